"""Snowflake Arctic (arctic): a dense decoder whose every layer adds, beside its residual SwiGLU FFN of the model
width, a parallel mixture of experts that reads the layer's input (its own RMS norm of it, not the attention's
output): x += attn(norm(x)); y = x + ffn(norm(x)); out = y + moe(norm_exps(layer input)).

References: Snowflake 2024, "Snowflake Arctic"; llama.cpp src/models/arctic.cpp.
"""

from __future__ import annotations

from gguf import MODEL_TENSOR as T
from gguf import Keys

from graphir.model import hf_config, presets
from graphir.model.architecture import Architecture
from graphir.model.builder import GraphBuilder
from graphir.model.hf_config import TEXT, VOCAB, Family
from graphir.model.hparams import HParams
from graphir.model.moe import MOE_KEYS, routed_expert_tensors, experts, check_routed
from graphir.model.presets import Preset
from graphir.model.qkv import check_head_sizes, qkv_tensors
from graphir.model.scales import layer_scales
from graphir.model.tensors import TensorSpec, spec, tensor_name

L, A, R = Keys.LLM, Keys.Attention, Keys.Rope


class Arctic(Architecture):
    name = "arctic"
    rope_mode = "norm"
    required_keys = (L.FEED_FORWARD_LENGTH, A.HEAD_COUNT, A.LAYERNORM_RMS_EPS)
    keys = MOE_KEYS

    def __init__(self, hp: HParams):
        check_routed(hp, self.name)
        check_head_sizes(hp, self.name)
        super().__init__(hp)

    def tensors(self) -> list[TensorSpec]:
        """The residual FFN is n_embd wide; the experts are ``feed_forward_length`` wide, their gates required."""
        hp = self.hp
        E, V, X = hp.n_embd, hp.n_vocab, hp.n_expert
        specs = [spec(T.TOKEN_EMBD, (E, V)), spec(T.OUTPUT_NORM, (E,), kind="vector"),
                 spec(T.OUTPUT, (E, V), tied_to=tensor_name(T.TOKEN_EMBD))]
        for il in range(hp.n_layer):
            F = hp.ff_length(il)
            layer = [spec(T.ATTN_NORM, (E,), il, kind="vector"), *qkv_tensors(hp, il),
                     spec(T.FFN_NORM, (E,), il, kind="vector"), spec(T.FFN_GATE, (E, E), il),
                     spec(T.FFN_DOWN, (E, E), il), spec(T.FFN_UP, (E, E), il),
                     spec(T.FFN_NORM_EXP, (E,), il, kind="vector"), *routed_expert_tensors(E, F, X, il)]
            specs += layer + layer_scales(layer, il, X)
        return specs

    def build(self, b: GraphBuilder) -> None:
        hp = self.hp
        x = b.build_inp_embd(b.w(T.TOKEN_EMBD))
        pos = b.build_inp_pos()
        for il in b.layers():
            h = b.norm(x, T.ATTN_NORM, il, name="attn_norm")
            q, k, v = b.build_qkv(h, il)
            q = b.rope(q, pos, name="Qcur.rope")
            k = b.rope(k, pos, name="Kcur.rope")
            a = b.build_attn(q, k, v, wo=b.w(T.ATTN_OUT, il), wo_s=b.scale(T.ATTN_OUT, il), kq_scale=b.kq_scale())
            a, x = b.last_layer_rows((a, "attn_out.rows"), (x, "inp.rows"))
            y = b.op("add", a, x, name="ffn_inp")
            # the residual FFN over the attention's output, and the experts over the layer's input
            f = b.build_ffn(b.norm(y, T.FFN_NORM, il, name="ffn_norm"), up=b.w(T.FFN_UP, il),
                            gate=b.w(T.FFN_GATE, il), down=b.w(T.FFN_DOWN, il))
            y = b.op("add", f, y, name="ffn_res")
            h = b.norm(x, T.FFN_NORM_EXP, il, name="ffn_norm_exps")
            moe = b.build_moe_ffn(h, **experts(b, il), n_expert=hp.n_expert, n_expert_used=hp.n_expert_used,
                                  norm_w=True)
            x = b.op("add", moe, y, name="l_out")
        x = b.norm(x, T.OUTPUT_NORM, name="result_norm")
        b.build_output(x, b.w(T.OUTPUT))


# ---- Hugging Face: what convert_hf_to_gguf writes for these configs -----------------------------------------

hf_config.register(Family("arctic", TEXT + (VOCAB,), {"tie_word_embeddings": False},
                          lambda c: presets.EXPERT_GATES), "ArcticForCausalLM")


# ---- presets: released models of this family, as their converted GGUFs declare them ---------------------

presets.register({
    # 35 layers of width 7168, 56 query and 8 KV heads of 128; a residual FFN of 7168 and 128 experts of 4864,
    # 2 per token, in every layer
    "Snowflake-Arctic": Preset("arctic", {
        L.CONTEXT_LENGTH: 4096, L.EMBEDDING_LENGTH: 7168, L.BLOCK_COUNT: 35, L.FEED_FORWARD_LENGTH: 4864,
        A.HEAD_COUNT: 56, A.HEAD_COUNT_KV: 8, R.FREQ_BASE: 10000.0, A.LAYERNORM_RMS_EPS: 1e-5, L.VOCAB_SIZE: 32000,
        L.EXPERT_COUNT: 128, L.EXPERT_USED_COUNT: 2,
    }, tied=False, include=presets.EXPERT_GATES, f32=presets.ROUTER_F32,
        source="Snowflake/snowflake-arctic-instruct config.json"),
})
