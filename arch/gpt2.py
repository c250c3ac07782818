"""GPT-2: a pre-LN decoder with a learned position table, fused biased QKV and a GELU MLP.

Each block is ``x += attn(LN(x))`` then ``x += mlp(LN(x))``, every LayerNorm and projection with a bias;
attention is causal multi-head attention without rotary positions: positions are the rows of a trained table
added to the token embeddings, so a context cannot hold more than ``n_ctx_train`` positions. The LM head is
the token embedding unless the file has its own ``output.weight``.
Reference: Radford et al. 2019, "Language Models are Unsupervised Multitask Learners"; llama.cpp
src/models/gpt2.cpp.
"""

from __future__ import annotations

import math

from gguf import MODEL_TENSOR as T
from gguf import Keys

from graphir.model.architecture import Architecture
from graphir.model.builder import Act, GraphBuilder, Norm
from graphir.model.hparams import f32
from graphir.model.tensors import TensorSpec, spec, tensor_name, with_bias
from graphir.model import presets
from graphir.model.presets import Preset


class Gpt2(Architecture):
    name = "gpt2"
    rope_mode = "none"  # positions come from the table, not from rotations
    learned_positions = True
    required_keys = (Keys.LLM.FEED_FORWARD_LENGTH, Keys.Attention.HEAD_COUNT, Keys.Attention.LAYERNORM_EPS)

    def tensors(self) -> list[TensorSpec]:
        hp = self.hp
        E, F, V = hp.n_embd, hp.n_ff, hp.n_vocab
        specs = [
            spec(T.TOKEN_EMBD, (E, V)),
            spec(T.POS_EMBD, (E, hp.n_ctx_train)),
            *with_bias(T.OUTPUT_NORM, (E,)),
            spec(T.OUTPUT, (E, V), tied_to=tensor_name(T.TOKEN_EMBD)),
        ]
        for il in range(hp.n_layer):
            specs += [
                *with_bias(T.ATTN_NORM, (E,), il),
                *with_bias(T.ATTN_QKV, (E, E + 2 * hp.n_embd_v_gqa), il),
                *with_bias(T.ATTN_OUT, (E, E), il),
                *with_bias(T.FFN_NORM, (E,), il),
                *with_bias(T.FFN_UP, (E, F), il),
                *with_bias(T.FFN_DOWN, (F, E), il),
            ]
        return specs

    def build(self, b: GraphBuilder) -> None:
        hp = self.hp
        pos = b.build_inp_pos()
        x = b.op("add", b.build_inp_embd(b.w(T.TOKEN_EMBD)), b.op("get_rows", b.w(T.POS_EMBD), pos, name="pos_embd"),
                 name="inpL")
        out_ids = b.build_inp_out_ids()
        kq_scale = f32(1.0 / f32(math.sqrt(hp.n_embd_head_k)))  # 1.0f / sqrtf(d): no attention.scale key is read
        for il in range(hp.n_layer):
            with b.layer(il):
                h = b.build_norm(x, b.w(T.ATTN_NORM, il), b.w(T.ATTN_NORM, il, "bias"), Norm.LAYER, name="attn_norm")
                q, k, v = b.build_qkv(h, il)
                a = b.build_attn(q, k, v, wo=b.w(T.ATTN_OUT, il), wo_b=b.w(T.ATTN_OUT, il, "bias"), kq_scale=kq_scale)
                if il == hp.n_layer - 1:  # only requested rows go through the last MLP and the head
                    a = b.op("get_rows", a, out_ids, name="attn_out.rows")
                    x = b.op("get_rows", x, out_ids, name="inp.rows")
                x = b.op("add", a, x, name="ffn_inp")
                h = b.build_norm(x, b.w(T.FFN_NORM, il), b.w(T.FFN_NORM, il, "bias"), Norm.LAYER, name="ffn_norm")
                f = b.build_ffn(h, up=b.w(T.FFN_UP, il), up_b=b.w(T.FFN_UP, il, "bias"), gate=None,
                                down=b.w(T.FFN_DOWN, il), down_b=b.w(T.FFN_DOWN, il, "bias"), act=Act.GELU)
                x = b.op("add", f, x, name="l_out")
        x = b.build_norm(x, b.w(T.OUTPUT_NORM), b.w(T.OUTPUT_NORM, suffix="bias"), Norm.LAYER, name="result_norm")
        b.build_output(x, b.w(T.OUTPUT))


# ---- presets: released models of this family, as their converted GGUFs declare them ---------------------

L, A = Keys.LLM, Keys.Attention


presets.register({
    # GPT-2 small; the converter keeps the position table in f32, and the LM head is the token embedding.
    "GPT-2": Preset("gpt2", {
        L.CONTEXT_LENGTH: 1024, L.EMBEDDING_LENGTH: 768, L.BLOCK_COUNT: 12, L.FEED_FORWARD_LENGTH: 3072,
        A.HEAD_COUNT: 12, A.LAYERNORM_EPS: 1e-5, L.VOCAB_SIZE: 50257,
    }, tied=True, f32=r"position_embd\.weight", source="openai-community/gpt2 config.json"),
})
