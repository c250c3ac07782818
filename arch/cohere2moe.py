"""Cohere's mixture of experts (cohere2moe): Command R7B's parallel block with experts.

Each layer is ``x + ffn(norm(x)) + attn(norm(x))``: one norm without bias (a LayerNorm, or an RMSNorm where the file
gives ``attention.layer_norm_rms_epsilon``) feeds both branches. Three of every four layers after the first of
each four slide over ``attention.sliding_window`` positions; those and the ``leading_dense_block_count`` first
layers rotate Q and K, the other global layers attend without positions. The leading layers' FFNs are dense
SwiGLU; the others route each token to its ``expert_used_count`` best experts (sigmoid unless the file's gating
function says otherwise; weights normalised and scaled as the file says; gate and up one stack or two) and, with
shared experts, average the experts' output with the shared expert's. The output rows are taken after the final
norm, and the logits multiplied by ``logit_scale``. Multi-token-prediction layers (``nextn_predict_layers``) load
and never run: llama.cpp's main graph leaves them to its draft graph.

Reference: llama.cpp src/models/cohere2moe.cpp. No public configuration is at hand: the golden graphs come from a
tiny header.
"""

from __future__ import annotations

from gguf import MODEL_TENSOR as T
from gguf import Keys

from graphir.errors import MetadataError
from graphir.graph.floats import inv_sqrt
from graphir.memory.layers import LayerNeeds
from graphir.model import hf_config, presets
from graphir.model.architecture import Architecture
from graphir.model.builder import Gating, GraphBuilder, Norm
from graphir.model.hf_config import BLOCKS, TEXT, VOCAB, Config, Family, derived, fixed, hf
from graphir.model.hparams import HParams, Key, SlidingWindow
from graphir.model.moe import (MOE_KEYS, NEXTN_KEY, check_routed, gate_up, gate_up_tensors, gating, nextn_layer,
                               nextn_written, shared_expert_tensors, trunk_layers)
from graphir.model.presets import Preset
from graphir.model.qkv import check_whole_heads, fused_or_split_qkv_tensors
from graphir.model.scales import layer_scales
from graphir.model.tensors import TensorSpec, spec, swiglu_tensors, tensor_name

L, A, R = Keys.LLM, Keys.Attention, Keys.Rope


