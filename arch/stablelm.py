"""StableLM (Stability AI: StableLM 2, StableLM Zephyr): a pre-LN decoder with SwiGLU, NEOX RoPE over part of each
head (a quarter in StableLM 2), optional Q/K/V biases and an LM head of its own.

What the file holds decides the block, as in llama.cpp's stablelm.cpp: a layer with an FFN LayerNorm runs
attention then FFN in sequence; one without (StableLM 2 12B) runs the FFN on the attention's LayerNorm, in
parallel. StableLM 2 12B also LayerNorms each head of Q and K with weights of its own (``attn_q_norm``,
``attn_k_norm``), wherever the file has them.

References: Bellagente et al. 2024, "Stable LM 2 1.6B Technical Report" (arXiv:2402.17834); llama.cpp
src/models/stablelm.cpp.
"""

from __future__ import annotations

from gguf import MODEL_TENSOR as T
from gguf import Keys

from graphir.graph.floats import inv_sqrt
from graphir.model import hf_config, presets
from graphir.model.architecture import Architecture
from graphir.model.builder import GraphBuilder, Norm
from graphir.model.hf_config import TEXT, VOCAB, Family, derived
from graphir.model.presets import Preset
from graphir.model.qkv import qkv_tensors
from graphir.model.scales import layer_scales
from graphir.model.tensors import TensorSpec, spec, with_bias

L, A, R = Keys.LLM, Keys.Attention, Keys.Rope


class StableLM(Architecture):
    name = "stablelm"
    rope_mode = "neox"
    required_keys = (L.FEED_FORWARD_LENGTH, A.HEAD_COUNT, A.LAYERNORM_EPS)

    def tensors(self) -> list[TensorSpec]:
        hp = self.hp
        E, F, V, d = hp.n_embd, hp.n_ff, hp.n_vocab, hp.n_embd_head_k
        specs = [spec(T.TOKEN_EMBD, (E, V)), *with_bias(T.OUTPUT_NORM, (E,)), spec(T.OUTPUT, (E, V))]
        for il in range(hp.n_layer):
            layer = [*with_bias(T.ATTN_NORM, (E,), il), *qkv_tensors(hp, il),
                     spec(T.ATTN_Q_NORM, (d, hp.head_count(il)), il, optional=True),
                     spec(T.ATTN_K_NORM, (d, hp.head_count_kv(il)), il, optional=True),
                     *(spec(T.FFN_NORM, (E,), il, suffix, kind="vector", optional=True) for suffix in ("weight", "bias")),
                     spec(T.FFN_GATE, (E, F), il), spec(T.FFN_UP, (E, F), il), spec(T.FFN_DOWN, (F, E), il)]
            specs += layer + layer_scales(layer, il)
        return specs

    def build(self, b: GraphBuilder) -> None:
        hp = self.hp
        x = b.build_inp_embd(b.w(T.TOKEN_EMBD))
        pos = b.build_inp_pos()
        for il in b.layers():
            h = b.norm(x, T.ATTN_NORM, il, Norm.LAYER, name="attn_norm")
            q, k, v = b.build_qkv(h, il)
            if b.w_opt(T.ATTN_Q_NORM, il) is not None:
                q = b.norm(q, T.ATTN_Q_NORM, il, Norm.LAYER, name="Qcur_normed")
            if b.w_opt(T.ATTN_K_NORM, il) is not None:
                k = b.norm(k, T.ATTN_K_NORM, il, Norm.LAYER, name="Kcur_normed")
            q, k = b.rope(q, pos, name="Qcur.rope"), b.rope(k, pos, name="Kcur.rope")
            a = b.build_attn(q, k, v, wo=b.w(T.ATTN_OUT, il), wo_s=b.scale(T.ATTN_OUT, il),
                             kq_scale=inv_sqrt(hp.n_embd_head_k))
            a, x, h = b.last_layer_rows((a, "attn_out.rows"), (x, "inp.rows"), (h, "attn_norm.rows"))
            x = b.op("add", a, x, name="ffn_inp")
            if b.w_opt(T.FFN_NORM, il) is not None:
                h = b.norm(x, T.FFN_NORM, il, Norm.LAYER, name="ffn_norm")
            # else the parallel residual: the FFN reads the attention's norm
            # (its matrices' scales unread, as llama.cpp's graph passes none)
            f = b.build_ffn(h, up=b.w(T.FFN_UP, il), gate=b.w(T.FFN_GATE, il), down=b.w(T.FFN_DOWN, il))
            x = b.op("add", f, x, name="l_out")
        x = b.norm(x, T.OUTPUT_NORM, kind=Norm.LAYER, name="result_norm")
        b.build_output(x, b.w(T.OUTPUT))


# ---- Hugging Face: convert_hf_to_gguf's StableLMModel -------------------------------------------------------

def _written(c: hf_config.Config) -> str:
    """The optional tensors the converter writes, as the config says: Q/K/V biases, the FFN norm (a sequential
    block), per-head Q/K norms."""
    parts = [*(("attn_[qkv]\\.bias",) if c.find("use_qkv_bias", kind="flag", default=False) else ()),
             *(() if c.find("use_parallel_residual", kind="flag", default=False) else ("ffn_norm\\.(weight|bias)",)),
             *(("attn_[qk]_norm\\.weight",) if c.find("qk_layernorm", kind="flag", default=False) else ())]
    return rf"blk\.\d+\.({'|'.join(parts)})" if parts else ""


hf_config.register(Family("stablelm", TEXT + (
    derived(R.DIMENSION_COUNT, lambda c: int(c.find("partial_rotary_factor", "rope_pct", kind="number")
                                             * (c.find("hidden_size") // c.find("num_attention_heads")))),
    VOCAB), {"tie_word_embeddings": False}, include=_written), "StableLmForCausalLM", "StableLMEpochForCausalLM")

presets.register({
    # 24 layers of 32 heads of 64, RoPE over 16 values of each; Q/K/V biases
    "StableLM-2-1.6B": Preset("stablelm", {
        L.CONTEXT_LENGTH: 4096, L.EMBEDDING_LENGTH: 2048, L.BLOCK_COUNT: 24, L.FEED_FORWARD_LENGTH: 5632,
        A.HEAD_COUNT: 32, A.HEAD_COUNT_KV: 32, A.LAYERNORM_EPS: 1e-5, R.DIMENSION_COUNT: 16, L.VOCAB_SIZE: 100352,
    }, tied=False, source="stabilityai/stablelm-2-1_6b config.json",
        include=r"blk\.\d+\.(attn_[qkv]\.bias|ffn_norm\.(weight|bias))"),
})
