"""Qwen3.5, dense (qwen35) and mixture-of-experts (qwen35moe): gated DeltaNet layers and gated full-attention
layers in one decoder.

Three layers of every four (``full_attention_interval``, or the flags of ``attention.recurrent_layers``) mix
tokens by gated DeltaNet: one projection gives q, k and v, which go through a short causal convolution and
SiLU; q and k are L2-normalised, and each value head keeps a matrix state that decays by exp(g) per token and is
corrected toward v along k by a step beta (the gated delta rule); the read-out is RMS-normalised per head and
gated by SiLU(z). The other layers are grouped-query attention with QK-norm and interleaved multi-section RoPE
(M-RoPE; a text token gives every section its position), whose Q projection also yields a sigmoid gate on the
heads' output. Each layer then adds a SwiGLU FFN behind a post-attention norm; in Qwen3.5-MoE a softmax-routed
mixture of experts (gate and up stacks fused or apart) plus a shared expert scaled by a sigmoid gate of its
own, the one variant as data (:attr:`Qwen35.experts`). The memory holds a KV cache for
the attention layers and conv columns plus delta states per sequence for the others (the ``hybrid`` kind).
Multi-token-prediction layers (``nextn_predict_layers``, each a gated-attention layer with its projection and norms)
load as llama.cpp asks for them and never run: its main graph leaves them to its draft graph.
Qwen3-Next (arch/qwen3next.py) is this build as data: NeoX RoPE without sections (:attr:`Qwen35.sections`) and its
DeltaNet projections packed key head by key head (:attr:`Qwen35.packed`).
Reference: Qwen Team 2026, "Qwen3.5"; Yang, Kautz & Hatamizadeh 2025, "Gated Delta Networks"; llama.cpp
src/models/qwen35.cpp, qwen35moe.cpp, delta-net-base.cpp.
"""

from __future__ import annotations

from typing import Callable, ClassVar

from gguf import MODEL_TENSOR as T
from gguf import Keys

from graphir.errors import MetadataError, TensorError
from graphir.graph.ir import Node
from graphir.memory.layers import Attention, LayerNeeds
from graphir.model import ssm
from graphir.model.architecture import Architecture
from graphir.model.builder import GraphBuilder
from graphir.model.hparams import HParams, Key
from graphir.model.moe import MOE_KEYS, NEXTN_KEY, check_experts, gate_up, gate_up_tensors, nextn_layer, trunk_layers
from graphir.graph.floats import f32, inv_sqrt
from graphir.model.tensors import TensorSpec, scales, spec, tensor_name
from graphir.model import presets
from graphir.model.presets import Preset
from graphir.model import hf_config
from graphir.model.hf_config import BLOCKS, TEXT, VOCAB, Config, Family, head_dim, derived, hf

RECURRENT_LAYERS = "{arch}.attention.recurrent_layers"  # llama.cpp's key; gguf-py has no constant for it yet
FUSED_EXPERTS = r"blk\.\d+\.ffn_gate_up_exps\.weight"  # the converter writes Qwen3.5-MoE's experts' gate and up as one
MTP_NORM = r"blk\.\d+\.nextn\.shared_head_norm\.weight"  # and a prediction layer's final norm (mtp.norm)
MOE_F32 = r"blk\.\d+\.(ssm_conv1d|ffn_gate_inp|ffn_gate_inp_shexp)\.weight"  # kept F32: conv kernels, routers


