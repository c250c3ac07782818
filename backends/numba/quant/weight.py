"""QWeight, a GGUF weight ready for matmul and get_rows, and the table of weight kinds it dispatches through.

One row of the table per GGUF type: what the kernels read the data as, the activation format, the stream
layout, and the functions of the other modules that repack, multiply and dequantize that type.
"""

from __future__ import annotations

import ctypes
import mmap
import threading
import weakref
from dataclasses import dataclass, replace
from typing import Any, Callable, Sequence

import gguf
import numpy as np

from graphir.backends.numba.primitives.isa import IsaPath, numerics
from graphir.backends.numba.primitives.jit import PAR_MIN
from graphir.backends.numba.quant.activation import ACT
from graphir.backends.numba.quant.blocks import (dequantizer, repack_iq1_m, repack_iq1_s, repack_iq3_s, repack_iq3_xxs,
                                                 repack_iq4_nl, repack_iq4_xs, repack_mxfp4, repack_q4_0, repack_q4_1,
                                                 repack_q4_k, repack_q5_0, repack_q5_1, repack_q5_k, repack_q6_k,
                                                 repack_q8_0, row_bf16, row_f16, row_f32, row_iq1, row_iq2, row_iq4_xs,
                                                 row_lut4, row_q2_k, row_q3_k, row_q4_0, row_q4_1, row_q4_k, row_q5_0,
                                                 row_q5_1, row_q5_k, row_q6_k, row_q8_0, row_ternary)
from graphir.backends.numba.quant.exact import (_G, exact_gemv, pack_iq4_nl_as_q8_0, pack_q4_0, pack_q4_0_as_q8_0,
                                                pack_q4_1, pack_q5_0_as_q8_0, pack_q5_1, pack_q8_0)
from graphir.backends.numba.quant.kquant import (k_product, pack_iq1_m, pack_iq1_s, pack_iq2_s, pack_iq2_xs,
                                                 pack_iq2_xxs, pack_iq3_s, pack_iq3_xxs, pack_iq4_xs, pack_q2_k,
                                                 pack_q3_k, pack_q4_k, pack_q4_k_values, pack_q5_k, pack_q6_k,
                                                 pack_tq1_0, pack_tq2_0, q2_k_x8, q4_k_x8)
from graphir.backends.numba.quant.lut4 import iq4_nl_matmul, iq4_nl_unrepacked, mxfp4_matmul, pack_iq4_nl, pack_mxfp4
from graphir.backends.numba.quant.stream import GEMM_FROM, converting_gemv, gemv_f32, tiled_gemm

__all__ = ["QWeight", "QWeightGroup", "SUPPORTED"]

T = gguf.GGMLQuantizationType
_F32 = np.float32


@dataclass(frozen=True)
class _Kind:
    dtype: type                    # element type the kernels read the GGUF data as (blocks: gguf.GGML_QUANT_SIZES)
    act: str                       # activation format: key of ACT (exact kinds: the one their kernels make)
    parts: int                     # streams a row is split into (stream order, see the package docstring)
    run: int                       # consecutive natural elements that go to one stream before the next
    repack: Callable | None        # (rows, nblocks, type_size) uint8 blocks -> packed arrays; None: use data as is
    gemv: Callable                 # (*packed, xq, asum, out), n < GEMM_FROM
    gemm: Callable                 # (*packed, xq, asum, out), n >= GEMM_FROM
    deq: Callable                  # (*packed, ids, inv, out)
    # Exact kinds (Q4_1, Q5_1, Q8_0, Q5_0, Q4_0, MXFP4, the K-quants): matmul uses its own layout, `pack` (qs, d, m),
    # and one kernel for every n, gemv (gemm is the same), takes (*packed, x, out) and quantizes x itself.
    # `repack`/`deq` then serve get_rows only (from raw rows).
    pack: Callable | None = None
    # rows of several weights can be packed one after another and run as one GEMV (QWeightGroup): their layout
    # keeps each group of _G rows apart
    joins: bool = False


