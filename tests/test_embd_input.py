"""Embedding rows in place of token ids (llama.cpp's ``llama_batch.embd``): an encoder's rows entering a decoder
at any position, with an M-RoPE model's per-section positions (an image patch's time, row and column).

Each case feeds the same rows and positions to llama.cpp (a ``llama_batch`` with ``embd`` set and, for M-RoPE, its
4 * n positions section-major) and to graphir: text tokens, then rows, then text again in one sequence.
"""

from __future__ import annotations

from typing import Callable

import ctypes
from pathlib import Path

import numpy as np
import pytest
from conftest import assert_llama_logits, process_folder
from test_families import LlamaCpp

import llama_made
from graphir.batch import Batch
from graphir.errors import BatchError
from graphir.running.runtime import Model, load

_rng = np.random.default_rng(11)
TEXT = _rng.integers(0, 128, 5).tolist()
AFTER = _rng.integers(0, 128, 3).tolist()
GRID = (2, 3)  # an image of 2 x 3 patches

# (arch, keys): families whose RoPE takes one position a token and families with M-RoPE sections
# the table's M-RoPE rows run rows_between_text too; CogVLM's rows take its vision expert's matrices
CASES = {"qwen2": {}, "qwen2vl": {}, "cogvlm": {}}
_MADE: dict[str, Path] = {}


def _file(case: str) -> Path:
    if case not in _MADE:
        arch = case.split("-")[0]
        _MADE[case] = llama_made.make(process_folder(f"embd-{case}-") / "F32.gguf", arch, **CASES[case])
    return _MADE[case]


def image_positions(start: int, rows: int, cols: int) -> np.ndarray:
    """An image's patches laid out as the tests give them, section-major: time grows patch by patch from
    ``start`` (graphir's KV cache masks by time alone), row and column from ``start``, extra 0."""
    n = rows * cols
    t = start + np.arange(n)
    h = start + np.repeat(np.arange(rows), cols)
    w = start + np.tile(np.arange(cols), rows)
    return np.concatenate([t, h, w, np.zeros(n, np.int64)])


def _rows_decode(o: LlamaCpp, rows: np.ndarray, pos: np.ndarray, seq: int = 0) -> None:
    """llama.cpp decodes ``rows`` (every one an output) at positions ``pos`` (n, or 4n section-major)."""
    n = len(rows)
    b = o.internals.LlamaBatch(n_tokens=n, embd=rows.shape[1], n_seq_max=o.n_seq_max, verbose=False)
    try:
        ctypes.memmove(b.batch.embd, np.ascontiguousarray(rows, np.float32).ctypes.data, rows.nbytes)
        positions = (ctypes.c_int32 * len(pos))(*[int(p) for p in pos])
        kind = type(b.batch.pos)
        own = ctypes.cast(b.batch.pos, ctypes.c_void_p).value  # the batch's own n positions, freed with it
        b.batch.pos = ctypes.cast(positions, kind)
        for i in range(n):
            b.batch.n_seq_id[i], b.batch.logits[i] = 1, True
            b.batch.seq_id[i][0] = seq
        b.batch.n_tokens = n
        assert o.lib.llama_decode(o.ctx.ctx, b.batch) == 0
    finally:
        b.batch.pos = ctypes.cast(own, kind)
        b.close()


def _positions_held(o: LlamaCpp) -> tuple[int, int]:
    """The first and last position llama.cpp's memory holds for sequence 0."""
    mem = o.lib.llama_get_memory(o.ctx.ctx)
    return o.lib.llama_memory_seq_pos_min(mem, 0), o.lib.llama_memory_seq_pos_max(mem, 0)


def rows_between_text(path: Path, model: Model,
                      check: Callable[[np.ndarray, np.ndarray, str], None] = assert_llama_logits) -> None:
    """Text, an image's rows (each with its positions per section, where the model's RoPE has sections), then
    text again, in one sequence of graphir and of llama.cpp: the logits of every step are llama.cpp's, and so are
    the positions each memory holds after it."""
    per_token = model.arch.positions_per_token
    n_img = GRID[0] * GRID[1]
    rows = _rng.normal(0.0, 1.0, (n_img, model.arch.n_embd_inp)).astype(np.float32)
    start = len(TEXT)
    pos = image_positions(start, *GRID) if per_token > 1 else np.arange(start, start + n_img)
    after = int(pos[:n_img].max()) + 1 + (2 if per_token > 1 else 0)  # M-RoPE: text may jump forward

    o = LlamaCpp(path, n_ctx=64)
    ctx = model.new_context(n_ctx=64)
    try:
        ctx.decode(Batch.from_tokens(TEXT, 0, outputs="all"))
        o.decode(TEXT, range(len(TEXT)), [0] * len(TEXT))
        check(ctx.logits(), np.stack([o.logits_ith(i) for i in range(len(TEXT))]), "text")
        ctx.decode(Batch.from_embd(rows, pos, outputs="all"))
        _rows_decode(o, rows, pos)
        check(ctx.logits(), np.stack([o.logits_ith(i) for i in range(n_img)]), "rows")
        assert (ctx.memory.seq_pos_min(0), ctx.memory.seq_pos_max(0)) == _positions_held(o)
        ctx.decode(Batch.from_tokens(AFTER, after, outputs="all"))
        o.decode(AFTER, range(after, after + len(AFTER)), [0] * len(AFTER))
        check(ctx.logits(), np.stack([o.logits_ith(i) for i in range(len(AFTER))]), "text after")
        assert (ctx.memory.seq_pos_min(0), ctx.memory.seq_pos_max(0)) == _positions_held(o)
    finally:
        o.close()