class Qwen35(Architecture):
    name = "qwen35"
    rope_mode = "imrope"
    required_keys = (Keys.Attention.LAYERNORM_RMS_EPS,)
    keys = (Key("ssm_d_conv", Keys.SSM.CONV_KERNEL, int, required=True, minimum=1),  # conv kernel width
            Key("ssm_d_inner", Keys.SSM.INNER_SIZE, int, required=True, minimum=1),  # value heads x head size
            Key("ssm_d_state", Keys.SSM.STATE_SIZE, int, required=True, minimum=1),  # head size of k (and v)
            Key("ssm_dt_rank", Keys.SSM.TIME_STEP_RANK, int, required=True, minimum=1),  # value heads
            Key("ssm_n_group", Keys.SSM.GROUP_COUNT, int, required=True, minimum=1),  # key heads
            Key("rope_sections", Keys.Rope.DIMENSION_SECTIONS, tuple, required=True, minimum=0, count=4),
            Key("recurrent_layers", RECURRENT_LAYERS, tuple, (), minimum=0, maximum=1),  # (): by the interval
            Key("full_attention_interval", Keys.LLM.FULL_ATTENTION_INTERVAL, int, 4, minimum=1),
            NEXTN_KEY)
    experts: ClassVar[bool] = False  # every FFN a mixture of experts with a gated shared expert (qwen35moe)
    sections: ClassVar[bool] = True  # RoPE in M-RoPE sections (``rope.dimension_sections``), else over n_rot alone
    # Qwen3-Next's DeltaNet (qwen3next): beta and alpha in one ssm_ba and, in older files, q, k, v and z in one
    # ssm_in, each laid out key head by key head; q and k repeated in place for the value heads a key head serves;
    # no per-tensor scale of the projections read (llama.cpp loads them and leaves them unread)
    packed: ClassVar[bool] = False

    def __init__(self, hp: HParams):
        def key(template: str) -> str:
            return f"'{template.format(arch=hp.arch)}'"

        self.n_trunk = trunk_layers(hp, self.name)  # the prediction layers after it are loaded, never run
        if self.experts:
            if not hp.n_expert:
                raise MetadataError(f"a '{self.name}' model needs experts ({key(Keys.LLM.EXPERT_COUNT)} > 0)")
            check_experts(hp, self.name)
        heads, k_heads, d = hp.ssm_dt_rank, hp.ssm_n_group, hp.ssm_d_state
        if hp.ssm_d_inner != heads * d or heads % k_heads:  # k and v heads are equally wide; k heads are shared
            raise MetadataError(f"DeltaNet inner size {hp.ssm_d_inner} ({key(Keys.SSM.INNER_SIZE)}) must be {heads} "
                                f"value heads ({key(Keys.SSM.TIME_STEP_RANK)}) of {d} ({key(Keys.SSM.STATE_SIZE)}), "
                                f"sharing {k_heads} key heads ({key(Keys.SSM.GROUP_COUNT)}) evenly")
        s = hp.rope_sections if self.sections else None
        if s is not None and (not any(s[:3]) or sum(s) > hp.n_embd_head_k):
            raise MetadataError(f"RoPE sections {list(s)} ({key(Keys.Rope.DIMENSION_SECTIONS)}) need a positive "
                                f"one among the first three and at most {hp.n_embd_head_k} pairs in all")
        super().__init__(hp)
        if any(isinstance(n, Attention) for n in self.needs) and hp.n_embd_head_k != hp.n_embd_head_v:
            raise MetadataError(f"attention heads of {hp.n_embd_head_k} keys ({key(Keys.Attention.KEY_LENGTH)}) and "
                                f"{hp.n_embd_head_v} values ({key(Keys.Attention.VALUE_LENGTH)}) must be equal")

    # ---- sizes -------------------------------------------------------------------------------------------

    def recurrent(self, il: int) -> bool:
        """Whether layer il is a DeltaNet layer: as the file's flags say, else three of every four of the trunk
        (a prediction layer attends)."""
        hp = self.hp
        if hp.recurrent_layers:
            return bool(hp.recurrent_layers[il])
        return il < self.n_trunk and (il + 1) % hp.full_attention_interval != 0

    @property
    def n_ff_exp(self) -> int:
        """One expert's width: layer 0's ``expert_feed_forward_length``, else the FFN length shared among the used
        experts (as llama.cpp)."""
        hp = self.hp
        return (hp.n_ff_exp[0] if hp.n_ff_exp else 0) or hp.ff_length(0) // hp.n_expert_used

    @property
    def key_dim(self) -> int:
        return self.hp.ssm_d_state * self.hp.ssm_n_group

    @property
    def per_key_head(self) -> int:
        """Value heads per key head."""
        return self.hp.ssm_dt_rank // self.hp.ssm_n_group

    @property
    def conv_dim(self) -> int:
        """Channels through the conv: q and k of every key head, v of every value head."""
        return 2 * self.key_dim + self.hp.ssm_d_inner

    def layers(self) -> LayerNeeds:
        return ssm.state_or_attention(self.hp, self.conv_dim, self.recurrent, self.n_trunk)

    # ---- tensors -----------------------------------------------------------------------------------------

    def tensors(self) -> list[TensorSpec]:
        hp = self.hp
        E, F = hp.n_embd, hp.n_ff
        specs = [spec(T.TOKEN_EMBD, (E, hp.n_vocab)), spec(T.OUTPUT_NORM, (E,), kind="vector"),
                 spec(T.OUTPUT, (E, hp.n_vocab), tied_to=tensor_name(T.TOKEN_EMBD))]
        for il in range(hp.n_layer):
            layer = [spec(T.ATTN_NORM, (E,), il, kind="vector"), spec(T.ATTN_POST_NORM, (E,), il, kind="vector"),
                     *(self.delta_tensors(il) if self.recurrent(il) else self.attn_tensors(il)),
                     *(self.moe_tensors(il) if self.experts else
                       [spec(T.FFN_GATE, (E, F), il), spec(T.FFN_UP, (E, F), il), spec(T.FFN_DOWN, (F, E), il),
                        *(s for t in (T.FFN_GATE, T.FFN_UP, T.FFN_DOWN) for s in scales(t, il))])]
            specs += layer if il < self.n_trunk else nextn_layer(layer, hp, il, required=True)
        return specs

    def moe_tensors(self, il: int) -> list[TensorSpec]:
        """The router, the experts' stacks (gate and up fused or apart), the shared expert of
        ``expert_shared_feed_forward_length`` (absent: the FFN length) and its gate [n_embd], each matrix's
        optional scales (one per expert for the stacks)."""
        hp = self.hp
        E, X, F, Fs = hp.n_embd, hp.n_expert, self.n_ff_exp, hp.n_ff_shexp or hp.ff_length(0)
        return [spec(T.FFN_GATE_INP, (E, X), il), spec(T.FFN_DOWN_EXP, (F, E, X), il),
                *gate_up_tensors(E, F, X, il),
                spec(T.FFN_GATE_INP_SHEXP, (E,), il, kind="vector"), spec(T.FFN_GATE_SHEXP, (E, Fs), il),
                spec(T.FFN_UP_SHEXP, (E, Fs), il), spec(T.FFN_DOWN_SHEXP, (Fs, E), il),
                *(s for t in (T.FFN_GATE_EXP, T.FFN_UP_EXP, T.FFN_DOWN_EXP) for s in scales(t, il, X)),
                *(s for t in (T.FFN_GATE_SHEXP, T.FFN_UP_SHEXP, T.FFN_DOWN_SHEXP) for s in scales(t, il))]

    def attn_tensors(self, il: int) -> list[TensorSpec]:
        """Q (and its gate, head by head), K, V with optional biases; the output; the QK-norm scales; each
        projection's optional per-tensor scale."""
        hp = self.hp
        E, d, H, Hkv = hp.n_embd, hp.n_embd_head_k, hp.head_count(il), hp.head_count_kv(il)
        return [spec(T.ATTN_Q, (E, 2 * d * H), il), spec(T.ATTN_K, (E, d * Hkv), il), spec(T.ATTN_V, (E, d * Hkv), il),
                spec(T.ATTN_Q, (2 * d * H,), il, "bias", kind="vector", optional=True),
                spec(T.ATTN_K, (d * Hkv,), il, "bias", kind="vector", optional=True),
                spec(T.ATTN_V, (d * Hkv,), il, "bias", kind="vector", optional=True),
                spec(T.ATTN_OUT, (d * H, E), il),
                spec(T.ATTN_Q_NORM, (d,), il, kind="vector"), spec(T.ATTN_K_NORM, (d,), il, kind="vector"),
                *(s for t in (T.ATTN_Q, T.ATTN_K, T.ATTN_V, T.ATTN_OUT) for s in scales(t, il))]

    def delta_tensors(self, il: int) -> list[TensorSpec]:
        """Layer il's gated DeltaNet. llama.cpp loads attn_qkv and attn_gate as optional but its graph uses them
        unconditionally (a file without them crashes there): here they are required."""
        if self.packed:
            return self.packed_delta_tensors(il)
        hp = self.hp
        E, H, d, V = hp.n_embd, hp.ssm_dt_rank, hp.ssm_d_state, hp.ssm_d_inner
        return [spec(T.ATTN_QKV, (E, self.conv_dim), il), spec(T.ATTN_GATE, (E, V), il),
                spec(T.SSM_CONV1D, (hp.ssm_d_conv, self.conv_dim), il),
                spec(T.SSM_DT, (H,), il, "bias", kind="vector"),
                spec(T.SSM_A, (H,), il, suffix=None, kind="vector"),  # -exp(A_log), stored under a bare name
                spec(T.SSM_BETA, (E, H), il), spec(T.SSM_ALPHA, (E, H), il),
                spec(T.SSM_NORM, (d,), il, kind="vector"), spec(T.SSM_OUT, (V, E), il),
                *(s for t in (T.ATTN_QKV, T.ATTN_GATE, T.SSM_BETA, T.SSM_ALPHA, T.SSM_OUT) for s in scales(t, il))]

    def packed_delta_tensors(self, il: int) -> list[TensorSpec]:
        """Layer il's gated DeltaNet in Qwen3-Next's files: q, k, v and z split (attn_qkv, attn_gate) or in one (ssm_in), all optional
        as llama.cpp loads them (its graph takes the split pair when attn_qkv is there); beta and alpha in one."""
        hp = self.hp
        E, H, d, V = hp.n_embd, hp.ssm_dt_rank, hp.ssm_d_state, hp.ssm_d_inner
        return [spec(T.SSM_IN, (E, 2 * self.key_dim + 2 * V), il, optional=True),
                spec(T.ATTN_QKV, (E, self.conv_dim), il, optional=True),
                spec(T.ATTN_GATE, (E, V), il, optional=True),
                spec(T.SSM_CONV1D, (hp.ssm_d_conv, self.conv_dim), il),
                spec(T.SSM_DT, (H,), il, "bias", kind="vector"),
                spec(T.SSM_A, (H,), il, suffix=None, kind="vector"),
                spec(T.SSM_BETA_ALPHA, (E, 2 * H), il),
                spec(T.SSM_NORM, (d,), il, kind="vector"), spec(T.SSM_OUT, (V, E), il),
                *(s for t in (T.SSM_IN, T.ATTN_QKV, T.ATTN_GATE, T.SSM_OUT) for s in scales(t, il))]

    # ---- graph -------------------------------------------------------------------------------------------

    def attention(self, b: GraphBuilder, h: Node, pos: Node, il: int) -> Node:
        """Gated attention: Q and its gate interleaved head by head in one projection; QK-norm, M-RoPE,
        attention through the layer's memory, the output times sigmoid(gate), then W_o."""
        hp = self.hp
        d, H, Hkv, Tn = hp.n_embd_head_k, hp.head_count(il), hp.head_count_kv(il), b.n_tokens
        qg = b.linear(h, b.w(T.ATTN_Q, il), b.w_opt(T.ATTN_Q, il, "bias"), name="Qcur_full", s=b.scale(T.ATTN_Q, il))
        q, gate = (b.op("view", qg, shape=(d, H, Tn), strides=(1, 2 * d, 2 * d * H), offset=off, name=tag)
                   for tag, off in (("Qcur", 0), ("gate", d)))
        gate = b.reshape(b.op("cont", gate, name="gate.cont"), (d * H, Tn), name="gate_reshaped")
        k, v = (b.reshape(b.linear(h, b.w(t, il), b.w_opt(t, il, "bias"), name=tag, s=b.scale(t, il)), (d, Hkv, Tn),
                          name=f"{tag}.heads") for t, tag in ((T.ATTN_K, "Kcur"), (T.ATTN_V, "Vcur")))
        q = b.norm(q, T.ATTN_Q_NORM, il, name="Qcur_normed")
        k = b.norm(k, T.ATTN_K_NORM, il, name="Kcur_normed")
        sections = hp.rope_sections if self.sections else None
        q = b.rope(q, pos, name="Qcur.rope", sections=sections)
        k = b.rope(k, pos, name="Kcur.rope", sections=sections)
        out = b.build_attn(q, k, v, wo=None, kq_scale=b.kq_scale())
        out = b.op("mul", out, b.op("sigmoid", gate, name="gate_sigmoid"), name="attn_gated")
        return b.mm(b.w(T.ATTN_OUT, il), out, b.scale(T.ATTN_OUT, il), name="attn_output")

    def l2_norm(self, b: GraphBuilder, x: Node, name: str) -> Node:
        """x / |x| per head (eps under the root), as llama.cpp writes it: RMS norm with eps / n, times 1 / sqrt(n)."""
        n = x.shape[0]
        y = b.op("rms_norm", x, eps=f32(self.hp.norm_rms_eps / n), name=f"{name}.rms")
        return b.op("scale", y, s=inv_sqrt(n), name=name)

    def delta_inputs(self, b: GraphBuilder, h: Node, il: int) -> tuple[Node, Node, Node, Node]:
        """The DeltaNet's projections of h: q, k and v for the conv [conv_dim, Ts, S], the output gate z, the
        step beta [1, Hv, Ts, S] (after its sigmoid) and the log-decay g [1, Hv, Ts, S]."""
        if self.packed:
            return self.packed_delta_inputs(b, h, il)
        hp = self.hp
        Hv, cd, Ts, S = hp.ssm_dt_rank, self.conv_dim, b.n_seq_tokens, b.n_seqs
        assert Ts is not None
        qkv = b.reshape(b.mm(b.w(T.ATTN_QKV, il), h, b.scale(T.ATTN_QKV, il), name="qkv_mixed"), (cd, Ts, S),
                        name="qkv_mixed.seqs")
        z = b.mm(b.w(T.ATTN_GATE, il), h, b.scale(T.ATTN_GATE, il), name="z")
        beta = b.reshape(b.mm(b.w(T.SSM_BETA, il), h, b.scale(T.SSM_BETA, il), name="beta"), (1, Hv, Ts, S),
                         name="beta.seqs")
        beta = b.op("sigmoid", beta, name="beta_sigmoid")
        alpha = b.reshape(b.mm(b.w(T.SSM_ALPHA, il), h, b.scale(T.SSM_ALPHA, il), name="alpha"), (Hv, Ts, S),
                          name="alpha.seqs")
        return qkv, z, beta, self.decay(b, alpha, il)

    def decay(self, b: GraphBuilder, alpha: Node, il: int) -> Node:
        """g = A * softplus(alpha + dt_bias) per value head ([Hv, Ts, S] in, [1, Hv, Ts, S] out)."""
        alpha = b.op("softplus", b.op("add", alpha, b.w(T.SSM_DT, il, "bias"), name="alpha_biased"),
                     name="a_softplus")
        return b.reshape(b.op("mul", alpha, b.w(T.SSM_A, il, None), name="gate"), (1, *alpha.shape), name="gate.seqs")

    def packed_delta_inputs(self, b: GraphBuilder, h: Node, il: int) -> tuple[Node, Node, Node, Node]:
        """:meth:`delta_inputs` from Qwen3-Next's projections: attn_qkv and attn_gate where the file has them (as
        llama.cpp's graph prefers), else ssm_in; beta and alpha from ssm_ba."""
        hp = self.hp
        Hk, Hv, r, Ts, S = hp.ssm_n_group, hp.ssm_dt_rank, self.per_key_head, b.n_seq_tokens, b.n_seqs
        assert Ts is not None
        qkv_w = b.w_opt(T.ATTN_QKV, il)
        if qkv_w is not None:
            qkv = b.reshape(b.mm(qkv_w, h, name="linear_attn_qkv_mixed"), (self.conv_dim, Ts, S),
                            name="linear_attn_qkv_mixed.seqs")
            z = b.mm(self.projection(b, T.ATTN_GATE, il), h, name="z")
        else:
            qkvz = b.mm(self.projection(b, T.SSM_IN, il), h, name="linear_attn_mixed_qkvz")
            qkv, z = self.split_qkvz(b, qkvz)
        ba = b.reshape(b.mm(b.w(T.SSM_BETA_ALPHA, il), h, name="linear_attn_mixed_ba"), (2 * r, Hk, Ts, S),
                       name="linear_attn_mixed_ba.heads")
        beta, alpha = (b.op("cont", b.op("view", ba, shape=(r, Hk, Ts, S), strides=(1, 2 * r, 2 * r * Hk,
                                                                                      2 * r * Hk * Ts),
                                         offset=off, name=tag), name=f"{tag}.cont")
                       for tag, off in (("b", 0), ("a", r)))
        beta = b.reshape(b.op("sigmoid", beta, name="beta_sigmoid"), (1, Hv, Ts, S), name="beta.seqs")
        return qkv, z, beta, self.decay(b, b.reshape(alpha, (Hv, Ts, S), name="alpha"), il)

    def projection(self, b: GraphBuilder, t: T, il: int) -> Node:
        """A projection of Qwen3-Next's DeltaNet that its file's form needs (llama.cpp's graph would read it
        missing): attn_gate beside attn_qkv, else ssm_in."""
        w = b.w_opt(t, il)
        if w is None:
            qkv, qkvz = tensor_name(T.ATTN_QKV, il), tensor_name(T.SSM_IN, il)
            raise TensorError(f"{b.label}: " + (f"missing tensor '{tensor_name(t, il)}' beside '{qkv}'" if t != T.SSM_IN
                                                else f"missing tensor '{qkv}' (or '{qkvz}' of q, k, v and z in one)"))
        return w

    def split_qkvz(self, b: GraphBuilder, mixed: Node) -> tuple[Node, Node]:
        """ssm_in's product, key head by key head [q, k, v, z], as [q..., k..., v...] for the conv and z."""
        hp = self.hp
        Dk, Hk, Ts, S = hp.ssm_d_state, hp.ssm_n_group, b.n_seq_tokens, b.n_seqs
        assert Ts is not None
        Dv = hp.ssm_d_inner // hp.ssm_n_group  # v (and z) of the value heads one key head serves
        width = 2 * Dk + 2 * Dv
        mixed = b.reshape(mixed, (width, Hk, Ts, S), name="linear_attn_mixed_qkvz.heads")
        q, k, v, z = (b.op("view", mixed, shape=(size, Hk, Ts, S), strides=(1, width, width * Hk, width * Hk * Ts),
                           offset=off, name=tag)
                      for tag, size, off in (("q", Dk, 0), ("k", Dk, Dk), ("v", Dv, 2 * Dk), ("z", Dv, 2 * Dk + Dv)))
        q, k, v = (b.reshape(b.op("cont", x, name=f"{tag}.cont"), (x.shape[0] * Hk, Ts, S), name=tag)
                   for x, tag in ((q, "query_flat"), (k, "key_flat"), (v, "value_flat")))
        qkv = b.op("concat", b.op("concat", q, k, dim=0, name="qk_mixed"), v, dim=0, name="qkv_mixed")
        return qkv, b.op("cont", z, name="z")

    def key_heads(self, b: GraphBuilder, q: Node, k: Node) -> tuple[Node, Node]:
        """q and k as the delta rule reads them: the op shares each key head among the value heads in turn
        (Qwen3.5); Qwen3-Next's are repeated here, each for the value heads it serves in place."""
        hp = self.hp
        r = self.per_key_head
        if not self.packed or r == 1:
            return q, k
        Dk, Hk, Ts, S = q.shape
        return tuple(b.reshape(b.op("repeat", b.reshape(x, (Dk, 1, Hk, Ts * S), name=f"{tag}.heads"),
                                    shape=(Dk, r, Hk, Ts * S), name=f"{tag}.repeat"),
                               (Dk, hp.ssm_dt_rank, Ts, S), name=f"{tag}_predelta")
                     for x, tag in ((q, "q_conv"), (k, "k_conv")))

    def delta_net(self, b: GraphBuilder, h: Node, il: int) -> Node:
        """Gated DeltaNet over the ubatch's sequences ([E, n_tokens] in and out)."""
        hp = self.hp
        Dk, Hk, Hv, cd = hp.ssm_d_state, hp.ssm_n_group, hp.ssm_dt_rank, self.conv_dim
        Ts, S = b.n_seq_tokens, b.n_seqs
        assert Ts is not None
        qkv, z, beta, g = self.delta_inputs(b, h, il)
        conv_x = ssm.conv_input(b, qkv, name="conv_input", transposed="qkv_mixed.t")
        x = b.op("silu", b.op("ssm_conv", conv_x, b.w(T.SSM_CONV1D, il), name="conv_output_raw"),
                 name="conv_output_silu")
        q, k = (b.op("view", x, shape=(Dk, Hk, Ts, S), strides=(1, Dk, cd, cd * Ts), offset=off, name=tag)
                for tag, off in (("q_conv", 0), ("k_conv", Dk * Hk)))
        v = b.op("view", x, shape=(Dk, Hv, Ts, S), strides=(1, Dk, cd, cd * Ts), offset=2 * Dk * Hk, name="v_conv")
        q, k = self.key_heads(b, self.l2_norm(b, q, "q_normed"), self.l2_norm(b, k, "k_normed"))

        state = b.reshape(b.build_rs("s"), (Dk, Dk, Hv, S), name="state")
        ys = b.op("gated_delta_net", q, k, v, g, beta, state, name="delta_net")
        y = b.op("view", ys, shape=(Dk, Hv, Ts, S), strides=(1, Dk, Dk * Hv, Dk * Hv * Ts), offset=0,
                 name="attn_output")
        ssm.store_states(b, ys, Dk * Hv * Ts * S, Dk * hp.ssm_d_inner, name="new_state")
        y = b.norm(y, T.SSM_NORM, il, name="attn_output_normed")
        y = b.op("mul", y, b.op("silu", b.reshape(z, (Dk, Hv, Ts, S), name="z.heads"), name="z_silu"), name="gated")
        y = b.reshape(y, (hp.ssm_d_inner, Ts, S), name="final_output")
        y = b.mm(b.w(T.SSM_OUT, il), y, None if self.packed else b.scale(T.SSM_OUT, il), name="linear_attn_out")
        return b.reshape(y, (hp.n_embd, b.n_tokens), name="linear_attn_out.tokens")

    def moe(self, b: GraphBuilder, h: Node, il: int) -> Node:
        """The experts' softmax-weighted sum (weights normalised) plus the shared expert times sigmoid(its gate)."""
        hp = self.hp
        moe = b.build_moe_ffn(h, gate_inp=b.w(T.FFN_GATE_INP, il), down_exps=b.w(T.FFN_DOWN_EXP, il),
                              **gate_up(b, il), n_expert=hp.n_expert, n_expert_used=hp.n_expert_used, norm_w=True,
                              up_exps_s=b.scale(T.FFN_UP_EXP, il), gate_exps_s=b.scale(T.FFN_GATE_EXP, il),
                              down_exps_s=b.scale(T.FFN_DOWN_EXP, il))
        shared = b.build_ffn(h, up=b.w(T.FFN_UP_SHEXP, il), gate=b.w(T.FFN_GATE_SHEXP, il),
                             down=b.w(T.FFN_DOWN_SHEXP, il), up_s=b.scale(T.FFN_UP_SHEXP, il),
                             gate_s=b.scale(T.FFN_GATE_SHEXP, il), down_s=b.scale(T.FFN_DOWN_SHEXP, il),
                             name="ffn_shexp")
        gate = b.op("sigmoid", b.mm(b.w(T.FFN_GATE_INP_SHEXP, il), h, name="shared_expert_gate"),
                    name="shared_expert_gate_sigmoid")
        return b.op("add", moe, b.op("mul", shared, gate, name="ffn_shexp_gated"), name="ffn_out")

    def build(self, b: GraphBuilder) -> None:
        x = b.build_inp_embd(b.w(T.TOKEN_EMBD))
        pos = b.build_inp_pos()
        for il in b.layers(self.n_trunk):
            h = b.norm(x, T.ATTN_NORM, il, name="attn_norm")
            a = self.delta_net(b, h, il) if self.recurrent(il) else self.attention(b, h, pos, il)
            x = b.op("add", a, x, name="attn_residual")
            h = b.norm(x, T.ATTN_POST_NORM, il, name="attn_post_norm")
            f = self.moe(b, h, il) if self.experts else b.build_ffn(
                h, up=b.w(T.FFN_UP, il), gate=b.w(T.FFN_GATE, il), down=b.w(T.FFN_DOWN, il),
                up_s=b.scale(T.FFN_UP, il), gate_s=b.scale(T.FFN_GATE, il), down_s=b.scale(T.FFN_DOWN, il))
            x = b.op("add", f, x, name="l_out")
        x = b.norm(x, T.OUTPUT_NORM, name="result_norm.all")
        # llama.cpp keeps every row through the last layer and picks the requested ones after the final norm
        b.build_output(b.op("get_rows", x, b.build_inp_out_ids(), name="result_norm"), b.w(T.OUTPUT))


