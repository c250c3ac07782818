"""The numba kernels under bounds checking: every graph the verifier accepts runs without an out-of-bounds access.

numba indexes arrays unchecked, so a kernel that reads past a row reads a neighbour's memory (wrong numbers)
and one that writes past it corrupts the heap. With ``NUMBA_BOUNDSCHECK=1`` every index is checked and a bad
one raises IndexError. The test runs this file as a script in a subprocess (beside the other tests:
tests/apart.py) with that variable and a fresh ``NUMBA_CACHE_DIR`` (kernels cached without checks would be
loaded instead, as numba's cache does not key on the setting): a short decode of a tiny random-weight model of
every family (two sequences: a prefill, a K-shift where the memory is a KV cache, two single-token steps; T5
encodes first) and of llama with every matrix type the backend runs, on every numerics path (avx512, avx2).
Any exception fails the case.

numba drops exceptions raised inside a ``prange`` body (numba issues #2811, #9380): the worker's chunk just
stops. The script therefore compiles the kernels without ``parallel`` (``prange`` is then ``range``, the
bodies are the same code) and first checks, with a kernel compiled from the backend's own options, that an
index one past the end does raise.

By hand (one line per case, 'ok NAME', 'FAIL NAME: ...'; exit status 1 if any failed):
    NUMBA_BOUNDSCHECK=1 NUMBA_CACHE_DIR=$(mktemp -d) python3 tests/test_boundscheck.py $(mktemp -d) [NAME ...]
Besides CASES the test runs the first RANDOM_IN_CI seeds of random shapes (:func:`random_case`: sizes, heads,
windows, weight types, up to three sequences of up to 300 tokens, ubatches of 1 to 300); it takes 75 to 140
seconds on two cores, most of it compiling the kernels with checks. ``--random A:B`` runs the seeds A..B-1
instead, where a context refusing a batch (BatchError, CacheFullError) prints 'refused NAME: ...' and is no
failure; 240 seeds take about a minute once the kernels are compiled.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest

import apart

K = gguf.Keys
Q = gguf.GGMLQuantizationType
START = 3  # the tiny T5's decoder_start_token_id

# family -> keys beyond conftest's TINY_KEYS; windows of 4 positions, so that the short decode slides past them
FAMILY_KEYS: dict[str, dict[str, object]] = {
    "llama": {}, "qwen2": {}, "qwen3": {}, "smollm3": {},
    "gemma2": {K.Attention.SLIDING_WINDOW: 4, K.LLM.ATTN_LOGIT_SOFTCAPPING: 3.0, K.LLM.FINAL_LOGIT_SOFTCAPPING: 2.0},
    "gemma3": {K.Attention.SLIDING_WINDOW: 4, K.Attention.KEY_LENGTH: 32, K.Attention.VALUE_LENGTH: 32},
    "phi3": {K.LLM.CONTEXT_LENGTH: 1024, K.Rope.SCALING_ORIG_CTX_LEN: 16, K.Rope.SCALING_ATTN_FACTOR: 1.19,
             K.Attention.SLIDING_WINDOW: 4},
    "gpt2": {K.Attention.LAYERNORM_EPS: 1e-5},
    "bert": {}, "nomic-bert": {}, "mamba": {}, "mamba2": {}, "granitehybrid": {}, "rwkv6": {}, "qwen35": {},
    "qwen3moe": {},
    "gpt-oss": {}, "deepseek2": {},  # conftest.TINY_FAMILY's: gpt-oss slides through 4 positions
    "t5": {K.Attention.HEAD_COUNT_KV: 4, K.Attention.KEY_LENGTH: 16, K.Attention.VALUE_LENGTH: 16,
           K.Attention.REL_BUCKETS_COUNT: 32, K.LLM.DECODER_START_TOKEN_ID: START, K.Attention.LAYERNORM_EPS: 1e-5},
}
# tensors a family's converter may write that its minimal preset leaves out
INCLUDE = {"phi3": r"blk\.\d+\.attn_qkv\.weight|rope_factors_(long|short)\.weight",
           "deepseek2": r"blk\.\d+\.exp_probs_b\.bias",
           "t5": r"(enc|dec)\.blk\.\d+\.ffn_gate\.weight"}
MATRIX_TYPES = (Q.F16, Q.BF16, Q.Q8_0, Q.Q4_1, Q.Q5_1, Q.Q4_0, Q.Q5_0, Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.MXFP4)
K_QUANTS = (Q.Q4_K, Q.Q5_K, Q.Q6_K)
ROWS_256 = {K.LLM.EMBEDDING_LENGTH: 256, K.LLM.FEED_FORWARD_LENGTH: 512}  # rows a K-quant block fits
STEPS = 2
BOUNDSCHECK_SECONDS = 1800


@dataclass(frozen=True)
class Case:
    """A model and the decode it runs: sequences of these lengths in one prefill (a decoder's in ubatches of
    n_ubatch; the default: 9 tokens as 7, a GEMM of 4 rows at a time and a tail, then 2), then STEPS steps."""

    arch: str
    dtype: Q = Q.F32
    keys: dict[str, object] = field(default_factory=dict)  # beyond FAMILY_KEYS
    lengths: tuple[int, ...] = (6, 3)
    n_ubatch: int = 7


CASES: dict[str, Case] = {**{arch: Case(arch) for arch in FAMILY_KEYS},
                          **{f"llama-{t.name.lower()}": Case("llama", t, ROWS_256) for t in MATRIX_TYPES}}
RECURRENT = ("mamba", "mamba2", "granitehybrid", "rwkv6", "qwen35")  # families whose state widths follow n_embd
RANDOM_IN_CI = 40  # random_case seeds the test runs besides CASES (all 240 seeds of 0..239 ran clean, 14 of them deepseek2 and 14 gpt-oss)
CI_CASES = [*CASES, *(f"random-{seed}" for seed in range(RANDOM_IN_CI))]


def random_case(seed: int) -> Case:
    """Random sizes for a family: widths, heads, window and weight type (attention families), up to three
    sequences of up to 300 tokens and a ubatch size of 1 to 300."""
    rng = np.random.default_rng([15, seed])
    arch = list(FAMILY_KEYS)[int(rng.integers(len(FAMILY_KEYS)))]
    keys: dict[str, object] = {K.LLM.CONTEXT_LENGTH: 2048}
    dtype = Q.F32
    if arch not in RECURRENT + ("deepseek2",):  # the recurrent families (and MLA's tied sizes) keep their widths
        # T5's relative position bias has rows of n_head: no quantized block fits
        types = (Q.F32, Q.F16, Q.BF16) if arch == "t5" else (Q.F32, *MATRIX_TYPES)
        dtype = types[int(rng.integers(len(types)))]
        step = 256 if dtype in K_QUANTS else 32 if dtype not in (Q.F32, Q.F16, Q.BF16) else 8
        n_embd = step * int(rng.integers(1, 3 if step == 256 else 13 if step == 8 else 5))
        n_head = int(rng.choice([h for h in (1, 2, 4, 8) if n_embd % (2 * h) == 0]))
        n_head_kv = n_head if arch in ("bert", "nomic-bert", "t5") else int(rng.choice(
            [h for h in (1, 2, 4, 8) if n_head % h == 0]))
        n_ff = step * int(rng.integers(1, 6))
        if arch in ("qwen3moe", "gpt-oss"):  # the experts' width, in whole quantization blocks like every row
            keys[K.LLM.EXPERT_FEED_FORWARD_LENGTH] = n_ff
        keys.update({K.LLM.EMBEDDING_LENGTH: n_embd, K.LLM.FEED_FORWARD_LENGTH: n_ff,
                     K.Attention.HEAD_COUNT: n_head, K.Attention.HEAD_COUNT_KV: n_head_kv,
                     K.Attention.KEY_LENGTH: n_embd // n_head, K.Attention.VALUE_LENGTH: n_embd // n_head})
    if arch in ("gemma2", "gemma3", "phi3", "gpt-oss"):
        keys[K.Attention.SLIDING_WINDOW] = int(rng.integers(1, 40))
    n_seq = int(rng.integers(1, 4))
    cap = 250 if arch in ("bert", "nomic-bert", "t5") else 300  # an encoder's ubatch: at most _decode's 256 cells
    lengths = tuple(int(n) for n in rng.integers(1, cap // n_seq + 1, n_seq))
    return Case(arch, dtype, keys, lengths, int(rng.integers(1, 301)))


# ---- the script: runs in the subprocess ----------------------------------------------------------------


def _serial_kernels() -> None:
    """Compile every kernel without ``parallel`` (see the module docstring); before the backend is imported.
    Only into a cache of their own: under the package's, they would replace the parallel kernels (numba's cache
    keys on neither option)."""
    if os.environ.get("NUMBA_BOUNDSCHECK") != "1" or not os.environ.get("NUMBA_CACHE_DIR"):
        sys.exit("set NUMBA_BOUNDSCHECK=1 and NUMBA_CACHE_DIR to a fresh directory (see the module docstring)")
    import numba

    njit = numba.njit

    def serial_njit(*args: Any, **options: Any) -> Any:
        return njit(*args, **{**options, "parallel": False})

    numba.njit = serial_njit


def _canary() -> None:
    """An index one past the end, in a kernel compiled with the backend's parallel options, raises IndexError."""
    from numba import prange

    from graphir.backends.numba.primitives.jit import PAR, parallel_and_serial

    def past_end(a: np.ndarray) -> float:
        s = 0.0
        for i in prange(a.shape[0] + 1):
            s += a[i]
        return s

    for kernel in parallel_and_serial(past_end):
        try:
            kernel(np.ones(4, np.float32))
        except IndexError:
            continue
        raise AssertionError(f"no IndexError from an index past the end (NUMBA_BOUNDSCHECK="
                             f"{os.environ.get('NUMBA_BOUNDSCHECK')!r}, options {PAR})")


