"""PLaMo 3 (Preferred Networks): the pre-norm decoder with RMSNorms also after both sublayers, one fused Q/K/V
projection, per-head RMS QK-norm before RoPE over split halves, a SwiGLU over the two halves of one up projection,
and per-layer head and FFN counts. Where the file sets a window, seven layers of every eight slide over it and
rotate with their own base (``rope.freq_base_swa``, llama.cpp's 10000 when absent). The LM head is the token
embedding unless the file has its own. The post-norms' tensors are named without ``.weight``, as llama.cpp's loader
asks for them.

References: Preferred Networks 2025, PLaMo 3 model card; llama.cpp src/models/plamo3.cpp.
"""

from __future__ import annotations

from gguf import MODEL_TENSOR as T
from gguf import Keys

from graphir.graph.floats import inv_sqrt
from graphir.model import hf_config, presets
from graphir.model.architecture import Architecture
from graphir.model.builder import GraphBuilder
from graphir.model.hf_config import TEXT, VOCAB, Config, Family
from graphir.model.hparams import Key, SlidingWindow
from graphir.model.prenorm import RMS_KEYS, synthetic
from graphir.model.qkv import qk_norm_tensors
from graphir.model.scales import layer_scales
from graphir.model.tensors import TensorSpec, spec, tensor_name

L, A, R = Keys.LLM, Keys.Attention, Keys.Rope
POST_NORMS = (T.ATTN_POST_NORM, T.FFN_POST_NORM)  # named blk.<il>.post_attention_norm, blk.<il>.post_ffw_norm


class Plamo3(Architecture):
    name = "plamo3"
    rope_mode = "neox"
    required_keys = RMS_KEYS
    per_layer = True
    swa = SlidingWindow("standard", period=8, off_when_zero=True)  # no window: every layer global
    keys = (Key("rope_freq_base_swa", R.FREQ_BASE_SWA, float, 10000.0),)

    def tensors(self) -> list[TensorSpec]:
        hp = self.hp
        E, V, d, dv = hp.n_embd, hp.n_vocab, hp.n_embd_head_k, hp.n_embd_head_v
        specs = [spec(T.TOKEN_EMBD, (E, V)), spec(T.OUTPUT_NORM, (E,), kind="vector"),
                 spec(T.OUTPUT, (E, V), tied_to=tensor_name(T.TOKEN_EMBD))]
        for il in range(hp.n_layer):
            H, Hkv, F = hp.head_count(il), hp.head_count_kv(il), hp.ff_length(il)
            layer = [spec(T.ATTN_NORM, (E,), il, kind="vector"), spec(T.ATTN_QKV, (E, (H + Hkv) * d + Hkv * dv), il),
                     *qk_norm_tensors(hp, il), spec(T.ATTN_OUT, (H * dv, E), il),
                     spec(T.FFN_NORM, (E,), il, kind="vector"),
                     *(spec(t, (E,), il, None, kind="vector") for t in POST_NORMS),
                     spec(T.FFN_UP, (E, 2 * F), il), spec(T.FFN_DOWN, (F, E), il)]
            specs += layer + layer_scales(layer, il)
        return specs

    def build(self, b: GraphBuilder) -> None:
        hp = self.hp
        d, dv = hp.n_embd_head_k, hp.n_embd_head_v
        x = b.build_inp_embd(b.w(T.TOKEN_EMBD))
        pos = b.build_inp_pos()
        for il in b.layers():
            H, Hkv, T_ = hp.head_count(il), hp.head_count_kv(il), b.n_tokens
            h = b.norm(x, T.ATTN_NORM, il, name="attn_norm")
            # Q, K and V: views of one product (its scale unread, as llama.cpp's graph passes none)
            qkv = b.linear(h, b.w(T.ATTN_QKV, il), name="wqkv")
            row = (H + Hkv) * d + Hkv * dv
            views = (("Qcur", d, H, 0), ("Kcur", d, Hkv, H * d), ("Vcur", dv, Hkv, (H + Hkv) * d))
            q, k, v = (b.op("view", qkv, shape=(w, n, T_), strides=(1, w, row), offset=off, name=tag)
                       for tag, w, n, off in views)
            q, k = b.norm(q, T.ATTN_Q_NORM, il, name="Qcur_normed"), b.norm(k, T.ATTN_K_NORM, il, name="Kcur_normed")
            base, scale = (hp.rope_freq_base_swa, 1.0) if hp.is_swa(il) else (None, None)
            q = b.rope(q, pos, name="Qcur.rope", freq_base=base, freq_scale=scale)
            k = b.rope(k, pos, name="Kcur.rope", freq_base=base, freq_scale=scale)
            a = b.build_attn(q, k, v, wo=b.w(T.ATTN_OUT, il), wo_s=b.scale(T.ATTN_OUT, il), kq_scale=inv_sqrt(d))
            a, x = b.last_layer_rows((a, "attn_out.rows"), (x, "inp.rows"))
            x = b.op("add", self._post_norm(b, a, T.ATTN_POST_NORM, il), x, name="ffn_inp")
            # feed-forward network
            f = b.build_ffn_fused_swiglu(b.norm(x, T.FFN_NORM, il, name="ffn_norm"), il)
            x = b.op("add", self._post_norm(b, f, T.FFN_POST_NORM, il), x, name="l_out")
        b.build_output(b.norm(x, T.OUTPUT_NORM, name="result_norm"), b.w(T.OUTPUT))

    @staticmethod
    def _post_norm(b: GraphBuilder, x: object, t: T, il: int) -> object:
        return b.build_norm(x, b.weight(tensor_name(t, il, None)), name=f"{t.name.lower()}")  # type: ignore[arg-type]


# ---- Hugging Face: convert_hf_to_gguf's Plamo3Model ---------------------------------------------------------------

def _window(c: Config) -> dict[str, object]:
    """window_size (or sliding_window) with the config's sliding_window_pattern, where the model slides."""
    window = c.find("window_size", "sliding_window", kind="size", default=None)
    if window is None:
        return {}
    return {A.SLIDING_WINDOW: window, A.SLIDING_WINDOW_PATTERN: c.find("sliding_window_pattern", kind="size")}


def _yarn(c: Config) -> dict[str, object]:
    """A flat rope_scaling_factor other than 1 is YaRN over initial_context_length, as the converter mirrors it."""
    factor = c.find("rope_scaling_factor", kind="number", default=1)
    if factor == 1 or "rope_type" in c.rope:
        return {}
    return {R.SCALING_TYPE: "yarn", R.SCALING_FACTOR: float(factor),
            R.SCALING_ORIG_CTX_LEN: c.find("initial_context_length", kind="size"), R.SCALING_YARN_BETA_FAST: 32.0,
            R.SCALING_YARN_BETA_SLOW: 1.0}


hf_config.register(Family("plamo3", TEXT + (VOCAB, _window, _yarn), {"tie_word_embeddings": True}),
                   "Plamo3ForCausalLM")

presets.register({
    "PLaMo-3-tiny": synthetic("plamo3", "a synthetic header of tiny sizes"),
    # eight layers, seven sliding over 64 positions with a base of their own, the eighth global
    "PLaMo-3-tiny-swa": synthetic("plamo3", "a synthetic header of tiny sizes with a window", keys={
        L.BLOCK_COUNT: 8, A.SLIDING_WINDOW: 64, R.FREQ_BASE_SWA: 1000.0}),
})