class Qwen35Moe(Qwen35):
    name = "qwen35moe"
    keys = Qwen35.keys + MOE_KEYS + (
        Key("n_ff_exp", Keys.LLM.EXPERT_FEED_FORWARD_LENGTH, tuple, (), minimum=0),
        Key("n_ff_shexp", Keys.LLM.EXPERT_SHARED_FEED_FORWARD_LENGTH, int, 0, minimum=0))
    experts = True


# ---- presets: released models of this family, as their converted GGUFs declare them ---------------------

L, A, R, S = Keys.LLM, Keys.Attention, Keys.Rope, Keys.SSM


presets.register({
    # Gated DeltaNet in three layers of four (16 key and 16 value heads of 128, conv kernel 4), gated attention
    # in every fourth (8 query heads and 2 KV heads of 256, a quarter of each head RoPE'd in M-RoPE sections), and a
    # multi-token-prediction layer after them (loaded, never run).
    "Qwen3.5-0.8B": Preset("qwen35", {
        L.CONTEXT_LENGTH: 262144, L.EMBEDDING_LENGTH: 1024, L.BLOCK_COUNT: 25, L.NEXTN_PREDICT_LAYERS: 1,
        L.FEED_FORWARD_LENGTH: 3584,
        A.HEAD_COUNT: 8, A.HEAD_COUNT_KV: 2, A.KEY_LENGTH: 256, A.VALUE_LENGTH: 256, R.FREQ_BASE: 10000000.0,
        R.DIMENSION_COUNT: 64, R.DIMENSION_SECTIONS: [11, 11, 10, 0], A.LAYERNORM_RMS_EPS: 1e-6,
        L.FULL_ATTENTION_INTERVAL: 4, S.CONV_KERNEL: 4, S.STATE_SIZE: 128, S.GROUP_COUNT: 16, S.TIME_STEP_RANK: 16,
        S.INNER_SIZE: 2048, L.VOCAB_SIZE: 248320,
    }, tied=True, include=MTP_NORM, f32=r"blk\.\d+\.ssm_conv1d\.weight",
        source="Qwen/Qwen3.5-0.8B config.json (text_config)"),
    # The largest Qwen3.5 mixture: Qwen3.5's layout at width 4096 over 60 layers (32 query and 2 KV heads of 256;
    # 16 key and 64 value DeltaNet heads of 128); each FFN 512 experts of 1024, 10 per token, and a shared expert
    # of 1024; a multi-token-prediction layer after them.
    "Qwen3.5-397B-A17B": Preset("qwen35moe", {
        L.CONTEXT_LENGTH: 262144, L.EMBEDDING_LENGTH: 4096, L.BLOCK_COUNT: 61, L.NEXTN_PREDICT_LAYERS: 1,
        A.HEAD_COUNT: 32, A.HEAD_COUNT_KV: 2, A.KEY_LENGTH: 256, A.VALUE_LENGTH: 256, R.FREQ_BASE: 10000000.0,
        R.DIMENSION_COUNT: 64,
        R.DIMENSION_SECTIONS: [11, 11, 10, 0], A.LAYERNORM_RMS_EPS: 1e-6, L.FULL_ATTENTION_INTERVAL: 4,
        S.CONV_KERNEL: 4, S.STATE_SIZE: 128, S.GROUP_COUNT: 16, S.TIME_STEP_RANK: 64, S.INNER_SIZE: 8192,
        L.VOCAB_SIZE: 248320, L.EXPERT_COUNT: 512, L.EXPERT_USED_COUNT: 10, L.EXPERT_FEED_FORWARD_LENGTH: 1024,
        L.EXPERT_SHARED_FEED_FORWARD_LENGTH: 1024,
    }, tied=False, include=f"{FUSED_EXPERTS}|{MTP_NORM}",
        f32=MOE_F32,
        source="Qwen/Qwen3.5-397B-A17B config.json (text_config)"),
})


