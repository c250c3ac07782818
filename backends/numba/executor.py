"""Executes IR graphs: binds a ubatch's symbolic dims, feeds inputs and cache buffers, runs one kernel per node.

A graph is compiled once per context into a flat list of steps (kernel, output slot, operand slots), and planned
once per binding of its dims (a Plan: attributes bound, windows on weights and on a memory's buffers made once);
values are freed after their last use. Weights are prepared once per model (the
quantized ones repacked lazily by :mod:`graphir.backends.numba.quant`) and shared by every context.
Arrays are in numpy order, the reverse of the IR's ggml order.
"""

from __future__ import annotations

import math
import threading
import time
from functools import lru_cache, partial
from types import CodeType, FunctionType
from typing import Any, Callable, Mapping, NamedTuple

import numpy as np

from graphir.backends.numba import tape as T
from graphir.backends.numba.kernels.attention import attention_mask, attention_over, open_prefix
from graphir.backends.numba.primitives.jit import PAR_MIN, kernel_launches
from graphir.backends.numba.kernels.moe import add_id, argsort_top_k, moe_sum, mul_mat_id, sum_rows
from graphir.backends.numba.kernels.mul_mat import (VEC_F16, VEC_F32, as_rows, f32_short_dots, mul_mat, padding_call,
                                               product_mode, products_call, short_dots_blocks_par,
                                               short_dots_blocks_ser)
from graphir.backends.numba.kernels.norm import norm, norm_kernel, rms_norm, rms_norm_kernel, rms_norming
from graphir.backends.numba.kernels.recurrent import (gated_delta_net, rwkv_wkv6, ssm_conv, ssm_conv_kernel, ssm_scan,
                                                 ssm_scan_heads, ssm_scan_heads_kernel, ssm_scan_kernel, wkv6_kernel)
from graphir.backends.numba.kernels.rope import imrope_cos_sin, rope_apply, rope_cos_sin, rope_kernel, roping
from graphir.backends.numba.kernels import rows as R
from graphir.backends.numba.primitives import simd
from graphir.backends.numba.kernels.softmax import KV_PAD, exp_head, mask_rows, probabilities, soft_max, soft_max_kernel
from graphir.backends.numba.kernels.unary import (LIBM, exp, geglu, gelu, gelu_kernel, gelu_table, libm_kernel, neg, relu,
                                            sigmoid, silu, silu_kernel, softplus, sqr, swiglu, swiglu_oai, tanh)
from graphir.backends.numba.primitives.isa import REDUCE_HADD, IsaPath
from graphir.backends.numba.quant.weight import QWeight, QWeightGroup, expert_matrices
from graphir.backends.numba.tape import Segment, Tape
from graphir.graph.dims import Sym
from graphir.graph.ir import Graph, Node
from graphir.graph.ops import OPS

Env = Mapping[str, int]
F32 = np.float32


def _dense(x: Any) -> np.ndarray:
    return x.dequantize() if isinstance(x, QWeight) else x


def _dense_kept() -> Callable[[Any], np.ndarray]:
    """_dense for one step's weight operand (conv kernel, A, time_first): a QWeight is dequantized on the first
    run and kept, since a Program's weights never change; per token this saves a copy per layer. Threads
    running the Program at once may both dequantize it the first time; the slot is replaced whole, so each
    reads a complete pair."""
    slot: list[tuple[Any, Any]] = [(None, None)]

    def dense(w: Any) -> np.ndarray:
        if not isinstance(w, QWeight):
            return w
        kept = slot[0]
        if kept[0] is not w:
            kept = slot[0] = (w, w.dequantize())
        return kept[1]

    return dense


def _mul_mat(w: Any, x: np.ndarray, path: IsaPath, contiguous: bool | None = None) -> np.ndarray:
    """ggml mul_mat: out[..., n, m] = sum_k w[..., m, k] x[..., n, k]; w's batch dims broadcast over x's.
    ``contiguous``: whether ggml sees x contiguous, for a float array w (mul_mat's default otherwise)."""
    if isinstance(w, QWeight):
        x2 = np.ascontiguousarray(x.reshape(-1, x.shape[-1]), dtype=np.float32)
        floats = w.float_rows()
        # f32 and f16 weights: ggml's own float paths (tinyBLAS or vec_dot, in their summation order)
        y = w.matmul(x2) if floats is None else mul_mat(floats, x2, path, pad=1, contiguous=True)
        return y.reshape(x.shape[:-1] + (w.rows,))
    return mul_mat(w, x, path, contiguous=contiguous)


class _Siblings:
    """The first of consecutive mul_mat steps of 2-D quantized weights on one x (q, k, v; gate, up): it computes
    them all in one kernel call (QWeightGroup, bit-equal to one call each) and leaves the others' results in
    the run's memo under their slots, for _mul_mat_sibling. A plan binds it to the group's product."""

    def __init__(self, memo: threading.local, group: QWeightGroup, later: tuple[int, ...]):
        self.memo, self.group, self.later = memo, group, later

    def __call__(self, env: Env, w: Any, x: np.ndarray) -> np.ndarray:
        return self._first(lambda x2: self.group.matmul(np.ascontiguousarray(x2, dtype=np.float32)), w, x)

    def bind(self, env: Env, known: list[Any], shapes: list[tuple[int, ...]]) -> Callable[..., Any]:
        return partial(self._first, self.group.product())

    def record(self, tape: Tape, args: list[Any]) -> np.ndarray | None:
        """The group's GEMV on the tape, for one row of x; the others' results left in the tape's memo."""
        x, call = args[1], self.group.gemv_call()
        if call is None or not _rows_of(x) or x.size != x.shape[-1]:
            return None
        gemv, joined, spans = call
        x2, out = x.reshape(1, -1), tape.arena((1, spans[-1].stop), fresh=True)   # kept whole: later steps take parts
        if not _record_gemv(tape, gemv, joined, x2, out):
            return None
        ys = [out[:, s] for s in spans]
        if x.ndim != 2:
            ys = [y.reshape(x.shape[:-1] + (v.rows,)) for v, y in zip(self.group.weights, ys)]
        for slot, y in zip(self.later, ys[1:]):
            tape.memo[("sibling", slot)] = y
        return ys[0]

    def _first(self, product: Callable[[np.ndarray], list[np.ndarray]], w: Any, x: np.ndarray) -> np.ndarray:
        ys = product(x.reshape(-1, x.shape[-1]))
        if x.ndim != 2:
            ys = [y.reshape(x.shape[:-1] + (v.rows,)) for v, y in zip(self.group.weights, ys)]
        for slot, y in zip(self.later, ys[1:]):
            self.memo.d[slot] = y
        return ys[0]


class _SiblingTake:
    """A later step of such a run: its value, made by the first (or computed here if it was not)."""

    def __init__(self, memo: threading.local, slot: int, path: IsaPath):
        self.memo, self.slot, self.path = memo, slot, path

    def __call__(self, env: Env, w: Any, x: np.ndarray) -> np.ndarray:
        y = self.memo.d.pop(self.slot, None)
        return _mul_mat(w, x, self.path) if y is None else y

    def record(self, tape: Tape, args: list[Any]) -> np.ndarray | None:
        return tape.memo.pop(("sibling", self.slot), None)


def _rows_of(*xs: Any) -> bool:
    """Whether each x is a C-contiguous float32 array: a tape's kernels read them as rows."""
    return all(isinstance(x, np.ndarray) and x.dtype == F32 and x.flags.c_contiguous and x.ndim for x in xs)


