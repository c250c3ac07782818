"""The vision transformer most towers share, as llama.cpp's clip graph builds it (tools/mtmd/clip.cpp:
``build_inp``, ``build_vit``, ``build_attn``, ``build_ffn``, ``build_patch_merge_permute``).

An image [W, H, 3] becomes one row per patch by the patch embedding (a convolution whose stride is its kernel,
as ggml does it: im2col, then a product with the kernel), plus learned positions; pre-norm layers of
bidirectional attention and an FFN follow, each block's input re-added after it. What the SigLIP towers hold is here,
and what CLIP's towers add (:class:`Options`: a class embedding, a norm before the layers, a stack cut short at the
layer the projector reads); clip's other options (fused QKV, Q/K norms, layer scales, gated FFNs) come with the
towers that use them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
from gguf import MODEL_TENSOR as T

from graphir.graph.floats import f32
from graphir.graph.ir import Node
from graphir.model.builder import Act, GraphBuilder, Norm
from graphir.model.hparams import HParams
from graphir.model.tensors import TensorSpec, spec, with_bias

CHANNELS = 3  # an image's red, green and blue planes
_ACTS = {"gelu": Act.GELU, "silu": Act.SILU, "gelu_quick": Act.GELU_QUICK, "gelu_erf": Act.GELU_ERF}
# The encoder's tensors in an audio tower's file: a.* for a vision tower's v.* (clip.cpp names them by the
# modality's prefix), each role as the ViT's
AUDIO_TENSORS = ((T.V_ENC_EMBD_POS, T.A_ENC_EMBD_POS), (T.V_PRE_NORM, T.A_PRE_NORM), (T.V_POST_NORM, T.A_POST_NORM),
                 (T.V_ENC_INPUT_NORM, T.A_ENC_INPUT_NORM), (T.V_ENC_ATTN_Q, T.A_ENC_ATTN_Q),
                 (T.V_ENC_ATTN_K, T.A_ENC_ATTN_K), (T.V_ENC_ATTN_V, T.A_ENC_ATTN_V), (T.V_ENC_ATTN_O, T.A_ENC_OUTPUT),
                 (T.V_ENC_POST_ATTN_NORM, T.A_ENC_OUTPUT_NORM), (T.V_ENC_FFN_UP, T.A_ENC_FFN_UP),
                 (T.V_ENC_FFN_DOWN, T.A_ENC_FFN_DOWN))


@dataclass(frozen=True)
class Options:
    """What a tower's encoder runs beyond SigLIP's (the defaults), as data. ``class_row``: the class embedding
    (``v.class_embd``) joined after the patch rows, as clip's llava graph joins it, the positions spanning one row
    more; ``pre_norm``: a LayerNorm before the layers (``v.pre_ln``, where the file has it); ``depth``: how many
    layers run (None: all; the rest are in the file but unused); ``features``: layers whose input is kept (the
    stack's input being layer 0's, its output the number ``depth``), the kept rows joined width-wise as the output
    (llama.cpp's embedding stack; none kept: the output is the stack's); ``ffn_either_way``: the file may name the
    FFN's up and down the other way round (old converters' fc1 and fc2 names), the graph taking them by shape as
    llama.cpp's loader swaps them; ``tensors``: the file's own tensor for each of the ViT's roles it names otherwise
    (an audio tower's, AUDIO_TENSORS); ``pool``: after the layers, before the final norm, each ``pool`` rows averaged
    into one (clip's audio average pool, ggml_pool_1d: Voxtral's; 0: none); ``rope_theta``: no learned positions, Q
    and K turned by 2D RoPE of this base instead (clip's build_rope_2d: each head's first half by the patch's row,
    its second by its column at the odd frequencies; inputs pos_h and pos_w; 0: learned positions);
    ``gated_ffn``: the FFN's activation of a gate (``ffn_gate``) times its up (clip's SwiGLU); ``mrope``: the RoPE
    of rope_theta is M-RoPE in ggml's vision mode instead (Qwen2-VL's: each head in four sections of d/4 pairs,
    the first two turned by the patch's row and column, pairs d/2 apart; input ``positions``, four a patch);
    ``window_pattern``: every layer but each window_pattern-th attends within windows only (input ``window_mask``,
    Qwen2.5-VL's window attention; 0: every layer attends to all patches); ``fused_qkv``: Q, K and V from one
    product by ``attn_qkv`` and its bias, three strided views of it (Qwen3-VL's); ``taps``: layers whose outputs
    build_vit also hands back (Qwen3-VL's deepstack)."""

    class_row: bool = False
    pre_norm: bool = False
    depth: int | None = None
    features: tuple[int, ...] = ()
    ffn_either_way: bool = False
    tensors: tuple[tuple[T, T], ...] = ()
    pool: int = 0
    rope_theta: float = 0.0
    gated_ffn: bool = False
    mrope: bool = False
    window_pattern: int = 0
    fused_qkv: bool = False
    taps: tuple[int, ...] = ()

    def role(self, t: T) -> T:
        """The file's tensor for the ViT's role t."""
        return dict(self.tensors).get(t, t)

    def kept(self, n_layer: int) -> list[int]:
        """The layers whose input the output joins, in order (each once)."""
        depth = n_layer if self.depth is None else self.depth
        return sorted({f for f in self.features if 0 <= f <= depth})


def patches_per_side(hp: HParams) -> int:
    return hp.image_size // hp.patch_size


def patch_grid(b: GraphBuilder) -> tuple[int, int]:
    """The patches across and down the image the graph is built for (the tower's ``frame``)."""
    width, height = b.arch.frame
    return width // b.hp.patch_size, height // b.hp.patch_size


def vit_tensors(hp: HParams, positions: int, opts: Options = Options()) -> list[TensorSpec]:
    """The patch embedding (a kernel [P, P, 3, E] and its bias), ``positions`` learned position rows, the final
    LayerNorm, and each layer's: LayerNorms before attention and FFN, Q, K and V apart, the output projection and
    the FFN's up and down, each with its bias where the file has one (llama.cpp's loader takes them all as
    optional; the graph needs the matrices); the class embedding and the norm before the layers where ``opts``
    asks for them."""
    E, P = hp.n_embd, hp.patch_size
    return [spec(T.V_ENC_EMBD_PATCH, (P, P, CHANNELS, E)),
            spec(T.V_ENC_EMBD_PATCH, (E,), suffix="bias", kind="vector", optional=True),
            *encoder_tensors(hp, positions, opts)]


def encoder_tensors(hp: HParams, positions: int, opts: Options = Options()) -> list[TensorSpec]:
    """What build_vit reads: ``positions`` learned position rows, the final LayerNorm, each layer's tensors, the
    class embedding and the norm before the layers where ``opts`` asks for them (vit_tensors without the patch
    embedding: a tower whose rows come otherwise, Whisper's convolutions)."""
    E, F, r = hp.n_embd, hp.n_ff, opts.role
    E_q, E_kv = hp.n_embd_head_k * hp.n_head, hp.n_embd_head_k * hp.n_head_kv
    out = [spec(r(T.V_ENC_EMBD_POS), (E, positions))] if not opts.rope_theta else []
    out += with_bias(r(T.V_POST_NORM), (E,), optional=True)
    if opts.class_row:
        out.append(spec(T.V_ENC_EMBD_CLS, (E,), suffix="", kind="vector"))
    if opts.pre_norm:
        out += with_bias(r(T.V_PRE_NORM), (E,), optional=True)
    for il in range(hp.n_layer):
        qkv = (with_bias(T.V_ENC_ATTN_QKV, (E, E_q + 2 * E_kv), il) if opts.fused_qkv else
               [*with_bias(r(T.V_ENC_ATTN_Q), (E, E_q), il, bias_optional=True),
                *with_bias(r(T.V_ENC_ATTN_K), (E, E_kv), il, bias_optional=True),
                *with_bias(r(T.V_ENC_ATTN_V), (E, E_kv), il, bias_optional=True)])
        out += [*with_bias(r(T.V_ENC_INPUT_NORM), (E,), il, optional=True), *qkv,
                *with_bias(r(T.V_ENC_ATTN_O), (E_q, E), il, bias_optional=True),
                *with_bias(r(T.V_ENC_POST_ATTN_NORM), (E,), il, optional=True),
                *_ffn_tensors(E, F, il, opts)]
    return out


def _ffn_tensors(E: int, F: int, il: int, opts: Options) -> list[TensorSpec]:
    """The FFN's up [E, F] and down [F, E] with their biases; ``either_way``: each may have the other's shape;
    ``gated_ffn``: its gate [E, F] too."""
    up_down = [*with_bias(opts.role(T.V_ENC_FFN_UP), (E, F), il, bias_optional=True),
               *with_bias(opts.role(T.V_ENC_FFN_DOWN), (F, E), il, bias_optional=True)]
    if opts.ffn_either_way:
        up_down = [replace(s, also=other.shape) for s, other in zip(up_down, up_down[2:] + up_down[:2])]
    return up_down + (with_bias(T.V_ENC_FFN_GATE, (E, F), il, bias_optional=True) if opts.gated_ffn else [])


def build_inp(b: GraphBuilder, kernels: tuple[str, ...] = ("weight",)) -> Node:
    """The image's patches as rows [E, n_patches] (clip's build_inp): ggml_conv_2d's im2col (its values rounded to
    f16, f32 for a bf16 kernel only), times the kernel; the patches in the image's row order; plus the kernel's bias
    where the file has one. ``kernels``: the patch kernels by suffix, their convolutions added (Qwen2-VL's two
    frames of a still image, one kernel each)."""
    hp = b.hp
    P, E = hp.patch_size, hp.n_embd
    nx, ny = patch_grid(b)
    n = nx * ny
    image = b.input("inp_raw", "f32", (*b.arch.frame, CHANNELS))
    kernel = b.w(T.V_ENC_EMBD_PATCH)
    cols = b.op("im2col", image, kw=P, kh=P, s0=P, s1=P, p0=0, p1=0, d0=1, d1=1,
                type="f32" if kernel.dtype == "bf16" else "f16", name="inp_patches")
    windows = b.reshape(cols, (CHANNELS * P * P, n), name="inp_patches.rows")
    convs = [b.op("mul_mat", windows, b.reshape(b.w(T.V_ENC_EMBD_PATCH, suffix=suffix), (P * P * CHANNELS, E),
                                                name="patch_embd.rows"), name="inp_conv") for suffix in kernels]
    x = b.op("cont", b.op("transpose", convs[0], name="inp_conv.t"), name="inp_patch_rows")
    for conv in convs[1:]:
        rows = b.op("cont", b.op("transpose", conv, name="inp_conv.t"), name="inp_patch_rows")
        x = b.op("add", x, rows, name="inp_patch_rows.sum")
    bias = b.w_opt(T.V_ENC_EMBD_PATCH, suffix="bias")
    return x if bias is None else b.op("add", x, bias, name="patch_bias")


def build_vit(b: GraphBuilder, x: Node, norm: Norm = Norm.LAYER, opts: Options = Options(),
              taps: list[tuple[int, Node]] | None = None) -> Node:
    """clip's build_vit over the patch rows x [E, n]: the class row joined after them and the norm before the
    layers where ``opts`` asks, the learned positions added, the layers ``opts`` runs, then the final norm where
    the file has one; the output the rows of the layers ``opts`` keeps, joined width-wise, if it keeps any.
    ``taps`` receives (layer, output) of each layer ``opts.taps`` names."""
    hp = b.hp
    if opts.class_row:
        x = b.op("concat", x, b.w(T.V_ENC_EMBD_CLS, suffix=""), dim=1, name="inp_cls")
    r = opts.role
    if not opts.rope_theta:
        x = b.op("add", x, b.w(r(T.V_ENC_EMBD_POS)), name="pos_embed")
    if opts.pre_norm:
        x = _norm(b, x, r(T.V_PRE_NORM), None, norm, "pre_ln")
    act = _ACTS[hp.ffn_act]
    depth = hp.n_layer if opts.depth is None else opts.depth
    kept = opts.kept(hp.n_layer)
    windows = b.input("window_mask", "f32", (x.shape[1], x.shape[1])) if opts.window_pattern else None
    stack = []
    for il in range(depth):
        if il in kept:
            stack.append(x)
        with b.layer(il):
            h = _norm(b, x, r(T.V_ENC_INPUT_NORM), il, norm, "layer_inp_normed")
            mask = windows if opts.window_pattern and (il + 1) % opts.window_pattern else None
            x = b.op("add", _attention(b, h, il, opts, mask), x, name="ffn_inp")
            h = _norm(b, x, r(T.V_ENC_POST_ATTN_NORM), il, norm, "ffn_inp_normed")
            up, down = (r(T.V_ENC_FFN_UP), r(T.V_ENC_FFN_DOWN))
            if opts.ffn_either_way and b.w(down, il).shape[0] == hp.n_embd:  # named the other way round
                up, down = down, up
            gate = b.w(T.V_ENC_FFN_GATE, il) if opts.gated_ffn else None
            f = b.build_ffn(h, up=b.w(up, il), up_b=b.w_opt(up, il, "bias"), gate=gate,
                            gate_b=b.w_opt(T.V_ENC_FFN_GATE, il, "bias") if opts.gated_ffn else None,
                            down=b.w(down, il), down_b=b.w_opt(down, il, "bias"), act=act)
            x = b.op("add", x, f, name="layer_out")
        if il in opts.taps and taps is not None:
            taps.append((il, x))
    if opts.pool:
        x = _pooled_rows(b, x, opts.pool)
    x = _norm(b, x, r(T.V_POST_NORM), None, norm, "post_ln")
    stack += [x] if depth in kept else []
    out = stack[0] if stack else x
    for i, rows in enumerate(stack[1:], 1):
        out = b.op("concat", out, rows, dim=0, name=f"features.{i}")
    return out


def _pooled_rows(b: GraphBuilder, x: Node, k: int) -> Node:
    """The rows x [E, n] averaged k at a time into [E, n / k]: ggml_pool_1d over each channel, as pool_2d of the
    channels [n, E] with windows one channel high (the same float32 sum over k, then over k)."""
    planes = b.op("cont", b.op("transpose", x, name="pool.t"), name="pool.planes")
    pooled = b.op("pool_2d", planes, pool="avg", k0=k, k1=1, s0=k, s1=1, p0=0, p1=0, name="pooled")
    return b.op("cont", b.op("transpose", pooled, name="pooled.t"), name="pooled_rows")


def _norm(b: GraphBuilder, x: Node, t: T, il: int | None, kind: Norm, name: str) -> Node:
    """x through norm t with its weight and bias, each where the file has them (clip normalises a layer's input
    whatever it loaded; after the layers only where the file has the norm's weight)."""
    w, bias = b.w_opt(t, il), b.w_opt(t, il, "bias")
    if il is None and w is None:
        return x
    return b.build_norm(x, w, bias, kind, name=name)


def _attention(b: GraphBuilder, x: Node, il: int, opts: Options, mask: Node | None = None) -> Node:
    """Every patch attends to every patch (those the mask lets it see, where given): Q, K and V (each with its bias
    where given), softmax(K^T Q / sqrt(d) + mask) V per head, and the output projection."""
    hp, r = b.hp, opts.role
    d, n = hp.n_embd_head_k, x.shape[1]
    projections = ((r(T.V_ENC_ATTN_Q), "Qcur", hp.n_head), (r(T.V_ENC_ATTN_K), "Kcur", hp.n_head_kv),
                   (r(T.V_ENC_ATTN_V), "Vcur", hp.n_head_kv))
    if opts.fused_qkv:
        qkv = b.linear(x, b.w(T.V_ENC_ATTN_QKV, il), b.w(T.V_ENC_ATTN_QKV, il, "bias"), name="qkv")
        starts = np.cumsum([0] + [d * heads for _, _, heads in projections[:2]])
        q, k, v = (b.op("view", qkv, shape=(d, heads, n), strides=(1, d, qkv.shape[0]), offset=int(start),
                        name=f"{tag}.heads") for start, (_, tag, heads) in zip(starts, projections))
    else:
        flat = [b.linear(x, b.w(t, il), b.w_opt(t, il, "bias"), name=tag) for t, tag, _ in projections]
        q, k, v = (b.reshape(y, (d, heads, n), name=f"{tag}.heads") for y, (_, tag, heads) in zip(flat, projections))
    if opts.rope_theta:
        turn = _rope_vision if opts.mrope else _rope_2d
        q, k = turn(b, q, opts.rope_theta, "Qcur"), turn(b, k, opts.rope_theta, "Kcur")
    out = b.attn_mha(q, k, v, mask, b.kq_scale())
    o = r(T.V_ENC_ATTN_O)
    return b.linear(out, b.w(o, il), b.w_opt(o, il, "bias"), name="attn_out")


def _rope_2d(b: GraphBuilder, x: Node, theta: float, tag: str) -> Node:
    """clip's build_rope_2d over heads x [d, heads, n]: each head's first half turned (adjacent pairs) by the patch's
    row (pos_h), its second half by its column (pos_w) at frequencies scaled by theta^(-2/d), the odd ones of a
    d-wide RoPE; each half a view turned as a whole, the halves joined again (ggml's rope with n_dims d/2, the
    second at offset d/2, turns the same values)."""
    d, heads, n = x.shape
    half = d // 2
    odd = float(np.float32(theta) ** (np.float32(-2.0) / np.float32(d)))
    turned = []
    for axis, offset, scale in (("pos_h", 0, 1.0), ("pos_w", half, odd)):
        pos = b.input(axis, "i32", (n,))
        part = b.op("view", x, shape=(half, heads, n), strides=(1, d, d * heads), offset=offset,
                    name=f"{tag}.{axis}.view")
        turned.append(b.rope(part, pos, name=f"{tag}.{axis}", n_dims=half, mode="norm", freq_base=f32(theta),
                             freq_scale=scale, ext_factor=0.0, attn_factor=1.0, n_ctx_orig=0))
    return b.op("concat", *turned, dim=0, name=f"{tag}.rope_2d")


def _rope_vision(b: GraphBuilder, x: Node, theta: float, tag: str) -> Node:
    """Qwen2-VL's M-RoPE over heads x [d, heads, n] (ggml_rope_multi in vision mode, as clip's qwen2vl graph calls
    it): sections of d/4 pairs, pair i turning channels i and i + d/2 by the patch's row (first section) or column
    (second), each section's frequencies counted from its own start; positions ``positions`` [4 n] (rows, columns,
    rows, columns)."""
    d, _, n = x.shape
    pos = b.input("positions", "i32", (4 * n,))
    return b.rope(x, pos, name=f"{tag}.rope_vision", n_dims=d // 2, mode="vision", sections=(d // 4,) * 4,
                  freq_base=f32(theta), freq_scale=1.0, ext_factor=0.0, attn_factor=1.0, n_ctx_orig=32768)
