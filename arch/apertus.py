"""Apertus (apertus): a pre-RMSNorm decoder with QK-norm and an ungated FFN whose activation is xIELU, with
trained parameters of its own in every layer.

Attention: each head of Q and K RMS-normalised with a learned scale (the optional norm biases are loaded and not
read, as llama.cpp's graph), NEOX-RoPE'd (rope_freqs divisors, or LongRoPE's long or short ones, where the file
has them), grouped-query attention scored by 1/sqrt(head size). FFN: ``W_down xielu(W_up x)``, xIELU being
``alpha_p x^2 + beta x`` for x > 0 and ``(e^min(x, eps) - 1 - x) alpha_n + beta x`` below, with the layer's
``xielu.alpha_n``/``alpha_p`` passed through softplus (ggml_xielu: alpha_n + beta) and its ``beta`` and ``eps``.
The family's golden graphs come from a synthetic header (Apertus-tiny): a released model's xIELU parameters are
tensor data of its checkpoint, which no config holds.
References: Swiss AI 2025, "Apertus"; Huang 2025, "Deriving Activation Functions Using Integration" (xIELU);
llama.cpp src/models/apertus.cpp.
"""

from __future__ import annotations

from dataclasses import replace

from gguf import MODEL_TENSOR as T
from gguf import Keys

from graphir.graph.floats import f32, inv_sqrt, softplus
from graphir.model import hf_config, presets
from graphir.model.architecture import Architecture
from graphir.model.builder import GraphBuilder
from graphir.model.hf_config import Config, Family, derived
from graphir.model.hparams import HParams, Key
from graphir.model.presets import Preset
from graphir.model.qkv import qkv_tensors
from graphir.model.rope_factors import long_context, longrope, rope_factor_tensors, rope_factors
from graphir.model.scales import layer_scales
from graphir.model.tensors import TensorSpec, spec

L, A, R = Keys.LLM, Keys.Attention, Keys.Rope
# llama.cpp's LLM_KV_XIELU_* keys, which carry no architecture prefix: one value, or one per layer
XIELU = {"xielu_alpha_n": "xielu.alpha_n", "xielu_alpha_p": "xielu.alpha_p", "xielu_beta": "xielu.beta",
         "xielu_eps": "xielu.eps"}


