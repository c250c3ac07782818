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

from llvmlite import ir
from numba import config, njit, types
from numba.core import cgutils
from numba.core.imputils import lower_constant
from numba.extending import NativeValue, intrinsic, models, register_model, typeof_impl, unbox

from graphir.backends.numba.primitives import cache  # noqa: F401  (installed before this module's kernels)

__all__ = ["Lanes", "lanes", "vzero", "vsplat", "vsplat_at", "vload", "vload_part", "vstore", "vfma", "vadd", "vsub",
           "vmul", "vhadd_sum", "vhadd_sums8", "vhsum", "vhsum8_at", "vhsum8_halves",
           "vreduce4", "vspread", "vspread4", "width", "as_f32", "element_ptr", "prefetch", "vfold_blocks", "vlane",
           "vhsums16", "vtranspose"]


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
        self.numba_type = F32Vec(n)  # made once: numba types an argument at every call


_LANES = {n: Lanes(n) for n in (8, 16)}


def lanes(n: int) -> Lanes:
    """The argument that compiles a kernel for registers of n float32 lanes (8: AVX2, 16: AVX-512)."""
    return _LANES[n]


@typeof_impl.register(Lanes)
def _typeof_lanes(val, c):  # type: ignore[no-untyped-def]
    return val.numba_type


@unbox(F32Vec)
def _unbox_lanes(typ, obj, c):  # type: ignore[no-untyped-def]
    return NativeValue(ir.Constant(ir.VectorType(ir.FloatType(), typ.n), [0.0] * typ.n))


@lower_constant(F32Vec)
def _lanes_constant(context, builder, ty, pyval):  # type: ignore[no-untyped-def]
    return ir.Constant(ir.VectorType(ir.FloatType(), ty.n), [0.0] * ty.n)   # a module-level Lanes, as a kernel sees it


def _vec(n: int) -> ir.VectorType:
    return ir.VectorType(ir.FloatType(), n)


_LOADS = (types.float32, types.uint16, types.uint8)   # vload's element types
_PART_LOADS = (types.float32, types.uint16)          # vload_part's


def _is_row(arr, dtypes) -> bool:  # type: ignore[no-untyped-def]
    return isinstance(arr, types.Array) and arr.ndim == 1 and arr.dtype in dtypes


def element_ptr(context, builder, aty, arr, idx, n):  # type: ignore[no-untyped-def]
    """Pointer to arr[idx] (a 1-D array, idx any integer), the first of n elements a vector reads or writes.
    Under NUMBA_BOUNDSCHECK=1 (numba's option for its own indexing) the whole run idx..idx + n - 1 is checked,
    and one outside the array raises IndexError as numba's checked indexing does; n = 0 (a masked load of no
    lane, whose idx may lie past the end) reads nothing and passes."""
    a = context.make_array(aty)(context, builder, arr)
    i64 = ir.IntType(64)
    idx = builder.zext(idx, i64) if idx.type.width < 64 else idx
    if config.BOUNDSCHECK and not (isinstance(n, int) and n == 0):
        size = builder.extract_value(a.shape, 0)
        end = builder.add(idx, n if isinstance(n, ir.Value) else ir.Constant(i64, n))
        bad = builder.or_(builder.icmp_signed("<", idx, ir.Constant(i64, 0)), builder.icmp_signed(">", end, size))
        if isinstance(n, ir.Value):                           # a masked access of no lane reads nothing
            bad = builder.and_(bad, builder.icmp_signed(">", n, ir.Constant(i64, 0)))
        with builder.if_then(bad, likely=False):
            context.call_conv.return_user_exc(builder, IndexError, ("vector access out of bounds",))
    return builder.gep(a.data, [idx])


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
    """arr[idx:idx + n] as a register: a 1-D C-contiguous float32 array, uint16 holding f16 bits (converted
    exactly, as F16C's vcvtph2ps does) or uint8 (converted exactly). Unchecked (the caller's loop bounds are the
    check) but under NUMBA_BOUNDSCHECK=1."""
    if not (isinstance(proto, F32Vec) and _is_row(arr, _LOADS) and isinstance(idx, types.Integer)):
        return None
    dtype = arr.dtype

    def codegen(context, builder, sig, args):
        n = proto.n
        ptr = element_ptr(context, builder, sig.args[1], args[1], args[2], proto.n)
        if dtype == types.float32:
            return builder.load(builder.bitcast(ptr, _vec(n).as_pointer()), align=4)
        if dtype == types.uint8:
            return builder.uitofp(builder.load(builder.bitcast(ptr, ir.VectorType(ir.IntType(8), n).as_pointer()),
                                               align=1), _vec(n))
        v = builder.load(builder.bitcast(ptr, ir.VectorType(ir.HalfType(), n).as_pointer()), align=2)
        return builder.fpext(v, _vec(n))

    return proto(proto, arr, idx), codegen


