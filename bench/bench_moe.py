"""Benchmark: a mixture-of-experts layer at Qwen3-30B-A3B's sizes, graphir against llama.cpp in the same run.

One qwen3moe layer (n_embd 2048, 32 query and 4 KV heads of 128, 128 experts of 768) with random F32 weights
(tests/conftest.py write_model_gguf, a 256-token vocabulary), written once per (n_expert, n_expert_used), and read whole into memory by both engines before timing (llama.cpp without mmap, graphir
reading every weight once): a prompt of 16 tokens, then 32 generated tokens, 2 threads, 5 runs taken in turn with
llama.cpp's (both engines see the same load on a shared machine); the median milliseconds per generated token
(robust to bursts of other work) for both engines and the ratio graphir / llama.cpp (<= 1: graphir is faster).
mul_mat_id multiplies only the experts a token chose, so the time should follow n_expert_used (about 3 x 768 x 2048
weights per used expert per token), not the experts the layer holds: the last two rows hold 8 and 64 experts
with 4 used each, and should take about the same time.
Then sigmoid routing with a selection bias and a shared expert: one glm4moe layer at GLM-4.5's shape scaled down
(n_embd 2048, 16 query and 2 KV heads of 128 with half of each rotated, 64 experts of 768 with 8 used, one shared
expert of 768, weights renormalised and scaled by 2.5).
Llama 4's form (``llama4:`` rows: a sigmoid router choosing by logits, each token weighted before its experts'
FFN, and a shared expert of the experts' width) is timed on four layers of the same sizes, the last a mixture, at
Llama-4-Scout's 16 experts and Maverick's 128, one used.
Run: python bench/bench_moe.py [N_EXPERT:N_USED | glm4moe | llama4:N_EXPERT:N_USED ...]
     (default: 128:1 128:2 128:4 128:8 8:4 64:4 glm4moe llama4:16:1 llama4:128:1)
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import gguf
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from conftest import make_tiny_preset, write_model_gguf  # noqa: E402

K = gguf.Keys
N_PROMPT, N_GEN, REPEAT, THREADS, VOCAB = 16, 32, 5, 2, 256
SHAPES = ("128:1", "128:2", "128:4", "128:8", "8:4", "64:4",  # qwen3moe's (n_expert:n_expert_used)
          "glm4moe", "llama4:16:1", "llama4:128:1")
LAYER = {K.LLM.EMBEDDING_LENGTH: 2048, K.LLM.BLOCK_COUNT: 1, K.LLM.FEED_FORWARD_LENGTH: 6144,
         K.Attention.HEAD_COUNT: 32, K.Attention.HEAD_COUNT_KV: 4, K.Attention.KEY_LENGTH: 128,
         K.Attention.VALUE_LENGTH: 128, K.Rope.FREQ_BASE: 1000000.0, K.Attention.LAYERNORM_RMS_EPS: 1e-6,
         K.LLM.VOCAB_SIZE: VOCAB, K.LLM.EXPERT_FEED_FORWARD_LENGTH: 768}
GLM_LAYER = {K.LLM.EMBEDDING_LENGTH: 2048, K.LLM.BLOCK_COUNT: 1, K.LLM.FEED_FORWARD_LENGTH: 6144,
             K.Attention.HEAD_COUNT: 16, K.Attention.HEAD_COUNT_KV: 2, K.Attention.KEY_LENGTH: 128,
             K.Attention.VALUE_LENGTH: 128, K.Rope.DIMENSION_COUNT: 64, K.Rope.FREQ_BASE: 1000000.0,
             K.Attention.LAYERNORM_RMS_EPS: 1e-5, K.LLM.VOCAB_SIZE: VOCAB, K.LLM.EXPERT_COUNT: 64,
             K.LLM.EXPERT_USED_COUNT: 8, K.LLM.EXPERT_FEED_FORWARD_LENGTH: 768, K.LLM.EXPERT_SHARED_COUNT: 1,
             K.LLM.LEADING_DENSE_BLOCK_COUNT: 0, K.LLM.EXPERT_GATING_FUNC: 2, K.LLM.EXPERT_WEIGHTS_NORM: True,
             K.LLM.EXPERT_WEIGHTS_SCALE: 2.5}


# Llama 4's form: four layers of the same sizes (llama.cpp's graph needs its fourth, positionless one to read
# the temperature input), the fourth a mixture (interleave step 4), the others dense FFNs of the experts' width
LLAMA4_LAYER = {**LAYER, K.LLM.BLOCK_COUNT: 4, K.LLM.FEED_FORWARD_LENGTH: 768, K.LLM.INTERLEAVE_MOE_LAYER_STEP: 4}


def layer_preset(shape: str) -> tuple[str, Any]:
    """The row's label and its preset: qwen3moe's n_expert:n_expert_used (one layer), GLM-4.5's layer scaled
    down, or Llama 4's four layers with llama4:n_expert:n_expert_used."""
    if shape == "glm4moe":
        return "glm4moe 64:8 +1 shared", make_tiny_preset("glm4moe", tied=False, **GLM_LAYER)
    family, layer = ("llama4", LLAMA4_LAYER) if shape.startswith("llama4:") else ("qwen3moe", LAYER)
    n_expert, n_used = (int(n) for n in shape.split(":")[-2:])
    return f"{family} {n_expert}:{n_used}", make_tiny_preset(family, tied=False, **{
        **layer, K.LLM.EXPERT_COUNT: n_expert, K.LLM.EXPERT_USED_COUNT: n_used})


