"""One query token's attention in one kernel: KQ, soft_max and KQV head by head, the way a decode step runs them.

Apart, the three are a mul_mat of the f16 K cache with q, a soft_max over the KV cells and a mul_mat of the
permuted f16 V cache with the probabilities: three launches and two values in between, per layer and token.
Here each head takes the same helpers in the same order (products_task's vec_dot_f16 rows, soft_max_row,
to_f32_row's rounding to f16, column_dots), so the result is bit for bit the three kernels'; only the launches
and the values in between are gone. attention_over() reads the caches' layouts once (a planned graph keeps the
function while the cache views stay); it and attend() say None where their case does not hold (more than one
token, a layout it does not read in place), and the caller runs the three kernels.
"""

from __future__ import annotations

import functools
from typing import Callable

import numpy as np
from numba import njit, prange

from graphir.backends.numba.primitives import isa
from graphir.backends.numba.primitives import simd
from graphir.backends.numba.primitives.jit import PAR, SER, call_at, native_address
from graphir.backends.numba.kernels.mul_mat import (VEC_F16, as_rows, column_dots, kernel_view,
                                                    task_addresses, to_f32_row, transposed_rows,
                                                    whole_register_dots)
from graphir.backends.numba.kernels.softmax import exp_head, mask_rows, soft_max_row

F32 = np.float32
# products_task's constant arguments as numpy integers: numba types a literal 0 or 1 as a literal, and products_task
# is compiled for int64 arguments (mul_mat.task_addresses)
_ZERO, _ONE, _VEC_F16 = np.int64(0), np.int64(1), np.int64(VEC_F16)