_Q8 = exact_gemv("q8_0")        # Q8_0's, and Q5_0's on Q8_0 blocks
_Q4_0 = exact_gemv("q4_0x8")    # Q4_0 in the order of llama.cpp's repacked 8x8 kernels
_DEQ_Q4_0 = dequantizer(row_q4_0)
_DEQ_LUT4 = dequantizer(row_lut4)                   # MXFP4's and IQ4_NL's codes into their table of values
# llama.cpp's vec_dot below 8 rows, its tiled kernels from 8 (Q4_K, Q2_K: where it does not repack)
_Q2_K, _Q3_K, _Q4_K, _Q5_K, _Q6_K, _IQ4_XS = (k_product(f) for f in ("q2_k", "q3_k", "q4_k", "q5_k", "q6_k",
                                                                     "iq4_xs"))
_DEQ_Q2_K = dequantizer(row_q2_k)
_IQ2, _DEQ_IQ2 = k_product("iq2"), dequantizer(row_iq2)             # IQ2_XXS, IQ2_XS, IQ2_S: one layout
_IQ1_S, _IQ1_M, _DEQ_IQ1 = k_product("iq1_s"), k_product("iq1_m"), dequantizer(row_iq1)
_TERNARY, _DEQ_TERNARY = k_product("ternary"), dequantizer(row_ternary)    # TQ1_0's and TQ2_0's: never tiled
_IQ3_S, _IQ3_XXS = k_product("iq3_s"), k_product("iq3_xxs")
_DEQ_SIGNED = dequantizer(row_iq4_xs)     # int8 values times a scale per 32 (IQ4_XS's; IQ3_S's, IQ3_XXS's alike)
_TYPES: dict[T, _Kind] = {
    T.F32: _Kind(np.float32, "f32", 1, 1, None, gemv_f32, tiled_gemm(row_f32), dequantizer(row_f32)),
    T.F16: _Kind(np.uint16, "f16", 1, 1, None, converting_gemv(bf16=False), tiled_gemm(row_f16),
                  dequantizer(row_f16)),
    T.BF16: _Kind(np.uint16, "bf16", 1, 1, None, converting_gemv(bf16=True), tiled_gemm(row_bf16),
                   dequantizer(row_bf16)),
    T.Q8_0: _Kind(np.uint8, "q8_0", 1, 32, repack_q8_0, _Q8, _Q8, dequantizer(row_q8_0), pack_q8_0, True),
    T.Q4_0: _Kind(np.uint8, "q8_0", 2, 16, repack_q4_0, _Q4_0, _Q4_0, _DEQ_Q4_0, pack_q4_0, True),
    T.Q5_0: _Kind(np.uint8, "q8_0", 2, 16, repack_q5_0, _Q8, _Q8, dequantizer(row_q5_0), pack_q5_0_as_q8_0, True),
    T.MXFP4: _Kind(np.uint8, "q8_0", 2, 16, repack_mxfp4, mxfp4_matmul, mxfp4_matmul, _DEQ_LUT4, pack_mxfp4),
    T.IQ4_NL: _Kind(np.uint8, "q8_0", 2, 16, repack_iq4_nl, iq4_nl_matmul, iq4_nl_matmul, _DEQ_LUT4, pack_iq4_nl),
    T.Q4_1: _Kind(np.uint8, "q8_1", 2, 16, repack_q4_1, exact_gemv("q4_1"), exact_gemv("q4_1"), dequantizer(row_q4_1), pack_q4_1,
                  True),
    T.Q5_1: _Kind(np.uint8, "q8_1", 2, 16, repack_q5_1, exact_gemv("q5_1"), exact_gemv("q5_1"), dequantizer(row_q5_1),
                  pack_q5_1, True),
    T.Q4_K: _Kind(np.uint8, "q8_K", 2, 32, repack_q4_k, q4_k_x8(True), q4_k_x8(True), dequantizer(row_q4_k), pack_q4_k),
    T.Q5_K: _Kind(np.uint8, "q8_K", 2, 32, repack_q5_k, _Q5_K, _Q5_K, dequantizer(row_q5_k), pack_q5_k),
    T.Q6_K: _Kind(np.uint8, "q8_K", 4, 32, repack_q6_k, _Q6_K, _Q6_K, dequantizer(row_q6_k), pack_q6_k),
    # Q3_K, Q2_K, IQ4_XS and the ternary types: get_rows reads matmul's layout (values as bytes in element order)
    T.Q3_K: _Kind(np.uint8, "q8_K", 1, 1, pack_q3_k, _Q3_K, _Q3_K, dequantizer(row_q3_k), pack_q3_k),
    T.Q2_K: _Kind(np.uint8, "q8_K", 1, 1, pack_q2_k, q2_k_x8(True), q2_k_x8(True), _DEQ_Q2_K, pack_q2_k),
    T.IQ4_XS: _Kind(np.uint8, "q8_K", 1, 1, repack_iq4_xs, _IQ4_XS, _IQ4_XS, _DEQ_SIGNED, pack_iq4_xs),
    T.IQ2_XXS: _Kind(np.uint8, "q8_K", 1, 1, pack_iq2_xxs, _IQ2, _IQ2, _DEQ_IQ2, pack_iq2_xxs),
    T.IQ2_XS: _Kind(np.uint8, "q8_K", 1, 1, pack_iq2_xs, _IQ2, _IQ2, _DEQ_IQ2, pack_iq2_xs),
    T.IQ2_S: _Kind(np.uint8, "q8_K", 1, 1, pack_iq2_s, _IQ2, _IQ2, _DEQ_IQ2, pack_iq2_s),
    T.IQ1_S: _Kind(np.uint8, "q8_K", 1, 1, repack_iq1_s, _IQ1_S, _IQ1_S, _DEQ_IQ1, pack_iq1_s),
    T.IQ1_M: _Kind(np.uint8, "q8_K", 1, 1, repack_iq1_m, _IQ1_M, _IQ1_M, _DEQ_IQ1, pack_iq1_m),
    T.TQ1_0: _Kind(np.uint8, "q8_K", 1, 1, pack_tq1_0, _TERNARY, _TERNARY, _DEQ_TERNARY, pack_tq1_0),
    T.TQ2_0: _Kind(np.uint8, "q8_K", 1, 1, pack_tq2_0, _TERNARY, _TERNARY, _DEQ_TERNARY, pack_tq2_0),
    T.IQ3_S: _Kind(np.uint8, "q8_K", 1, 1, repack_iq3_s, _IQ3_S, _IQ3_S, _DEQ_SIGNED, pack_iq3_s),
    T.IQ3_XXS: _Kind(np.uint8, "q8_K", 1, 1, repack_iq3_xxs, _IQ3_XXS, _IQ3_XXS, _DEQ_SIGNED, pack_iq3_xxs),
}
SUPPORTED = frozenset(_TYPES)
# llama.cpp repacks a Q4_0 matrix only when its rows come in eights (exact_gemv's "q4_0x8"), only a 2-D one
# (a stack's matrices, mul_mat of a 3-D weight, never), and only on the paths that list its type as repacked
# (isa.PATHS: Q2_K on AVX-512 alone): the others take its vec_dot, which is Q8_0's on the same values; so with
# Q4_K and Q2_K, whose others take its vec_dot and tiled kernels (k_product), and IQ4_NL, whose others take its
# vec_dot for one activation row and tinyBLAS from two (lut4.iq4_nl_unrepacked)
_IQ4_NL_MUL_MAT = iq4_nl_unrepacked(tiny_blas=True)
_UNREPACKED: dict[T, _Kind] = {
    T.Q4_0: _Kind(np.uint8, "q8_0", 2, 16, repack_q4_0, _Q8, _Q8, _DEQ_Q4_0, pack_q4_0_as_q8_0, True),
    T.Q4_K: _Kind(np.uint8, "q8_K", 2, 32, repack_q4_k, _Q4_K, _Q4_K, dequantizer(row_q4_k), pack_q4_k_values),
    T.Q2_K: _Kind(np.uint8, "q8_K", 1, 1, pack_q2_k, _Q2_K, _Q2_K, _DEQ_Q2_K, pack_q2_k),
    T.IQ4_NL: _Kind(np.uint8, "q8_0", 2, 16, repack_iq4_nl, _IQ4_NL_MUL_MAT, _IQ4_NL_MUL_MAT, _DEQ_LUT4,
                    pack_iq4_nl_as_q8_0)}
