"""The tape's instruction set, declared once: each opcode's name, the kinds of its kernel's arguments in order, and
what it does. Both faces of the tape come from this table: ``Tape.record`` encodes a kernel's arguments by it,
and the player (:mod:`.player`, a straight-line dispatch numba compiles) is generated from it by
``python -m graphir.backends.numba.tape.opcodes`` (tests/test_opcodes.py checks it is up to date).

An instruction in the code is the opcode, the kernel's native address, then one word per argument that is not
``lanes``: an array's row in the table of arrays (the kinds of :data:`.arrays.KINDS`), an integer, a bool as 0 or
1, a float constant's index (``f32``), or a register's index (``reg``: an integer set before each run).
``lanes`` is the register type of the player's path (kernels.mul_mat, kernels.attention take it), no word.
PLACE, last, calls no kernel: its words are variable in number (arrays.place reads them).
"""

from __future__ import annotations

import textwrap
from enum import IntEnum
from pathlib import Path
from typing import NamedTuple

SCALARS = ("int", "bool", "f32", "reg", "lanes")


class Opcode(NamedTuple):
    name: str
    args: tuple[str, ...]   # the kind of each of the kernel's arguments, in order
    doc: str

    @property
    def words(self) -> int:
        """Its length in the code: opcode, address, and a word per argument but ``lanes``."""
        return 2 + sum(kind != "lanes" for kind in self.args)


_INT8 = ("int",) * 8
OPCODES = (
    Opcode("GEMV2", ("u8", "u16", "f2", "f2"),
           "GEMV of a two-part packed weight (the exact kinds', Q4_K's): (quants, d), x, out"),
    Opcode("GEMV3", ("u8", "u16", "u16", "f2", "f2"), "of a three-part one: (qs, d, m), x, out"),
    Opcode("GEMVK", ("u8_2", "i8_3", "f3", "f2", "f2"),
           "of a K-quant's (or I-quant's) values, scales and d (quant.kquant's k_product): x, out"),
    Opcode("NORM", ("f2", "f32", "f1r", "f2"), "rms_norm rows: x, eps, w, out"),
    Opcode("BINARY", ("f2", "f2", "int", "f2", "int"),
           "x op y -> out by rows, row r with y's (r // div) % len(y): x, y, div, out, op"),
    Opcode("SILU", ("f2", "int", "int", "f2", "f2"), "silu rows, gated: x, lanes, variant, gate, out"),
    Opcode("ROPE", ("f2", "f2", "f2", "int", "int", "int", "bool", "int", "f2"),
           "rope rows: x, cos, sin, n_tok, n_head, n_dims, neox, n_fused, out"),
    Opcode("SET_ROWS", ("u16_2", "f2", "i64"), "f16 rows: dst bits, src, ids"),
    Opcode("ATTEND", ("int", "int", "u16r", "int", "int", "int", "f2", "int", "int", "int", "f2", "int", "reg", "f32",
                      "int", "u16r", "int", "int", "int", "int", "f3", "f3"),
           "one query token's attention; the cells read up to: a register set per run"),
    Opcode("ROWS", ("f2r", "int", "f2"), "activations as padded float32 rows for the float products: src, kind, out"),
    Opcode("PRODUCTS16", ("int", "int", "lanes", "u16r", "int", "f1", *_INT8, "bool", "int", "i64", "bool", "f3"),
           "products of f16 weight rows with them"),
    Opcode("PRODUCTS32", ("int", "int", "lanes", "f1r", "int", "f1", *_INT8, "bool", "int", "i64", "bool", "f3"),
           "products of f32 weight rows with them"),
    Opcode("MOVE", ("f2", "f2", "i64", "bool"),
           "rows gathered (dst[i] = src[ids[i]]) or scattered: src, dst, ids, scatter"),
    Opcode("CONCAT", ("f2", "f2", "f2"), "x rows, then y rows -> out rows"),
    Opcode("CONV", ("f3", "f2", "f3"), "Mamba's causal conv: sx, w, y"),
    Opcode("SCAN", ("f3", "f3", "f3", "f2", "f3", "f3", "f3", "f3"),
           "Mamba-1's selective scan: s, x, dt, A, B, C, y, states"),
    Opcode("LIBM", ("f2", "int", "f2"), "glibc's exp, tanh, sigmoid or softplus of rows: x, which, out"),
    Opcode("UNARY", ("f2", "f2", "int", "f32"), "relu, square, negation or scaling of rows: x, out, which, s"),
    Opcode("LAYER_NORM", ("f2", "f32", "int", "f2"), "norm rows: x, eps, lanes, out"),
    Opcode("GELU", ("f2", "f2", "bool", "f1", "f2"),
           "gelu rows through ggml's table (geglu: gated by u): x, u, gated, table, out"),
    Opcode("SOFT_MAX", ("f2", "f2", "int", "f32", "f1", "int", "int", "int", "f2", "f1"),
           "x, mask rows, mrows, scale, ALiBi slopes, head, lanes, variant, out, sinks"),
    Opcode("SHORT_DOTS", ("f3", "f1", "int", "f2"),
           "f16 rows shorter than a step, one x row: w by columns in blocks, x, k, out"),
    Opcode("STRIDED", ("f1", "int", "int", "int", "int", "f3"),
           "a strided view copied: flat src, offset, three strides, out"),
    Opcode("WKV6", ("f3", "f3", "f3", "f2", "f3", "f4", "f3", "f4"),
           "RWKV6's wkv: k, v, r, time_first, decay, states, y, new states"),
    Opcode("SHORT_DOTS32", ("f2", "f1", "int", "int", "f1"),
           "f32 ones: w by columns, x, k, the products added unfused up to, out"),
    Opcode("WEIGHT_ROWS16", ("u16r", "int", "i64", "f2"),
           "an f16 weight's rows as float32: w flat, row length, ids, out"),
    Opcode("WEIGHT_ROWS32", ("f1r", "int", "i64", "f2"), "an f32 weight's rows: w flat, row length, ids, out"),
    Opcode("SCAN_HEADS", ("f4", "f4", "f3", "f1", "f4", "f4", "f4", "f4", "lanes", "bool"),
           "Mamba-2's scan: s, x, dt, A, B, C, y, states, hadd"),
    Opcode("PLACE", (), "rows read where they lie (Tape.row_in_place), at the start of a run"),
)
Op = IntEnum("Op", [(o.name, code) for code, o in enumerate(OPCODES)])   # type: ignore[misc]
PLACE = Op.PLACE