def _preset(case: Case) -> Any:
    from conftest import make_tiny_preset

    preset = make_tiny_preset(case.arch, tied=False, **{**FAMILY_KEYS[case.arch], **case.keys})
    return dataclasses.replace(preset, include="|".join(p for p in (preset.include, INCLUDE.get(case.arch)) if p))


def _batch(tokens: list[list[int]], pos: bool = False) -> Any:
    """One batch of each sequence's tokens in turn (sequence ids 0, 1, ...), every token an output; positions
    from 0 when ``pos``, else where each sequence left off."""
    from graphir.batch import Batch

    flat = [t for seq in tokens for t in seq]
    ids = [(s,) for s, seq in enumerate(tokens) for _ in seq]
    at = np.array([p for seq in tokens for p in range(len(seq))]) if pos else None
    return Batch(np.array(flat), at, ids, np.ones(len(flat), bool))


def _decode(model: Any, case: Case) -> np.ndarray:
    """The decode of a case; the last outputs."""
    rng = np.random.default_rng(list(case.lengths))
    seqs = [rng.integers(4, 256, n).tolist() for n in case.lengths]
    step = lambda: [[int(rng.integers(4, 256))] for _ in seqs]  # noqa: E731
    total, n_seq = sum(case.lengths), len(seqs)
    one_ubatch = dict(n_ctx=min(256, total + n_seq * (STEPS + 1)), n_seq_max=n_seq, n_ubatch=total, n_batch=total)
    if model.arch.encoder_stack is not None:  # encoder-decoder: encode the sources, then the decoder steps
        ctx = model.new_context(**one_ubatch)
        ctx.encode(_batch(seqs, pos=True))
        ctx.decode(_batch([[START]] * n_seq, pos=True))
    elif model.arch.contexts[0] == "none":  # an encoder remembers nothing: each step is a one-token input
        ctx = model.new_context(**one_ubatch)
        for tokens in (seqs, *(step() for _ in range(STEPS))):
            ctx.decode(_batch(tokens, pos=True))
        return np.stack([ctx.embeddings_seq(s) for s in range(n_seq)])
    else:
        ctx = model.new_context(n_ctx=total + n_seq * (STEPS + 3), n_seq_max=n_seq, n_ubatch=case.n_ubatch,
                                n_batch=max(total, case.n_ubatch))
        ctx.decode(_batch(seqs))
    for i in range(STEPS):
        if i == 1 and ctx.memory.kind in ("kv", "mla") and ctx.memory.can_shift():
            ctx.memory.seq_add(n_seq - 1, -1, -1, 2)  # the next decode re-ropes cached K first
        ctx.decode(_batch(step()))
    return ctx.logits()


