"""Running models: logits against llama.cpp, batch invariance, and batches the context must refuse untouched."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

import gguf
import numpy as np
import pytest
from conftest import write_model_gguf

from graphir.batch import Batch
from graphir.errors import BatchError, CacheFullError
from graphir.model.presets import Preset
from graphir.running.runtime import Model, load

Q = gguf.GGMLQuantizationType
TOKENS = [5, 17, 200, 3, 99, 42, 7, 250, 128, 64, 1, 2]

oracle = pytest.mark.oracle


def llama_cpp_logits(path: Path, tokens: list[int], cache: str) -> np.ndarray:
    """All-position logits from llama.cpp, with its KV cache of the given type."""
    os.environ.setdefault("GGML_NO_BACKTRACE", "1")
    import llama_cpp

    ggml_type = {"f32": 0, "f16": 1}[cache]
    llm = llama_cpp.Llama(model_path=str(path), n_ctx=64, n_batch=64, logits_all=True, verbose=False,
                          n_threads=2, type_k=ggml_type, type_v=ggml_type)
    llm.eval(tokens)
    return np.array(llm.scores[: len(tokens)], dtype=np.float32)


def llama_cpp_greedy(path: Path, prompt: list[int], n: int) -> list[int]:
    import llama_cpp

    llm = llama_cpp.Llama(model_path=str(path), n_ctx=64, n_batch=64, verbose=False, n_threads=2)
    llm.eval(prompt)
    out = []
    for _ in range(n):
        out.append(int(np.argmax(np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(llm.n_vocab(),)))))
        llm.eval([out[-1]])
    return out


def graphir_greedy(model: Model, prompt: list[int], n: int) -> list[int]:
    ctx = model.new_context(n_ctx=64)
    ctx.decode(Batch.from_tokens(prompt, 0))
    out = []
    for i in range(n):
        out.append(int(np.argmax(ctx.logits_ith(-1))))
        ctx.decode(Batch.one(out[-1], len(prompt) + i))
    return out


def graphir_logits(model: Model, tokens: list[int], cache: str, **kw: int) -> np.ndarray:
    ctx = model.new_context(n_ctx=64, type_k=cache, type_v=cache, **kw)
    ctx.decode(Batch.from_tokens(tokens, 0, outputs="all"))
    return ctx.logits()


@pytest.fixture(params=["llama", "qwen2"])
def tiny_f32(request: pytest.FixtureRequest, tmp_path: Path, tiny_preset: Callable[..., Preset]) -> Path:
    return write_model_gguf(tmp_path / f"{request.param}.gguf", tiny_preset(request.param, tied=False))


@oracle
@pytest.mark.parametrize("cache", ["f32", "f16"])
def test_f32_weights_match_llama_cpp_at_every_position(tiny_f32: Path, cache: str) -> None:
    ref = llama_cpp_logits(tiny_f32, TOKENS, cache)
    ours = graphir_logits(load(str(tiny_f32)), TOKENS, cache)
    assert ref.std() > 0.5  # the logits are spread: a wrong mask or rope would move them
    assert np.abs(ours - ref).max() <= 1e-3


@oracle
@pytest.mark.parametrize("dtype", [Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q5_0, Q.Q4_1, Q.Q4_K, Q.Q5_K, Q.Q6_K])
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_quantized_weights_give_llama_cpps_greedy_tokens(
        tmp_path: Path, tiny_preset: Callable[..., Preset], arch: str, dtype: Q) -> None:
    # rows of 256 so that K-quant blocks fit; activations are quantized to 8 bits on both sides
    preset = tiny_preset(arch, **{gguf.Keys.LLM.EMBEDDING_LENGTH: 256, gguf.Keys.LLM.FEED_FORWARD_LENGTH: 512})
    path = write_model_gguf(tmp_path / "q.gguf", preset, dtype)
    ref = llama_cpp_logits(path, TOKENS, "f16")
    model = load(str(path))
    ours = graphir_logits(model, TOKENS, "f16")
    assert (ours.argmax(axis=1) == ref.argmax(axis=1)).all()
    assert graphir_greedy(model, TOKENS[:4], 16) == llama_cpp_greedy(path, TOKENS[:4], 16)


def _one_at_a_time(model: Model, tokens: list[int]) -> np.ndarray:
    ctx = model.new_context(n_ctx=64, type_k="f32", type_v="f32")
    rows = []
    for i, t in enumerate(tokens):
        ctx.decode(Batch.one(t, i))
        rows.append(ctx.logits_ith(-1).copy())
    return np.array(rows)


def test_logits_do_not_depend_on_how_tokens_are_batched(tiny_f32: Path) -> None:
    model = load(str(tiny_f32))
    whole = graphir_logits(model, TOKENS, "f32")
    assert np.abs(_one_at_a_time(model, TOKENS) - whole).max() <= 1e-5
    assert np.abs(graphir_logits(model, TOKENS, "f32", n_ubatch=5) - whole).max() <= 1e-5


def _cache_bytes(ctx: object) -> bytes:
    mem = ctx.memory  # type: ignore[attr-defined]
    return mem.pos.tobytes() + mem.seq.tobytes() + b"".join(b.tobytes() for b in mem.buffers().values())


@pytest.mark.parametrize("batch,message", [
    (Batch.from_tokens([3, 256]), "token 1 has id 256, outside the vocabulary [0, 256)"),
    (Batch([3], None, [(1,)], [True]), "token 0 has seq id 1, outside [0, 1) (n_seq_max=1)"),
    (Batch.from_tokens([3, 4], pos0=5), "token 0 of seq 0 has position 5, but the sequence continues at 3"),
    (Batch.from_tokens([]), "empty batch: nothing to decode"),
])
def test_a_bad_batch_is_refused_and_leaves_the_cache_byte_identical(tiny_f32: Path, batch: Batch,
                                                                   message: str) -> None:
    ctx = load(str(tiny_f32)).new_context(n_ctx=16)
    ctx.decode(Batch.from_tokens([1, 2, 3], 0))
    before = _cache_bytes(ctx)
    with pytest.raises(BatchError) as e:
        ctx.decode(batch)
    assert str(e.value).startswith(message)
    assert _cache_bytes(ctx) == before


def test_a_batch_that_does_not_fit_raises_cache_full_and_changes_nothing(tiny_f32: Path) -> None:
    ctx = load(str(tiny_f32)).new_context(n_ctx=8, n_ubatch=4)
    ctx.decode(Batch.from_tokens([1, 2, 3, 4, 5], 0))
    before = _cache_bytes(ctx)
    with pytest.raises(CacheFullError, match="KV cache full: ubatch 0 needs 4 cells, 3 of 8 are free"):
        ctx.decode(Batch.from_tokens([6, 7, 8, 9]))
    assert _cache_bytes(ctx) == before
    ctx.decode(Batch.from_tokens([6, 7, 8]))  # what fits still runs
    assert ctx.memory.seq_pos_max(0) == 7


def test_outputs_come_in_batch_order_and_logits_ith_follows_flags(tiny_f32: Path) -> None:
    model = load(str(tiny_f32))
    whole = graphir_logits(model, TOKENS, "f32")
    ctx = model.new_context(n_ctx=64, type_k="f32", type_v="f32", n_ubatch=5)
    flags = [i % 3 == 0 for i in range(len(TOKENS))]
    ctx.decode(Batch(TOKENS, None, [(0,)] * len(TOKENS), flags))
    assert np.abs(ctx.logits() - whole[np.flatnonzero(flags)]).max() <= 1e-5
    assert np.abs(ctx.logits_ith(9) - whole[9]).max() <= 1e-5
    with pytest.raises(IndexError, match="token 1 of the last batch has no output"):
        ctx.logits_ith(1)


def test_sequences_in_one_batch_do_not_see_each_other(tiny_f32: Path) -> None:
    model = load(str(tiny_f32))
    a, b = TOKENS[:6], TOKENS[6:]
    ctx = model.new_context(n_ctx=64, n_seq_max=2, type_k="f32", type_v="f32")
    ctx.decode(Batch(a + b, [*range(6), *range(6)], [(0,)] * 6 + [(1,)] * 6, [True] * 12))
    assert np.abs(ctx.logits()[:6] - graphir_logits(model, a, "f32")).max() <= 1e-5
    assert np.abs(ctx.logits()[6:] - graphir_logits(model, b, "f32")).max() <= 1e-5


def test_a_cacheless_context_attends_within_the_batch(tiny_f32: Path) -> None:
    model = load(str(tiny_f32))
    ctx = model.new_context(kind="none")
    ctx.decode(Batch.from_tokens(TOKENS, 0, outputs="all"))
    assert np.abs(ctx.logits() - graphir_logits(model, TOKENS, "f32")).max() <= 1e-5


def test_graphir_run_streams_a_continuation_and_reports_speed(tiny_f32: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from graphir.cli import main

    assert main(["run", str(tiny_f32), "-p", "the cat", "-n", "6", "-v"]) == 0
    out, err = capsys.readouterr()
    model = load(str(tiny_f32))
    ids = model.tokenize("the cat")
    assert out == "the cat" + "".join(model.generate("the cat", max_tokens=6)) + "\n"  # the prompt echoed
    assert f"prompt: {len(ids)} tokens" in err and "generation: 6 tokens" in err and "tokens/s" in err
    assert err.startswith(f"numerics: {model.numerics.describe()}\n")             # which llama.cpp path ran


def test_graphir_run_takes_the_numerics_path_asked_for(tiny_f32: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from graphir.cli import main

    assert main(["run", str(tiny_f32), "-p", "the cat", "-n", "2", "--isa", "avx2", "-v"]) == 0
    assert capsys.readouterr().err.startswith("numerics: avx2 (llama.cpp's x86 AVX2 (+FMA, F16C) CPU build), chosen")
