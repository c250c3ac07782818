"""A plan's kernel calls recorded once and replayed in native code: no Python between them at run time.

A small graph (a generation step's) is planned into an arena: every value a recorded step makes gets its own
array, made when the plan is, so a call's operands are all known then, and windows of them (reshape, view,
permute) are made then too and cost nothing at run time. A step that can be recorded (its kernel and arguments
fixed for the plan) appends one instruction to the tape: an opcode, the kernel's native address and its
operands, arrays as rows of a table of their addresses and shapes. ``play`` walks the tape and calls each
kernel at its address (jit.call_at); the kernels are the ones the steps call from Python, with the same
arguments, so the bits are the same. What changes per run is copied in first: the feeds the tape reads, and
what is derived from them once per run (RoPE's cos/sin, the cells attention reads up to).

Modules
    opcodes  the instruction set, one table: each opcode's kernel arguments by kind; generates the player
    arrays   how play reads its operands from the table of arrays; PLACE's instruction
    player   play, generated from the opcode table
"""

from __future__ import annotations

import time
from typing import Any, Callable

import numba
import numpy as np

from graphir.backends.numba.primitives.jit import native_address
from graphir.backends.numba.tape.arrays import KINDS, NUMPY, WIDTH, cycles
from graphir.backends.numba.tape.opcodes import OPCODES, Op
from graphir.backends.numba.tape.player import player

globals().update(Op.__members__)   # the opcodes by name (tape.MOVE, ...), as recorders spell them

ARENA_MAX = 16 << 20   # bytes of values up to which a plan is recorded: a generation step's, not a long prompt's

_ADDRESSES: dict[tuple[Any, ...], int] = {}   # (kernel, its arguments' kinds) -> native address


def _kind(a: Any) -> Any:
    """What numba types an argument by, found without numba.typeof (2 us an array)."""
    if isinstance(a, np.ndarray):
        return a.dtype.str, a.ndim, a.flags.c_contiguous, a.flags.f_contiguous, a.flags.writeable, a.flags.aligned
    return type(a) if isinstance(a, (bool, int, float, np.generic)) else numba.typeof(a)   # a register type


def fits(kind: str, a: Any) -> bool:
    """Whether the player reads ``a`` as an array of ``kind`` (the kernel then gets the very type numba compiled it
    for from Python)."""
    t = KINDS[kind]
    return isinstance(a, np.ndarray) and a.dtype == NUMPY[kind] and a.ndim == t.ndim and a.flags.c_contiguous \
        and a.flags.aligned and a.flags.writeable == t.mutable


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
            code += [Op.PLACE, 0, ids_row, len(written_rows), *written_rows, len(values),
                     *(x for v in values for x in v)]
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
        if not fits(kind, a):
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

    def record(self, op: int, kernel: Callable, args: tuple[Any, ...]) -> bool:
        """Append op calling ``kernel`` with ``args``, each encoded as the opcode table declares its kind (a
        ``reg`` argument is the register's index); False (nothing appended) where an array is not of its kind."""
        operands: list[int | None] = []
        for kind, a in zip(OPCODES[op].args, args, strict=True):
            if kind in KINDS:
                operands.append(self.ref(kind, a))
            elif kind == "f32":
                operands.append(self.f32(a))
            elif kind != "lanes":
                operands.append(int(a))
        return self.emit(op, kernel, args, tuple(operands))

    def emit(self, op: int, kernel: Callable, args: tuple[Any, ...], operands: tuple[int | None, ...]) -> bool:
        """Append op calling ``kernel`` (compiled, or found in the cache, for ``args``' types) with ``operands``,
        its words as the opcode table lays them out; False (nothing appended) where an operand had no index."""
        if len(operands) != OPCODES[op].words - 2:
            raise ValueError(f"{OPCODES[op].name} takes {OPCODES[op].words - 2} operands, got {len(operands)}")
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
            t = np.zeros((len(self.arrays), WIDTH), np.int64)
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

