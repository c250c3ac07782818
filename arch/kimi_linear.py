"""Kimi-Linear (kimi-linear): Kimi Delta Attention layers and multi-head latent attention layers in one decoder,
with DeepSeek-V3's mixture of experts.

A layer whose ``attention.head_count_kv`` entry is 0 mixes tokens by Kimi Delta Attention (KDA): q, k and v each
from their own projection, each through its own short causal convolution (the three keep their last columns side
by side in the layer's rolling state, q's first) and SiLU; q and k L2-normalised per head; the gated delta rule
with a decay per key channel, g = A * softplus(f_b(f_a(x)) + dt_bias) (a low-rank projection, one A per head),
and a step beta = sigmoid(b(x)) per head; the read-out RMS-normalised per head (``ssm_norm``) and gated by
sigmoid(g_b(g_a(x))), then W_o. The other layers attend with absorbed MLA (arch/deepseek2.py's form: one shared
head over rows [latent | key part], queries without positions absorbed through ``attn_k_b``, each head's output
decompressed through ``attn_v_b``), without RoPE: the key part goes into the row as projected. Scores are scaled
by 1/sqrt(key_length_mla). FFNs: the first ``leading_dense_block_count`` layers are dense SwiGLU, the others route
each token to its ``expert_used_count`` best experts (the file's gating, with the selection bias
``exp_probs_b``; renormalised, scaled by ``expert_weights_scale``) plus a shared expert.

The memory is the hybrid kind with a latent cache as its attention part: one latent row per token for the MLA
layers, conv columns (q, k and v) and one d x d delta state per head and sequence for the KDA layers.
llama.cpp sizes the KDA layers by layer 0's head count and ``kda.head_dim``, as here.
References: Kimi Team 2025, "Kimi Linear: An Expressive, Efficient Attention Architecture"; llama.cpp
src/models/kimi-linear.cpp, delta-net-base.cpp.
"""

from __future__ import annotations

from typing import ClassVar, Mapping

from gguf import MODEL_TENSOR as T
from gguf import Keys

from graphir.arch.deepseek2 import GATINGS, _mla
from graphir.errors import MetadataError
from graphir.graph.floats import f32, inv_sqrt
from graphir.graph.ir import Node
from graphir.memory.layers import LatentAttention, LayerNeeds, Recurrent
from graphir.model import hf_config, presets, ssm
from graphir.model.architecture import Architecture
from graphir.model.builder import Gating, GraphBuilder
from graphir.model.hf_config import BLOCKS, TEXT, VOCAB, Config, Family, derived, hf
from graphir.model.hparams import HParams, Key
from graphir.model.moe import MOE_KEYS, check_experts
from graphir.model.presets import Preset
from graphir.model.scales import layer_scales
from graphir.model.tensors import TensorDecl, TensorSpec, spec, swiglu_tensors, tensor_name

L, A, R, S = Keys.LLM, Keys.Attention, Keys.Rope, Keys.SSM

QKV = ((T.ATTN_Q, T.SSM_CONV1D_Q, "q"), (T.ATTN_K, T.SSM_CONV1D_K, "k"), (T.ATTN_V, T.SSM_CONV1D_V, "v"))