def _record_float_product(tape: Tape, w: QWeight, x: np.ndarray, path: IsaPath) -> np.ndarray | None:
    """An F32 or F16 weight's product on the tape: mul_mat's kernels for it (x padded and, for F16, rounded to
    f16 first; then the products), as _mul_mat calls them."""
    floats = w.float_rows()
    x2 = x.reshape(-1, x.shape[-1])
    (n, k), m, f16 = x2.shape, floats.shape[0], floats.dtype == np.float16
    mode, kind = product_mode(f16, n, k, path.lanes, True, False), 2 if f16 else 0
    x1 = x2
    if kind or k % 64:   # once per x and kind: the products of one input (q, k and v) share its rows
        key = ("rows", id(x), kind)
        seen, x1 = tape.memo.get(key, (None, None))
        if seen is not x:   # (the memo keeps x, so its id names no other array meanwhile)
            x1 = tape.arena((n, -(-k // 64) * 64))
            fn, (src, kd, _) = padding_call(x2, kind, x1)
            if not tape.emit(T.ROWS, fn, (src, kd, x1), (tape.ref("f2r", src), kd, tape.ref("f2", x1))):
                return None
            tape.memo[key] = x, x1
    out = tape.arena((1, n, m))
    if mode == VEC_F16 and n == 1 and k < 4 * path.lanes:   # every product in vec_dot's scalar tail
        blocks = 2 if m % 2 == 0 and m * k >= PAR_MIN else 1        # a block of rows a thread
        wt3 = np.ascontiguousarray(floats.T.reshape(k, blocks, m // blocks).transpose(1, 0, 2), F32)
        x0, o2 = x1.reshape(-1), out.reshape(blocks, m // blocks)
        fn = short_dots_blocks_par if blocks > 1 else short_dots_blocks_ser
        ok = tape.emit(T.SHORT_DOTS, fn, (wt3, x0, k, o2), (tape.ref("f3", wt3), tape.ref("f1", x0), k,
                                                           tape.ref("f2", o2)))
        return out.reshape(x.shape[:-1] + (m,)) if ok else None
    fn, a = products_call(floats.reshape(1, m, k), x1, n, 1, k, k, 1, mode, path, out)
    w1 = tape.ref("u16r", a[3]) if f16 else tape.ref("f1r", a[3])
    ops = (a[0], a[1], w1, a[4], tape.ref("f1", a[5]), *a[6:14], int(a[14]), a[15], tape.ref("f3", out))
    if not tape.emit(T.PRODUCTS16 if f16 else T.PRODUCTS32, fn, a, ops):
        return None
    return out.reshape(x.shape[:-1] + (m,))


def _record_activation_product(tape: Tape, w: np.ndarray, x: np.ndarray, path: IsaPath,
                               contiguous: bool | None = None) -> np.ndarray | None:
    """A product of two float32 arrays (an encoder's KQ and KQV, heads as the batch; RWKV6's LoRA stack) on the
    tape, as mul_mat computes it: the path chosen by the same rule (a soft_max value's KV padding and contiguity),
    x's rows padded, then the products, for each index of the fourth dim. Only where mul_mat would copy neither
    operand's rows (contiguous, or q, k, v as permuted views of one projection)."""
    if not (isinstance(x, np.ndarray) and w.dtype == x.dtype == F32):
        return None
    if contiguous is None:
        contiguous = hasattr(x, "kv_pad")
    pad = getattr(x, "kv_pad", 1)
    r = max(w.ndim, x.ndim, 2)
    w4, x4 = (a.reshape((1,) * (4 - a.ndim) + a.shape) for a in (w, x))
    if x4.shape[0] % w4.shape[0] or x4.shape[1] % w4.shape[1] or not all(
            a.flags.c_contiguous or a.transpose(1, 0, 2).flags.c_contiguous for v in (w4, x4) for a in v):
        return None
    k, n, m = x4.shape[3], x4.shape[2], w4.shape[2]
    kp = -(-k // pad) * pad
    mode = product_mode(False, n, kp, path.lanes, contiguous, False)
    out = tape.arena(x4.shape[:-1] + (m,))
    for a in range(x4.shape[0]):
        wa, xa = w4[a // (x4.shape[0] // w4.shape[0])], x4[a]
        xrows, xsb, xsn = as_rows(xa)
        x1 = tape.arena((xrows.shape[0], -(-k // 64) * 64))
        fn, (src, kd, _) = padding_call(xrows, 0, x1)
        if not tape.emit(T.ROWS, fn, (src, kd, x1), (tape.ref("f2r", src), kd, tape.ref("f2", x1))):
            return None
        if mode == VEC_F32 and kp < 4 * path.lanes and xa.shape[:2] == (1, 1) and not wa.flags.writeable:
            # one row of x by a weight's rows all scalar tail (a read-only operand is a weight: the tape's values
            # and a memory's buffers are writable), laid out by columns once here
            wt, x0, o0 = np.ascontiguousarray(wa[0].T), x1.reshape(-1), out[a].reshape(-1)
            cut = min(k, kp // (path.lanes // 2) * (path.lanes // 2))
            if not tape.emit(T.SHORT_DOTS32, f32_short_dots, (wt, x0, k, cut, o0),
                             (tape.ref("f2", wt), tape.ref("f1", x0), k, cut, tape.ref("f1", o0))):
                return None
            continue
        fn, c = products_call(wa, x1, xsb, xsn, k, kp, xa.shape[0] // wa.shape[0], mode, path, out[a])
        ops = (c[0], c[1], tape.ref("f1r", c[3]), c[4], tape.ref("f1", c[5]), *c[6:14], int(c[14]), c[15],
               tape.ref("f3", out[a]))
        if not tape.emit(T.PRODUCTS32, fn, c, ops):
            return None
    return out.reshape(out.shape[4 - r:])


def _record_gemv(tape: Tape, gemv: Callable, packed: tuple[np.ndarray, ...], x: np.ndarray, out: np.ndarray) -> bool:
    """An exact GEMV of packed rows (quant bytes, then f16 scales) on the tape."""
    if len(packed) not in (2, 3):
        return False
    refs = (tape.ref("u8", packed[0]), *(tape.ref("u16", p) for p in packed[1:]), tape.ref("f2", x),
            tape.ref("f2", out))
    return tape.emit(T.GEMV2 if len(packed) == 2 else T.GEMV3, gemv, (*packed, x, out), refs)


def _broadcast(b: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """ggml repeats b to a's shape when each of b's sizes divides a's; numpy only broadcasts 1s.
    b may have more (size-1) dimensions than a, as RWKV's [E, 1, 1] mix parameters do."""
    b = b.reshape((1,) * (len(shape) - b.ndim) + b.shape[max(b.ndim - len(shape), 0):])
    if all(n == 1 or n == m for n, m in zip(b.shape, shape)):
        return b
    return np.tile(b, tuple(m // n for n, m in zip(b.shape, shape)))


def _permuting(axes: tuple[int, ...], rank: int) -> Callable[[np.ndarray], np.ndarray]:
    """ggml permute (axis i moves to position axes[i]) on numpy's reversed axes, as a function of x; ``rank``: the
    result's."""
    r = len(axes)
    perm = [0] * r
    for i in range(r):
        perm[r - 1 - axes[i]] = r - 1 - i

    def permute(x: np.ndarray) -> np.ndarray:
        y = x.reshape((1,) * (r - x.ndim) + x.shape).transpose(perm)
        return y.reshape(y.shape[r - rank:]) if rank < r else y

    return permute


def _viewing(shape: tuple[int, ...], strides: tuple[int, ...], offset: int) -> Callable[[np.ndarray], np.ndarray]:
    """A strided window of x's buffer as a function of x (x is contiguous: a cache buffer or a fresh value);
    numpy-order strides and the offset in elements, in bytes for 4-byte elements worked out once."""
    strides4, offset4 = tuple(s * 4 for s in strides), offset * 4

    def view(x: np.ndarray) -> np.ndarray:
        item = x.itemsize
        st, off = (strides4, offset4) if item == 4 else (tuple(s * item for s in strides), offset * item)
        y = np.ndarray(shape, x.dtype, buffer=x, offset=off, strides=st)
        y.setflags(write=False)
        return y

    return view


def _set_rows(dst: np.ndarray, src: np.ndarray, ids: np.ndarray) -> np.ndarray:
    dst[ids] = src  # NOTE: in place: dst is the cache buffer the memory owns; f32 -> f16 rounds to nearest even
    return dst


def _ints_fn(values: tuple[Any, ...]) -> Callable[[Env], tuple[int, ...]]:
    """Attribute integers that may name dims (shapes, strides, offsets): computed once when static, per run
    when one is a Sym."""
    if any(isinstance(d, Sym) for d in values):
        return lambda env: tuple(d.eval(env) if isinstance(d, Sym) else d for d in values)
    fixed = tuple(values)
    return lambda env: fixed


def _shape_fn(shape: tuple[Any, ...]) -> Callable[[Env], tuple[int, ...]]:
    """numpy shape of an attribute shape (ggml order reversed)."""
    return _ints_fn(tuple(reversed(shape)))


# ---- kernels, one per non-leaf op of the catalogue ---------------------------------------------------------
# A kernel maker takes the node (its attributes), the run's memo and the numerics path, and returns
# f(env, *operands) -> value. ``memo.d`` lives for one run of one thread: values every layer would recompute
# (RoPE's cos/sin) are made once, and contexts sharing a program from several threads never see each other's.

Maker = Callable[[Node, threading.local, IsaPath], Callable[..., Any]]
KERNELS: dict[str, Maker] = {}


def kernel(*ops: str) -> Callable[[Maker], Maker]:
    """Register a kernel maker for ops of graphir.graph.ops.OPS; an op without one, or with two, is an error."""
    def register(make: Maker) -> Maker:
        for op in ops:
            if op not in OPS or OPS[op].kind == "leaf":
                raise ValueError(f"kernel for {op!r}: not a computing op of the catalogue")
            if op in KERNELS:
                raise ValueError(f"two kernels for op {op!r}")
            KERNELS[op] = make
        return make
    return register


_BINARY = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide}
_ROW_OPS = {np.add: R.ADD, np.subtract: R.SUB, np.multiply: R.MUL, np.divide: R.DIV}   # a tape's kernel for each
_UNARY_FN = {"gelu": gelu, "relu": relu, "sqr": sqr, "neg": neg, "exp": exp, "tanh": tanh, "sigmoid": sigmoid,
             "softplus": softplus}


@kernel("get_rows")
def _get_rows(n: Node, memo: threading.local, path: IsaPath) -> Callable[..., Any]:
    if len(n.inputs[1].shape) >= 2:  # batched: src (B..., rows, ne0), ids (B..., n)
        return lambda env, src, ids: np.take_along_axis(src, ids[..., None].astype(np.intp), axis=-2).astype(
            np.float32, copy=False)
    return _GetRows()


class _GetRows:
    def __call__(self, env: Env, src: Any, ids: np.ndarray) -> np.ndarray:
        # fancy indexing copies already: a float32 source (a recurrent state buffer) is not copied twice
        return src.get_rows(ids) if isinstance(src, QWeight) else src[ids].astype(np.float32, copy=False)

    def record(self, tape: Tape, args: list[Any]) -> np.ndarray | None:
        """Rows of a float32 array (a recurrent state buffer, a value) by ids on the tape; one row of a memory's
        buffer is read where it lies (Tape.row_in_place: a generation step's state, 96 KB a layer of Mamba-130M,
        512 KB of RWKV6-1.6B, is not copied)."""
        src, ids = args
        if isinstance(src, QWeight):
            return _record_weight_rows(tape, src, ids)
        if not _rows_of(src) or src.ndim != 2 or not isinstance(ids, np.ndarray) or ids.ndim != 1:
            return None
        if src.flags.writeable:
            out = tape.row_in_place(src, ids)
            if out is not None:
                return out
        out = tape.arena((len(ids), src.shape[1]))
        ok = tape.emit(T.MOVE, R.move_rows, (src, out, ids, False), (tape.ref("f2", src), tape.ref("f2", out),
                                                                      tape.ref("i64", ids), 0))
        return out if ok else None


def _record_weight_rows(tape: Tape, w: QWeight, ids: Any) -> np.ndarray | None:
    """An F16 or F32 weight's rows by ids (a token's embedding) on the tape, read from the weight as stored."""
    floats = w.float_rows()
    if floats is None or not isinstance(ids, np.ndarray) or ids.ndim != 1:
        return None
    f16 = floats.dtype == np.float16
    flat = floats.reshape(-1).view(np.uint16) if f16 else floats.reshape(-1)
    out = tape.arena((len(ids), w.ne0))
    ok = tape.emit(T.WEIGHT_ROWS, R.weight_rows, (flat, w.ne0, ids, out), (
        tape.ref("u16r" if f16 else "f1r", flat), w.ne0, tape.ref("i64", ids), tape.ref("f2", out), int(f16)))
    return out if ok else None


@kernel("mul_mat")
def _mul_mat_kernel(n: Node, memo: threading.local, path: IsaPath) -> Callable[..., Any]:
    w, x = n.inputs
    if w.op == "weight" and len(w.shape) == 3:  # a stack of matrices (MLA's per-head k_b, v_b): held dense; ggml
        # may take tinyBLAS for it where the activations are contiguous (not a permuted or strided view)
        return _StackProduct(path, x.op not in ("permute", "transpose", "view"))
    return _Product(path)


class _StackProduct:
    """mul_mat of a stack of matrices (MLA's per-head k_b and v_b) by x; ``contiguous``: whether ggml sees x
    contiguous (not a permuted or strided view), which may give tinyBLAS its path."""

    def __init__(self, path: IsaPath, contiguous: bool):
        self.path, self.contiguous = path, contiguous

    def __call__(self, env: Env, w: Any, x: np.ndarray) -> np.ndarray:
        return _mul_mat(w, x, self.path, contiguous=self.contiguous)

    def record(self, tape: Tape, args: list[Any]) -> np.ndarray | None:
        w, x = args
        return _record_activation_product(tape, w, x, self.path, self.contiguous) if isinstance(w, np.ndarray) \
            else None


class _Product:
    """mul_mat of a 2-D weight by x; a plan binds it to a quantized weight's own product (QWeight.product)."""

    def __init__(self, path: IsaPath):
        self.path = path

    def __call__(self, env: Env, w: Any, x: np.ndarray) -> np.ndarray:
        return _mul_mat(w, x, self.path)

    def bind(self, env: Env, known: list[Any], shapes: list[tuple[int, ...]]) -> Callable[..., Any]:
        w = known[0]
        if not isinstance(w, QWeight) or w.float_rows() is not None:
            return partial(self, env)
        product, rows = w.product(), w.rows
        return lambda w, x: product(x) if x.ndim == 2 else product(x.reshape(-1, x.shape[-1])).reshape(
            x.shape[:-1] + (rows,))

    def record(self, tape: Tape, args: list[Any]) -> np.ndarray | None:
        w, x = args
        if isinstance(w, np.ndarray):
            return _record_activation_product(tape, w, x, self.path)
        if isinstance(w, QWeight) and w.float_rows() is not None and _rows_of(x):
            return _record_float_product(tape, w, x, self.path)
        call = w.gemv_call() if isinstance(w, QWeight) else None
        if call is None or not _rows_of(x):
            return None
        x2 = x.reshape(-1, x.shape[-1])
        out = tape.arena((x2.shape[0], w.rows))
        if not _record_gemv(tape, *call, x2, out):
            return None
        return out if x.ndim == 2 else out.reshape(x.shape[:-1] + (w.rows,))


@kernel("mul_mat_id")
def _mul_mat_id(n: Node, memo: threading.local, path: IsaPath) -> Callable[..., Any]:
    n_expert = n.inputs[0].shape[2]

    def by_experts(env: Env, w: Any, x: np.ndarray, ids: np.ndarray) -> np.ndarray:
        experts = expert_matrices(w, n_expert)
        m = experts[0].rows if isinstance(experts[0], QWeight) else experts[0].shape[0]
        return mul_mat_id(lambda e, rows: _expert_product(experts[e], rows, path), n_expert, m, x, ids)

    return by_experts


def _expert_product(w: Any, x: np.ndarray, path: IsaPath) -> np.ndarray:
    """x (n, K) float32 through one expert: (n, M). F32 and F16 experts take ggml_vec_dot, never tinyBLAS, as
    ggml's mul_mat_id does."""
    if isinstance(w, QWeight):
        floats = w.float_rows()
        if floats is None:
            return w.matmul(x)
        return mul_mat(floats, x, path, pad=1, contiguous=False, vec_dot=True)
    return mul_mat(w, x, path, contiguous=False, vec_dot=True)


@kernel("argsort_top_k")
def _argsort_top_k(n: Node, memo: threading.local, path: IsaPath) -> Callable[..., Any]:
    return lambda env, x: argsort_top_k(x, n.attrs["k"])


@kernel("sum_rows")
def _sum_rows(n: Node, memo: threading.local, path: IsaPath) -> Callable[..., Any]:
    return lambda env, x: sum_rows(x)


@kernel("moe_sum")
def _moe_sum(n: Node, memo: threading.local, path: IsaPath) -> Callable[..., Any]:
    return lambda env, x: moe_sum(x)


@kernel("clamp")
def _clamp(n: Node, memo: threading.local, path: IsaPath) -> Callable[..., Any]:
    lo, hi = np.float32(n.attrs["min"]), np.float32(n.attrs["max"])
    return lambda env, x: np.maximum(np.minimum(x, hi, dtype=np.float32), lo)


@kernel(*_BINARY)
def _binary(n: Node, memo: threading.local, path: IsaPath) -> Callable[..., Any]:
    return _Binary(_BINARY[n.op])


class _Binary:
    """add, sub, mul, div: y repeated over x as ggml does; a plan where y's shape broadcasts numpy's way (each of
    its sizes 1 or x's, no more dims than x) binds the ufunc alone."""

    def __init__(self, f: np.ufunc):
        self.f = f

    def __call__(self, env: Env, x: np.ndarray, y: Any) -> np.ndarray:
        return self.f(x, _broadcast(_dense(y), x.shape), dtype=np.float32)

    def bind(self, env: Env, known: list[Any], shapes: list[tuple[int, ...]]) -> Callable[..., Any]:
        (xs, ys), f = shapes, self.f
        if isinstance(known[1], QWeight) or len(ys) > len(xs) \
                or any(n != 1 and n != m for n, m in zip(reversed(ys), reversed(xs))):
            return partial(self, env)
        return lambda x, y: f(x, y, dtype=np.float32)

    def record(self, tape: Tape, args: list[Any]) -> np.ndarray | None:
        """x op y on the tape where y has x's shape or x's trailing dims (a bias, a scale: one row, or a block that
        repeats, as Mamba-2's grouped norm weight), taken as rows of y's size."""
        x, y = args
        if not _rows_of(x, y):
            return None
        trailing = y.shape[next((i for i, n in enumerate(y.shape) if n != 1), len(y.shape)):]
        if x.shape != y.shape and x.shape[len(x.shape) - len(trailing):] != trailing:
            return None
        if not y.flags.writeable:   # a weight (a bias, a scale): it never changes, so the arena holds a copy
            y = tape.constant(y)
        width = x.shape[-1] if x.shape == y.shape else max(y.size, 1)
        out = tape.arena(x.shape)
        x2, y2, o2 = x.reshape(-1, width), y.reshape(-1, width), out.reshape(-1, width)
        op = _ROW_OPS[self.f]
        ok = tape.emit(T.BINARY, R.binary_rows, (x2, y2, o2, op),
                       (tape.ref("f2", x2), tape.ref("f2", y2), tape.ref("f2", o2), op))
        return out if ok else None


@kernel(*_UNARY_FN)
def _unary(n: Node, memo: threading.local, path: IsaPath) -> Callable[..., Any]:
    return _Unary(n.op)


@kernel("scale")
def _scale(n: Node, memo: threading.local, path: IsaPath) -> Callable[..., Any]:
    return _Unary("scale", np.float32(n.attrs["s"]))


_ROW_UNARY = {"relu": R.RELU, "sqr": R.SQR, "neg": R.NEG, "scale": R.SCALE}   # numpy's, as row kernels


class _Unary:
    """A unary op (or scale by s); on a tape, the glibc ones (exp, tanh, ...), numpy's (relu, sqr, neg, scale) and
    gelu (ggml's table)."""

    def __init__(self, op: str, s: np.float32 = np.float32(1.0)):
        self.op, self.s = op, s
        self.f = (lambda x: x * s) if op == "scale" else _UNARY_FN[op]

    def __call__(self, env: Env, x: np.ndarray) -> np.ndarray:
        return self.f(x)

    def record(self, tape: Tape, args: list[Any]) -> np.ndarray | None:
        x = args[0]
        if not _rows_of(x) or (self.op not in LIBM and self.op not in _ROW_UNARY and self.op != "gelu"):
            return None
        out = tape.arena(x.shape)
        x2, o2 = x.reshape(-1, x.shape[-1]), out.reshape(-1, x.shape[-1])
        if self.op == "gelu":
            table = gelu_table()
            ok = tape.emit(T.GELU, gelu_kernel(x.size), (x2, x2, False, table, o2),
                           (tape.ref("f2", x2), tape.ref("f2", x2), 0, tape.ref("f1", table), tape.ref("f2", o2)))
        elif self.op in LIBM:
            which = LIBM[self.op]
            ok = tape.emit(T.LIBM, libm_kernel(x.size), (x2, which, o2),
                           (tape.ref("f2", x2), which, tape.ref("f2", o2)))
        else:
            which = _ROW_UNARY[self.op]
            ok = tape.emit(T.UNARY, R.unary_rows, (x2, o2, which, self.s),
                           (tape.ref("f2", x2), tape.ref("f2", o2), which, tape.f32(self.s)))
        return out if ok else None


@kernel("rms_norm")
def _rms_norm(n: Node, memo: threading.local, path: IsaPath) -> Callable[..., Any]:
    return _Norm(n.attrs["eps"], path, rms=True)


@kernel("norm")
def _norm(n: Node, memo: threading.local, path: IsaPath) -> Callable[..., Any]:
    return _Norm(n.attrs["eps"], path, rms=False)


_NO_WEIGHT = np.zeros(0, F32)   # rms_norm's kernel without a product by a weight
_NO_WEIGHT.flags.writeable = False


class _Norm:
    """norm, or rms_norm without a weight after it (Mamba-2's grouped norm, whose weight comes after a reshape;
    one followed by its weight is _RmsNormWeighted)."""

    def __init__(self, eps: float, path: IsaPath, rms: bool):
        self.eps, self.path, self.rms = eps, path, rms

    def __call__(self, env: Env, x: np.ndarray) -> np.ndarray:
        return rms_norm(x, self.eps) if self.rms else norm(x, self.eps, self.path)

    def record(self, tape: Tape, args: list[Any]) -> np.ndarray | None:
        x = args[0]
        if not _rows_of(x):
            return None
        out = tape.arena(x.shape)
        x2, o2, eps, lanes = x.reshape(-1, x.shape[-1]), out.reshape(-1, x.shape[-1]), F32(self.eps), self.path.lanes
        if self.rms:
            ok = tape.emit(T.NORM, rms_norm_kernel(x.size), (x2, eps, _NO_WEIGHT, o2),
                           (tape.ref("f2", x2), tape.f32(eps), tape.ref("f1r", _NO_WEIGHT), tape.ref("f2", o2)))
        else:
            ok = tape.emit(T.LAYER_NORM, norm_kernel(), (x2, eps, lanes, o2),
                           (tape.ref("f2", x2), tape.f32(eps), lanes, tape.ref("f2", o2)))
        return out if ok else None


@kernel("silu")
def _silu(n: Node, memo: threading.local, path: IsaPath) -> Callable[..., Any]:
    return _Silu(path)


class _Silu:
    def __init__(self, path: IsaPath):
        self.path = path

    def __call__(self, env: Env, x: np.ndarray) -> np.ndarray:
        return silu(x, self.path)

    def record(self, tape: Tape, args: list[Any]) -> np.ndarray | None:
        x = args[0]
        if not _rows_of(x):
            return None
        out = tape.arena(x.shape)
        x2, o2 = x.reshape(-1, x.shape[-1]), out.reshape(-1, x.shape[-1])
        none = tape.arena((x2.shape[0], 0))                       # no gate
        lanes, expf = self.path.lanes, self.path.expf
        ok = tape.emit(T.SILU, silu_kernel(x.size), (x2, lanes, expf, none, o2),
                       (tape.ref("f2", x2), lanes, expf, tape.ref("f2", none), tape.ref("f2", o2)))
        return out if ok else None


@kernel("swiglu")
def _swiglu(n: Node, memo: threading.local, path: IsaPath) -> Callable[..., Any]:
    return _Swiglu(path)


class _Swiglu:
    def __init__(self, path: IsaPath):
        self.path = path

    def __call__(self, env: Env, g: np.ndarray, u: np.ndarray) -> np.ndarray:
        return swiglu(g, u, self.path)

    def record(self, tape: Tape, args: list[Any]) -> np.ndarray | None:
        g, u = args
        if not _rows_of(g, u) or g.shape != u.shape:
            return None
        out = tape.arena(g.shape)
        g2, u2, o2 = (a.reshape(-1, g.shape[-1]) for a in (g, u, out))
        lanes, expf = self.path.lanes, self.path.expf
        ok = tape.emit(T.SILU, silu_kernel(g.size), (g2, lanes, expf, u2, o2),
                       (tape.ref("f2", g2), lanes, expf, tape.ref("f2", u2), tape.ref("f2", o2)))
        return out if ok else None


@kernel("geglu")
def _geglu(n: Node, memo: threading.local, path: IsaPath) -> Callable[..., Any]:
    return lambda env, g, u: geglu(g, u)


@kernel("swiglu_oai")
def _swiglu_oai(n: Node, memo: threading.local, path: IsaPath) -> Callable[..., Any]:
    alpha, limit = n.attrs["alpha"], n.attrs["limit"]
    return lambda env, g, u: swiglu_oai(g, u, alpha, limit)


@kernel("add_id")
def _add_id(n: Node, memo: threading.local, path: IsaPath) -> Callable[..., Any]:
    return lambda env, x, b, ids: add_id(x, _dense(b), ids)


@kernel("rope")
def _rope(n: Node, memo: threading.local, path: IsaPath) -> Callable[..., Any]:
    a = n.attrs
    return _Rope(a, memo, lambda pos, ff: rope_cos_sin(pos, a["n_dims"], None if ff is None else _dense(ff).reshape(-1),
                                                       a))


@kernel("rope_multi")
def _rope_multi(n: Node, memo: threading.local, path: IsaPath) -> Callable[..., Any]:
    a = n.attrs
    return _Rope(a, memo, lambda pos, ff: imrope_cos_sin(pos, a["n_dims"], a["sections"], a))


class _Rope:
    """rope and rope_multi: x rotated by the cos/sin of the positions (and frequency factors), which the run's memo
    keeps from the first layer that makes them for the others; a plan binds the rotation to x's shape."""

    def __init__(self, a: dict[str, Any], memo: threading.local,
                 cos_sin: Callable[[np.ndarray, Any], tuple[np.ndarray, np.ndarray]]):
        self.a, self.memo, self.cos_sin, self.key = a, memo, cos_sin, tuple(a.values())

    def __call__(self, env: Env, x: np.ndarray, pos: np.ndarray, ff: Any = None) -> np.ndarray:
        return rope_apply(x, self._cached(pos, ff), self.a)

    def bind(self, env: Env, known: list[Any], shapes: list[tuple[int, ...]]) -> Callable[..., Any]:
        rotate, cached = roping(self.a, shapes[0]), self._cached
        return lambda x, pos, ff=None: rotate(x, cached(pos, ff))

    def record(self, tape: Tape, args: list[Any]) -> np.ndarray | None:
        """The rotation on the tape; cos/sin of the positions made before each run, once for the layers."""
        x, pos, ff = (*args, None)[:3]
        if not _rows_of(x):
            return None
        key = ("cos_sin", id(pos), id(ff), self.key)
        cs = tape.memo.get(key)
        if cs is None:
            c, s = self.cos_sin(pos, ff)
            if not _rows_of(c, s) or c.ndim != 2:
                return None
            cs = tape.memo[key] = tape.arena(c.shape, fresh=True), tape.arena(s.shape, fresh=True)

            def fill(cs: tuple[np.ndarray, np.ndarray] = cs) -> None:
                cs[0][...], cs[1][...] = self.cos_sin(pos, ff)

            tape.before.append(fill)
        (cos, sin), (kernel, nh, n_dims, neox, n_fused) = cs, rope_kernel(self.a, x.shape)
        rows, out = x.reshape(-1, x.shape[-1]), tape.arena(x.shape)
        o2 = out.reshape(rows.shape)
        ok = tape.emit(T.ROPE, kernel, (rows, cos, sin, cos.shape[0], nh, n_dims, neox, n_fused, o2),
                       (tape.ref("f2", rows), tape.ref("f2", cos), tape.ref("f2", sin), cos.shape[0], nh, n_dims,
                        int(neox), n_fused, tape.ref("f2", o2)))
        return out if ok else None

    def _cached(self, pos: np.ndarray, ff: Any) -> tuple[np.ndarray, np.ndarray]:
        k, d = (id(pos), id(ff), self.key), self.memo.d
        cs = d.get(k)
        if cs is None:
            cs = d[k] = self.cos_sin(pos, ff)
        return cs


def _kv_pad(soft_max_node: Node) -> int:
    """llama.cpp pads a KV cache's attended cells (n_kv) to 256 masked ones; a mask over the ubatch (n_tokens)
    or an encoder's output (n_enc) has the length it says."""
    n = soft_max_node
    return KV_PAD if len(n.inputs) > 1 and str(n.inputs[1].shape[0]).startswith("n_kv") else 1


@kernel("soft_max")
def _soft_max(n: Node, memo: threading.local, path: IsaPath) -> Callable[..., Any]:
    return _SoftMax(n.attrs, _kv_pad(n), path)


class _SoftMax:
    def __init__(self, a: dict[str, Any], pad: int, path: IsaPath):
        self.a, self.pad, self.path = a, pad, path

    def __call__(self, env: Env, x: np.ndarray, mask: np.ndarray | None = None, sinks: Any = None) -> np.ndarray:
        return soft_max(x, None if mask is None else _broadcast(mask, x.shape), self.a["scale"], self.a["max_bias"],
                        self.path, self.pad, None if sinks is None else _dense(sinks))

    def record(self, tape: Tape, args: list[Any]) -> np.ndarray | None:
        """soft_max with a mask (no sinks, no ALiBi) on the tape: its value marked as soft_max marks it (the KV
        padding it ran with), which the mul_mat that reads it chooses its path by."""
        if len(args) != 2 or self.a["max_bias"] or not _rows_of(*args):
            return None
        x, mask = args
        m, mrows = mask_rows(_broadcast(mask, x.shape), x.shape)
        if not np.shares_memory(m, mask):
            return None
        x2, lanes = x.reshape(-1, x.shape[-1]), self.path.lanes
        head, scale, none = exp_head(x.shape[-1], lanes, self.pad), F32(self.a["scale"]), tape.arena((0,))
        out, variant = tape.arena(x.shape), self.path.expf
        o2 = out.reshape(x2.shape)
        ok = tape.emit(T.SOFT_MAX, soft_max_kernel(x.size), (x2, m, mrows, scale, head, lanes, variant, o2, none),
                       (tape.ref("f2", x2), tape.ref("f2", m), mrows, tape.f32(scale), head, lanes, variant,
                        tape.ref("f2", o2), tape.ref("f1", none)))
        return probabilities(out, self.pad) if ok else None


class _Window:
    """A step whose value is a window on its operand's memory (reshape, view, permute, transpose; a cont that need
    not copy): ``at(env)`` is the function of the operand for one binding of the dims. A plan binds it once, and
    where the operand is known before the run (a weight, a memory's buffer) computes the window itself once."""

    def __init__(self, at: Callable[[Env], Callable[[np.ndarray], np.ndarray]]):
        self.at = at

    def __call__(self, env: Env, x: np.ndarray) -> np.ndarray:
        return self.at(env)(x)


@kernel("reshape")
def _reshape(n: Node, memo: threading.local, path: IsaPath) -> Callable[..., Any]:
    shape = _shape_fn(n.attrs["shape"])

    def at(env: Env) -> Callable[[np.ndarray], np.ndarray]:
        s = shape(env)
        return lambda x: x.reshape(s)

    return _Window(at)


@kernel("view")
def _view_kernel(n: Node, memo: threading.local, path: IsaPath) -> Callable[..., Any]:
    a = n.attrs
    r = len(a["shape"])
    geometry = _ints_fn((*reversed(a["shape"]), *reversed(a["strides"]), a["offset"]))

    def at(env: Env) -> Callable[[np.ndarray], np.ndarray]:
        g = geometry(env)
        return _viewing(g[:r], g[r:-1], g[-1])

    return _Window(at)


@kernel("permute", "transpose")
def _permute_kernel(n: Node, memo: threading.local, path: IsaPath) -> Callable[..., Any]:
    axes, rank = (n.attrs["axes"] if n.op == "permute" else (1, 0, 2, 3)), len(n.shape)
    permute = _permuting(axes, rank)
    return _Window(lambda env: permute)


@kernel("cont")
def _cont(n: Node, memo: threading.local, path: IsaPath) -> Callable[..., Any]:
    return _Cont()


class _Cont:
    def __call__(self, env: Env, x: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(x)

    def record(self, tape: Tape, args: list[Any]) -> np.ndarray | None:
        """x itself where it is contiguous already, as np.ascontiguousarray gives it: nothing to play. Else, where x
        is a view of up to three dims of a C-contiguous array (Mamba's conv state: the last columns of conv_x; a
        permute), copied element by element from that array's flat memory."""
        x = args[0]
        if not isinstance(x, np.ndarray) or x.dtype != F32:
            return None
        if x.flags.c_contiguous:
            return x
        base = T.storage_of(x)
        if x.ndim > 3 or not base.flags.c_contiguous or base.nbytes % x.itemsize \
                or any(st % x.itemsize for st in x.strides):
            return None
        base = base.reshape(-1).view(F32)   # the arena's arrays are float32 views of bytes
        pad = 3 - x.ndim
        shape, strides = (1,) * pad + x.shape, (0,) * pad + tuple(st // x.itemsize for st in x.strides)
        out = tape.arena(x.shape)
        flat, o3 = base.reshape(-1), out.reshape(shape)
        off = (x.ctypes.data - base.ctypes.data) // x.itemsize
        ok = tape.emit(T.STRIDED, R.strided_copy, (flat, off, *strides, o3), (tape.ref("f1", flat), off, *strides,
                                                                               tape.ref("f3", o3)))
        return out if ok else None


@kernel("concat")
def _concat(n: Node, memo: threading.local, path: IsaPath) -> Callable[..., Any]:
    return _Concat(len(n.shape), n.attrs["dim"])


class _Concat:
    def __init__(self, rank: int, dim: int):
        self.rank, self.axis = rank, rank - 1 - dim     # numpy's axis of ggml's dim

    def __call__(self, env: Env, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        x, y = (v.reshape((1,) * (self.rank - v.ndim) + v.shape) for v in (x, y))
        return np.concatenate([x, y], axis=self.axis).astype(np.float32, copy=False)

    def record(self, tape: Tape, args: list[Any]) -> np.ndarray | None:
        """On the tape as rows: what lies before the axis is the rows, the axis and what follows it the columns."""
        x, y = (v.reshape((1,) * (self.rank - v.ndim) + v.shape) if isinstance(v, np.ndarray) else v for v in args)
        ax = self.axis
        if not _rows_of(x, y) or x.shape[:ax] != y.shape[:ax] or x.shape[ax + 1:] != y.shape[ax + 1:]:
            return None
        out = tape.arena(x.shape[:ax] + (x.shape[ax] + y.shape[ax],) + x.shape[ax + 1:])
        rows = math.prod(x.shape[:ax])
        x2, y2, o2 = x.reshape(rows, -1), y.reshape(rows, -1), out.reshape(rows, -1)
        ok = tape.emit(T.CONCAT, R.concat_cols, (x2, y2, o2), (tape.ref("f2", x2), tape.ref("f2", y2),
                                                                tape.ref("f2", o2)))
        return out if ok else None


@kernel("set_rows")
def _set_rows_kernel(n: Node, memo: threading.local, path: IsaPath) -> Callable[..., Any]:
    if len(n.inputs[2].shape) == 2:  # batched: dst (B, rows, ne0), src (B, n, ne0), ids (B, n); dst a fresh value
        def set_batched(env: Env, dst: np.ndarray, src: np.ndarray, ids: np.ndarray) -> np.ndarray:
            np.put_along_axis(dst, ids[..., None].astype(np.intp), src, axis=1)
            return dst
        return set_batched
    return _SetRows()


class _SetRows:
    def __call__(self, env: Env, dst: np.ndarray, src: np.ndarray, ids: np.ndarray) -> np.ndarray:
        return _set_rows(dst, src, ids)

    def record(self, tape: Tape, args: list[Any]) -> np.ndarray | None:
        """Rows into an f16 cache (rows, width) on the tape, rounded as numpy rounds them, or a float32 one's."""
        dst, src, ids = args
        if not isinstance(dst, np.ndarray) or dst.dtype not in (np.float16, F32) or dst.ndim != 2 \
                or not dst.flags.c_contiguous or not _rows_of(src) or not isinstance(ids, np.ndarray) \
                or ids.ndim != 1 or src.shape != (len(ids), dst.shape[1]):
            return None
        if dst.dtype == F32:   # a recurrent state's rows
            ok = tape.emit(T.MOVE, R.move_rows, (src, dst, ids, True), (tape.ref("f2", src), tape.ref("f2", dst),
                                                                         tape.ref("i64", ids), 1))
        else:
            bits = dst.view(np.uint16)
            ok = tape.emit(T.SET_ROWS, R.set_rows_f16, (bits, src, ids),
                           (tape.ref("u16_2", bits), tape.ref("f2", src), tape.ref("i64", ids)))
        if ok:
            tape.writes_rows(dst, ids)
        return dst if ok else None


@kernel("fill")
def _fill(n: Node, memo: threading.local, path: IsaPath) -> Callable[..., Any]:
    c = np.float32(n.attrs["c"])
    return lambda env, x: np.full(x.shape, c, np.float32)


@kernel("repeat")
def _repeat(n: Node, memo: threading.local, path: IsaPath) -> Callable[..., Any]:
    shape = _shape_fn(n.attrs["shape"])

    def repeat(env: Env, x: np.ndarray) -> np.ndarray:
        s = shape(env)
        return np.ascontiguousarray(np.broadcast_to(_broadcast(x, s), s), dtype=np.float32)

    return repeat


@kernel("ssm_conv")
def _ssm_conv(n: Node, memo: threading.local, path: IsaPath) -> Callable[..., Any]:
    return _SsmConv()


class _SsmConv:
    def __init__(self) -> None:
        self.dense = _dense_kept()

    def __call__(self, env: Env, sx: np.ndarray, w: Any) -> np.ndarray:
        return ssm_conv(sx, self.dense(w))

    def record(self, tape: Tape, args: list[Any]) -> np.ndarray | None:
        sx, w = args[0], self.dense(args[1])
        if not _rows_of(sx, w) or w.ndim != 2:
            return None
        sx3 = sx.reshape((-1,) + sx.shape[-2:])
        y = tape.arena((sx3.shape[0], sx3.shape[2] - w.shape[1] + 1, sx3.shape[1]))
        ok = tape.emit(T.CONV, ssm_conv_kernel(y.size), (sx3, w, y), (tape.ref("f3", sx3), tape.ref("f2", w),
                                                                 tape.ref("f3", y)))
        return y if ok else None


def _result_with_states(tape: Tape, shape: tuple[int, ...], y_shape: tuple[int, ...],
                        st_shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A recurrent op's value on the tape as ggml lays it out, every output then the final states in one array of
    ``shape``: that array, and its two parts as the kernel writes them."""
    out = tape.arena(shape)
    flat, n = out.reshape(-1), math.prod(y_shape)
    return out, flat[:n].reshape(y_shape), flat[n:].reshape(st_shape)


@kernel("ssm_scan")
def _ssm_scan(n: Node, memo: threading.local, path: IsaPath) -> Callable[..., Any]:
    return _SsmScan()


class _SsmScan:
    def __init__(self) -> None:
        self.dense = _dense_kept()

    def __call__(self, env: Env, s: np.ndarray, x: np.ndarray, dt: np.ndarray, A: Any, B: np.ndarray,
                 C: np.ndarray) -> np.ndarray:
        return ssm_scan(s, x, dt, self.dense(A), B, C)

    def record(self, tape: Tape, args: list[Any]) -> np.ndarray | None:
        """The scan on the tape: its result, every y then the final states, one arena array (as ggml's)."""
        s, x, dt, A, B, C = args[0], args[1], args[2], self.dense(args[3]), args[4], args[5]
        if not _rows_of(s, x, dt, A, B, C) or A.ndim != 2 or any(v.ndim != 3 for v in (x, dt, B, C)):
            return None
        s3 = s.reshape((x.shape[0],) + A.shape)
        out, y, st = _result_with_states(tape, (x.size + s3.size,), x.shape, s3.shape)
        ops = tuple(tape.ref("f3", v) for v in (s3, x, dt)) + (tape.ref("f2", A),) + tuple(
            tape.ref("f3", v) for v in (B, C, y, st))
        return out if tape.emit(T.SCAN, ssm_scan_kernel(), (s3, x, dt, A, B, C, y, st), ops) else None


@kernel("ssm_scan_heads")
def _ssm_scan_heads(n: Node, memo: threading.local, path: IsaPath) -> Callable[..., Any]:
    return _SsmScanHeads(path)


class _SsmScanHeads:
    def __init__(self, path: IsaPath) -> None:
        self.dense, self.lanes, self.hadd = _dense_kept(), path.lanes, path.reduce == REDUCE_HADD

    def __call__(self, env: Env, s: np.ndarray, x: np.ndarray, dt: np.ndarray, A: Any, B: np.ndarray,
                 C: np.ndarray) -> np.ndarray:
        return ssm_scan_heads(s, x, dt, self.dense(A), B, C, self.lanes, self.hadd)

    def record(self, tape: Tape, args: list[Any]) -> np.ndarray | None:
        """Mamba-2's scan on the tape: every y then the final states, one arena array (as ggml's); its 4-D
        operands go as 3-D rows (sequences and the next dim merged), made 4-D again by play."""
        s, x, dt, A, B, C = args[0], args[1], args[2], self.dense(args[3]).reshape(-1), args[4], args[5]
        if not _rows_of(s, x, dt, A, B, C) or x.ndim != 4 or dt.ndim != 3 or B.ndim != 4 or C.shape != B.shape:
            return None
        s4 = s.reshape(x.shape[0], x.shape[2], x.shape[3], B.shape[3])
        out, y, st = _result_with_states(tape, (x.size + s4.size,), x.shape, s4.shape)
        as3 = [a.reshape((-1,) + a.shape[2:]) for a in (s4, x, B, C, y, st)]
        ops = (*(tape.ref("f3", a) for a in as3[:2]), tape.ref("f3", dt), tape.ref("f1", A),
               *(tape.ref("f3", a) for a in as3[2:]), x.shape[0], int(self.hadd))
        kernel_args = (s4, x, dt, A, B, C, y, st, simd.lanes(self.lanes), self.hadd)
        return out if tape.emit(T.SCAN_HEADS, ssm_scan_heads_kernel(), kernel_args, ops) else None


@kernel("rwkv_wkv6")
def _rwkv_wkv6(n: Node, memo: threading.local, path: IsaPath) -> Callable[..., Any]:
    return _Wkv6()


class _Wkv6:
    def __init__(self) -> None:
        self.first = _dense_kept()

    def __call__(self, env: Env, k: np.ndarray, v: np.ndarray, r: np.ndarray, tf: Any, td: np.ndarray,
                 state: np.ndarray) -> np.ndarray:
        return rwkv_wkv6(k, v, r, self.first(tf), td, state)

    def record(self, tape: Tape, args: list[Any]) -> np.ndarray | None:
        """wkv6 on the tape: its result, the outputs then the final states, one arena array (as ggml's)."""
        k, v, r, tf, td, state = args[0], args[1], args[2], self.first(args[3]), args[4], args[5]
        if not _rows_of(k, v, r, tf, td, state) or tf.ndim != 2:
            return None
        n_head, hs = tf.shape
        k, v, r, td = (a.reshape(-1, n_head, hs) for a in (k, v, r, td))
        n_seqs = state.shape[0]
        out, y, st = _result_with_states(tape, (k.shape[0] + hs * n_seqs, n_head * hs), k.shape,
                                         (n_seqs * n_head, hs, hs))
        s0 = state.reshape(n_seqs * n_head, hs, hs)
        args4 = (k, v, r, tf, td, s0.reshape(n_seqs, n_head, hs, hs), y, st.reshape(n_seqs, n_head, hs, hs))
        ops = (*(tape.ref("f3", a) for a in (k, v, r)), tape.ref("f2", tf), tape.ref("f3", td), tape.ref("f3", s0),
               tape.ref("f3", y), tape.ref("f3", st), n_seqs)
        return out if tape.emit(T.WKV6, wkv6_kernel(), args4, ops) else None


@kernel("gated_delta_net")
def _gated_delta_net(n: Node, memo: threading.local, path: IsaPath) -> Callable[..., Any]:
    hadd = path.reduce == REDUCE_HADD
    return lambda env, q, k, v, g, beta, s: gated_delta_net(q, k, v, g, beta, s, path.lanes, hadd)


_MATRIX_OPS = ("mul_mat", "mul_mat_id", "get_rows")  # their first operand may stay a QWeight


def _step(n: Node, memo: threading.local, path: IsaPath) -> Callable[..., Any]:
    make = KERNELS.get(n.op)
    if make is None:
        raise NotImplementedError(f"the numba backend has no kernel for op '{n.op}' (node {n.name})")
    return make(n, memo, path)


_as_it_is = _Window(lambda env: lambda x: x)


Readers = dict[int, list[tuple[Node, int]]]   # id of a node -> the nodes reading it, with the operand slot


def _readers(graph: Graph) -> Readers:
    readers: Readers = {}
    for n in graph.nodes:
        for slot, x in enumerate(n.inputs):
            readers.setdefault(id(x), []).append((n, slot))
    return readers


def _read_only_by(readers: Readers, n: Node, op: str, slot: int) -> bool:
    return [(r.op, s) for r, s in readers.get(id(n), [])] == [(op, slot)]


def _contiguous_for_mul_mat_only(graph: Graph, readers: Readers, keep: set[int], index: dict[int, int]) -> set[int]:
    """The f16 cont steps whose value only a mul_mat reads, as its first operand: mul_mat takes any layout (a
    copy where its kernels need rows, reading a permuted V cache in place where they do not), so these pass
    their operand through instead of copying it. The value is the same array element for element."""
    return {index[id(n)] for n in graph.nodes
            if n.op == "cont" and n.dtype == "f16" and index[id(n)] not in keep
            and _read_only_by(readers, n, "mul_mat", 0)}


Step = tuple[Callable[..., Any], int, tuple[int, ...], tuple[int, ...]]   # kernel, output slot, operands, freed
# a chain of steps run as one: its profile label, its nodes (the last one's value is what it makes), and what makes
# the one step (its kernel and operand slots) from the chain's steps
Chain = tuple[str, tuple[Node, ...], Callable[[list[Step]], tuple[Callable[..., Any], tuple[int, ...]]]]


def _attention_chains(graph: Graph, readers: Readers, keep: set[int], index: dict[int, int],
                      memo: threading.local, path: IsaPath) -> list[Chain]:
    """The (kq, soft_max, kqv) chains kernels.attention computes as one: mul_mat of an f16 K with q, soft_max of
    it with a mask and nothing else (no sinks, no ALiBi), mul_mat of an f16 V with that; kq and the
    probabilities read by nothing else and not outputs."""
    def make(sm: Node) -> Callable[[list[Step]], tuple[Callable[..., Any], tuple[int, ...]]]:
        def steps_to_one(steps: list[Step]) -> tuple[Callable[..., Any], tuple[int, ...]]:
            (fk, _, (k, q), _), (fs, _, (_, mask), _), (fv, _, (v, _), _) = steps
            return _Attention(sm, fk, fs, fv, memo, path), (k, q, mask, v)
        return steps_to_one

    chains: list[Chain] = []
    for kqv in graph.nodes:
        sm = kqv.inputs[1] if kqv.op == "mul_mat" else None
        if sm is None or sm.op != "soft_max" or len(sm.inputs) != 2 or sm.attrs["max_bias"] != 0:
            continue
        kq = sm.inputs[0]
        if kq.op != "mul_mat" or kq.inputs[0].dtype != "f16" or kqv.inputs[0].dtype != "f16" \
                or index[id(kq)] in keep or index[id(sm)] in keep \
                or not _read_only_by(readers, kq, "soft_max", 0) or not _read_only_by(readers, sm, "mul_mat", 1):
            continue
        chains.append(("attention", (kq, sm, kqv), make(sm)))
    return chains


def _norm_weight_chains(graph: Graph, readers: Readers, keep: set[int], index: dict[int, int]) -> list[Chain]:
    """rms_norm then mul by a weight row (a norm's scale), the rms_norm read by nothing else: one step,
    kernels.norm's rms_norm with the weight, which rounds x * scale and then * w as the two steps do."""
    def make(eps: float) -> Callable[[list[Step]], tuple[Callable[..., Any], tuple[int, ...]]]:
        def steps_to_one(steps: list[Step]) -> tuple[Callable[..., Any], tuple[int, ...]]:
            (fn, _, (x,), _), (fm, _, (_, w), _) = steps

            return _RmsNormWeighted(eps, fn, fm), (x, w)
        return steps_to_one

    chains: list[Chain] = []
    for mul in graph.nodes:
        norm, w = mul.inputs if mul.op == "mul" else (None, None)
        if norm is None or norm.op != "rms_norm" or w.op != "weight" or len(w.shape) != 1 \
                or w.shape[0] != norm.shape[0] or index[id(norm)] in keep or not _read_only_by(readers, norm, "mul", 0):
            continue
        chains.append(("rms_norm*weight", (norm, mul), make(norm.attrs["eps"])))
    return chains


class _RmsNormWeighted:
    """One step for rms_norm then mul by the norm's weight: kernels.norm's rms_norm with the weight where it is a
    float32 row of x's length, else the two steps' kernels in turn."""

    def __init__(self, eps: float, norm_step: Callable[..., Any], mul_step: Callable[..., Any]):
        self.eps, self.norm_step, self.mul_step = eps, norm_step, mul_step

    def __call__(self, env: Env, x: np.ndarray, w: Any) -> np.ndarray:
        if self._takes(w, x.shape):
            return rms_norm(x, self.eps, w)
        return self.mul_step(env, self.norm_step(env, x), w)

    def bind(self, env: Env, known: list[Any], shapes: list[tuple[int, ...]]) -> Callable[..., Any]:
        if not self._takes(known[1], shapes[0]):
            return partial(self, env)
        norm_x = rms_norming(self.eps, known[1], math.prod(shapes[0]))
        return lambda x, w: norm_x(x)

    def record(self, tape: Tape, args: list[Any]) -> np.ndarray | None:
        x, w = args
        if not _rows_of(x) or not self._takes(w, x.shape):
            return None
        rows, out = x.reshape(-1, x.shape[-1]), tape.arena(x.shape)
        o2, eps = out.reshape(rows.shape), F32(self.eps)
        ok = tape.emit(T.NORM, rms_norm_kernel(x.size), (rows, eps, w, o2),
                       (tape.ref("f2", rows), tape.f32(eps), tape.ref("f1r", w), tape.ref("f2", o2)))
        return out if ok else None

    @staticmethod
    def _takes(w: Any, shape: tuple[int, ...]) -> bool:
        return isinstance(w, np.ndarray) and w.ndim == 1 and w.dtype == np.float32 and w.shape[0] == shape[-1]


class _Attention:
    """One step for an attention chain: kernels.attention for one query token, the chain's three kernels in
    turn for anything else; bit-equal either way. A plan that knows the caches' views reads their layouts once."""

    def __init__(self, sm: Node, kq_step: Callable[..., Any], sm_step: Callable[..., Any],
                 kqv_step: Callable[..., Any], memo: threading.local, path: IsaPath):
        self.steps, self.memo, self.path = (kq_step, sm_step, kqv_step), memo, path
        self.scale, self.pad = sm.attrs["scale"], _kv_pad(sm)

    def __call__(self, env: Env, k: np.ndarray, q: np.ndarray, mask: np.ndarray, v: np.ndarray) -> np.ndarray:
        return self._over(attention_over(k, v, self.scale, self.pad, self.path), env, k, q, mask, v)

    def bind(self, env: Env, known: list[Any], shapes: list[tuple[int, ...]]) -> Callable[..., Any]:
        k, _, _, v = known
        if not isinstance(k, np.ndarray) or not isinstance(v, np.ndarray):
            return partial(self, env)
        one_token = len(shapes[1]) == 3 and shapes[1][1] == 1   # q's shape: a decode step's plan
        return partial(self._over, attention_over(k, v, self.scale, self.pad, self.path, one_token), env)

    def record(self, tape: Tape, args: list[Any]) -> np.ndarray | None:
        """One query token's attention on the tape: the cells it reads up to set from the mask before each run."""
        k, q, mask, v = args
        if not all(isinstance(a, np.ndarray) for a in args) or not _rows_of(q, mask) or q.ndim != 3 or q.shape[1] != 1:
            return None
        over = attention_over(k, v, self.scale, self.pad, self.path, True)
        nh, n_kv = q.shape[0], k.shape[1]
        m, mrows, _ = attention_mask(_broadcast(mask, (nh, 1, n_kv)), nh, n_kv)
        if over is None or not over.takes(q, mrows) or not np.shares_memory(m, mask):  # type: ignore[attr-defined]
            return None
        key = ("live", id(mask), mrows, n_kv)
        live = tape.memo.get(key)
        if live is None:
            live = tape.memo[key] = tape.reg()

            def cells(r: int = live) -> None:
                tape.table()[1][r] = min(open_prefix(m[:mrows]), n_kv)

            tape.before.append(cells)
        kq, out = tape.arena((nh, 1, n_kv)), tape.arena((nh, 1, v.shape[1]))
        kernel, a = over.call(q, m, mrows, 0, kq, out)  # type: ignore[attr-defined]
        if not np.shares_memory(a[6], q):
            return None
        ref = tape.ref
        ops = (a[0], a[1], ref("u16r", a[2]), a[3], a[4], a[5], ref("f2", a[6]), a[7], a[8], a[9], ref("f2", a[10]),
               a[11], live, tape.f32(a[13]), a[14], ref("u16r", a[15]), a[16], a[17], a[18], a[19], ref("f3", a[20]),
               ref("f3", a[21]))
        return out if tape.emit(T.ATTEND, kernel, a, ops) else None

    def _over(self, over: Callable[..., np.ndarray | None] | None, env: Env, k: np.ndarray, q: np.ndarray,
              mask: np.ndarray, v: np.ndarray) -> np.ndarray:
        if over is not None and q.ndim == 3 and q.shape[1] == 1:
            key = ("attention mask", id(mask), q.shape[0], k.shape[1])  # the same for every layer of a run
            kept = self.memo.d.get(key)                 # (the mask kept with its rows: its id stays its own)
            if kept is None:
                kept = self.memo.d[key] = mask, attention_mask(_broadcast(mask, (q.shape[0], 1, k.shape[1])), *key[2:])
            rows = kept[1]
            y = over(q, *rows)
            if y is not None:
                return y
        kq_step, sm_step, kqv_step = self.steps
        n_kv = k.shape[-2]
        if mask.shape[-1] == n_kv == v.shape[-1]:   # the three over the cells up to the last one the mask opens
            key = ("open prefix", id(mask))
            kept = self.memo.d.get(key)
            if kept is None:
                kept = self.memo.d[key] = mask, max(-(-open_prefix(mask) // 64) * 64, 64)
            if kept[1] < n_kv:
                k, v, mask = k[..., :kept[1], :], v[..., :kept[1]], mask[..., :kept[1]]
        return kqv_step(env, v, sm_step(env, kq_step(env, k, q), mask))


_IN_PLACE = frozenset({"set_rows"})  # ops whose value is their first operand, written in place
_DTYPES = {"f32": np.float32, "i32": np.int64, "i64": np.int64}   # of the values a tape's arena holds (ids and
# positions as int64, what the tape's kernels take: a feed is copied in, and Python steps read the feed itself)


def _before_tape(tape: Tape, arrays: list[np.ndarray], *feeds: np.ndarray) -> None:
    """A taped plan's first step: this run's feeds copied into the arena, then what the tape derives from them."""
    for dst, x in zip(arrays, feeds):
        dst[...] = x.reshape(dst.shape)
    for f in tape.before:
        f()


def _into(dst: np.ndarray, fn: Callable[..., Any], *args: Any) -> Any:
    """fn's value, also written into dst (a tape's arena array, which recorded steps read; of its size)."""
    y = fn(*args)
    dst[...] = np.reshape(y, dst.shape)
    return y


_PLANS = 16                          # plans a Program keeps: shape classes (ubatch sizes, n_kv) by held buffers


class Plan(NamedTuple):
    """A Program's steps for one binding of the dims: the values known before the run, by slot (weights, held
    buffers, windows of them, a tape's arena), the feeds by slot, and the steps, each a function of its operands
    alone (a step of out slot -1 makes no value: it plays a tape's instructions, or copies feeds in first)."""
    known: list[tuple[int, Any]]
    feeds: list[tuple[int, str]]
    steps: list[tuple[Callable[..., Any], int, tuple[int, ...], tuple[int, ...]]]
    labels: dict[int, str]
    run: Callable[[Mapping[str, np.ndarray]], dict[str, np.ndarray]] | None  # the steps as one function of the feeds
    lock: threading.Lock | None        # a plan with a tape: its arena serves one run at a time
    tapes: bool                        # made without the tape it would have: its next run makes it with one
    copied: frozenset[str]             # the outputs a run copies out: a tape's (the next run writes over its
                                       # arena), not a memory's buffers written in place


def _straight_line(steps: list[Step], known: dict[int, Any], feeds: list[tuple[int, str]], outputs: dict[str, int],
                   copied: frozenset[str]) -> Callable[[Mapping[str, np.ndarray]], dict[str, np.ndarray]]:
    """The steps as one Python function of the feeds, a call per step on local variables (v<slot>; a value known
    before the run is a constant, k<slot>), each deleted after its last reader: what a run does, without the
    interpreting loop's indexing and bookkeeping around every step. Its source is kept as ``run.source``."""
    local = {out for _, out, _, _ in steps if out >= 0} | {i for i, _ in feeds}
    names = {j: (f"v{j}" if j in local else f"k{j}") for j in set(known) | local}
    space: dict[str, Any] = {f"k{j}": v for j, v in known.items() if j not in local}
    lines = ["def run(feeds):"] + [f"    v{i} = feeds[{name!r}]" for i, name in feeds]
    gone: set[int] = set()
    for s, (fn, out, ins, free) in enumerate(steps):
        space[f"f{s}"] = fn
        lines.append(f"    {f'v{out} = ' if out >= 0 else ''}f{s}({', '.join(names[j] for j in ins)})")
        dead = [j for j in free if j in local and j not in gone]
        gone.update(dead)
        if dead:
            lines.append("    del " + ", ".join(names[j] for j in dead))
    lines.append("    return {" + ", ".join(f"{role!r}: {names[i]}{'.copy()' if role in copied else ''}"
                                       for role, i in outputs.items()) + "}")
    source = "\n".join(lines) + "\n"
    code = _compiled(source)
    run = FunctionType(code, space, "run")
    run.source = source  # type: ignore[attr-defined]
    return run


@lru_cache(maxsize=64)
def _compiled(source: str) -> CodeType:
    """A plan's function compiled once per text: plans of another context or of weights alike (same steps, same
    slots) share it, each with its own functions and constants; compiling takes ~15 ms for a 30-layer decoder."""
    module = compile(source, "<graphir plan>", "exec")
    return next(c for c in module.co_consts if isinstance(c, CodeType))


class Program:
    """A graph ready to run: steps in topological order, leaves bound to weights or to named feeds. Each binding
    of the dims it runs with gets a plan (Plan), made at its first run and kept."""

    def __init__(self, graph: Graph, weights: Callable[..., Any], path: IsaPath):
        index = {id(n): i for i, n in enumerate(graph.nodes)}
        last_use = {i: i for i in range(len(graph.nodes))}
        for i, n in enumerate(graph.nodes):
            for x in n.inputs:
                last_use[index[id(x)]] = i
        keep = {index[id(n)] for n in graph.outputs.values()}
        self.n_slots = len(graph.nodes)
        self.path = path
        self.memo = threading.local()
        self.consts: list[tuple[int, Any]] = []
        self.feeds: list[tuple[int, str]] = []
        self.steps: list[tuple[Callable[..., np.ndarray], int, tuple[int, ...], tuple[int, ...]]] = []
        matrix_use = {id(x) for n in graph.nodes if n.op in _MATRIX_OPS for x in n.inputs[:1]}
        other_use = {id(x) for n in graph.nodes if n.op not in _MATRIX_OPS for x in n.inputs}
        stacked = {id(n.inputs[0]) for n in graph.nodes if n.op == "mul_mat_id"} - other_use  # experts, as rows
        readers = _readers(graph)
        in_place = _contiguous_for_mul_mat_only(graph, readers, keep, index)
        for i, n in enumerate(graph.nodes):
            free = tuple(sorted({index[id(x)] for x in n.inputs  # values whose last reader this step is
                                 if last_use[index[id(x)]] == i and index[id(x)] not in keep}))
            if i in in_place:
                self.steps.append((_as_it_is, i, (index[id(n.inputs[0])],), free))
            elif n.op == "weight":
                w = weights(n.name, stacked=True) if id(n) in stacked else weights(n.name)
                if id(n) in other_use or id(n) not in matrix_use:  # viewed or reshaped (BERT's type row): dense
                    w = _dense(w)
                self.consts.append((i, w))
            elif n.op == "input":
                self.feeds.append((i, n.name))
            else:
                self.steps.append((_step(n, self.memo, path), i, tuple(index[id(x)] for x in n.inputs), free))
        self._fuse_siblings(graph, path)
        self.plain_steps = list(self.steps)  # one step per node: what a run with taps takes
        self.labels: dict[int, str] = {}     # a fused step's name in the profile, by its output slot
        chains = (_attention_chains(graph, readers, keep, index, self.memo, path)
                  + _norm_weight_chains(graph, readers, keep, index))
        self._fuse(chains, index)
        self.outputs = {role: index[id(n)] for role, n in graph.outputs.items()}
        self.names = [n.name for n in graph.nodes]
        self.shapes = [n.shape for n in graph.nodes]
        self.ops = [n.op for n in graph.nodes]
        self.dtypes = [n.dtype for n in graph.nodes]
        self._feed_slots = {i for i, _ in self.feeds}
        self._written = {ins[0] for _, out, ins, _ in self.plain_steps if self.ops[out] in _IN_PLACE}
        self.profile: dict[str, list[float]] | None = None  # set to {}: op -> [seconds, steps] of every run
        self.plans: dict[tuple[Any, ...], Plan] = {}
        self._plans_lock = threading.Lock()

    def _fuse_siblings(self, graph: Graph, path: IsaPath) -> None:
        """Runs of consecutive mul_mat steps whose weights are 2-D QWeights of one type and whose x is the same
        value become one step computing them all (a QWeightGroup) and steps that take their results from the
        run's memo. Consecutive only: nothing can run between them, so x is the same value for all."""
        consts = dict(self.consts)

        def weight_of(step: tuple[Any, int, tuple[int, ...], tuple[int, ...]]) -> QWeight | None:
            _, out, ins, _ = step
            n = graph.nodes[out]
            w = consts.get(ins[0])
            if n.op != "mul_mat" or len(n.inputs[0].shape) != 2 or not isinstance(w, QWeight) \
                    or not QWeightGroup.joins(w):              # f32/f16 weights take _mul_mat's float paths
                return None
            return w

        steps, s = self.steps, 0
        while s < len(steps):
            w0 = weight_of(steps[s])
            e = s + 1
            while w0 is not None and e < len(steps) and (w := weight_of(steps[e])) is not None \
                    and steps[e][2][1] == steps[s][2][1] and w.qtype == w0.qtype:
                e += 1
            if e - s >= 2:
                run = steps[s:e]
                group = QWeightGroup(tuple(consts[st[2][0]] for st in run))
                _, out, ins, free = run[0]
                steps[s] = (_Siblings(self.memo, group, tuple(st[1] for st in run[1:])), out, ins, free)
                for k in range(s + 1, e):
                    _, out, ins, free = steps[k]
                    steps[k] = (_SiblingTake(self.memo, out, path), out, ins, free)
            s = e

    def _fuse(self, chains: list[Chain], index: dict[int, int]) -> None:
        """Each chain's steps become one at the place of its last, which ``make`` gives from the chain's steps
        (its function and operand slots). The values the chain's steps freed are freed there, but for those only
        the chain made."""
        at = {out: pos for pos, (_, out, _, _) in enumerate(self.steps)}
        dropped = set()
        for label, nodes, make in chains:
            steps = [self.steps[at[index[id(n)]]] for n in nodes]
            made = {st[1] for st in steps[:-1]}
            fn, ins = make(steps)
            out = steps[-1][1]
            self.steps[at[out]] = (fn, out, ins, tuple(sorted(set().union(*(st[3] for st in steps)) - made)))
            self.labels[out] = label
            dropped |= {at[i] for i in made}
        self.steps = [st for pos, st in enumerate(self.steps) if pos not in dropped]

    def run(self, env: Env, feeds: Mapping[str, np.ndarray], taps: dict[str, np.ndarray] | None = None,
            held: Mapping[str, np.ndarray] | None = None,
            plans: dict[tuple[Any, ...], Plan] | None = None) -> dict[str, np.ndarray]:
        """Outputs by role. ``held``: inputs that stay the same arrays from run to run (a memory's buffers), which
        the plan for these dims may view once instead of every run; ``plans``: where the plans that keep them are
        kept, owned by the caller that owns the buffers (a context), so that they go with it (default: the
        program's own). With ``taps`` (a dict), every computed value is also copied into it by node name, like
        llama.cpp's eval callback: the way to compare engines node by node."""
        with kernel_launches():
            return self._run(self._plan(env, held or {}, taps is None, self.plans if plans is None else plans), env,
                             feeds, taps)

    def _plan(self, env: Env, held: Mapping[str, np.ndarray], fused: bool, plans: dict[tuple[Any, ...], Plan]) -> Plan:
        key = (fused, tuple(sorted(env.items())), tuple(map(id, held.values())))
        plan = plans.get(key)
        if plan is None or plan.tapes:
            # a plan's first run goes without its tape, which takes longer to make than a run takes: a binding
            # run once (a prompt or a sentence of its own length) never pays for one
            plan = self._make_plan(env, held, fused, taping=plan is not None)
            with self._plans_lock:
                while key not in plans and len(plans) >= _PLANS:
                    del plans[next(iter(plans))]
                plans[key] = plan
        return plan

    def _make_plan(self, env: Env, held: Mapping[str, np.ndarray], fused: bool, taping: bool = True) -> Plan:
        """The steps bound to one binding of the dims: windows bound to their geometry, and computed here where
        their operand is known before the run (a weight, a held buffer, a window of one; set_rows writes its held
        buffer in place, so its value is known too); a step that can use known operands bound to them. A small
        graph's steps go on a tape where they can (backends.numba.tape): their values in its arena, known here. Without
        ``tape``, a plan that would have one says so (``tapes``), to be made again with it."""
        known: dict[int, Any] = dict(self.consts)
        feeds = []
        for i, name in self.feeds:
            if name in held:
                known[i] = held[name]
            else:
                feeds.append((i, name))
        small = fused and self._values_bytes(env) <= T.ARENA_MAX
        tape = Tape(self.path.lanes) if small and taping else None
        fed: dict[int, np.ndarray] = {}   # feeds a tape reads: the arena array each run's feed is copied into
        copies: dict[int, np.ndarray] = {}  # values of Python steps a tape reads: the arena array each is copied into
        steps: list[Step] = []

        def add(fn: Callable[..., Any], out: int, ins: tuple[int, ...], free: tuple[int, ...]) -> None:
            """One step of the graph into the plan: a window made here, an instruction on the tape, or a step."""
            if isinstance(fn, _Window):
                window = fn.at(env)
                x = known.get(ins[0])
                if fused and isinstance(x, np.ndarray):
                    y = window(x)
                    if y.size == 0 or np.may_share_memory(x, y):  # not a copy (numpy copies some reshapes of
                        # strided arrays); an empty view (a one-token batch's previous tokens) shares nothing
                        if tape is not None and x.flags.writeable:  # a tape's kernels take writable rows
                            y.flags.writeable = True
                        known[out] = y
                        return
                steps.append((window, out, ins, free))
                return
            if self.ops[out] in _IN_PLACE and ins[0] in known:
                known[out] = known[ins[0]]
            record = getattr(fn, "record", None) if tape is not None else None
            if record is not None:
                tape.label = self.labels.get(out, self.ops[out])  # type: ignore[union-attr]
                new: dict[int, np.ndarray] = {}
                args = [self._in_arena(j, env, known, fed, copies, new, tape) for j in ins]  # type: ignore[arg-type]
                y = record(tape, args) if all(a is not None for a in args) else None
                if y is not None:
                    known[out] = y
                    for j, a in new.items():   # from now on copied each run
                        if j in self._feed_slots:
                            fed[j] = a
                        else:
                            copies[j] = a
                            k = next(k for k in range(len(steps) - 1, -1, -1) if steps[k][1] == j)
                            fn_j, _, ins_j, free_j = steps[k]
                            steps[k] = (partial(_into, a, fn_j), j, ins_j, free_j)
                    return
            if tape is not None and tape.pending:
                steps.append((tape.segment(), -1, (), ()))
            if tape is not None and self.ops[out] in _IN_PLACE and isinstance(known.get(ins[0]), np.ndarray):
                tape.writes_rows(known[ins[0]], None)   # a buffer written from Python
            bind = getattr(fn, "bind", None) if fused else None
            steps.append((partial(fn, env) if bind is None else bind(env, [known.get(j) for j in ins],
                                                                        [self._shape(j, env) for j in ins]),
                          out, ins, free))

        holding: set[int] = set()   # slots whose value holds its arena storage
        for fn, out, ins, free in (self.steps if fused else self.plain_steps):
            add(fn, out, ins, free)
            if tape is not None:    # liveness: a value's storage goes back to the tape's pool after its last reader
                if out in known and out not in holding:
                    holding.add(out)
                    tape.hold(known[out])
                for j in free:
                    if j in holding:
                        holding.discard(j)
                        tape.release(known[j])
        if tape is not None:
            if tape.pending:
                steps.append((tape.segment(), -1, (), ()))
            place = tape.finish([known[j] for fn, out, ins, _ in steps if out >= 0 for j in ins
                                 if isinstance(known.get(j), np.ndarray)]
                                + [known[i] for i in self.outputs.values() if isinstance(known.get(i), np.ndarray)])
            if place is not None:
                tape.before.append(place)
            if fed or tape.before:
                steps.insert(0, (partial(_before_tape, tape, list(fed.values())), -1, tuple(fed), ()))
        held_ids = {id(a) for a in held.values()}
        copied = frozenset(role for role, i in self.outputs.items()
                           if tape is not None and id(known.get(i)) not in held_ids)
        return Plan(list(known.items()), feeds, steps, self.labels if fused else {},
                    _straight_line(steps, known, feeds, self.outputs, copied) if fused else None,
                    threading.Lock() if tape is not None else None, small and tape is None, copied)

    def _values_bytes(self, env: Env) -> int:
        """The bytes of the values the steps make for this binding (not windows, nor what is written in place)."""
        return sum(4 * math.prod(self._shape(out, env)) for fn, out, _, _ in self.steps
                   if not isinstance(fn, _Window) and self.ops[out] not in _IN_PLACE)

    def _in_arena(self, slot: int, env: Env, known: dict[int, Any], fed: dict[int, np.ndarray],
                  copies: dict[int, np.ndarray], new: dict[int, np.ndarray], tape: Tape) -> Any:
        """A recorded step's operand, known at plan time: as it is where known; else an arena array, into which
        a feed is copied before each run, or the Python step that makes the value copies it as it makes it (added
        to ``new``: the caller makes it so if the step is recorded). Python steps go on reading the values
        themselves (a copy drops a view's layout and soft_max's mark, which choose mul_mat's path). None where
        the value's type has no arena array (the step then runs from Python)."""
        if slot in known:
            return known[slot]
        a = fed.get(slot, copies.get(slot))
        if a is not None:
            return a
        dtype = _DTYPES.get(self.dtypes[slot])
        if dtype is None or slot in self._written or (slot not in self._feed_slots and dtype != F32):
            return None   # a buffer written in place must be the caller's, not a copy of it
        a = new[slot] = tape.arena(self._shape(slot, env), dtype, fresh=True)
        return a

    def _shape(self, slot: int, env: Env) -> tuple[int, ...]:
        """The numpy shape of a slot's value for this binding of the dims, from its node's shape in the graph."""
        return tuple(d.eval(env) if isinstance(d, Sym) else d for d in reversed(self.shapes[slot]))

    def _run(self, plan: Plan, env: Env, feeds: Mapping[str, np.ndarray],
             taps: dict[str, np.ndarray] | None) -> dict[str, np.ndarray]:
        self.memo.d = {}
        if plan.lock is not None:
            with plan.lock:
                return self._run_plan(plan, feeds, taps)
        return self._run_plan(plan, feeds, taps)

    def _run_plan(self, plan: Plan, feeds: Mapping[str, np.ndarray],
                  taps: dict[str, np.ndarray] | None) -> dict[str, np.ndarray]:
        if plan.run is not None and taps is None and self.profile is None:
            return plan.run(feeds)
        vals: list[Any] = [None] * self.n_slots
        for i, v in plan.known:
            vals[i] = v
        for i, name in plan.feeds:
            vals[i] = feeds[name]
        profile, labels = self.profile, plan.labels
        for fn, out, ins, free in plan.steps:
            if profile is not None:
                t0 = time.perf_counter()
            if out < 0:   # a tape's segment times its instructions itself; the feeds' copy is the run's own
                if profile is not None and isinstance(fn, Segment):
                    fn.profiled(profile)
                else:
                    fn(*[vals[j] for j in ins])
                continue
            vals[out] = fn(*[vals[j] for j in ins])
            if profile is not None:
                spent = profile.setdefault(labels.get(out, self.ops[out]), [0.0, 0])
                spent[0] += time.perf_counter() - t0
                spent[1] += 1
            if taps is not None:
                taps[self.names[out]] = np.array(vals[out])
            for j in free:
                vals[j] = None
        return {role: vals[i].copy() if role in plan.copied else vals[i] for role, i in self.outputs.items()}
