"""Hunyuan v3 (hy_v3): a pre-norm decoder whose layers are dense or mixtures of experts as the file holds them.

Attention: Q, K, V (biases where the file has them), a per-head RMS norm of Q and K, NEOX RoPE over whole heads.
A layer whose file holds a router (``ffn_gate_inp``) routes each token to its ``expert_used_count`` best experts by
the file's gating function (sigmoid where absent) plus an optional selection bias ``exp_probs_b``, weights
renormalised and scaled as the file says, with its experts' gate and up stacks as one or two tensors and each
expert's scales; it adds a shared expert. Other layers are dense SwiGLU. Every FFN tensor is optional to the
loader; matrices' scales are read. The last layer runs every row and the output rows are taken after the final
norm. The last ``nextn_predict_layers`` layers are multi-token-prediction layers: loaded, never run here.

References: llama.cpp src/models/hy-v3.cpp (no public model card is cited here).
"""

from __future__ import annotations

from typing import Mapping

from gguf import MODEL_TENSOR as T
from gguf import Keys

from graphir.graph.floats import inv_sqrt
from graphir.graph.ir import Node
from graphir.memory.layers import LayerNeeds
from graphir.model import hf_config, presets
from graphir.model.architecture import Architecture
from graphir.model.builder import Gating, GraphBuilder
from graphir.model.hf_config import TEXT, VOCAB, Config, Family, derived, fixed, hf
from graphir.model.hparams import HParams, Key
from graphir.model.moe import (GATING_FUNC_KEY, MOE_KEYS, NEXTN_KEY, check_experts, expert_width, gate_up,
                               gate_up_problems, gate_up_tensors, gating, nextn_layer, shared_expert_tensors,
                               trunk_layers)
from graphir.model.presets import Preset
from graphir.model.qkv import check_whole_heads, qk_norm_tensors, qkv, qkv_tensors
from graphir.model.scales import layer_scales
from graphir.model.tensors import TensorDecl, TensorSpec, spec, tensor_name

L, A, R = Keys.LLM, Keys.Attention, Keys.Rope


