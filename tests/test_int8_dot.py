"""Lane sums of quantized blocks (quant.int8_dot): every way this host can form them (VNNI, pmaddubsw + pmaddwd,
plain vector arithmetic), for registers of one row and of two, and for Q4_1 in halves of two or four rows, gives
ggml's integers: lane l of a row is the sum of the products of its elements 4l .. 4l + 3. A K-quant super-block's
lanes (k_lanes) add those of its eight runs of 32 elements, each times its sub-block's scale, and
Q5_K's and Q2_K's min integers (k_mins) those of its mins with the activation's sums, row by row."""

from __future__ import annotations

import llvmlite.binding as llvm
import numpy as np
import pytest
from numba import njit

from graphir.backends.numba.primitives.simd import lanes, vstore, width
from graphir.backends.numba.quant.blocks import IQ4_NL_VALUES, MXFP4_VALUES
from graphir.backends.numba.quant.int8_dot import (FLAVOURS, HOST, PLANES, block_lanes, k_lanes, k_mins, k_start,
                                                   nibble_half_lanes, plane_values, row_code_dots, row_k_dots,
                                                   row_nibble_dots)

def _elements(fmt: str, q: np.ndarray) -> np.ndarray:
    """A row's 32 weight quants in element order, from its block bytes."""
    if fmt == "q4_1":
        return np.concatenate([q & 15, q >> 4]).astype(np.int64)
    return q.view(np.int8).astype(np.int64)


def _kernel(fmt: str, flavour: str):  # type: ignore[no-untyped-def]
    block = block_lanes(fmt, flavour)

    @njit
    def run(v, q, y, out):
        vstore(out, 0, block(v, q, 0, y, 0))

    return run


@pytest.mark.parametrize("flavour", FLAVOURS)
@pytest.mark.parametrize("fmt", ["q4_1", "q8_0"])
@pytest.mark.parametrize("n", [8, 16])        # 16 lanes without AVX-512's byte instructions: the plain form
def test_every_way_gives_ggml_lane_sums(flavour, fmt, n):
    rng = np.random.default_rng(n)
    rows, size = n // 8, 16 if fmt == "q4_1" else 32
    run = _kernel(fmt, flavour)
    for trial in range(20):
        q = rng.integers(0, 256, rows * size, dtype=np.uint8)
        y = rng.integers(-127, 128, 32, dtype=np.int8)
        if trial == 0:                                        # the extremes: the largest sums either way
            q[:] = 0x80 if fmt == "q8_0" else 0xFF
            y[:] = -127
        if trial == 1:
            q[:] = 0x7F if fmt == "q8_0" else 0xFF
            y[:] = 127
        out = np.empty(n, np.float32)
        run(lanes(n), q, y, out)
        want = np.concatenate([(_elements(fmt, q[r * size:(r + 1) * size]) * y).reshape(8, 4).sum(axis=1)
                               for r in range(rows)])
        assert np.array_equal(out, want.astype(np.float32)), (flavour, fmt, n, trial)