# where an expert's rows are not repacked, mul_mat_id takes the vec_dot for every activation row (never tinyBLAS)
_IQ4_NL_MUL_MAT_ID = iq4_nl_unrepacked(tiny_blas=False)
_UNREPACKED_EXPERT: dict[T, _Kind] = {
    T.IQ4_NL: _Kind(np.uint8, "q8_0", 2, 16, repack_iq4_nl, _IQ4_NL_MUL_MAT_ID, _IQ4_NL_MUL_MAT_ID, _DEQ_LUT4,
                    pack_iq4_nl_as_q8_0)}
# the kernels whose order differs in a build that splits FMA chains (isa.IsaPath.split_chains), in their place there
_SPLIT_CHAINS: dict[Callable, Callable] = {_IQ4_NL_MUL_MAT: iq4_nl_unrepacked(tiny_blas=True, split=True),
                                          _IQ4_NL_MUL_MAT_ID: iq4_nl_unrepacked(tiny_blas=False, split=True)}

# an expert's rows of a repacked kind, which llama.cpp's mul_mat_id multiplies one activation row at a time
_EXPERT: dict[T, _Kind] = {
    T.Q4_K: _Kind(np.uint8, "q8_K", 2, 32, repack_q4_k, q4_k_x8(False), q4_k_x8(False), dequantizer(row_q4_k),
                  pack_q4_k),
    T.Q2_K: _Kind(np.uint8, "q8_K", 1, 1, pack_q2_k, q2_k_x8(False), q2_k_x8(False), _DEQ_Q2_K, pack_q2_k)}


