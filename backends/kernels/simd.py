"""SIMD registers for numba kernels: a float32 vector type whose values live in registers, and the few
operations ggml's float loops are made of (load, FMA, add, the horizontal sums).

LLVM's auto-vectorizer only vectorizes a loop whose accumulators it may keep in memory, and numba's arrays are
heap memory: a dot product written with scalar loops runs its FMA chains through loads and stores. These
vectors are LLVM ``<n x float>`` values, so a kernel holding a tile of them gets them in registers, with one
``vfmadd`` per FMA and ``vcvtph2ps`` to read an f16 row. Every operation rounds as its scalar counterpart does
(no fast-math), so a kernel written with them sums in exactly the order it spells out.

The lane count is a type: a kernel takes a ``Lanes(n)`` argument (``lanes(n)``), which numba passes as a zero
vector of n lanes, and every helper takes its width from it; one kernel source compiles once per width.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import NativeValue, intrinsic, models, register_model, typeof_impl, unbox

__all__ = ["Lanes", "lanes", "vzero", "vload", "vload_part", "vfma", "vadd", "vhsum", "vreduce4", "width",
           "as_f32"]


class F32Vec(types.Type):
    """numba type of a register of ``n`` float32 lanes."""

    def __init__(self, n: int):
        self.n = n
        super().__init__(name=f"f32x{n}")


@register_model(F32Vec)
class _F32VecModel(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):  # type: ignore[no-untyped-def]
        super().__init__(dmm, fe_type, ir.VectorType(ir.FloatType(), fe_type.n))


class Lanes:
    """The register width a kernel is compiled for, passed as an argument (numba sees a zero vector)."""

    def __init__(self, n: int):
        self.n = n


_LANES = {n: Lanes(n) for n in (8, 16)}


def lanes(n: int) -> Lanes:
    """The argument that compiles a kernel for registers of n float32 lanes (8: AVX2, 16: AVX-512)."""
    return _LANES[n]


@typeof_impl.register(Lanes)
def _typeof_lanes(val, c):  # type: ignore[no-untyped-def]
    return F32Vec(val.n)


@unbox(F32Vec)
def _unbox_lanes(typ, obj, c):  # type: ignore[no-untyped-def]
    return NativeValue(ir.Constant(ir.VectorType(ir.FloatType(), typ.n), [0.0] * typ.n))


def _vec(n: int) -> ir.VectorType:
    return ir.VectorType(ir.FloatType(), n)


@intrinsic
def width(typingctx, proto):
    """The lane count of proto's type, a compile-time constant."""
    if not isinstance(proto, F32Vec):
        return None

    def codegen(context, builder, sig, args):
        return ir.Constant(ir.IntType(64), proto.n)

    return types.int64(proto), codegen


@intrinsic
def vzero(typingctx, proto):
    """A register of zeros, as wide as proto."""
    if not isinstance(proto, F32Vec):
        return None

    def codegen(context, builder, sig, args):
        return ir.Constant(_vec(proto.n), [0.0] * proto.n)

    return proto(proto), codegen


@intrinsic
def vload(typingctx, proto, arr, idx):
    """arr[idx:idx + n] as a register: a 1-D C-contiguous float32 array, or uint16 holding f16 bits (converted
    exactly, as F16C's vcvtph2ps does). No bounds check: the caller's loop bounds are the check."""
    if not (isinstance(proto, F32Vec) and isinstance(arr, types.Array) and arr.ndim == 1
            and arr.dtype in (types.float32, types.uint16) and isinstance(idx, types.Integer)):
        return None
    half = arr.dtype == types.uint16

    def codegen(context, builder, sig, args):
        n = proto.n
        data = context.make_array(sig.args[1])(context, builder, args[1]).data
        ptr = builder.gep(data, [builder.zext(args[2], ir.IntType(64)) if args[2].type.width < 64 else args[2]])
        if half:
            v = builder.load(builder.bitcast(ptr, ir.VectorType(ir.HalfType(), n).as_pointer()), align=2)
            return builder.fpext(v, _vec(n))
        return builder.load(builder.bitcast(ptr, _vec(n).as_pointer()), align=4)

    return proto(proto, arr, idx), codegen


