"""Lane sums of quantized blocks in registers, with the integer dot-product instructions of the host.

ggml's x86 vec_dot for Q4_1 x Q8_1 and Q8_0 x Q8_0 multiplies a block's 32 weight quants by the activation's
32 int8 quants and adds each run of four products into one int32 lane (``vpdpbusd`` where the CPU has VNNI,
``pmaddubsw`` then ``pmaddwd`` otherwise): eight lane sums per block, which it converts to float and
accumulates. The lane sums are integers and exact however they are formed, so any host may take whichever
instruction it has and get ggml's numbers: VNNI, the AVX2/AVX-512BW pair, or plain LLVM vector arithmetic
(any other CPU). Which one is read from the host once (``HOST``); tests build the others by name.

A register of n float32 lanes holds R = n / 8 weight rows' eight lanes each: ``lanes`` takes R rows' blocks
laid one after another and the activation block, and returns their lane sums as floats, row by row.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import llvmlite.binding as llvm
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from graphir.backends.numba.primitives.simd import F32Vec, element_ptr

__all__ = ["FLAVOURS", "HOST", "PLANES", "WIDE_LANES", "block_lanes", "k_lanes", "k_mins", "k_start",
           "nibble_half_lanes", "plane_values", "row_code_dots", "row_k_dots", "row_nibble_dots"]

_I8, _I16, _I32 = ir.IntType(8), ir.IntType(16), ir.IntType(32)


_FEATURES = llvm.get_host_cpu_features()
_AVX512BW = bool(_FEATURES.get("avx512bw", False))
WIDE_LANES = 16 if _AVX512BW else 8      # float32 lanes of the widest register the host has byte instructions for
# the ways this host can form lane sums, fastest first
FLAVOURS = tuple(name for name, needs in (("vnni", ("avx512vnni", "avx512bw", "avx512vl")), ("pmadd", ("avx2",)),
                                          ("generic", ()))
                 if all(_FEATURES.get(n, False) for n in needs))
HOST = FLAVOURS[0]

_Field = tuple[int, int, int, int]


def _runs(fields: Callable[[int], tuple[_Field, ...]]) -> tuple[tuple[_Field, ...], ...]:
    return tuple(fields(g) for g in range(8))


# K-quant values kept in bit fields as GGUF keeps them: a format's bytes a super-block and, for each run g of 32
# elements, its fields (byte offset, shift, bits, place): value j of the run is the OR over them of
# ((q[offset + j] >> shift) & (2^bits - 1)) << place
PLANES: dict[str, tuple[int, tuple[tuple[_Field, ...], ...]]] = {
    # TQ2_0's qs: element 128h + 32s + l in bits 2s of byte 32h + l
    "tq2_0": (64, _runs(lambda g: ((32 * (g // 4), 2 * (g % 4), 2, 0),))),
    # Q4_K's qs: runs 2p and 2p + 1 the low and high nibbles of bytes 32p .. 32p + 31
    "q4_k": (128, _runs(lambda g: ((32 * (g // 2), 4 * (g % 2), 4, 0),))),
    # Q5_K's qh (run g's fifth bits: bit g of its 32 bytes), then its qs as Q4_K's
    "q5_k": (160, _runs(lambda g: ((32 + 32 * (g // 2), 4 * (g % 2), 4, 0), (0, g, 1, 4)))),
    # Q6_K's ql (half h, run 4h + s: the low (s < 2) or high nibbles of bytes 64h + 32(s % 2) ..) and qh (its two
    # top bits: bits 2s of bytes 128 + 32h ..)
    "q6_k": (192, _runs(lambda g: ((64 * (g // 4) + 32 * (g % 2), 4 * (g % 4 // 2), 4, 0),
                                   (128 + 32 * (g // 4), 2 * (g % 4), 2, 4)))),
}


def _indices(values: list[int]) -> ir.Constant:
    return ir.Constant(ir.VectorType(_I32, len(values)), values)


def _x86(builder: ir.IRBuilder, name: str, ret: ir.Type, args: list[ir.Value]) -> ir.Value:
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ret, [a.type for a in args]), name)
    return builder.call(fn, args)


def _sums(builder: ir.IRBuilder, flavour: str, w: ir.Value, y: ir.Value, n: int) -> ir.Value:
    """n int32 lane sums of four products each, w's bytes unsigned and y's signed (4n bytes each)."""
    bits = 32 * n
    vi = ir.VectorType(_I32, n)
    if bits == 512 and not _AVX512BW:                         # no 512-bit byte instructions: LLVM splits the plain form
        flavour = "generic"
    if flavour == "vnni":
        return _x86(builder, f"llvm.x86.avx512.vpdpbusd.{bits}", vi,
                    [ir.Constant(vi, [0] * n), builder.bitcast(w, vi), builder.bitcast(y, vi)])
    if flavour == "pmadd":
        vw = ir.VectorType(_I16, 2 * n)
        pre = "llvm.x86.avx512." if bits == 512 else "llvm.x86.avx2."
        pairs = _x86(builder, pre + ("pmaddubs.w.512" if bits == 512 else "pmadd.ub.sw"), vw, [w, y])
        ones = ir.Constant(vw, [1] * 2 * n)
        return _x86(builder, pre + ("pmaddw.d.512" if bits == 512 else "pmadd.wd"), vi, [pairs, ones])
    wide = ir.VectorType(_I32, 4 * n)                         # generic: widen, multiply, add runs of four
    p = builder.mul(builder.zext(w, wide), builder.sext(y, wide))
    parts = [builder.shuffle_vector(p, p, _indices(list(range(j, 4 * n, 4)))) for j in range(4)]
    return builder.add(builder.add(parts[0], parts[1]), builder.add(parts[2], parts[3]))


def _scaled_sums(builder: ir.IRBuilder, flavour: str, w: ir.Value, y: ir.Value, scales: ir.Value, n: int) -> ir.Value:
    """n int32 lanes, each its scale (an int32 lane of ``scales``, within int16) times the sum of four products,
    w's bytes unsigned and y's signed: ggml's K-quant lanes, as it forms them where the host can (pmaddubsw, then
    pmaddwd against the scales; VNNI has no scaled form), else _sums times the scales."""
    bits = 32 * n
    if flavour == "generic" or (bits == 512 and not _AVX512BW):
        return builder.mul(_sums(builder, "generic", w, y, n), scales)
    vw = ir.VectorType(_I16, 2 * n)
    pre = "llvm.x86.avx512." if bits == 512 else "llvm.x86.avx2."
    pairs = _x86(builder, pre + ("pmaddubs.w.512" if bits == 512 else "pmadd.ub.sw"), vw, [w, y])
    twice = builder.shuffle_vector(scales, scales, _indices([i // 2 for i in range(2 * n)]))
    return _x86(builder, pre + ("pmaddw.d.512" if bits == 512 else "pmadd.wd"), ir.VectorType(_I32, n),
                [pairs, builder.trunc(twice, vw)])


def _sign_trick(builder: ir.IRBuilder, w: ir.Value, y: ir.Value) -> tuple[ir.Value, ir.Value]:
    """Signed bytes w and y -> |w| and y with w's sign (0 where w is 0), whose unsigned-by-signed products are
    w * y: how ggml multiplies two signed operands (_mm256_sign_epi8 twice)."""
    zero = ir.Constant(w.type, [0] * w.type.count)
    neg = builder.icmp_signed("<", w, zero)
    return (builder.select(neg, builder.sub(zero, w), w),
            builder.select(neg, builder.sub(zero, y), builder.select(builder.icmp_signed("==", w, zero), zero, y)))


def _offset_sums(builder: ir.IRBuilder, w: ir.Value, y: ir.Value, n: int) -> ir.Value:
    """n int32 lane sums of signed bytes w times signed y as ggml's sign trick forms them, with VNNI and without
    the trick's selects: w + 128 (a flip of the top bit) is unsigned, and each lane starts from -128 times its
    four y's (vpdpbusd of 128s by y, the same for every weight row a block's activation meets, so computed once
    a block). The integers are the products', which are the trick's unless y holds -128 (only where the
    activation held NaN: the trick negates it to itself); such a block takes the trick."""
    vi = ir.VectorType(_I32, n)
    top = ir.Constant(w.type, [-128] * w.type.count)
    dp = f"llvm.x86.avx512.vpdpbusd.{32 * n}"
    y_sums = _x86(builder, dp, vi, [ir.Constant(vi, [0] * n), builder.bitcast(top, vi), builder.bitcast(y, vi)])
    start = builder.sub(ir.Constant(vi, [0] * n), y_sums)
    fast = _x86(builder, dp, vi, [start, builder.bitcast(builder.xor(w, top), vi), builder.bitcast(y, vi)])
    lowest = builder.icmp_signed("==", y, top)
    any_lowest = _x86(builder, f"llvm.vector.reduce.or.v{w.type.count}i1", ir.IntType(1), [lowest])
    with builder.if_else(any_lowest, likely=False) as (trick, plain):
        with trick:
            slow = _sums(builder, "vnni", *_sign_trick(builder, w, y), n)
            trick_end = builder.basic_block
        with plain:
            plain_end = builder.basic_block
    merged = builder.phi(vi)
    merged.add_incoming(slow, trick_end)
    merged.add_incoming(fast, plain_end)
    return merged


def _pair_sums(builder: ir.IRBuilder, v: ir.Value) -> ir.Value:
    """A register of 2m int32 lanes -> m: lane j the sum of lanes 2j and 2j + 1."""
    n = v.type.count
    return builder.add(builder.shuffle_vector(v, v, _indices(list(range(0, n, 2)))),
                       builder.shuffle_vector(v, v, _indices(list(range(1, n, 2)))))


def _row_totals(builder: ir.IRBuilder, per_row: list[ir.Value]) -> ir.Value:
    """Up to eight int32x8 registers -> one whose lane t is the sum of register t's lanes (0 past the last):
    three rounds of adding neighbouring lanes, each packing two registers' pair sums into one."""
    vs = per_row + [ir.Constant(ir.VectorType(_I32, 8), [0] * 8)] * (8 - len(per_row))
    while len(vs) > 1:
        vs = [builder.add(builder.shuffle_vector(a, b, _indices(list(range(0, 16, 2)))),
                          builder.shuffle_vector(a, b, _indices(list(range(1, 16, 2))))) for a, b in zip(vs[::2], vs[1::2])]
    return vs[0]