class Cohere2Moe(Architecture):
    name = "cohere2moe"
    rope_mode = "norm"
    required_keys = (A.SLIDING_WINDOW, L.LOGIT_SCALE, L.LEADING_DENSE_BLOCK_COUNT, L.EXPERT_FEED_FORWARD_LENGTH)
    swa = SlidingWindow("standard", period=4, dense_first=True)
    keys = MOE_KEYS + (
        Key("logit_scale", L.LOGIT_SCALE, float, 0.0),  # 0: the logits as they are
        Key("n_layer_dense_lead", L.LEADING_DENSE_BLOCK_COUNT, int, 0, minimum=0),
        Key("n_ff_exp", L.EXPERT_FEED_FORWARD_LENGTH, tuple, (), minimum=0),  # 0: feed_forward_length
        Key("n_ff_shexp", L.EXPERT_SHARED_FEED_FORWARD_LENGTH, int, 0, minimum=0),  # 0: the experts' times their count
        Key("n_expert_shared", L.EXPERT_SHARED_COUNT, int, 0, minimum=0),
        Key("expert_weights_norm", L.EXPERT_WEIGHTS_NORM, bool, False),
        Key("expert_weights_scale", L.EXPERT_WEIGHTS_SCALE, float, 0.0),
        Key("expert_gating_func", L.EXPERT_GATING_FUNC, int, 0, minimum=0),  # 0: sigmoid
        Key("rope_freq_base_swa", R.FREQ_BASE_SWA, float, default_from="rope_freq_base"),  # read, not used
        NEXTN_KEY,
    )

    def __init__(self, hp: HParams):
        if not (hp.norm_eps or hp.norm_rms_eps):
            raise MetadataError(f"a '{self.name}' model needs its norms' epsilon ("
                                f"'{A.LAYERNORM_EPS.format(arch=self.name)}' or "
                                f"'{A.LAYERNORM_RMS_EPS.format(arch=self.name)}')")
        check_routed(hp, self.name)
        check_whole_heads(hp, self.name)
        self.gating = gating(hp, self.name, Gating.SIGMOID)
        self.n_trunk = trunk_layers(hp, self.name)  # the prediction layers after it are loaded, never run
        super().__init__(hp)

    @property
    def norm(self) -> Norm:
        """RMSNorm where the file gives its epsilon, else LayerNorm (llama.cpp reads the type off the keys)."""
        return Norm.RMS if self.hp.norm_rms_eps else Norm.LAYER

    @property
    def widths(self) -> tuple[int, int]:
        """An expert's width and the shared expert's."""
        hp = self.hp
        n_ff_exp = hp.n_ff_exp[0] or hp.ff_length(0)
        return n_ff_exp, hp.n_ff_shexp or n_ff_exp * hp.n_expert_shared

    def layers(self) -> LayerNeeds:
        return super().layers()[:self.n_trunk]

    def tensors(self) -> list[TensorSpec]:
        hp = self.hp
        E, V, X = hp.n_embd, hp.n_vocab, hp.n_expert
        Fx, Fs = self.widths
        specs = [spec(T.TOKEN_EMBD, (E, V)), spec(T.OUTPUT_NORM, (E,), kind="vector"),
                 spec(T.OUTPUT, (E, V), tied_to=tensor_name(T.TOKEN_EMBD))]
        for il in range(hp.n_layer):
            layer = [spec(T.ATTN_NORM, (E,), il, kind="vector"), *fused_or_split_qkv_tensors(hp, il),
                     spec(T.ATTN_OUT, (hp.head_count(il) * hp.n_embd_head_v, E), il)]
            if il < hp.n_layer_dense_lead:
                F = hp.ff_length(il)
                layer += swiglu_tensors(E, F, il)
            else:
                layer += [spec(T.FFN_GATE_INP, (E, X), il), spec(T.FFN_DOWN_EXP, (Fx, E, X), il),
                          *gate_up_tensors(E, Fx, X, il), *(shared_expert_tensors(E, Fs, il) if hp.n_expert_shared
                                                            else ())]
            layer += layer_scales(layer, il, X)
            specs += layer if il < self.n_trunk else nextn_layer(layer, hp, il)
        return specs

    def build(self, b: GraphBuilder) -> None:
        hp, w, s = self.hp, b.w, b.scale
        x = b.build_inp_embd(w(T.TOKEN_EMBD))
        pos = b.build_inp_pos()
        for il in b.layers(self.n_trunk):
            h = b.norm(x, T.ATTN_NORM, il, self.norm, name="attn_norm")
            q, k, v = b.build_qkv(h, il)
            if hp.is_swa(il) or il < hp.n_layer_dense_lead:  # the sliding and the leading layers know positions
                q = b.rope(q, pos, name="Qcur.rope")
                k = b.rope(k, pos, name="Kcur.rope")
            a = b.build_attn(q, k, v, wo=w(T.ATTN_OUT, il), wo_s=s(T.ATTN_OUT, il), kq_scale=inv_sqrt(hp.n_embd_head_k))
            # the FFN reads the attention's norm
            if il < hp.n_layer_dense_lead:
                f = b.build_ffn(h, up=w(T.FFN_UP, il), up_s=s(T.FFN_UP, il), gate=w(T.FFN_GATE, il),
                                gate_s=s(T.FFN_GATE, il), down=w(T.FFN_DOWN, il), down_s=s(T.FFN_DOWN, il))
            else:
                router = w(T.FFN_GATE_INP, il)
                f = b.build_moe_ffn(h, gate_inp=router, **gate_up(b, il), down_exps=w(T.FFN_DOWN_EXP, il),
                                    n_expert=hp.n_expert, n_expert_used=hp.n_expert_used, gating=self.gating,
                                    norm_w=hp.expert_weights_norm, w_scale=hp.expert_weights_scale,
                                    up_exps_s=s(T.FFN_UP_EXP, il), gate_exps_s=s(T.FFN_GATE_EXP, il),
                                    down_exps_s=s(T.FFN_DOWN_EXP, il))
                if hp.n_expert_shared:
                    shared = b.build_ffn(h, up=w(T.FFN_UP_SHEXP, il), up_s=s(T.FFN_UP_SHEXP, il),
                                         gate=w(T.FFN_GATE_SHEXP, il), gate_s=s(T.FFN_GATE_SHEXP, il),
                                         down=w(T.FFN_DOWN_SHEXP, il), down_s=s(T.FFN_DOWN_SHEXP, il),
                                         name="ffn_shexp")
                    f = b.op("scale", b.op("add", f, shared, name="ffn_moe_shexp"), s=0.5, name="ffn_out")
            x = b.op("add", b.op("add", f, x, name="ffn_res"), a, name="l_out")  # both branches join the stream
        x = b.norm(x, T.OUTPUT_NORM, kind=self.norm, name="h_nextn")
        x = b.op("get_rows", x, b.build_inp_out_ids(), name="result_norm")  # the output rows, after the norm
        b.build_output(x, w(T.OUTPUT))
        if hp.logit_scale:
            b.outputs["logits"] = b.op("scale", b.outputs["logits"], s=hp.logit_scale, name="result_scaled")


