"""OpenAI's gpt-oss (gpt-oss-20b, gpt-oss-120b): a pre-norm decoder whose every FFN is a mixture of experts.

Attention alternates a 128-position sliding window (even layers) with full attention (odd layers), every head
of 64 values with q/k/v and output biases, NEOX RoPE with YaRN scaling, and a learned sink per head: one more
logit that joins each softmax's denominator and attends to nothing, so a head may attend to little. The FFN
routes each token to its best experts by the router's biased logits, weights them by a softmax over the chosen
logits alone, and runs each expert as a clamped SwiGLU (gate capped above, up clamped and shifted by one, the
gate's sigmoid sharpened by 1.702) whose three products carry a bias per expert. The experts ship as MXFP4.

References: OpenAI 2025, "gpt-oss-120b & gpt-oss-20b Model Card" (arXiv:2508.10925); llama.cpp
src/models/openai-moe.cpp and llama-graph.cpp's build_moe_ffn (LLM_FFN_SWIGLU_OAI_MOE), as vendored in
llama-cpp-python 0.3.36, whose architecture name for it is ``gpt-oss``.
"""

from __future__ import annotations

from gguf import MODEL_TENSOR as T
from gguf import Keys

from graphir.arch.llama import Llama
from graphir.model.moe import MOE_KEYS
from graphir.errors import MetadataError
from graphir.graph.ir import Node
from graphir.model.builder import Act, Gating, GraphBuilder
from graphir.model.hparams import HParams, Key, SlidingWindow, inv_sqrt
from graphir.model.tensors import TensorSpec, spec
from gguf import GGMLQuantizationType as Q
from graphir.model import presets
from graphir.model.presets import Preset


class GptOss(Llama):
    name = "gpt-oss"
    rope_mode = "neox"
    required_keys = (Keys.Attention.HEAD_COUNT, Keys.Attention.LAYERNORM_RMS_EPS,
                     Keys.LLM.EXPERT_FEED_FORWARD_LENGTH)
    swa = SlidingWindow("standard", window=0, period=2)  # attention.sliding_window required; even layers slide
    keys = MOE_KEYS + (Key("n_ff_exp", Keys.LLM.EXPERT_FEED_FORWARD_LENGTH, int, 0, minimum=1),
                       Key("rope_freq_base_swa", Keys.Rope.FREQ_BASE_SWA, float, default_from="rope_freq_base"))
    gate_optional = False
    out_bias = False  # attn_output.bias is required here: declared with the layer's tensors

    def __init__(self, hp: HParams):
        if not hp.n_expert:
            key = Keys.LLM.EXPERT_COUNT.format(arch=self.name)
            raise MetadataError(f"a '{self.name}' model needs experts ('{key}' > 0)")
        super().__init__(hp)

    def expert_ff_length(self, il: int) -> int:
        return self.hp.n_ff_exp

    # ---- tensors: an untied head, no rope_freqs; per layer sinks, a biased router and biased experts ----------

    def head_tensors(self) -> list[TensorSpec]:
        return [spec(T.OUTPUT, (self.hp.n_embd, self.hp.n_vocab))]

    def rope_tensors(self) -> list[TensorSpec]:
        return []

    def layer_tensors(self, il: int) -> list[TensorSpec]:
        E = self.hp.n_embd
        return [spec(T.ATTN_NORM, (E,), il, kind="vector"), *self.mix_tensors(il),
                spec(T.ATTN_OUT, (E,), il, "bias", kind="vector"),
                spec(T.ATTN_SINKS, (self.hp.head_count(il),), il, kind="vector"),
                spec(T.ATTN_POST_NORM, (E,), il, kind="vector"), *self.moe_tensors(il)]

    def moe_tensors(self, il: int) -> list[TensorSpec]:
        """The router and the stacked experts, each with its biases (an expert's bias is its column of the
        [width, n_expert] table; the converter writes them f32)."""
        E, F, X = self.hp.n_embd, self.hp.n_ff_exp, self.n_expert()
        return [spec(T.FFN_GATE_INP, (E, X), il), spec(T.FFN_GATE_INP, (X,), il, "bias", kind="vector"),
                spec(T.FFN_GATE_EXP, (E, F, X), il), spec(T.FFN_GATE_EXP, (F, X), il, "bias", kind="vector"),
                spec(T.FFN_UP_EXP, (E, F, X), il), spec(T.FFN_UP_EXP, (F, X), il, "bias", kind="vector"),
                spec(T.FFN_DOWN_EXP, (F, E, X), il), spec(T.FFN_DOWN_EXP, (E, X), il, "bias", kind="vector")]

    # ---- graph -----------------------------------------------------------------------------------------

    def rope_at(self, il: int) -> tuple[float | None, float | None]:
        """Sliding layers rotate with rope.freq_base_swa (the model's base unless the file says)."""
        return (self.hp.rope_freq_base_swa, None) if self.hp.is_swa(il) else (None, None)

    def attention(self, b: GraphBuilder, h: Node, pos: Node, il: int) -> Node:
        """Grouped-query attention, RoPE'd, whose softmax counts each head's sink; scores scaled by
        1/sqrt(rotated dims)."""
        q, k, v = b.build_qkv(h, il)
        base, scale = self.rope_at(il)
        q = b.rope(q, pos, name="Qcur.rope", freq_base=base, freq_scale=scale)
        k = b.rope(k, pos, name="Kcur.rope", freq_base=base, freq_scale=scale)
        return b.build_attn(q, k, v, wo=b.w(T.ATTN_OUT, il), wo_b=b.w(T.ATTN_OUT, il, "bias"),
                            kq_scale=inv_sqrt(self.hp.n_rot), sinks=b.w(T.ATTN_SINKS, il))

    def moe(self, b: GraphBuilder, h: Node, il: int) -> Node:
        """The top n_expert_used experts by biased router logits, weighted by a softmax over those logits;
        each expert a clamped SwiGLU with a bias on each of its products."""
        hp, w = self.hp, b.w
        return b.build_moe_ffn(
            h, gate_inp=w(T.FFN_GATE_INP, il), gate_inp_b=w(T.FFN_GATE_INP, il, "bias"),  # type: ignore[arg-type]
            up_exps=w(T.FFN_UP_EXP, il), up_exps_b=w(T.FFN_UP_EXP, il, "bias"),  # type: ignore[arg-type]
            gate_exps=w(T.FFN_GATE_EXP, il), gate_exps_b=w(T.FFN_GATE_EXP, il, "bias"),
            down_exps=w(T.FFN_DOWN_EXP, il), down_exps_b=w(T.FFN_DOWN_EXP, il, "bias"),  # type: ignore[arg-type]
            n_expert=hp.n_expert, n_expert_used=hp.n_expert_used, gating=Gating.SOFTMAX_WEIGHT, act=Act.SWIGLU_OAI)

    def build(self, b: GraphBuilder) -> None:
        """x += attn(norm(x)); x += moe(norm(x)) per layer. Every layer runs all of the ubatch's tokens, the
        last one too: the requested rows are taken after it, as llama.cpp's graph for this family does."""
        hp = self.hp
        x = b.build_inp_embd(b.w(T.TOKEN_EMBD))
        pos = b.build_inp_pos()
        out_ids = b.build_inp_out_ids()
        for il in range(hp.n_layer):
            with b.layer(il):
                a = self.attention(b, b.build_norm(x, b.w(T.ATTN_NORM, il), name="attn_norm"), pos, il)
                x = b.op("add", a, x, name="ffn_inp")
                f = self.moe(b, b.build_norm(x, b.w(T.ATTN_POST_NORM, il), name="attn_post_norm"), il)
                x = b.op("add", f, x, name="l_out")
        x = b.op("get_rows", x, out_ids, name="out_rows")
        x = b.build_norm(x, b.w(T.OUTPUT_NORM), name="result_norm")
        b.build_output(x, b.w(T.OUTPUT))


