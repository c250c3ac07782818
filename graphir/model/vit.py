"""The vision transformer most towers share, as llama.cpp's clip graph builds it (tools/mtmd/clip.cpp:
``build_inp``, ``build_vit``, ``build_attn``, ``build_ffn``, ``build_patch_merge_permute``).

An image [W, H, 3] becomes one row per patch by the patch embedding (a convolution whose stride is its kernel,
as ggml does it: im2col, then a product with the kernel), plus learned positions; pre-norm layers of
bidirectional attention and an FFN follow, each block's input re-added after it. What the SigLIP towers hold is here;
clip's other options (fused QKV, Q/K norms, layer scales, gated FFNs, a norm before the layers) come with the
towers that use them.
"""

from __future__ import annotations

from gguf import MODEL_TENSOR as T

from graphir.graph.ir import Node
from graphir.model.builder import Act, GraphBuilder, Norm
from graphir.model.hparams import HParams
from graphir.model.tensors import TensorSpec, spec, with_bias

CHANNELS = 3  # an image's red, green and blue planes
_ACTS = {"gelu": Act.GELU, "silu": Act.SILU, "gelu_quick": Act.GELU_QUICK}


def patches_per_side(hp: HParams) -> int:
    return hp.image_size // hp.patch_size


def vit_tensors(hp: HParams, positions: int) -> list[TensorSpec]:
    """The patch embedding (a kernel [P, P, 3, E] and its bias), ``positions`` learned position rows, the final
    LayerNorm, and each layer's: LayerNorms before attention and FFN, Q, K and V apart, the output projection and
    the FFN's up and down, each with its bias where the file has one (llama.cpp's loader takes them all as
    optional; the graph needs the matrices)."""
    E, F, P = hp.n_embd, hp.n_ff, hp.patch_size
    E_q, E_kv = hp.n_embd_head_k * hp.n_head, hp.n_embd_head_k * hp.n_head_kv
    out = [spec(T.V_ENC_EMBD_PATCH, (P, P, CHANNELS, E)),
           spec(T.V_ENC_EMBD_PATCH, (E,), suffix="bias", kind="vector", optional=True),
           spec(T.V_ENC_EMBD_POS, (E, positions)), *with_bias(T.V_POST_NORM, (E,), optional=True)]
    for il in range(hp.n_layer):
        out += [*with_bias(T.V_ENC_INPUT_NORM, (E,), il, optional=True),
                *with_bias(T.V_ENC_ATTN_Q, (E, E_q), il, bias_optional=True),
                *with_bias(T.V_ENC_ATTN_K, (E, E_kv), il, bias_optional=True),
                *with_bias(T.V_ENC_ATTN_V, (E, E_kv), il, bias_optional=True),
                *with_bias(T.V_ENC_ATTN_O, (E_q, E), il, bias_optional=True),
                *with_bias(T.V_ENC_POST_ATTN_NORM, (E,), il, optional=True),
                *with_bias(T.V_ENC_FFN_UP, (E, F), il, bias_optional=True),
                *with_bias(T.V_ENC_FFN_DOWN, (F, E), il, bias_optional=True)]
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
    """clip's build_vit over the patch rows x [E, n]: the learned positions added, every layer, then the final norm
    where the file has one."""
    hp = b.hp
    x = b.op("add", x, b.w(T.V_ENC_EMBD_POS), name="pos_embed")
    act = _ACTS[hp.ffn_act]
    for il in range(hp.n_layer):
        with b.layer(il):
            h = _norm(b, x, T.V_ENC_INPUT_NORM, il, norm, "layer_inp_normed")
            x = b.op("add", _attention(b, h, il), x, name="ffn_inp")
            h = _norm(b, x, T.V_ENC_POST_ATTN_NORM, il, norm, "ffn_inp_normed")
            f = b.build_ffn(h, up=b.w(T.V_ENC_FFN_UP, il), up_b=b.w_opt(T.V_ENC_FFN_UP, il, "bias"), gate=None,
                            down=b.w(T.V_ENC_FFN_DOWN, il), down_b=b.w_opt(T.V_ENC_FFN_DOWN, il, "bias"), act=act)
            x = b.op("add", x, f, name="layer_out")
    return _norm(b, x, T.V_POST_NORM, None, norm, "post_ln")


def _norm(b: GraphBuilder, x: Node, t: T, il: int | None, kind: Norm, name: str) -> Node:
    """x through norm t with its weight and bias, each where the file has them (clip normalises a layer's input
    whatever it loaded; after the layers only where the file has the norm's weight)."""
    w, bias = b.w_opt(t, il), b.w_opt(t, il, "bias")
    if il is None and w is None:
        return x
    return b.build_norm(x, w, bias, kind, name=name)


def _attention(b: GraphBuilder, x: Node, il: int) -> Node:
    """Every patch attends to every patch: Q, K and V (each with its bias where given), softmax(K^T Q / sqrt(d)) V
    per head, and the output projection."""
    hp = b.hp
    d, n = hp.n_embd_head_k, x.shape[1]
    projections = ((T.V_ENC_ATTN_Q, "Qcur", hp.n_head), (T.V_ENC_ATTN_K, "Kcur", hp.n_head_kv),
                   (T.V_ENC_ATTN_V, "Vcur", hp.n_head_kv))
    flat = [b.linear(x, b.w(t, il), b.w_opt(t, il, "bias"), name=tag) for t, tag, _ in projections]
    q, k, v = (b.reshape(y, (d, heads, n), name=f"{tag}.heads") for y, (_, tag, heads) in zip(flat, projections))
    out = b.attn_mha(q, k, v, None, b.kq_scale())
    return b.linear(out, b.w(T.V_ENC_ATTN_O, il), b.w_opt(T.V_ENC_ATTN_O, il, "bias"), name="attn_out")
