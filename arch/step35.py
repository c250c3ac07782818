"""Step-3.5 (step35): a pre-norm decoder whose layers slide or not by the file's per-layer pattern, each with its own
head count. Each head's Q and K may be RMS-normalised; RoPE (NEOX) turns ``rope.dimension_count_swa`` dims of a
sliding layer's heads (``rope.dimension_count`` where absent, a whole head where both are) with
``rope.freq_base_swa`` (10000 where absent) and no frequency scaling, and half of ``rope.dimension_count`` dims of a
global layer's heads with the model's parameters and its frequency factors where the file has them. Where the file has a layer's ``attn_gate``, each head's
attention output is multiplied by a sigmoid of one projection of the sublayer's input before W_o. A layer whose file
holds a router (``ffn_gate_inp``) is a mixture of SwiGLU experts (sigmoid-routed unless the file says otherwise, an
optional selection bias, weights normalised and scaled as the file says) plus a shared expert; any other layer is a
dense SwiGLU. The experts' SwiGLU is clamped at the layer's ``swiglu_clamp_exp``, the shared expert's and the dense
one's at its ``swiglu_clamp_shexp`` (up clamped, silu(gate) capped, where the file gives a limit). The last layer runs
every row; the output rows are taken before the final norm.
Multi-token-prediction layers (``nextn_predict_layers``, appended to the trunk) load and never run: llama.cpp's main
graph leaves them to its draft graph, and asks for their tensors only where the file has the first one's projection
(a file without it holds the trunk alone).

No public configuration is at hand with its exact figures: the family's golden graphs come from llama.cpp's tiny
header of it (the sizes tests/test-llama-archs.cpp gives step35).

Reference: StepFun, "Step-3.5-Flash"; llama.cpp src/models/step35.cpp (and convert_hf_to_gguf's Step35Model).
"""

from __future__ import annotations

from typing import Any, Mapping

from gguf import MODEL_TENSOR as T
from gguf import Keys

from graphir.errors import MetadataError, TensorError
from graphir.graph.floats import f32, inv_sqrt
from graphir.graph.ir import Node
from graphir.memory.layers import LayerNeeds
from graphir.model import hf_config, presets
from graphir.model.architecture import Architecture
from graphir.model.builder import Gating, GraphBuilder
from graphir.model.hf_config import BLOCKS, TEXT, VOCAB, Config, Family, derived, hf
from graphir.model.hparams import HParams, Key, SlidingWindow
from graphir.model.moe import (GATING_FUNC_KEY, MOE_KEYS, NEXTN_KEY, check_experts, experts, gating, nextn_layer,
                               trunk_layers)
from graphir.model.presets import Preset
from graphir.model.qkv import fused_or_split_qkv_tensors
from graphir.model.rope_factors import long_context, longrope, rope_factor_tensors, rope_factors
from graphir.model.scales import layer_scales
from graphir.model.tensors import TensorDecl, TensorSpec, spec, tensor_name

L, A, R = Keys.LLM, Keys.Attention, Keys.Rope