class KimiLinear(Architecture):
    name = "kimi-linear"
    required_keys = (A.LAYERNORM_RMS_EPS, A.HEAD_COUNT)
    per_layer = True  # head_count_kv per layer says which layers are KDA layers
    fused_qkv: ClassVar[bool] = True  # the KDA's q, k and v may come from one attn_qkv (else from three, required)
    tied_head: ClassVar[bool] = False  # a file without output.weight reuses token_embd
    keys = MOE_KEYS + (
        Key("n_embd_head_k_mla", A.KEY_LENGTH_MLA, int, required=True, minimum=1),
        Key("n_embd_head_v_mla", A.VALUE_LENGTH_MLA, int, required=True, minimum=1),
        Key("n_lora_kv", A.KV_LORA_RANK, int, required=True, minimum=1),
        Key("ssm_d_conv", S.CONV_KERNEL, int, required=True, minimum=2),
        Key("kda_head_dim", Keys.KDA.HEAD_DIM, int, required=True, minimum=1),
        Key("n_ff_exp", L.EXPERT_FEED_FORWARD_LENGTH, int, 0, minimum=0, first=True),
        Key("n_expert_shared", L.EXPERT_SHARED_COUNT, int, required=True, minimum=0),
        Key("n_layer_dense_lead", L.LEADING_DENSE_BLOCK_COUNT, int, 0, minimum=0),
        Key("expert_weights_scale", L.EXPERT_WEIGHTS_SCALE, float, 0.0),
        Key("expert_gating_func", L.EXPERT_GATING_FUNC, int, required=True, minimum=0),
    )

    def __init__(self, hp: HParams):
        key = lambda t: f"'{t.format(arch=self.name)}'"  # noqa: E731
        check_experts(hp, self.name)
        if hp.expert_gating_func not in GATINGS:
            raise MetadataError(f"{key(L.EXPERT_GATING_FUNC)} = {hp.expert_gating_func}: not a gating graphir "
                                f"builds (1 softmax, 2 sigmoid, 3 softmax of the chosen)")
        if hp.n_layer_dense_lead < hp.n_layer and not hp.n_expert:
            raise MetadataError(f"layers {hp.n_layer_dense_lead}.. are mixtures of experts "
                                f"({key(L.LEADING_DENSE_BLOCK_COUNT)} = {hp.n_layer_dense_lead}) but "
                                f"{key(L.EXPERT_COUNT)} is 0")
        self.n_trunk = self.trunk(hp)
        self.d_nope = hp.n_embd_head_k_mla - hp.n_rot
        if self.d_nope < 1:
            raise MetadataError(f"heads of {hp.n_embd_head_k_mla} values ({key(A.KEY_LENGTH_MLA)}) leave no part "
                                f"without positions beside the {hp.n_rot} of the key part ({key(R.DIMENSION_COUNT)})")
        super().__init__(hp)

    def trunk(self, hp: HParams) -> int:
        """The layers the graph runs: all of them."""
        return hp.n_layer

    def recurrent(self, il: int) -> bool:
        return self.hp.head_count_kv(il) == 0

    @property
    def gating(self) -> Gating:
        return GATINGS[self.hp.expert_gating_func]

    @property
    def n_ff_shexp(self) -> int:
        """The shared expert's width: an expert's times the shared count (at least one)."""
        return self.hp.n_ff_exp * max(self.hp.n_expert_shared, 1)

    @property
    def n_head(self) -> int:
        """The heads of every layer, as llama.cpp's graph reads them: layer 0's count."""
        return self.hp.head_count(0)

    @property
    def d_inner(self) -> int:
        return self.n_head * self.hp.kda_head_dim

    def layers(self) -> LayerNeeds:
        """KDA: the conv columns of q, k and v side by side, one d x d state per head; MLA: one latent row."""
        hp, d = self.hp, self.hp.kda_head_dim
        kda = Recurrent(3 * (hp.ssm_d_conv - 1) * self.d_inner, d * d * self.n_head)
        return tuple(kda if self.recurrent(il) else LatentAttention(hp.n_lora_kv + hp.n_rot)
                     for il in range(self.n_trunk))

    def check_heads(self, label: str) -> None:
        """A latent layer attends as one shared head (its K/V head count says only that it attends)."""

    # ---- tensors ------------------------------------------------------------------------------------------

    def tensors(self) -> list[TensorSpec]:
        hp = self.hp
        E, V = hp.n_embd, hp.n_vocab
        specs = [spec(T.TOKEN_EMBD, (E, V)), spec(T.OUTPUT_NORM, (E,), kind="vector"),
                 spec(T.OUTPUT, (E, V), tied_to=tensor_name(T.TOKEN_EMBD) if self.tied_head else None)]
        for il in range(hp.n_layer):
            mixer = self.kda_tensors(il) if self.recurrent(il) else self.mla_tensors(il)
            ffn = self.ffn_tensors(il)
            layer = [spec(T.ATTN_NORM, (E,), il, kind="vector"), *mixer, spec(T.FFN_NORM, (E,), il, kind="vector"),
                     *ffn, *layer_scales([*mixer, *ffn], il, hp.n_expert)]
            specs += layer if il < self.n_trunk else self.draft_layer(layer, il)
        return specs

    def draft_layer(self, layer: list[TensorSpec], il: int) -> list[TensorSpec]:
        """A layer after the trunk (none here)."""
        return layer

    def kda_tensors(self, il: int) -> list[TensorSpec]:
        """Layer il's KDA: q, k and v (:meth:`qkv_tensors`), each conv kernel [d_conv, 1, d_inner], the gates'
        projections (:meth:`gate_tensors`), beta's, A one per head, the read-out's norm and W_o."""
        hp = self.hp
        E, H, d, Di, K = hp.n_embd, self.n_head, hp.kda_head_dim, self.d_inner, hp.ssm_d_conv
        return [*self.qkv_tensors(il), *(spec(conv, (K, 1, Di), il) for _, conv, _ in QKV),
                *self.gate_tensors(il), spec(T.SSM_BETA, (E, H), il),
                spec(T.SSM_A, (1, H), il, suffix=None),  # -exp(A_log), stored under a bare name
                spec(T.SSM_DT, (Di,), il, "bias", kind="vector"),
                spec(T.SSM_NORM, (d,), il, kind="vector"), spec(T.ATTN_OUT, (Di, hp.n_embd), il)]

    def qkv_tensors(self, il: int) -> list[TensorSpec]:
        """q, k and v apart or in one attn_qkv (llama.cpp's create_tensor_qkv; biases loaded, never read); where
        the graph reads the three alone (``fused_qkv`` False), those three required."""
        E, Di = self.hp.n_embd, self.d_inner
        if not self.fused_qkv:
            return [*(spec(t, (E, Di), il) for t, _, _ in QKV),
                    *(spec(t, (Di,), il, "bias", kind="vector", optional=True) for t, _, _ in QKV)]
        return [spec(T.ATTN_QKV, (E, 3 * Di), il, optional=True),
                spec(T.ATTN_QKV, (3 * Di,), il, "bias", kind="vector", optional=True),
                *(spec(t, (E, Di), il, optional=True) for t, _, _ in QKV),
                *(spec(t, (Di,), il, "bias", kind="vector", optional=True) for t, _, _ in QKV)]

    def gate_tensors(self, il: int) -> list[TensorSpec]:
        """The decay's and the output gate's projections, each of low rank (head_dim) through two matrices."""
        E, d, Di = self.hp.n_embd, self.hp.kda_head_dim, self.d_inner
        return [spec(T.SSM_F_A, (E, d), il), spec(T.SSM_F_B, (d, Di), il),
                spec(T.SSM_G_A, (E, d), il), spec(T.SSM_G_B, (d, Di), il)]

    def mla_tensors(self, il: int) -> list[TensorSpec]:
        """Layer il's absorbed MLA, queries projected directly (llama.cpp's graph reads attn_q alone)."""
        hp = self.hp
        E, H = hp.n_embd, self.n_head
        return [spec(T.ATTN_Q, (E, H * hp.n_embd_head_k_mla), il), *self.latent_tensors(il),
                spec(T.ATTN_OUT, (H * hp.n_embd_head_v_mla, E), il)]

    def latent_tensors(self, il: int) -> list[TensorSpec]:
        """The latent and key part's projection and norm, and the per-head absorption and decompression stacks."""
        hp = self.hp
        E, H, Rkv = hp.n_embd, self.n_head, hp.n_lora_kv
        return [spec(T.ATTN_KV_A_NORM, (Rkv,), il, kind="vector"), spec(T.ATTN_KV_A_MQA, (E, Rkv + hp.n_rot), il),
                spec(T.ATTN_K_B, (self.d_nope, Rkv, H), il), spec(T.ATTN_V_B, (Rkv, hp.n_embd_head_v_mla, H), il)]

    def ffn_tensors(self, il: int) -> list[TensorSpec]:
        """Dense SwiGLU in the leading layers; else the experts, their selection bias and the shared expert of
        ``expert_feed_forward_length`` x ``expert_shared_count`` (loaded as optional, read always: required here)."""
        hp = self.hp
        E = hp.n_embd
        if il < hp.n_layer_dense_lead:
            return swiglu_tensors(E, hp.ff_length(il), il)
        X, F, Fs = hp.n_expert, hp.n_ff_exp, self.n_ff_shexp
        return [spec(T.FFN_GATE_INP, (E, X), il), spec(T.FFN_GATE_EXP, (E, F, X), il),
                spec(T.FFN_DOWN_EXP, (F, E, X), il), spec(T.FFN_UP_EXP, (E, F, X), il),
                spec(T.FFN_GATE_SHEXP, (E, Fs), il), spec(T.FFN_DOWN_SHEXP, (Fs, E), il),
                spec(T.FFN_UP_SHEXP, (E, Fs), il), spec(T.FFN_EXP_PROBS_B, (X,), il, "bias", kind="vector")]

    def check(self, tensors: Mapping[str, TensorDecl]) -> list[str]:
        """The table's checks, and each KDA layer's q, k and v in one whole form: attn_qkv, else the three."""
        problems = super().check(tensors)
        for il in range(self.n_trunk):
            if self.fused_qkv and self.recurrent(il) and tensor_name(T.ATTN_QKV, il) not in tensors:
                problems += [f"missing tensor '{tensor_name(t, il)}' (or '{tensor_name(T.ATTN_QKV, il)}')"
                             for t, _, _ in QKV if tensor_name(t, il) not in tensors]
        return problems

    # ---- graph --------------------------------------------------------------------------------------------

    def short_conv(self, b: GraphBuilder, saved: Node, x: Node, conv: T, part: int, tag: str, il: int) -> Node:
        """One of q, k and v ([d_inner, n_tokens]) behind its saved columns (the ``part``-th third of the layer's
        rolling state), convolved and SiLU'd: [head_dim, n_head, n_seq_tokens, n_seqs]. Returns also the
        columns to save."""
        hp = self.hp
        K, Di, d, Ts, Sq = hp.ssm_d_conv, self.d_inner, hp.kda_head_dim, b.n_seq_tokens, b.n_seqs
        assert Ts is not None
        state = b.op("view", saved, shape=(K - 1, Di, Sq), strides=(1, K - 1, 3 * (K - 1) * Di),
                     offset=part * (K - 1) * Di, name=f"{tag}_conv_state")
        x = b.reshape(x, (Di, Ts, Sq), name=f"{tag}_proj.seqs")
        conv_x = b.op("concat", state, b.op("transpose", x, name=f"{tag}_proj.t"), dim=0, name=f"{tag}_conv_x")
        last = b.op("view", conv_x, shape=(K - 1, Di, Sq), strides=(1, K - 1 + Ts, (K - 1 + Ts) * Di), offset=Ts,
                    name=f"{tag}_conv_state.new")
        w = b.reshape(b.w(conv, il), (K, Di), name=f"{tag}_conv_w")
        y = b.op("ssm_conv", conv_x, w, name=f"{tag}_conv")
        y = b.op("silu", b.reshape(y, (Di, b.n_tokens), name=f"{tag}_conv.tokens"), name=f"{tag}_conv_silu")
        return b.reshape(y, (d, self.n_head, Ts, Sq), name=f"{tag}_conv.heads"), last

    def l2_norm(self, b: GraphBuilder, x: Node, name: str) -> Node:
        """x / |x| per head, as llama.cpp writes it: RMS norm with eps / n, times 1 / sqrt(n)."""
        n = x.shape[0]
        y = b.op("rms_norm", x, eps=f32(self.hp.norm_rms_eps / n), name=f"{name}.rms")
        return b.op("scale", y, s=inv_sqrt(n), name=name)

    def kda(self, b: GraphBuilder, h: Node, il: int) -> Node:
        """Kimi Delta Attention over the ubatch's sequences ([E, n_tokens] in and out)."""
        hp = self.hp
        H, d, Di, K, Ts, Sq = self.n_head, hp.kda_head_dim, self.d_inner, hp.ssm_d_conv, b.n_seq_tokens, b.n_seqs
        assert Ts is not None
        saved = b.build_rs("r")
        convs = [self.short_conv(b, saved, x, conv, i, tag, il)
                 for i, (x, (_, conv, tag)) in enumerate(zip(self.projections(b, h, il), QKV))]
        new_cols = [b.op("cont", last, name=f"{tag}_conv_state.cont") for (_, last), (_, _, tag) in zip(convs, QKV)]
        cols = b.op("concat", b.op("concat", new_cols[0], new_cols[1], dim=1, name="qk_conv_state.new"), new_cols[2],
                    dim=1, name="conv_state.new")
        b.store_rs("r", b.reshape(cols, (3 * (K - 1) * Di, Sq), name="conv_rows"))
        q, k, v = (y for y, _ in convs)

        g = b.reshape(self.decay(b, h, il), (d, H, Ts, Sq), name="kda_g1.seqs")
        beta = b.reshape(b.mm(b.w(T.SSM_BETA, il), h, name="beta"), (1, H, Ts, Sq), name="kda_beta")
        beta = b.op("sigmoid", beta, name="beta_sigmoid")

        state = b.reshape(b.build_rs("s"), (d, d, H, Sq), name="state")
        q, k = self.l2_norm(b, q, "q_normed"), self.l2_norm(b, k, "k_normed")
        ys = b.op("gated_delta_net", q, k, v, g, beta, state, name="delta_net")
        y = b.op("view", ys, shape=(d, H, Ts, Sq), strides=(1, d, d * H, d * H * Ts), offset=0, name="attn_output")
        y = b.op("cont", y, name="attn_output.cont")
        ssm.store_states(b, ys, d * H * Ts * Sq, d * Di, name="new_state")

        g2 = self.out_gate(b, h, il)
        y = b.norm(b.reshape(y, (d, H, b.n_tokens), name="attn_output.heads"), T.SSM_NORM, il, name="kda_normed")
        y = b.op("mul", y, b.op("sigmoid", g2, name="g2_sigmoid"), name="kda_gated")
        y = b.reshape(b.op("cont", y, name="kda_gated.cont"), (Di, b.n_tokens), name="kda_gated.tokens")
        return b.mm(b.w(T.ATTN_OUT, il), y, name="kda_out")

    def projections(self, b: GraphBuilder, h: Node, il: int) -> list[Node]:
        """q, k and v [d_inner, n_tokens]: from attn_qkv where the file has it (as llama.cpp's graph prefers),
        else from the three apart."""
        Di = self.d_inner
        qkv_w = b.w_opt(T.ATTN_QKV, il) if self.fused_qkv else None
        if qkv_w is None:
            return [b.mm(b.w(t, il), h, name=f"{tag}_proj") for t, _, tag in QKV]
        qkv = b.mm(qkv_w, h, name="qkv")
        return [b.op("cont", b.op("view", qkv, shape=(Di, b.n_tokens), strides=(1, 3 * Di), offset=i * Di,
                                  name=f"{tag}_in"), name=f"{tag}_proj") for i, (_, _, tag) in enumerate(QKV)]

    def per_head_a(self, b: GraphBuilder, il: int) -> Node:
        return b.reshape(b.w(T.SSM_A, il, None), (1, self.n_head, 1), name="A.heads")

    def decay(self, b: GraphBuilder, h: Node, il: int) -> Node:
        """The log-decay per key channel [head_dim, n_head, n_tokens]: A * softplus(f_b(f_a(x)) + dt_bias)."""
        g = b.mm(b.w(T.SSM_F_B, il), b.mm(b.w(T.SSM_F_A, il), h, name="f_a"), name="g1")
        g = b.op("softplus", b.op("add", g, b.w(T.SSM_DT, il, "bias"), name="g1_biased"), name="g1_softplus")
        return b.op("mul", b.reshape(g, (self.hp.kda_head_dim, self.n_head, b.n_tokens), name="g1.heads"),
                    self.per_head_a(b, il), name="kda_g1")

    def out_gate(self, b: GraphBuilder, h: Node, il: int) -> Node:
        """The read-out's gate before its sigmoid [head_dim, n_head, n_tokens]: g_b(g_a(x))."""
        g2 = b.mm(b.w(T.SSM_G_B, il), b.mm(b.w(T.SSM_G_A, il), h, name="g_a"), name="g2")
        return b.reshape(g2, (self.hp.kda_head_dim, self.n_head, b.n_tokens), name="g2.heads")

    def mla(self, b: GraphBuilder, h: Node, il: int) -> Node:
        """Absorbed MLA without positions over directly projected queries, then W_o (times its scale)."""
        q = b.mm(b.w(T.ATTN_Q, il), h, name="q_proj")
        return self.latent_attention(b, h, q, None, il, wo=b.w(T.ATTN_OUT, il), wo_s=b.w_opt(T.ATTN_OUT, il, "scale"))

    def rotate(self, b: GraphBuilder, x: Node, pos: Node | None, name: str) -> Node:
        """The key part and the queries' RoPE'd part as they enter attention: unrotated (Kimi's MLA has no RoPE)."""
        return x

    def latent_attention(self, b: GraphBuilder, h: Node, q: Node, pos: Node | None, il: int, *, wo: Node | None,
                         wo_s: Node | None = None) -> Node:
        """Absorbed MLA of queries q [n_head * key_length_mla, n_tokens] over h's latent rows: each head's query
        without positions absorbed through attn_k_b, the key part and the queries' other part through
        :meth:`rotate`, one shared head over [latent | key part], each head's output decompressed through
        attn_v_b; then W_o where ``wo`` is given (else the heads' outputs)."""
        hp = self.hp
        H, Tn, Rkv, rot, dk, nope = self.n_head, b.n_tokens, hp.n_lora_kv, hp.n_rot, hp.n_embd_head_k_mla, self.d_nope
        q_nope = b.op("view", q, shape=(nope, H, Tn), strides=(1, dk, dk * H), offset=0, name="q_nope")
        q_pe = b.op("view", q, shape=(rot, H, Tn), strides=(1, dk, dk * H), offset=nope, name="q_pe")
        kv_pe = b.mm(b.w(T.ATTN_KV_A_MQA, il), h, name="kv_cmpr_pe")
        kv = b.op("view", kv_pe, shape=(Rkv, Tn), strides=(1, Rkv + rot), offset=0, name="kv_cmpr")
        k_pe = b.op("view", kv_pe, shape=(rot, 1, Tn), strides=(1, Rkv + rot, Rkv + rot), offset=Rkv, name="k_pe")
        q_pe, k_pe = self.rotate(b, q_pe, pos, "q_pe.rope"), self.rotate(b, k_pe, pos, "k_pe.rope")
        kv = b.norm(kv, T.ATTN_KV_A_NORM, il, name="kv_cmpr_norm")
        q_nope = b.op("permute", q_nope, axes=(0, 2, 1, 3), name="q_nope_perm")
        q_abs = b.op("mul_mat", b.w(T.ATTN_K_B, il), q_nope, name="q_nope_absorbed")
        q_abs = b.op("permute", q_abs, axes=(0, 2, 1, 3), name="q_nope_absorbed_perm")
        q = b.op("concat", q_abs, q_pe, dim=0, name="Qcur")
        latent = b.reshape(kv, (Rkv, 1, Tn), name="kv_cmpr_reshape")
        k = b.op("concat", latent, k_pe, dim=0, name="Kcur")
        return b.build_attn_mla(q, k, latent, wo=wo, v_mla=b.w(T.ATTN_V_B, il), kq_scale=inv_sqrt(dk), wo_s=wo_s)

    def ffn(self, b: GraphBuilder, h: Node, il: int) -> Node:
        hp, w = self.hp, b.w
        if il < hp.n_layer_dense_lead:
            return b.build_ffn(h, up=w(T.FFN_UP, il), gate=w(T.FFN_GATE, il), down=w(T.FFN_DOWN, il))
        moe = b.build_moe_ffn(h, gate_inp=w(T.FFN_GATE_INP, il), up_exps=w(T.FFN_UP_EXP, il),
                              gate_exps=w(T.FFN_GATE_EXP, il), down_exps=w(T.FFN_DOWN_EXP, il),
                              n_expert=hp.n_expert, n_expert_used=hp.n_expert_used,
                              gating=self.gating, norm_w=True, w_scale=hp.expert_weights_scale,
                              probs_b=w(T.FFN_EXP_PROBS_B, il, "bias"))
        shared = b.build_ffn(h, up=w(T.FFN_UP_SHEXP, il), gate=w(T.FFN_GATE_SHEXP, il), down=w(T.FFN_DOWN_SHEXP, il),
                             name="ffn_shexp")
        return b.op("add", moe, shared, name="ffn_out")

    def build(self, b: GraphBuilder) -> None:
        x = b.build_inp_embd(b.w(T.TOKEN_EMBD))
        for il in b.layers(self.n_trunk):
            h = b.norm(x, T.ATTN_NORM, il, name="attn_norm")
            a = self.kda(b, h, il) if self.recurrent(il) else self.mla(b, h, il)
            a, x = b.last_layer_rows((a, "attn_out.rows"), (x, "inp.rows"))
            x = b.op("add", a, x, name="ffn_inp")
            f = self.ffn(b, b.norm(x, T.FFN_NORM, il, name="ffn_norm"), il)
            x = b.op("add", f, x, name="l_out")
        b.build_output(b.norm(x, T.OUTPUT_NORM, name="result_norm"), b.w(T.OUTPUT))