presets.register({
    # llama.cpp's tiny cohere2moe over five layers (so that alike ones fold): width 256, two heads of 128, an RMSNorm;
    # layer 0 dense (384) and roped, then 2 experts of 384 (both used, sigmoid-routed) and a shared expert of 192,
    # layers 1-3 sliding over 32 positions and layer 4 global without positions
    "cohere2moe-tiny-header": Preset("cohere2moe", {
        L.CONTEXT_LENGTH: 256, L.EMBEDDING_LENGTH: 256, L.BLOCK_COUNT: 5, L.FEED_FORWARD_LENGTH: 384,
        A.HEAD_COUNT: 2, A.HEAD_COUNT_KV: 2, A.LAYERNORM_RMS_EPS: 1e-5, A.SLIDING_WINDOW: 32, L.VOCAB_SIZE: 128,
        L.LOGIT_SCALE: 1.0, L.LEADING_DENSE_BLOCK_COUNT: 1, L.EXPERT_COUNT: 2, L.EXPERT_USED_COUNT: 2,
        L.EXPERT_FEED_FORWARD_LENGTH: 384, L.EXPERT_SHARED_FEED_FORWARD_LENGTH: 192, L.EXPERT_SHARED_COUNT: 1,
        L.EXPERT_GATING_FUNC: 2,
    }, tied=False, include=r"blk\.\d+\.(attn_[qkv]|ffn_gate_up_exps)\.weight", f32=presets.ROUTER_F32,
        source="llama.cpp tests/test-llama-archs.cpp's tiny cohere2moe header"),
})


def _dense_lead(c: Config) -> int:
    """The leading "dense" entries of mlp_layer_types, or first_k_dense_replace."""
    types = c.find("mlp_layer_types", kind="list", default=None)
    if types is None:
        return c.find("first_k_dense_replace", kind="size", default=0)
    return next((i for i, t in enumerate(types) if t != "dense"), len(types))


def _shared(c: Config) -> dict[str, object]:
    """The shared experts, each as wide as a routed one; the converter takes only their average with the experts."""
    n = c.find("num_shared_experts", kind="size", default=0)
    if not n:
        return {}
    if c.find("shared_expert_combination_strategy", kind="text", default="average") != "average":
        raise c.error("shared_expert_combination_strategy must be 'average' (the converter refuses any other)")
    return {L.EXPERT_SHARED_COUNT: n, L.EXPERT_SHARED_FEED_FORWARD_LENGTH: c.find("intermediate_size") * n}


def _written(c: Config) -> str:
    """Q, K and V apart, the experts' gate and up stacks apart, and the prediction layers' tensors."""
    n_nextn = c.find("num_nextn_predict_layers", kind="size", default=0)
    trunk = r"attn_norm|attn_[qkv]|attn_output"
    return rf"{presets.SPLIT_QKV}|blk\.\d+\.ffn_(gate|up)_exps\.weight" + (
        f"|{nextn_written(c.find(*BLOCKS), n_nextn, trunk)}" if n_nextn else "")


# Cohere2MoeModel: the text keys, the logit scale, the window and which layers slide, the experts' width (the
# config's intermediate_size), the leading dense layers, whole heads roped, no RoPE scaling; its
# multi-token-prediction layers counted in the blocks
hf_config.register(Family("cohere2moe", TEXT + (
    VOCAB, hf(L.LOGIT_SCALE, "logit_scale", kind="number"), hf(A.SLIDING_WINDOW, "sliding_window"),
    derived(A.SLIDING_WINDOW_PATTERN, lambda c: [t == "sliding_attention" for t in c.find("layer_types", kind="list")]),
    hf(L.EXPERT_FEED_FORWARD_LENGTH, "intermediate_size"), derived(L.LEADING_DENSE_BLOCK_COUNT, _dense_lead),
    hf(L.EXPERT_WEIGHTS_NORM, "norm_topk_prob", kind="flag", default=False), _shared,
    hf(L.NEXTN_PREDICT_LAYERS, "num_nextn_predict_layers", kind="size", default=None),
    derived(L.BLOCK_COUNT, lambda c: c.find(*BLOCKS) + c.find("num_nextn_predict_layers", kind="size", default=0)),
    hf(R.DIMENSION_COUNT, "head_dim"), fixed(R.SCALING_TYPE, "none"),
), {"tie_word_embeddings": True}, _written), "Cohere2MoeForCausalLM")
