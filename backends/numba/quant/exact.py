"""Q4_1, Q5_1, Q8_0 and Q4_0: llama.cpp's dot products bit for bit, in a layout of their own.

ggml_vec_dot_q4_1_q8_1, _q5_1_q8_1 and ggml_vec_dot_q8_0_q8_0 (x86 quants.c, AVX2 path; tinyBLAS_Q0_AVX, which takes
Q8_0 x Q8_0 when n >= 2, keeps the same order per output element): per 32-block, eight int32 lane sums of
four consecutive products (VNNI dpbusd / maddubs+madd), converted to float and accumulated lane-wise as
acc[l] = fma(d_w * d_x, lane[l], acc[l]) in block order; the result is hsum8(acc), plus for Q4_1 and Q5_1 the
min term summs = fma(m_w, s_x, summs) chained over the blocks (a scalar vfmadd231ss in the build) and added last.
Q5_1's blocks are laid out as Q8_0's with their values 0-31 as unsigned bytes (ggml forms the same bytes from the
nibbles and the fifth bits before its unsigned-by-signed multiply-add), its m beside d.
Layout: weight rows in groups of _G; inside a group, block by block, the quant bytes of its rows one row after
another as GGUF stores them, and apart the rows' d (and m) as f16, [group][block][row]: a plain regrouping of
the GGUF blocks, no byte changed. The GEMV forms the lane sums with the host's integer dot product
(quant.int8_dot: VNNI, pmaddubsw, or plain vector arithmetic), two rows to an AVX-512 register, and scales a
block's rows from one register of their d. It serves every number of activation rows: a group's rows stay in
L1 while all of x meets them, and on an AVX2 host it measured faster than a GEMM that expanded the weights to
float, at every n from 3 to 512 (1.3-6x; the per-element order is the same, so are the bits).
Q4_0, whose matrices llama.cpp repacks when their rows come in eights, is summed in the order of its 8x8 kernels
instead (exact_gemv's "q4_0x8"); Q5_0, and Q4_0 whose rows do not come in eights, run as Q8_0 (_as_q8_0).
Activations: the int8 quants in natural order, d and s per block.
The formats share one GEMV (exact_gemv; several weights on one x run as one GEMV over their rows laid one after
another, quant.weight.QWeightGroup): the format is a closure constant that picks its lane functions, and numba
compiles only that branch. (A closure over the functions themselves would change numba's cache key in every
process: the key pickles a dispatcher with a per-process uuid, and the kernels would compile again at each
start.)
"""

from __future__ import annotations

from typing import Callable

import numpy as np
from numba import njit, prange

from graphir.backends.numba.primitives.jit import INL
from graphir.backends.numba.primitives.simd import (lanes, prefetch, vfma, vfold_blocks, vhsum8_at, vhsum8_halves,
                                                    vload, vmul, vsplat, vspread, vspread4, vstore, vsub, vzero, width)
from graphir.backends.numba.quant.activation import q8_blocks
from graphir.backends.numba.quant.blocks import IQ4_NL_VALUES
from graphir.backends.numba.quant.int8_dot import WIDE_LANES, block_lanes, nibble_half_lanes

_F32 = np.float32
_exact = dict(parallel=True, cache=True)                  # no FMA contraction but the written ones: bit-exact

_G = 16                    # weight rows per group of the layout (an AVX-512 register of their scales)
GEMV_LANES = WIDE_LANES    # float32 lanes of the GEMV's registers: AVX-512 holds two rows' eight lanes

_lanes_q4_1, _lanes_q8_0, _lanes_u8 = block_lanes("q4_1"), block_lanes("q8_0"), block_lanes("u8")
_low_q4_1, _high_q4_1 = nibble_half_lanes(False), nibble_half_lanes(True)
_AHEAD = 16                # blocks of a group run that the GEMV asks the memory for ahead of their use


