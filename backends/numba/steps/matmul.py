"""The matrix product steps: mul_mat of a weight (quantized, F16 or F32) or of two activations, and sibling
products on one x (q, k, v; gate, up) run as one kernel call; with their tape faces."""

from __future__ import annotations

import threading
from functools import partial
from typing import Any, Callable

import numpy as np

from graphir.backends.numba import tape as T
from graphir.backends.numba.kernels.mul_mat import (VEC_F16, VEC_F32, as_rows, f32_short_dots, mul_mat, padding_call,
                                                    product_mode, products_call, short_dots_blocks_par,
                                                    short_dots_blocks_ser)
from graphir.backends.numba.primitives.isa import IsaPath
from graphir.backends.numba.primitives.jit import PAR_MIN
from graphir.backends.numba.quant.weight import QWeight, QWeightGroup, stack_matrices
from graphir.backends.numba.steps.base import F32, Env, Function, Step, kernel, rows_of
from graphir.backends.numba.tape import Tape
from graphir.graph.ir import Node


def matrix_product(w: Any, x: np.ndarray, path: IsaPath, contiguous: bool | None = None) -> np.ndarray:
    """ggml mul_mat: out[..., n, m] = sum_k w[..., m, k] x[..., n, k]; w's batch dims broadcast over x's.
    ``contiguous``: whether ggml sees x contiguous, for a float array w (mul_mat's default otherwise)."""
    if isinstance(w, QWeight):
        x2 = np.ascontiguousarray(x.reshape(-1, x.shape[-1]), dtype=np.float32)
        floats = w.float_rows()
        # f32 and f16 weights: ggml's own float paths (tinyBLAS or vec_dot, in their summation order)
        y = w.matmul(x2) if floats is None else mul_mat(floats, x2, path, pad=1, contiguous=True, weight=True)
        return y.reshape(x.shape[:-1] + (w.rows,))
    return mul_mat(w, x, path, contiguous=contiguous)


class Siblings(Step):
    """The first of consecutive mul_mat steps of 2-D quantized weights on one x (q, k, v; gate, up): it computes
    them all in one kernel call (QWeightGroup, bit-equal to one call each) and leaves the others' results in
    the run's memo under their slots, for _mul_mat_sibling. A plan binds it to the group's product."""

    def __init__(self, memo: threading.local, group: QWeightGroup, later: tuple[int, ...]):
        self.memo, self.group, self.later = memo, group, later

    def __call__(self, env: Env, w: Any, x: np.ndarray) -> np.ndarray:
        return self._first(lambda x2: self.group.matmul(np.ascontiguousarray(x2, dtype=np.float32)), w, x)

    def bind(self, env: Env, known: list[Any], shape: Callable[[int], tuple[int, ...]]) -> Callable[..., Any]:
        return partial(self._first, self.group.product())

    def record(self, tape: Tape, args: list[Any]) -> np.ndarray | None:
        """The group's GEMV on the tape, for one row of x; the others' results left in the tape's memo."""
        x, call = args[1], self.group.gemv_call()
        if call is None or not rows_of(x) or x.size != x.shape[-1]:
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


class SiblingTake(Step):
    """A later step of such a run: its value, made by the first (or computed here if it was not)."""

    def __init__(self, memo: threading.local, slot: int, path: IsaPath):
        self.memo, self.slot, self.path = memo, slot, path

    def __call__(self, env: Env, w: Any, x: np.ndarray) -> np.ndarray:
        y = self.memo.d.pop(self.slot, None)
        return matrix_product(w, x, self.path) if y is None else y

    def record(self, tape: Tape, args: list[Any]) -> np.ndarray | None:
        return tape.memo.pop(("sibling", self.slot), None)


