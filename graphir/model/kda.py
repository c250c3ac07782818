"""Kimi Delta Attention (KDA) and the absorbed latent attention it is interleaved with, as Kimi-Linear and Ling 3.0
build them: the blocks both families' graphs share, with what differs between them (the projections of q, k and v,
the decay, the read-out's gate, RoPE) handed in by the family.

KDA: q, k and v each through its own short causal convolution (the three keep their last columns side by side in
the layer's rolling state, q's first) and SiLU; q and k L2-normalised per head; the gated delta rule with a decay
per key channel and a step beta = sigmoid(b(x)) per head; the read-out RMS-normalised per head (``ssm_norm``), gated
by the sigmoid of the family's gate, then W_o. Absorbed MLA (arch/deepseek2.py's form): one shared head over rows
[latent | key part], queries without positions absorbed through ``attn_k_b``, each head's output decompressed
through ``attn_v_b``; scores scaled by 1/sqrt(key_length_mla).
References: Kimi Team 2025, "Kimi Linear"; llama.cpp src/models/kimi-linear.cpp, bailingmoe3.cpp, delta-net-base.cpp.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping

from gguf import MODEL_TENSOR as T
from gguf import Keys

from graphir.errors import MetadataError
from graphir.graph.floats import f32, inv_sqrt
from graphir.graph.ir import Node
from graphir.memory.layers import LatentAttention, LayerNeeds, Recurrent
from graphir.model import ssm
from graphir.model.builder import GraphBuilder
from graphir.model.hparams import HParams, Key
from graphir.model.mla import Rope
from graphir.model.tensors import TensorDecl, TensorSpec, spec, tensor_name

L, A, R, S = Keys.LLM, Keys.Attention, Keys.Rope, Keys.SSM

QKV = ((T.ATTN_Q, T.SSM_CONV1D_Q, "q"), (T.ATTN_K, T.SSM_CONV1D_K, "k"), (T.ATTN_V, T.SSM_CONV1D_V, "v"))

# the keys of a KDA + latent-attention hybrid
KEYS = (
    Key("n_embd_head_k_mla", A.KEY_LENGTH_MLA, int, required=True, minimum=1),
    Key("n_embd_head_v_mla", A.VALUE_LENGTH_MLA, int, required=True, minimum=1),
    Key("n_lora_kv", A.KV_LORA_RANK, int, required=True, minimum=1),
    Key("ssm_d_conv", S.CONV_KERNEL, int, required=True, minimum=2),
    Key("kda_head_dim", Keys.KDA.HEAD_DIM, int, required=True, minimum=1),
)


@dataclass(frozen=True)
class Hybrid:
    """Which layers are KDA layers (``attention.head_count_kv`` 0), and the sizes llama.cpp gives them all: layer
    0's head count and ``kda.head_dim``."""

    hp: HParams
    n_trunk: int  # the layers the graph runs

    def recurrent(self, il: int) -> bool:
        return self.hp.head_count_kv(il) == 0

    @property
    def n_head(self) -> int:
        return self.hp.head_count(0)

    @property
    def d_inner(self) -> int:
        return self.n_head * self.hp.kda_head_dim

    @property
    def d_nope(self) -> int:
        """The queries' part without positions beside the key part of ``n_rot``."""
        return self.hp.n_embd_head_k_mla - self.hp.n_rot

    def check(self, arch: str) -> None:
        if self.d_nope < 1:
            raise MetadataError(f"heads of {self.hp.n_embd_head_k_mla} values "
                                f"('{A.KEY_LENGTH_MLA.format(arch=arch)}') leave no part without positions beside "
                                f"the {self.hp.n_rot} of the key part ('{R.DIMENSION_COUNT.format(arch=arch)}')")

    def layers(self) -> LayerNeeds:
        """KDA: the conv columns of q, k and v side by side, one d x d state per head; MLA: one latent row."""
        hp, d = self.hp, self.hp.kda_head_dim
        kda = Recurrent(3 * (hp.ssm_d_conv - 1) * self.d_inner, d * d * self.n_head)
        return tuple(kda if self.recurrent(il) else LatentAttention(hp.n_lora_kv + hp.n_rot)
                     for il in range(self.n_trunk))

    # ---- tensors ------------------------------------------------------------------------------------------

    def kda_tensors(self, il: int, qkv: list[TensorSpec], gates: list[TensorSpec]) -> list[TensorSpec]:
        """Layer il's KDA: the family's q, k, v and gate projections, each conv kernel [d_conv, 1, d_inner], beta's
        projection, A one per head, the decay's bias, the read-out's norm and W_o."""
        hp = self.hp
        E, H, d, Di, K = hp.n_embd, self.n_head, hp.kda_head_dim, self.d_inner, hp.ssm_d_conv
        return [*qkv, *(spec(conv, (K, 1, Di), il) for _, conv, _ in QKV), *gates, spec(T.SSM_BETA, (E, H), il),
                spec(T.SSM_A, (1, H), il, suffix=None),  # -exp(A_log), stored under a bare name
                spec(T.SSM_DT, (Di,), il, "bias", kind="vector"),
                spec(T.SSM_NORM, (d,), il, kind="vector"), spec(T.ATTN_OUT, (Di, hp.n_embd), il)]

    def split_qkv_tensors(self, il: int, optional: bool = False) -> list[TensorSpec]:
        """q, k and v apart, with their biases (loaded, never read)."""
        E, Di = self.hp.n_embd, self.d_inner
        return [*(spec(t, (E, Di), il, optional=optional) for t, _, _ in QKV),
                *(spec(t, (Di,), il, "bias", kind="vector", optional=True) for t, _, _ in QKV)]

    def latent_tensors(self, il: int) -> list[TensorSpec]:
        """The latent and key part's projection and norm, and the per-head absorption and decompression stacks."""
        hp = self.hp
        E, H, Rkv = hp.n_embd, self.n_head, hp.n_lora_kv
        return [spec(T.ATTN_KV_A_NORM, (Rkv,), il, kind="vector"), spec(T.ATTN_KV_A_MQA, (E, Rkv + hp.n_rot), il),
                spec(T.ATTN_K_B, (self.d_nope, Rkv, H), il), spec(T.ATTN_V_B, (Rkv, hp.n_embd_head_v_mla, H), il)]

    def missing_qkv(self, tensors: Mapping[str, TensorDecl]) -> list[str]:
        """Each KDA layer's q, k and v in one whole form: attn_qkv, else the three."""
        return [f"missing tensor '{tensor_name(t, il)}' (or '{tensor_name(T.ATTN_QKV, il)}')"
                for il in range(self.n_trunk) if self.recurrent(il) and tensor_name(T.ATTN_QKV, il) not in tensors
                for t, _, _ in QKV if tensor_name(t, il) not in tensors]

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

    def per_head_a(self, b: GraphBuilder, il: int) -> Node:
        return b.reshape(b.w(T.SSM_A, il, None), (1, self.n_head, 1), name="A.heads")

    def kda(self, b: GraphBuilder, h: Node, il: int, qkv: Callable[[], list[Node]], decay: Callable[[], Node],
            gate: Callable[[], Node]) -> Node:
        """Kimi Delta Attention over the ubatch's sequences ([E, n_tokens] in and out). The family's parts are
        built where llama.cpp builds them: the projections q, k and v [d_inner, n_tokens], the log-decay per key
        channel and the read-out's gate before its sigmoid (both [head_dim, n_head, n_tokens])."""
        hp = self.hp
        H, d, Di, K, Ts, Sq = self.n_head, hp.kda_head_dim, self.d_inner, hp.ssm_d_conv, b.n_seq_tokens, b.n_seqs
        assert Ts is not None
        saved = b.build_rs("r")
        convs = [self.short_conv(b, saved, x, conv, i, tag, il) for i, (x, (_, conv, tag)) in enumerate(zip(qkv(), QKV))]
        new_cols = [b.op("cont", last, name=f"{tag}_conv_state.cont") for (_, last), (_, _, tag) in zip(convs, QKV)]
        cols = b.op("concat", b.op("concat", new_cols[0], new_cols[1], dim=1, name="qk_conv_state.new"), new_cols[2],
                    dim=1, name="conv_state.new")
        b.store_rs("r", b.reshape(cols, (3 * (K - 1) * Di, Sq), name="conv_rows"))
        q, k, v = (y for y, _ in convs)

        g = b.reshape(decay(), (d, H, Ts, Sq), name="kda_g1.seqs")
        beta = b.reshape(b.mm(b.w(T.SSM_BETA, il), h, name="beta"), (1, H, Ts, Sq), name="kda_beta")
        beta = b.op("sigmoid", beta, name="beta_sigmoid")

        state = b.reshape(b.build_rs("s"), (d, d, H, Sq), name="state")
        q, k = self.l2_norm(b, q, "q_normed"), self.l2_norm(b, k, "k_normed")
        ys = b.op("gated_delta_net", q, k, v, g, beta, state, name="delta_net")
        y = b.op("view", ys, shape=(d, H, Ts, Sq), strides=(1, d, d * H, d * H * Ts), offset=0, name="attn_output")
        y = b.op("cont", y, name="attn_output.cont")
        ssm.store_states(b, ys, d * H * Ts * Sq, d * Di, name="new_state")

        g2 = gate()
        y = b.norm(b.reshape(y, (d, H, b.n_tokens), name="attn_output.heads"), T.SSM_NORM, il, name="kda_normed")
        y = b.op("mul", y, b.op("sigmoid", g2, name="g2_sigmoid"), name="kda_gated")
        y = b.reshape(b.op("cont", y, name="kda_gated.cont"), (Di, b.n_tokens), name="kda_gated.tokens")
        return b.mm(b.w(T.ATTN_OUT, il), y, name="kda_out")

    def latent_attention(self, b: GraphBuilder, h: Node, q: Node, pos: Node | None, il: int, rope: Rope | None, *,
                         wo: Node | None, wo_s: Node | None = None) -> Node:
        """Absorbed MLA of queries q [n_head * key_length_mla, n_tokens] over h's latent rows: each head's query
        without positions absorbed through attn_k_b, the key part and the queries' other part RoPE'd by ``rope``
        (None: as projected), one shared head over [latent | key part], each head's output decompressed through
        attn_v_b; then W_o where ``wo`` is given (else the heads' outputs)."""
        hp = self.hp
        H, Tn, Rkv, rot, dk, nope = self.n_head, b.n_tokens, hp.n_lora_kv, hp.n_rot, hp.n_embd_head_k_mla, self.d_nope
        q_nope = b.op("view", q, shape=(nope, H, Tn), strides=(1, dk, dk * H), offset=0, name="q_nope")
        q_pe = b.op("view", q, shape=(rot, H, Tn), strides=(1, dk, dk * H), offset=nope, name="q_pe")
        kv_pe = b.mm(b.w(T.ATTN_KV_A_MQA, il), h, name="kv_cmpr_pe")
        kv = b.op("view", kv_pe, shape=(Rkv, Tn), strides=(1, Rkv + rot), offset=0, name="kv_cmpr")
        k_pe = b.op("view", kv_pe, shape=(rot, 1, Tn), strides=(1, Rkv + rot, Rkv + rot), offset=Rkv, name="k_pe")
        if rope is not None:
            assert pos is not None
            q_pe, k_pe = rope(b, q_pe, pos, "q_pe.rope"), rope(b, k_pe, pos, "k_pe.rope")
        kv = b.norm(kv, T.ATTN_KV_A_NORM, il, name="kv_cmpr_norm")
        q_nope = b.op("permute", q_nope, axes=(0, 2, 1, 3), name="q_nope_perm")
        q_abs = b.op("mul_mat", b.w(T.ATTN_K_B, il), q_nope, name="q_nope_absorbed")
        q_abs = b.op("permute", q_abs, axes=(0, 2, 1, 3), name="q_nope_absorbed_perm")
        q = b.op("concat", q_abs, q_pe, dim=0, name="Qcur")
        latent = b.reshape(kv, (Rkv, 1, Tn), name="kv_cmpr_reshape")
        k = b.op("concat", latent, k_pe, dim=0, name="Kcur")
        return b.build_attn_mla(q, k, latent, wo=wo, v_mla=b.w(T.ATTN_V_B, il), kq_scale=inv_sqrt(dk), wo_s=wo_s)