@njit(**INL)
def _ask_ahead(qs, d, m, o, qb, with_min):
    """Prefetch the block _AHEAD blocks on (its rows' quants, scales and mins; first row o of this one): a
    thread's groups lie one after another, yet the hardware's prefetch alone leaves the GEMV waiting on memory
    (1B-class Q8_0 matrices on two Zen 5 cores: 37 -> 66 GB/s; SmolLM2's Q4_1 matrices on an AVX-512 Intel host,
    30 layers' in turn from memory: ffn_up 50.7 -> 48.5 us, attn_q 31.0 -> 28.0)."""
    a = o + _AHEAD * _G
    for j in range(0, _G * qb, 64):
        prefetch(qs, a * qb + j)
    prefetch(d, a)
    if with_min:
        prefetch(m, a)


def _regrouped(b: np.ndarray, q0: int, q1: int, with_min: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """GGUF blocks (rows, nblocks, type size) -> (quant bytes q0:q1, d, m) as [group][block][row]; rows are padded
    with zero blocks to whole groups (their results are never written)."""
    rows, nb, size = b.shape
    if rows % _G:
        b = np.concatenate([b, np.zeros((-rows % _G, nb, size), b.dtype)])
    g = b.reshape(-1, _G, nb, size).transpose(0, 2, 1, 3)

    def f16(at: int) -> np.ndarray:
        return np.ascontiguousarray(g[..., at:at + 2]).view(np.uint16).reshape(-1)

    return np.ascontiguousarray(g[..., q0:q1]).reshape(-1), f16(0), f16(2) if with_min else np.empty(0, np.uint16)


def pack_q4_1(b):
    return _regrouped(b, 4, 20, True)


def pack_q8_0(b):
    return _regrouped(b, 2, 34, False)


def pack_q5_1(b):
    """Q5_1 blocks (f16 d, f16 m, 32 fifth bits, 16 nibble bytes) -> d, m and the 32 values as bytes, grouped."""
    values = _nibbles(b[:, :, 8:24]) | (_fifth_bits(b[:, :, 4:8]) << 4).astype(np.uint8)
    return _regrouped(np.concatenate([b[:, :, 0:4], values], axis=-1), 4, 36, True)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """A block's 16 bytes -> its 32 four-bit codes in natural order (byte j: element j low, j + 16 high)."""
    return np.concatenate([qs & 15, qs >> 4], axis=-1)


def _as_q8_0(b: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Blocks whose f16 d leads them and whose 32 values fit int8, packed as Q8_0 blocks of the same numbers:
    ggml_vec_dot_q4_0_q8_0 and _q5_0_q8_0 form the same lane sums from them as ggml_vec_dot_q8_0_q8_0 (the
    values unpacked to bytes first, then one multiply-add path), so their dot products are Q8_0's."""
    return pack_q8_0(np.concatenate([b[:, :, 0:2], values.astype(np.int8).view(np.uint8)], axis=-1))


def pack_q4_0(b):
    return _regrouped(b, 2, 18, False)


def pack_q4_0_as_q8_0(b):
    return _as_q8_0(b, _nibbles(b[:, :, 2:18]).astype(np.int16) - 8)


def pack_iq4_nl_as_q8_0(b):
    """IQ4_NL blocks as Q8_0 blocks of their values (kvalues_iq4nl): tinyBLAS_Q0_AVX and
    ggml_vec_dot_iq4_nl_q8_0 look a block's codes up to those bytes, then form Q8_0's lane sums."""
    return _as_q8_0(b, IQ4_NL_VALUES.astype(np.int16)[_nibbles(b[:, :, 2:18])])


def _fifth_bits(qh: np.ndarray) -> np.ndarray:
    """A block's 4 bytes of fifth bits -> one per element (bit j: element j's)."""
    return qh.copy().view(np.uint32) >> np.arange(32, dtype=np.uint32) & 1


def pack_q5_0_as_q8_0(b):
    return _as_q8_0(b, _nibbles(b[:, :, 6:22]).astype(np.int16) + 16 * _fifth_bits(b[:, :, 2:6]).astype(np.int16) - 16)


@njit(cache=True, inline="always")
def _lanes_8(u8, v, qs, qo, y, yo):
    """A register of Q8_0 rows' lane sums, or with ``u8`` of Q5_1 rows' (their values as unsigned bytes)."""
    return _lanes_u8(v, qs, qo, y, yo) if u8 else _lanes_q8_0(v, qs, qo, y, yo)


@njit(cache=True, inline="always")
def _rows_out(acc, r, with_min, sm, j, out, i, row, rows):
    """The results of a register of r Q8_0 (or Q5_1) rows, the first of them ``row``: each row's hsum8 (plus, with
    a min term, its own from sm[j]), where the row exists."""
    if row < rows:
        out[i, row] = vhsum8_at(acc, 0) + sm[j] if with_min else vhsum8_at(acc, 0)
    if r == 2 and row + 1 < rows:
        out[i, row + 1] = vhsum8_at(acc, 1) + sm[j + 1] if with_min else vhsum8_at(acc, 1)


@njit(cache=True, inline="always")
def _halves_out(lo, hi, sm, out, i, row, rows):
    """The results of a register pair of n / 4 Q4_1 rows in halves (nibble_half_lanes), the first of them ``row``:
    each row's hsum8 plus its min term, where the row exists."""
    j, r = row % width(lo), width(lo) // 4
    if row < rows:
        out[i, row] = vhsum8_halves(lo, hi, 0) + sm[j]
    if r > 1 and row + 1 < rows:
        out[i, row + 1] = vhsum8_halves(lo, hi, 1) + sm[j + 1]
    if r > 2 and row + 2 < rows:
        out[i, row + 2] = vhsum8_halves(lo, hi, 2) + sm[j + 2]
    if r > 3 and row + 3 < rows:
        out[i, row + 3] = vhsum8_halves(lo, hi, 3) + sm[j + 3]


@njit(cache=True, inline="always")
def _row_sums(a0, a1, a2, a3, a4, a5, a6, a7):
    """Eight registers of R rows' eight lanes each -> one register of those 8R rows' sums, in row order."""
    return vfold_blocks(vfold_blocks(vfold_blocks(a0, a1, 1), vfold_blocks(a2, a3, 1), 1),
                        vfold_blocks(vfold_blocks(a4, a5, 1), vfold_blocks(a6, a7, 1), 1), 1)


def exact_gemv(fmt: str, n_lanes: int = GEMV_LANES) -> Callable:
    """ggml_vec_dot_q4_1_q8_1 (fmt "q4_1"), ggml_vec_dot_q8_0_q8_0 ("q8_0") or ggml_vec_dot_q5_1_q8_1 ("q5_1",
    Q8_0's registers with Q4_1's min term) for any n: prange over
    groups of _G weight rows; per activation row, 8 registers of R rows each at a time, their lane chains held in
    registers over the blocks. The block's d_w * d_x for those rows is one register (spread over each row's lanes
    by vspread), and Q4_1's min term chains in one register across the rows. n_lanes: float32 lanes of a register
    (R = n_lanes / 8 rows).
    "q4_0x8": Q4_0 in the order of llama.cpp's repacked 8x8 kernels, for any n: per block each row's exact sum
    (its nibbles' lane sums added across, less 8 times the activation block's sum), then one FMA with d_w * d_x,
    the rows of a pass side by side in one register.
    "q4_1" keeps each row's eight lane chains in two halves instead (nibble_half_lanes: lanes 0-3 of n / 4 rows in
    one register, 4-7 in another, four such pairs): one load of n / 4 rows' bytes serves both, where putting a
    row's halves side by side took a byte shuffle per row (SmolLM2's ffn_up at n = 1 on AVX2: 31.8 -> 26.5 us).
    The chains are the same, lane for lane, so are the bits."""
    if fmt not in ("q4_1", "q8_0", "q5_1", "q4_0x8"):
        raise ValueError(f"exact_gemv: unknown format {fmt!r}")
    q4_1, q5_1, whole = fmt == "q4_1", fmt == "q5_1", fmt == "q4_0x8"
    qb = 32 if fmt in ("q8_0", "q5_1") else 16                      # quant bytes of a block of one row (16: nibbles)
    v_, r = lanes(n_lanes), n_lanes // 8

    @njit(cache=True)
    def group(g, qs, d, m, yf, yd, ys, out):
        """Weight rows g * _G .. + _G for every activation row: the body of gemv's parallel loop, a function of
        its own (numba's analysis of parallel code took seconds to compile it inside the loop)."""
        v = v_
        n, nb, rows = yd.shape[0], yd.shape[1], out.shape[1]
        k = nb * 32
        dd, sm = np.empty(width(v), _F32), np.empty(width(v), _F32)
        for i in range(n):
            for h in range(0, _G, width(v)):              # 8 registers of R rows: width(v) rows at a time
                if whole:
                    acc = vzero(v)
                    for b in range(nb):
                        o = (g * nb + b) * _G + h
                        if i == 0 and h == 0:
                            _ask_ahead(qs, d, m, o, qb, q4_1)
                        qo, yo, step = o * qb, i * k + b * 32, r * qb
                        sums = _row_sums(_lanes_q4_1(v, qs, qo, yf, yo), _lanes_q4_1(v, qs, qo + step, yf, yo),
                                         _lanes_q4_1(v, qs, qo + 2 * step, yf, yo),
                                         _lanes_q4_1(v, qs, qo + 3 * step, yf, yo),
                                         _lanes_q4_1(v, qs, qo + 4 * step, yf, yo),
                                         _lanes_q4_1(v, qs, qo + 5 * step, yf, yo),
                                         _lanes_q4_1(v, qs, qo + 6 * step, yf, yo),
                                         _lanes_q4_1(v, qs, qo + 7 * step, yf, yo))
                        acc = vfma(vsub(sums, vsplat(v, ys[i, b])), vmul(vload(v, d, o), vsplat(v, yd[i, b])), acc)
                    vstore(dd, 0, acc)
                    for j in range(min(width(v), rows - g * _G - h)):
                        out[i, g * _G + h + j] = dd[j]
                    continue
                if q4_1:                                  # four register pairs of n / 4 rows' halves each
                    l0 = l1 = l2 = l3 = h0 = h1 = h2 = h3 = summ = vzero(v)
                    r4 = width(v) // 4
                    for b in range(nb):
                        o = (g * nb + b) * _G + h
                        if i == 0 and h == 0:
                            _ask_ahead(qs, d, m, o, qb, q4_1)
                        vstore(dd, 0, vmul(vload(v, d, o), vsplat(v, yd[i, b])))
                        summ = vfma(vload(v, m, o), vsplat(v, ys[i, b]), summ)
                        qo, yo, step = o * 16, i * k + b * 32, r4 * 16
                        f = vspread4(v, dd, 0)
                        l0 = vfma(f, _low_q4_1(v, qs, qo, yf, yo), l0)
                        h0 = vfma(f, _high_q4_1(v, qs, qo, yf, yo), h0)
                        f, qo = vspread4(v, dd, r4), qo + step
                        l1 = vfma(f, _low_q4_1(v, qs, qo, yf, yo), l1)
                        h1 = vfma(f, _high_q4_1(v, qs, qo, yf, yo), h1)
                        f, qo = vspread4(v, dd, 2 * r4), qo + step
                        l2 = vfma(f, _low_q4_1(v, qs, qo, yf, yo), l2)
                        h2 = vfma(f, _high_q4_1(v, qs, qo, yf, yo), h2)
                        f, qo = vspread4(v, dd, 3 * r4), qo + step
                        l3 = vfma(f, _low_q4_1(v, qs, qo, yf, yo), l3)
                        h3 = vfma(f, _high_q4_1(v, qs, qo, yf, yo), h3)
                    vstore(sm, 0, summ)
                    r0 = g * _G + h
                    _halves_out(l0, h0, sm, out, i, r0, rows)
                    _halves_out(l1, h1, sm, out, i, r0 + r4, rows)
                    _halves_out(l2, h2, sm, out, i, r0 + 2 * r4, rows)
                    _halves_out(l3, h3, sm, out, i, r0 + 3 * r4, rows)
                    continue
                a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = summ = vzero(v)   # Q8_0, Q5_1: 8 registers of R rows
                for b in range(nb):
                    o = (g * nb + b) * _G + h             # the first row's scale; its quants at o * qb
                    if i == 0 and h == 0:
                        _ask_ahead(qs, d, m, o, qb, q5_1)
                    vstore(dd, 0, vmul(vload(v, d, o), vsplat(v, yd[i, b])))
                    if q5_1:
                        summ = vfma(vload(v, m, o), vsplat(v, ys[i, b]), summ)
                    qo, yo, step = o * qb, i * k + b * 32, r * qb
                    a0 = vfma(vspread(v, dd, 0), _lanes_8(q5_1, v, qs, qo, yf, yo), a0)
                    a1 = vfma(vspread(v, dd, r), _lanes_8(q5_1, v, qs, qo + step, yf, yo), a1)
                    a2 = vfma(vspread(v, dd, 2 * r), _lanes_8(q5_1, v, qs, qo + 2 * step, yf, yo), a2)
                    a3 = vfma(vspread(v, dd, 3 * r), _lanes_8(q5_1, v, qs, qo + 3 * step, yf, yo), a3)
                    a4 = vfma(vspread(v, dd, 4 * r), _lanes_8(q5_1, v, qs, qo + 4 * step, yf, yo), a4)
                    a5 = vfma(vspread(v, dd, 5 * r), _lanes_8(q5_1, v, qs, qo + 5 * step, yf, yo), a5)
                    a6 = vfma(vspread(v, dd, 6 * r), _lanes_8(q5_1, v, qs, qo + 6 * step, yf, yo), a6)
                    a7 = vfma(vspread(v, dd, 7 * r), _lanes_8(q5_1, v, qs, qo + 7 * step, yf, yo), a7)
                vstore(sm, 0, summ)
                r0 = g * _G + h
                _rows_out(a0, r, q5_1, sm, 0, out, i, r0, rows)
                _rows_out(a1, r, q5_1, sm, r, out, i, r0 + r, rows)
                _rows_out(a2, r, q5_1, sm, 2 * r, out, i, r0 + 2 * r, rows)
                _rows_out(a3, r, q5_1, sm, 3 * r, out, i, r0 + 3 * r, rows)
                _rows_out(a4, r, q5_1, sm, 4 * r, out, i, r0 + 4 * r, rows)
                _rows_out(a5, r, q5_1, sm, 5 * r, out, i, r0 + 5 * r, rows)
                _rows_out(a6, r, q5_1, sm, 6 * r, out, i, r0 + 6 * r, rows)
                _rows_out(a7, r, q5_1, sm, 7 * r, out, i, r0 + 7 * r, rows)


    @njit(**_exact)
    def gemv(qs, d, m, x, out):
        n, k = x.shape
        nb, rows = k >> 5, out.shape[1]
        y, yd, ys = np.empty((n, k), np.int8), np.empty((n, nb), _F32), np.empty((n, nb), _F32)
        q8_blocks(x, y, yd, ys)
        yf = y.reshape(-1)
        if whole:                                             # 8 times each block's sum of quants
            for i in range(n):
                for b in range(nb):
                    t = 0
                    for j in range(32):
                        t += yf[i * k + b * 32 + j]
                    ys[i, b] = _F32(8 * t)
        for g in prange((rows + _G - 1) // _G):
            group(np.int64(g), qs, d, m, yf, yd, ys, out)   # one signature in and outside the loop

    return gemv
