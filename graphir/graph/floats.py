"""Float32 rounding as ggml and GGUF do it: graph attributes, hparams and attention scales are float32 values,
so every layer that writes one rounds it the same way (a leaf: it imports nothing of graphir)."""

from __future__ import annotations

import ctypes
import ctypes.util
import math
import struct

_LIBM = ctypes.CDLL(ctypes.util.find_library("m") or "libm.so.6")
for _f, _n in (("expf", 1), ("logf", 1), ("log2f", 1), ("powf", 2), ("sinf", 1), ("cosf", 1)):
    getattr(_LIBM, _f).restype, getattr(_LIBM, _f).argtypes = ctypes.c_float, [ctypes.c_float] * _n


def powf(x: float, y: float) -> float:
    """glibc's float32 ``powf`` (a constant llama.cpp computes with it: the same bits)."""
    return float(_LIBM.powf(f32(x), f32(y)))


def sinf(x: float) -> float:
    """glibc's float32 ``sinf`` of x rounded to a float (mtmd's audio tables)."""
    return float(_LIBM.sinf(f32(x)))


def cosf(x: float) -> float:
    """glibc's float32 ``cosf`` of x rounded to a float."""
    return float(_LIBM.cosf(f32(x)))


def log2f(x: float) -> float:
    """glibc's float32 ``log2f``."""
    return float(_LIBM.log2f(f32(x)))


def f32(x: float) -> float:
    """Round to the nearest float32, as GGUF and ggml store it (beyond float32's range: infinity, as C's cast)."""
    try:
        return struct.unpack("<f", struct.pack("<f", x))[0]
    except OverflowError:  # a FLOAT64 key holding 1e300
        return math.copysign(math.inf, x)


def inv_sqrt(x: float) -> float:
    """``1.0f / sqrtf(x)`` as llama.cpp computes attention scales: both steps rounded to float32 (1/sqrt in
    double rounds differently, e.g. for 24 and 96)."""
    return f32(1.0 / f32(math.sqrt(f32(float(x)))))


def softplus(x: float) -> float:
    """``ggml_compute_softplus_f32`` as ggml computes an op's constants: x above 20, else logf(1 + expf(x)),
    glibc's float32 functions (Python's double log and exp round differently)."""
    x = f32(x)
    return x if x > 20.0 else f32(_LIBM.logf(f32(1.0 + f32(_LIBM.expf(x)))))