@pytest.mark.parametrize("flavour", FLAVOURS)
@pytest.mark.parametrize("n", [8, 16])
def test_a_q8_0_quant_of_minus_128_meets_negative_weights_as_ggmls_sign_trick_does(flavour, n):
    """-128 in the activation (the quantizer's output for a NaN) against a negative weight: _mm256_sign_epi8
    negates it to itself, so ggml's product is |w| * -128, not w * -128; every way must give ggml's."""
    rng = np.random.default_rng(128 + n)
    run = _kernel("q8_0", flavour)
    for trial in range(10):
        q = rng.integers(0, 256, 4 * n, dtype=np.uint8)
        y = rng.integers(-127, 128, 32, dtype=np.int8)
        y[rng.integers(0, 32, 1 + trial)] = -128
        out = np.empty(n, np.float32)
        run(lanes(n), q, y, out)
        w = q.view(np.int8).astype(np.int64).reshape(n // 8, 32)
        y_signed = np.where(w < 0, np.where(y == -128, -128, -y.astype(np.int64)), np.where(w == 0, 0, y))
        want = (np.abs(w) * y_signed).reshape(n // 8, 8, 4).sum(axis=2).reshape(-1)
        assert np.array_equal(out, want.astype(np.float32)), (flavour, n, trial)


@pytest.mark.parametrize("flavour", FLAVOURS)
@pytest.mark.parametrize("pairs, rows", [(1, 1), (4, 1), (1, 4)])
@pytest.mark.parametrize("n", [8, 16])
def test_rows_side_by_side_give_each_rows_scaled_nibble_dots(flavour, pairs, rows, n):
    """row_nibble_dots: lane l is row l's sum over the pairs of sub-blocks of scale times (4-bit values . 32
    quants), from the chunked layout (four bytes a row, the rows one after another, eight chunks a pair); several
    activation rows at once (100 quants apart), each its own."""
    dots = row_nibble_dots(pairs, flavour, rows=rows)

    @njit
    def one(v, q, y, sc, out):
        vstore(out, 0, dots(v, q, 0, y, 0, 100, sc, 0))

    @njit
    def four(v, q, y, sc, out):
        r0, r1, r2, r3 = dots(v, q, 0, y, 0, 100, sc, 0)
        vstore(out, 0, r0)
        vstore(out, width(v), r1)
        vstore(out, 2 * width(v), r2)
        vstore(out, 3 * width(v), r3)

    rng = np.random.default_rng(pairs * n)
    for trial in range(10):
        values = rng.integers(0, 16, (n, pairs, 2, 32), dtype=np.uint8)   # row, pair, sub-block, element
        y = rng.integers(-128, 128, (rows, pairs, 2, 32), dtype=np.int8)
        sc = rng.integers(0, 64, (pairs, 2, n), dtype=np.uint8)
        if trial == 0:                                        # the extremes: every product and scale at its largest
            values[:], y[:], sc[:] = 15, -128, 63
        packed = (values[:, :, 0] | values[:, :, 1] << 4).reshape(n, pairs, 8, 4).transpose(1, 2, 0, 3)
        y_rows = np.zeros((rows, 100 if pairs == 1 else 256), np.int8)
        y_rows[:, :64 * pairs] = y.reshape(rows, -1)
        out = np.empty(rows * n, np.float32)
        (one if rows == 1 else four)(lanes(n), np.ascontiguousarray(packed).reshape(-1), y_rows.reshape(-1),
                                     sc.reshape(-1), out)
        for r in range(rows):
            want = np.einsum("rpse,pse,psr->r", values.astype(np.int64), y[r].astype(np.int64), sc.astype(np.int64))
            assert np.array_equal(out[r * n:(r + 1) * n], want.astype(np.float32)), (flavour, pairs, n, trial, r)


@pytest.mark.parametrize("flavour", FLAVOURS)
@pytest.mark.parametrize("table", ["iq4_nl", "mxfp4"])
@pytest.mark.parametrize("n", [8, 16])
def test_rows_side_by_side_give_each_rows_exact_code_products(flavour, table, n):
    """row_code_dots: lane l is row l's exact sum of values[code] * quant over a block, from GGUF's code bytes in
    chunks of four a row; a quant of -128 (what a NaN quantizes to) multiplies exactly too, as the repacked
    kernels' products do."""
    values = (IQ4_NL_VALUES if table == "iq4_nl" else MXFP4_VALUES).astype(np.int64)
    dots = row_code_dots(values.tolist(), flavour)

    @njit
    def run(v, q, y, ysum, out):
        vstore(out, 0, dots(v, q, 0, y, 0, ysum))

    rng = np.random.default_rng(n)
    for trial in range(10):
        codes = rng.integers(0, 256, (n, 16), dtype=np.uint8)           # byte j: element j low, j + 16 high
        y = rng.integers(-128, 128, 32, dtype=np.int8)
        if trial == 0:                                        # the extremes: the largest value against -128
            codes[:], y[:] = 0x00 if table == "iq4_nl" else 0xFF, -128
        packed = codes.reshape(n, 4, 4).transpose(1, 0, 2)
        out = np.empty(n, np.float32)
        run(lanes(n), np.ascontiguousarray(packed).reshape(-1), y, int(y.astype(np.int64).sum()), out)
        elements = values[np.concatenate([codes & 15, codes >> 4], axis=1)]
        want = elements @ y.astype(np.int64)
        assert np.array_equal(out, want.astype(np.float32)), (flavour, table, n, trial)


@pytest.mark.parametrize("flavour", FLAVOURS)
@pytest.mark.parametrize("fmt", ["q6_k", "q5_k", "iq4_xs"])
@pytest.mark.parametrize("n", [8, 16])
@pytest.mark.parametrize("rows", [1, 8])
def test_rows_side_by_side_give_each_rows_tiled_k_quant_integer(flavour, fmt, n, rows):
    """row_k_dots: lane l is row l's exact s1 over a super-block, sum_j sc_j * (sub-block j's values . quants),
    Q6_K's values less 32 (sub-blocks of 16), Q5_K's as they are, IQ4_XS's codes looked up in kvalues_iq4nl
    (sub-blocks of 32); the largest magnitudes (past 2^24 in the sum) included; several activation rows at once
    (rows 300 quants apart, their starts 20 apart), each its own."""
    codes = fmt == "iq4_xs"
    sub, bias = (16, 32) if fmt == "q6_k" else (32, 0)
    table = IQ4_NL_VALUES.astype(np.int64)
    dots = row_k_dots(sub, bias, flavour, codes=table.tolist() if codes else None, rows=rows)

    @njit
    def one(v, q, y, sc, bs, out):
        vstore(out, 0, dots(v, q, 0, y, 0, 300, sc, 0, bs, 0, 20))

    @njit
    def eight(v, q, y, sc, bs, out):
        r0, r1, r2, r3, r4, r5, r6, r7 = dots(v, q, 0, y, 0, 300, sc, 0, bs, 0, 20)
        n = width(v)
        vstore(out, 0, r0)
        vstore(out, n, r1)
        vstore(out, 2 * n, r2)
        vstore(out, 3 * n, r3)
        vstore(out, 4 * n, r4)
        vstore(out, 5 * n, r5)
        vstore(out, 6 * n, r6)
        vstore(out, 7 * n, r7)

    rng = np.random.default_rng(n)
    for trial in range(10):
        y = rng.integers(-127, 128, (rows, 256)).astype(np.int8)
        sc = rng.integers(-128 if fmt == "q6_k" else -32 if codes else 0, 128 if fmt == "q6_k" else 32 if codes else 64,
                          (256 // sub, n)).astype(np.int8)
        if codes:
            raw = rng.integers(0, 256, (n, 8, 16)).astype(np.uint8)     # row, run, code byte
            if trial == 0:
                raw[:], y[:], sc[:] = 0, -127, -32
            values = table[np.concatenate([raw & 15, raw >> 4], axis=2)].reshape(n, 256)
            packed = raw.reshape(n, 8, 4, 4).transpose(1, 2, 0, 3)
        else:
            top = 63 if fmt == "q6_k" else 31
            raw = rng.integers(0, top + 1, (n, 256)).astype(np.uint8)
            if trial == 0:
                raw[:], y[:] = (0, 127) if fmt == "q6_k" else (top, -127)
                sc[:] = 127 if fmt == "q6_k" else 63
            values = raw.astype(np.int64) - bias
            packed = raw.reshape(n, 64, 4).transpose(1, 0, 2)
        y_rows = np.zeros((rows, 300), np.int8)
        y_rows[:, :256] = y
        bs = np.zeros((rows, 20), np.int32)                   # each sub-block's start (k_start times its sum)
        bs[:, :256 // sub] = k_start(bias, codes, flavour) * y.astype(np.int32).reshape(rows, -1, sub).sum(axis=2)
        out = np.empty(rows * n, np.float32)
        (one if rows == 1 else eight)(lanes(n), np.ascontiguousarray(packed).reshape(-1), y_rows.reshape(-1),
                                      sc.reshape(-1), bs.reshape(-1), out)
        for r in range(rows):
            want = ((values * y[r].astype(np.int64)).reshape(n, 256 // sub, sub).sum(axis=2)
                    * sc.T.astype(np.int64)).sum(1)
            if trial == 0:
                assert np.abs(want).max() >= 2 ** 24
            assert np.array_equal(out[r * n:(r + 1) * n], want.astype(np.float32)), (flavour, fmt, n, trial, r)


@pytest.mark.parametrize("flavour", FLAVOURS)
@pytest.mark.parametrize("n", [8, 16])
def test_q4_1_halves_hold_each_rows_low_then_high_lane_sums(flavour, n):
    low, high = nibble_half_lanes(False, flavour), nibble_half_lanes(True, flavour)

    @njit
    def run(v, q, y, out):
        vstore(out, 0, low(v, q, 0, y, 0))
        vstore(out, n, high(v, q, 0, y, 0))

    rng = np.random.default_rng(n)
    rows = n // 4
    for trial in range(20):
        q = rng.integers(0, 256, rows * 16, dtype=np.uint8)
        y = rng.integers(-127, 128, 32, dtype=np.int8)
        if trial == 0:
            q[:], y[:] = 0xFF, -127
        out = np.empty(2 * n, np.float32)
        run(lanes(n), q, y, out)
        sums = np.stack([(_elements("q4_1", q[r * 16:(r + 1) * 16]) * y).reshape(8, 4).sum(axis=1)
                         for r in range(rows)])
        want = np.concatenate([sums[:, :4].reshape(-1), sums[:, 4:].reshape(-1)])
        assert np.array_equal(out, want.astype(np.float32)), (flavour, n, trial)


@pytest.mark.parametrize("flavour", FLAVOURS)
@pytest.mark.parametrize("sub, bias, top, lane_bias, signed", [
    (16, 32, 63, False, False), (32, 0, 31, False, False), (16, 4, 7, True, False), (16, 0, 3, False, False),
    (32, 0, 127, False, True),
    (16, 0, 43, False, True)], ids=["q6_k", "q5_k", "q3_k", "q2_k", "iq4_xs", "iq2"])
def test_k_quant_lanes_are_ggml_vec_dots_and_their_sums_converted_once(flavour, sub, bias, top, lane_bias, signed):
    """Lane l: over runs g of 32, scale[(32g + 4l) // sub] times the products of elements 4l .. 4l + 3 of the
    run, less bias * (scale[2l] * bsum[2l] + scale[2l + 1] * bsum[2l + 1]), or with lane_bias (Q3_K) the
    products of the values less bias; with rows, lane t holds activation row t's lanes' integer sum as one float.
    ``signed``: the value bytes are int8 (IQ4_XS's grid, -127 .. 113; the IQ2 types' signed grid values, -43 .. 43,
    scales per 16), its scales -32 .. 31. The extremes reach past 2^24 in a lane (Q6_K) or in the sum (Q5_K,
    IQ4_XS, IQ2): the integers stay exact."""
    each, one, eight = (k_lanes(sub, bias, rows, flavour, lane_bias=lane_bias, signed=signed) for rows in (0, 1, 8))

    @njit
    def run(v, q, y, sc, bs, out):
        vstore(out, 0, each(v, q, 0, y, 0, 0, sc, 0, bs, 0, 0))
        vstore(out, 8, one(v, q, 0, y, 256, 0, sc, 0, bs, 16, 0))
        vstore(out, 16, eight(v, q, 0, y, 0, 256, sc, 0, bs, 0, 16))

    rng = np.random.default_rng(sub)
    for trial in range(20):
        q = rng.integers(-top if signed else 0, top + 1, 256).astype(np.int8 if signed else np.uint8)
        y = rng.integers(-127, 128, (8, 256)).astype(np.int8)
        low, high = (-128, 128) if bias else (-32, 32) if signed else (0, 64)
        sc = rng.integers(low, high, 16).astype(np.int8)
        if trial == 0:          # the largest values and scales; with the offset, lane 0's elements 127, the rest
            q[:], sc[:] = -top if signed else top, 127 if bias else -32 if signed else 63   # -127 (the products
            y[0] = np.where((np.arange(256) % 32 < 4) & (bias > 0), 127, -127)              # and the offset add up)
        bs = y.astype(np.int32).reshape(8, 16, 16).sum(axis=2).astype(np.int32)
        out = np.empty(24, np.float32)
        run(lanes(8), q.view(np.uint8), y.reshape(-1), sc, bs.reshape(-1), out)
        per_lane = sc.astype(np.int64)[(32 * np.arange(8)[:, None] + 4 * np.arange(8)) // sub]     # [run][lane]
        values = q.astype(np.int64) - (bias if lane_bias else 0)
        want = ((values * y).reshape(8, 8, 8, 4).sum(axis=3) * per_lane).sum(axis=1)                  # [row][lane]
        if bias and not lane_bias:
            want -= bias * (sc[0::2].astype(np.int64) * bs[:, 0::2] + sc[1::2].astype(np.int64) * bs[:, 1::2])
        if trial == 0 and top > 7:                       # Q3_K's and Q2_K's sums stay below 2^24
            assert np.abs(want[0]).max() >= 2 ** 24 if bias else np.abs(want[0].sum()) >= 2 ** 24
        assert np.array_equal(out[:8], want[0].astype(np.float32)), (flavour, sub, trial)
        assert out[8] == np.float32(want[1].sum()) and np.all(out[9:16] == 0), (flavour, sub, trial)
        assert np.array_equal(out[16:], want.sum(axis=1).astype(np.float32)), (flavour, sub, trial)


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_k_quant_lanes_of_codes_are_those_of_their_values(flavour):
    """``codes`` (IQ4_XS as GGUF keeps it: 4-bit codes into kvalues_iq4nl, 16 bytes a run of 32, byte j holding
    element j low and j + 16 high) give the lanes of the values they index, through the sign trick as the
    signed values' (a quant of -128 against a negative value included), for one row's lanes and eight rows'
    sums; the largest products (every code 0, -127, against -127) included."""
    table = IQ4_NL_VALUES.astype(np.int64)
    each, eight = (k_lanes(32, 0, rows, flavour, signed=True, codes=table.tolist()) for rows in (0, 8))
    each_v, eight_v = (k_lanes(32, 0, rows, flavour, signed=True) for rows in (0, 8))

    @njit
    def run(v, q, values, y, sc, bs, out):
        vstore(out, 0, each(v, q, 128, y, 256, 0, sc, 0, bs, 16, 0))
        vstore(out, 8, eight(v, q, 128, y, 0, 256, sc, 0, bs, 0, 16))
        vstore(out, 16, each_v(v, values, 0, y, 256, 0, sc, 0, bs, 16, 0))
        vstore(out, 24, eight_v(v, values, 0, y, 0, 256, sc, 0, bs, 0, 16))

    rng = np.random.default_rng(4)
    for trial in range(20):
        codes = rng.integers(0, 256, 256).astype(np.uint8)             # the second super-block's are read
        y = rng.integers(-128, 128, (8, 256)).astype(np.int8)
        sc = rng.integers(-32, 32, 16).astype(np.int8)
        if trial == 0:
            codes[:], y[:], sc[:] = 0, -127, -32
        runs = codes[128:].reshape(8, 16)
        values = table[np.concatenate([runs & 15, runs >> 4], axis=1).reshape(-1)].astype(np.int8)
        bs = y.astype(np.int32).reshape(8, 16, 16).sum(axis=2).astype(np.int32)
        out = np.empty(32, np.float32)
        run(lanes(8), codes, values.view(np.uint8), y.reshape(-1), sc, bs.reshape(-1), out)
        assert np.array_equal(out[:16], out[16:]), (flavour, trial)
        w = values.astype(np.int64)
        y_signed = np.where(w < 0, np.where(y == -128, -128, -y.astype(np.int64)), np.where(w == 0, 0, y))
        per_lane = sc.astype(np.int64)[(32 * np.arange(8)[:, None] + 4 * np.arange(8)) // 32]     # [run][lane]
        want = ((np.abs(w) * y_signed).reshape(8, 8, 8, 4).sum(axis=3) * per_lane).sum(axis=1)  # [row][lane]
        assert np.array_equal(out[:8], want[1].astype(np.float32)), (flavour, trial)
        assert np.array_equal(out[8:16], want.sum(axis=1).astype(np.float32)), (flavour, trial)


def _gguf_values(planes: str, q: np.ndarray) -> np.ndarray:
    """A super-block's 256 values from its bytes as GGUF keeps them (rows of them: (..., bytes)), written out as
    ggml's dequantize_row_* walks them."""
    y = np.zeros((*q.shape[:-1], 256), np.uint8)
    if planes == "tq2_0":                                     # element 128h + 32s + l: bits 2s of byte 32h + l
        for h in range(2):
            for s in range(4):
                y[..., 128 * h + 32 * s:128 * h + 32 * s + 32] = q[..., 32 * h:32 * h + 32] >> (2 * s) & 3
    elif planes == "q6_k":                                    # ql[128], qh[64]
        for h in range(2):
            ql, qh = q[..., 64 * h:64 * h + 64], q[..., 128 + 32 * h:128 + 32 * h + 32]
            y[..., 128 * h:128 * h + 32] = ql[..., :32] & 15 | (qh & 3) << 4
            y[..., 128 * h + 32:128 * h + 64] = ql[..., 32:] & 15 | (qh >> 2 & 3) << 4
            y[..., 128 * h + 64:128 * h + 96] = ql[..., :32] >> 4 | (qh >> 4 & 3) << 4
            y[..., 128 * h + 96:128 * h + 128] = ql[..., 32:] >> 4 | (qh >> 6 & 3) << 4
    else:                                                     # Q5_K: qh[32], then qs[128]; Q4_K: qs[128]
        qh, qs = (q[..., :32], q[..., 32:]) if planes == "q5_k" else (np.zeros_like(q[..., :32]), q)
        for j in range(4):
            y[..., 64 * j:64 * j + 32] = qs[..., 32 * j:32 * j + 32] & 15 | (qh >> (2 * j) & 1) << 4
            y[..., 64 * j + 32:64 * j + 64] = qs[..., 32 * j:32 * j + 32] >> 4 | (qh >> (2 * j + 1) & 1) << 4
    return y


_PLANE_CASES = [("tq2_0", 16, 1, 3), ("q4_k", 32, 0, 15), ("q5_k", 32, 0, 31), ("q6_k", 16, 32, 63)]


@pytest.mark.parametrize("flavour", FLAVOURS)
@pytest.mark.parametrize("planes, sub, bias, top", _PLANE_CASES, ids=[c[0] for c in _PLANE_CASES])
def test_k_quant_lanes_of_bit_fields_are_those_of_their_values(flavour, planes, sub, bias, top):
    """``planes``: values kept in bit fields as GGUF keeps them (TQ2_0's crumbs, Q4_K's nibbles, Q5_K's and Q6_K's
    nibbles and high bits; PLANES gives each format's bytes) give the lanes of the values ggml's dequantizer reads
    from them, for one row's lanes and eight rows' sums, here with each format's offset taken out through the
    activation's sums (TQ2_0's 1, Q6_K's 32); every field's largest value against quants of +-127 included."""
    size = PLANES[planes][0]
    each, eight = (k_lanes(sub, bias, rows, flavour, planes=planes) for rows in (0, 8))
    each_v, eight_v = (k_lanes(sub, bias, rows, flavour) for rows in (0, 8))

    @njit
    def run(v, q, values, y, sc, bs, out):
        vstore(out, 0, each(v, q, size, y, 256, 0, sc, 0, bs, 16, 0))
        vstore(out, 8, eight(v, q, size, y, 0, 256, sc, 0, bs, 0, 16))
        vstore(out, 16, each_v(v, values, 0, y, 256, 0, sc, 0, bs, 16, 0))
        vstore(out, 24, eight_v(v, values, 0, y, 0, 256, sc, 0, bs, 0, 16))

    rng = np.random.default_rng(3)
    for trial in range(20):
        q = rng.integers(0, 256, 2 * size).astype(np.uint8)          # the second super-block's are read
        y = rng.integers(-127, 128, (8, 256)).astype(np.int8)
        sc = rng.integers(-128, 128, 16).astype(np.int8)
        if trial == 0:
            q[size:], y[1] = 255, np.where(np.arange(256) % 32 < 4, 127, -127)
        values = _gguf_values(planes, q[size:])
        assert trial or values.min() == values.max() == top
        bs = y.astype(np.int32).reshape(8, 16, 16).sum(axis=2).astype(np.int32)
        out = np.empty(32, np.float32)
        run(lanes(8), q, values, y.reshape(-1), sc, bs.reshape(-1), out)
        assert np.array_equal(out[:16], out[16:]), (flavour, planes, trial)
        per_lane = sc.astype(np.int64)[(32 * np.arange(8)[:, None] + 4 * np.arange(8)) // sub]     # [run][lane]
        want = ((values.astype(np.int64) * y).reshape(8, 8, 8, 4).sum(axis=3) * per_lane).sum(axis=1)
        if bias:
            want -= bias * (sc[0::2].astype(np.int64) * bs[:, 0::2] + sc[1::2].astype(np.int64) * bs[:, 1::2])
        assert np.array_equal(out[:8], want[1].astype(np.float32)), (flavour, planes, trial)
        assert np.array_equal(out[8:16], want.sum(axis=1).astype(np.float32)), (flavour, planes, trial)


@pytest.mark.parametrize("planes", sorted(PLANES))
@pytest.mark.parametrize("spread", [1, 3, 8, 16])
def test_plane_values_unpack_bit_fields_row_by_row_and_side_by_side(planes, spread):
    """plane_values: a super-block's values from their bit fields, as ggml's dequantizer reads them, into bytes in
    element order; with ``spread`` rows' super-blocks laid side by side in 4-byte words (word c of row l at word
    spread * c + l), into their values laid side by side the same way. The bytes around are untouched."""
    size = PLANES[planes][0]
    unpack = plane_values(planes, spread)

    @njit
    def run(q, dst):
        unpack(q, 4, dst, 8)

    rng = np.random.default_rng(spread)
    rows = rng.integers(0, 256, (spread, size)).astype(np.uint8)
    side = np.ascontiguousarray(rows.reshape(spread, size // 4, 4).transpose(1, 0, 2)).reshape(-1)
    q = np.concatenate([np.full(4, 7, np.uint8), side, np.full(4, 7, np.uint8)])
    dst = np.full(256 * spread + 16, 9, np.uint8)
    run(q, dst)
    want = _gguf_values(planes, rows).reshape(spread, 64, 4).transpose(1, 0, 2).reshape(-1)
    assert np.array_equal(dst[8:-8], want)
    assert np.all(dst[:8] == 9) and np.all(dst[-8:] == 9)


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_k_quant_lanes_of_half_a_super_block_are_its_second_halfs_integer(flavour):
    """runs=4 from element 128 and scale 8 on (the integer of ggml_gemm_q2_K_8x8_q8_K per half super-block): lane 0
    is sum over elements 128 .. 255 of scale[e // 16] * q * y, the other lanes 0."""
    half = k_lanes(16, 0, 1, flavour, runs=4)

    @njit
    def run(v, q, y, sc, bs, out):
        vstore(out, 0, half(v, q, 128, y, 128, 0, sc, 8, bs, 0, 0))

    rng = np.random.default_rng(4)
    for trial in range(20):
        q, y = rng.integers(0, 4, 256).astype(np.uint8), rng.integers(-127, 128, 256).astype(np.int8)
        sc = rng.integers(0, 16, 32).astype(np.int8)
        out = np.empty(8, np.float32)
        run(lanes(8), q, y, sc, np.zeros(16, np.int32), out)
        want = (q[128:].astype(np.int64) * y[128:] * sc[np.arange(128, 256) // 16].astype(np.int64)).sum()
        assert out[0] == np.float32(want) and np.all(out[1:] == 0), (flavour, trial)


@pytest.mark.parametrize("sub", [32, 16])
@pytest.mark.parametrize("rows, pairs", [(1, False), (3, False), (8, False), (1, True)])
def test_k_quant_mins_are_each_rows_min_integer(rows, pairs, sub):
    """Lane t (t < rows): sum_j min_j * (activation row t's sum over sub-block j of 32, two sums of 16; or of 16,
    one sum), past the rows 0; with pairs, lane p the terms j = 2p and 2p + 1 (Q4_K's vec_dot register, lanes 0-3;
    Q2_K's, all eight). The extremes (mins 63, every quant -127) reach past 2^16 and stay exact."""
    mins, n = k_mins(rows, pairs, sub), 256 // sub

    @njit
    def run(v, sc, bs, out):
        vstore(out, 0, mins(v, sc, 16, bs, 32, 20))

    rng = np.random.default_rng(rows)
    for trial in range(20):
        sc = rng.integers(0, 64, 16 + 2 * n).astype(np.int8)
        bs = rng.integers(-127 * 16, 127 * 16 + 1, 32 + 20 * 8).astype(np.int32)
        if trial == 0:
            sc[:], bs[:] = 63, -127 * 16
        out = np.empty(8, np.float32)
        run(lanes(8), sc, bs, out)
        terms = [bs[32 + 20 * t:48 + 20 * t].reshape(n, -1).sum(axis=1) * sc[16 + n:16 + 2 * n].astype(np.int64)
                 for t in range(rows)]
        want = list(terms[0].reshape(-1, 2).sum(axis=1)) + [0] * (8 - n // 2) if pairs else \
            [t.sum() for t in terms] + [0] * (8 - rows)
        assert np.array_equal(out, np.array(want, np.float32)), (rows, pairs, trial)


def test_the_host_takes_its_fastest_way():
    assert HOST == FLAVOURS[0] and FLAVOURS[-1] == "generic"
    if llvm.get_host_cpu_features().get("avx512vnni", False):
        assert HOST == "vnni"


@pytest.mark.parametrize("flavour", FLAVOURS)
@pytest.mark.parametrize("sub", [32, 16], ids=["iq1_s", "iq1_m"])
def test_iq1_lanes_take_the_grid_and_the_delta_apart(flavour, sub):
    """Values 8 * g + e (g in -1 .. 1, e = +-1: IQ1_S's and IQ1_M's, as ggml-cpu/tiled stores them): part "grid"
    gives the lanes of g, "delta" those of e, no part those of the values whole (= 8 * grid + delta), each lane
    scale times the products of elements 4l .. 4l + 3 over the runs, as k_lanes' signed values; every sign of
    g, e and the quants, the largest scales (15) against +-127 included."""
    grid, delta, whole, grid8, delta8, whole8 = (k_lanes(sub, 0, rows, flavour, signed=True, part=part)
                                                 for rows in (0, 8) for part in ("grid", "delta", None))

    @njit
    def run(v, q, y, sc, bs, out):
        vstore(out, 0, grid(v, q, 0, y, 0, 0, sc, 0, bs, 0, 0))
        vstore(out, 8, delta(v, q, 0, y, 0, 0, sc, 0, bs, 0, 0))
        vstore(out, 16, whole(v, q, 0, y, 0, 0, sc, 0, bs, 0, 0))
        vstore(out, 24, grid8(v, q, 0, y, 0, 256, sc, 0, bs, 0, 16))
        vstore(out, 32, delta8(v, q, 0, y, 0, 256, sc, 0, bs, 0, 16))
        vstore(out, 40, whole8(v, q, 0, y, 0, 256, sc, 0, bs, 0, 16))

    rng = np.random.default_rng(sub)
    for trial in range(20):
        g, e = rng.integers(-1, 2, 256), rng.choice([-1, 1], 256)
        y = rng.integers(-127, 128, (8, 256)).astype(np.int8)
        sc = rng.choice(np.arange(1, 16, 2), 16).astype(np.int8)
        if trial == 0:                                           # every value +-1 in the grid's sign, quants +-127
            g, sc[:] = np.where(np.arange(256) % 2, 1, -1), 15
            y[:] = np.where(np.arange(256) % 2, 127, -127)
        q = (8 * g + e).astype(np.int8)
        out = np.empty(48, np.float32)
        run(lanes(8), q.view(np.uint8), y.reshape(-1), sc, np.zeros(128, np.int32), out)
        per_lane = sc.astype(np.int64)[(32 * np.arange(8)[:, None] + 4 * np.arange(8)) // sub]     # [run][lane]
        want = {name: ((values * y).reshape(8, 8, 8, 4).sum(axis=3) * per_lane).sum(axis=1)       # [row][lane]
                for name, values in (("grid", g), ("delta", e), ("whole", 8 * g + e))}
        for at, name in enumerate(("grid", "delta", "whole")):
            assert np.array_equal(out[8 * at:8 * at + 8], want[name][0].astype(np.float32)), (flavour, name, trial)
            assert np.array_equal(out[24 + 8 * at:32 + 8 * at], want[name].sum(axis=1).astype(np.float32)), \
                (flavour, name, trial)
