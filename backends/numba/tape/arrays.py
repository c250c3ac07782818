"""How the tape's player reads its operands: arrays of a few kinds, made from rows of one int64 table (an address,
then the shape), the cycle counter a profiled play times instructions by, and PLACE's instruction."""

from __future__ import annotations

from typing import Any

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic
from numba.np import arrayobj

from graphir.backends.numba.primitives.jit import SER

# the kinds of array play makes from the table, by name: C-contiguous, and numba types a read-only array apart
_C = "C"
KINDS: dict[str, types.Array] = {
    "u8": types.Array(types.uint8, 1, _C), "u8_2": types.Array(types.uint8, 2, _C),
    "i8_3": types.Array(types.int8, 3, _C), "u16": types.Array(types.uint16, 1, _C),
    "u16_2": types.Array(types.uint16, 2, _C), "u16r": types.Array(types.uint16, 1, _C, readonly=True),
    "i64": types.Array(types.int64, 1, _C), "f1": types.Array(types.float32, 1, _C),
    "f1r": types.Array(types.float32, 1, _C, readonly=True), "f2": types.Array(types.float32, 2, _C),
    "f2r": types.Array(types.float32, 2, _C, readonly=True), "f3": types.Array(types.float32, 3, _C),
    "f4": types.Array(types.float32, 4, _C),
}
WIDTH = 5   # int64 words of a row of the table: an array's address, then its shape (up to 4 dims)
NUMPY = {k: np.dtype(str(t.dtype)) for k, t in KINDS.items()}


@intrinsic
def cycles_now(typingctx):  # type: ignore[no-untyped-def]
    """The CPU's cycle counter (rdtsc on x86: a constant rate), what a profiled play times instructions by."""
    def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.IntType(64), []),
                                            "llvm.readcyclecounter")
        return builder.call(fn, [])

    return types.int64(), codegen


@njit(**SER)
def cycles():
    return cycles_now()


def _reader(aryty: types.Array) -> Any:
    """An intrinsic making, from row i of the int64 table t (an address, then the shape), an array of numba type
    ``aryty`` over that memory (C strides, no owner: the tape keeps the numpy array it was taken from). It is what
    lets play read arrays of many types from one table: numba's typed lists of arrays compile again in each
    process (0.6 s and 0.25 s a type)."""
    @intrinsic
    def read(typingctx, t, i):  # type: ignore[no-untyped-def]
        def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
            table = context.make_array(sig.args[0])(context, builder, args[0])
            row = builder.mul(args[1], context.get_constant(types.intp, WIDTH))
            words = [builder.load(builder.gep(table.data, [builder.add(row, context.get_constant(types.intp, j))]))
                     for j in range(1 + aryty.ndim)]
            ary = arrayobj.make_array(aryty)(context, builder)
            item = context.get_data_type(aryty.dtype)
            size = context.get_constant(types.intp, context.get_abi_sizeof(item))
            strides, step = [], size
            for d in reversed(words[1:]):
                strides.insert(0, step)
                step = builder.mul(step, d)
            arrayobj.populate_array(ary, data=builder.inttoptr(words[0], item.as_pointer()), shape=words[1:],
                                    strides=strides, itemsize=size, meminfo=None)
            return ary._getvalue()

        return aryty(t, types.intp), codegen

    return read


(read_u8, read_u8_2, read_i8_3, read_u16, read_u16_2, read_u16r, read_i64, read_f1, read_f1r, read_f2, read_f2r,
 read_f3, read_f4) = (_reader(KINDS[k]) for k in ("u8", "u8_2", "i8_3", "u16", "u16_2", "u16r", "i64", "f1", "f1r",
                                                   "f2", "f2r", "f3", "f4"))


@njit(**SER)
def place(t, code, q):
    """PLACE's operands from code[q]: the ids' table row, the number of arrays of ids written into the buffers
    and their rows, the number of values; per value the buffer's row, the row of a copy target at the value's
    own address, whether to copy always, the number of windows and (table row, offset) per window. Each
    window's table row is pointed at row i = ids[0] of the buffer, or, where i is written in this run (or
    always), at the value after row i is copied into it. Returns where the next instruction starts."""
    i = read_i64(t, code[q])[0]
    clash = False
    for k in range(code[q + 1]):
        w = read_i64(t, code[q + 2 + k])
        for j in range(w.shape[0]):
            clash = clash or w[j] == i
    q += 2 + code[q + 1]
    n_values = code[q]
    q += 1
    for _ in range(n_values):
        buf, own, n_win = code[q], code[q + 1], code[q + 3]
        if clash or code[q + 2] != 0:
            src, dst = read_f2(t, buf), read_f2(t, own)
            for c in range(dst.shape[1]):
                dst[0, c] = src[i, c]
            base = t[own, 0]
        else:
            base = t[buf, 0] + i * t[buf, 2] * 4
        q += 4
        for _ in range(n_win):
            t[code[q], 0] = base + code[q + 1]
            q += 2
    return q
