"""Every weight type graphir multiplies, on files llama.cpp's own quantizer wrote: llama.cpp's logits and tokens.

A tiny F32 model made by llama.cpp (tests/llama_made.py) goes through ``llama_model_quantize`` with ``pure`` set,
so every matrix, the token embeddings (row lookups) and the LM head are of the one type under test, in the bytes
llama.cpp writes. Both engines then read the same prompt: the logits at every position and at each of eight
greedy steps must be llama.cpp's bit for bit on the host's path (README, Numerics), and so the tokens. The MoE
model puts the type into expert matrices (mul_mat_id) too.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from conftest import assert_llama_logits, process_folder
from test_families import LlamaCpp

import llama_made
from graphir import load
from graphir.batch import Batch

PROMPT = [1, 5, 9, 17, 33, 65, 3, 7, 11, 13, 2, 4]
# the types whose products graphir sums in llama.cpp's order on every path (the README's Numerics table)
# (llama.cpp's IQ2_M file type holds IQ2_S matrices; its IQ2_S file type, IQ2_XS ones)
EXACT = ("F16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K_S", "Q4_K_S", "Q5_K_S", "Q6_K", "IQ4_NL", "IQ4_XS",
         "IQ3_S", "IQ3_XXS", "IQ2_XXS", "IQ2_XS", "IQ2_M", "IQ1_S", "IQ1_M", "TQ1_0", "TQ2_0")
MODELS = {"dense": ("llama", False), "experts": ("qwen3moe", True)}
_FILES: dict[tuple[str, str], Path] = {}


def pure(model: str, ftype: str) -> Path:
    """The tiny ``model`` with every weight matrix of llama.cpp's file type ``ftype`` (made once per process)."""
    if (model, ftype) not in _FILES:
        folder = process_folder(f"weight-types-{model}-{ftype}-")
        arch, moe = MODELS[model]
        src = _FILES.get((model, "F32")) or llama_made.make(folder / "F32.gguf", arch, moe=moe)
        _FILES[model, "F32"] = src
        _FILES[model, ftype] = llama_made.quantize(src, folder / f"{ftype}.gguf", ftype, pure=True)
    return _FILES[model, ftype]


@pytest.mark.oracle
@pytest.mark.parametrize("model", list(MODELS))
@pytest.mark.parametrize("ftype", EXACT)
def test_a_file_of_one_weight_type_gives_llama_cpps_logits_and_tokens(ftype: str, model: str) -> None:
    path = pure(model, ftype)
    ctx, o = load(str(path)).new_context(n_ctx=64), LlamaCpp(path, n_ctx=64)
    try:
        ctx.decode(Batch.from_tokens(PROMPT, 0, outputs="all"))
        o.decode(PROMPT, range(len(PROMPT)), [0] * len(PROMPT))
        assert_llama_logits(ctx.logits(), np.stack([o.logits_ith(i) for i in range(len(PROMPT))]), "prompt logits")
        ours, theirs = [], []
        for p in range(len(PROMPT), len(PROMPT) + 8):
            ours.append(int(np.argmax(ctx.logits_ith(-1))))
            theirs.append(int(np.argmax(o.logits_ith(-1))))
            ctx.decode(Batch.one(ours[-1], p))
            o.decode([theirs[-1]], [p], [0])
            assert_llama_logits(ctx.logits_ith(-1), o.logits_ith(0), f"step {p}")
        assert ours == theirs
    finally:
        o.close()


@pytest.mark.oracle
@pytest.mark.parametrize("ftype", EXACT)
def test_the_expert_products_are_llama_cpps_node_for_node(ftype: str) -> None:
    """mul_mat_id multiplies an expert's rows one activation row at a time where a mul_mat of the same rows takes
    its four-row kernel (Q4_K: another order of the same sums); the logits rarely show the difference, so the
    experts' outputs are compared as llama.cpp's eval callback reports them."""
    from llama_taps import llama_cpp_taps

    path, taps = pure("experts", ftype), {}
    load(str(path)).new_context(n_ctx=64).decode(Batch.from_tokens(PROMPT, 0, outputs="all"), taps=taps)
    theirs = llama_cpp_taps(str(path), PROMPT)
    for name in ("ffn_moe_gate_scaled", "ffn_moe_up_scaled", "ffn_moe_out"):   # the first layer: every token
        ref = theirs[f"{name}-0"]
        assert_llama_logits(taps[f"blk.0.{name}"].reshape(ref.shape), ref, name)


@pytest.mark.oracle
def test_a_model_loaded_for_another_path_multiplies_in_that_paths_order() -> None:
    """Q2_K is repacked by llama.cpp on AVX-512 and not on AVX2: a model loaded with ``isa=`` the path this process
    does not default to gives the logits a process defaulting to that path gives (the one the other path's oracle
    holds to llama.cpp's bits), not the default path's order."""
    import subprocess
    import sys

    from graphir.backends.numba.primitives.isa import PATHS, numerics

    other = next(p for p in PATHS if p != numerics().path.name)
    path = pure("dense", "Q2_K")
    ctx = load(str(path), isa=other).new_context(n_ctx=64)
    ctx.decode(Batch.from_tokens(PROMPT, 0, outputs="all"))
    script = ("import sys, numpy as np; from graphir import load; from graphir.batch import Batch\n"
              "ctx = load(sys.argv[1]).new_context(n_ctx=64)\n"
              f"ctx.decode(Batch.from_tokens({PROMPT}, 0, outputs='all'))\n"
              "sys.stdout.buffer.write(np.ascontiguousarray(ctx.logits(), np.float32).tobytes())\n")
    run = subprocess.run([sys.executable, "-c", script, str(path)], capture_output=True, check=True,
                         env={**os.environ, "GRAPHIR_ISA": other})
    theirs = np.frombuffer(run.stdout, np.float32).reshape(len(PROMPT), -1)
    assert np.array_equal(np.asarray(ctx.logits(), np.float32).view(np.uint32), theirs.view(np.uint32))
