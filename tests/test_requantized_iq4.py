"""The released real models re-quantized by llama.cpp to its IQ4 file types: llama.cpp's logits and greedy tokens,
bit for bit.

As tests/test_requantized.py (whose quantizer and models it takes), for LLAMA_FTYPE_MOSTLY_IQ4_NL and _IQ4_XS,
which need no importance matrix. An IQ4_NL matrix whose rows come in eights (every one of these models') is
multiplied by llama.cpp's repacked 8x8 kernels; IQ4_XS by its vec_dot below 8 activation rows and its tiled
kernels from 8, so one prompt is short (the vec_dot) and one long (the tiled kernels); where a matrix's 576
(SmolLM2) or 640 (Gemma) columns are not a multiple of IQ4_XS's 256, llama.cpp falls back to IQ4_NL, and the
first layers' ffn_down and Gemma's attn_v take Q5_K (its 640 columns: Q5_1), as llama.cpp's quantizer chooses.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import pytest
from conftest import assert_llama_logits
from test_families import greedy_against_llama_cpp
from test_requantized import requantized, sources  # noqa: F401 (the models, a fixture)

from graphir import load

T = gguf.GGMLQuantizationType
PROMPTS = {"short": "The capital of France is",
           "long": "The capital of France is Paris, the capital of Italy is Rome, and the capital of Spain is"}
STEPS = 12


@pytest.mark.oracle
@pytest.mark.parametrize("prompt", PROMPTS)
@pytest.mark.parametrize("ftype", ["IQ4_NL", "IQ4_XS"])
@pytest.mark.parametrize("name", ["smollm2", "gemma3"])
def test_an_iq4_requantized_real_model_gives_llama_cpps_logits_and_tokens(sources: dict[str, Path], name: str,
                                                                           ftype: str, prompt: str) -> None:
    path = requantized(sources[name], name, ftype)
    types = {t.tensor_type for t in gguf.GGUFReader(path).tensors}
    assert T.IQ4_NL in types and (T.IQ4_XS in types) == (ftype == "IQ4_XS")
    model = load(str(path))
    tokens = model.tokenize(PROMPTS[prompt], parse_special=True)
    assert (len(tokens) >= 8) == (prompt == "long")
    ours, theirs = greedy_against_llama_cpp(model, path, tokens, STEPS, assert_llama_logits)
    assert ours == theirs
