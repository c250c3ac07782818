"""The vision transformer most towers share, as llama.cpp's clip graph builds it (tools/mtmd/clip.cpp:
``build_inp``, ``build_vit``, ``build_attn``, ``build_ffn``, ``build_patch_merge_permute``).

An image [W, H, 3] becomes one row per patch by the patch embedding (a convolution whose stride is its kernel,
as ggml does it: im2col, then a product with the kernel), plus learned positions; pre-norm layers of
bidirectional attention and an FFN follow, each block's input re-added after it. The tensors a tower file may hold
for it are declared here, by llama.cpp's loader's rules (most of them optional).
"""

from __future__ import annotations

from gguf import MODEL_TENSOR as T

from graphir.graph.ir import Node
from graphir.model.builder import Act, Gate, GraphBuilder, Norm
from graphir.model.hparams import HParams
from graphir.model.tensors import TensorSpec, spec, with_bias

CHANNELS = 3  # an image's red, green and blue planes
_ACTS = {"gelu": Act.GELU, "silu": Act.SILU, "gelu_quick": Act.GELU_QUICK}


def patches_per_side(hp: HParams) -> int:
    return hp.image_size // hp.patch_size


def vit_tensors(hp: HParams, positions: int) -> list[TensorSpec]:
    """The patch embedding (a kernel [P, P, 3, E] and its bias), ``positions`` learned position rows, the optional
    norms before and after the layers, and each layer's: LayerNorms before attention and FFN, Q, K and V apart or
    fused (each with its bias where the file has one), Q and K norms and layer scales where it has them, the output
    projection, and the FFN's up, optional gate, and down, with their biases where given."""
    E, F, P = hp.n_embd, hp.n_ff, hp.patch_size
    E_kv = hp.n_embd_head_k * hp.n_head_kv
    E_q = hp.n_embd_head_k * hp.n_head
    out = [spec(T.V_ENC_EMBD_PATCH, (P, P, CHANNELS, E)), spec(T.V_ENC_EMBD_PATCH, (E,), suffix="bias",
                                                               kind="vector", optional=True),
           spec(T.V_ENC_EMBD_POS, (E, positions)),
           *with_bias(T.V_PRE_NORM, (E,), optional=True), *with_bias(T.V_POST_NORM, (E,), optional=True)]
    for il in range(hp.n_layer):
        out += [
            *with_bias(T.V_ENC_INPUT_NORM, (E,), il, optional=True),
            *with_bias(T.V_ENC_ATTN_QKV, (E, E_q + 2 * E_kv), il, optional=True),
            *with_bias(T.V_ENC_ATTN_Q, (E, E_q), il, optional=True),
            *with_bias(T.V_ENC_ATTN_K, (E, E_kv), il, optional=True),
            *with_bias(T.V_ENC_ATTN_V, (E, E_kv), il, optional=True),
            spec(T.V_ENC_ATTN_Q_NORM, (hp.n_embd_head_k,), il, kind="vector", optional=True, also=(E_q,)),
            spec(T.V_ENC_ATTN_K_NORM, (hp.n_embd_head_k,), il, kind="vector", optional=True, also=(E_kv,)),
            *with_bias(T.V_ENC_ATTN_O, (E_q, E), il, bias_optional=True),
            spec(T.V_LAYER_SCALE_1, (E,), il, kind="vector", optional=True),
            *with_bias(T.V_ENC_POST_ATTN_NORM, (E,), il, optional=True),
            *with_bias(T.V_ENC_FFN_UP, (E, F), il, bias_optional=True),
            *with_bias(T.V_ENC_FFN_GATE, (E, F), il, optional=True),
            *with_bias(T.V_ENC_FFN_DOWN, (F, E), il, bias_optional=True),
            spec(T.V_LAYER_SCALE_2, (E,), il, kind="vector", optional=True),
        ]
    return out


def build_inp(b: GraphBuilder) -> Node:
    """The image's patches as rows [E, n_patches] (clip's build_inp): ggml_conv_2d's im2col (its values rounded to
    f16, f32 for a bf16 kernel only), times the kernel; the patches in the image's row order; plus the kernel's bias
    where the file has one."""
    hp = b.hp
    S, P, E = hp.image_size, hp.patch_size, hp.n_embd
    n = patches_per_side(hp) ** 2
    image = b.input("inp_raw", "f32", (S, S, CHANNELS))
    kernel = b.w(T.V_ENC_EMBD_PATCH)
    cols = b.op("im2col", image, kw=P, kh=P, s0=P, s1=P, p0=0, p1=0, d0=1, d1=1,
                type="f32" if kernel.dtype == "bf16" else "f16", name="inp_patches")
    conv = b.op("mul_mat", b.reshape(cols, (CHANNELS * P * P, n), name="inp_patches.rows"),
                b.reshape(kernel, (P * P * CHANNELS, E), name="patch_embd.rows"), name="inp_conv")
    x = b.op("cont", b.op("transpose", conv, name="inp_conv.t"), name="inp_patch_rows")
    bias = b.w_opt(T.V_ENC_EMBD_PATCH, suffix="bias")
    return x if bias is None else b.op("add", x, bias, name="patch_bias")