@intrinsic
def prefetch(typingctx, arr, idx):
    """Ask for the cache line holding arr[idx] (a 1-D array) ahead of its use; a hint that reads nothing and
    cannot fault, so idx may lie past the end (no bounds check, even under NUMBA_BOUNDSCHECK=1)."""
    if not (isinstance(arr, types.Array) and arr.ndim == 1 and isinstance(idx, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        a = context.make_array(sig.args[0])(context, builder, args[0])
        i64, i32, i8p = ir.IntType(64), ir.IntType(32), ir.IntType(8).as_pointer()
        idx = builder.sext(args[1], i64) if args[1].type.width < 64 else args[1]
        ptr = builder.bitcast(builder.gep(a.data, [idx]), i8p)
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32]),
                                            "llvm.prefetch.p0i8")
        builder.call(fn, [ptr, ir.Constant(i32, 0), ir.Constant(i32, 3), ir.Constant(i32, 1)])
        return context.get_dummy_value()

    return types.none(arr, idx), codegen


@intrinsic
def vtranspose(typingctx, proto, src, so, stride, dst, do):
    """dst[do + n * c + r] = src[so + stride * r + c] for r, c < n (n = proto's lanes; src and dst 1-D arrays of one
    4-byte type): n rows of n words laid side by side, column c of them one register in dst. The rows are loaded
    whole and transposed in registers, log2(n) rounds of two-register shuffles (each swaps the off-diagonal blocks
    of one size), where word-by-word copies took two scalar instructions a word."""
    if not (isinstance(proto, F32Vec) and isinstance(src, types.Array) and src.ndim == dst.ndim == 1
            and isinstance(dst, types.Array) and src.dtype == dst.dtype and src.dtype.bitwidth == 32):
        return None

    def codegen(context, builder, sig, args):
        n, i32 = proto.n, ir.IntType(32)
        vi = ir.VectorType(i32, n)

        def at(arr: int, idx: ir.Value) -> ir.Value:
            return builder.bitcast(element_ptr(context, builder, sig.args[arr], args[arr], idx, n), vi.as_pointer())

        step = builder.sext(args[3], ir.IntType(64)) if args[3].type.width < 64 else args[3]
        first = builder.sext(args[2], ir.IntType(64)) if args[2].type.width < 64 else args[2]
        rows = [builder.load(at(1, builder.add(first, builder.mul(step, ir.Constant(step.type, r)))), align=4)
                for r in range(n)]
        k = n // 2
        while k:
            for i in (i for i in range(n) if not i & k):
                top = [j if not j & k else n + j - k for j in range(n)]
                bottom = [j + k if not j & k else n + j for j in range(n)]
                rows[i], rows[i + k] = (builder.shuffle_vector(rows[i], rows[i + k], ir.Constant(vi, top)),
                                        builder.shuffle_vector(rows[i], rows[i + k], ir.Constant(vi, bottom)))
            k //= 2
        out = builder.sext(args[5], ir.IntType(64)) if args[5].type.width < 64 else args[5]
        for c, row in enumerate(rows):
            builder.store(row, at(4, builder.add(out, ir.Constant(out.type, n * c))), align=4)
        return context.get_dummy_value()

    return types.none(proto, src, so, stride, dst, do), codegen


