"""The state-space blocks several families share, after llama.cpp's mamba-base.cpp and its ``build_conv_state``.

A short causal convolution reads each sequence's last ``d_conv - 1`` input columns, kept in the layer's rolling
state ``r`` (:func:`conv_input`): Mamba, Mamba-2 (and Granite 4.0-H's Mamba-2 layers), Qwen3.5's DeltaNet and
LFM2's short convolutions all convolve so. A scan's value holds its outputs, then the final states, which go back
to the state ``s`` (:func:`store_states`). The Mamba and Mamba-2 mixers themselves (:func:`mamba_layer`, :func:`mamba2_layer`) are
shared by the Mamba family and the Granite hybrids. Reference: Gu & Dao 2023, "Mamba"; Dao & Gu 2024,
"Transformers are SSMs" (Mamba-2).
"""

from __future__ import annotations

from typing import Callable

from gguf import MODEL_TENSOR as T
from gguf import Keys

from graphir.errors import MetadataError
from graphir.graph.dims import Dim
from graphir.graph.ir import Node
from graphir.memory.layers import Attention, LayerNeeds, Recurrent
from graphir.model.builder import GraphBuilder
from graphir.model.hparams import HParams, Key
from graphir.model.tensors import TensorSpec, scales, spec, tensor_name

# The sizes of a Mamba block, as llama.cpp's loader reads them for every state-space family
SSM_KEYS = (Key("ssm_d_conv", Keys.SSM.CONV_KERNEL, int, required=True, minimum=1),  # conv kernel width
            Key("ssm_d_inner", Keys.SSM.INNER_SIZE, int, required=True, minimum=1),
            Key("ssm_d_state", Keys.SSM.STATE_SIZE, int, required=True, minimum=1),
            Key("ssm_dt_rank", Keys.SSM.TIME_STEP_RANK, int, required=True, minimum=1))  # Mamba-2: heads
MAMBA_KEYS = SSM_KEYS + (Key("ssm_dt_b_c_rms", Keys.SSM.DT_B_C_RMS, bool, False),)  # Falcon-Mamba's norms
MAMBA2_KEYS = SSM_KEYS + (Key("ssm_n_group", Keys.SSM.GROUP_COUNT, int, required=True, minimum=1),)


# ---- the convolution and the scan's states, for every state-space family ------------------------------------


def recurrent_state(hp: HParams, channels: int) -> Recurrent:
    """Per sequence: the last d_conv - 1 columns of the conv's ``channels``, and d_state per inner channel (Mamba's
    states; DeltaNet's d_state x d_state matrix per value head is as many)."""
    return Recurrent((hp.ssm_d_conv - 1) * channels, hp.ssm_d_state * hp.ssm_d_inner)


def state_or_attention(hp: HParams, channels: int, recurrent: Callable[[int], bool], n_layer: int) -> LayerNeeds:
    """The needs of a hybrid's first ``n_layer`` layers: a :func:`recurrent_state` of ``channels`` where
    ``recurrent(il)``, else self-attention at the layer's K/V widths."""
    return tuple(recurrent_state(hp, channels) if recurrent(il) else Attention(hp.n_embd_k_gqa_at(il),
                                                                               hp.n_embd_v_gqa_at(il))
                 for il in range(n_layer))


def conv_input(b: GraphBuilder, x: Node, *, name: str, transposed: str) -> Node:
    """x [channels, n_seq_tokens, n_seqs] behind each sequence's saved columns: the conv's input
    [d_conv - 1 + n_seq_tokens, channels, n_seqs]. Its last d_conv - 1 columns become the new state
    (``transposed``: the name of x's transpose). How many columns are saved is the layer's rolling state's width
    over the channels, as the family stated it (Mamba's ``ssm_d_conv`` - 1, LFM2's ``shortconv.l_cache`` - 1)."""
    Ts, S = b.n_seq_tokens, b.n_seqs
    assert Ts is not None
    channels = x.shape[0]
    saved = b.build_rs("r")
    K = int(saved.shape[0]) // channels + 1
    conv = b.reshape(saved, (K - 1, channels, S), name="conv_state")
    conv_x = b.op("concat", conv, b.op("transpose", x, name=transposed), dim=0, name=name)
    last = b.op("view", conv_x, shape=(K - 1, channels, S), strides=(1, K - 1 + Ts, (K - 1 + Ts) * channels),
                offset=Ts, name="conv_state.new")
    b.store_rs("r", b.reshape(b.op("cont", last, name="conv_state.cont"), ((K - 1) * channels, S), name="conv_rows"))
    return conv_x


