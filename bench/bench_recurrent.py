"""Benchmark: recurrent and hybrid families against llama.cpp, in the same run, at real layer sizes.

No Mamba, Mamba-2, RWKV6, Granite-4.0-H or Qwen3.5 GGUF ships on the package registry, so each model is the tests'
random-weight GGUF (tests/conftest.py write_model_gguf, F16 matrices, 256 tokens) with the layer sizes of a released model
and few layers (the per-layer cost is what is compared): prompt processing of 64 tokens (LFM2: 512) and generation of 32,
2 threads, best of 3, tokens/s for both engines and the ratio graphir / llama.cpp (>= 1: graphir is faster). Each
engine keeps one context and clears its memory between runs (what llama.cpp's side does with kv_cache_clear, and
how a server runs: a new context makes its plans again, a few ms that a run of 32 tokens would count).
LFM2's and RWKV-7's rows read a prompt of 512 tokens (PROMPTS).
Run: python bench/bench_recurrent.py [family ...]   (families: mamba, mamba2, rwkv6, granitehybrid, qwen35, lfm2, rwkv7)
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

import gguf
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from conftest import make_tiny_preset, write_model_gguf  # noqa: E402

K = gguf.Keys
N_PROMPT, N_GEN, REPEAT, THREADS, VOCAB = 64, 32, 3, 2, 256  # the tests' byte-level vocabulary
# family -> (released model whose layer sizes these are, its keys with a few layers)
MODELS = {
    "mamba": ("Mamba-130M", {K.LLM.EMBEDDING_LENGTH: 768, K.LLM.BLOCK_COUNT: 4, K.SSM.INNER_SIZE: 1536,
                             K.SSM.STATE_SIZE: 16, K.SSM.TIME_STEP_RANK: 48}),
    "mamba2": ("Mamba-2-2.7B", {K.LLM.EMBEDDING_LENGTH: 2560, K.LLM.BLOCK_COUNT: 2, K.SSM.INNER_SIZE: 5120,
                                K.SSM.STATE_SIZE: 128, K.SSM.TIME_STEP_RANK: 80, K.SSM.GROUP_COUNT: 1}),
    "rwkv6": ("RWKV6-1.6B", {K.LLM.EMBEDDING_LENGTH: 2048, K.LLM.BLOCK_COUNT: 2, K.LLM.FEED_FORWARD_LENGTH: 7168,
                             K.WKV.HEAD_SIZE: 64, K.LLM.TIME_MIX_EXTRA_DIM: 32, K.LLM.TIME_DECAY_EXTRA_DIM: 64}),
    "granitehybrid": ("Granite-4.0-H-Micro-like", {
        K.LLM.EMBEDDING_LENGTH: 2048, K.LLM.BLOCK_COUNT: 4, K.LLM.FEED_FORWARD_LENGTH: 8192,
        K.Attention.HEAD_COUNT: 32, K.Attention.HEAD_COUNT_KV: [0, 0, 0, 8], K.SSM.INNER_SIZE: 4096,
        K.SSM.STATE_SIZE: 128, K.SSM.TIME_STEP_RANK: 64, K.SSM.GROUP_COUNT: 1}),
    "qwen35": ("Qwen3.5-0.8B", {  # three gated DeltaNet layers and one gated attention layer
        K.LLM.EMBEDDING_LENGTH: 1024, K.LLM.BLOCK_COUNT: 4, K.LLM.FEED_FORWARD_LENGTH: 3584,
        K.LLM.FULL_ATTENTION_INTERVAL: 4, K.Attention.HEAD_COUNT: 8, K.Attention.HEAD_COUNT_KV: 2,
        K.Attention.KEY_LENGTH: 256, K.Attention.VALUE_LENGTH: 256, K.Rope.DIMENSION_COUNT: 64,
        K.Rope.DIMENSION_SECTIONS: [11, 11, 10, 0], K.SSM.INNER_SIZE: 2048, K.SSM.STATE_SIZE: 128,
        K.SSM.TIME_STEP_RANK: 16, K.SSM.GROUP_COUNT: 16}),
    "lfm2": ("LFM2-1.2B", {  # three short-convolution layers (3 taps) and one attention layer (32 heads, 8 KV)
        K.LLM.CONTEXT_LENGTH: 4096, K.LLM.EMBEDDING_LENGTH: 2048, K.LLM.BLOCK_COUNT: 4, K.LLM.FEED_FORWARD_LENGTH: 8192,
        K.Attention.HEAD_COUNT: 32, K.Attention.HEAD_COUNT_KV: [0, 0, 8, 0], K.ShortConv.L_CACHE: 3}),
    "rwkv7": ("RWKV7-World-1.5B", {
        K.LLM.EMBEDDING_LENGTH: 2048, K.LLM.BLOCK_COUNT: 2, K.LLM.FEED_FORWARD_LENGTH: 8192, K.WKV.HEAD_SIZE: 64,
        K.Attention.DECAY_LORA_RANK: 96, K.Attention.ICLR_LORA_RANK: 96, K.Attention.VALUE_RESIDUAL_MIX_LORA_RANK: 64,
        K.Attention.GATE_LORA_RANK: 256, K.Attention.LAYERNORM_EPS: 1e-5, K.LLM.CONTEXT_LENGTH: 1048576}),
}
PROMPTS = {"lfm2": 512, "rwkv7": 512}  # families timed on a longer prompt than N_PROMPT
UNTIED = ("rwkv7",)  # families whose LM head llama.cpp requires


def tokens(n: int = N_PROMPT) -> list[int]:
    return [int(t) for t in np.random.default_rng(0).integers(0, VOCAB, n)]


def best(fn) -> float:  # type: ignore[no-untyped-def]
    return min(fn() for _ in range(REPEAT))


def bench_graphir(path: str, n_prompt: int = N_PROMPT) -> tuple[float, float]:
    from graphir.batch import Batch
    from graphir.running.runtime import load

    model, toks = load(path), tokens(n_prompt)
    ctx = model.new_context(n_ctx=n_prompt + N_GEN)   # one context, cleared between runs as llama.cpp's is

    def pp() -> float:
        ctx.memory.clear()
        t = time.perf_counter()
        ctx.decode(Batch.from_tokens(toks, 0))
        return time.perf_counter() - t

    def tg() -> float:
        ctx.memory.clear()
        ctx.decode(Batch.from_tokens(toks, 0))
        t = time.perf_counter()
        for i in range(N_GEN):
            ctx.decode(Batch.one(int(ctx.logits_ith(-1).argmax()), n_prompt + i))
        return time.perf_counter() - t

    pp(), tg()  # warm-up: numba's compile (or cache load) and weight preparation
    return n_prompt / best(pp), N_GEN / best(tg)


def bench_llama_cpp(path: str, n_prompt: int = N_PROMPT) -> tuple[float, float]:
    os.environ.setdefault("GGML_NO_BACKTRACE", "1")
    from llama_cpp import Llama

    llm = Llama(model_path=path, n_ctx=n_prompt + N_GEN, n_batch=n_prompt, n_threads=THREADS, verbose=False)
    toks = tokens(n_prompt)

    def logits() -> np.ndarray:
        return np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(llm.n_vocab(),))

    def pp() -> float:
        llm.reset()
        llm._ctx.kv_cache_clear()  # the recurrent states too: a new sequence starts at position 0
        t = time.perf_counter()
        llm.eval(toks)
        return time.perf_counter() - t

    def tg() -> float:
        llm.reset()
        llm._ctx.kv_cache_clear()
        llm.eval(toks)
        t = time.perf_counter()
        for _ in range(N_GEN):
            llm.eval([int(np.argmax(logits()))])
        return time.perf_counter() - t

    pp(), tg()
    return n_prompt / best(pp), N_GEN / best(tg)


def main() -> None:
    families = sys.argv[1:] or list(MODELS)
    print(f"{'family':14} {'sizes of':26} {'phase':6} {'graphir tok/s':>14} {'llama.cpp tok/s':>16} {'ratio':>6}")
    with tempfile.TemporaryDirectory() as d:
        for fam in families:
            source, keys = MODELS[fam]
            preset = make_tiny_preset(fam, tied=fam not in UNTIED, **{K.LLM.VOCAB_SIZE: VOCAB, **keys})
            path = str(write_model_gguf(Path(d) / f"{fam}.gguf", preset, gguf.GGMLQuantizationType.F16))
            n_prompt = PROMPTS.get(fam, N_PROMPT)
            ours, theirs = bench_graphir(path, n_prompt), bench_llama_cpp(path, n_prompt)
            for phase, a, b in (("pp", ours[0], theirs[0]), ("tg", ours[1], theirs[1])):
                print(f"{fam:14} {source:26} {phase:6} {a:14.1f} {b:16.1f} {a / b:6.2f}", flush=True)
            os.remove(path)


if __name__ == "__main__":
    main()
