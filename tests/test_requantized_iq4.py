"""Models re-quantized by llama.cpp to its IQ4 file types: llama.cpp's logits and greedy tokens, bit for bit.

As tests/test_requantized.py (whose quantizer and models it takes), for LLAMA_FTYPE_MOSTLY_IQ4_NL and _IQ4_XS,
which need no importance matrix. An IQ4_NL matrix whose rows come in eights (every one of these models') is
multiplied by llama.cpp's repacked 8x8 kernels; IQ4_XS by its vec_dot below 8 activation rows and its tiled
kernels from 8, so the prompt is long (the tiled kernels) and each greedy step one row (the vec_dot); where a
matrix's 576 (SmolLM2) or 640 (Gemma) columns are not a multiple of IQ4_XS's 256, llama.cpp falls back to IQ4_NL, and the
first layers' ffn_down and Gemma's attn_v take Q5_K (its 640 columns: Q5_1), as llama.cpp's quantizer chooses.
The matrices llama.cpp does not repack come from its own tiny models (tests/llama_made.py), every matrix IQ4_NL.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import pytest
from conftest import assert_llama_logits, process_folder
from test_families import greedy_against_llama_cpp
from test_requantized import requantized, sources  # noqa: F401 (the models, a fixture)

import llama_made
from graphir import load

T = gguf.GGMLQuantizationType
PROMPT = "The capital of France is Paris, the capital of Italy is Rome, and the capital of Spain is"
STEPS = 12


@pytest.mark.oracle
@pytest.mark.parametrize("ftype", ["IQ4_NL", "IQ4_XS"])
@pytest.mark.parametrize("name", ["smollm2", "gemma3"])
def test_an_iq4_requantized_real_model_gives_llama_cpps_logits_and_tokens(sources: dict[str, Path], name: str,
                                                                           ftype: str) -> None:
    path = requantized(sources[name], name, ftype)
    types = {t.tensor_type for t in gguf.GGUFReader(path).tensors}
    assert T.IQ4_NL in types and (T.IQ4_XS in types) == (ftype == "IQ4_XS")
    model = load(str(path))
    tokens = model.tokenize(PROMPT, parse_special=True)
    assert len(tokens) >= 8
    ours, theirs = greedy_against_llama_cpp(model, path, tokens, STEPS, assert_llama_logits)
    assert ours == theirs


# llama.cpp's tiny models with IQ4_NL matrices it does not repack: a dense Llama of 224 columns (seven blocks a row,
# an odd last one) and 124 tokens (an LM head whose rows are not in eights: the vec_dot for one row, tinyBLAS for
# the prompt); a Qwen3-MoE whose experts have 100 rows (mul_mat_id: the vec_dot for every row; their down matrices,
# 100 columns, fall back to F16)
TINY = {"dense": ("llama", False, dict(n_embd=224, n_vocab=124)), "experts": ("qwen3moe", True, dict(n_ff=100))}
TINY_PROMPT = [1, 5, 9, 17, 33, 65, 3, 7, 11, 13, 2, 4]


@pytest.mark.oracle
@pytest.mark.parametrize("model", TINY)
def test_iq4_nl_rows_llama_cpp_does_not_repack_give_its_logits_and_tokens(model: str) -> None:
    arch, moe, sizes = TINY[model]
    folder = process_folder(f"iq4-nl-{model}-")
    path = llama_made.quantize(llama_made.make(folder / "F32.gguf", arch, moe=moe, **sizes), folder / "IQ4_NL.gguf",
                               "IQ4_NL", pure=True)
    tensors = {t.name: t for t in gguf.GGUFReader(path).tensors}
    unrepacked = "output.weight" if model == "dense" else "blk.0.ffn_up_exps.weight"
    assert tensors[unrepacked].tensor_type == T.IQ4_NL and tensors[unrepacked].shape[1] % 8
    ours, theirs = greedy_against_llama_cpp(load(str(path)), path, TINY_PROMPT, 8, assert_llama_logits)
    assert ours == theirs
