"""Small numba helpers shared by the backend's kernels.

numba has no float16 type, so everything that must round like llama.cpp's fp16/bf16 conversions is done here
with integer or exact float arithmetic. None of these helpers uses fastmath: they are bit-exact.
`fma` is the fused multiply-add llama.cpp's SIMD code uses (one rounding); numba never contracts a*b + c on
its own, so every FMA of the emulated ggml arithmetic is written out with it.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

from graphir.backends.numba.primitives import cache  # noqa: F401  (installed before this module's kernels)

__all__ = ["fma", "hsum8", "hsum16", "hsum", "bits_f32", "bits_u32", "bits_f64", "bits_u64", "half_bits", "f16_round",
           "f16_bits", "round_f16", "round_bf16"]


@intrinsic
def fma(typingctx, a, b, c):
    """a * b + c rounded once (llvm.fma: x86's vfmadd), for three floats of one type. Exact: a float64
    emulation (product exact, then one f64 rounding, then f32) would round twice in rare ties."""
    if not (isinstance(a, types.Float) and a == b == c):
        return None

    def codegen(context, builder, signature, args):
        return builder.fma(*args)

    return a(a, b, c), codegen


@intrinsic
def bits_f32(typingctx, i):
    """The float32 whose bit pattern is the low 32 bits of the integer i (a bitcast; vectorizes, unlike a view)."""
    if not isinstance(i, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        v = args[0]
        i32 = ir.IntType(32)
        if v.type.width > 32:
            v = builder.trunc(v, i32)
        elif v.type.width < 32:
            v = builder.sext(v, i32) if i.signed else builder.zext(v, i32)
        return builder.bitcast(v, ir.FloatType())

    return types.float32(i), codegen


def _bitcast(src: types.Type, dst: types.Type, dst_ir: ir.Type, doc: str) -> Any:
    """An intrinsic reinterpreting a value of type src as one of type dst (same width: a bitcast)."""
    def bits(typingctx, v):  # type: ignore[no-untyped-def]
        if v != src:
            return None

        def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
            return builder.bitcast(args[0], dst_ir)

        return dst(v), codegen

    bits.__doc__ = doc
    return intrinsic(bits)


bits_u32 = _bitcast(types.float32, types.uint32, ir.IntType(32), "The bit pattern of a float32, as uint32.")
bits_u64 = _bitcast(types.float64, types.uint64, ir.IntType(64), "The bit pattern of a float64, as uint64.")
bits_f64 = _bitcast(types.uint64, types.float64, ir.DoubleType(), "The float64 of a uint64's bit pattern.")


@intrinsic
def half_bits(typingctx, f):
    """The bits of float16(f), rounded to nearest even (an fptrunc: F16C's vcvtps2ph on x86), as uint32."""
    if f != types.float32:
        return None

    def codegen(context, builder, signature, args):
        h = builder.bitcast(builder.fptrunc(args[0], ir.HalfType()), ir.IntType(16))
        return builder.zext(h, ir.IntType(32))

    return types.uint32(f), codegen


@njit(cache=True, inline="always")
def hsum8(a0, a1, a2, a3, a4, a5, a6, a7):
    """ggml's hsum_float_8 (x86 quants.c / tinyBLAS): the high half added to the low half, then lanes
    (0+2) and (1+3), then those two."""
    return ((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7))


@njit(cache=True, inline="always")
def hsum16(v):
    """_mm512_reduce_add_ps as GCC compiles it (ggml's softmax sums, vec_dot_f16 reduce, tinyBLAS hsum): the high
    256 bits added to the low, then the high 128 to the low, then lanes (0+2), (1+3), then those two. v: 16
    floats (an array or a slice)."""
    a0, a1, a2, a3 = v[0] + v[8], v[1] + v[9], v[2] + v[10], v[3] + v[11]
    a4, a5, a6, a7 = v[4] + v[12], v[5] + v[13], v[6] + v[14], v[7] + v[15]
    return ((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7))


@njit(cache=True, inline="always")
def hsum(v, o, lanes):
    """The sum of one register, v[o:o + lanes], halved down to one lane: _mm512_reduce_add_ps for 16 lanes,
    hsum_float_8 (and soft_max's / the variance's extract-movehl-movehdup sequence) for 8."""
    if lanes == 16:
        return hsum16(v[o:o + 16])
    return hsum8(v[o], v[o + 1], v[o + 2], v[o + 3], v[o + 4], v[o + 5], v[o + 6], v[o + 7])


@njit(cache=True)
def f16_round(v):
    """float32 value of float16(v), round-to-nearest-even (what F16C / `np.float16` do), as float32."""
    a = np.float64(v)
    if a == 0.0 or not np.isfinite(a):
        return np.float32(a)
    _, e = math.frexp(a)                       # 2**(e-1) <= |a| < 2**e
    ue = max(e - 11, -24)                      # exponent of one f16 ulp at |a| (subnormals: 2**-24)
    r = math.ldexp(np.rint(math.ldexp(a, -ue)), ue)   # exact scalings; np.rint is half-to-even
    if abs(r) > 65504.0:
        r = math.copysign(np.inf, a)
    return np.float32(r)


@njit(cache=True, inline="always")
def f16_bits(h):
    """float32 bit pattern of the half with bits h, exact for normals, zeros, inf and nan. Subnormal halves
    (exponent 0, nonzero mantissa) come out wrong and must be patched by the caller as m * 2**-24 (integer
    code cannot normalize them without a loop; float code needs no bit tricks for them)."""
    h = np.uint32(h)
    em = h & np.uint32(0x7FFF)
    b = ((h & np.uint32(0x8000)) << np.uint32(16)) | ((em << np.uint32(13)) + np.uint32(0x38000000))
    if em >= np.uint32(0x7C00):                # inf / nan: all-ones exponent
        b |= np.uint32(0x7F800000)
    return b


def round_f16(x: np.ndarray) -> np.ndarray:
    """x rounded to float16 and back (llama.cpp's fp32->fp16 conversion of activations: nearest-even)."""
    return x.astype(np.float16).astype(np.float32)


def round_bf16(x: np.ndarray) -> np.ndarray:
    """x rounded to bfloat16 and back, nearest-even with NaN kept quiet (llama.cpp's fp32->bf16)."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    nan = (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    r = (u + (np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1)))) & np.uint32(0xFFFF0000)
    r = np.where(nan, (u & np.uint32(0xFFFF0000)) | np.uint32(0x00400000), r)
    return r.view(np.float32)