@intrinsic
def as_f32(typingctx, h):
    """An element of a row vload reads, as float32: a float32 as it is, a uint16 as the f16 with those bits."""
    if h not in (types.uint16, types.float32):
        return None

    def codegen(context, builder, sig, args):
        if h == types.float32:
            return args[0]
        return builder.fpext(builder.bitcast(args[0], ir.HalfType()), ir.FloatType())

    return types.float32(h), codegen


def _binary(name: str):  # type: ignore[no-untyped-def]
    def typer(typingctx, a, b):  # type: ignore[no-untyped-def]
        if not (isinstance(a, F32Vec) and a == b):
            return None

        def codegen(context, builder, sig, args):
            return getattr(builder, name)(*args)

        return a(a, b), codegen

    return intrinsic(typer)


vadd = _binary("fadd")


@intrinsic
def vfma(typingctx, a, b, c):
    """a * b + c lane by lane, rounded once (llvm.fma: vfmadd)."""
    if not (isinstance(a, F32Vec) and a == b == c):
        return None

    def codegen(context, builder, sig, args):
        vt = args[0].type
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vt, [vt, vt, vt]),
                                            f"llvm.fma.v{vt.count}f32")
        return builder.call(fn, list(args))

    return a(a, b, c), codegen


def _lane_sum(builder: ir.IRBuilder, lanes: list[ir.Value]) -> ir.Value:
    """hsum_float_8's order for 8 lanes ((0+4)+(2+6)) + ((1+5)+(3+7)); 16 lanes are first folded high onto low
    (what _mm512_reduce_add_ps compiles to)."""
    if len(lanes) == 16:
        lanes = [builder.fadd(lanes[i], lanes[i + 8]) for i in range(8)]
    a = lanes
    return builder.fadd(builder.fadd(builder.fadd(a[0], a[4]), builder.fadd(a[2], a[6])),
                        builder.fadd(builder.fadd(a[1], a[5]), builder.fadd(a[3], a[7])))


@intrinsic
def vhsum(typingctx, v):
    """The sum of one register's lanes in ggml's order (see kernels_util.hsum)."""
    if not isinstance(v, F32Vec):
        return None

    def codegen(context, builder, sig, args):
        return _lane_sum(builder, [builder.extract_element(args[0], ir.Constant(ir.IntType(32), i))
                                   for i in range(v.n)])

    return types.float32(v), codegen


@intrinsic
def _hadd_sum(typingctx, v):
    """An 8-lane register summed by AVX's 256 -> 128 bits then two _mm_hadd_ps: ((0+4)+(1+5)) + ((2+6)+(3+7)).
    (Only AVX builds, 8 lanes, sum this way; a 16-lane register gets vhsum's order.)"""
    if not isinstance(v, F32Vec):
        return None

    def codegen(context, builder, sig, args):
        a = [builder.extract_element(args[0], ir.Constant(ir.IntType(32), i)) for i in range(v.n)]
        if v.n != 8:
            return _lane_sum(builder, a)
        return builder.fadd(builder.fadd(builder.fadd(a[0], a[4]), builder.fadd(a[1], a[5])),
                            builder.fadd(builder.fadd(a[2], a[6]), builder.fadd(a[3], a[7])))

    return types.float32(v), codegen


@njit(cache=True, error_model="numpy", inline="always")
def vreduce4(a0, a1, a2, a3, hadd):
    """GGML_F32_VEC_REDUCE of four registers: (0 + 2) + (1 + 3) lane by lane, then that register's sum, by
    _mm_hadd_ps (``hadd``: the AVX build, 8 lanes) or halving."""
    s = vadd(vadd(a0, a2), vadd(a1, a3))
    if hadd:
        return _hadd_sum(s)
    return vhsum(s)


@njit(cache=True, error_model="numpy", inline="always")
def vload_part(proto, arr, idx, count, scratch):
    """Like vload, the first ``count`` lanes only (all if count is larger, none if it is negative); the others are
    zeros (a row's last, partial register). scratch: float32 room for one register."""
    n = min(count, width(proto))
    for t in range(n):
        scratch[t] = as_f32(arr[idx + t])
    for t in range(max(n, 0), width(proto)):
        scratch[t] = 0.0
    return vload(proto, scratch, 0)