class HyV3(Architecture):
    name = "hy_v3"
    rope_mode = "neox"
    required_keys = (A.HEAD_COUNT, A.LAYERNORM_RMS_EPS, L.EXPERT_FEED_FORWARD_LENGTH)
    keys = MOE_KEYS + (
        Key("n_ff_exp", L.EXPERT_FEED_FORWARD_LENGTH, list, 0),
        Key("n_ff_shexp", L.EXPERT_SHARED_FEED_FORWARD_LENGTH, int, 0, minimum=0),  # 0: the experts' width
        GATING_FUNC_KEY,
        Key("expert_weights_scale", L.EXPERT_WEIGHTS_SCALE, float, 0.0),
        Key("expert_weights_norm", L.EXPERT_WEIGHTS_NORM, bool, False),
        NEXTN_KEY,
    )

    def __init__(self, hp: HParams):
        check_experts(hp, self.name)
        check_whole_heads(hp, self.name)
        self.n_trunk = trunk_layers(hp, self.name)
        self.gating = gating(hp, self.name, Gating.SIGMOID)
        super().__init__(hp)

    def layers(self) -> LayerNeeds:
        return super().layers()[:self.n_trunk]

    def check(self, tensors: Mapping[str, TensorDecl]) -> list[str]:
        """The table's checks, each routed layer's gate and up stacks in one whole form, and each other layer's
        dense FFN (a layer is routed when the file holds its router, else dense)."""
        problems = super().check(tensors)
        for il in range(self.n_trunk):
            if tensor_name(T.FFN_GATE_INP, il) in tensors:
                problems += gate_up_problems(tensors, il)
            else:
                problems += [f"missing tensor '{tensor_name(t, il)}' (a layer without a router is a dense FFN)"
                             for t in (T.FFN_GATE, T.FFN_DOWN, T.FFN_UP) if tensor_name(t, il) not in tensors]
        return problems

    def tensors(self) -> list[TensorSpec]:
        hp = self.hp
        E, V, X, F = hp.n_embd, hp.n_vocab, hp.n_expert, hp.ff_length(0)
        F_exp = expert_width(hp)
        specs = [spec(T.TOKEN_EMBD, (E, V)), spec(T.OUTPUT_NORM, (E,), kind="vector"),
                 spec(T.OUTPUT, (E, V), tied_to=tensor_name(T.TOKEN_EMBD))]
        for il in range(hp.n_layer):
            layer = [spec(T.ATTN_NORM, (E,), il, kind="vector"), *qkv_tensors(hp, il), *qk_norm_tensors(hp, il),
                     spec(T.FFN_NORM, (E,), il, kind="vector")]
            ffn = [spec(T.FFN_GATE, (E, F), il), spec(T.FFN_DOWN, (F, E), il), spec(T.FFN_UP, (E, F), il),
                   spec(T.FFN_GATE_INP, (E, X), il), spec(T.FFN_EXP_PROBS_B, (X,), il, None, kind="vector"),
                   spec(T.FFN_DOWN_EXP, (F_exp, E, X), il), *shared_expert_tensors(E, hp.n_ff_shexp or F_exp, il)]
            layer += [TensorSpec(s.name, s.shape, s.kind, optional=True) for s in ffn]
            layer += gate_up_tensors(E, F_exp, X, il)
            layer += layer_scales(layer, il, X)
            specs += layer if il < self.n_trunk else nextn_layer(layer, hp, il)
        return specs

    def ffn(self, b: GraphBuilder, h: Node, il: int) -> Node:
        hp, w, s = self.hp, b.w, b.scale
        if b.w_opt(T.FFN_GATE_INP, il) is None:
            return b.build_ffn(h, up=w(T.FFN_UP, il), gate=w(T.FFN_GATE, il), down=w(T.FFN_DOWN, il),
                               up_s=s(T.FFN_UP, il), gate_s=s(T.FFN_GATE, il), down_s=s(T.FFN_DOWN, il),
                               name="ffn_dense_out")
        stacks = gate_up(b, il)
        moe = b.build_moe_ffn(h, gate_inp=w(T.FFN_GATE_INP, il), **stacks, down_exps=w(T.FFN_DOWN_EXP, il),
                              n_expert=hp.n_expert, n_expert_used=hp.n_expert_used, gating=self.gating,
                              norm_w=hp.expert_weights_norm, w_scale=hp.expert_weights_scale,
                              probs_b=b.w_opt(T.FFN_EXP_PROBS_B, il, None),
                              up_exps_s=s(T.FFN_UP_EXP, il), gate_exps_s=s(T.FFN_GATE_EXP, il),
                              down_exps_s=s(T.FFN_DOWN_EXP, il))
        shared = b.build_ffn(h, up=w(T.FFN_UP_SHEXP, il), gate=w(T.FFN_GATE_SHEXP, il), down=w(T.FFN_DOWN_SHEXP, il),
                             up_s=s(T.FFN_UP_SHEXP, il), gate_s=s(T.FFN_GATE_SHEXP, il),
                             down_s=s(T.FFN_DOWN_SHEXP, il), name="ffn_shared_out")
        return b.op("add", moe, shared, name="ffn_out")

    def build(self, b: GraphBuilder) -> None:
        hp = self.hp
        x = b.build_inp_embd(b.w(T.TOKEN_EMBD))
        pos = b.build_inp_pos()
        for il in b.layers(self.n_trunk):
            h = b.norm(x, T.ATTN_NORM, il, name="attn_norm")
            q, k, v = qkv(b, h, il, normed=True)
            q, k = b.rope(q, pos, name="Qcur.rope"), b.rope(k, pos, name="Kcur.rope")
            a = b.build_attn(q, k, v, wo=b.w(T.ATTN_OUT, il), wo_s=b.scale(T.ATTN_OUT, il),
                             kq_scale=inv_sqrt(hp.n_embd_head_k))
            x = b.op("add", a, x, name="ffn_inp")  # every row on, in the last layer too
            f = self.ffn(b, b.norm(x, T.FFN_NORM, il, name="ffn_norm"), il)
            x = b.op("add", f, x, name="l_out")
        x = b.norm(x, T.OUTPUT_NORM, name="h_nextn")
        x = b.op("get_rows", x, b.build_inp_out_ids(), name="result_norm")  # the output rows, after the norm
        b.build_output(x, b.w(T.OUTPUT))


