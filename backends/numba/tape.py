"""A plan's kernel calls recorded once and replayed in native code: no Python between them at run time.

A small graph (a generation step's) is planned into an arena: every value a recorded step makes gets its own
array, made when the plan is, so a call's operands are all known then, and windows of them (reshape, view,
permute) are made then too and cost nothing at run time. A step that can be recorded (its kernel and arguments
fixed for the plan) appends one instruction to the tape: an opcode, the kernel's native address and its
operands, arrays as rows of a table of their addresses and shapes. ``play`` walks the tape and calls each
kernel at its address (jit.call_at); the kernels are the ones the steps call from Python, with the same
arguments, so the bits are the same. What changes per run is copied in first: the feeds the tape reads, and
what is derived from them once per run (RoPE's cos/sin, the cells attention reads up to).
"""

from __future__ import annotations

import functools
import time
from typing import Any, Callable

import numba
import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic
from numba.np import arrayobj

from graphir.backends.numba.primitives import simd
from graphir.backends.numba.primitives.jit import SER, call_at, native_address

ARENA_MAX = 16 << 20   # bytes of values up to which a plan is recorded: a generation step's, not a long prompt's

# the kinds of array play makes from the table, by name: C-contiguous, and numba types a read-only array apart
_C = "C"
KINDS: dict[str, types.Array] = {
    "u8": types.Array(types.uint8, 1, _C), "u16": types.Array(types.uint16, 1, _C),
    "u16_2": types.Array(types.uint16, 2, _C), "u16r": types.Array(types.uint16, 1, _C, readonly=True),
    "i64": types.Array(types.int64, 1, _C), "f1": types.Array(types.float32, 1, _C),
    "f1r": types.Array(types.float32, 1, _C, readonly=True), "f2": types.Array(types.float32, 2, _C),
    "f2r": types.Array(types.float32, 2, _C, readonly=True), "f3": types.Array(types.float32, 3, _C),
}
_NUMPY = {k: np.dtype(str(t.dtype)) for k, t in KINDS.items()}
_ADDRESSES: dict[tuple[Any, ...], int] = {}   # (kernel, its arguments' kinds) -> native address


def _kind(a: Any) -> Any:
    """What numba types an argument by, found without numba.typeof (2 us an array)."""
    if isinstance(a, np.ndarray):
        return a.dtype.str, a.ndim, a.flags.c_contiguous, a.flags.f_contiguous, a.flags.writeable, a.flags.aligned
    return type(a) if isinstance(a, (bool, int, float, np.generic)) else numba.typeof(a)   # a register type

# opcodes: what follows each in the code (the kernel's address, then its operands: table rows, integers, rows of
# the float constants, registers)
(GEMV2, GEMV3, NORM, BINARY, SILU, ROPE, SET_ROWS, ATTEND, ROWS, PRODUCTS16, PRODUCTS32, MOVE, CONCAT, CONV, SCAN,
 LIBM, UNARY, LAYER_NORM, GELU, SOFT_MAX, SHORT_DOTS, STRIDED, WKV6, SHORT_DOTS32, PLACE, WEIGHT_ROWS,
 SCAN_HEADS) = range(27)


@intrinsic
def _cycles(typingctx):  # type: ignore[no-untyped-def]
    """The CPU's cycle counter (rdtsc on x86: a constant rate), what a profiled play times instructions by."""
    def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.IntType(64), []),
                                            "llvm.readcyclecounter")
        return builder.call(fn, [])

    return types.int64(), codegen


@njit(**SER)
def cycles():
    return _cycles()


def _reader(aryty: types.Array) -> Any:
    """An intrinsic making, from row i of the int64 table t (an address, then the shape), an array of numba type
    ``aryty`` over that memory (C strides, no owner: the tape keeps the numpy array it was taken from). It is what
    lets play read arrays of many types from one table: numba's typed lists of arrays compile again in each
    process (0.6 s and 0.25 s a type)."""
    @intrinsic
    def read(typingctx, t, i):  # type: ignore[no-untyped-def]
        def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
            table = context.make_array(sig.args[0])(context, builder, args[0])
            row = builder.mul(args[1], context.get_constant(types.intp, 4))
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