@intrinsic
def vload_part(typingctx, proto, arr, idx, count):
    """Like vload, the first ``count`` lanes only (all if count is larger, none if it is negative), by a masked
    load: nothing past them is read, and the other lanes are zeros (a row's last, partial register). A whole
    register is a plain load: AVX2 has no masked load of 16-bit lanes, and LLVM makes one lane by lane with a
    branch each (column_dots over an f16 V cache: 239 against 75 us a layer of SmolLM2 at 1100 cells)."""
    if not (isinstance(proto, F32Vec) and _is_row(arr, _PART_LOADS) and isinstance(idx, types.Integer)
            and isinstance(count, types.Integer)):
        return None
    dtype = arr.dtype

    def codegen(context, builder, sig, args):
        n = proto.n
        ptr = element_ptr(context, builder, sig.args[1], args[1], args[2], 0)
        i64v = ir.VectorType(ir.IntType(64), n)
        cnt = args[3] if args[3].type.width == 64 else builder.sext(args[3], ir.IntType(64))
        one = builder.insert_element(ir.Constant(i64v, ir.Undefined), cnt, ir.Constant(ir.IntType(32), 0))
        spread = builder.shuffle_vector(one, one, ir.Constant(ir.VectorType(ir.IntType(32), n), [0] * n))
        mask = builder.icmp_signed("<", ir.Constant(i64v, list(range(n))), spread)
        if config.BOUNDSCHECK:                                 # the lanes read must lie in the array
            element_ptr(context, builder, sig.args[1], args[1], args[2],
                         builder.select(builder.icmp_signed("<", cnt, ir.Constant(ir.IntType(64), n)),
                                        builder.select(builder.icmp_signed("<", cnt, ir.Constant(ir.IntType(64), 0)),
                                                       ir.Constant(ir.IntType(64), 0), cnt),
                                        ir.Constant(ir.IntType(64), n)))
        f32 = dtype == types.float32
        vt = ir.VectorType(ir.FloatType() if f32 else ir.HalfType(), n)
        fnty = ir.FunctionType(vt, [vt.as_pointer(), ir.IntType(32), mask.type, vt])
        fn = cgutils.get_or_insert_function(builder.module, fnty, f"llvm.masked.load.v{n}{'f32' if f32 else 'f16'}.p0")
        whole = builder.icmp_signed(">=", cnt, ir.Constant(ir.IntType(64), n))
        with builder.if_else(whole, likely=True) as (plain, masked):
            with plain:
                v_plain = builder.load(builder.bitcast(ptr, vt.as_pointer()), align=4 if f32 else 2)
                from_plain = builder.block
            with masked:
                v_masked = builder.call(fn, [builder.bitcast(ptr, vt.as_pointer()), ir.Constant(ir.IntType(32),
                                                                                                4 if f32 else 2),
                                             mask, ir.Constant(vt, [0.0] * n)])
                from_masked = builder.block
        v = builder.phi(vt)
        v.add_incoming(v_plain, from_plain)
        v.add_incoming(v_masked, from_masked)
        return v if f32 else builder.fpext(v, _vec(n))

    return proto(proto, arr, idx, count), codegen


