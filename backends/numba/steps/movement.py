"""The movement steps: windows (reshape, view, permute, transpose), cont, concat, get_rows, set_rows, fill, cast
and repeat; with their tape faces."""

from __future__ import annotations

import math
import threading
from typing import Any, Callable

import numpy as np

from graphir.backends.numba import tape as T
from graphir.backends.numba.kernels import rows as R
from graphir.backends.numba.primitives.isa import IsaPath
from graphir.backends.numba.quant.weight import QWeight
from graphir.backends.numba.steps.base import (F32, Env, Function, Step, Window, broadcast, ints_fn, kernel, rows_of,
                                               shape_fn)
from graphir.backends.numba.tape import Tape
from graphir.graph.ir import Node


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
        if not x.size:  # an empty value (a ubatch without outputs): its offset points past the empty buffer
            return np.empty(shape, x.dtype)
        item = x.itemsize
        st, off = (strides4, offset4) if item == 4 else (tuple(s * item for s in strides), offset * item)
        y = np.ndarray(shape, x.dtype, buffer=x, offset=off, strides=st)
        y.setflags(write=False)
        return y

    return view


def _set_rows(dst: np.ndarray, src: np.ndarray, ids: np.ndarray) -> np.ndarray:
    dst[ids] = src  # NOTE: in place: dst is the cache buffer the memory owns; f32 -> f16 rounds to nearest even
    return dst


@kernel("get_rows")
def _get_rows(n: Node, memo: threading.local, path: IsaPath) -> Step:
    if len(n.inputs[1].shape) >= 2:  # batched: src (B..., rows, ne0), ids (B..., n)
        return Function(lambda env, src, ids: np.take_along_axis(src, ids[..., None].astype(np.intp), axis=-2)
                        .astype(np.float32, copy=False))
    return _GetRows()


class _GetRows(Step):
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
        if not rows_of(src) or src.ndim != 2 or not isinstance(ids, np.ndarray) or ids.ndim != 1:
            return None
        if src.flags.writeable:
            out = tape.row_in_place(src, ids)
            if out is not None:
                return out
        out = tape.arena((len(ids), src.shape[1]))
        ok = tape.record(T.MOVE, R.move_rows, (src, out, ids, False))
        return out if ok else None


def _record_weight_rows(tape: Tape, w: QWeight, ids: Any) -> np.ndarray | None:
    """An F16 or F32 weight's rows by ids (a token's embedding) on the tape, read from the weight as stored."""
    floats = w.float_rows()
    if floats is None or not isinstance(ids, np.ndarray) or ids.ndim != 1:
        return None
    f16 = floats.dtype == np.float16
    flat = floats.reshape(-1).view(np.uint16) if f16 else floats.reshape(-1)
    out = tape.arena((len(ids), w.ne0))
    ok = tape.record(T.WEIGHT_ROWS16 if f16 else T.WEIGHT_ROWS32, R.weight_rows, (flat, w.ne0, ids, out))
    return out if ok else None


@kernel("reshape")
def _reshape(n: Node, memo: threading.local, path: IsaPath) -> Step:
    shape = shape_fn(n.attrs["shape"])

    def at(env: Env) -> Callable[[np.ndarray], np.ndarray]:
        s = shape(env)
        return lambda x: x.reshape(s)

    return Window(at)


@kernel("view")
def _view_kernel(n: Node, memo: threading.local, path: IsaPath) -> Step:
    a = n.attrs
    r = len(a["shape"])
    geometry = ints_fn((*reversed(a["shape"]), *reversed(a["strides"]), a["offset"]))

    def at(env: Env) -> Callable[[np.ndarray], np.ndarray]:
        g = geometry(env)
        return _viewing(g[:r], g[r:-1], g[-1])

    return Window(at)


@kernel("permute", "transpose")
def _permute_kernel(n: Node, memo: threading.local, path: IsaPath) -> Step:
    axes, rank = (n.attrs["axes"] if n.op == "permute" else (1, 0, 2, 3)), len(n.shape)
    permute = _permuting(axes, rank)
    return Window(lambda env: permute)


@kernel("cont")
def _cont(n: Node, memo: threading.local, path: IsaPath) -> Step:
    return _Cont()


class _Cont(Step):
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
        ok = tape.record(T.STRIDED, R.strided_copy, (flat, off, *strides, o3))
        return out if ok else None


@kernel("concat")
def _concat(n: Node, memo: threading.local, path: IsaPath) -> Step:
    return _Concat(len(n.shape), n.attrs["dim"])


