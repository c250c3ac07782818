"""Self-attention's projections as most decoder families declare and use them: Q, K, V and the output
projection (llama.cpp's ``create_tensor_qkv`` and ``wo``), the per-head QK-norm several of them apply, and the
check of head sizes their graphs assume."""

from __future__ import annotations

from gguf import MODEL_TENSOR as T
from gguf import Keys

from graphir.errors import MetadataError
from graphir.graph.floats import inv_sqrt
from graphir.graph.ir import Node
from graphir.model.builder import GraphBuilder
from graphir.model.hparams import HParams, Key
from graphir.model.tensors import TensorSpec, spec

# The bound llama.cpp's build_qkv clamps Q, K and V to, for the families that read it (DBRX, MPT, OLMo); 0: none
CLAMP_KQV = Key("clamp_kqv", Keys.Attention.CLAMP_KQV, float, 0.0)


def qkv_tensors(hp: HParams, il: int, *, biases_required: bool = False) -> list[TensorSpec]:
    """Layer il's Q, K, V and output projections, and Q/K/V biases: optional extras, as llama.cpp loads them,
    unless the family's converter always writes them (``biases_required``: Qwen2)."""
    E, d = hp.n_embd, hp.n_embd_head_k
    q_out, k_out, v_out = hp.head_count(il) * d, hp.n_embd_k_gqa_at(il), hp.n_embd_v_gqa_at(il)
    return [spec(T.ATTN_Q, (E, q_out), il), spec(T.ATTN_K, (E, k_out), il), spec(T.ATTN_V, (E, v_out), il),
            spec(T.ATTN_OUT, (hp.head_count(il) * hp.n_embd_head_v, E), il),
            *(spec(t, (n,), il, "bias", kind="vector", optional=not biases_required)
              for t, n in ((T.ATTN_Q, q_out), (T.ATTN_K, k_out), (T.ATTN_V, v_out)))]


def fused_or_split_qkv_tensors(hp: HParams, il: int) -> list[TensorSpec]:
    """Layer il's Q, K and V as llama.cpp's ``create_tensor_qkv`` takes them: one attn_qkv with its bias, or the
    three apart with theirs; all optional here, the architecture's check asks for one of the two forms."""
    E = hp.n_embd
    widths = ((T.ATTN_Q, hp.head_count(il) * hp.n_embd_head_k), (T.ATTN_K, hp.n_embd_k_gqa_at(il)),
              (T.ATTN_V, hp.n_embd_v_gqa_at(il)))
    W = sum(w for _, w in widths)
    return [spec(T.ATTN_QKV, (E, W), il, optional=True), spec(T.ATTN_QKV, (W,), il, "bias", kind="vector", optional=True),
            *(spec(t, (E, w), il, optional=True) for t, w in widths),
            *(spec(t, (w,), il, "bias", kind="vector", optional=True) for t, w in widths)]


def qk_norm_tensors(hp: HParams, il: int) -> list[TensorSpec]:
    d = hp.n_embd_head_k
    return [spec(T.ATTN_Q_NORM, (d,), il, kind="vector"), spec(T.ATTN_K_NORM, (d,), il, kind="vector")]


def qkv(b: GraphBuilder, h: Node, il: int, normed: bool) -> tuple[Node, Node, Node]:
    """Q, K, V of layer il (the builder's build_qkv), with QK-norm where the family has it (``normed``): each head
    of Q and K RMS-normalised over its own values, with a learned scale (Qwen3, Gemma 3)."""
    q, k, v = b.build_qkv(h, il)
    if normed:
        q, k = b.norm(q, T.ATTN_Q_NORM, il, name="Qcur_normed"), b.norm(k, T.ATTN_K_NORM, il, name="Kcur_normed")
    return q, k, v


def check_whole_heads(hp: HParams, arch: str) -> None:
    """The families whose llama.cpp graph asserts that RoPE turns whole heads (n_rot == head size) refuse a file
    that says otherwise."""
    if hp.n_rot != hp.n_embd_head_k:
        raise MetadataError(f"'{Keys.Rope.DIMENSION_COUNT.format(arch=arch)}' = {hp.n_rot}: llama.cpp's graph "
                            f"rotates whole heads of {hp.n_embd_head_k}")


def roped_attention(b: GraphBuilder, h: Node, pos: Node, il: int, clamp: float = 0.0, wo_bias: bool = False) -> Node:
    """Layer il's self-attention over h as most families build it: Q, K, V (clamped to [-clamp, clamp] where the
    family clamps), RoPE'd, scores scaled by 1/sqrt(head size), heads projected by W_o (plus its bias where the
    family has one, times its scale)."""
    q, k, v = b.build_qkv(h, il, clamp=clamp)
    q, k = b.rope(q, pos, name="Qcur.rope"), b.rope(k, pos, name="Kcur.rope")
    return b.build_attn(q, k, v, wo=b.w(T.ATTN_OUT, il), wo_b=b.w(T.ATTN_OUT, il, "bias") if wo_bias else None,
                        wo_s=b.scale(T.ATTN_OUT, il), kq_scale=inv_sqrt(b.hp.n_embd_head_k))


def check_head_sizes(hp: HParams, arch: str, rotated: bool = True) -> None:
    """llama.cpp's assertion of the graphs that read one head size: keys and values (and, ``rotated``, the RoPE'd
    dims) equally wide; a file that breaks it is refused naming the keys."""
    key = lambda t: t.format(arch=arch)  # noqa: E731
    if hp.n_embd_head_k != hp.n_embd_head_v or (rotated and hp.n_rot != hp.n_embd_head_k):
        rot = f" and {hp.n_rot} rotated dims ('{key(Keys.Rope.DIMENSION_COUNT)}')" if rotated else ""
        raise MetadataError(f"heads of {hp.n_embd_head_k} keys ('{key(Keys.Attention.KEY_LENGTH)}'), "
                            f"{hp.n_embd_head_v} values ('{key(Keys.Attention.VALUE_LENGTH)}'){rot}: llama.cpp's "
                            f"graph needs them equal")
