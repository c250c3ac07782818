"""The register type the float and quantized kernels are written with: every operation rounds as its scalar
counterpart, the horizontal sums add in ggml's orders, and under NUMBA_BOUNDSCHECK a vector access past an
array's end raises as numba's own indexing does."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from numba import njit

from graphir.backends.numba.primitives.simd import (lanes, vfma, vhadd_sum, vhadd_sums8, vhsum, vload, vload_part,
                                                    vreduce4, vsplat_at, vstore, vtranspose, vzero)
from graphir.backends.numba.primitives.bits import fma, hsum

F32 = np.float32


@njit(cache=True)
def _fma_rows(v, a, b, c, out):
    for i in range(0, out.shape[0], 16):
        vstore(out, i, vfma(vload(v, a, i), vload(v, b, i), vload(v, c, i)))


@njit(cache=True)
def _scalar_fma(a, b, c, out):
    for i in range(out.shape[0]):
        out[i] = fma(a[i], b[i], c[i])


@njit(cache=True)
def _sums(v, a, out):
    out[0] = vhsum(vload(v, a, 0))
    out[1] = vreduce4(vload(v, a, 0), vload(v, a, a.shape[0] // 4), vload(v, a, a.shape[0] // 2),
                      vload(v, a, 3 * a.shape[0] // 4), False)
    out[2] = vreduce4(vload(v, a, 0), vload(v, a, a.shape[0] // 4), vload(v, a, a.shape[0] // 2),
                      vload(v, a, 3 * a.shape[0] // 4), True)


@njit(cache=True)
def vec_reduce(acc, reg, hadd, s16):
    """GGML_F32_VEC_REDUCE of four registers of ``reg`` lanes, acc[:4 * reg], written out in scalars: registers
    (0 + 2) + (1 + 3) lane by lane, then that register's sum: 256 -> 128 bits and two _mm_hadd_ps (``hadd``, the
    AVX build) or halving (_mm512_reduce_add_ps). s16: scratch of ``reg`` floats."""
    for t in range(reg):
        s16[t] = (acc[t] + acc[2 * reg + t]) + (acc[reg + t] + acc[3 * reg + t])
    if hadd:
        return ((s16[0] + s16[4]) + (s16[1] + s16[5])) + ((s16[2] + s16[6]) + (s16[3] + s16[7]))
    return hsum(s16, 0, reg)


@njit(cache=True)
def _scalar_sums(a, n, out, s16):
    out[0] = hsum(a, 0, n)
    out[1] = vec_reduce(a, n, False, s16)
    out[2] = vec_reduce(a, n, True, s16)


def test_a_vector_fma_rounds_once_per_lane_like_the_scalar_one():
    rng = np.random.default_rng(0)
    a, b, c = (rng.standard_normal(4096).astype(F32) * F32(1e3) for _ in range(3))
    ours, ref = np.empty_like(a), np.empty_like(a)
    _fma_rows(lanes(16), a, b, c, ours)
    _scalar_fma(a, b, c, ref)
    assert np.array_equal(ours, ref)
    assert not np.array_equal(ours, a * b + c)   # one rounding, not two


@pytest.mark.parametrize("n", [8, 16])
def test_horizontal_sums_add_in_ggml_orders(n):
    rng = np.random.default_rng(n)
    for _ in range(200):
        a = (rng.standard_normal(4 * n) * 10.0 ** rng.integers(-3, 4, 4 * n)).astype(F32)
        ours, ref = np.empty(3, F32), np.empty(3, F32)
        _sums(lanes(n), a, ours)
        _scalar_sums(a, n, ref, np.empty(16, F32))
        assert ours[0] == ref[0] and ours[1] == ref[1]
        if n == 8:                     # the AVX build's hadd order exists for 8 lanes only
            assert ours[2] == ref[2]


@njit(cache=True)
def _hadd_rows(v, a, out):
    vstore(out, 0, vhadd_sums8(vload(v, a, 0), vload(v, a, 8), vload(v, a, 16), vload(v, a, 24), vload(v, a, 32),
                               vload(v, a, 40), vload(v, a, 48), vload(v, a, 56)))
    for r in range(8):
        out[8 + r] = vhadd_sum(vload(v, a, 8 * r))


def test_eight_rows_summed_at_once_add_in_the_avx_builds_order():
    rng = np.random.default_rng(3)
    for trial in range(50):
        a = (rng.standard_normal(64) * 10.0 ** rng.integers(-6, 7, 64)).astype(F32)
        out = np.empty(16, F32)
        _hadd_rows(lanes(8), a, out)
        want = np.empty(8, F32)
        for r in range(8):
            x = a[8 * r:8 * r + 8]
            want[r] = ((x[0] + x[4]) + (x[1] + x[5])) + ((x[2] + x[6]) + (x[3] + x[7]))
        assert np.array_equal(out[:8], want) and np.array_equal(out[8:], want), trial


@njit(cache=True)
def _loads(v, h, f, out):
    vstore(out, 0, vload(v, h, 0))
    vstore(out, 16, vload_part(v, h, 0, 5))
    vstore(out, 32, vload_part(v, f, 3, 7))
    vstore(out, 48, vzero(v))
    vstore(out, 64, vload_part(v, h, 0, 16))              # every lane asked for: a whole load, f16 and f32
    vstore(out, 80, vload_part(v, f, 4, 40))
    vstore(out, 96, vsplat_at(v, f, 19))


def test_loads_convert_f16_bits_exactly_and_partial_loads_read_zeros_past_the_count():
    h = np.array([0, 1, 0x3C00, 0x8001, 0x7BFF, 0xFC00, 0x7E00, 0x0400, 0x3555, 0xC000, 0x03FF, 1, 2, 3, 4, 5],
                 np.uint16)
    f = np.arange(1, 21, dtype=F32)
    out = np.empty(112, F32)
    _loads(lanes(16), h, f, out)
    want = h.view(np.float16).astype(F32)
    assert np.array_equal(out[:16], want, equal_nan=True)
    assert np.array_equal(out[16:21], want[:5]) and not out[21:32].any()
    assert np.array_equal(out[32:39], f[3:10]) and not out[39:64].any()
    assert np.array_equal(out[64:80], want, equal_nan=True) and np.array_equal(out[80:96], f[4:20])
    assert np.array_equal(out[96:], np.full(16, 20, F32))


@njit(cache=True)
def _transpose(v, src, so, stride, dst, do):
    vtranspose(v, src, so, stride, dst, do)


@pytest.mark.parametrize("n", [8, 16])
def test_a_transpose_lays_n_rows_of_n_words_side_by_side_and_touches_nothing_else(n):
    """vtranspose: word c of row r (rows 37 words apart from word 7 on) lands at n * c + r from word 5 on, every
    bit of it (uint32 and float32 words alike, NaN payloads included); the words around are left as they were."""
    rng = np.random.default_rng(n)
    src = rng.integers(0, 2 ** 32, 7 + 37 * n, dtype=np.uint64).astype(np.uint32)
    want = src[7:7 + 37 * n].reshape(n, 37)[:, :n].T.reshape(-1)
    for dtype in (np.uint32, F32):
        dst = np.full(5 + n * n + 3, 0xDEADBEEF, np.uint32)
        _transpose(lanes(n), src.view(dtype), 7, 37, dst.view(dtype), 5)
        assert np.array_equal(dst[5:5 + n * n], want), dtype
        assert (dst[:5] == 0xDEADBEEF).all() and (dst[5 + n * n:] == 0xDEADBEEF).all(), dtype


def test_a_vector_access_past_the_end_raises_under_boundscheck(tmp_path):
    code = ("import numpy as np\n"
            "from numba import njit\n"
            "from graphir.backends.numba.primitives.simd import lanes, vload, vload_part, vstore\n"
            "f = njit(lambda v, a, i, out: vstore(out, 0, vload(v, a, i)))\n"
            "g = njit(lambda v, a, i, n, out: vstore(out, 0, vload_part(v, a, i, n)))\n"
            "a, out = np.ones(20, np.float32), np.zeros(16, np.float32)\n"
            "v = lanes(16)\n"
            "f(v, a, 4, out)\n"
            "g(v, a, 16, 4, out)\n"
            "g(v, a, 19, -3, out)\n"
            "g(v, a, 36, 0, out)\n"                     # no lane: nothing read, wherever it points
            "for call in (lambda: f(v, a, 5, out), lambda: g(v, a, 16, 5, out)):\n"
            "    try:\n        call()\n    except IndexError as e:\n        print('IndexError:', e)\n")
    env = {**os.environ, "NUMBA_BOUNDSCHECK": "1", "NUMBA_CACHE_DIR": str(tmp_path)}
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split("\n")[:2] == ["IndexError: vector access out of bounds"] * 2


def test_a_prefetch_reads_nothing_and_may_point_past_the_end_even_under_boundscheck(tmp_path):
    code = ("import numpy as np\n"
            "from numba import njit\n"
            "from graphir.backends.numba.primitives.simd import prefetch\n"
            "@njit\n"
            "def f(a, far):\n"
            "    for i in (0, 19, 20, far, -far):\n"
            "        prefetch(a, i)\n"
            "    return a.sum()\n"
            "a = np.arange(20, dtype=np.uint8)\n"
            "print(f(a, 1 << 40), f(np.zeros(0, np.float32), 64))\n")
    env = {**os.environ, "NUMBA_BOUNDSCHECK": "1", "NUMBA_CACHE_DIR": str(tmp_path)}
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["190", "0.0"]