@intrinsic
def vstore(typingctx, arr, idx, v):
    """arr[idx:idx + n] = v, arr a 1-D C-contiguous float32 array (no bounds check)."""
    if not (isinstance(v, F32Vec) and _is_row(arr, (types.float32,)) and isinstance(idx, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        ptr = element_ptr(context, builder, sig.args[0], args[0], args[1], v.n)
        builder.store(args[2], builder.bitcast(ptr, _vec(v.n).as_pointer()), align=4)
        return context.get_dummy_value()

    return types.none(arr, idx, v), codegen


@intrinsic
def vsplat(typingctx, proto, x):
    """A register holding the float32 x in every lane."""
    if not (isinstance(proto, F32Vec) and x == types.float32):
        return None

    def codegen(context, builder, sig, args):
        n = proto.n
        one = builder.insert_element(ir.Constant(_vec(n), ir.Undefined), args[1], ir.Constant(ir.IntType(32), 0))
        return builder.shuffle_vector(one, one, ir.Constant(ir.VectorType(ir.IntType(32), n), [0] * n))

    return proto(proto, x), codegen


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


def _lanewise(name: str, instruction: str, doc: str):  # type: ignore[no-untyped-def]
    """An intrinsic name(a, b): LLVM's ``instruction`` on two registers of one width, lane by lane."""
    def typer(typingctx, a, b):  # type: ignore[no-untyped-def]
        if not (isinstance(a, F32Vec) and a == b):
            return None

        def codegen(context, builder, sig, args):
            return getattr(builder, instruction)(*args)

        return a(a, b), codegen

    typer.__name__ = typer.__qualname__ = name
    typer.__doc__ = doc
    return intrinsic(typer)


vadd = _lanewise("vadd", "fadd", "a + b lane by lane.")
vsub = _lanewise("vsub", "fsub", "a - b lane by lane.")
vmul = _lanewise("vmul", "fmul", "a * b lane by lane.")


@intrinsic
def vfold_blocks(typingctx, a, b, h):
    """Each block of 2h lanes folded, its high h lanes added onto its low h, a's blocks then b's: one step of a
    horizontal sum for several registers at once (h a constant). h = n / 2 is AVX's 256 -> 128-bit step for two
    rows; h = 1 sums neighbouring lanes, so three rounds over eight registers of whole rows' eight lanes leave each
    row's sum in one lane."""
    if not (isinstance(a, F32Vec) and a == b and isinstance(h, types.IntegerLiteral)):
        return None
    k = h.literal_value

    def codegen(context, builder, sig, args):
        n, i32 = a.n, ir.IntType(32)
        starts = range(0, 2 * n, 2 * k)
        low = [s + i for s in starts for i in range(k)]
        high = [s + k + i for s in starts for i in range(k)]
        lo = builder.shuffle_vector(args[0], args[1], ir.Constant(ir.VectorType(i32, n), low))
        hi = builder.shuffle_vector(args[0], args[1], ir.Constant(ir.VectorType(i32, n), high))
        return builder.fadd(lo, hi)

    return a(a, b, h), codegen


@intrinsic
def vlane(typingctx, v, i):
    """Lane i of v."""
    if not (isinstance(v, F32Vec) and isinstance(i, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        return builder.extract_element(args[0], args[1])

    return types.float32(v, i), codegen


def _spreading(each: int, doc: str):  # type: ignore[no-untyped-def]
    """An intrinsic spread(proto, arr, idx): a register of n lanes from the n / each floats arr[idx:] (float32,
    1-D), each repeated in ``each`` consecutive lanes."""

    @intrinsic
    def spread(typingctx, proto, arr, idx):  # type: ignore[no-untyped-def]
        if not (isinstance(proto, F32Vec) and _is_row(arr, (types.float32,)) and isinstance(idx, types.Integer)):
            return None

        def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
            r = proto.n // each
            ptr = element_ptr(context, builder, sig.args[1], args[1], args[2], r)
            v = builder.load(builder.bitcast(ptr, _vec(r).as_pointer()), align=4)
            order = [i for i in range(r) for _ in range(each)]
            return builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(ir.IntType(32), proto.n), order))

        return proto(proto, arr, idx), codegen

    spread.__doc__ = doc
    return spread


vspread = _spreading(8, "n / 8 floats from arr[idx], each in 8 lanes: the per-row factor of a register holding "
                        "n / 8 rows' eight lanes each.")
vspread4 = _spreading(4, "n / 4 floats from arr[idx], each in 4 lanes: the per-row factor of a register holding "
                         "n / 4 rows' half lanes (vhsum8_halves).")


@intrinsic
def vsplat_at(typingctx, proto, arr, idx):
    """vsplat(arr[idx]) for a 1-D float32 array, unchecked like vload: one broadcast load, where indexing in numba
    adds a wraparound test for a negative index to each."""
    if not (isinstance(proto, F32Vec) and _is_row(arr, (types.float32,)) and isinstance(idx, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        n = proto.n
        x = builder.load(element_ptr(context, builder, sig.args[1], args[1], args[2], 1))
        one = builder.insert_element(ir.Constant(_vec(n), ir.Undefined), x, ir.Constant(ir.IntType(32), 0))
        return builder.shuffle_vector(one, one, ir.Constant(ir.VectorType(ir.IntType(32), n), [0] * n))

    return proto(proto, arr, idx), codegen


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
def vhsum8_at(typingctx, v, part):
    """The sum of lanes 8 * part .. 8 * part + 7 of v in hsum_float_8's order; part a constant. A part past the
    register's end sums no lane (0.0), so that code for wider registers compiles for narrower ones too."""
    if not (isinstance(v, F32Vec) and isinstance(part, types.IntegerLiteral)):
        return None
    p = part.literal_value

    def codegen(context, builder, sig, args):
        if 8 * p >= v.n:
            return ir.Constant(ir.FloatType(), 0.0)
        return _lane_sum(builder, [builder.extract_element(args[0], ir.Constant(ir.IntType(32), 8 * p + i))
                                   for i in range(8)])

    return types.float32(v, part), codegen


@intrinsic
def vhsum8_halves(typingctx, lo, hi, row):
    """The sum in hsum_float_8's order of the eight lanes of a row held in halves: its lanes 0-3 at lo[4 * row:]
    and 4-7 at hi[4 * row:] (row a constant; a row past the registers' end sums no lane, 0.0)."""
    if not (isinstance(lo, F32Vec) and lo == hi and isinstance(row, types.IntegerLiteral)):
        return None
    r = row.literal_value

    def codegen(context, builder, sig, args):
        if 4 * r >= lo.n:
            return ir.Constant(ir.FloatType(), 0.0)
        at = [ir.Constant(ir.IntType(32), 4 * r + i) for i in range(4)]
        return _lane_sum(builder, [builder.extract_element(args[0], i) for i in at]
                         + [builder.extract_element(args[1], i) for i in at])

    return types.float32(lo, hi, row), codegen


@intrinsic
def vhadd_sum(typingctx, v):
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
def vhadd_sums8(s0, s1, s2, s3, s4, s5, s6, s7):
    """Eight 8-lane registers' sums in vhadd_sum's order, ((0+4)+(1+5)) + ((2+6)+(3+7)), as one register in row
    order: the halves folded, then two rounds of neighbour sums (what _mm_hadd_ps adds, for eight rows at once)."""
    return vfold_blocks(vfold_blocks(vfold_blocks(s0, s1, 4), vfold_blocks(s2, s3, 4), 1),
                        vfold_blocks(vfold_blocks(s4, s5, 4), vfold_blocks(s6, s7, 4), 1), 1)


@njit(cache=True, error_model="numpy", inline="always")
def vhsums16(r0, r1, r2, r3, r4, r5, r6, r7, r8, r9, r10, r11, r12, r13, r14, r15):
    """Sixteen 16-lane registers' sums in vhsum's order (high half onto low, then quarters, then pairs), as one
    register, lane k register k's: the same additions, four rounds of two shuffles and an add for all of them."""
    a0, a1, a2, a3 = vfold_blocks(r0, r1, 8), vfold_blocks(r2, r3, 8), vfold_blocks(r4, r5, 8), vfold_blocks(r6, r7, 8)
    a4, a5 = vfold_blocks(r8, r9, 8), vfold_blocks(r10, r11, 8)
    a6, a7 = vfold_blocks(r12, r13, 8), vfold_blocks(r14, r15, 8)
    b0, b1, b2, b3 = vfold_blocks(a0, a1, 4), vfold_blocks(a2, a3, 4), vfold_blocks(a4, a5, 4), vfold_blocks(a6, a7, 4)
    return vfold_blocks(vfold_blocks(b0, b1, 2), vfold_blocks(b2, b3, 2), 1)


@njit(cache=True, error_model="numpy", inline="always")
def vreduce4(a0, a1, a2, a3, hadd):
    """GGML_F32_VEC_REDUCE of four registers: (0 + 2) + (1 + 3) lane by lane, then that register's sum, by
    _mm_hadd_ps (``hadd``: the AVX build, 8 lanes) or halving."""
    s = vadd(vadd(a0, a2), vadd(a1, a3))
    if hadd:
        return vhadd_sum(s)
    return vhsum(s)