# ---- presets: released models of this family, as their converted GGUFs declare them ---------------------

F32 = presets.ROUTER_F32 + r"|blk\.\d+\.ssm_a"  # routers and A (a bare name) kept f32; the q/k/v conv kernels not


def _kv_heads(n_layer: int, mla_layers: list[int]) -> list[int]:
    """One shared (latent) head in the MLA layers, none in the KDA layers: the per-layer count that tells them apart
    and sizes the latent row (key_length)."""
    return [1 if il in mla_layers else 0 for il in range(n_layer)]


presets.register({
    # 27 layers of width 2304: MLA (32 heads of 128 + 64, values of 128, a latent of 512 + 64, no query compression)
    # in every fourth layer and the last, KDA (32 heads of 128, conv kernel 4) in the others; the first layer's FFN
    # dense (9216), the others 256 experts of 1024 with 8 per token by sigmoid with a selection bias, renormalised
    # and scaled by 2.446, plus one shared expert
    "Kimi-Linear-48B-A3B": Preset("kimi-linear", {
        L.CONTEXT_LENGTH: 1048576, L.EMBEDDING_LENGTH: 2304, L.BLOCK_COUNT: 27, L.FEED_FORWARD_LENGTH: 9216,
        A.HEAD_COUNT: 32, A.HEAD_COUNT_KV: _kv_heads(27, [3, 7, 11, 15, 19, 23, 26]), A.KEY_LENGTH: 576,
        A.VALUE_LENGTH: 512, A.KEY_LENGTH_MLA: 192, A.VALUE_LENGTH_MLA: 128, A.KV_LORA_RANK: 512,
        R.DIMENSION_COUNT: 64, R.FREQ_BASE: 10000.0, A.LAYERNORM_RMS_EPS: 1e-5, S.CONV_KERNEL: 4,
        Keys.KDA.HEAD_DIM: 128, L.LEADING_DENSE_BLOCK_COUNT: 1, L.EXPERT_COUNT: 256, L.EXPERT_USED_COUNT: 8,
        L.EXPERT_FEED_FORWARD_LENGTH: 1024, L.EXPERT_SHARED_COUNT: 1, L.EXPERT_WEIGHTS_SCALE: 2.446,
        L.EXPERT_GATING_FUNC: 2, L.VOCAB_SIZE: 163840,
    }, tied=False, include=presets.SPLIT_QKV, f32=F32, source="moonshotai/Kimi-Linear-48B-A3B-Instruct config.json"),
})


