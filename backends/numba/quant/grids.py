"""Grid codebooks: the IQ types whose weights are rows of a fixed grid picked by an index, each value signed.

IQ2_XXS, IQ2_XS and IQ2_S store, per group of 8 weights, the index of one row of their grid (256, 512 or 1024
rows of 8 values from {8, 25, 43}) and 8 sign bits; IQ2_XXS and IQ2_XS spend 7 bits on the signs and take the
8th as the one that makes the count of minus signs even (llama.cpp's ksigns_iq2xs), IQ2_S stores all 8. A
4-bit scale s per 16 (IQ2_XXS: per 32) weights enters as the odd integer 2s + 1, and d * (2s + 1) / 8 is the
weight's scale (gguf's d * (0.5 + s) / 4, the same float: both factors of two are exact).

The grids are gguf's (gguf.quants.<TYPE>.grid_hex decoded through its grid_map), the sign table is derived;
the unpackers below turn raw blocks into the signed values in element order, the scales 2s + 1 per 16
elements and d: the fields quant.kquant's products and quant.blocks' row dequantizer read.
"""

from __future__ import annotations

import functools

import gguf
import numpy as np

__all__ = ["even_signs", "grid", "iq2_s_fields", "iq2_xs_fields", "iq2_xxs_fields", "signed_values"]

T = gguf.GGMLQuantizationType


@functools.cache
def grid(qtype: T) -> np.ndarray:
    """gguf's grid of ``qtype`` as int8 (rows, values a row)."""
    cls = getattr(gguf.quants, T(qtype).name)
    cls.init_grid()
    return np.asarray(cls.grid).reshape(cls.grid_shape).astype(np.int8)


def even_signs(bits7: np.ndarray) -> np.ndarray:
    """7 sign bits -> the sign byte whose 8th bit makes the number of set bits even (ksigns_iq2xs)."""
    bits7 = np.asarray(bits7).astype(np.uint8)
    parity = np.unpackbits(bits7[..., None], axis=-1).sum(-1, dtype=np.uint8) & 1
    return bits7 | parity << 7


def signed_values(table: np.ndarray, index: np.ndarray, signs: np.ndarray) -> np.ndarray:
    """Rows ``index`` (..., g) of a grid of 8 values a row, each negated where its bit in the sign byte of its
    group (..., g) is set (bit e: value e) -> (..., 8g) int8 in element order."""
    v = table[index]                                                   # (..., g, 8)
    negative = (signs[..., None] >> np.arange(8, dtype=np.uint8)) & 1
    return np.where(negative == 1, -v, v).reshape(*index.shape[:-1], -1)


def _d(b: np.ndarray) -> np.ndarray:
    """The f16 d at the start of every block, as float32 (rows, nb)."""
    return np.ascontiguousarray(b[:, :, 0:2]).view(np.float16)[..., 0].astype(np.float32)


def _odd(nibbles: np.ndarray) -> np.ndarray:
    return (2 * nibbles.astype(np.int16) + 1).astype(np.int8)


def _nibble_scales(sc: np.ndarray) -> np.ndarray:
    """Scale bytes (rows, nb, 8), the low nibble for the first 16 weights of 32, the high one for the next 16
    -> 2s + 1 per 16 (rows, nb, 16) int8."""
    return _odd(np.stack([sc & 15, sc >> 4], axis=-1).reshape(*sc.shape[:2], 16))


def iq2_xxs_fields(b: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """IQ2_XXS blocks (rows, nb, 66: f16 d, then per 32 weights 4 index bytes and a word of four 7-bit sign
    groups and the 4-bit scale on top) -> the values (rows, nb * 256) int8, the scales 2s + 1 per 16 (rows, nb,
    16) int8 (each of the 32's twice) and d (rows, nb) float32."""
    rows, nb = b.shape[:2]
    words = np.ascontiguousarray(b[:, :, 2:66]).view(np.uint32).reshape(rows, nb, 8, 2)
    index = b[:, :, 2:66].reshape(rows, nb, 8, 8)[..., :4]
    signs = even_signs(words[..., 1:2] >> np.array([0, 7, 14, 21], np.uint32) & 127)
    values = signed_values(grid(T.IQ2_XXS), index, signs)
    return values.reshape(rows, -1), np.repeat(_odd(words[..., 1] >> 28), 2, axis=-1), _d(b)


def iq2_xs_fields(b: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """IQ2_XS blocks (rows, nb, 74: f16 d, 32 words of a 9-bit index and 7 sign bits, 8 scale bytes) -> as
    iq2_xxs_fields."""
    rows, nb = b.shape[:2]
    q = np.ascontiguousarray(b[:, :, 2:66]).view(np.uint16)
    values = signed_values(grid(T.IQ2_XS), q & 511, even_signs(q >> 9))
    return values.reshape(rows, -1), _nibble_scales(b[:, :, 66:74]), _d(b)


def iq2_s_fields(b: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """IQ2_S blocks (rows, nb, 82: f16 d, 32 low index bytes, 32 sign bytes, 8 bytes of the indices' two high
    bits (bits 2l, 2l + 1 of byte j for group l of weights 32j ..), 8 scale bytes) -> as iq2_xxs_fields."""
    rows, nb = b.shape[:2]
    high = b[:, :, 66:74, None] >> np.array([0, 2, 4, 6], np.uint8) & 3          # (rows, nb, 8, 4)
    index = b[:, :, 2:34].astype(np.uint16) | high.reshape(rows, nb, 32).astype(np.uint16) << 8
    values = signed_values(grid(T.IQ2_S), index, b[:, :, 34:66])
    return values.reshape(rows, -1), _nibble_scales(b[:, :, 74:82]), _d(b)
