"""The grid codebooks of llama.cpp's i-quants, and grid-coded values unpacked to the signed values ggml multiplies.

The grid types (IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S) store no values: per group of 4 (or 8)
elements an index into a fixed table of value vectors, the type's grid, and per element a sign bit, either as a
plain bit (IQ2_S, IQ3_S) or, for each group of eight elements, seven bits whose eighth is their parity (ggml's
ksigns_iq2xs; IQ2_XXS, IQ2_XS, IQ3_XXS); IQ1's grid holds -1, 0 and 1 and a delta stands for the sign. Every ggml
kernel turns a group into its signed bytes before any arithmetic (the vec_dot signs the activation instead, the
same products), so graphir keeps a block's values as int8 in element order (quant.blocks' *_fields) and
multiplies them as it multiplies IQ4_XS's (quant.kquant). The tables are gguf's (its classes' grid_hex /
grid_map and IQ2_XXS.ksigns), the ones gguf.quants.dequantize reads.
"""

from __future__ import annotations

import functools

import gguf
import numpy as np

__all__ = ["bits", "grid", "parity_signs", "signed_values"]

_KSIGNS = np.frombuffer(gguf.quants.IQ2_XXS.ksigns, np.uint8)   # seven sign bits -> the byte with their parity


@functools.cache
def grid(qtype: gguf.GGMLQuantizationType) -> np.ndarray:
    """The grid of ``qtype`` as gguf decodes it: (entries, values an entry) int8."""
    cls = getattr(gguf.quants, gguf.GGMLQuantizationType(qtype).name)
    cls.init_grid()
    table = cls.grid.reshape(cls.grid_shape).astype(np.int8)
    table.flags.writeable = False                           # shared by every caller
    return table


def bits(b: np.ndarray) -> np.ndarray:
    """Bytes (..., n) -> their bits (..., 8n) as 0 / 1 bytes, each byte's least significant first."""
    return np.unpackbits(np.ascontiguousarray(b, np.uint8)[..., None], axis=-1, bitorder="little").reshape(
        *b.shape[:-1], 8 * b.shape[-1])


def parity_signs(seven: np.ndarray) -> np.ndarray:
    """Groups' seven sign bits (any unsigned integer array; bits above the seventh ignored) -> their eight sign
    bits as bytes: the eighth set where the seven hold an odd count (ksigns_iq2xs)."""
    return _KSIGNS[np.asarray(seven) & 127]


def signed_values(qtype: gguf.GGMLQuantizationType, index: np.ndarray, signs: np.ndarray) -> np.ndarray:
    """Grid indices (..., g) and sign bytes (..., g * width / 8: bit j of byte k for element 8k + j) -> the values
    (..., g * width) int8: the indexed grid entries one after another, each value negated where its bit is set."""
    g = grid(qtype)[np.asarray(index, np.intp)].reshape(*index.shape[:-1], -1)
    return np.where(bits(signs).astype(bool), -g, g).astype(np.int8)