def build_vit(b: GraphBuilder, x: Node, norm: Norm = Norm.LAYER) -> Node:
    """clip's build_vit over the patch rows x [E, n]: the learned positions added, the pre-norm where the file has
    one, every layer, then the post-norm where it has one."""
    hp = b.hp
    x = b.op("add", x, b.w(T.V_ENC_EMBD_POS), name="pos_embed")
    x = _norm(b, x, T.V_PRE_NORM, None, norm, "pre_ln")
    act = _ACTS[hp.ffn_act]
    for il in range(hp.n_layer):
        with b.layer(il):
            h = _norm(b, x, T.V_ENC_INPUT_NORM, il, norm, "layer_inp_normed")
            a = _attention(b, h, il, norm)
            a = _scaled(b, a, T.V_LAYER_SCALE_1, il, "attn_out_scaled")
            x = b.op("add", a, x, name="ffn_inp")
            h = _norm(b, x, T.V_ENC_POST_ATTN_NORM, il, norm, "ffn_inp_normed")
            f = b.build_ffn(h, up=b.w(T.V_ENC_FFN_UP, il), up_b=b.w_opt(T.V_ENC_FFN_UP, il, "bias"),
                            gate=b.w_opt(T.V_ENC_FFN_GATE, il), gate_b=b.w_opt(T.V_ENC_FFN_GATE, il, "bias"),
                            down=b.w(T.V_ENC_FFN_DOWN, il), down_b=b.w_opt(T.V_ENC_FFN_DOWN, il, "bias"),
                            act=act, gate_mode=Gate.PAR)
            f = _scaled(b, f, T.V_LAYER_SCALE_2, il, "ffn_out_scaled")
            x = b.op("add", x, f, name="layer_out")
    return _norm(b, x, T.V_POST_NORM, None, norm, "post_ln")


def _norm(b: GraphBuilder, x: Node, t: T, il: int | None, kind: Norm, name: str) -> Node:
    """x through norm t with its weight and bias, each where the file has them (clip normalises a layer's input
    whatever it loaded; the norms before and after the layers only where the file has their weight)."""
    w, bias = b.w_opt(t, il), b.w_opt(t, il, "bias")
    if il is None and w is None:
        return x
    return b.build_norm(x, w, bias, kind, name=name)


def _scaled(b: GraphBuilder, x: Node, t: T, il: int, name: str) -> Node:
    s = b.w_opt(t, il)
    return x if s is None else b.op("mul", x, s, name=name)


def _attention(b: GraphBuilder, x: Node, il: int, norm: Norm) -> Node:
    """Every patch attends to every patch: Q, K and V (fused or apart, each with its bias where given), Q's and K's
    norms where the file has them (over the whole projection, or per head where the norm is a head wide), then
    softmax(K^T Q / sqrt(d)) V per head and the output projection."""
    hp = b.hp
    d, n = hp.n_embd_head_k, x.shape[1]
    qkv = b.w_opt(T.V_ENC_ATTN_QKV, il)
    if qkv is not None:
        fused = b.linear(x, qkv, b.w_opt(T.V_ENC_ATTN_QKV, il, "bias"), name="qkv")
        E_q, E_kv = d * hp.n_head, d * hp.n_head_kv
        q, k, v = (b.op("view", fused, shape=(d, heads, n), strides=(1, d, fused.shape[0]), offset=off, name=tag)
                   for tag, heads, off in (("Qcur", hp.n_head, 0), ("Kcur", hp.n_head_kv, E_q),
                                           ("Vcur", hp.n_head_kv, E_q + E_kv)))
        q, k = _qk_norm(b, q, T.V_ENC_ATTN_Q_NORM, il, norm, "Qcur_norm"), \
            _qk_norm(b, k, T.V_ENC_ATTN_K_NORM, il, norm, "Kcur_norm")
    else:
        q, k, v = (b.linear(x, b.w(t, il), b.w_opt(t, il, "bias"), name=tag)
                   for t, tag in ((T.V_ENC_ATTN_Q, "Qcur"), (T.V_ENC_ATTN_K, "Kcur"), (T.V_ENC_ATTN_V, "Vcur")))
        per_head = _norm_width(b, T.V_ENC_ATTN_Q_NORM, il) == d
        if not per_head:
            q, k = _qk_norm(b, q, T.V_ENC_ATTN_Q_NORM, il, norm, "Qcur_norm"), \
                _qk_norm(b, k, T.V_ENC_ATTN_K_NORM, il, norm, "Kcur_norm")
        q = b.reshape(q, (d, hp.n_head, n), name="Qcur.heads")
        k = b.reshape(k, (d, hp.n_head_kv, n), name="Kcur.heads")
        v = b.reshape(v, (d, hp.n_head_kv, n), name="Vcur.heads")
        if per_head:
            q, k = _qk_norm(b, q, T.V_ENC_ATTN_Q_NORM, il, norm, "Qcur_norm_per_head"), \
                _qk_norm(b, k, T.V_ENC_ATTN_K_NORM, il, norm, "Kcur_norm_per_head")
    out = b.attn_mha(q, k, v, None, b.kq_scale())
    return b.linear(out, b.w(T.V_ENC_ATTN_O, il), b.w_opt(T.V_ENC_ATTN_O, il, "bias"), name="attn_out")


def _norm_width(b: GraphBuilder, t: T, il: int) -> int | None:
    w = b.w_opt(t, il)
    return None if w is None else w.shape[0]


def _qk_norm(b: GraphBuilder, x: Node, t: T, il: int, norm: Norm, name: str) -> Node:
    w = b.w_opt(t, il)
    return x if w is None else b.build_norm(x, w, None, norm, name=name)