# ---- Hugging Face: the keys convert_hf_to_gguf writes for Qwen3.5 -------------------------------------------------

def _mtp(c: Config) -> int:
    return c.find("mtp_num_hidden_layers", kind="size", default=0)


def deltanet_keys(mtp: Callable[[Config], int]) -> tuple:
    """The keys convert_hf_to_gguf writes for a gated-DeltaNet hybrid whose ``mtp(config)`` prediction layers
    come after the others (as attention layers)."""
    def layers(c: Config) -> list[bool] | None:
        types = c.find("layer_types", kind="list", default=None)  # absent: by the interval
        if types is None:
            return None
        n = c.find(*BLOCKS)
        if len(types) != n:
            raise c.error(f"layer_types has {len(types)} entries, num_hidden_layers {n}")
        return [t == "linear_attention" for t in types] + [False] * mtp(c)

    return TEXT + (
        hf(L.EXPERT_FEED_FORWARD_LENGTH, "moe_intermediate_size", default=None),
        hf(L.EXPERT_SHARED_FEED_FORWARD_LENGTH, "shared_expert_intermediate_size", default=None),
        hf(S.CONV_KERNEL, "linear_conv_kernel_dim"),
        hf(S.STATE_SIZE, "linear_key_head_dim"),
        hf(S.GROUP_COUNT, "linear_num_key_heads"),
        hf(S.TIME_STEP_RANK, "linear_num_value_heads"),
        derived(S.INNER_SIZE, lambda c: c.find("linear_value_head_dim") * c.find("linear_num_value_heads")),
        derived(RECURRENT_LAYERS, layers),
        hf(L.FULL_ATTENTION_INTERVAL, "full_attention_interval", default=4),
        derived(R.DIMENSION_COUNT, lambda c: int(head_dim(c) * c.check(
            "partial_rotary_factor", c.rope.get("partial_rotary_factor", 0.25), "number"))),
        VOCAB,
        derived(L.BLOCK_COUNT, lambda c: c.find(*BLOCKS) + mtp(c)),
        derived(L.NEXTN_PREDICT_LAYERS, lambda c: mtp(c) or None),
    )


QWEN35 = deltanet_keys(_mtp) + (
    lambda c: {} if "mrope_section" in c.rope else {R.DIMENSION_SECTIONS: [11, 11, 10, 0]},)


hf_config.register(Family("qwen35", QWEN35, {"tie_word_embeddings": False}, lambda c: MTP_NORM), "Qwen3_5ForCausalLM",
                   "Qwen3_5ForConditionalGeneration")
hf_config.register(Family("qwen35moe", QWEN35, {"tie_word_embeddings": False},
                          lambda c: f"{FUSED_EXPERTS}|{MTP_NORM}"),
                   "Qwen3_5MoeForCausalLM", "Qwen3_5MoeForConditionalGeneration")