@functools.cache
def _head_kernel(n_lanes: int, hadd: bool, variant: int) -> Callable:
    """The kernel of one head for registers of n_lanes, ggml's horizontal sums (hadd) or not and expf ``variant``:
    constants of the kernel, so that the branches of the other paths are gone before LLVM optimizes it (as
    arguments, every path was compiled; the first call took 6.6 s)."""
    lanes, v_ = n_lanes, simd.lanes(n_lanes)

    @njit(**SER)
    def attend_head(kw, ldk, ksb, ksm, q1, ldq, qsb, d, ratio, mask, mrows, live, scale, head, vw, vsb, vsc, kpv, ldp,
                    kq, out, task_at, h):
        """Head h: kq[h, 0] = its KQ row (mul_mat's VEC_F16 path, n = 1), then soft_max of it into p, p rounded to
        f16 and padded (ggml's conversion of src1), then out[h, 0] = the V columns against it (column_dots). Cells
        from ``live`` on are masked: their products would only be added to -inf, and their probabilities are 0,
        whose products leave column_dots' sums as they are, so neither is computed. task_at: products_task's
        address (mul_mat.task_addresses), compiled apart: a prompt's products take it too."""
        v = v_
        n_kv = kq.shape[2]
        simd_kq = d // (4 * lanes) * (4 * lanes)
        if simd_kq == d and hadd == (lanes == 8):
            whole_register_dots(v, kw, (h // ratio) * ksb * ldk, ksm * ldk, q1, h * qsb * ldq, d, live, kq[h, 0])
        else:
            call_at(task_at, (v, kw, ldk, q1, ldq, d, d, (h // ratio) * ksb, ksm, h * qsb, _ONE, hadd, _VEC_F16,
                              simd_kq, h, _ZERO, _ONE, _ZERO, live, kq))
        kq[h, 0, live:] = 0.0
        w = np.empty(max(head, n_kv), F32)
        p = np.empty(n_kv, F32)
        soft_max_row(kq[h, 0], mask[h % mrows], scale, F32(1.0), head, lanes, variant, w, p, F32(0.0), False)
        x = np.empty(ldp, F32)
        to_f32_row(p, 2, x)
        column_dots(v, vw, (h // ratio) * vsb, vsc, x, 0, live, kpv, hadd, out[h, 0])

    return attend_head


@njit(**PAR)
def _attend(head_at, task_at, kw, ldk, ksb, ksm, q, qsb, d, ratio, mask, mrows, live, scale, head, vw, vsb, vsc, kpv,
            ldp, kq, out):
    """The kernel of every head, in parallel. It rounds q to f16 itself (ggml's conversion of src1), rows padded to
    64, where a second kernel launch did. The head's work is called at its native address (jit.call_at): called by
    name from a prange body it compiled several times over (this kernel's first call took 21.7 s; the head alone
    compiles in 6 s, then this in 1.5 s). Its index is cast: numba types a prange index int64 when it infers the
    loop and uint64 when it lowers it. Parallel only: a first token's few cells take one launch too, and a serial
    copy would compile again."""
    ldq = (q.shape[1] + 63) // 64 * 64
    q1 = np.empty((q.shape[0], ldq), F32)
    for r in range(q.shape[0]):
        to_f32_row(q[r], 2, q1[r])
    qf = q1.reshape(-1)
    for h in prange(out.shape[0]):
        call_at(head_at, (kw, ldk, ksb, ksm, qf, ldq, qsb, d, ratio, mask, mrows, live, scale, head, vw, vsb, vsc, kpv,
                          ldp, kq, out, task_at, np.int64(h)))


@functools.cache
def _head_at(n_lanes: int, hadd: bool, variant: int) -> tuple[int, int]:
    """The head kernel's native address for the argument types _attend passes it (stand-ins of each); looked up at
    the first call or by a one-token plan (attention_over's ``ahead``), not by every plan that reads the caches'
    layouts: a prompt's plan does too, and never calls it. With it, products_task's (which it calls), compiled
    first: a prompt's products in another process then find it in the cache."""
    task_at = task_addresses(n_lanes, np.dtype(np.uint16), hadd, False)[0]
    caches, rows, cube = kernel_view(np.zeros(1, np.float16)), np.empty((1, 1), F32), np.empty((1, 1, 1), F32)
    return native_address(_head_kernel(n_lanes, hadd, variant), caches, 0, 0, 0, rows[0], 0, 0, 0, 0, rows, 0, 0,
                          F32(0), 0, caches, 0, 0, 0, 0, cube, cube, 0, 0), task_at


def attention_over(k: np.ndarray, vt: np.ndarray, scale: float, pad: int, path: isa.IsaPath,
                   ahead: bool = False) -> Callable[[np.ndarray, np.ndarray, int, int], np.ndarray | None] | None:
    """The attention of one query token over the f16 caches k (n_head_kv, n_kv, d) and vt (n_head_kv, d_v, n_kv)
    (vt the V cache seen transposed, read in place), with their layouts read once: a function of q (n_head, 1, d)
    and the mask's rows (attention_mask) giving mul_mat(vt, soft_max(mul_mat(k, q), mask, scale) with KV padding
    ``pad``), or None for a q it does not take. None where k and vt are not this kernel's case. ``ahead``: the
    head's kernel is compiled (or loaded) now, where it would be at the first call: a plan for one query token,
    which will call it, gets its largest kernel ready before the others."""
    if k.ndim != 3 or vt.ndim != 3 or k.dtype != np.float16 or vt.dtype != np.float16 or vt.flags.c_contiguous \
            or vt.shape[0] != k.shape[0] or vt.shape[2] != k.shape[1]:
        return None
    cols = transposed_rows(vt)
    if cols is None:
        return None
    n_head_kv, n_kv, d = k.shape
    krows, ksb, ksm = as_rows(k)
    kflat, vflat, vsb, vsc = kernel_view(krows.reshape(-1)), *cols
    lanes, hadd = path.lanes, path.reduce == isa.REDUCE_HADD
    head, kpv = exp_head(n_kv, lanes, pad), -(-n_kv // pad) * pad
    scale32, ldp, d_v = F32(scale), -(-n_kv // 64) * 64, vt.shape[1]
    if ahead:
        _head_at(lanes, hadd, path.expf)

    def call(q: np.ndarray, m: np.ndarray, mrows: int, live: int, kq: np.ndarray | None = None,
             out: np.ndarray | None = None) -> tuple[Callable, tuple]:
        """The kernel and its arguments for q (the result in the last: ``out``, made here unless given)."""
        n_head = q.shape[0]
        qrows, qsb, _ = as_rows(q.astype(F32, copy=False))
        kq = np.empty((n_head, 1, n_kv), F32) if kq is None else kq
        out = np.empty((n_head, 1, d_v), F32) if out is None else out
        return _attend, (*_head_at(lanes, hadd, path.expf), kflat, krows.shape[1], ksb, ksm, qrows, qsb, d,
                         n_head // n_head_kv, m, mrows, min(live, n_kv), scale32, head, vflat, vsb, vsc, kpv, ldp, kq,
                         out)

    def attention(q: np.ndarray, m: np.ndarray, mrows: int, live: int) -> np.ndarray | None:
        if not takes(q, mrows):
            return None
        kernel, args = call(q, m, mrows, live)
        kernel(*args)
        return args[-1]

    def takes(q: np.ndarray | tuple[int, ...], mrows: int) -> bool:
        """Whether q (or its shape) and a mask of mrows rows are this kernel's case."""
        shape = q if isinstance(q, tuple) else q.shape
        return len(shape) == 3 and shape[1] == 1 and shape[2] == d and shape[0] % n_head_kv == 0 and mrows != 0

    attention.call, attention.takes = call, takes  # type: ignore[attr-defined]
    return attention


def attention_mask(mask: np.ndarray, n_head: int, n_kv: int) -> tuple[np.ndarray, int, int]:
    """The mask as the float32 rows attention_over's function reads, how many (0: none it can read), and the cells
    up to the last one a row lets through (llama.cpp's padding masks those past the used ones)."""
    m, mrows = mask_rows(mask, (n_head, 1, n_kv))
    return m, mrows, open_prefix(m[:mrows])


def open_prefix(mask: np.ndarray) -> int:
    """The cells (the mask's last axis) up to the last one some row lets through: past it every row is -inf, as
    llama.cpp's padding of n_kv is. There a query's products only meet -inf and its probabilities are 0, which
    leave every sum over the cells as it is; so attention over this prefix alone gives the same bits."""
    rows = mask.reshape(-1, mask.shape[-1])
    cells = np.flatnonzero((rows != -np.inf).any(axis=0))
    return int(cells[-1]) + 1 if len(cells) else 0


def attend(k: np.ndarray, q: np.ndarray, mask: np.ndarray, vt: np.ndarray, scale: float, pad: int,
           path: isa.IsaPath) -> np.ndarray | None:
    """attention_over(k, vt, ...) applied to q and the mask at once; None where that is not this kernel's case."""
    over = attention_over(k, vt, scale, pad, path)
    if over is None or q.ndim != 3 or q.shape[1] != 1:
        return None
    return over(q, *attention_mask(mask, q.shape[0], k.shape[1]))