def store_states(b: GraphBuilder, value: Node, n_out: Dim, n_embd_s: int, *, name: str) -> None:
    """Write back the final states a recurrent op's value holds after its ``n_out`` outputs, ``n_embd_s`` per
    sequence (ggml's layout of ssm_scan, gated_delta_net and rwkv_wkv6)."""
    b.store_rs("s", b.op("view", value, shape=(n_embd_s, b.n_seqs), strides=(1, n_embd_s), offset=n_out, name=name))


# ---- Mamba -------------------------------------------------------------------------------------------------


def mamba_tensors(hp: HParams, il: int, dt_b_c_norms: bool = False) -> list[TensorSpec]:
    """Layer il's selective SSM block; ``dt_b_c_norms``: with the RMS norms' weights of dt, B and C (Jamba's)."""
    E, Di, Ds, R, K = hp.n_embd, hp.ssm_d_inner, hp.ssm_d_state, hp.ssm_dt_rank, hp.ssm_d_conv
    norms = [spec(t, (n,), il, kind="vector") for t, n in ((T.SSM_DT_NORM, R), (T.SSM_B_NORM, Ds), (T.SSM_C_NORM, Ds))]
    return [*(norms if dt_b_c_norms else ()),
        spec(T.SSM_IN, (E, 2 * Di), il),
        spec(T.SSM_CONV1D, (K, Di), il),
        spec(T.SSM_CONV1D, (Di,), il, "bias", kind="vector"),
        spec(T.SSM_X, (Di, R + 2 * Ds), il),
        spec(T.SSM_DT, (R, Di), il),
        spec(T.SSM_DT, (Di,), il, "bias", kind="vector"),
        spec(T.SSM_A, (Ds, Di), il, suffix=None),  # already -exp(A_log), stored under a bare name
        spec(T.SSM_D, (Di,), il, suffix=None, kind="vector"),
        spec(T.SSM_OUT, (Di, E), il),
        *scales(T.SSM_IN, il), *scales(T.SSM_OUT, il),
    ]


