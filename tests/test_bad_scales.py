"""Blocks no quantizer writes: infinite and NaN scales, and values outside what the quantizer produces, computed
as llama.cpp computes them.

A file can hold them (a broken converter, a flipped bit); llama.cpp does not refuse them, it multiplies them,
and so must graphir: the same NaNs and infinities in the same places, every other number the same bits, and no
crash or hang in what follows (the NaN logits are still decoded and a token is still sampled). The tiny model
llama.cpp made and quantized (tests/test_weight_types.py's ``pure``) gets its first FFN up-projection's blocks
rewritten: a few rows with a poisoned block each, the other rows as they were, so the products of the healthy
rows are checked beside the poisoned ones in llama.cpp's own tensor (its eval callback).
"""

from __future__ import annotations

import struct
from pathlib import Path

import gguf
import numpy as np
import pytest
from conftest import oracle_is_exact
from test_weight_types import PROMPT, pure

from graphir import load
from graphir.batch import Batch

pytestmark = pytest.mark.oracle

INF, NAN = struct.pack("<e", np.inf), struct.pack("<e", np.nan)
NEG_INF = struct.pack("<e", -np.inf)
# per llama.cpp file type: the tensor type, and the poisoned rows as (byte offset in the row's first block, bytes)
POISON: dict[str, tuple[gguf.GGMLQuantizationType, list[tuple[int, bytes]]]] = {
    "F16": (gguf.GGMLQuantizationType.F16, [(0, INF), (0, NAN), (2, NEG_INF)]),
    "Q8_0": (gguf.GGMLQuantizationType.Q8_0, [(0, INF), (0, NAN), (0, NEG_INF), (2, b"\x80" * 32)]),  # q = -128
    "Q4_0": (gguf.GGMLQuantizationType.Q4_0, [(0, INF), (0, NAN), (0, NEG_INF)]),
    "Q4_1": (gguf.GGMLQuantizationType.Q4_1, [(0, INF), (0, NAN), (2, INF), (2, NAN)]),        # d, then the min
    "Q5_0": (gguf.GGMLQuantizationType.Q5_0, [(0, INF), (0, NAN), (0, NEG_INF)]),
    "Q5_1": (gguf.GGMLQuantizationType.Q5_1, [(0, INF), (0, NAN), (2, INF), (2, NAN)]),
    "Q4_K_S": (gguf.GGMLQuantizationType.Q4_K, [(0, INF), (0, NAN), (2, INF), (2, NAN),        # d, then dmin
                                                 (4, b"\xff" * 12)]),                            # every scale/min 63
    "Q5_K_S": (gguf.GGMLQuantizationType.Q5_K, [(0, INF), (0, NAN), (2, INF), (2, NAN), (4, b"\xff" * 12)]),
    "Q6_K": (gguf.GGMLQuantizationType.Q6_K, [(208, INF), (208, NAN), (192, b"\x80" * 16)]),   # d; scales -128
    "Q3_K_S": (gguf.GGMLQuantizationType.Q3_K, [(108, INF), (108, NAN), (96, b"\xff" * 12)]),  # d; scales
    "Q2_K": (gguf.GGMLQuantizationType.Q2_K, [(80, INF), (80, NAN), (82, INF), (82, NAN)]),     # d, then dmin
    "IQ4_NL": (gguf.GGMLQuantizationType.IQ4_NL, [(0, INF), (0, NAN), (0, NEG_INF)]),
    "IQ4_XS": (gguf.GGMLQuantizationType.IQ4_XS, [(0, INF), (0, NAN), (2, b"\xff" * 6)]),      # d; scales 31
    "IQ2_XXS": (gguf.GGMLQuantizationType.IQ2_XXS, [(0, INF), (0, NAN), (0, NEG_INF),
                                                    (2, b"\xff" * 8)]),       # d; grid row 255, signs -, scale 31
    "IQ2_XS": (gguf.GGMLQuantizationType.IQ2_XS, [(0, INF), (0, NAN), (0, NEG_INF), (66, b"\xff" * 8)]),  # d; scales 31
    "IQ2_M": (gguf.GGMLQuantizationType.IQ2_S, [(0, INF), (0, NAN), (0, NEG_INF), (74, b"\xff" * 8)]),    # d; scales 31
    # d; every scale 15, delta -1/8 and high index bits 7
    "IQ1_S": (gguf.GGMLQuantizationType.IQ1_S, [(0, INF), (0, NAN), (0, NEG_INF), (34, b"\xff" * 16)]),
    # its f16 d is the top nibbles of the four scale words (their scales 0 here): inf, NaN, -inf
    "IQ1_M": (gguf.GGMLQuantizationType.IQ1_M, [(48, struct.pack("<4H", 0, 0, 0xC000, 0x7000)),
                                                 (48, struct.pack("<4H", 0, 0, 0xE000, 0x7000)),
                                                 (48, struct.pack("<4H", 0, 0, 0xC000, 0xF000))]),
    # d, then bytes no quantizer writes (TQ1_0's 1, which its base-3 encoding skips; TQ2_0's 2-bit 3s)
    "TQ1_0": (gguf.GGMLQuantizationType.TQ1_0, [(52, INF), (52, NAN), (52, NEG_INF), (0, b"\x01" * 48)]),
    "TQ2_0": (gguf.GGMLQuantizationType.TQ2_0, [(64, INF), (64, NAN), (0, b"\xff" * 64)]),
}
POISON["IQ3_S"] = (gguf.GGMLQuantizationType.IQ3_S, [(0, INF), (0, NAN), (0, NEG_INF),
                                                  (106, b"\xff" * 4)])        # d; scales 31