class Step35(Architecture):
    name = "step35"
    rope_mode = "neox"
    required_keys = (A.LAYERNORM_RMS_EPS, L.EXPERT_FEED_FORWARD_LENGTH, A.SLIDING_WINDOW, A.SLIDING_WINDOW_PATTERN)
    swa = SlidingWindow("standard")  # the window and the per-layer pattern from the file
    per_layer = True  # head counts per layer, as llama.cpp reads them
    keys = MOE_KEYS + (
        Key("n_ff_exp", L.EXPERT_FEED_FORWARD_LENGTH, tuple, (), minimum=0),
        Key("n_ff_shexp", L.EXPERT_SHARED_FEED_FORWARD_LENGTH, int, 0, minimum=0),
        GATING_FUNC_KEY,  # 0: sigmoid
        Key("expert_weights_scale", L.EXPERT_WEIGHTS_SCALE, float, 0.0),
        Key("expert_weights_norm", L.EXPERT_WEIGHTS_NORM, bool, False),
        Key("rope_freq_base_swa", R.FREQ_BASE_SWA, float, f32(10000.0)),  # llama.cpp's default, not the model's base
        Key("n_rot_swa", R.DIMENSION_COUNT_SWA, int, default_from="n_rot", minimum=0),
        # llama.cpp sizes a sliding layer's heads by these, but its graph by layer 0's: they must agree
        Key("n_embd_head_k_swa", A.KEY_LENGTH_SWA, int, default_from="n_embd_head_k"),
        Key("n_embd_head_v_swa", A.VALUE_LENGTH_SWA, int, default_from="n_embd_head_v"),
        Key("swiglu_clamp_exp", L.SWIGLU_CLAMP_EXP, tuple, (), item=float),  # absent: no clamp
        Key("swiglu_clamp_shexp", L.SWIGLU_CLAMP_SHEXP, tuple, (), item=float),
        NEXTN_KEY,
    )

    def __init__(self, hp: HParams):
        key = lambda t: t.format(arch=self.name)  # noqa: E731
        check_experts(hp, self.name)
        self.n_trunk = trunk_layers(hp, self.name)  # the prediction layers after it are loaded, never run
        self.gating = gating(hp, self.name, Gating.SIGMOID)
        if (hp.n_embd_head_k_swa, hp.n_embd_head_v_swa) != (hp.n_embd_head_k, hp.n_embd_head_v):
            raise MetadataError(f"'{key(A.KEY_LENGTH_SWA)}' = {hp.n_embd_head_k_swa} and '{key(A.VALUE_LENGTH_SWA)}' = "
                                f"{hp.n_embd_head_v_swa}: llama.cpp's graph reads every layer's heads as "
                                f"{hp.n_embd_head_k} (K) and {hp.n_embd_head_v} (V) wide")
        for il in range(self.n_trunk):
            n = rotated(hp, il)
            if n > hp.n_embd_head_k or n % 2:
                raise MetadataError(f"layer {il} rotates {n} dims of heads of {hp.n_embd_head_k} (key "
                                    f"'{key(R.DIMENSION_COUNT_SWA if hp.is_swa(il) else R.DIMENSION_COUNT)}'): RoPE "
                                    f"turns an even number of a head's dims, at most all")
        super().__init__(hp)

    def layers(self) -> LayerNeeds:
        return super().layers()[:self.n_trunk]

    def variant(self, n_ctx_seq: int) -> bool:
        return longrope(self.hp) and long_context(self.hp, n_ctx_seq)

    def layer_tensors(self, il: int) -> list[TensorSpec]:
        """Layer il's tensors as llama.cpp's loader asks for them: Q, K and V fused or apart, the rest of the
        attention (QK-norms and the gate optional), and both FFN forms optional: the router decides which a layer
        runs (:meth:`check`)."""
        hp = self.hp
        E, X, H, d = hp.n_embd, hp.n_expert, hp.head_count(il), hp.n_embd_head_k
        F, Fx, Fs = hp.ff_length(0), hp.n_ff_exp[0], hp.n_ff_shexp  # every layer sized by layer 0's, as llama.cpp
        layer = [spec(T.ATTN_NORM, (E,), il, kind="vector"), *fused_or_split_qkv_tensors(hp, il),
                 spec(T.ATTN_OUT, (hp.n_embd_head_v * H, E), il), spec(T.FFN_NORM, (E,), il, kind="vector")]
        optional = [spec(T.ATTN_Q_NORM, (d,), il, kind="vector"), spec(T.ATTN_K_NORM, (d,), il, kind="vector"),
                    spec(T.ATTN_GATE, (E, H), il),
                    spec(T.FFN_GATE, (E, F), il), spec(T.FFN_DOWN, (F, E), il), spec(T.FFN_UP, (E, F), il),
                    spec(T.FFN_GATE_INP, (E, X), il), spec(T.FFN_GATE_EXP, (E, Fx, X), il),
                    spec(T.FFN_DOWN_EXP, (Fx, E, X), il), spec(T.FFN_UP_EXP, (E, Fx, X), il),
                    spec(T.FFN_EXP_PROBS_B, (X,), il, "bias", kind="vector"),
                    spec(T.FFN_GATE_SHEXP, (E, Fs), il), spec(T.FFN_UP_SHEXP, (E, Fs), il),
                    spec(T.FFN_DOWN_SHEXP, (Fs, E), il)]
        layer += [TensorSpec(s.name, s.shape, s.kind, optional=True) for s in optional]
        return layer + layer_scales(layer, il, X)

    def tensors(self) -> list[TensorSpec]:
        hp = self.hp
        E, V = hp.n_embd, hp.n_vocab
        n_rot_max = max(rotated(hp, il) for il in range(self.n_trunk))  # one factor vector for every layer
        specs = [spec(T.TOKEN_EMBD, (E, V)), spec(T.OUTPUT_NORM, (E,), kind="vector"), spec(T.OUTPUT, (E, V)),
                 *rope_factor_tensors(hp, n_rot=n_rot_max)]
        for il in range(hp.n_layer):
            specs += self.layer_tensors(il) if il < self.n_trunk else nextn_layer(self.layer_tensors(il), hp, il)
        return specs

    def check(self, tensors: Mapping[str, TensorDecl]) -> list[str]:
        """The table's checks; each layer's FFN whole in the form its router says (a router: experts and a shared
        expert; none: a dense FFN); and, where the file holds the first prediction layer's projection, every
        prediction layer's tensors that llama.cpp's loader then requires."""
        problems = super().check(tensors)
        for il in range(self.n_trunk):
            problems += ffn_problems(tensors, il)
        if tensor_name(T.NEXTN_EH_PROJ, self.n_trunk) in tensors:
            for il in range(self.n_trunk, self.hp.n_layer):
                head_norm = tensor_name(T.NEXTN_SHARED_HEAD_NORM, il)  # optional, as the shared head's matrix
                problems += [f"missing tensor '{s.name}'" for s in nextn_layer(self.layer_tensors(il), self.hp, il,
                                                                                required=True)
                             if not s.optional and s.name not in tensors and s.name != head_norm]
        return problems

    def clamp(self, limits: tuple[float, ...], il: int) -> dict[str, Any]:
        """A SwiGLU's clamp at layer il's limit (none where the file gives no limits), as llama.cpp applies it to
        this family: up and silu(gate) clamped apart."""
        return {"swiglu_limit": limits[il] if limits else 0.0, "clamp_apart": True}

    def ffn(self, b: GraphBuilder, h: Node, il: int) -> Node:
        hp = self.hp
        problems = ffn_problems(b.tensors, il)
        if problems:
            raise TensorError(f"{b.label}: {problems[0]}")
        shared = self.clamp(hp.swiglu_clamp_shexp, il)
        if b.w_opt(T.FFN_GATE_INP, il) is None:
            return b.build_ffn(h, up=b.w(T.FFN_UP, il), gate=b.w(T.FFN_GATE, il), down=b.w(T.FFN_DOWN, il), **shared)
        moe = b.build_moe_ffn(h, **experts(b, il), probs_b=b.w_opt(T.FFN_EXP_PROBS_B, il, "bias"),
                              n_expert=hp.n_expert, n_expert_used=hp.n_expert_used, gating=self.gating,
                              norm_w=hp.expert_weights_norm, w_scale=hp.expert_weights_scale,
                              **self.clamp(hp.swiglu_clamp_exp, il))
        sh = b.build_ffn(h, up=b.w(T.FFN_UP_SHEXP, il), gate=b.w(T.FFN_GATE_SHEXP, il),
                         down=b.w(T.FFN_DOWN_SHEXP, il), name="ffn_shared_out", **shared)
        return b.op("add", moe, sh, name="ffn_out")

    def rope(self, b: GraphBuilder, il: int) -> dict[str, Any]:
        """How layer il turns Q and K: a sliding layer its own dims with its own base and no scaling; a global one
        half the model's dims, divided by the first of the file's frequency factors (one vector for every layer)."""
        hp = self.hp
        n = rotated(hp, il)
        if hp.is_swa(il):
            return {"n_dims": n, "freq_base": hp.rope_freq_base_swa, "freq_scale": 1.0}
        factors = rope_factors(b)
        if factors is not None and factors.shape[0] != n // 2:
            factors = b.op("view", factors, shape=(n // 2,), strides=(1,), offset=0, name="rope_factors")
        return {"n_dims": n, "freq_factors": factors}

    def build(self, b: GraphBuilder) -> None:
        hp = self.hp
        dv = hp.n_embd_head_v
        x = b.build_inp_embd(b.w(T.TOKEN_EMBD))
        pos = b.build_inp_pos()
        for il in b.layers(self.n_trunk):
            H, n_tok = hp.head_count(il), b.n_tokens
            h = b.norm(x, T.ATTN_NORM, il, name="attn_norm")
            # self-attention: per-head QK-norms where the file has them, RoPE as the layer turns it
            q, k, v = b.build_qkv(h, il)
            if b.w_opt(T.ATTN_Q_NORM, il) is not None:
                q = b.norm(q, T.ATTN_Q_NORM, il, name="Qcur_normed")
            if b.w_opt(T.ATTN_K_NORM, il) is not None:
                k = b.norm(k, T.ATTN_K_NORM, il, name="Kcur_normed")
            rope = self.rope(b, il)
            q, k = b.rope(q, pos, name="Qcur_pos", **rope), b.rope(k, pos, name="Kcur_pos", **rope)
            a = b.build_attn(q, k, v, wo=None, kq_scale=inv_sqrt(hp.n_embd_head_k))
            gate = b.w_opt(T.ATTN_GATE, il)
            if gate is not None:  # each head's output times sigmoid(W_gate h), its scale unread
                g = b.op("sigmoid", b.mm(gate, h, name="attn_gate"), name="attn_gate_sigmoid")
                a = b.op("mul", b.reshape(a, (dv, H, n_tok), name="attn_out.heads"),
                         b.reshape(g, (1, H, n_tok), name="attn_gate_3d"), name="attn_gated_3d")
                a = b.reshape(a, (dv * H, n_tok), name="attn_gated")
            a = b.mm(b.w(T.ATTN_OUT, il), a, b.scale(T.ATTN_OUT, il), name="attn_proj")
            x = b.op("add", a, x, name="ffn_inp")  # every row on, in the last layer too
            f = self.ffn(b, b.norm(x, T.FFN_NORM, il, name="ffn_norm"), il)
            x = b.op("add", f, x, name="l_out")
        x = b.op("get_rows", x, b.build_inp_out_ids(), name="h_nextn.rows")  # the output rows, before the norm
        x = b.norm(x, T.OUTPUT_NORM, name="result_norm")
        b.build_output(x, b.w(T.OUTPUT))


def ffn_problems(tensors: Mapping[str, Any], il: int) -> list[str]:
    """What layer il lacks of the FFN its router says it has (a router: experts and a shared expert; none: a dense
    FFN), one line each (empty: the FFN is whole)."""
    if tensor_name(T.FFN_GATE_INP, il) in tensors:
        need, what = (T.FFN_GATE_EXP, T.FFN_DOWN_EXP, T.FFN_UP_EXP, T.FFN_GATE_SHEXP, T.FFN_DOWN_SHEXP,
                      T.FFN_UP_SHEXP), "a layer with a router is a mixture of experts"
    else:
        need, what = (T.FFN_GATE, T.FFN_DOWN, T.FFN_UP), "a layer without a router is a dense FFN"
    return [f"missing tensor '{tensor_name(t, il)}' ({what})" for t in need if tensor_name(t, il) not in tensors]


def rotated(hp: HParams, il: int) -> int:
    """Layer il's rotated dims: a sliding layer's own count, half the model's for a global one."""
    return hp.n_rot_swa if hp.is_swa(il) else hp.n_rot // 2


# ---- Hugging Face: what convert_hf_to_gguf's Step35Model writes for Step3p5ForCausalLM ---------------------------


def _theta(c: Config) -> dict[str, Any]:
    """A per-layer ``rope_theta`` (one base a layer) is, as the converter rewrites it before the keys every family
    writes, its first entry for the model and its second for the sliding layers; no keys of its own."""
    theta = c.doc.get("rope_theta")
    if isinstance(theta, list) and len(theta) > 1:
        c.doc["rope_theta"], c.doc["local_rope_theta"] = theta[0], theta[1]
    return {}


def _nextn(c: Config) -> int:
    return c.find("num_nextn_predict_layers", kind="size", default=0)


def _blocks(c: Config) -> int:
    """The trunk and the prediction layers appended to it."""
    return c.find(*BLOCKS) + _nextn(c)


def _padded(values: list[Any], n: int, pad: Any) -> list[Any]:
    return (list(values) + [pad] * n)[:n]


def _layer_types(c: Config) -> list[str]:
    """Each block's type (the prediction layers' too), global where the config gives none."""
    return _padded(c.find("layer_types", kind="list", default=[]), _blocks(c), "full_attention")


def _attention(c: Config) -> dict[str, Any]:
    """Per block: heads and KV groups (a sliding layer's from ``attention_other_setting``), whether it slides; the
    converter checks that a sliding layer rotates whole heads and a global one half of each."""
    types = _layer_types(c)
    factors = _padded(c.find("partial_rotary_factors", kind="list", default=[]), len(types), 0.5)
    if [1.0 if t == "sliding_attention" else 0.5 for t in types] != factors:
        raise c.error(f"partial_rotary_factors {factors} are not 1 on the sliding layers and 0.5 on the others")
    other = c.find("attention_other_setting", kind="map", default={})
    heads, groups = c.find("num_attention_heads"), c.find("num_attention_groups")
    heads_swa = other.get("num_attention_heads", heads)
    groups_swa = other.get("num_attention_groups", groups)
    swa = [t == "sliding_attention" for t in types]
    return {A.HEAD_COUNT: [heads_swa if s else heads for s in swa],
            A.HEAD_COUNT_KV: [groups_swa if s else groups for s in swa],
            A.SLIDING_WINDOW: c.find("sliding_window"), A.SLIDING_WINDOW_PATTERN: swa,
            A.VALUE_LENGTH: c.find("head_dim")}


def _enum(c: Config) -> str:
    enum = c.doc.get("moe_layers_enum")
    return enum.strip() if isinstance(enum, str) else ""


def _moe_layers(c: Config) -> list[int]:
    """The mixture-of-experts layers ``moe_layers_enum`` names (every layer where it names none)."""
    return sorted(int(i) for i in _enum(c).split(",")) if _enum(c) else list(range(_blocks(c)))


def _clamps(c: Config) -> dict[str, Any]:
    """The per-layer SwiGLU limits where the config gives them, 0 (none) for a missing one and the prediction
    layers."""
    out = {}
    for key, name in ((L.SWIGLU_CLAMP_EXP, "swiglu_limits"), (L.SWIGLU_CLAMP_SHEXP, "swiglu_limits_shared")):
        limits = c.find(name, kind="list", default=None)
        if limits is not None:
            out[key] = _padded([0.0 if v is None else float(v) for v in limits], _blocks(c), 0.0)
    return out


def _written(c: Config) -> str:
    """Every block's Q, K and V apart and its QK-norms, its head-wise gate where the config has one, a routed
    block's router, selection bias, expert and shared expert stacks, another's dense FFN; a prediction layer's
    norms, output projection, its own projection and norms and shared head; llama3's frequency factors."""
    moe, n = set(_moe_layers(c)), _blocks(c)
    routed = "|".join(str(il) for il in range(n) if il in moe) or "none"
    dense = "|".join(str(il) for il in range(n) if il not in moe) or "none"
    nextn = "|".join(str(il) for il in range(c.find(*BLOCKS), n)) or "none"
    gate = "|attn_gate" if c.find("use_head_wise_attn_gate", kind="flag", default=False) else ""
    bias = rf"|blk\.({routed})\.exp_probs_b\.bias" if c.find("use_moe_router_bias", kind="flag", default=False) else ""
    llama3 = r"|rope_freqs\.weight" if str(c.full_rope.get("rope_type", "")).lower() == "llama3" else ""
    return (rf"blk\.\d+\.(attn_[qkv]|attn_[qk]_norm{gate})\.weight|blk\.({dense})\.ffn_(gate|up|down)\.weight|"
            rf"blk\.({routed})\.(ffn_gate_inp|ffn_(gate|up|down)_(exps|shexp))\.weight|"
            rf"blk\.({nextn})\.(attn_norm|attn_output|ffn_norm|nextn\.(eh_proj|enorm|hnorm|shared_head_norm|"
            rf"shared_head_head))\.weight{bias}{llama3}")


hf_config.register(Family("step35", (_theta,) + TEXT + (
    VOCAB, derived(L.BLOCK_COUNT, _blocks), _attention,
    hf(L.EXPERT_COUNT, "moe_num_experts", kind="size"), hf(L.EXPERT_USED_COUNT, "moe_top_k", kind="size"),
    hf(L.EXPERT_FEED_FORWARD_LENGTH, "moe_intermediate_size"),
    hf(L.EXPERT_SHARED_FEED_FORWARD_LENGTH, "share_expert_dim"),
    hf(L.EXPERT_WEIGHTS_SCALE, "moe_router_scaling_factor", kind="number", default=None),
    hf(L.EXPERT_WEIGHTS_NORM, "norm_expert_weight", kind="flag", default=None),
    derived(L.LEADING_DENSE_BLOCK_COUNT, lambda c: max(0, _moe_layers(c)[0]) if _enum(c) else 0),
    hf(L.MOE_EVERY_N_LAYERS, "moe_every_n_layer", kind="size", default=1),
    hf(A.LAYERNORM_RMS_EPS, "rms_norm_eps", kind="number", default=1e-5), _clamps,
    derived(L.NEXTN_PREDICT_LAYERS, lambda c: _nextn(c) or None),
), {"tie_word_embeddings": False}, _written), "Step3p5ForCausalLM")


presets.register({
    # llama.cpp's tiny step35, over five layers (so that alike ones fold) alternating as its first two: width 160, two
    # heads of 80 (global layers rotate 40 dims, sliding ones all 80); layer 1 slides over 32 positions, layer 0 is
    # global; layer 0's FFN dense (384), the others 2 experts of 384 (both used, sigmoid-routed, a selection bias) and
    # a shared expert of 192; every layer's QK-norms and head-wise gate
    "step35-tiny-header": Preset("step35", {
        L.CONTEXT_LENGTH: 256, L.EMBEDDING_LENGTH: 160, L.BLOCK_COUNT: 5, L.FEED_FORWARD_LENGTH: 384,
        A.HEAD_COUNT: 2, A.HEAD_COUNT_KV: 2, A.LAYERNORM_RMS_EPS: 1e-5, A.SLIDING_WINDOW: 32,
        A.SLIDING_WINDOW_PATTERN: [il % 2 == 1 for il in range(5)], L.VOCAB_SIZE: 128, L.EXPERT_COUNT: 2,
        L.EXPERT_USED_COUNT: 2, L.EXPERT_FEED_FORWARD_LENGTH: 384, L.EXPERT_SHARED_FEED_FORWARD_LENGTH: 192,
        L.EXPERT_GATING_FUNC: 2,
    }, tied=False, include=r"blk\.\d+\.(attn_[qkv]|attn_[qk]_norm|attn_gate)\.weight|blk\.0\.ffn_(gate|up|down)\.weight|"
                           r"blk\.[1-9]\.(ffn_gate_inp|ffn_(gate|up|down)_(exps|shexp))\.weight|"
                           r"blk\.[1-9]\.exp_probs_b\.bias",
        f32=presets.ROUTER_F32, source="llama.cpp tests/test-llama-archs.cpp, its tiny step35 header"),
})