def mamba_layer(b: GraphBuilder, x: Node, il: int) -> Node:
    """The selective SSM block (llama.cpp's ``build_mamba_layer``): [E, n_tokens] in, [E, n_seq_tokens, n_seqs] out."""
    hp = b.hp
    Di, Ds, R = hp.ssm_d_inner, hp.ssm_d_state, hp.ssm_dt_rank
    Ts, S = b.n_seq_tokens, b.n_seqs
    assert Ts is not None
    x = b.reshape(x, (hp.n_embd, Ts, S), name="attn_norm.seqs")
    xz = b.mm(b.w(T.SSM_IN, il), x, b.scale(T.SSM_IN, il), name="ssm_in")  # [2*Di, Ts, S]
    xs = b.op("view", xz, shape=(Di, Ts, S), strides=(1, 2 * Di, 2 * Di * Ts), offset=0, name="ssm_x_in")
    z = b.op("view", xz, shape=(Di, Ts, S), strides=(1, 2 * Di, 2 * Di * Ts), offset=Di, name="ssm_z")

    conv_x = conv_input(b, xs, name="conv_x", transposed="ssm_x_in.t")
    xs = b.op("ssm_conv", conv_x, b.w(T.SSM_CONV1D, il), name="ssm_conv")
    xs = b.op("silu", b.op("add", xs, b.w(T.SSM_CONV1D, il, "bias"), name="ssm_conv.b"), name="ssm_conv.act")

    dbc = b.op("mul_mat", b.w(T.SSM_X, il), xs, name="ssm_dbc")  # [R + 2*Ds, Ts, S]
    row = R + 2 * Ds
    norms = (T.SSM_DT_NORM, T.SSM_B_NORM, T.SSM_C_NORM)
    weighted = all(tensor_name(t, il) in b.tensors for t in norms)  # Jamba's norms of dt, B and C
    dt = b.op("view", dbc, shape=(R, Ts, S), strides=(1, row, row * Ts), offset=0, name="ssm_dt_in")
    # B and C normalised with weights are viewed as llama.cpp does, in one group ([Ds, 1, Ts, S])
    group, group_stride = ((1,), (Ds,)) if weighted else ((), ())
    B, C = (b.op("view", dbc, shape=(Ds, *group, Ts, S), strides=(1, *group_stride, row, row * Ts), offset=off,
                 name=tag) for tag, off in (("ssm_B", R), ("ssm_C", R + Ds)))
    if weighted:
        dt, B, C = (b.norm(v, t, il, name=f"{tag}_norm") for v, t, tag in zip((dt, B, C), norms,
                                                                              ("ssm_dt_in", "ssm_B", "ssm_C")))
        B, C = (b.reshape(v, (Ds, Ts, S), name=f"{tag}_norm.tokens") for v, tag in ((B, "ssm_B"), (C, "ssm_C")))
    elif hp.ssm_dt_b_c_rms:  # Falcon-Mamba: dt, B and C RMS-normalised, without a scale
        dt, B, C = (b.op("rms_norm", t, eps=hp.norm_rms_eps, name=f"{tag}_norm")
                    for t, tag in ((dt, "ssm_dt_in"), (B, "ssm_B"), (C, "ssm_C")))
    dt = b.linear(dt, b.w(T.SSM_DT, il), b.w(T.SSM_DT, il, "bias"), name="ssm_dt")

    state = b.reshape(b.build_rs("s"), (Ds, Di, S), name="ssm_state")
    ys = b.op("ssm_scan", state, xs, dt, b.w(T.SSM_A, il, None), B, C, name="ssm_scan")
    y = b.op("view", ys, shape=(Di, Ts, S), strides=(1, Di, Di * Ts), offset=0, name="ssm_y")
    store_states(b, ys, Di * Ts * S, Ds * Di, name="ssm_state.new")

    y = b.op("add", y, b.op("mul", xs, b.w(T.SSM_D, il, None), name="ssm_skip"), name="ssm_y.skip")
    y = b.op("swiglu", b.op("cont", z, name="ssm_z.cont"), y, name="ssm_gated")
    return b.mm(b.w(T.SSM_OUT, il), y, b.scale(T.SSM_OUT, il), name="ssm_out")


# ---- Mamba-2 -----------------------------------------------------------------------------------------------


def check_mamba2(hp: HParams) -> None:
    """Mamba-2's heads split the inner size and fall into equal groups sharing B and C."""
    heads, inner, groups = hp.ssm_dt_rank, hp.ssm_d_inner, hp.ssm_n_group
    if inner % heads or heads % groups:
        raise MetadataError(f"{heads} SSM heads ('{Keys.SSM.TIME_STEP_RANK.format(arch=hp.arch)}') must split the "
                            f"inner size {inner} and fall into {groups} equal groups "
                            f"('{Keys.SSM.GROUP_COUNT.format(arch=hp.arch)}')")


def mamba2_conv_dim(hp: HParams) -> int:
    """Channels through Mamba-2's conv: x, then B and C of every group."""
    return hp.ssm_d_inner + 2 * hp.ssm_n_group * hp.ssm_d_state