def run_case(name: str, case: Case, directory: Path) -> None:
    from conftest import write_model_gguf

    from graphir.running.backend import get
    from graphir.running.runtime import load

    path = write_model_gguf(directory / f"{name}.gguf", _preset(case), case.dtype)
    for isa in get().paths:  # register widths differ, and so do the kernels' strides and tails
        if not np.isfinite(_decode(load(str(path), isa), case)).all():
            raise AssertionError(f"{name}: outputs on the {isa} path are not finite")


def named_case(name: str) -> Case:
    """A case by name: one of CASES, or random-SEED."""
    return random_case(int(name.removeprefix("random-"))) if name.startswith("random-") else CASES[name]


def script(argv: list[str]) -> int:
    """``DIR [NAME ...]`` (default: CI_CASES) or ``DIR --random A:B`` (seeds A..B-1): run the cases with models
    written to DIR; 'ok NAME', 'refused NAME: ...' (--random only) or 'FAIL NAME: ...' per case on stdout, times
    and tracebacks on stderr."""
    _serial_kernels()
    from graphir.errors import BatchError, CacheFullError

    directory, rest = Path(argv[0]), argv[1:]
    if rest[:1] == ["--random"]:
        a, b = (int(x) for x in rest[1].split(":"))
        names, refusable = [f"random-{s}" for s in range(a, b)], (BatchError, CacheFullError)
    else:
        names, refusable = rest or CI_CASES, ()
    cases = {name: named_case(name) for name in names}
    failed = 0
    t0 = time.perf_counter()
    for name, case in [("canary", None), *cases.items()]:
        t = time.perf_counter()
        try:
            _canary() if case is None else run_case(name, case, directory)
        except refusable as e:
            print(f"refused {name}: {type(e).__name__}: {e}", flush=True)
        except Exception as e:  # every failure is reported, and the other cases still run
            failed += 1
            print(f"FAIL {name}: {type(e).__name__}: {e} ({case})", flush=True)
            traceback.print_exc()
        else:
            print(f"ok {name}", flush=True)
        print(f"{name}: {time.perf_counter() - t:.1f} s {case}", file=sys.stderr, flush=True)
    print(f"total: {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
    return 1 if failed else 0


# ---- the test ------------------------------------------------------------------------------------------


def _bounds_checked_run() -> subprocess.CompletedProcess:
    """This file as a script, with bounds checking and a numba cache of its own (see the module's docstring)."""
    folder = Path(apart.scratch("graphir-boundscheck-"))
    env = {**os.environ, "NUMBA_BOUNDSCHECK": "1", "NUMBA_CACHE_DIR": str(folder / "numba-cache")}
    (folder / "models").mkdir()
    return apart.run([sys.executable, __file__, str(folder / "models")], timeout=BOUNDSCHECK_SECONDS, env=env)


@pytest.mark.boundscheck
@pytest.mark.apart(work=_bounds_checked_run)
def test_every_family_and_matrix_type_runs_under_bounds_checking(apart_result: subprocess.CompletedProcess) -> None:
    p = apart_result
    assert (p.returncode, p.stdout) == (0, "".join(f"ok {n}\n" for n in ["canary", *CI_CASES])), p.stdout + p.stderr


if __name__ == "__main__":
    sys.exit(script(sys.argv[1:]))