POISON["IQ3_XXS"] = (gguf.GGMLQuantizationType.IQ3_XXS, [(0, INF), (0, NAN), (0, NEG_INF),
                                                      (66, b"\xff" * 32)])    # d; every sign set, scales 31
ROWS_APART = 7  # poisoned rows 0, 7, 14, ...: several of the kernels' row groups, healthy rows between them


def poisoned(ftype: str) -> Path:
    """``pure("dense", ftype)`` with blk.0.ffn_up's rows 0, 7, 14, ... each given one of POISON's bytes."""
    src = pure("dense", ftype)
    dst = src.with_name(f"{ftype}-poisoned.gguf")
    if not dst.exists():
        qtype, edits = POISON[ftype]
        tensor = next(t for t in gguf.GGUFReader(src).tensors if t.name == "blk.0.ffn_up.weight")
        assert tensor.tensor_type == qtype
        row_bytes = tensor.n_bytes // int(tensor.shape[1])
        data = bytearray(src.read_bytes())
        for i, (at, value) in enumerate(edits):
            start = tensor.data_offset + i * ROWS_APART * row_bytes + at
            data[start:start + len(value)] = value
        dst.write_bytes(bytes(data))
    return dst


def assert_same_floats(ours: np.ndarray, ref: np.ndarray, what: str) -> None:
    """NaN where llama.cpp has NaN (in the rows it computed: a layer's last part runs for the output token only);
    every other value (infinities included) the same bits, or on a host whose
    path graphir only approximates, the same infinities and finite values within 1e-4 relative."""
    ours = np.asarray(ours, np.float32).reshape(-1, ref.shape[-1])[-(ref.size // ref.shape[-1]):].reshape(ref.shape)
    nan = np.isnan(ref)
    assert np.array_equal(np.isnan(ours), nan), f"{what}: NaN at {np.argwhere(np.isnan(ours) != nan)[:4].tolist()}"
    if oracle_is_exact():
        assert np.array_equal(ours[~nan].view(np.uint32), ref[~nan].view(np.uint32)), \
            f"{what}: max |d| {np.nanmax(np.abs(ours - ref)):.3g}"
    else:
        np.testing.assert_allclose(ours[~nan], ref[~nan], rtol=1e-4, atol=1e-4, err_msg=what)


@pytest.mark.parametrize("ftype", list(POISON))
def test_inf_and_nan_scales_give_llama_cpps_numbers(ftype: str) -> None:
    from llama_taps import llama_cpp_taps

    path = poisoned(ftype)
    theirs = llama_cpp_taps(str(path), PROMPT)
    up = theirs["ffn_up-0"]
    rows = np.arange(len(POISON[ftype][1])) * ROWS_APART
    assert not np.isfinite(up[..., rows]).all() and np.isfinite(np.delete(up, rows, axis=-1)).all(), \
        "the poison must reach llama.cpp's product, and only in its rows"
    ctx, taps = load(str(path)).new_context(n_ctx=64), {}
    ctx.decode(Batch.from_tokens(PROMPT, 0), taps=taps)   # the last token's logits, as llama.cpp's taps decode
    for ours, ref in (("blk.0.ffn_up", "ffn_up-0"), ("blk.0.l_out", "l_out-0"), ("blk.1.l_out", "l_out-1"),
                      ("result_output", "result_output")):
        assert_same_floats(taps[ours], theirs[ref], ref)
    token = int(np.argmax(ctx.logits_ith(-1)))   # NaN logits: a token is still chosen, and decoded
    ctx.decode(Batch.one(token, len(PROMPT)))
    assert ctx.logits_ith(-1).shape == (theirs["result_output"].shape[-1],)


def test_an_infinite_activation_quantizes_to_q8_k_as_llama_cpp_does() -> None:
    """quantize_row_q8_K_ref on a row whose largest value is +inf: iscale = -127 / inf = -0, so d = 1 / -0 = -inf
    (C's division, no error), every finite value's quant 0 and the infinity's nearest_int(NaN) 0; the repacked
    GEMM's quantizer (ggml_quantize_mat_q8_K_4x8) takes the same maximum, positive: scale -0, d -inf, its
    NaN quant converted and saturated to -128."""
    from graphir.backends.numba.quant.kquant import q8_k_fours, q8_k_rows

    x = np.linspace(-1.0, 1.0, 256, dtype=np.float32).reshape(1, 256)
    x[0, 17] = np.inf
    y, yd, ysum = np.empty((1, 256), np.int8), np.empty((1, 1), np.float32), np.empty((1, 16), np.int32)
    q8_k_rows(x, y, yd, ysum)
    assert yd[0, 0] == -np.inf and not y.any() and not ysum.any()
    q8_k_fours(x, y, yd, ysum, 1)
    assert yd[0, 0] == -np.inf and y[0, 17] == -128 and np.count_nonzero(y) == 1 and ysum[0, 1] == -128