def _argument(kind: str, j: int) -> str:
    """The player's expression of an argument of ``kind`` whose word is a[j]."""
    return {"int": f"a[{j}]", "bool": f"a[{j}] != 0", "f32": f"f32s[a[{j}]]", "reg": f"regs[a[{j}]]"}.get(
        kind, f"read_{kind}(t, a[{j}])")


def player_source() -> str:
    """The text of the player module: one branch per opcode, its kernel called with its arguments as the table
    declares them."""
    branches = []
    for code, o in enumerate(OPCODES):
        test = f"{'if' if code == 0 else 'elif'} op == {code}:"
        if o.name == "PLACE":
            branches.append(f"            {test}  # PLACE: {o.doc}\n                pc = place(t, code, pc + 2)")
            continue
        args, j = [], 0
        for kind in o.args:
            if kind == "lanes":
                args.append("v")
            else:
                args.append(_argument(kind, j))
                j += 1
        branches.append(f"            {test}  # {o.name}: {o.doc}\n"
                        f"                call_at(at, ({', '.join(args)}))\n                pc += {o.words}")
    readers = [f"read_{k}" for k in sorted({k for o in OPCODES for k in o.args if k not in SCALARS})]
    names = textwrap.fill(", ".join([*readers, "cycles_now", "place"]), 116, initial_indent="    ",
                          subsequent_indent="    ")
    return _PLAYER.format(names=names, branches="\n".join(branches))


_PLAYER = '''"""The tape's player, generated from the opcode table by graphir.backends.numba.tape.opcodes: do not edit."""

from __future__ import annotations

import functools
from typing import Callable

from numba import njit

from graphir.backends.numba.primitives import simd
from graphir.backends.numba.primitives.jit import SER, call_at
from graphir.backends.numba.tape.arrays import (
{names})


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
                c0 = cycles_now()
            op, at = code[pc], code[pc + 1]
            a = code[pc + 2:]
{branches}
            else:
                raise ValueError("unknown tape opcode")
            if timed:
                spent[i] += cycles_now() - c0
            i += 1

    return play
'''

PLAYER_PATH = Path(__file__).with_name("player.py")

if __name__ == "__main__":
    PLAYER_PATH.write_text(player_source())