# ---- Hugging Face: what convert_hf_to_gguf writes for HYV3ForCausalLM ---------------------------------------


def _nextn(c: Config) -> int:
    return c.find("num_nextn_predict_layers", kind="size", default=0)


def _written(c: Config) -> str:
    """The dense lead's FFNs, the routed layers' routers, selection biases, expert and shared expert stacks (the
    converter writes the NextN layers' tensors too; they are all optional here)."""
    n_layer, lead = c.find("num_hidden_layers"), c.find("first_k_dense_replace", kind="size", default=0)
    dense = "|".join(str(il) for il in range(lead)) or "none"
    routed = "|".join(str(il) for il in range(lead, n_layer))
    return (rf"blk\.({dense})\.ffn_(gate|up|down)\.weight|blk\.({routed})\.(ffn_gate_inp|ffn_(gate|up|down)_(exps|shexp))"
            rf"\.weight|blk\.({routed})\.exp_probs_b")


hf_config.register(Family("hy_v3", TEXT + (
    derived(L.BLOCK_COUNT, lambda c: c.find("num_hidden_layers") + _nextn(c)),  # the NextN layers appended
    derived(L.NEXTN_PREDICT_LAYERS, lambda c: _nextn(c) or None),
    hf(L.EXPERT_FEED_FORWARD_LENGTH, "moe_intermediate_size"),
    derived(L.EXPERT_SHARED_FEED_FORWARD_LENGTH,
            lambda c: c.find("moe_intermediate_size") * c.find("num_shared_experts", kind="size", default=1)),
    derived(L.EXPERT_WEIGHTS_NORM, lambda c: c.find("route_norm", kind="flag", default=True)),
    derived(L.EXPERT_WEIGHTS_SCALE, lambda c: c.find("router_scaling_factor", kind="number", default=1.0)),
    fixed(L.EXPERT_GATING_FUNC, 2),  # sigmoid with a selection bias
    VOCAB,
), {"tie_word_embeddings": False}, _written), "HYV3ForCausalLM")


# ---- presets: a synthetic header (no public config is given here) -------------------------------------------

presets.register({
    # 4 layers (the first dense, as its file holds no router), 8 experts of 128 with 2 per token by sigmoid scores
    # and a selection bias, renormalised and scaled by 2.5, a shared expert, and one NextN layer
    "HY-V3-synthetic": Preset("hy_v3", {
        L.CONTEXT_LENGTH: 4096, L.EMBEDDING_LENGTH: 256, L.BLOCK_COUNT: 5, L.FEED_FORWARD_LENGTH: 384,
        A.HEAD_COUNT: 2, A.HEAD_COUNT_KV: 1, R.FREQ_BASE: 10000.0, A.LAYERNORM_RMS_EPS: 1e-6, L.EXPERT_COUNT: 8,
        L.EXPERT_USED_COUNT: 2, L.EXPERT_FEED_FORWARD_LENGTH: 128, L.EXPERT_WEIGHTS_SCALE: 2.5,
        L.EXPERT_WEIGHTS_NORM: True, L.EXPERT_GATING_FUNC: 2, L.NEXTN_PREDICT_LAYERS: 1, L.VOCAB_SIZE: 1024,
    }, tied=False, include=r"blk\.0\.ffn_(gate|up|down)\.weight|blk\.[123]\.(ffn_gate_inp|ffn_(gate|up|down)_(exps|shexp))"
                           r"\.weight|blk\.[123]\.exp_probs_b", f32=presets.ROUTER_F32, source="synthetic header"),
})