def mamba2_tensors(hp: HParams, il: int, norm_optional: bool = False) -> list[TensorSpec]:
    """Layer il's Mamba-2 block. Granite's loader takes the conv bias as optional, but llama.cpp's graph adds it
    unconditionally (a file without it crashes there): it is required here. The grouped norm is optional where a
    family's loader takes it so (``norm_optional``: Falcon-H1); the block then leaves it out."""
    E, Di, H, G, K, cd = hp.n_embd, hp.ssm_d_inner, hp.ssm_dt_rank, hp.ssm_n_group, hp.ssm_d_conv, mamba2_conv_dim(hp)
    return [
        spec(T.SSM_IN, (E, Di + cd + H), il),  # z, x B C, dt
        spec(T.SSM_CONV1D, (K, cd), il),
        spec(T.SSM_CONV1D, (cd,), il, "bias", kind="vector"),
        spec(T.SSM_DT, (H,), il, "bias", kind="vector"),
        spec(T.SSM_A, (1, H), il, suffix=None),  # -exp(A_log), one per head
        spec(T.SSM_D, (1, H), il, suffix=None),
        spec(T.SSM_NORM, (Di // G, G), il, optional=norm_optional),
        spec(T.SSM_OUT, (Di, E), il),
        *scales(T.SSM_IN, il), *scales(T.SSM_OUT, il),
    ]


def mamba2_layer(b: GraphBuilder, x: Node, il: int) -> Node:
    """The Mamba-2 block (llama.cpp's ``build_mamba2_layer``): [E, n_tokens] in, same out."""
    hp = b.hp
    Di, Ds, H, G = hp.ssm_d_inner, hp.ssm_d_state, hp.ssm_dt_rank, hp.ssm_n_group
    cd = mamba2_conv_dim(hp)
    P, Ts, S = Di // H, b.n_seq_tokens, b.n_seqs
    assert Ts is not None
    x = b.reshape(x, (hp.n_embd, Ts, S), name="attn_norm.seqs")
    zxbcdt = b.mm(b.w(T.SSM_IN, il), x, b.scale(T.SSM_IN, il), name="ssm_in")  # [Di + cd + H, Ts, S]
    row = Di + cd + H
    z = b.op("view", zxbcdt, shape=(P, H, Ts, S), strides=(1, P, row, row * Ts), offset=0, name="ssm_z")
    xbc = b.op("view", zxbcdt, shape=(cd, Ts, S), strides=(1, row, row * Ts), offset=Di, name="ssm_xbc")
    dt = b.op("view", zxbcdt, shape=(H, Ts, S), strides=(1, row, row * Ts), offset=Di + cd, name="ssm_dt_in")

    conv_x = conv_input(b, xbc, name="conv_x", transposed="ssm_xbc.t")
    xbc = b.op("ssm_conv", conv_x, b.w(T.SSM_CONV1D, il), name="ssm_conv")
    xbc = b.op("silu", b.op("add", xbc, b.w(T.SSM_CONV1D, il, "bias"), name="ssm_conv.b"), name="ssm_conv.act")

    xs = b.op("view", xbc, shape=(P, H, Ts, S), strides=(1, P, cd, cd * Ts), offset=0, name="ssm_x")
    B, C = (b.op("view", xbc, shape=(Ds, G, Ts, S), strides=(1, Ds, cd, cd * Ts), offset=off, name=tag)
            for tag, off in (("ssm_B", Di), ("ssm_C", Di + G * Ds)))
    dt = b.op("add", b.op("cont", dt, name="ssm_dt.cont"), b.w(T.SSM_DT, il, "bias"), name="ssm_dt")

    state = b.reshape(b.build_rs("s"), (Ds, P, H, S), name="ssm_state")
    ys = b.op("ssm_scan_heads", state, xs, dt, b.w(T.SSM_A, il, None), B, C, name="ssm_scan")
    y = b.op("view", ys, shape=(P, H, Ts, S), strides=(1, P, Di, Di * Ts), offset=0, name="ssm_y")
    store_states(b, ys, Di * Ts * S, Ds * Di, name="ssm_state.new")

    y = b.op("add", y, b.op("mul", xs, b.w(T.SSM_D, il, None), name="ssm_skip"), name="ssm_y.skip")
    y = b.op("swiglu", b.op("cont", z, name="ssm_z.cont"), y, name="ssm_gated")
    if tensor_name(T.SSM_NORM, il) in b.tensors:  # Falcon-H1's may be absent
        y = b.norm(b.reshape(y, (Di // G, G, Ts, S), name="ssm_gated.groups"), T.SSM_NORM, il, name="ssm_norm")
    return b.mm(b.w(T.SSM_OUT, il), b.reshape(y, (Di, b.n_tokens), name="ssm_norm.tokens"),
                b.scale(T.SSM_OUT, il), name="ssm_out")
