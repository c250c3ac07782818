"""Apple's OpenELM (openelm): a pre-RMSNorm decoder whose layers grow: each has its own query and KV head counts
and FFN length (layer-wise scaling).

Each layer projects Q, K and V at once (``attn_qkv``, heads of ``key_length``), RMS-normalises every head of Q and
K with a learned scale, ropes them (NEOX pairs) and attends with grouped-query attention, scores by 1/sqrt(head
size); then a SwiGLU FFN. The LM head is the token embedding. (llama.cpp's transposed V cache is as wide as the
widest layer's where KV head counts differ; graphir's holds each layer's own width: the same values, another cache
shape in the graph.)
References: Mehta et al. 2024, "OpenELM: An Efficient Language Model Family with Open Training and Inference
Framework"; llama.cpp src/models/openelm.cpp.
"""

from __future__ import annotations

from gguf import MODEL_TENSOR as T
from gguf import Keys

from graphir.graph.floats import inv_sqrt
from graphir.model import hf_config, presets
from graphir.model.architecture import Architecture
from graphir.model.builder import GraphBuilder
from graphir.model.hf_config import VOCAB, Config, Family, derived, hf
from graphir.model.presets import Preset
from graphir.model.qkv import qk_norm_tensors
from graphir.model.scales import layer_scales
from graphir.model.tensors import TensorSpec, spec

L, A, R = Keys.LLM, Keys.Attention, Keys.Rope


class OpenELM(Architecture):
    name = "openelm"
    rope_mode = "neox"
    required_keys = (A.LAYERNORM_RMS_EPS,)
    per_layer = True

    def tensors(self) -> list[TensorSpec]:
        hp = self.hp
        E, V, d = hp.n_embd, hp.n_vocab, hp.n_embd_head_k
        specs = [spec(T.TOKEN_EMBD, (E, V)), spec(T.OUTPUT_NORM, (E,), kind="vector")]
        for il in range(hp.n_layer):
            H, F = hp.head_count(il), hp.ff_length(il)
            layer = [spec(T.ATTN_NORM, (E,), il, kind="vector"),
                     spec(T.ATTN_QKV, (E, (H + 2 * hp.head_count_kv(il)) * d), il), *qk_norm_tensors(hp, il),
                     spec(T.ATTN_OUT, (H * d, E), il), spec(T.FFN_NORM, (E,), il, kind="vector"),
                     spec(T.FFN_GATE, (E, F), il), spec(T.FFN_DOWN, (F, E), il), spec(T.FFN_UP, (E, F), il)]
            specs += layer + layer_scales(layer, il)  # read: attention's output scale alone
        return specs

    def build(self, b: GraphBuilder) -> None:
        hp = self.hp
        d, T_ = hp.n_embd_head_k, b.n_tokens
        x = b.build_inp_embd(b.w(T.TOKEN_EMBD))
        pos = b.build_inp_pos()
        for il in b.layers():
            H, H_kv = hp.head_count(il), hp.head_count_kv(il)
            h = b.norm(x, T.ATTN_NORM, il, name="attn_norm")
            # self-attention: Q, K and V heads of one product, Q and K normalised per head (no scale of attn_qkv)
            qkv = b.linear(h, b.w(T.ATTN_QKV, il), name="wqkv")
            row = (H + 2 * H_kv) * d
            q, k, v = (b.op("view", qkv, shape=(d, n, T_), strides=(1, d, row), offset=off * d, name=tag)
                       for tag, n, off in (("Qcur", H, 0), ("Kcur", H_kv, H), ("Vcur", H_kv, H + H_kv)))
            q = b.rope(b.norm(q, T.ATTN_Q_NORM, il, name="Qcur_normed"), pos, name="Qcur.rope")
            k = b.rope(b.norm(k, T.ATTN_K_NORM, il, name="Kcur_normed"), pos, name="Kcur.rope")
            a = b.build_attn(q, k, v, wo=b.w(T.ATTN_OUT, il), wo_s=b.scale(T.ATTN_OUT, il), kq_scale=inv_sqrt(d))
            a, x = b.last_layer_rows((a, "attn_out.rows"), (x, "inp.rows"))
            x = b.op("add", x, a, name="ffn_inp")
            f = b.build_ffn(b.norm(x, T.FFN_NORM, il, name="ffn_norm"), up=b.w(T.FFN_UP, il),
                            gate=b.w(T.FFN_GATE, il), down=b.w(T.FFN_DOWN, il))
            x = b.op("add", f, x, name="l_out")
        x = b.norm(x, T.OUTPUT_NORM, name="result_norm")
        b.build_output(x, b.w(T.TOKEN_EMBD))


# ---- Hugging Face: convert_hf_to_gguf's OpenELMModel ------------------------------------------------------


def _make_divisible(v: float, divisor: int) -> int:
    """OpenELM's rounding of an FFN width: to the nearest multiple of divisor, at least divisor, and not below
    90% of v."""
    n = max(divisor, int(v + divisor / 2) // divisor * divisor)
    return n + divisor if n < 0.9 * v else n


def _ffn_lengths(c: Config) -> list[int]:
    E, divisor = c.find("model_dim"), c.find("ffn_dim_divisor")
    return [_make_divisible(c.check("ffn_multipliers", m, "number") * E, divisor)
            for m in c.find("ffn_multipliers", kind="list")]


OPENELM = (
    hf(L.CONTEXT_LENGTH, "max_context_length"),
    hf(L.EMBEDDING_LENGTH, "model_dim"),
    hf(L.BLOCK_COUNT, "num_transformer_layers"),
    derived(L.FEED_FORWARD_LENGTH, _ffn_lengths),
    hf(A.HEAD_COUNT, "num_query_heads", kind="list"),
    hf(A.HEAD_COUNT_KV, "num_kv_heads", kind="list"),
    hf(R.FREQ_BASE, "rope_freq_constant", kind="number"),
    hf(R.DIMENSION_COUNT, "head_dim"),
    hf(A.KEY_LENGTH, "head_dim"),
    hf(A.VALUE_LENGTH, "head_dim"),
    derived(A.LAYERNORM_RMS_EPS, lambda c: 1e-6),  # the converter's constant
    VOCAB,
)
hf_config.register(Family("openelm", OPENELM, {"tie_word_embeddings": True}), "OpenELMForCausalLM")

# ---- presets -----------------------------------------------------------------------------------------------

presets.register({
    # 270M: 16 layers of heads of 64; 12 to 20 query heads (3 to 5 KV heads) and FFN multipliers 0.5 to 4 growing
    # with depth; the head is the token embedding
    "OpenELM-270M": Preset("openelm", {
        L.CONTEXT_LENGTH: 2048, L.EMBEDDING_LENGTH: 1280, L.BLOCK_COUNT: 16,
        L.FEED_FORWARD_LENGTH: [768, 1024, 1280, 1536, 1792, 2048, 2560, 2816, 3072, 3328, 3584, 3840, 4352, 4608,
                                4864, 5120],
        A.HEAD_COUNT: [12] * 5 + [16] * 7 + [20] * 4, A.HEAD_COUNT_KV: [3] * 5 + [4] * 7 + [5] * 4,
        R.FREQ_BASE: 10000.0, R.DIMENSION_COUNT: 64, A.KEY_LENGTH: 64, A.VALUE_LENGTH: 64, A.LAYERNORM_RMS_EPS: 1e-6,
        L.VOCAB_SIZE: 32000,
    }, tied=True, source="apple/OpenELM-270M config.json"),
})
