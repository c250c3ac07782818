"""GPT-NeoX (EleutherAI: GPT-NeoX-20B, Pythia): a pre-LN decoder with fused biased QKV, NEOX RoPE over the
first ``rope.dimension_count`` values of each head (Pythia: a quarter), a GELU MLP with biases and an LM head of
its own.

With ``use_parallel_residual`` (every released model) attention and MLP read the layer's input in parallel,
each through its own LayerNorm: ``x + attn(LN1(x)) + mlp(LN2(x))``; without it, in sequence, as GPT-2's blocks.

References: Black et al. 2022, "GPT-NeoX-20B: An Open-Source Autoregressive Language Model"; Biderman et al. 2023,
"Pythia: A Suite for Analyzing Large Language Models"; llama.cpp src/models/gptneox.cpp.
"""

from __future__ import annotations

from gguf import MODEL_TENSOR as T
from gguf import Keys

from graphir.model import hf_config, presets
from graphir.model.architecture import Architecture
from graphir.model.builder import Act, GraphBuilder, Norm
from graphir.model.hf_config import BLOCKS, VOCAB, Family, derived, hf
from graphir.model.hparams import Key
from graphir.model.presets import Preset
from graphir.model.qkv import roped_attention
from graphir.model.scales import layer_scales
from graphir.model.tensors import TensorSpec, spec, with_bias

L, A, R = Keys.LLM, Keys.Attention, Keys.Rope


class GPTNeoX(Architecture):
    name = "gptneox"
    rope_mode = "neox"
    required_keys = (L.FEED_FORWARD_LENGTH, A.HEAD_COUNT, A.LAYERNORM_EPS)
    keys = (Key("use_par_res", L.USE_PARALLEL_RESIDUAL, bool, required=True),)

    def tensors(self) -> list[TensorSpec]:
        hp = self.hp
        E, F, V = hp.n_embd, hp.n_ff, hp.n_vocab
        specs = [spec(T.TOKEN_EMBD, (E, V)), *with_bias(T.OUTPUT_NORM, (E,)), spec(T.OUTPUT, (E, V))]
        for il in range(hp.n_layer):
            layer = [*with_bias(T.ATTN_NORM, (E,), il),
                     *with_bias(T.ATTN_QKV, (E, E + 2 * hp.n_embd_v_gqa), il),
                     *with_bias(T.ATTN_OUT, (E, E), il),
                     *with_bias(T.FFN_NORM, (E,), il),
                     *with_bias(T.FFN_UP, (E, F), il),
                     *with_bias(T.FFN_DOWN, (F, E), il)]
            specs += layer + layer_scales(layer, il)
        return specs

    def build(self, b: GraphBuilder) -> None:
        hp = self.hp
        x = b.build_inp_embd(b.w(T.TOKEN_EMBD))
        pos = b.build_inp_pos()
        for il in b.layers():
            h = b.norm(x, T.ATTN_NORM, il, Norm.LAYER, name="attn_norm")
            a = roped_attention(b, h, pos, il, wo_bias=True)
            a, x = b.last_layer_rows((a, "attn_out.rows"), (x, "inp.rows"))
            if hp.use_par_res:  # both branches read the layer's input
                h = b.norm(x, T.FFN_NORM, il, Norm.LAYER, name="ffn_norm")
                f = self._mlp(b, h, il)
                x = b.op("add", b.op("add", f, x, name="ffn_res"), a, name="l_out")
            else:
                x = b.op("add", a, x, name="ffn_inp")
                f = self._mlp(b, b.norm(x, T.FFN_NORM, il, Norm.LAYER, name="ffn_norm"), il)
                x = b.op("add", f, x, name="l_out")
        x = b.norm(x, T.OUTPUT_NORM, kind=Norm.LAYER, name="result_norm")
        b.build_output(x, b.w(T.OUTPUT))

    @staticmethod
    def _mlp(b: GraphBuilder, h, il: int):  # type: ignore[no-untyped-def]
        """The GELU MLP with its biases (its matrices' scales unread, as llama.cpp's graph passes none)."""
        return b.build_ffn(h, up=b.w(T.FFN_UP, il), up_b=b.w(T.FFN_UP, il, "bias"), gate=None,
                           down=b.w(T.FFN_DOWN, il), down_b=b.w(T.FFN_DOWN, il, "bias"), act=Act.GELU)


# ---- Hugging Face: convert_hf_to_gguf's GPTNeoXModel -----------------------------------------------------------

hf_config.register(Family("gptneox", (
    hf(L.BLOCK_COUNT, *BLOCKS),
    hf(L.CONTEXT_LENGTH, "max_position_embeddings"),
    hf(L.EMBEDDING_LENGTH, "hidden_size"),
    hf(L.FEED_FORWARD_LENGTH, "intermediate_size"),
    derived(R.DIMENSION_COUNT, lambda c: int(c.find("rotary_pct", kind="number", default=1.0)
                                             * (c.find("hidden_size") // c.find("num_attention_heads")))),
    hf(A.HEAD_COUNT, "num_attention_heads"),
    derived(L.USE_PARALLEL_RESIDUAL, lambda c: c.find("use_parallel_residual", kind="flag", default=True)),
    hf(A.LAYERNORM_EPS, "layer_norm_eps", kind="number"),
    VOCAB,
), {"tie_word_embeddings": False}), "GPTNeoXForCausalLM")

presets.register({
    # 24 layers of 16 heads of 128, RoPE over a quarter of each head
    "Pythia-1.4B": Preset("gptneox", {
        L.CONTEXT_LENGTH: 2048, L.EMBEDDING_LENGTH: 2048, L.BLOCK_COUNT: 24, L.FEED_FORWARD_LENGTH: 8192,
        R.DIMENSION_COUNT: 32, A.HEAD_COUNT: 16, L.USE_PARALLEL_RESIDUAL: True, A.LAYERNORM_EPS: 1e-5,
        L.VOCAB_SIZE: 50304,
    }, tied=False, source="EleutherAI/pythia-1.4b config.json"),
})
