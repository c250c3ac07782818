"""Phi-3 (Phi-3-mini, Phi-3.5-mini, Phi-4-mini): a pre-RMSNorm decoder with fused QKV, one fused gate+up
projection and LongRoPE; and Phi-3.5-MoE (phimoe), the same graph with biased norms, output projections and LM
head, and FFNs that are mixtures of experts.

Each block is ``x += attn(RMSNorm(x))`` then ``x += W_down (silu(g) * u)`` where ``[g; u] = W_up RMSNorm(x)``
(``ffn_up`` holds the gate rows first, then the up rows). Attention is grouped-query over NEOX-rotated Q and K,
with Q divided by sqrt(head size) before the scores (which are then not scaled again). RoPE may cover only the
first ``n_rot`` values of a head (Phi-4-mini: 3/4) and divides its frequencies by one of two learned
per-frequency factor vectors shared by all layers: the *short* ones for contexts up to the original training
context, the *long* ones beyond it (LongRoPE), so the graph depends on the context size. The checkpoints'
``sliding_window`` is read and ignored, as llama.cpp does: every layer attends to the whole context.
PhiMoE routes each token to its ``expert_used_count`` best of ``expert_count`` experts of ``feed_forward_length``
by softmax, weights renormalised; its RMS norms add a bias, and so do its attention output and LM head.
Reference: Abdin et al. 2024, "Phi-3 Technical Report"; Ding et al. 2024, "LongRoPE"; llama.cpp
src/models/phi3.cpp, phimoe.cpp and llama_model::get_rope_factors.
"""

from __future__ import annotations

import math
from typing import ClassVar

from gguf import MODEL_TENSOR as T
from gguf import Keys

from graphir.model import hf_config, presets
from graphir.model.architecture import Architecture
from graphir.graph.ir import Node
from graphir.model.builder import GraphBuilder
from graphir.model.moe import MOE_KEYS, check_routed, routed_expert_tensors, routed_experts
from graphir.model.hf_config import VOCAB, Family, derived, hf
from graphir.graph.floats import inv_sqrt
from graphir.model.hparams import HParams
from graphir.model.presets import Preset
from graphir.model.qkv import fused_or_split_qkv_tensors
from graphir.model.scales import layer_scales
from graphir.model.tensors import TensorSpec, spec, tensor_name

L, A, R = Keys.LLM, Keys.Attention, Keys.Rope


