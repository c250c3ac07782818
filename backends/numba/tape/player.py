"""The tape's player, generated from the opcode table by graphir.backends.numba.tape.opcodes: do not edit."""

from __future__ import annotations

import functools
from typing import Callable

from numba import njit

from graphir.backends.numba.primitives import simd
from graphir.backends.numba.primitives.jit import SER, call_at
from graphir.backends.numba.tape.arrays import (
    read_f1, read_f1r, read_f2, read_f2r, read_f3, read_f4, read_i64, read_i8_3, read_u16, read_u16_2, read_u16r,
    read_u8, read_u8_2, cycles_now, place)


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
            if op == 0:  # GEMV2: GEMV of a two-part packed weight (the exact kinds', Q4_K's): (quants, d), x, out
                call_at(at, (read_u8(t, a[0]), read_u16(t, a[1]), read_f2(t, a[2]), read_f2(t, a[3])))
                pc += 6
            elif op == 1:  # GEMV3: of a three-part one: (qs, d, m), x, out
                call_at(at, (read_u8(t, a[0]), read_u16(t, a[1]), read_u16(t, a[2]), read_f2(t, a[3]), read_f2(t, a[4])))
                pc += 7
            elif op == 2:  # GEMVK: of a K-quant's (or I-quant's) values, scales and d (quant.kquant's k_product): x, out
                call_at(at, (read_u8_2(t, a[0]), read_i8_3(t, a[1]), read_f3(t, a[2]), read_f2(t, a[3]), read_f2(t, a[4])))
                pc += 7
            elif op == 3:  # NORM: rms_norm rows: x, eps, w, out
                call_at(at, (read_f2(t, a[0]), f32s[a[1]], read_f1r(t, a[2]), read_f2(t, a[3])))
                pc += 6
            elif op == 4:  # BINARY: x op y -> out by rows, row r with y's (r // div) % len(y): x, y, div, out, op
                call_at(at, (read_f2(t, a[0]), read_f2(t, a[1]), a[2], read_f2(t, a[3]), a[4]))
                pc += 7
            elif op == 5:  # SILU: silu rows, gated: x, lanes, variant, gate, out
                call_at(at, (read_f2(t, a[0]), a[1], a[2], read_f2(t, a[3]), read_f2(t, a[4])))
                pc += 7
            elif op == 6:  # ROPE: rope rows: x, cos, sin, n_tok, n_head, n_dims, neox, n_fused, out
                call_at(at, (read_f2(t, a[0]), read_f2(t, a[1]), read_f2(t, a[2]), a[3], a[4], a[5], a[6] != 0, a[7], read_f2(t, a[8])))
                pc += 11
            elif op == 7:  # SET_ROWS: f16 rows: dst bits, src, ids
                call_at(at, (read_u16_2(t, a[0]), read_f2(t, a[1]), read_i64(t, a[2])))
                pc += 5
            elif op == 8:  # ATTEND: one query token's attention; the cells read up to: a register set per run
                call_at(at, (a[0], a[1], read_u16r(t, a[2]), a[3], a[4], a[5], read_f2(t, a[6]), a[7], a[8], a[9], read_f2(t, a[10]), a[11], regs[a[12]], f32s[a[13]], a[14], read_u16r(t, a[15]), a[16], a[17], a[18], a[19], read_f3(t, a[20]), read_f3(t, a[21])))
                pc += 24
            elif op == 9:  # ROWS: activations as padded float32 rows for the float products: src, kind, out
                call_at(at, (read_f2r(t, a[0]), a[1], read_f2(t, a[2])))
                pc += 5
            elif op == 10:  # PRODUCTS16: products of f16 weight rows with them
                call_at(at, (a[0], a[1], v, read_u16r(t, a[2]), a[3], read_f1(t, a[4]), a[5], a[6], a[7], a[8], a[9], a[10], a[11], a[12], a[13] != 0, a[14], read_i64(t, a[15]), a[16] != 0, read_f3(t, a[17])))
                pc += 20
            elif op == 11:  # PRODUCTS32: products of f32 weight rows with them
                call_at(at, (a[0], a[1], v, read_f1r(t, a[2]), a[3], read_f1(t, a[4]), a[5], a[6], a[7], a[8], a[9], a[10], a[11], a[12], a[13] != 0, a[14], read_i64(t, a[15]), a[16] != 0, read_f3(t, a[17])))
                pc += 20
            elif op == 12:  # MOVE: rows gathered (dst[i] = src[ids[i]]) or scattered: src, dst, ids, scatter
                call_at(at, (read_f2(t, a[0]), read_f2(t, a[1]), read_i64(t, a[2]), a[3] != 0))
                pc += 6
            elif op == 13:  # CONCAT: x rows, then y rows -> out rows
                call_at(at, (read_f2(t, a[0]), read_f2(t, a[1]), read_f2(t, a[2])))
                pc += 5
            elif op == 14:  # CONV: Mamba's causal conv: sx, w, y
                call_at(at, (read_f3(t, a[0]), read_f2(t, a[1]), read_f3(t, a[2])))
                pc += 5
            elif op == 15:  # SCAN: Mamba-1's selective scan: s, x, dt, A, B, C, y, states
                call_at(at, (read_f3(t, a[0]), read_f3(t, a[1]), read_f3(t, a[2]), read_f2(t, a[3]), read_f3(t, a[4]), read_f3(t, a[5]), read_f3(t, a[6]), read_f3(t, a[7])))
                pc += 10
            elif op == 16:  # LIBM: glibc's exp, tanh, sigmoid or softplus of rows: x, which, out
                call_at(at, (read_f2(t, a[0]), a[1], read_f2(t, a[2])))
                pc += 5
            elif op == 17:  # UNARY: relu, square, negation or scaling of rows: x, out, which, s
                call_at(at, (read_f2(t, a[0]), read_f2(t, a[1]), a[2], f32s[a[3]]))
                pc += 6
            elif op == 18:  # LAYER_NORM: norm rows: x, eps, lanes, out
                call_at(at, (read_f2(t, a[0]), f32s[a[1]], a[2], read_f2(t, a[3])))
                pc += 6
            elif op == 19:  # GELU: gelu rows through ggml's table (geglu: gated by u): x, u, gated, table, out
                call_at(at, (read_f2(t, a[0]), read_f2(t, a[1]), a[2] != 0, read_f1(t, a[3]), read_f2(t, a[4])))
                pc += 7
            elif op == 20:  # SOFT_MAX: x, mask rows, mrows, scale, ALiBi slopes, head, lanes, variant, out, sinks
                call_at(at, (read_f2(t, a[0]), read_f2(t, a[1]), a[2], f32s[a[3]], read_f1(t, a[4]), a[5], a[6], a[7], read_f2(t, a[8]), read_f1(t, a[9])))
                pc += 12
            elif op == 21:  # SHORT_DOTS: f16 rows shorter than a step, one x row: w by columns in blocks, x, k, out
                call_at(at, (read_f3(t, a[0]), read_f1(t, a[1]), a[2], read_f2(t, a[3])))
                pc += 6
            elif op == 22:  # STRIDED: a strided view copied: flat src, offset, three strides, out
                call_at(at, (read_f1(t, a[0]), a[1], a[2], a[3], a[4], read_f3(t, a[5])))
                pc += 8
            elif op == 23:  # WKV6: RWKV6's wkv: k, v, r, time_first, decay, states, y, new states
                call_at(at, (read_f3(t, a[0]), read_f3(t, a[1]), read_f3(t, a[2]), read_f2(t, a[3]), read_f3(t, a[4]), read_f4(t, a[5]), read_f3(t, a[6]), read_f4(t, a[7])))
                pc += 10
            elif op == 24:  # SHORT_DOTS32: f32 ones: w by columns, x, k, the products added unfused up to, out
                call_at(at, (read_f2(t, a[0]), read_f1(t, a[1]), a[2], a[3], read_f1(t, a[4])))
                pc += 7
            elif op == 25:  # WEIGHT_ROWS16: an f16 weight's rows as float32: w flat, row length, ids, out
                call_at(at, (read_u16r(t, a[0]), a[1], read_i64(t, a[2]), read_f2(t, a[3])))
                pc += 6
            elif op == 26:  # WEIGHT_ROWS32: an f32 weight's rows: w flat, row length, ids, out
                call_at(at, (read_f1r(t, a[0]), a[1], read_i64(t, a[2]), read_f2(t, a[3])))
                pc += 6
            elif op == 27:  # SCAN_HEADS: Mamba-2's scan: s, x, dt, A, B, C, y, states, hadd
                call_at(at, (read_f4(t, a[0]), read_f4(t, a[1]), read_f3(t, a[2]), read_f1(t, a[3]), read_f4(t, a[4]), read_f4(t, a[5]), read_f4(t, a[6]), read_f4(t, a[7]), v, a[8] != 0))
                pc += 11
            elif op == 28:  # PLACE: rows read where they lie (Tape.row_in_place), at the start of a run
                pc = place(t, code, pc + 2)
            else:
                raise ValueError("unknown tape opcode")
            if timed:
                spent[i] += cycles_now() - c0
            i += 1

    return play
