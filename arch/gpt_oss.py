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

from gguf import GGMLQuantizationType as Q
from gguf import MODEL_TENSOR as T
from gguf import Keys

from graphir.errors import MetadataError
from graphir.model import hf_config, presets
from graphir.model.architecture import Architecture
from graphir.model.builder import Act, Gating, GraphBuilder
from graphir.model.hf_config import TEXT, VOCAB, Family, hf
from graphir.model.hparams import HParams, Key, SlidingWindow
from graphir.graph.floats import inv_sqrt
from graphir.model.moe import MOE_KEYS, check_experts
from graphir.model.presets import Preset
from graphir.model.qkv import qkv_tensors
from graphir.model.scales import layer_scales
from graphir.model.tensors import TensorSpec, spec

L, A, R = Keys.LLM, Keys.Attention, Keys.Rope


class GptOss(Architecture):
    """As llama.cpp's src/models/openai-moe.cpp builds it."""

    name = "gpt-oss"
    rope_mode = "neox"
    required_keys = (A.HEAD_COUNT, A.LAYERNORM_RMS_EPS, L.EXPERT_FEED_FORWARD_LENGTH)
    swa = SlidingWindow("standard", window=0, period=2)  # attention.sliding_window required; even layers slide
    keys = MOE_KEYS + (Key("n_ff_exp", L.EXPERT_FEED_FORWARD_LENGTH, int, 0, minimum=1),
                       Key("rope_freq_base_swa", R.FREQ_BASE_SWA, float, default_from="rope_freq_base"))

    def __init__(self, hp: HParams):
        if not hp.n_expert:
            raise MetadataError(f"a '{self.name}' model needs experts ('{L.EXPERT_COUNT.format(arch=self.name)}' > 0)")
        check_experts(hp, self.name)
        super().__init__(hp)

    def tensors(self) -> list[TensorSpec]:
        """An untied head; per layer sinks, q/k/v with optional biases, a biased output, a biased router and
        biased experts (an expert's bias is its column of the [width, n_expert] table; the converter writes them
        f32)."""
        hp = self.hp
        E, V, F, X = hp.n_embd, hp.n_vocab, hp.n_ff_exp, hp.n_expert
        specs = [spec(T.TOKEN_EMBD, (E, V)), spec(T.OUTPUT_NORM, (E,), kind="vector"), spec(T.OUTPUT, (E, V))]
        for il in range(hp.n_layer):
            layer = [spec(T.ATTN_NORM, (E,), il, kind="vector"), *qkv_tensors(hp, il),
                     spec(T.ATTN_OUT, (E,), il, "bias", kind="vector"),
                     spec(T.ATTN_SINKS, (hp.head_count(il),), il, kind="vector"),
                     spec(T.ATTN_POST_NORM, (E,), il, kind="vector"),
                     spec(T.FFN_GATE_INP, (E, X), il), spec(T.FFN_GATE_INP, (X,), il, "bias", kind="vector"),
                     spec(T.FFN_GATE_EXP, (E, F, X), il), spec(T.FFN_GATE_EXP, (F, X), il, "bias", kind="vector"),
                     spec(T.FFN_UP_EXP, (E, F, X), il), spec(T.FFN_UP_EXP, (F, X), il, "bias", kind="vector"),
                     spec(T.FFN_DOWN_EXP, (F, E, X), il), spec(T.FFN_DOWN_EXP, (E, X), il, "bias", kind="vector")]
            specs += layer + layer_scales(layer, il, X)  # the experts' scales are not read by llama.cpp's graph
        return specs

    def build(self, b: GraphBuilder) -> None:
        """x += attn(norm(x)); x += moe(norm(x)) per layer. Every layer runs all of the ubatch's tokens, the
        last one too: the requested rows are taken after it, as llama.cpp's graph for this family does."""
        hp, w = self.hp, b.w
        x = b.build_inp_embd(w(T.TOKEN_EMBD))
        pos = b.build_inp_pos()
        for il in b.layers():
            # self-attention, RoPE'd (sliding layers with rope.freq_base_swa), whose softmax counts each head's sink;
            # scores scaled by 1/sqrt(rotated dims)
            h = b.norm(x, T.ATTN_NORM, il, name="attn_norm")
            q, k, v = b.build_qkv(h, il)
            base = hp.rope_freq_base_swa if hp.is_swa(il) else None
            q = b.rope(q, pos, name="Qcur.rope", freq_base=base)
            k = b.rope(k, pos, name="Kcur.rope", freq_base=base)
            a = b.build_attn(q, k, v, wo=w(T.ATTN_OUT, il), wo_b=w(T.ATTN_OUT, il, "bias"),
                             wo_s=b.scale(T.ATTN_OUT, il), kq_scale=inv_sqrt(hp.n_rot),
                             sinks=w(T.ATTN_SINKS, il))
            x = b.op("add", a, x, name="ffn_inp")
            # the top n_expert_used experts by biased router logits, weighted by a softmax over those logits; each
            # expert a clamped SwiGLU with a bias on each of its products
            h = b.norm(x, T.ATTN_POST_NORM, il, name="attn_post_norm")
            f = b.build_moe_ffn(
                h, gate_inp=w(T.FFN_GATE_INP, il), gate_inp_b=w(T.FFN_GATE_INP, il, "bias"),
                up_exps=w(T.FFN_UP_EXP, il), up_exps_b=w(T.FFN_UP_EXP, il, "bias"),
                gate_exps=w(T.FFN_GATE_EXP, il), gate_exps_b=w(T.FFN_GATE_EXP, il, "bias"),
                down_exps=w(T.FFN_DOWN_EXP, il), down_exps_b=w(T.FFN_DOWN_EXP, il, "bias"),
                n_expert=hp.n_expert, n_expert_used=hp.n_expert_used, gating=Gating.SOFTMAX_WEIGHT,
                act=Act.SWIGLU_OAI)
            x = b.op("add", f, x, name="l_out")
        x = b.op("get_rows", x, b.build_inp_out_ids(), name="out_rows")
        x = b.norm(x, T.OUTPUT_NORM, name="result_norm")
        b.build_output(x, w(T.OUTPUT))


# ---- Hugging Face: what convert_hf_to_gguf writes for these configs -----------------------------------------

GPT_OSS_RULES = TEXT + (
    hf(A.SLIDING_WINDOW, "sliding_window"),
    hf(L.EXPERT_FEED_FORWARD_LENGTH, "intermediate_size"),
    VOCAB,
)
hf_config.register(Family("gpt-oss", GPT_OSS_RULES, {"tie_word_embeddings": False},
                          lambda c: r"blk\.\d+\.attn_[qkv]\.bias", mxfp4=r"blk\.\d+\.ffn_(gate|up|down)_exps\.weight"),
                   "GptOssForCausalLM")


# ---- presets: released models of this family, as their converted GGUFs declare them ---------------------


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