class Phi3(Architecture):
    """As llama.cpp's src/models/phi3.cpp builds it."""

    name = "phi3"
    rope_mode = "neox"  # HF rotate-half layout, kept by the converter
    required_keys = (Keys.LLM.FEED_FORWARD_LENGTH, Keys.Attention.HEAD_COUNT, Keys.Attention.LAYERNORM_RMS_EPS)
    experts: ClassVar[bool] = False  # PhiMoE: mixtures of experts, and biases on the norms, W_o and the LM head

    def __init__(self, hp: HParams):
        if self.experts:
            check_routed(hp, self.name)
        super().__init__(hp)

    def variant(self, n_ctx_seq: int) -> bool:
        """Whether a context of n_ctx_seq cells per sequence uses the long RoPE factors."""
        return n_ctx_seq > self.hp.n_ctx_orig_yarn

    def tensors(self) -> list[TensorSpec]:
        """One fused attention projection (what the converter writes) or three, each with an optional bias; one
        fused [gate; up] FFN projection."""
        hp = self.hp
        E, V, F, n = hp.n_embd, hp.n_vocab, hp.n_ff, hp.n_rot // 2
        moe = self.experts
        specs = [spec(T.TOKEN_EMBD, (E, V)), spec(T.OUTPUT_NORM, (E,), kind="vector"),
                 spec(T.OUTPUT, (E, V), tied_to=None if moe else tensor_name(T.TOKEN_EMBD)),
                 spec(T.ROPE_FACTORS_LONG, (n,), kind="vector", optional=True),
                 spec(T.ROPE_FACTORS_SHORT, (n,), kind="vector", optional=True)]
        if moe:
            specs += [spec(T.OUTPUT_NORM, (E,), suffix="bias", kind="vector"),
                      spec(T.OUTPUT, (V,), suffix="bias", kind="vector")]
        for il in range(hp.n_layer):
            layer = [spec(T.ATTN_NORM, (E,), il, kind="vector"),
                     *fused_or_split_qkv_tensors(hp, il), spec(T.ATTN_OUT, (E, E), il), spec(T.FFN_NORM, (E,), il, kind="vector")]
            if moe:
                X = self.hp.n_expert
                layer += [*(spec(t, (E,), il, "bias", kind="vector") for t in (T.ATTN_NORM, T.ATTN_OUT, T.FFN_NORM)),
                          *routed_expert_tensors(E, F, X, il)]
            else:
                layer += [spec(T.FFN_UP, (E, 2 * F), il), spec(T.FFN_DOWN, (F, E), il)]  # [gate; up]
            # the dense FFN's scales are not read by llama.cpp's graph
            specs += layer + layer_scales(layer, il, self.hp.n_expert if moe else 0)
        return specs


    def build(self, b: GraphBuilder) -> None:
        hp = self.hp
        x = b.build_inp_embd(b.w(T.TOKEN_EMBD))
        pos = b.build_inp_pos()
        for il in b.layers():
            # self-attention; the RoPE factors for long contexts beyond the original one (LongRoPE)
            rope_factors = b.w_opt(T.ROPE_FACTORS_LONG if self.variant(b.n_ctx_seq) else T.ROPE_FACTORS_SHORT)
            h = b.norm(x, T.ATTN_NORM, il, name="attn_norm")
            q, k, v = b.build_qkv(h, il)
            q = b.rope(q, pos, rope_factors, name="Qcur.rope")
            k = b.rope(k, pos, rope_factors, name="Kcur.rope")
            q = b.op("scale", q, s=inv_sqrt(hp.n_embd_head_k), name="Qcur.scaled")
            wo_b = b.w(T.ATTN_OUT, il, "bias") if self.experts else None
            a = b.build_attn(q, k, v, wo=b.w(T.ATTN_OUT, il), wo_b=wo_b, wo_s=b.scale(T.ATTN_OUT, il), kq_scale=1.0)
            a, x = b.last_layer_rows((a, "attn_out.rows"), (x, "inp.rows"))
            x = b.op("add", a, x, name="ffn_inp")
            f = self.ffn(b, b.norm(x, T.FFN_NORM, il, name="ffn_norm"), il)
            x = b.op("add", f, x, name="l_out")
        x = b.norm(x, T.OUTPUT_NORM, name="result_norm")
        b.build_output(x, b.w(T.OUTPUT), b.w(T.OUTPUT, suffix="bias") if self.experts else None)

    def ffn(self, b: GraphBuilder, h: Node, il: int) -> Node:
        """SwiGLU over the two halves of one projection, silu(gate rows) * up rows; PhiMoE: each token's best
        experts by softmax, weights renormalised."""
        if self.experts:
            return routed_experts(b, h, il, norm_w=True)
        return b.build_ffn_fused_swiglu(h, il)


class PhiMoe(Phi3):
    name = "phimoe"
    keys = MOE_KEYS
    experts = True


# ---- Hugging Face: what convert_hf_to_gguf writes for these configs -----------------------------------------


def _phi3_rope_dims(c: hf_config.Config) -> int:
    factor = c.check("partial_rotary_factor", c.rope.get("partial_rotary_factor", 1.0), "number")
    return int(factor * c.find("hidden_size", "n_embd")) // c.find("num_attention_heads", "n_head")


def _phi3_attn_factor(c: hf_config.Config) -> float | None:
    """LongRoPE's (or YaRN's) attention factor, written with the long factors."""
    if not c.rope.get("long_factor"):
        return None
    orig = c.rope_value(c.rope, "original_max_position_embeddings", "count")
    if orig < 2:
        raise c.error(f"original_max_position_embeddings {orig} leaves LongRoPE no scale to work from")
    scale = c.find("n_positions", "max_position_embeddings") / orig
    kind = str(c.rope.get("rope_type", "")).lower()
    if kind in ("su", "longrope"):
        return math.sqrt(1 + math.log(scale) / math.log(orig)) if scale > 1 else 1.0
    if kind == "yarn":
        return 0.1 * math.log(scale) + 1.0 if scale > 1 else 1.0
    raise c.error(f"rope_scaling.type '{kind}' with long factors is not supported (supported: longrope, su, yarn)")


PHI3_RULES: tuple[hf_config.Rule, ...] = (
    hf(L.CONTEXT_LENGTH, "n_positions", "max_position_embeddings"),
    derived(R.SCALING_ORIG_CTX_LEN, lambda c: c.rope_value(c.rope, "original_max_position_embeddings", "count")),
    hf(L.EMBEDDING_LENGTH, "hidden_size", "n_embd"),
    hf(L.FEED_FORWARD_LENGTH, "intermediate_size"),
    hf(L.BLOCK_COUNT, *hf_config.BLOCKS),
    hf(A.HEAD_COUNT, "num_attention_heads", "n_head"),
    hf(A.HEAD_COUNT_KV, "num_key_value_heads", "n_head_kv"),
    hf(A.LAYERNORM_RMS_EPS, "rms_norm_eps", kind="number"),
    derived(R.DIMENSION_COUNT, _phi3_rope_dims),
    derived(R.FREQ_BASE, lambda c: c.rope_value(c.rope, "rope_theta")),
    hf(A.SLIDING_WINDOW, "sliding_window", kind="size", default=0),  # 0 tells Phi-4 from the others
    derived(R.SCALING_ATTN_FACTOR, _phi3_attn_factor),
    VOCAB,
)