# ---- Hugging Face: convert_hf_to_gguf's KimiLinearModel -----------------------------------------------------


def _linear(c: Config, name: str) -> int:
    """A figure of the KDA layers (``linear_attn_config``)."""
    return c.check(f"linear_attn_config.{name}", c.find("linear_attn_config", kind="map").get(name), "count")


def _mla_layers(c: Config) -> list[int]:
    """The MLA layers, from linear_attn_config.full_attn_layers (numbered from 1)."""
    full = c.check("linear_attn_config.full_attn_layers",
                   c.find("linear_attn_config", kind="map").get("full_attn_layers"), "list")
    return [c.check("linear_attn_config.full_attn_layers", il, "count") - 1 for il in full]


KIMI_LINEAR = TEXT + (
    derived(A.HEAD_COUNT_KV, lambda c: _kv_heads(c.find(*BLOCKS), _mla_layers(c))),
    _mla,
    hf(A.Q_LORA_RANK, "q_lora_rank", default=None),
    hf(R.DIMENSION_COUNT, "qk_rope_head_dim"),
    derived(S.CONV_KERNEL, lambda c: _linear(c, "short_conv_kernel_size")),
    derived(Keys.KDA.HEAD_DIM, lambda c: _linear(c, "head_dim")),
    hf(L.LEADING_DENSE_BLOCK_COUNT, "first_k_dense_replace", kind="size", default=None),
    hf(L.EXPERT_FEED_FORWARD_LENGTH, "moe_intermediate_size"),
    hf(L.EXPERT_SHARED_COUNT, "num_shared_experts", kind="size"),
    hf(L.EXPERT_WEIGHTS_SCALE, "routed_scaling_factor", kind="number", default=None),
    VOCAB,
)
hf_config.register(Family("kimi-linear", KIMI_LINEAR, {"tie_word_embeddings": False}, lambda c: presets.SPLIT_QKV),
                   "KimiLinearForCausalLM")
