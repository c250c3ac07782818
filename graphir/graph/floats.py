"""Float32 rounding as ggml and GGUF do it: graph attributes, hparams and attention scales are float32 values,
so every layer that writes one rounds it the same way (a leaf: it imports nothing of graphir)."""

from __future__ import annotations

import math
import struct


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