# what a QWeight's rows are, for the order llama.cpp multiplies them in: a 2-D weight of mul_mat ("matrix"), one
# expert's rows of a mul_mat_id stack ("expert"), one matrix of a 3-D weight of mul_mat ("stack": MLA's per-head
# k_b and v_b, which ggml's repacking leaves alone)
USES = ("matrix", "expert", "stack")


def _kind_of(qtype: T, rows: int, use: str, path: IsaPath) -> _Kind:
    """The kind of a weight's rows: the repacked one where llama.cpp on the numerics path ``path`` repacks them,
    with the split chains' kernels where its build splits them."""
    if qtype in _UNREPACKED and (rows % 8 or use == "stack" or qtype.name not in path.repacked):
        kind = _UNREPACKED_EXPERT.get(qtype, _UNREPACKED[qtype]) if use == "expert" else _UNREPACKED[qtype]
    else:
        kind = _EXPERT[qtype] if use == "expert" and qtype in _EXPERT else _TYPES[qtype]
    split = _SPLIT_CHAINS.get(kind.gemv) if path.split_chains else None
    return kind if split is None else replace(kind, gemv=split, gemm=split)

_perm_cache: dict[tuple[int, int, int], np.ndarray] = {}


def _inverse_perm(parts: int, run: int, k: int) -> np.ndarray:
    """Index in the (parts, k/parts) stream layout of each natural activation element (identity if parts=1)."""
    key = (parts, run, k)
    inv = _perm_cache.get(key)
    if inv is None:
        g, w = np.divmod(np.arange(k), parts * run)
        inv = _perm_cache[key] = (w // run) * (k // parts) + g * run + w % run
    return inv



def _storage(a: np.ndarray) -> np.ndarray:
    """The array whose memory ``a`` views (a layout's parts may be views of one array: Q4_K's bytes and words)."""
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a

class QWeight:
    """A weight matrix (rows, ne0) in its GGUF storage type, ready for x @ W.T and row lookups."""

    # __weakref__: what is derived from a weight (an expert's slice of a stacked one) lives as long as it does
    __slots__ = ("raw", "qtype", "rows", "ne0", "path", "_kind", "_inv", "_packed", "_lock", "__weakref__")

    def __init__(self, raw: np.ndarray, qtype: T, ne0: int, use: str = "matrix", path: IsaPath | None = None):
        """``use``: what the rows are (USES), where llama.cpp's order depends on it; ``path``: the numerics path
        whose llama.cpp order to take where the paths differ (which types it repacks; default: GRAPHIR_ISA, else
        the host's)."""
        if use not in USES:
            raise ValueError(f"use must be one of {USES}, got {use!r}")
        self.raw, self.qtype, self.ne0, self.rows = raw, T(qtype), int(ne0), int(raw.shape[0])
        self.path = numerics().path if path is None else path
        self._kind = _kind_of(self.qtype, self.rows, use, self.path)
        self._inv = _inverse_perm(self._kind.parts, self._kind.run, self.ne0)
        self._packed: tuple[np.ndarray, ...] | None = None
        self._lock = threading.Lock()

    @staticmethod
    def prepare(raw: np.ndarray, qtype: gguf.GGMLQuantizationType, ne0: int, path: IsaPath | None = None) -> "QWeight":
        """Wrap raw GGUF tensor data (no copy; the repack happens on first use)."""
        qtype = T(qtype)
        if qtype not in _TYPES:
            raise NotImplementedError(f"weight type {qtype.name} is not supported ({sorted(t.name for t in _TYPES)})")
        block, tsize = gguf.GGML_QUANT_SIZES[qtype]
        want = np.dtype(_TYPES[qtype].dtype)
        raw = np.asarray(raw)                                  # a memmap becomes a plain ndarray view
        if raw.ndim == 2 and raw.flags.c_contiguous and (raw.dtype == np.uint8 or raw.dtype == np.float16) \
                and raw.dtype != want:
            raw = raw.view(want)                               # bytes or float16 -> what the kernels read
        width = ne0 // block * tsize // want.itemsize
        if raw.ndim != 2 or ne0 % block or raw.shape[1] != width or raw.dtype != want or not raw.flags.c_contiguous:
            raise ValueError(f"{qtype.name} weight with ne0={ne0} must be C-contiguous {want.name} (rows, {width}) "
                             f"or its bytes; got {raw.dtype} {raw.shape}")
        return QWeight(raw, qtype, ne0, path=path)

    # -- storage ------------------------------------------------------------------------------------------

    def _repack(self, raw_rows: np.ndarray) -> tuple[np.ndarray, ...]:
        if self._kind.repack is None:
            return (raw_rows,)
        tsize = gguf.GGML_QUANT_SIZES[self.qtype][1]
        return self._kind.repack(raw_rows.reshape(raw_rows.shape[0], -1, tsize))

    @property
    def packed(self) -> tuple[np.ndarray, ...]:
        """The kernel layout of the whole tensor, built on first use and kept (see the package docstring)."""
        if self._packed is None:
            with self._lock:
                if self._packed is None:
                    if self._kind.pack is not None:
                        tsize = gguf.GGML_QUANT_SIZES[self.qtype][1]
                        self._packed = self._kind.pack(self.raw.reshape(self.rows, -1, tsize))
                    else:
                        self._packed = self._repack(self.raw)
                    if self._kind.repack is not None:   # a copy now serves the products
                        release_pages(self.raw)
        return self._packed

    @property
    def nbytes(self) -> int:
        """Bytes of the GGUF data."""
        return int(self.raw.nbytes)

    @property
    def packed_nbytes(self) -> int:
        """Extra memory held by the repacked copy (0 until the first matmul, and always 0 for float types)."""
        if self._packed is None or self._kind.repack is None:
            return 0
        return sum({id(root): int(root.nbytes) for root in map(_storage, self._packed)}.values())  # views once

    # -- operations ---------------------------------------------------------------------------------------

    def matmul(self, x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """x (n, ne0) float32 -> (n, rows) float32 = x @ W.T, with llama.cpp's activation rounding."""
        if x.ndim != 2 or x.shape[1] != self.ne0 or x.dtype != _F32 or not x.flags.c_contiguous:
            raise ValueError(f"x must be C-contiguous float32 (n, {self.ne0}), got {x.dtype} {x.shape}")
        n, k = x.shape[0], self._kind
        if out is None:
            out = np.empty((n, self.rows), _F32)
        elif out.shape != (n, self.rows) or out.dtype != _F32 or not out.flags.c_contiguous:
            raise ValueError(f"out must be C-contiguous float32 {(n, self.rows)}, got {out.dtype} {out.shape}")
        if k.pack is not None:                                 # exact kinds: llama.cpp's vec_dot order
            k.gemv(*self.packed, x, out)
            return out
        quantize, group = ACT[k.act]
        asum = np.empty((n, self.ne0 // group if group else 0), _F32)
        xq = np.empty((n, self.ne0), _F32)                     # quantized activation, in stream order
        quantize(x, self._inv, xq, asum)
        (k.gemv if n < GEMM_FROM else k.gemm)(*self.packed, xq, asum, out)
        return out

    def product(self) -> Callable[[np.ndarray], np.ndarray]:
        """matmul as a function of x alone, for a caller that multiplies by this weight run after run (a planned
        graph): the packed layout and the kernel looked up once; x (n, ne0) is made C-contiguous float32."""
        k, ne0, rows = self._kind, self.ne0, self.rows
        if k.pack is None:
            return lambda x: self.matmul(np.ascontiguousarray(x, dtype=_F32))
        packed, gemv = self.packed, k.gemv

        def product(x: np.ndarray) -> np.ndarray:
            x = np.ascontiguousarray(x, dtype=_F32)
            if x.ndim != 2 or x.shape[1] != ne0:
                raise ValueError(f"x must be (n, {ne0}), got {x.shape}")
            out = np.empty((x.shape[0], rows), _F32)
            gemv(*packed, x, out)
            return out

        return product

    def gemv_call(self) -> tuple[Callable, tuple[np.ndarray, ...]] | None:
        """For an exact kind (llama.cpp's vec_dot order), its GEMV and packed arrays: gemv(*packed, x, out) is
        product(x) into out. None for other kinds, which quantize x first."""
        k = self._kind
        return None if k.pack is None or self.float_rows() is not None else (k.gemv, self.packed)

    def float_rows(self) -> np.ndarray | None:
        """An f32 or f16 weight as stored (float32 / float16), which the float dot products read as it is; None
        for other types."""
        if self.qtype not in (T.F32, T.F16):
            return None
        return self.raw if self.qtype == T.F32 else self.raw.view(np.float16)

    def get_rows(self, ids: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """(len(ids), ne0) float32 rows of W, bit-equal to gguf.quants.dequantize."""
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        if ids.size and (ids.min() < 0 or ids.max() >= self.rows):
            raise IndexError(f"row ids must be in [0, {self.rows})")
        if out is None:
            out = np.empty((ids.size, self.ne0), _F32)
        elif out.shape != (ids.size, self.ne0) or out.dtype != _F32 or not out.flags.c_contiguous:
            raise ValueError(f"out must be C-contiguous float32 {(ids.size, self.ne0)}, got {out.dtype} {out.shape}")
        floats = self.float_rows()
        if floats is not None and ids.size * self.ne0 < PAR_MIN:   # a few rows (a token's embedding): numpy's
            out[...] = floats[ids]                                   # copy, without waking the worker threads
        elif self._packed is not None and self._kind.pack is None:
            self._kind.deq(*self._packed, ids, self._inv, out)
        else:                                                  # never multiplied: repack just these rows
            self._kind.deq(*self._repack(self.raw[ids]), np.arange(ids.size), self._inv, out)
        return out

    def dequantize(self) -> np.ndarray:
        """The whole (rows, ne0) float32 matrix (for tests and debugging)."""
        return self.get_rows(np.arange(self.rows))

    def __repr__(self) -> str:
        return f"QWeight({self.qtype.name}, rows={self.rows}, ne0={self.ne0})"


_libc = ctypes.CDLL(None)
_LIBC = _libc if hasattr(_libc, "madvise") and hasattr(mmap, "MADV_DONTNEED") else None  # POSIX systems


def release_pages(a: np.ndarray) -> None:
    """Let the OS drop the resident pages of a file-mapped array (a weight whose repacked copy now serves the
    products): they stay mapped, and a later read (get_rows of a tied embedding) maps them in again from the
    file, so nothing changes but the resident memory, which no longer holds the weights twice. Only pages wholly
    inside the array; nothing for an array of the process's own memory (there the pages are its only copy)."""
    base = a
    while isinstance(base, np.ndarray) and not isinstance(base, np.memmap):
        base = base.base
    if not isinstance(base, np.memmap) or _LIBC is None:
        return
    start = a.ctypes.data
    lo, hi = -(-start // mmap.PAGESIZE) * mmap.PAGESIZE, (start + a.nbytes) // mmap.PAGESIZE * mmap.PAGESIZE
    if hi > lo:
        _LIBC.madvise(ctypes.c_void_p(lo), ctypes.c_size_t(hi - lo), mmap.MADV_DONTNEED)


_MATRICES: weakref.WeakKeyDictionary[QWeight, list[QWeight]] = weakref.WeakKeyDictionary()
_MATRICES_LOCK = threading.Lock()


def _split(w: QWeight, n: int, use: str) -> list[QWeight]:
    """w's rows as n QWeights of consecutive row ranges (matrix i's rows are i * rows/n .. (i + 1) * rows/n, as
    GGUF stores a 3-D tensor), made once per weight and shared by every graph and thread that multiplies it (each
    repacks on its first use)."""
    if w.rows % n:
        raise ValueError(f"{w!r} does not split into {n} matrices")
    with _MATRICES_LOCK:
        if w not in _MATRICES:
            rows = w.rows // n
            _MATRICES[w] = [QWeight(w.raw[i * rows:(i + 1) * rows], w.qtype, w.ne0, use, w.path) for i in range(n)]
        return _MATRICES[w]


def expert_matrices(w: Any, n_expert: int) -> Sequence[Any]:
    """The n_expert matrices of a stacked weight [n_embd, n_ff, n_expert]: QWeights of a QWeight's rows (_split);
    or a float array (n_expert, n_ff, n_embd), expert e being its view [e]."""
    if isinstance(w, QWeight):
        return _split(w, n_expert, "expert")
    w = np.ascontiguousarray(w, dtype=np.float32)  # no copy of a float32 array: expert e is the view w[e]
    if w.ndim != 3 or w.shape[0] != n_expert:
        raise ValueError(f"stacked expert weights must be (n_expert={n_expert}, n_ff, n_embd), got {w.shape}")
    return w


def stack_matrices(w: QWeight, n: int) -> list[QWeight]:
    """The n matrices of a quantized 3-D weight that mul_mat multiplies matrix by matrix (MLA's per-head k_b and
    v_b, [k, m, n]): each a QWeight of its m rows, multiplied as llama.cpp multiplies a matrix it does not
    repack (x quantized to the type's activation format, its vec_dot order). A stack of one matrix is 2-D to
    ggml (ggml_n_dims), which repacks it as any matrix."""
    return _split(w, n, "stack" if n > 1 else "matrix")


class QWeightGroup:
    """Weights multiplied by the same x (attention's q, k, v; the FFN's gate and up): matmul(x) equals
    [w.matmul(x) for w in weights] bit for bit, and for weights of one kind that joins (Q4_1, Q5_1, Q8_0, Q5_0, Q4_0)
    whose row counts are whole groups of _G, is one GEMV over all their rows: x quantized once, the
    threads started once. For that the weights' packed rows are laid one after another in one array on the first
    call, and each weight's own packed layout becomes its part of it (no second copy)."""

    __slots__ = ("weights", "_kind", "_packed", "_lock")

    @staticmethod
    def joins(w: QWeight) -> bool:
        """Whether w can be one of such a group (its kind's GEMV runs on joined rows and it has whole groups)."""
        return w._kind.joins and w.rows % _G == 0

    def __init__(self, weights: tuple[QWeight, ...]):
        self.weights = tuple(weights)
        kinds = {w._kind for w in self.weights}
        ne0 = {w.ne0 for w in self.weights}
        one_kind = len(kinds) == 1 and len(ne0) == 1 and all(QWeightGroup.joins(w) for w in self.weights)
        self._kind = kinds.pop() if one_kind else None
        self._packed: tuple[np.ndarray, ...] | None = None
        self._lock = threading.Lock()

    def _joined(self) -> tuple[np.ndarray, ...]:
        if self._packed is None:
            with self._lock:
                if self._packed is None:
                    parts = [w.packed for w in self.weights]
                    joined = tuple(np.concatenate([p[i] for p in parts]) for i in range(len(parts[0])))
                    at = [0] * len(joined)
                    for w, p in zip(self.weights, parts):     # each weight's layout: its slice of the joined one
                        views = []
                        for i, a in enumerate(p):
                            views.append(joined[i][at[i]:at[i] + a.size])
                            at[i] += a.size
                        with w._lock:
                            w._packed = tuple(views)
                    self._packed = joined
        return self._packed

    def gemv_call(self) -> tuple[Callable, tuple[np.ndarray, ...], list[slice]] | None:
        """For weights of one kind that joins: the GEMV, the joined arrays and each weight's columns of its result
        (gemv(*joined, x, out) computes them all into out, one row of x). None otherwise."""
        k = self._kind
        if k is None:
            return None
        spans: list[slice] = []
        for w in self.weights:
            spans.append(slice(spans[-1].stop if spans else 0, (spans[-1].stop if spans else 0) + w.rows))
        return k.gemv, self._joined(), spans

    def product(self) -> Callable[[np.ndarray], list[np.ndarray]]:
        """matmul as a function of x alone, as QWeight.product: the joined layout and the GEMV looked up once."""
        call = self.gemv_call()
        if call is None:
            return self.matmul
        (gemv, joined, spans), ne0 = call, self.weights[0].ne0
        total = spans[-1].stop

        def product(x: np.ndarray) -> list[np.ndarray]:
            x = np.ascontiguousarray(x, dtype=_F32)
            if x.ndim != 2 or x.shape[1] != ne0 or x.shape[0] != 1:  # several rows: matmul's contiguous parts
                return self.matmul(x)
            out = np.empty((1, total), _F32)
            gemv(*joined, x, out)
            return [out[:, s] for s in spans]

        return product

    def matmul(self, x: np.ndarray) -> list[np.ndarray]:
        """x (n, ne0) float32 -> one (n, rows) float32 array per weight."""
        k = self._kind
        if k is None or x.ndim != 2 or x.dtype != _F32 \
                or x.shape[1] != self.weights[0].ne0 or not x.flags.c_contiguous:
            return [w.matmul(x) for w in self.weights]
        out = np.empty((x.shape[0], sum(w.rows for w in self.weights)), _F32)
        k.gemv(*self._joined(), x, out)
        parts, a = [], 0
        for w in self.weights:
            part = out[:, a:a + w.rows]
            parts.append(part if x.shape[0] == 1 else np.ascontiguousarray(part))
            a += w.rows
        return parts