Loader = Callable[[int, int], ir.Value]  # (offset, count) -> that many bytes (i8 vector) from an operand's index on


def _on_blocks(sums: Callable[[ir.IRBuilder, int, Loader, Loader], ir.Value]) -> Callable[..., Any]:
    """An intrinsic f(proto, q, qo, y, yo) over uint8 weight bytes q and int8 activation quants y: the int32 lane
    sums that sums(builder, n, load_q, load_y) forms, as float32 in a register like proto (n lanes)."""

    @intrinsic
    def on_blocks(typingctx, proto, q, qo, y, yo):  # type: ignore[no-untyped-def]
        if not (isinstance(proto, F32Vec) and isinstance(q, types.Array) and isinstance(y, types.Array)
                and q.dtype == types.uint8 and y.dtype == types.int8):
            return None

        def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
            def loader(at: int) -> Loader:
                def load(offset: int, count: int) -> ir.Value:
                    idx = builder.add(args[at + 1], ir.Constant(args[at + 1].type, offset)) if offset else args[at + 1]
                    ptr = element_ptr(context, builder, sig.args[at], args[at], idx, count)
                    return builder.load(builder.bitcast(ptr, ir.VectorType(_I8, count).as_pointer()), align=1)
                return load

            return builder.sitofp(sums(builder, proto.n, loader(1), loader(3)), ir.VectorType(ir.FloatType(), proto.n))

        return proto(proto, q, qo, y, yo), codegen

    return on_blocks


