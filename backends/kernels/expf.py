"""ggml_v_expf, the exp llama.cpp's SiLU and soft_max use, one lane at a time, in the variant of each path.

Not libm's expf (up to ~1.5 ulp apart): a range reduction to 2^n, a degree-5 polynomial and the power put
back, as vec.h writes it for AVX-512 (scalef) and for AVX2 (split), selected by isa.EXPF_*.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from graphir.backends.isa import EXPF_SPLIT
from graphir.backends.kernels.jit import INL
from graphir.backends.kernels_util import bits_f32, fma

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