def _phi3_include(c: hf_config.Config) -> str:
    return r"blk\.\d+\.attn_qkv\.weight" + (r"|rope_factors_(long|short)\.weight" if c.rope.get("long_factor") else "")


hf_config.register(Family("phi3", PHI3_RULES, {"tie_word_embeddings": False, "original_max_position_embeddings": 4096},
                          _phi3_include), "Phi3ForCausalLM")
# the separate Q, K, V projections with their biases, and LongRoPE's factors
PHIMOE_WRITTEN = r"blk\.\d+\.attn_[qkv]\.(weight|bias)|rope_factors_(long|short)\.weight"
hf_config.register(Family("phimoe", PHI3_RULES + (
    hf(L.EXPERT_COUNT, "num_local_experts", kind="size"), hf(L.EXPERT_USED_COUNT, "num_experts_per_tok", kind="size"),
), {"tie_word_embeddings": False, "original_max_position_embeddings": 4096},
    lambda c: PHIMOE_WRITTEN), "PhiMoEForCausalLM")


# ---- presets: released models of this family, as their converted GGUFs declare them ---------------------


def _phi3(n_ctx: int, n_head: int, n_head_kv: int, vocab: int, tied: bool, source: str,
          sliding_window: int = 262144) -> Preset:
    # fused attn_qkv; the converter writes sliding_window, which llama.cpp ignores. Beyond a 4096 original context
    # (LongRoPE) it adds rope_factors_long/short and rope.scaling.attn_factor = sqrt(1 + ln(32) / ln(4096)).
    long = n_ctx > 4096
    return Preset("phi3", {
        L.CONTEXT_LENGTH: n_ctx, R.SCALING_ORIG_CTX_LEN: 4096, L.EMBEDDING_LENGTH: 3072, L.FEED_FORWARD_LENGTH: 8192,
        L.BLOCK_COUNT: 32, A.HEAD_COUNT: n_head, A.HEAD_COUNT_KV: n_head_kv, A.LAYERNORM_RMS_EPS: 1e-5,
        R.DIMENSION_COUNT: 96, R.FREQ_BASE: 10000.0, **({R.SCALING_ATTN_FACTOR: (1 + 5 / 12) ** 0.5} if long else {}),
        A.SLIDING_WINDOW: sliding_window, L.VOCAB_SIZE: vocab,
    }, tied=tied, include=r"blk\.\d+\.attn_qkv\.weight" + (r"|rope_factors_(long|short)\.weight" if long else ""),
        source=source)


presets.register({
    # 32 layers, 32 query and 8 KV heads of 128, 16 experts of 6400 with 2 per token; LongRoPE from 4096 positions
    "Phi-3.5-MoE": Preset("phimoe", {
        L.CONTEXT_LENGTH: 131072, R.SCALING_ORIG_CTX_LEN: 4096, L.EMBEDDING_LENGTH: 4096, L.FEED_FORWARD_LENGTH: 6400,
        L.BLOCK_COUNT: 32, A.HEAD_COUNT: 32, A.HEAD_COUNT_KV: 8, A.LAYERNORM_RMS_EPS: 1e-5, R.DIMENSION_COUNT: 128,
        R.FREQ_BASE: 10000.0, R.SCALING_ATTN_FACTOR: (1 + 5 / 12) ** 0.5, A.SLIDING_WINDOW: 131072,
        L.EXPERT_COUNT: 16, L.EXPERT_USED_COUNT: 2, L.VOCAB_SIZE: 32064,
    }, tied=False, include=PHIMOE_WRITTEN, f32=presets.ROUTER_F32,
        source="microsoft/Phi-3.5-MoE-instruct config.json"),
    "Phi-3-mini-4k": _phi3(4096, 32, 32, 32064, False, "microsoft/Phi-3-mini-4k-instruct config.json",
                           sliding_window=2047),
    "Phi-3.5-mini": _phi3(131072, 32, 32, 32064, False, "microsoft/Phi-3.5-mini-instruct config.json"),
    "Phi-4-mini": _phi3(131072, 24, 8, 200064, True, "microsoft/Phi-4-mini-instruct config.json "
                        "(partial_rotary_factor 0.75: 96 of 128 dims rotate)"),
})