_u8, _u16, _u16_2, _u16r, _i64, _f1, _f1r, _f2, _f2r, _f3 = (_reader(KINDS[k]) for k in (
    "u8", "u16", "u16_2", "u16r", "i64", "f1", "f1r", "f2", "f2r", "f3"))


@njit(**SER)
def _place(t, code, q):
    """PLACE's operands from code[q]: the ids' table row, the number of arrays of ids written into the buffers
    and their rows, the number of values; per value the buffer's row, the row of a copy target at the value's
    own address, whether to copy always, the number of windows and (table row, offset) per window. Each
    window's table row is pointed at row i = ids[0] of the buffer, or, where i is written in this run (or
    always), at the value after row i is copied into it. Returns where the next instruction starts."""
    i = _i64(t, code[q])[0]
    clash = False
    for k in range(code[q + 1]):
        w = _i64(t, code[q + 2 + k])
        for j in range(w.shape[0]):
            clash = clash or w[j] == i
    q += 2 + code[q + 1]
    n_values = code[q]
    q += 1
    for _ in range(n_values):
        buf, own, n_win = code[q], code[q + 1], code[q + 3]
        if clash or code[q + 2] != 0:
            src, dst = _f2(t, buf), _f2(t, own)
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


@functools.cache
def player(n_lanes: int) -> Callable:
    """play for registers of n_lanes float32 lanes (the float products take the register type as an argument; a
    constant of the kernel, as in kernels.attention)."""
    v_ = simd.lanes(n_lanes)

    @njit(**SER)
    def play(code, f32s, regs, t, spent):
        """Run the tape: each instruction calls its kernel at its address with its operands, arrays made from
        the table ``t`` (address and shape by row). ``spent``: empty, or where the cycles of each instruction are
        added (a profiled run)."""
        v = v_
        pc = i = c0 = 0
        timed = spent.shape[0] > 0
        while pc < code.shape[0]:
            if timed:
                c0 = _cycles()
            op, at = code[pc], code[pc + 1]
            a = code[pc + 2:]
            if op == GEMV2:      # exact GEMV of a two-part packed weight: (qs, d), x, out
                call_at(at, (_u8(t, a[0]), _u16(t, a[1]), _f2(t, a[2]), _f2(t, a[3])))
                pc += 6
            elif op == GEMV3:    # of a three-part one: (qs, d, m), x, out
                call_at(at, (_u8(t, a[0]), _u16(t, a[1]), _u16(t, a[2]), _f2(t, a[3]), _f2(t, a[4])))
                pc += 7
            elif op == NORM:     # rms_norm rows: x, eps, w, out
                call_at(at, (_f2(t, a[0]), f32s[a[1]], _f1r(t, a[2]), _f2(t, a[3])))
                pc += 6
            elif op == BINARY:   # x op y -> out, rows (y: x's rows or one row), op
                call_at(at, (_f2(t, a[0]), _f2(t, a[1]), _f2(t, a[2]), a[3]))
                pc += 6
            elif op == LIBM:     # glibc's exp, tanh, sigmoid or softplus of rows: x, which, out
                call_at(at, (_f2(t, a[0]), a[1], _f2(t, a[2])))
                pc += 5
            elif op == UNARY:    # relu, square, negation or scaling of rows: x, out, which, s
                call_at(at, (_f2(t, a[0]), _f2(t, a[1]), a[2], f32s[a[3]]))
                pc += 6
            elif op == LAYER_NORM:  # norm rows: x, eps, lanes, out
                call_at(at, (_f2(t, a[0]), f32s[a[1]], a[2], _f2(t, a[3])))
                pc += 6
            elif op == GELU:     # gelu rows through ggml's table (geglu: gated by u): x, u, gated, table, out
                call_at(at, (_f2(t, a[0]), _f2(t, a[1]), a[2] != 0, _f1(t, a[3]), _f2(t, a[4])))
                pc += 7
            elif op == SOFT_MAX:  # x, mask rows, mrows, scale, head, lanes, variant, out, sinks
                call_at(at, (_f2(t, a[0]), _f2(t, a[1]), a[2], f32s[a[3]], a[4], a[5], a[6], _f2(t, a[7]),
                             _f1(t, a[8])))
                pc += 11
            elif op == MOVE:     # rows gathered (dst[i] = src[ids[i]]) or scattered: src, dst, ids, scatter
                call_at(at, (_f2(t, a[0]), _f2(t, a[1]), _i64(t, a[2]), a[3] != 0))
                pc += 6
            elif op == CONCAT:   # x rows, then y rows -> out rows
                call_at(at, (_f2(t, a[0]), _f2(t, a[1]), _f2(t, a[2])))
                pc += 5
            elif op == CONV:     # Mamba's causal conv: sx, w, y
                call_at(at, (_f3(t, a[0]), _f2(t, a[1]), _f3(t, a[2])))
                pc += 5
            elif op == SCAN:     # Mamba-1's selective scan: s, x, dt, A, B, C, y, states
                call_at(at, (_f3(t, a[0]), _f3(t, a[1]), _f3(t, a[2]), _f2(t, a[3]), _f3(t, a[4]), _f3(t, a[5]),
                             _f3(t, a[6]), _f3(t, a[7])))
                pc += 10
            elif op == SILU:     # silu rows, gated: x, lanes, variant, gate, out
                call_at(at, (_f2(t, a[0]), a[1], a[2], _f2(t, a[3]), _f2(t, a[4])))
                pc += 7
            elif op == ROPE:     # rope rows: x, cos, sin, n_tok, n_head, n_dims, neox, n_fused, out
                call_at(at, (_f2(t, a[0]), _f2(t, a[1]), _f2(t, a[2]), a[3], a[4], a[5], a[6] != 0, a[7],
                             _f2(t, a[8])))
                pc += 11
            elif op == SET_ROWS:  # f16 rows: dst bits, src, ids
                call_at(at, (_u16_2(t, a[0]), _f2(t, a[1]), _i64(t, a[2])))
                pc += 5
            elif op == ATTEND:   # one query token's attention; the cells read up to: a register set per run
                call_at(at, (a[0], a[1], _u16r(t, a[2]), a[3], a[4], a[5], _f2(t, a[6]), a[7], a[8], a[9],
                             _f2(t, a[10]), a[11], regs[a[12]], f32s[a[13]], a[14], _u16r(t, a[15]), a[16], a[17],
                             a[18], a[19], _f3(t, a[20]), _f3(t, a[21])))
                pc += 24
            elif op == ROWS:     # activations as padded float32 rows for the float products: src, kind, out
                call_at(at, (_f2r(t, a[0]), a[1], _f2(t, a[2])))
                pc += 5
            elif op == STRIDED:  # a strided view copied: flat src, offset, three strides, out
                call_at(at, (_f1(t, a[0]), a[1], a[2], a[3], a[4], _f3(t, a[5])))
                pc += 8
            elif op == WKV6:     # RWKV6's wkv: k, v, r, time_first, decay, states, y, new states (as 3-D), n_seqs
                s0, st = _f3(t, a[5]), _f3(t, a[7])
                shape = (a[8], s0.shape[0] // a[8], s0.shape[1], s0.shape[2])
                call_at(at, (_f3(t, a[0]), _f3(t, a[1]), _f3(t, a[2]), _f2(t, a[3]), _f3(t, a[4]), s0.reshape(shape),
                             _f3(t, a[6]), st.reshape(shape)))
                pc += 11
            elif op == SCAN_HEADS:  # Mamba-2's scan: s, x, dt, A, B, C, y, states (4-D as 3-D), n_seqs, hadd
                ns = a[8]
                s0, x3, b3, c3 = _f3(t, a[0]), _f3(t, a[1]), _f3(t, a[4]), _f3(t, a[5])
                y3, st = _f3(t, a[6]), _f3(t, a[7])
                sh = (ns, s0.shape[0] // ns, s0.shape[1], s0.shape[2])
                xh = (ns, x3.shape[0] // ns, x3.shape[1], x3.shape[2])
                bh = (ns, b3.shape[0] // ns, b3.shape[1], b3.shape[2])
                call_at(at, (s0.reshape(sh), x3.reshape(xh), _f3(t, a[2]), _f1(t, a[3]), b3.reshape(bh), c3.reshape(bh),
                             y3.reshape(xh), st.reshape(sh), v, a[9] != 0))
                pc += 12
            elif op == SHORT_DOTS:  # f16 rows shorter than a step, one x row: w by columns in blocks, x, k, out
                call_at(at, (_f3(t, a[0]), _f1(t, a[1]), a[2], _f2(t, a[3])))
                pc += 6
            elif op == SHORT_DOTS32:  # f32 ones: w by columns, x, k, the products added unfused up to, out
                call_at(at, (_f2(t, a[0]), _f1(t, a[1]), a[2], a[3], _f1(t, a[4])))
                pc += 7
            elif op == PRODUCTS16 or op == PRODUCTS32:   # products of f16 / f32 weight rows with them
                if op == PRODUCTS16:
                    call_at(at, (a[0], a[1], v, _u16r(t, a[2]), a[3], _f1(t, a[4]), a[5], a[6], a[7], a[8], a[9],
                                 a[10], a[11], a[12], a[13] != 0, a[14], _f3(t, a[15])))
                else:
                    call_at(at, (a[0], a[1], v, _f1r(t, a[2]), a[3], _f1(t, a[4]), a[5], a[6], a[7], a[8], a[9],
                                 a[10], a[11], a[12], a[13] != 0, a[14], _f3(t, a[15])))
                pc += 18
            elif op == WEIGHT_ROWS:  # an f16 (a[4]) or f32 weight's rows as float32: w flat, row length, ids, out
                if a[4]:
                    call_at(at, (_u16r(t, a[0]), a[1], _i64(t, a[2]), _f2(t, a[3])))
                else:
                    call_at(at, (_f1r(t, a[0]), a[1], _i64(t, a[2]), _f2(t, a[3])))
                pc += 7
            elif op == PLACE:    # rows read where they lie (Tape.row_in_place), at the start of a run
                pc += _place(t, code, pc + 2) - pc
            else:
                raise ValueError("unknown tape opcode")
            if timed:
                spent[i] += _cycles() - c0
            i += 1

    return play


def storage_of(a: Any) -> np.ndarray | None:
    """The array whose memory an array views (itself if it owns it); None for what is not an array."""
    if not isinstance(a, np.ndarray):
        return None
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a


class Tape:
    """Instructions and the arrays they read, made while a plan is made; ``segment()`` closes the instructions
    recorded since the last one into a function that plays them (a planned step)."""

    def __init__(self, n_lanes: int) -> None:
        self.play = player(n_lanes)
        self.code: list[int] = []
        self.labels: list[str] = []                   # each instruction's, for a profile
        self.label = ""                               # the label of what is being recorded
        self.f32s: list[float] = []
        self.arrays: list[np.ndarray] = []           # the table's rows: kept alive while the tape is
        self.index: dict[int, int] = {}
        self.n_regs = 0                               # registers: integers set per run (attention's cells)
        self.before: list[Callable[[], None]] = []   # per run, before the first instruction: derived values
        self.memo: dict[Any, Any] = {}                # what recorded steps share (cos/sin of positions, ...)
        self.start = self.pending = 0                 # where the instructions not yet in a segment start; how many
        self.made: set[int] = set()                   # the arena's arrays, by id
        self.pool: list[np.ndarray] = []              # storage of values past their last reader, for later ones
        self.holders: dict[int, int] = {}             # storage a value of the plan may give back: its live views
        self.written: dict[int, list[np.ndarray]] = {}  # arrays not the arena's that instructions write rows of
        self.in_place: list[tuple[np.ndarray, np.ndarray, np.ndarray, int]] = []  # row_in_place's values
        self._table: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None

    def arena(self, shape: tuple[int, ...], dtype: Any = np.float32, fresh: bool = False) -> np.ndarray:
        """An array of the arena: a recorded step's value, or a copy of a value the tape reads. Unless ``fresh``,
        it may take the storage of values whose last reader comes before (liveness-based reuse: release), which
        only an array its instruction writes at its place in the run may do; ``fresh`` for what is written
        before the run (feeds, derived values, constants) or at another place (a Python step's value)."""
        nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
        fits = [i for i, r in enumerate(self.pool) if r.nbytes >= nbytes] if not fresh and nbytes else []
        if fits:
            root = self.pool.pop(min(fits, key=lambda i: self.pool[i].nbytes))
            root[:nbytes] = 0
        else:
            root = np.zeros(nbytes, np.uint8)
        a = root[:nbytes].view(dtype).reshape(shape)
        self.made.update((id(a), id(root)))
        if not fresh:
            self.holders.setdefault(id(root), 0)
        return a

    def hold(self, value: Any) -> None:
        """A slot of the plan (or a value kept for a later step) takes ``value``: its storage stays its own."""
        root = storage_of(value)
        if root is not None and id(root) in self.holders:
            self.holders[id(root)] += 1

    def release(self, value: Any) -> None:
        """A holder of ``value`` is past its last reader: with the last of them, the storage goes to the pool."""
        root = storage_of(value)
        if root is not None and self.holders.get(id(root), 0) > 0:
            self.holders[id(root)] -= 1
            if self.holders[id(root)] == 0:
                self.pool.append(root)

    def writes_rows(self, buf: np.ndarray, ids: np.ndarray | None) -> None:
        """An instruction writes rows ``ids`` of ``buf`` (a memory's buffer, written in place); None: a Python
        step writes rows of it."""
        self.written.setdefault(id(buf), []).append(ids)

    def row_in_place(self, buf: np.ndarray, ids: np.ndarray) -> np.ndarray | None:
        """Row ids[0] of buf (a float32 array not the arena's: a memory's state buffer) as the value ``out`` of a
        gather, without an instruction to copy it: at the start of each run (finish), the table's rows of ``out``
        and of every window of it are pointed into buf at that row. Where the run writes that row (its ids among
        those written into buf), or a Python step reads ``out`` or writes buf, the row is copied into ``out``
        then instead (as the gather would read it: nothing wrote buf before it, or it would not be here). None
        where buf was written before the gather (which must then copy at its place) or is the arena's."""
        if id(storage_of(buf)) in self.made or id(buf) in self.written or len(ids) != 1 or self.ref("f2", buf) is None \
                or self.ref("i64", ids) is None:
            return None
        out = self.arena((1, buf.shape[1]), buf.dtype, fresh=True)
        own = out[:]            # out at its own address, for the copy: a row of the table no window takes
        self.arrays.append(own)
        self.in_place.append((buf, ids, out, len(self.arrays) - 1))
        return out

    def finish(self, python_reads: list[np.ndarray]) -> Segment | None:
        """Once the tape is complete (the windows of row_in_place's values and the rows written into their
        buffers are known), the segment that places those values, to play before each run (after the feeds are
        copied in): a PLACE instruction per group of values taking the same ids and written by the
        same arrays of ids (a generation step's states: one). ``python_reads``: what the plan's Python steps
        and outputs read."""
        if not self.in_place:
            return None
        own_rows = {row for *_, row in self.in_place}
        groups: dict[tuple[int, ...], tuple[int, list[int], list[list[int]]]] = {}
        for buf, ids, out, own in self.in_place:
            written = self.written.get(id(buf), [])
            lo, hi = out.ctypes.data, out.ctypes.data + out.nbytes
            windows = [(r, a.ctypes.data - lo) for r, a in enumerate(self.arrays)
                       if r not in own_rows and lo <= a.ctypes.data < hi]
            always = any(w is None for w in written) or any(np.shares_memory(a, out) for a in python_reads)
            known = [w for w in written if w is not None]
            _, _, values = groups.setdefault(
                (id(ids), *map(id, known)), (self.index[id(ids)], [self.index[id(w)] for w in known], []))
            values.append([self.index[id(buf)], own, int(always), len(windows), *(x for w in windows for x in w)])
        code = []
        for ids_row, written_rows, values in groups.values():
            code += [PLACE, 0, ids_row, len(written_rows), *written_rows, len(values), *(x for v in values for x in v)]
        return Segment(self, np.array(code, np.int64), ["rows in place"] * len(groups))

    def constant(self, a: np.ndarray) -> np.ndarray:
        """A copy of a (a weight that never changes) in the arena, writable as the tape's kinds are, made once."""
        c = self.memo.get(("constant", id(a)))
        if c is None:
            c = self.memo[("constant", id(a))] = self.arena(a.shape, a.dtype, fresh=True)
            c[...] = a
        return c

    def ref(self, kind: str, a: np.ndarray) -> int | None:
        """a's row in the table, read as an array of ``kind``; None where a is not of that kind (the step then
        runs from Python)."""
        t = KINDS[kind]
        if a.dtype != _NUMPY[kind] or a.ndim != t.ndim or not a.flags.c_contiguous or not a.flags.aligned \
                or a.flags.writeable != t.mutable:
            return None
        if id(a) not in self.index:
            self.index[id(a)] = len(self.arrays)
            self.arrays.append(a)
        return self.index[id(a)]

    def f32(self, x: float) -> int:
        self.f32s.append(float(x))
        return len(self.f32s) - 1

    def reg(self) -> int:
        self.n_regs += 1
        return self.n_regs - 1

    def emit(self, op: int, kernel: Callable, args: tuple[Any, ...], operands: tuple[int | None, ...]) -> bool:
        """Append op calling ``kernel`` (compiled, or found in the cache, for ``args``' types) with ``operands``;
        False (nothing appended) where an operand had no index."""
        if any(o is None for o in operands):
            return False
        key = (kernel, *(_kind(a) for a in args))
        at = _ADDRESSES.get(key)
        if at is None:
            at = _ADDRESSES[key] = native_address(kernel, *args)
        self.code += [op, at, *(int(o) for o in operands)]  # type: ignore[arg-type]
        self.labels.append(self.label)
        self.pending += 1
        return True

    def segment(self) -> Segment:
        """The instructions since the last segment as one call (their code apart; the arrays shared)."""
        n = len(self.labels)
        seg = Segment(self, np.array(self.code[self.start:], np.int64), self.labels[n - self.pending:])
        self.start, self.pending = len(self.code), 0
        return seg

    def table(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The float constants, the registers and the arrays' table (address, then shape), made at the first run
        (the tape is complete by then)."""
        if self._table is None:
            t = np.zeros((len(self.arrays), 4), np.int64)
            for i, a in enumerate(self.arrays):
                t[i, 0], t[i, 1:1 + a.ndim] = a.ctypes.data, a.shape
            self._table = np.array(self.f32s, np.float32), np.zeros(max(self.n_regs, 1), np.int64), t
        return self._table


class Segment:
    """Instructions of a tape played as one step of a plan; ``profiled`` plays them timing each."""

    def __init__(self, tape: Tape, code: np.ndarray, labels: list[str]):
        self.tape, self.code, self.labels = tape, code, labels

    def __call__(self) -> None:
        self.tape.play(self.code, *self.tape.table(), _UNTIMED)

    def profiled(self, profile: dict[str, list[float]]) -> None:
        """Play, adding each instruction's seconds and count to ``profile`` under its label."""
        spent = np.zeros(len(self.labels), np.int64)
        self.tape.play(self.code, *self.tape.table(), spent)
        rate = cycle_rate()
        for label, c in zip(self.labels, spent):
            entry = profile.setdefault(label, [0.0, 0])
            entry[0] += c / rate
            entry[1] += 1


_UNTIMED = np.zeros(0, np.int64)
_RATE: list[float] = []


def cycle_rate() -> float:
    """Cycles of the counter per second, measured once against time.perf_counter (over 20 ms)."""
    if not _RATE:
        c0, t0 = cycles(), time.perf_counter()
        while time.perf_counter() - t0 < 0.02:
            pass
        _RATE.append((cycles() - c0) / (time.perf_counter() - t0))
    return _RATE[0]

