"""The released real models re-quantized by llama.cpp's own quantizer to the types people download: llama.cpp's
logits and greedy tokens, bit for bit.

SmolLM2-135M (Q4_1) and Gemma-3-270M (Q4_K_M) go through ``llama_model_quantize`` with ``allow_requantize`` (as
``llama-quantize --allow-requantize`` does) to each file type below; where a matrix's rows are not a multiple of
a K-quant's 256 (SmolLM2's 576, Gemma's 640 columns) llama.cpp itself falls back to Q5_0, Q5_1 or Q8_0, so every
file mixes several types, as the released ones do. Both engines read the same prompt and take llama.cpp's greedy
tokens: every step's logits must be llama.cpp's (on the oracle's own path; README, Numerics).
"""

from __future__ import annotations

import functools
import hashlib
import os
from pathlib import Path

import pytest
from conftest import assert_llama_logits
from oracle_build import cache_root
from test_families import greedy_against_llama_cpp

import llama_made

from graphir import load

FTYPES = ("Q4_K_M", "Q5_K_M", "Q6_K", "Q3_K_M", "Q2_K")
PROMPT, STEPS = "The capital of France is", 12
_FILES: dict[tuple[str, str], Path] = {}


@pytest.fixture(scope="module")
def sources(smollm2_gguf: Path, gemma3_gguf: Path) -> dict[str, Path]:
    return {"smollm2": smollm2_gguf, "gemma3": gemma3_gguf}


def requantized(src: Path, name: str, ftype: str) -> Path:
    """``src`` re-quantized to ``ftype`` by llama.cpp, made once and kept beside the oracle builds under a key of
    the source's bytes, the type and llama.cpp's version: the AVX2 re-run (tests/test_numerics.py) and later runs
    take the same file, where llama.cpp's IQ4 quantizer alone spent three minutes a process on these two models."""
    if (name, ftype) not in _FILES:
        import llama_cpp

        folder = cache_root().parent / "requantized"
        folder.mkdir(parents=True, exist_ok=True)
        dst = folder / f"{name}-{_digest(src)[:16]}-{ftype}-llama-cpp-{llama_cpp.__version__}.gguf"
        if not dst.exists():
            part = llama_made.quantize(src, dst.with_suffix(f".{os.getpid()}.part"), ftype, allow_requantize=True)
            os.replace(part, dst)                       # whole or absent, whoever made it
        _FILES[name, ftype] = dst
    return _FILES[name, ftype]


@functools.cache
def _digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 24):
            h.update(chunk)
    return h.hexdigest()


@pytest.mark.oracle
@pytest.mark.parametrize("ftype", FTYPES)
@pytest.mark.parametrize("name", ["smollm2", "gemma3"])
def test_a_requantized_real_model_gives_llama_cpps_logits_and_tokens(sources: dict[str, Path], name: str,
                                                                       ftype: str) -> None:
    path = requantized(sources[name], name, ftype)
    model = load(str(path))
    ours, theirs = greedy_against_llama_cpp(model, path, model.tokenize(PROMPT, parse_special=True), STEPS,
                                            assert_llama_logits)
    assert ours == theirs