def _record_float_product(tape: Tape, w: QWeight, x: np.ndarray, path: IsaPath) -> np.ndarray | None:
    """An F32 or F16 weight's product on the tape: mul_mat's kernels for it (x padded and, for F16, rounded to
    f16 first; then the products), as _mul_mat calls them."""
    floats = w.float_rows()
    x2 = x.reshape(-1, x.shape[-1])
    (n, k), m, f16 = x2.shape, floats.shape[0], floats.dtype == np.float16
    mode, kind = product_mode(f16, n, k, path.lanes, True, False, m), 2 if f16 else 0
    x1 = x2
    if kind or k % 64:   # once per x and kind: the products of one input (q, k and v) share its rows
        key = ("rows", id(x), kind)
        seen, x1 = tape.memo.get(key, (None, None))
        if seen is not x:   # (the memo keeps x, so its id names no other array meanwhile)
            x1 = tape.arena((n, -(-k // 64) * 64))
            fn, (src, kd, _) = padding_call(x2, kind, x1)
            if not tape.record(T.ROWS, fn, (src, kd, x1)):
                return None
            tape.memo[key] = x, x1
    out = tape.arena((1, n, m))
    if mode == VEC_F16 and n == 1 and k < 4 * path.lanes:   # every product in vec_dot's scalar tail
        blocks = 2 if m % 2 == 0 and m * k >= PAR_MIN else 1        # a block of rows a thread
        wt3 = np.ascontiguousarray(floats.T.reshape(k, blocks, m // blocks).transpose(1, 0, 2), F32)
        x0, o2 = x1.reshape(-1), out.reshape(blocks, m // blocks)
        fn = short_dots_blocks_par if blocks > 1 else short_dots_blocks_ser
        ok = tape.record(T.SHORT_DOTS, fn, (wt3, x0, k, o2))
        return out.reshape(x.shape[:-1] + (m,)) if ok else None
    fn, a = products_call(floats.reshape(1, m, k), x1, n, 1, k, k, 1, mode, path, out)
    if not tape.record(T.PRODUCTS16 if f16 else T.PRODUCTS32, fn, a):
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
        if not tape.record(T.ROWS, fn, (src, kd, x1)):
            return None
        if mode == VEC_F32 and kp < 4 * path.lanes and xa.shape[:2] == (1, 1) and not wa.flags.writeable:
            # one row of x by a weight's rows all scalar tail (a read-only operand is a weight: the tape's values
            # and a memory's buffers are writable), laid out by columns once here
            wt, x0, o0 = np.ascontiguousarray(wa[0].T), x1.reshape(-1), out[a].reshape(-1)
            cut = min(k, kp // (path.lanes // 2) * (path.lanes // 2))
            if not tape.record(T.SHORT_DOTS32, f32_short_dots, (wt, x0, k, cut, o0)):
                return None
            continue
        fn, c = products_call(wa, x1, xsb, xsn, k, kp, xa.shape[0] // wa.shape[0], mode, path, out[a])
        if not tape.record(T.PRODUCTS32, fn, c):
            return None
    return out.reshape(out.shape[4 - r:])


_GEMV_OPS = (T.GEMV2, T.GEMV3, T.GEMVK)   # a layout's parts by kind: the exact kinds' and Q4_K's, the others'


def _gemv_op(packed: tuple[np.ndarray, ...]) -> Any:
    """The GEMV opcode whose kinds a layout's parts are (then x and out, float32 rows); None where none is."""
    return next((op for op in _GEMV_OPS if len(T.OPCODES[op].args) == len(packed) + 2
                 and all(T.fits(kind, a) for kind, a in zip(T.OPCODES[op].args, packed))), None)


def _record_gemv(tape: Tape, gemv: Callable, packed: tuple[np.ndarray, ...], x: np.ndarray, out: np.ndarray) -> bool:
    """A GEMV of packed rows on the tape; False (nothing recorded) where no opcode takes its layout."""
    op = _gemv_op(packed)
    return op is not None and tape.record(op, gemv, (*packed, x, out))


@kernel("mul_mat")
def _mul_mat_kernel(n: Node, memo: threading.local, path: IsaPath) -> Step:
    w, x = n.inputs
    if w.op == "weight" and len(w.shape) == 3:  # a stack of matrices (MLA's per-head k_b, v_b); ggml may take
        # tinyBLAS for float ones where the activations are contiguous (not a permuted or strided view)
        return _StackProduct(path, w.shape[2], _seen_contiguous(x))
    if w.op != "weight" and _weight_values(x):
        # activations' rows by a weight: a patch embedding (ggml_conv_2d, im2col's windows by the kernel). Each output
        # is the dot of a window and a kernel row in ggml's float32 order (kernels.mul_mat: tinyBLAS's where ggml
        # takes it, else ggml_vec_dot_f16/f32's; f16 windows by the kernel rounded to f16, as ggml converts it).
        # ggml sees the kernel contiguous and every window as a row (none padded, as attention's cells): tinyBLAS's
        # choice goes by both
        return Function(lambda env, w, x: mul_mat(w, x, path, pad=1, contiguous=True, weight=True))
    return _Product(path)


def _weight_values(x: Node) -> bool:
    """Whether x is a weight's values as stored: the weight, or a reshape of it."""
    while x.op == "reshape":
        x = x.inputs[0]
    return x.op == "weight"


def _seen_contiguous(x: Node) -> bool:
    """Whether ggml sees x contiguous: not a permutation, and a view only where its strides are a dense array's
    (Gemma 3n's view of all but the first AltUp stream, at an offset)."""
    if x.op in ("permute", "transpose"):
        return False
    if x.op != "view":
        return True
    dense = 1
    for size, stride in zip(x.attrs["shape"], x.attrs["strides"]):
        if stride != dense:
            return False
        dense = dense * size
    return True


class _StackProduct(Step):
    """mul_mat of a stack of ``n`` matrices [k, m, n] (MLA's per-head k_b and v_b) by x [k, t, n * r], matrix i
    by x's batches i * r .. (i + 1) * r - 1 (ggml's broadcast). Float matrices as a product of float arrays
    (``contiguous``: whether ggml sees x contiguous, which may give tinyBLAS its path); quantized ones as ggml
    multiplies a matrix it does not repack: x's rows quantized to the type's activation format, then its
    vec_dot order (each matrix a QWeight of its own, quant.weight.stack_matrices)."""

    def __init__(self, path: IsaPath, n: int, contiguous: bool):
        self.path, self.n, self.contiguous = path, n, contiguous

    def __call__(self, env: Env, w: Any, x: np.ndarray) -> np.ndarray:
        floats = self._floats(w)
        if floats is not None:
            return mul_mat(floats, x, self.path, contiguous=self.contiguous)
        matrices, x3 = self._operands(w, x)
        out = np.empty(x3.shape[:-1] + (matrices[0].rows,), F32)
        r = x3.shape[0] // self.n
        for b in range(x3.shape[0]):
            matrices[b // r].matmul(np.ascontiguousarray(x3[b], dtype=F32), out[b])
        return out.reshape(x.shape[:-1] + (out.shape[-1],))

    def record(self, tape: Tape, args: list[Any]) -> np.ndarray | None:
        """Float matrices as _record_activation_product; quantized ones of an exact kind as one GEMV a batch of
        x, where x is rows (not a permuted view)."""
        w, x = args
        floats = self._floats(w)
        if floats is not None:
            return _record_activation_product(tape, floats, x, self.path, self.contiguous)
        if not rows_of(x):
            return None
        matrices, x3 = self._operands(w, x)
        calls = [m.gemv_call() for m in matrices]
        if any(c is None or _gemv_op(c[1]) is None for c in calls):
            return None
        out = tape.arena(x3.shape[:-1] + (matrices[0].rows,))
        r = x3.shape[0] // self.n
        for b in range(x3.shape[0]):
            if not _record_gemv(tape, *calls[b // r], x3[b], out[b]):  # type: ignore[misc]
                return None
        return out.reshape(x.shape[:-1] + (out.shape[-1],))

    def _floats(self, w: Any) -> np.ndarray | None:
        """The stack as a float array (n, m, k) (F32 or F16 as stored); None for a quantized one."""
        if isinstance(w, np.ndarray):
            return w
        floats = w.float_rows()
        return None if floats is None else floats.reshape(self.n, -1, floats.shape[-1])

    def _operands(self, w: QWeight, x: np.ndarray) -> tuple[list[QWeight], np.ndarray]:
        """The stack's matrices, and x as (batches, t, k), a multiple of n batches."""
        x3 = x.reshape((-1,) + x.shape[-2:])
        if x3.shape[0] % self.n:
            raise ValueError(f"mul_mat: cannot broadcast a stack of {self.n} matrices over {x.shape}")
        return stack_matrices(w, self.n), x3


class _Product(Step):
    """mul_mat of a 2-D weight by x; a plan binds it to a quantized weight's own product (QWeight.product)."""

    def __init__(self, path: IsaPath):
        self.path = path

    def __call__(self, env: Env, w: Any, x: np.ndarray) -> np.ndarray:
        return matrix_product(w, x, self.path)

    def bind(self, env: Env, known: list[Any], shape: Callable[[int], tuple[int, ...]]) -> Callable[..., Any]:
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
        if isinstance(w, QWeight) and w.float_rows() is not None and rows_of(x):
            return _record_float_product(tape, w, x, self.path)
        call = w.gemv_call() if isinstance(w, QWeight) else None
        if call is None or not rows_of(x):
            return None
        x2 = x.reshape(-1, x.shape[-1])
        out = tape.arena((x2.shape[0], w.rows))
        if not _record_gemv(tape, *call, x2, out):
            return None
        return out if x.ndim == 2 else out.reshape(x.shape[:-1] + (w.rows,))