def tokens() -> list[int]:
    return [int(t) for t in np.random.default_rng(0).integers(0, VOCAB, N_PROMPT)]


def graphir_generation(path: str) -> Callable[[], list[float]]:
    """A warmed-up run of N_GEN generated tokens, returning each token's seconds."""
    from graphir.batch import Batch
    from graphir.running.runtime import load

    model, toks = load(path), tokens()
    for name in model.meta.tensors:  # every page read in now, as llama.cpp's use_mmap=False does: no page faults
        w = model.weight(name)
        np.asarray(getattr(w, "raw", w)).sum()  # a matrix: its GGUF data; stacked experts and vectors: the array

    def tg() -> list[float]:
        ctx = model.new_context(n_ctx=N_PROMPT + N_GEN)
        ctx.decode(Batch.from_tokens(toks, 0))
        times = []
        for i in range(N_GEN):
            t = time.perf_counter()
            ctx.decode(Batch.one(int(ctx.logits_ith(-1).argmax()), N_PROMPT + i))
            times.append(time.perf_counter() - t)
        return times

    tg()  # warm-up: numba's compile (or cache load)
    return tg


def llama_cpp_generation(path: str) -> tuple[Callable[[], list[float]], Any]:
    os.environ.setdefault("GGML_NO_BACKTRACE", "1")
    from llama_cpp import Llama

    llm = Llama(model_path=path, n_ctx=N_PROMPT + N_GEN, n_batch=N_PROMPT, n_threads=THREADS, use_mmap=False,
                verbose=False)
    toks = tokens()

    def tg() -> list[float]:
        llm.reset()
        llm._ctx.kv_cache_clear()
        llm.eval(toks)
        times = []
        for _ in range(N_GEN):
            token = int(np.argmax(np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(llm.n_vocab(),))))
            t = time.perf_counter()
            llm.eval([token])
            times.append(time.perf_counter() - t)
        return times

    tg()
    return tg, llm


def main() -> None:
    shapes = sys.argv[1:] or list(SHAPES)
    print(f"one mixture-of-experts layer, F32, {THREADS} threads; ms per generated token (median of {REPEAT} x {N_GEN})")
    print(f"{'layer (experts:used)':>24} {'graphir ms':>11} {'llama.cpp ms':>13} {'ratio':>6}")
    with tempfile.TemporaryDirectory() as d:
        for shape in shapes:
            label, preset = layer_preset(shape)
            path = str(write_model_gguf(Path(d) / f"moe-{shape.replace(':', '-')}.gguf", preset,
                                        gguf.GGMLQuantizationType.F32))
            ours_run, (theirs_run, llm) = graphir_generation(path), llama_cpp_generation(path)
            ours_t: list[float] = []
            theirs_t: list[float] = []
            for _ in range(REPEAT):  # alternating, so that both engines see the same load of a shared machine
                ours_t += ours_run()
                theirs_t += theirs_run()
            llm.close()
            ours, theirs = 1000 * float(np.median(ours_t)), 1000 * float(np.median(theirs_t))
            print(f"{label:>24} {ours:11.1f} {theirs:13.1f} {ours / theirs:6.2f}", flush=True)
            os.remove(path)


if __name__ == "__main__":
    main()