def block_lanes(fmt: str, flavour: str = HOST) -> Callable[..., Any]:
    """An intrinsic lanes(proto, q, qo, y, yo): the lane sums (as float32, a register like proto) of R = n / 8
    rows' blocks of format ``fmt`` laid one after another from q[qo] (uint8) against the 32 int8 activation
    quants at y[yo]. q4_1: 16 bytes a row, byte j holding element j (low nibble) and j + 16 (high); q8_0: 32
    int8 a row, taken as ggml takes them, |w| times y with w's sign (with VNNI, w + 128 times y from a start of
    -128 times y's sums: the same integers, without the sign trick's selects); u8: 32 unsigned bytes a row
    (Q5_1's values, 0-31, as ggml_vec_dot_q5_1_q8_1 forms them before its unsigned-by-signed multiply-add)."""
    if fmt not in ("q4_1", "q8_0", "u8") or flavour not in ("vnni", "pmadd", "generic"):
        raise ValueError(f"block_lanes: unknown format {fmt!r} or flavour {flavour!r}")
    row_bytes = 16 if fmt == "q4_1" else 32

    def sums(builder: ir.IRBuilder, n: int, load_q: Loader, load_y: Loader) -> ir.Value:
        r = n // 8
        raw, act = load_q(0, row_bytes * r), load_y(0, 32)
        if r > 1:
            act = builder.shuffle_vector(act, act, _indices(list(range(32)) * r))
        if fmt == "q4_1":                                 # row by row: its 16 low nibbles, then its 16 high
            lo = builder.and_(raw, ir.Constant(raw.type, [15] * 16 * r))
            hi = builder.lshr(raw, ir.Constant(raw.type, [4] * 16 * r))
            order: list[int] = []
            for i in range(r):
                order += list(range(16 * i, 16 * i + 16)) + list(range(16 * (r + i), 16 * (r + i) + 16))
            w = builder.shuffle_vector(lo, hi, _indices(order))
        elif fmt == "u8":
            w = raw
        elif flavour == "vnni":
            return _offset_sums(builder, raw, act, n)
        else:
            w, act = _sign_trick(builder, raw, act)
        return _sums(builder, flavour, w, act, n)

    return _on_blocks(sums)