@pytest.mark.oracle
@pytest.mark.parametrize("case", list(CASES))
def test_rows_between_text_give_llama_cpps_logits(case: str) -> None:
    path = _file(case)
    rows_between_text(path, load(str(path)))


@pytest.mark.parametrize("case", ["qwen2", "qwen2vl"])
def test_rows_split_into_ubatches_give_the_logits_of_one(case: str) -> None:
    """Rows in ubatches of 2 give the logits they give as one ubatch (each ubatch holds rows only)."""
    model = load(str(_file(case)))
    rows = _rng.normal(0.0, 1.0, (6, model.arch.n_embd_inp)).astype(np.float32)
    pos = image_positions(0, 2, 3) if model.arch.positions_per_token > 1 else np.arange(6)
    out = []
    for n_ubatch in (6, 2):
        ctx = model.new_context(n_ctx=32, n_ubatch=n_ubatch)
        ctx.decode(Batch.from_embd(rows, pos, outputs="all"))
        out.append(ctx.logits())
    np.testing.assert_array_equal(out[0], out[1])


def test_rows_equal_to_token_embeddings_give_the_tokens_logits() -> None:
    import gguf

    model = load(str(_file("qwen2")))
    tensor = next(t for t in gguf.GGUFReader(_file("qwen2")).tensors if t.name == "token_embd.weight")
    table = np.asarray(tensor.data, np.float32).reshape(-1, model.hparams.n_embd)
    ctx = model.new_context(n_ctx=32)
    ctx.decode(Batch.from_tokens(TEXT, 0, outputs="all"))
    want = ctx.logits().copy()
    ctx = model.new_context(n_ctx=32)
    ctx.decode(Batch.from_embd(table[TEXT], None, outputs="all"))
    np.testing.assert_array_equal(ctx.logits(), want)


@pytest.mark.parametrize("rows, pos, case, cause", [
    ((4, 255), None, "qwen2", "embedding rows of width 255: this model takes rows of 256"),
    ((4, 256), np.arange(16), "qwen2", "4 positions a row are M-RoPE's: this model's RoPE has no sections"),
    ((4, 256), np.arange(8), "qwen2vl", "2 positions a row: this model's M-RoPE takes 4"),
])
def test_a_wrong_batch_of_rows_is_one_line_naming_its_cause_and_changes_nothing(
        rows: tuple[int, int], pos: np.ndarray | None, case: str, cause: str) -> None:
    model = load(str(_file(case)))
    ctx = model.new_context(n_ctx=32)
    ctx.decode(Batch.from_tokens(TEXT, 0))
    before = (ctx.logits().copy(), ctx.state_save())
    with pytest.raises(BatchError) as e:
        ctx.decode(Batch.from_embd(np.zeros(rows, np.float32), pos))
    assert cause in str(e.value) and "\n" not in str(e.value)
    np.testing.assert_array_equal(ctx.logits(), before[0])
    assert ctx.state_save() == before[1]


def test_a_batch_is_tokens_or_rows_not_both() -> None:
    with pytest.raises(BatchError, match="token ids or embedding rows, not both"):
        Batch([1, 2], None, [(0,), (0,)], [True, True], np.zeros((2, 8), np.float32))


def test_m_rope_positions_may_jump_forward_but_not_back() -> None:
    """As llama.cpp's batch check for M-RoPE models: a sequence's next position is any later one."""
    model = load(str(_file("qwen2vl")))
    ctx = model.new_context(n_ctx=32)
    ctx.decode(Batch.from_tokens(TEXT, 0))
    ctx.decode(Batch.from_tokens(AFTER, len(TEXT) + 4))
    assert ctx.memory.seq_pos_max(0) == len(TEXT) + 4 + len(AFTER) - 1
    with pytest.raises(BatchError, match=f"continues at {len(TEXT) + 4 + len(AFTER)} or later"):
        ctx.decode(Batch.from_tokens(AFTER, 3))