class Apertus(Architecture):
    name = "apertus"
    rope_mode = "neox"
    required_keys = (L.FEED_FORWARD_LENGTH, A.HEAD_COUNT, A.LAYERNORM_RMS_EPS)
    keys = tuple(Key(field, template, tuple, None, required=True, item=float) for field, template in XIELU.items())

    def __init__(self, hp: HParams):
        """Each layer's xIELU as ggml's op parameters (ggml_xielu's softplus steps, in float32), which its node
        carries (the hparams keep the layer counts and sizes alone)."""
        self.xielu = tuple({"alpha_n": f32(beta + softplus(alpha_n)), "alpha_p": softplus(alpha_p), "beta": beta,
                            "eps": eps}
                           for alpha_n, alpha_p, beta, eps in zip(hp.xielu_alpha_n, hp.xielu_alpha_p, hp.xielu_beta,
                                                                  hp.xielu_eps))
        super().__init__(replace(hp, family=()))

    def variant(self, n_ctx_seq: int) -> bool:
        return longrope(self.hp) and long_context(self.hp, n_ctx_seq)

    def tensors(self) -> list[TensorSpec]:
        hp = self.hp
        E, V, F, d = hp.n_embd, hp.n_vocab, hp.n_ff, hp.n_embd_head_k
        specs = [spec(T.TOKEN_EMBD, (E, V)), spec(T.OUTPUT_NORM, (E,), kind="vector"), spec(T.OUTPUT, (E, V)),
                 *rope_factor_tensors(hp)]
        for il in range(hp.n_layer):
            layer = [spec(T.ATTN_NORM, (E,), il, kind="vector"), *qkv_tensors(hp, il),
                     spec(T.ATTN_OUT, (E,), il, "bias", kind="vector", optional=True),
                     spec(T.FFN_NORM, (E,), il, kind="vector"), spec(T.FFN_DOWN, (F, E), il),
                     spec(T.FFN_UP, (E, F), il), spec(T.ATTN_Q_NORM, (d,), il, kind="vector"),
                     spec(T.ATTN_Q_NORM, (d,), il, "bias", kind="vector", optional=True),
                     spec(T.ATTN_K_NORM, (d,), il, kind="vector"),
                     spec(T.ATTN_K_NORM, (d,), il, "bias", kind="vector", optional=True)]
            specs += layer + layer_scales(layer, il)  # read: Q, K, V and attention's output scales
        return specs

    def build(self, b: GraphBuilder) -> None:
        hp = self.hp
        x = b.build_inp_embd(b.w(T.TOKEN_EMBD))
        pos = b.build_inp_pos()
        for il in b.layers():
            h = b.norm(x, T.ATTN_NORM, il, name="attn_norm")
            # self-attention: Q and K normalised per head (weights only), RoPE'd
            q, k, v = b.build_qkv(h, il)
            q = b.build_norm(q, b.w(T.ATTN_Q_NORM, il), name="Qcur_normed")
            k = b.build_norm(k, b.w(T.ATTN_K_NORM, il), name="Kcur_normed")
            q = b.rope(q, pos, rope_factors(b), name="Qcur.rope")
            k = b.rope(k, pos, rope_factors(b), name="Kcur.rope")
            a = b.build_attn(q, k, v, wo=b.w(T.ATTN_OUT, il), wo_b=b.w_opt(T.ATTN_OUT, il, "bias"),
                             wo_s=b.scale(T.ATTN_OUT, il), kq_scale=inv_sqrt(hp.n_embd_head_k))
            a, x = b.last_layer_rows((a, "attn_out.rows"), (x, "inp.rows"))
            x = b.op("add", a, x, name="ffn_inp")
            # feed-forward network: xIELU between the up and down projections (their scales unread)
            up = b.linear(b.norm(x, T.FFN_NORM, il, name="ffn_norm"), b.w(T.FFN_UP, il), name="ffn_up")
            f = b.linear(b.op("xielu", up, name="ffn_xielu", **self.xielu[il]), b.w(T.FFN_DOWN, il), name="ffn_down")
            x = b.op("add", f, x, name="l_out")
        x = b.norm(x, T.OUTPUT_NORM, name="result_norm")
        b.build_output(x, b.w(T.OUTPUT))


# ---- Hugging Face: convert_hf_to_gguf's ApertusModel (a LlamaModel) -----------------------------------------

def _xielu_init(c: Config) -> dict[str, float]:
    """The xIELU parameters the converter copies from the checkpoint's tensors: a config holds none, so a graph
    from a config takes the modelling code's initial values (alpha_p, alpha_n 0.8, beta 0.5, eps -1e-6)."""
    return dict(zip(XIELU.values(), (0.8, 0.8, 0.5, -1e-6)))


hf_config.register(Family("apertus", hf_config.TEXT + (
    hf_config.VOCAB, derived(R.DIMENSION_COUNT, hf_config.head_dim), _xielu_init,
), {"tie_word_embeddings": False}), "ApertusForCausalLM")

# ---- presets -----------------------------------------------------------------------------------------------

presets.register({
    # a synthetic header of Apertus's layout (not a released model): 4 layers of 8 heads (2 KV heads) of 64, xIELU
    # at the initial values a config gives
    "Apertus-tiny": Preset("apertus", {
        L.CONTEXT_LENGTH: 4096, L.EMBEDDING_LENGTH: 512, L.BLOCK_COUNT: 4, L.FEED_FORWARD_LENGTH: 2048,
        A.HEAD_COUNT: 8, A.HEAD_COUNT_KV: 2, A.LAYERNORM_RMS_EPS: 1e-5, R.FREQ_BASE: 12000000.0,
        R.DIMENSION_COUNT: 64, L.VOCAB_SIZE: 1024, **dict(zip(XIELU.values(), (0.8, 0.8, 0.5, -1e-6))),
    }, tied=False, source="a synthetic header of apertus's layout, xIELU at its initial values"),
})