# ---- presets: released models of this family, as their converted GGUFs declare them ---------------------

L, A, R = Keys.LLM, Keys.Attention, Keys.Rope


def _gpt_oss(n_layer: int, n_expert: int, source: str) -> Preset:
    """gpt-oss: 64 query and 8 KV heads of 64 over a width of 2880, a 128-position window on even layers, YaRN
    (factor 32 from 4096); experts of 2880, 4 per token, in MXFP4 as the converter repacks the checkpoint's
    blocks, the rest as it writes them (F16 matrices; router, sinks and every bias F32)."""
    return Preset("gpt-oss", {
        L.CONTEXT_LENGTH: 131072, L.EMBEDDING_LENGTH: 2880, L.BLOCK_COUNT: n_layer, L.FEED_FORWARD_LENGTH: 2880,
        A.HEAD_COUNT: 64, A.HEAD_COUNT_KV: 8, A.KEY_LENGTH: 64, A.VALUE_LENGTH: 64, R.FREQ_BASE: 150000.0,
        A.LAYERNORM_RMS_EPS: 1e-5, R.SCALING_TYPE: "yarn", R.SCALING_FACTOR: 32.0, R.SCALING_ORIG_CTX_LEN: 4096,
        A.SLIDING_WINDOW: 128, L.VOCAB_SIZE: 201088, L.EXPERT_COUNT: n_expert, L.EXPERT_USED_COUNT: 4,
        L.EXPERT_FEED_FORWARD_LENGTH: 2880,
    }, tied=False, include=r"blk\.\d+\.attn_[qkv]\.bias", f32=presets.ROUTER_F32,
        overrides={f"blk.{il}.ffn_{m}_exps.weight": Q.MXFP4 for il in range(n_layer) for m in ("gate", "up", "down")},
        source=source)


presets.register({
    "gpt-oss-20b": _gpt_oss(24, 32, "openai/gpt-oss-20b config.json"),
    "gpt-oss-120b": _gpt_oss(36, 128, "openai/gpt-oss-120b config.json"),
})