class _Concat(Step):
    def __init__(self, rank: int, dim: int):
        self.rank, self.axis = rank, rank - 1 - dim     # numpy's axis of ggml's dim

    def __call__(self, env: Env, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        x, y = (v.reshape((1,) * (self.rank - v.ndim) + v.shape) for v in (x, y))
        return np.concatenate([x, y], axis=self.axis).astype(np.float32, copy=False)

    def record(self, tape: Tape, args: list[Any]) -> np.ndarray | None:
        """On the tape as rows: what lies before the axis is the rows, the axis and what follows it the columns."""
        x, y = (v.reshape((1,) * (self.rank - v.ndim) + v.shape) if isinstance(v, np.ndarray) else v for v in args)
        ax = self.axis
        if not rows_of(x, y) or x.shape[:ax] != y.shape[:ax] or x.shape[ax + 1:] != y.shape[ax + 1:]:
            return None
        out = tape.arena(x.shape[:ax] + (x.shape[ax] + y.shape[ax],) + x.shape[ax + 1:])
        rows = math.prod(x.shape[:ax])
        x2, y2, o2 = x.reshape(rows, -1), y.reshape(rows, -1), out.reshape(rows, -1)
        ok = tape.record(T.CONCAT, R.concat_cols, (x2, y2, o2))
        return out if ok else None


@kernel("set_rows")
def _set_rows_kernel(n: Node, memo: threading.local, path: IsaPath) -> Step:
    if len(n.inputs[2].shape) == 2:  # batched: dst (B, rows, ne0), src (B, n, ne0), ids (B, n); dst a fresh value
        def set_batched(env: Env, dst: np.ndarray, src: np.ndarray, ids: np.ndarray) -> np.ndarray:
            if not dst.flags.writeable:  # a strided view of the fresh value (sparse attention's mask rows)
                dst = dst.copy()
            np.put_along_axis(dst, ids[..., None].astype(np.intp), src, axis=1)
            return dst
        return Function(set_batched)
    return _SetRows()


class _SetRows(Step):
    def __call__(self, env: Env, dst: np.ndarray, src: np.ndarray, ids: np.ndarray) -> np.ndarray:
        return _set_rows(dst, src, ids)

    def record(self, tape: Tape, args: list[Any]) -> np.ndarray | None:
        """Rows into an f16 cache (rows, width) on the tape, rounded as numpy rounds them, or a float32 one's."""
        dst, src, ids = args
        if not isinstance(dst, np.ndarray) or dst.dtype not in (np.float16, F32) or dst.ndim != 2 \
                or not dst.flags.c_contiguous or not rows_of(src) or not isinstance(ids, np.ndarray) \
                or ids.ndim != 1 or src.shape != (len(ids), dst.shape[1]):
            return None
        if dst.dtype == F32:   # a recurrent state's rows
            ok = tape.record(T.MOVE, R.move_rows, (src, dst, ids, True))
        else:
            bits = dst.view(np.uint16)
            ok = tape.record(T.SET_ROWS, R.set_rows_f16, (bits, src, ids))
        if ok:
            tape.writes_rows(dst, ids)
        return dst if ok else None


@kernel("pad")
def _pad(n: Node, memo: threading.local, path: IsaPath) -> Step:
    """Zeros after a's values along each dim: numpy's axes are ggml's dims reversed."""
    widths, rank = [(0, p) for p in reversed(n.attrs["pad"])], len(n.shape)

    def pad(env: Env, x: np.ndarray) -> np.ndarray:
        y = np.pad(x.reshape((1,) * (4 - x.ndim) + x.shape), widths).astype(np.float32, copy=False)
        return y.reshape(y.shape[4 - rank:])
    return Function(pad)


@kernel("fill")
def _fill(n: Node, memo: threading.local, path: IsaPath) -> Step:
    c = np.float32(n.attrs["c"])
    return Function(lambda env, x: np.full(x.shape, c, np.float32))


@kernel("cast")
def _cast(n: Node, memo: threading.local, path: IsaPath) -> Step:
    to = np.float32 if n.attrs["type"] == "f32" else np.int32  # to i32: truncated toward zero, as C's conversion
    return Function(lambda env, x: x.astype(to))


@kernel("repeat")
def _repeat(n: Node, memo: threading.local, path: IsaPath) -> Step:
    shape = shape_fn(n.attrs["shape"])

    def repeat(env: Env, x: np.ndarray) -> np.ndarray:
        s = shape(env)
        return np.ascontiguousarray(np.broadcast_to(broadcast(x, s), s), dtype=np.float32)

    return Function(repeat)
