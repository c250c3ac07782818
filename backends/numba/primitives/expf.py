"""The exps llama.cpp's CPU code takes, and glibc's logf, one lane at a time, so that loops of them vectorize.

ggml_v_expf, what its SiLU and soft_max use: a range reduction to 2^n, a degree-5 polynomial and the power put
back, as vec.h writes it for AVX-512 (scalef) and for AVX2 (split), selected by isa.EXPF_*.
libm_expf and libm_logf, glibc's expf and logf (2.28 and later, their FMA variants), what ggml's scalar loops
call (Mamba's scan and its softplus): libm_expf is up to ~1.5 ulp from ggml_v_expf. On another C library they
are not its functions, and tests/test_numerics.py says so.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from graphir.backends.numba.primitives import cache  # noqa: F401  (installed before this module's kernels)
from graphir.backends.numba.primitives.isa import EXPF_SPLIT
from graphir.backends.numba.primitives.jit import INL
from graphir.backends.numba.primitives.bits import bits_f32, bits_f64, bits_u32, bits_u64, fma

F32 = np.float32

_E = [F32(float.fromhex(h)) for h in ("0x1.8p23", "0x1.715476p+0", "0x1.7f7d1cp-20", "0x1.62e4p-1", "0x1.0e4020p-7",
                                       "0x1.573e2ep-5", "0x1.555e66p-3", "0x1.fffdb6p-2", "0x1.ffffecp-1")]
_R, _LOG2E, _LN2_LO, _LN2_HI, _C5, _C4, _C3, _C2, _C1 = _E
_ONE, _ZERO, _INF, _N126, _N192, _N200 = F32(1.0), F32(0.0), F32(np.inf), F32(126.0), F32(192.0), F32(200.0)
_P127, _M125 = F32(2.0 ** 127), F32(2.0 ** -125)


@njit(**INL)
def v_expf_scalef(x):
    """ggml_v_expf (vec.h, AVX-512) for one lane: 2^n range reduction, degree-5 polynomial, scalef.

    NOTE: not libm's expf (up to ~1.5 ulp apart); llama.cpp's SiLU and softmax use it. scalef(j, n) = j * 2^n
    rounded once: as (j * 2^(n>>1)) * 2^(n - (n>>1)), the first product exact (|n| <= 192, j in [0.7, 1.5]).
    """
    z = fma(x, _LOG2E, _R)
    n = z - _R
    b = fma(-n, _LN2_LO, fma(-n, _LN2_HI, x))
    u = b * b
    j = fma(fma(fma(_C5, b, _C4), u, fma(_C3, b, _C2)), u, fma(_C1, b, _ONE))
    big = abs(n) > _N192
    k = np.int32(min(max(n, -_N192), _N192))
    k1 = k >> np.int32(1)
    res = (j * bits_f32((k1 + np.int32(127)) << np.int32(23))) * bits_f32((k - k1 + np.int32(127)) << np.int32(23))
    if big:
        res = _ZERO if n <= _ZERO else _INF
    return res


@njit(**INL)
def v_expf_split(x):
    """ggml_v_expf (vec.h, AVX2) for one lane: the same reduction, a polynomial j without its constant 1 and
    k = 2^n, result k + k*j; for |n| > 126 the power is split in two factors, s2 * (1 + j) then * s1, so it
    cannot overflow early, and past |n| > 192 the result is s1 * s1 (inf, or 0).

    The vector code builds k, s1 and s2 from z's bits with 32-bit integer steps; here they are the same powers
    of two from n. As in its blend, every case is computed and then selected (a branch stops loops from
    vectorizing), and lanes that will not use s2 get a harmless one: the vector code skips that path when no
    lane needs it, and computing it with the real s2 makes subnormals, which cost microcode assists (SiLU
    measured 4x slower). Checked equal to the bitwise formulation on every 5th float32."""
    z = fma(x, _LOG2E, _R)
    n = z - _R
    b = fma(-n, _LN2_LO, fma(-n, _LN2_HI, x))
    u = b * b
    j = fma(fma(fma(_C5, b, _C4), u, fma(_C3, b, _C2)), u, _C1 * b)
    pos = n > _ZERO
    an = abs(n)
    split = an > _N126                                      # _CMP_GT_OQ: false for NaN, which takes k + k*j
    kn = np.int32(min(max(n, -_N200), _N200))
    k = bits_f32((kn + np.int32(127)) << np.int32(23))      # 2^n
    ks = kn if split else (np.int32(127) if pos else np.int32(-120))
    s1 = _P127 if pos else _M125                            # 2^127 or 2^-125
    s2 = bits_f32((ks + (np.int32(0) if pos else np.int32(252))) << np.int32(23))   # 2^(n-127) or 2^(n+125)
    res = (_INF if pos else _ZERO) if an > _N192 else fma(s2, j, s2) * s1   # s1 * s1 rounds to inf or 0
    return res if split else fma(j, k, k)


@njit(**INL)
def v_expf_shifted(w, head, mx, variant):
    """w[:head] = ggml_v_expf(w - mx), with the path's variant chosen once outside the loop (a branch inside
    keeps it from vectorizing: soft_max measured 30% slower)."""
    if variant == EXPF_SPLIT:
        for i in range(head):
            w[i] = v_expf_split(w[i] - mx)
    else:
        for i in range(head):
            w[i] = v_expf_scalef(w[i] - mx)


# glibc's expf: x / ln2 * 32 = k + r, exp(x) = 2^(k/32) * p(r) with p of degree 3, all in float64; the table holds
# 2^(i/32) with i's part of the exponent taken out (it is added back from k's bits)
_TAB = np.array([np.float64(2.0 ** (i / 32)).view(np.uint64) - np.uint64(i << 47) for i in range(32)], np.uint64)
_INVLN2_32, _SHIFT = float.fromhex("0x1.71547652b82fep+5"), float.fromhex("0x1.8p+52")
_P0, _P1, _P2 = (float.fromhex(h) for h in ("0x1.c6af84b912394p-20", "0x1.ebfce50fac4f3p-13", "0x1.62e42ff0c52d6p-6"))
_BIG = np.uint32(0x42b)                                  # top 12 bits of 88.0f: |x| >= 88 (or inf, nan)
_OVER, _UNDER, _TINY = F32(float.fromhex("0x1.62e42ep6")), F32(-float.fromhex("0x1.9fe368p6")), \
    F32(-float.fromhex("0x1.9d1d9ep6"))
_SUBNORMAL = F32(2.0 ** -149)                            # what glibc's may-underflow path returns, (0x1.4p-75f)^2


@njit(**INL)
def libm_expf(x):
    """glibc's expf for one float32, as its FMA variant computes it: k from fma(x, 32/ln2, shift) and r from the
    fused x * 32/ln2 - k, the polynomial's three FMAs, one multiply by the table's power, one rounding to float32.
    Outside |x| < 88 the same, except: nan and inf give x + x (-inf gives 0), x > 88.72 gives inf, x < -103.97
    gives 0 and x < -103.28 the smallest subnormal. Written as selects, so a loop of it vectorizes."""
    xd = np.float64(x)
    kd = fma(xd, _INVLN2_32, _SHIFT)
    ki = bits_u64(kd)
    kd -= _SHIFT
    r = fma(xd, _INVLN2_32, -kd)
    s = bits_f64(_TAB[ki & np.uint64(31)] + (ki << np.uint64(47)))
    y = fma(fma(r, _P0, _P1), r * r, fma(r, _P2, 1.0)) * s
    res = F32(y)
    top = (bits_u32(x) >> np.uint32(20)) & np.uint32(0x7ff)
    if top >= _BIG:
        res = x + x if top >= np.uint32(0x7f8) else res
        res = _ZERO if x == -_INF else res
        res = _INF if x > _OVER else res
        res = _SUBNORMAL if x < _TINY else res
        res = _ZERO if x < _UNDER else res
    return res


# glibc's logf: x = 2^k * z with z near 1, z = c * (1 + r) for one of 16 c's whose 1/c and log(c) are in the table,
# log(x) = k*ln2 + log(c) + log1p(r), log1p of degree 4 in float64
_LOG_TAB = np.array([float.fromhex(h) for h in (
    "0x1.661ec79f8f3bep+0", "-0x1.57bf7808caadep-2", "0x1.571ed4aaf883dp+0", "-0x1.2bef0a7c06ddbp-2",
    "0x1.49539f0f010b0p+0", "-0x1.01eae7f513a67p-2", "0x1.3c995b0b80385p+0", "-0x1.b31d8a68224e9p-3",
    "0x1.30d190c8864a5p+0", "-0x1.6574f0ac07758p-3", "0x1.25e227b0b8ea0p+0", "-0x1.1aa2bc79c8100p-3",
    "0x1.1bb4a4a1a343fp+0", "-0x1.a4e76ce8c0e5ep-4", "0x1.12358f08ae5bap+0", "-0x1.1973c5a611cccp-4",
    "0x1.0953f419900a7p+0", "-0x1.252f438e10c1ep-5", "0x1.0p+0", "0x0.0p+0",
    "0x1.e608cfd9a47acp-1", "0x1.aa5aa5df25984p-5", "0x1.ca4b31f026aa0p-1", "0x1.c5e53aa362eb4p-4",
    "0x1.b2036576afce6p-1", "0x1.526e57720db08p-3", "0x1.9c2d163a1aa2dp-1", "0x1.bc2860d224770p-3",
    "0x1.886e6037841edp-1", "0x1.1058bc8a07ee1p-2", "0x1.767dcf5534862p-1", "0x1.4043057b6ee09p-2")], np.float64)
_LN2 = float.fromhex("0x1.62e42fefa39efp-1")
_L0, _L1, _L2 = (float.fromhex(h) for h in ("-0x1.00ea348b88334p-2", "0x1.5575b0be00b6ap-2", "-0x1.ffffef20a4123p-2"))
_TWO23 = F32(2.0 ** 23)


@njit(**INL)
def libm_logf(x):
    """glibc's logf for one float32, as its FMA variant computes it: k and the table's c from x's bits,
    r = fma(z, 1/c, -1), k*ln2 + log(c) fused, the polynomial's FMAs as it orders them, one rounding to float32.
    A subnormal x is scaled by 2^23 first; 0 gives -inf, a negative x or nan a nan (x - x over itself), inf inf.
    Written as selects, so a loop of it vectorizes."""
    ix = bits_u32(x)
    sub = ix < np.uint32(0x800000)
    ix = bits_u32(x * _TWO23) - np.uint32(23 << 23) if sub else ix
    tmp = ix - np.uint32(0x3f330000)
    i = (tmp >> np.uint32(19)) & np.uint32(15)
    k = np.int32(tmp) >> np.int32(23)
    z = np.float64(bits_f32(ix - (tmp & np.uint32(0xff800000))))
    r = fma(z, _LOG_TAB[2 * i], -1.0)
    y0 = fma(np.float64(k), _LN2, _LOG_TAB[2 * i + 1])
    r2 = r * r
    y = fma(fma(r2, _L0, fma(r, _L1, _L2)), r2, y0 + r)
    res = F32(y)
    if ix - np.uint32(0x800000) >= np.uint32(0x7f000000) or sub:
        res = (x - x) / (x - x) if x != x or x < _ZERO else res
        res = x if x == _INF else res
        res = -_INF if x == _ZERO else res
    return res