def nibble_half_lanes(high: bool, flavour: str = HOST) -> Callable[..., Any]:
    """An intrinsic halves(proto, q, qo, y, yo): half of the lane sums of n / 4 rows' Q4_1 blocks (16 bytes each,
    one after another from q[qo]) against the activation block at y[yo], as float32: the low nibbles (elements
    0-15, lanes 0-3) or, ``high``, the high ones (elements 16-31, lanes 4-7), row r's four at lanes 4r-4r+3.
    One load serves both halves of all the rows, and no byte is moved across the register: the rows' nibbles
    meet the activation's half repeated, where block_lanes puts each row's halves side by side first."""
    if flavour not in ("vnni", "pmadd", "generic"):
        raise ValueError(f"nibble_half_lanes: unknown flavour {flavour!r}")

    def sums(builder: ir.IRBuilder, n: int, load_q: Loader, load_y: Loader) -> ir.Value:
        raw, act = load_q(0, 4 * n), load_y(16 * high, 16)
        act = builder.shuffle_vector(act, act, _indices(list(range(16)) * (n // 4)))
        if high:
            raw = builder.lshr(raw, ir.Constant(raw.type, [4] * 4 * n))
        return _sums(builder, flavour, builder.and_(raw, ir.Constant(raw.type, [15] * 4 * n)), act, n)

    return _on_blocks(sums)


def k_lanes(sub: int, bias: int, rows: int, flavour: str = HOST, runs: int = 8, lane_bias: bool = False,
            signed: bool = False, part: str | None = None,
            planes: str | None = None, codes: Sequence[int] | None = None) -> Callable[..., Any]:
    """An intrinsic lanes(proto, q, qo, y, yo, ystep, sc, so, bs, bo, bstep) for a register of 8 lanes: a K-quant
    super-block's int32 lanes as ggml_vec_dot_q6_K_q8_K / _q5_K_q8_K (AVX2) form them, as float32. q: the 256
    values as unsigned bytes in element order from q[qo] (uint8); y: the 256 activation quants from y[yo] (int8);
    sc: the 256 / ``sub`` sub-block scales from sc[so] (int8); bs: the activation's 16 sums per 16 quants from
    bs[bo] (int32). Lane l is, over the eight runs of 32 elements, the sum of (its elements 4l .. 4l + 3 . y)
    times the scale of their sub-block (of ``sub`` = 16 or 32 elements), less ``bias`` * (sc[2l] * bs[2l] +
    sc[2l + 1] * bs[2l + 1]) (Q6_K's offset of 32, taken out through the activation sums lane by lane); with
    ``lane_bias``, less ``bias`` times the lane's own scaled sums of y (ggml_vec_dot_q3_K_q8_K multiplies its
    values with their offset of 4 taken out). ``runs`` < 8: only the first that many runs of 32 (half a
    super-block: 4). The integers are exact (int32, as ggml's), converted to float lane by lane; or, ``rows`` > 0,
    the lanes' sum converted once (the tiled kernels' per-block integer) for that many activation rows at
    y[yo + t * ystep], bs[bo + t * bstep], row t's in lane t: the weight's values and scales are loaded once for
    them all. ``signed``: q's bytes are int8 values (IQ4_XS's), multiplied as ggml does, |value| by the quant
    with the value's sign. ``part`` (signed values 8 * g + e, g in -1 .. 1 and e = +-1: IQ1_S's and IQ1_M's grid
    value and delta sign, as ggml-cpu/tiled multiplies them whole): "grid" takes g, "delta" e, the two sums
    ggml_vec_dot_iq1_s_q8_K / _iq1_m_q8_K keep apart. ``planes`` (a key of PLANES): q holds the values in bit
    fields as GGUF keeps them (TQ2_0's crumbs, Q4_K's nibbles, Q5_K's and Q6_K's nibbles and high bits),
    unpacked in registers as ggml's vec_dots do. ``codes`` (16 signed values; with ``signed``): q holds 4-bit
    codes into them, 16 bytes a run of 32 (byte j: element j low, j + 16 high; IQ4_XS's qs as GGUF keeps them, 128
    bytes a super-block), looked up in registers as ggml_vec_dot_iq4_xs_q8_K does (pshufb)."""
    if sub not in (16, 32) or (bias and sub != 16) or not 0 <= rows <= 8 or runs not in (4, 8) \
            or (runs < 8 and bias and not lane_bias) or (signed and (bias or lane_bias)) \
            or part not in (None, "grid", "delta") or (part and not signed) or (planes and signed) \
            or (codes is not None and (not signed or part or len(codes) != 16)) \
            or (planes is not None and planes not in PLANES) or flavour not in ("vnni", "pmadd", "generic"):
        raise ValueError(f"k_lanes: no sub-block size {sub} with bias {bias} for {rows} rows over {runs} runs"
                         f"{' of signed values' if signed else ''}{f' ({part})' if part else ''}"
                         f"{f' in planes {planes!r}' if planes else ''}, or unknown "
                         f"flavour {flavour!r}")
    i32x8, wide = ir.VectorType(_I32, 8), WIDE_LANES        # runs of 32 formed two at a time on AVX-512
    table = [int(v) & 255 for v in codes] if codes is not None else []

    @intrinsic
    def lanes(typingctx, proto, q, qo, y, yo, ystep, sc, so, bs, bo, bstep):  # type: ignore[no-untyped-def]
        if not (isinstance(proto, F32Vec) and proto.n == 8 and all(isinstance(a, types.Array) for a in (q, y, sc, bs))
                and (q.dtype, y.dtype, sc.dtype, bs.dtype) == (types.uint8, types.int8, types.int8, types.int32)):
            return None

        def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
            def load(at: int, offset: int | ir.Value, count: int, elem: ir.Type) -> ir.Value:
                idx = args[at + 1]
                if not isinstance(offset, int) or offset:
                    idx = builder.add(idx, offset if not isinstance(offset, int) else ir.Constant(idx.type, offset))
                ptr = element_ptr(context, builder, sig.args[at], args[at], idx, count)
                return builder.load(builder.bitcast(ptr, ir.VectorType(elem, count).as_pointer()), align=1)

            raw_scales = load(6, 0, 16, _I8)                  # sub 32: 8 scales (and 8 bytes not read)
            step = wide // 8
            group = range(0, runs, step)


            def code_runs(g: int) -> ir.Value:               # runs g .. g + step - 1 from their codes
                raw = load(1, 16 * g, 2 * wide, _I8)
                lo = builder.and_(raw, ir.Constant(raw.type, [15] * 2 * wide))
                hi = builder.lshr(raw, ir.Constant(raw.type, [4] * 2 * wide))
                order = [i for r in range(step) for i in list(range(16 * r, 16 * r + 16))
                         + list(range(2 * wide + 16 * r, 2 * wide + 16 * r + 16))]
                return _look_up(builder, flavour, table, builder.shuffle_vector(lo, hi, _indices(order)))

            if planes:
                def run(g: int) -> ir.Value:
                    return _plane_run(builder, lambda at: load(1, at, 32, _I8), PLANES[planes][1][g])
                values = [run(g) if step == 1 else builder.shuffle_vector(run(g), run(g + 1), _indices(list(range(64))))
                          for g in group]
            elif codes is not None:
                values = [code_runs(g) for g in group]
            else:
                values = [_part(builder, load(1, 32 * g, 4 * wide, _I8), part) for g in group]
            scales = [builder.sext(builder.shuffle_vector(raw_scales, raw_scales, _indices(
                [(32 * g + 4 * lane) // sub for lane in range(wide)])), ir.VectorType(_I32, wide)) for g in group]
            offset = ir.Constant(ir.VectorType(_I8, 4 * wide), [bias] * 4 * wide)
            per_row = []
            for t in range(max(rows, 1)):
                yo = builder.mul(args[5], ir.Constant(args[5].type, t))
                acc = ir.Constant(ir.VectorType(_I32, wide), [0] * wide)
                for k, g in enumerate(group):
                    y_run = load(3, builder.add(yo, ir.Constant(yo.type, 32 * g)), 4 * wide, _I8)
                    w = values[k]
                    if signed:
                        w, y_run = _sign_trick(builder, w, y_run)
                    acc = builder.add(acc, _scaled_sums(builder, flavour, w, y_run, scales[k], wide))
                    if lane_bias:
                        acc = builder.sub(acc, _scaled_sums(builder, flavour, offset, y_run, scales[k], wide))
                if wide > 8:                                  # the runs' lanes added in integers: ggml's 8 lanes
                    acc = builder.add(builder.shuffle_vector(acc, acc, _indices(list(range(8)))),
                                      builder.shuffle_vector(acc, acc, _indices(list(range(8, 16)))))
                if bias and not lane_bias:
                    bo = builder.mul(args[10], ir.Constant(args[10].type, t))
                    sums = builder.mul(load(8, bo, 16, _I32), builder.sext(raw_scales, ir.VectorType(_I32, 16)))
                    acc = builder.sub(acc, builder.mul(_pair_sums(builder, sums), ir.Constant(i32x8, [bias] * 8)))
                per_row.append(acc)
            return builder.sitofp(_row_totals(builder, per_row) if rows else per_row[0],
                                  ir.VectorType(ir.FloatType(), 8))

        return proto(proto, q, qo, y, yo, ystep, sc, so, bs, bo, bstep), codegen

    return lanes


def _plane_run(builder: ir.IRBuilder, load: Callable[[int], ir.Value], fields: tuple[_Field, ...]) -> ir.Value:
    """Values of a run from its bit fields (PLANES; load(offset): a field's bytes there, as many as the values
    wanted): each field's bytes shifted down, masked, moved to its place, and the fields ORed."""
    out = None
    for at, shift, bits, place in fields:
        v = load(at)
        n = v.type.count
        if shift:
            v = builder.lshr(v, ir.Constant(v.type, [shift] * n))
        if shift + bits < 8:
            v = builder.and_(v, ir.Constant(v.type, [(1 << bits) - 1] * n))
        if place:
            v = builder.shl(v, ir.Constant(v.type, [place] * n))
        out = v if out is None else builder.or_(out, v)
    return out


def plane_values(planes: str, spread: int = 1) -> Callable[..., Any]:
    """An intrinsic unpack(q, qo, dst, do): a super-block's 256 values kept in bit fields (PLANES[planes]) from
    q[qo] as bytes in element order into dst[do] (both uint8), as k_lanes unpacks them in registers. ``spread``:
    every byte offset of both times that, each byte's place taken by ``spread`` (a field of 32 bytes is 32 *
    spread, the run's values likewise): ``spread`` rows' super-blocks laid side by side in 4-byte words, the
    packed ones unpacked at once, since a word of values is formed from the same word of each field."""
    if planes not in PLANES or spread < 1:
        raise ValueError(f"plane_values: unknown planes {planes!r} ({sorted(PLANES)}) or spread {spread} (>= 1)")
    chunk = 64 if spread % 2 == 0 else 32                 # bytes a register (two ymm registers or one zmm)

    @intrinsic
    def unpack(typingctx, q, qo, dst, do):  # type: ignore[no-untyped-def]
        if not (isinstance(q, types.Array) and isinstance(dst, types.Array) and q.dtype == dst.dtype == types.uint8
                and q.ndim == dst.ndim == 1):
            return None

        def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
            at, load = _operands(context, builder, sig, args)
            vb = ir.VectorType(_I8, chunk)
            for g, fields in enumerate(PLANES[planes][1]):
                for c in range(0, 32 * spread, chunk):
                    run = _plane_run(builder, lambda offset: load(0, offset * spread + c, vb, chunk), fields)
                    ptr = element_ptr(context, builder, sig.args[2], args[2], at(2, 32 * spread * g + c), chunk)
                    builder.store(run, builder.bitcast(ptr, vb.as_pointer()), align=1)
            return context.get_dummy_value()

        return types.void(q, qo, dst, do), codegen

    return unpack


def _part(builder: ir.IRBuilder, v: ir.Value, part: str | None) -> ir.Value:
    """Bytes 8 * g + e (g in -1 .. 1, e = +-1) -> g = (v + 4) >> 3 ("grid") or e = v - 8 * g ("delta"); v as it is
    for no part."""
    if part is None:
        return v
    n = v.type.count
    grid = builder.ashr(builder.add(v, ir.Constant(v.type, [4] * n)), ir.Constant(v.type, [3] * n))
    return grid if part == "grid" else builder.sub(v, builder.shl(grid, ir.Constant(v.type, [3] * n)))


def k_mins(rows: int, pairs: bool = False, sub: int = 32) -> Callable[..., Any]:
    """An intrinsic mins(proto, sc, so, bs, bo, bstep) for a register of 8 lanes: lane t (t < ``rows``) is a
    K-quant's min integer of activation row t, sum_j sc[so + n + j] * (the activation's sum over sub-block j) (the
    n = 256 / ``sub`` mins after the n scales, int8; the activation's sums per 16 quants from bs[bo + t * bstep],
    int32; Q4_K/Q5_K: sub 32, two sums a sub-block; Q2_K: sub 16), as float32. With ``pairs`` (one row), lane p
    holds the terms of j = 2p and 2p + 1: ggml_vec_dot_q4_K_q8_K's four (the rest 0), or the eight of
    ggml_vec_dot_q2_K_q8_K's multiply-add of mins and sums."""
    if not 1 <= rows <= 8 or (pairs and rows != 1) or sub not in (16, 32):
        raise ValueError(f"k_mins: {rows} rows (1 to 8; pairs: 1), sub-blocks of {sub} (16 or 32)")
    n = 256 // sub

    @intrinsic
    def mins(typingctx, proto, sc, so, bs, bo, bstep):  # type: ignore[no-untyped-def]
        if not (isinstance(proto, F32Vec) and proto.n == 8 and isinstance(sc, types.Array)
                and isinstance(bs, types.Array) and (sc.dtype, bs.dtype) == (types.int8, types.int32)):
            return None

        def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
            def load(at: int, idx: ir.Value, count: int, elem: ir.Type) -> ir.Value:
                ptr = element_ptr(context, builder, sig.args[at], args[at], idx, count)
                return builder.load(builder.bitcast(ptr, ir.VectorType(elem, count).as_pointer()), align=1)

            m = builder.sext(load(1, builder.add(args[2], ir.Constant(args[2].type, n)), n, _I8),
                             ir.VectorType(_I32, n))
            per_row = []                                      # int32x8: lane p the terms of j = 2p, 2p + 1 (sub 16)
            for t in range(rows):                             # or the term of j = p (sub 32)
                sums = load(3, builder.add(args[4], builder.mul(args[5], ir.Constant(args[5].type, t))), 16, _I32)
                per_row.append(_pair_sums(builder, builder.mul(sums, m)) if sub == 16
                               else builder.mul(_pair_sums(builder, sums), m))
            if pairs and sub == 32:
                four = _pair_sums(builder, per_row[0])
                return builder.sitofp(builder.shuffle_vector(four, ir.Constant(four.type, [0] * 4),
                                                             _indices(list(range(8)))), ir.VectorType(ir.FloatType(), 8))
            if pairs:
                return builder.sitofp(per_row[0], ir.VectorType(ir.FloatType(), 8))
            return builder.sitofp(_row_totals(builder, per_row), ir.VectorType(ir.FloatType(), 8))

        return proto(proto, sc, so, bs, bo, bstep), codegen

    return mins


def _dot_into(builder: ir.IRBuilder, flavour: str, acc: ir.Value, w: ir.Value, y: ir.Value, n: int) -> ir.Value:
    """acc plus _sums(w, y): VNNI's vpdpbusd accumulates in the instruction itself."""
    if flavour == "vnni" and (n != 16 or _AVX512BW):
        vi = ir.VectorType(_I32, n)
        return _x86(builder, f"llvm.x86.avx512.vpdpbusd.{32 * n}", vi, [acc, builder.bitcast(w, vi),
                                                                          builder.bitcast(y, vi)])
    return builder.add(acc, _sums(builder, flavour, w, y, n))


def _signed_products(builder: ir.IRBuilder, w: ir.Value, y: ir.Value, n: int) -> ir.Value:
    """n int32 lane sums of four products of signed bytes w and y, each the exact product (also for -128, where
    ggml's sign trick differs): widened to int32, multiplied, runs of four added."""
    wide = ir.VectorType(_I32, 4 * n)
    p = builder.mul(builder.sext(w, wide), builder.sext(y, wide))
    parts = [builder.shuffle_vector(p, p, _indices(list(range(j, 4 * n, 4)))) for j in range(4)]
    return builder.add(builder.add(parts[0], parts[1]), builder.add(parts[2], parts[3]))


def _broadcast_four(context, builder, aty, arr, idx, n):  # type: ignore[no-untyped-def]
    """The four int8 at arr[idx] (a 1-D array) in each of n int32 lanes, as a 4n-byte vector."""
    vi = ir.VectorType(_I32, n)
    ptr = element_ptr(context, builder, aty, arr, idx, 4)
    one = builder.insert_element(ir.Constant(vi, ir.Undefined), builder.load(builder.bitcast(ptr, _I32.as_pointer()),
                                                                             align=1), ir.Constant(_I32, 0))
    return builder.bitcast(builder.shuffle_vector(one, one, ir.Constant(vi, [0] * n)), ir.VectorType(_I8, 4 * n))


def _look_up(builder: ir.IRBuilder, flavour: str, table: list[int], codes: ir.Value) -> ir.Value:
    """Bytes 0-15 -> table[code] (16 byte values): one pshufb per register on x86, compares elsewhere."""
    n = codes.type.count
    if flavour == "generic":
        out = ir.Constant(codes.type, [0] * n)
        for c, value in enumerate(table):
            hit = builder.icmp_unsigned("==", codes, ir.Constant(codes.type, [c] * n))
            out = builder.select(hit, ir.Constant(codes.type, [value] * n), out)
        return out
    name = "llvm.x86.avx512.pshuf.b.512" if n == 64 else "llvm.x86.avx2.pshuf.b"
    return _x86(builder, name, codes.type, [ir.Constant(codes.type, table * (n // 16)), codes])


def _operands(context, builder, sig, args):  # type: ignore[no-untyped-def]
    """For an intrinsic whose array arguments are each followed by an index: at(i, offset), array argument i's
    index plus offset, and load(i, offset, ty, count), the ty (a vector of count elements, or one) there."""
    def at(i: int, offset: int) -> ir.Value:
        idx = args[i + 1]
        return builder.add(idx, ir.Constant(idx.type, offset)) if offset else idx

    def load(i: int, offset: int, ty: ir.Type, count: int = 1) -> ir.Value:
        ptr = element_ptr(context, builder, sig.args[i], args[i], at(i, offset), count)
        return builder.load(builder.bitcast(ptr, ty.as_pointer()), align=1)

    return at, load


def _row_four(context, builder, sig, args, r, offset, n):  # type: ignore[no-untyped-def]
    """For an intrinsic taking activation rows as (y, yo, ys) at arguments 3-5: the four int8 of row r at
    y[yo + r * ys + offset], in each of n int32 lanes (_broadcast_four)."""
    idx = builder.add(args[4], builder.mul(args[5], ir.Constant(args[5].type, r))) if r else args[4]
    idx = builder.add(idx, ir.Constant(idx.type, offset)) if offset else idx
    return _broadcast_four(context, builder, sig.args[3], args[3], idx, n)


def _rows_result(context, builder, sig, sums, n):  # type: ignore[no-untyped-def]
    """Each activation row's int32 sums as float32: one register, or a tuple of them for several rows."""
    floats = [builder.sitofp(x, ir.VectorType(ir.FloatType(), n)) for x in sums]
    return floats[0] if len(floats) == 1 else context.make_tuple(builder, sig.return_type, floats)


def row_code_dots(values: Sequence[int], flavour: str = HOST) -> Callable[..., Any]:
    """An intrinsic dots(proto, q, qo, y, yo, ysum): for n = proto's lanes weight rows side by side (lane l is
    row l), the exact sum over a 32-element block of values[code] (16 signed byte values) times its activation
    quants, as float32 (at most 32 * 128 * 128 in magnitude). Layout: a block's 16 code bytes a row as GGUF
    keeps them (byte j: element j low, j + 16 high) in four chunks of four, chunk c the n rows' four bytes one
    row after another from q[qo + 4nc]; the quants (int8) at y[yo]; ysum their sum. The codes become values in
    registers (pshufb); with VNNI as values + 128, unsigned, from a start of -128 * ysum, elsewhere as they are,
    multiplied widened: the exact products either way (ggml's sign trick differs where a quant is -128)."""
    if len(values) != 16 or flavour not in ("vnni", "pmadd", "generic"):
        raise ValueError(f"row_code_dots: {len(values)} values (16) or unknown flavour {flavour!r}")
    signed = [int(v) & 255 for v in values]
    offset = [(int(v) + 128) & 255 for v in values]

    @intrinsic
    def dots(typingctx, proto, q, qo, y, yo, ysum):  # type: ignore[no-untyped-def]
        if not (isinstance(proto, F32Vec) and isinstance(q, types.Array) and isinstance(y, types.Array)
                and (q.dtype, y.dtype) == (types.uint8, types.int8) and isinstance(ysum, types.Integer)):
            return None

        def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
            n = proto.n
            vi, vb = ir.VectorType(_I32, n), ir.VectorType(_I8, 4 * n)
            vnni = flavour == "vnni" and (n != 16 or _AVX512BW)
            if vnni:
                total = args[5] if args[5].type.width == 32 else builder.trunc(args[5], _I32)
                start = builder.insert_element(ir.Constant(vi, ir.Undefined),
                                               builder.mul(total, ir.Constant(_I32, -128)), ir.Constant(_I32, 0))
                acc = builder.shuffle_vector(start, start, ir.Constant(vi, [0] * n))
            else:
                acc = ir.Constant(vi, [0] * n)
            at, load = _operands(context, builder, sig, args)
            for c in range(4):
                raw = load(1, 4 * n * c, vb, 4 * n)
                halves = (builder.and_(raw, ir.Constant(vb, [15] * 4 * n)),
                          builder.lshr(raw, ir.Constant(vb, [4] * 4 * n)))
                for h, codes in enumerate(halves):
                    four = _broadcast_four(context, builder, sig.args[3], args[3], at(3, 16 * h + 4 * c), n)
                    if vnni:
                        w = _look_up(builder, flavour, offset, codes)
                        acc = _x86(builder, f"llvm.x86.avx512.vpdpbusd.{32 * n}", vi,
                                   [acc, builder.bitcast(w, vi), builder.bitcast(four, vi)])
                    else:
                        acc = builder.add(acc, _signed_products(builder, _look_up(builder, flavour, signed, codes),
                                                                four, n))
            return builder.sitofp(acc, ir.VectorType(ir.FloatType(), n))

        return proto(proto, q, qo, y, yo, ysum), codegen

    return dots


def k_start(bias: int, codes: bool, flavour: str = HOST) -> int:
    """What row_k_dots' sum over a sub-block starts from, per unit of the activation's sum there: -bias (Q6_K's
    values less 32), -128 where codes go in as values + 128 (VNNI), else 0 (nothing to start from)."""
    return -bias if bias else -128 if codes and flavour == "vnni" else 0


def row_k_dots(sub: int, bias: int, flavour: str = HOST, codes: Sequence[int] | None = None,
               rows: int = 1) -> Callable[..., Any]:
    """An intrinsic dots(proto, q, qo, y, yo, ys, sc, so, bs, bo, bss): for n = proto's lanes weight rows side by
    side (lane l is row l), a K-quant super-block's exact integer s1 = sum_j sc_j * (sub-block j's unsigned values
    . its activation quants, less ``bias`` times their sum), as float32, for ``rows`` activation rows at once (a
    tuple of them when more than one): ggml-cpu/tiled's per-block integer of Q6_K (sub 16, bias 32) or Q5_K and
    Q4_K (sub 32, no bias). Layout: 64 chunks of four values a row, chunk c the n rows' four bytes one row after
    another from q[qo + 4nc]; sub-block j's n scales (int8) at sc[so + nj]; activation row r's 256 quants (int8) at
    y[yo + r * ys], and where k_start is not 0 what sub-block j's sums start from at bs[bo + r * bss + j] (int32:
    k_start times the sub-block's quants' sum, formed once a row by the caller for every group of weight rows, so
    that a turn loads it into a register as it is). A chunk's four quants are broadcast to every
    row (vpdpbusd, or pmaddubsw and pmaddwd): no sum across lanes; each chunk is loaded (and its codes looked up)
    once for all the activation rows, whose chains run side by side. ``codes`` (16 signed values; sub 32): q holds
    4-bit codes into them, per run of 32 four chunks of four code bytes a row (the run's 16 GGUF bytes: byte j
    element j low, j + 16 high) from q[qo + 16nj + 4nc], looked up in registers (IQ4_XS): ggml's tiled kernels
    multiply them with the sign trick, whose products are the true ones unless a quant is -128, which
    quantize_row_q8_K never makes (its NaN and infinities quantize to 0 .. 127); with VNNI they go in as values +
    128 from a start of -128 times the run's quants, elsewhere through the sign trick."""
    if ((sub, bias) not in ((16, 32), (32, 0)) or flavour not in ("vnni", "pmadd", "generic")
            or (codes is not None and (sub, len(codes)) != (32, 16)) or rows < 1):
        raise ValueError(f"row_k_dots: no sub-blocks of {sub} with bias {bias}{' of codes' if codes else ''}, "
                         f"{rows} activation rows, or unknown flavour {flavour!r}")
    signed = [int(v) & 255 for v in codes] if codes is not None else []
    offset = [(int(v) + 128) & 255 for v in codes] if codes is not None else []
    start = k_start(bias, codes is not None, flavour)

    @intrinsic
    def dots(typingctx, proto, q, qo, y, yo, ys, sc, so, bs, bo, bss):  # type: ignore[no-untyped-def]
        if not (isinstance(proto, F32Vec) and all(isinstance(a, types.Array) for a in (q, y, sc, bs))
                and (q.dtype, y.dtype, sc.dtype, bs.dtype) == (types.uint8, types.int8, types.int8, types.int32)):
            return None

        def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
            n = proto.n
            vi, vb = ir.VectorType(_I32, n), ir.VectorType(_I8, 4 * n)
            offsets = codes is not None and start != 0        # values + 128 from their start (_dot_into: any n)
            s1 = [cgutils.alloca_once_value(builder, ir.Constant(vi, [0] * n)) for _ in range(rows)]
            # one sub-block a turn of an LLVM loop, not unrolled here: the code of eight activation rows over a
            # whole super-block took LLVM seconds to compile per format, and a turn's dots are work enough
            steps = ((n * sub // 2 if codes else n * sub), sub, n, 1)   # its q, y, sc and bs offsets
            with cgutils.for_range(builder, ir.Constant(args[2].type, 256 // sub)) as loop:
                turn = list(args)
                for i, step in zip((2, 4, 7, 9), steps):
                    turn[i] = builder.add(args[i], builder.mul(loop.index, ir.Constant(args[i].type, step)))
                _, load = _operands(context, builder, sig, turn)

                def first(r: int) -> ir.Value:               # activation row r's start of the sub-block
                    idx = builder.add(turn[9], builder.mul(turn[10], ir.Constant(turn[10].type, r))) if r else turn[9]
                    ptr = element_ptr(context, builder, sig.args[8], turn[8], idx, 1)
                    return builder.load(builder.bitcast(ptr, _I32.as_pointer()), align=1)

                def splat(x: ir.Value) -> ir.Value:
                    one = builder.insert_element(ir.Constant(vi, ir.Undefined), x, ir.Constant(_I32, 0))
                    return builder.shuffle_vector(one, one, ir.Constant(vi, [0] * n))

                def four(r: int, offset: int) -> ir.Value:
                    return _row_four(context, builder, sig, turn, r, offset, n)

                dot = [splat(first(r)) if start else ir.Constant(vi, [0] * n) for r in range(rows)]
                if codes is None:
                    for c in range(sub // 4):
                        w = load(1, 4 * n * c, vb, 4 * n)
                        dot = [_dot_into(builder, flavour, dot[r], w, four(r, 4 * c), n) for r in range(rows)]
                for c in range(4 if codes is not None else 0):
                    raw = load(1, 4 * n * c, vb, 4 * n)
                    for h, part in enumerate((builder.and_(raw, ir.Constant(vb, [15] * 4 * n)),
                                              builder.lshr(raw, ir.Constant(vb, [4] * 4 * n)))):
                        value = _look_up(builder, flavour, offset if offsets else signed, part)
                        for r in range(rows):
                            y4 = four(r, 16 * h + 4 * c)
                            dot[r] = (_dot_into(builder, flavour, dot[r], value, y4, n) if offsets else
                                      _dot_into(builder, flavour, dot[r], *_sign_trick(builder, value, y4), n))
                scale = builder.sext(load(6, 0, ir.VectorType(_I8, n), n), vi)
                for r in range(rows):
                    builder.store(builder.add(builder.load(s1[r]), builder.mul(scale, dot[r])), s1[r])
            return _rows_result(context, builder, sig, [builder.load(p) for p in s1], n)

        result = proto if rows == 1 else types.UniTuple(proto, rows)
        return result(proto, q, qo, y, yo, ys, sc, so, bs, bo, bss), codegen

    return dots


def row_nibble_dots(pairs: int, flavour: str = HOST, rows: int = 1) -> Callable[..., Any]:
    """An intrinsic dots(proto, q, qo, y, yo, ys, sc, so): for n = proto's lanes weight rows side by side (lane l
    is row l), the exact integer sum over ``pairs`` consecutive pairs of 32-element sub-blocks of sc_j * (the
    sub-block's 4-bit values . its 32 activation quants), as float32, for ``rows`` activation rows at once (a
    tuple of them when more than one). Layout: pair t's 32 bytes of every row (low nibbles sub-block 2t, high
    nibbles 2t + 1, as Q4_K stores them) in eight chunks of four bytes, chunk c the n rows' four bytes one row
    after another, from q[qo + 32nt + 4nc]; sub-block j's n scales (uint8) at sc[so + nj]; activation row r's
    pair of 64 quants (int8) at y[yo + r * ys + 64t]. A chunk's four quants are broadcast to every row and meet
    each row's four values in one lane (vpdpbusd, or pmaddubsw and pmaddwd): no sum across lanes, and each nibble
    byte loaded once for both of its sub-blocks and all the activation rows."""
    if pairs not in (1, 4) or flavour not in ("vnni", "pmadd", "generic") or rows < 1:
        raise ValueError(f"row_nibble_dots: {pairs} pairs (1 or 4), {rows} activation rows, or unknown flavour "
                         f"{flavour!r}")

    @intrinsic
    def dots(typingctx, proto, q, qo, y, yo, ys, sc, so):  # type: ignore[no-untyped-def]
        if not (isinstance(proto, F32Vec) and all(isinstance(a, types.Array) for a in (q, y, sc))
                and (q.dtype, y.dtype, sc.dtype) == (types.uint8, types.int8, types.uint8)):
            return None

        def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
            n = proto.n
            vi, vb = ir.VectorType(_I32, n), ir.VectorType(_I8, 4 * n)

            at, load = _operands(context, builder, sig, args)

            def four(r: int, offset: int) -> ir.Value:
                return _row_four(context, builder, sig, args, r, offset, n)

            low = ir.Constant(vb, [15] * 4 * n)
            total = [ir.Constant(vi, [0] * n)] * rows
            for t in range(pairs):
                lo_dot = hi_dot = [ir.Constant(vi, [0] * n)] * rows
                for c in range(8):
                    raw = load(1, 32 * n * t + 4 * n * c, vb, 4 * n)
                    lo, hi = builder.and_(raw, low), builder.lshr(raw, ir.Constant(vb, [4] * 4 * n))
                    lo_dot = [_dot_into(builder, flavour, lo_dot[r], lo, four(r, 64 * t + 4 * c), n)
                              for r in range(rows)]
                    hi_dot = [_dot_into(builder, flavour, hi_dot[r], hi, four(r, 64 * t + 32 + 4 * c), n)
                              for r in range(rows)]
                s_lo, s_hi = (builder.zext(load(6, n * (2 * t + h), ir.VectorType(_I8, n), n), vi) for h in (0, 1))
                total = [builder.add(total[r], builder.add(builder.mul(s_lo, lo_dot[r]), builder.mul(s_hi, hi_dot[r])))
                         for r in range(rows)]
            return _rows_result(context, builder, sig, total, n)

        result = proto if rows == 1 else types.UniTuple(proto, rows)
        return result(proto, q, qo, y, yo, ys, sc, so), codegen

    return dots
