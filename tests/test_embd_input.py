"""Embedding rows in place of token ids (llama.cpp's ``llama_batch.embd``): an encoder's rows entering a decoder
at any position, with an M-RoPE model's per-section positions (an image patch's time, row and column).

Each case feeds the same rows and positions to llama.cpp (a ``llama_batch`` with ``embd`` set and, for M-RoPE, its
4 * n positions section-major) and to graphir: text tokens, then rows, then text again in one sequence. An image
laid out as llama.cpp's mtmd lays it out gives all its patches one time and each its own row and column: the
caches keep those per cell and mask by them, which the cells llama.cpp saves show.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Callable

import ctypes
from pathlib import Path

import numpy as np
import pytest
from conftest import assert_llama_logits, fail_on_run, memory_bytes, process_folder
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
# Gemma scales rows by sqrt(n_embd) as it scales tokens' embeddings; Gemma 3 takes rows as they are
CASES = {"qwen2": {}, "qwen2vl": {}, "qwen3vl": {}, "cogvlm": {}, "gemma": {}, "gemma3": {}}
MROPE = ["qwen2vl", "qwen3vl"]  # M-RoPE by sections one after the other, and interleaved
_MADE: dict[str, Path] = {}


def _file(case: str) -> Path:
    if case not in _MADE:
        arch = case.split("-")[0]
        _MADE[case] = llama_made.make(process_folder(f"embd-{case}-") / "F32.gguf", arch, **CASES[case])
    return _MADE[case]


def image_positions(start: int, rows: int, cols: int) -> np.ndarray:
    """An image's patches with a time each, section-major: time grows patch by patch from ``start``, row and
    column from ``start``, extra 0."""
    n = rows * cols
    t = start + np.arange(n)
    h = start + np.repeat(np.arange(rows), cols)
    w = start + np.tile(np.arange(cols), rows)
    return np.concatenate([t, h, w, np.zeros(n, np.int64)])


def mtmd_image(start: int, rows: int, cols: int) -> tuple[np.ndarray, int]:
    """An image's patches as llama.cpp's mtmd gives them to an M-RoPE model (mtmd_image_tokens_get_decoder_pos),
    section-major: every patch at time ``start``, at row ``start`` + r and column ``start`` + c, extra 0; and the
    position text continues at after it, ``start`` + max(rows, cols) (mtmd_image_tokens_get_n_pos)."""
    n = rows * cols
    return (np.concatenate([np.full(n, start), start + np.repeat(np.arange(rows), cols),
                            start + np.tile(np.arange(cols), rows), np.zeros(n, np.int64)]), start + max(rows, cols))


def patches(pos: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """The section-major positions of the patches ``idx`` of an image's positions ``pos``."""
    return pos.reshape(4, -1)[:, idx].reshape(-1)


def _rows_call(o: LlamaCpp, rows: np.ndarray, pos: np.ndarray, seq: int = 0) -> int:
    """llama.cpp's answer to decoding ``rows`` (every one an output) at positions ``pos`` (n, or 4n
    section-major)."""
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
        return int(o.lib.llama_decode(o.ctx.ctx, b.batch))
    finally:
        b.batch.pos = ctypes.cast(own, kind)
        b.close()


def _rows_decode(o: LlamaCpp, rows: np.ndarray, pos: np.ndarray, seq: int = 0) -> None:
    """llama.cpp decodes ``rows`` (every one an output) at positions ``pos`` (n, or 4n section-major)."""
    assert _rows_call(o, rows, pos, seq) == 0


def _tokens_call(o: LlamaCpp, tokens: list[int], pos: list[int], seq: int = 0) -> int:
    """llama.cpp's answer to decoding ``tokens`` (every one an output) at positions ``pos``."""
    b = o.internals.LlamaBatch(n_tokens=len(tokens), embd=0, n_seq_max=o.n_seq_max, verbose=False)
    try:
        for i, (t, p) in enumerate(zip(tokens, pos)):
            b.batch.token[i], b.batch.pos[i], b.batch.n_seq_id[i], b.batch.logits[i] = t, p, 1, True
            b.batch.seq_id[i][0] = seq
        b.batch.n_tokens = len(tokens)
        return int(o.lib.llama_decode(o.ctx.ctx, b.batch))
    finally:
        b.close()


def llama_cells(o: LlamaCpp, seq: int) -> list[tuple[int, int, int]]:
    """The (position, row, column) of each cell llama.cpp's KV cache holds for ``seq``, in cell order, read from
    its saved state of the sequence: its magic and id (llama_context::state_seq_get_data), the cache's streams,
    and in the one holding the sequence each cell's position, sequence count and llama_kv_cell_ext (x: column,
    y: row, the token) before its sequence ids (llama_kv_cache::state_write_meta)."""
    size = o.lib.llama_state_seq_get_size(o.ctx.ctx, seq)
    buf = (ctypes.c_uint8 * size)()
    assert o.lib.llama_state_seq_get_data(o.ctx.ctx, buf, size, seq) == size
    words = np.frombuffer(bytes(buf), np.int32)
    _magic, seq_id, n_stream = words[:3]
    assert seq_id == seq
    at = 3
    for _ in range(n_stream):
        count, at = int(words[at]), at + 1
        if count:
            cells = []
            for _ in range(count):
                pos, n_seq, x, y, _token = words[at:at + 5]
                assert n_seq == 1 and words[at + 5] == seq
                cells.append((int(pos), int(y), int(x)))
                at += 5 + n_seq
            return cells
    return []


def graphir_cells(memory: object, seq: int) -> list[tuple[int, int, int]]:
    """The (position, row, column) of each cell graphir's KV cache holds for ``seq``, in cell order."""
    mine = np.flatnonzero((memory.seq >> np.uint64(seq)) & np.uint64(1))  # type: ignore[attr-defined]
    return [(int(memory.pos[c]), int(memory.row[c]), int(memory.col[c])) for c in mine]  # type: ignore[attr-defined]


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


IMAGE = (3, 4)  # an image of 3 rows of 4 patches, as mtmd sends it to an M-RoPE model
LAST_ROW, FIRST_ROWS = np.arange(8, 12), np.arange(8)  # its patches, the last row first: out of raster order


def _image_rows(model: Model) -> np.ndarray:
    return np.random.default_rng(3).normal(0.0, 1.0, (IMAGE[0] * IMAGE[1], model.arch.n_embd_inp)).astype(np.float32)


def _llama_logits(o: LlamaCpp, n: int) -> np.ndarray:
    return np.stack([o.logits_ith(i) for i in range(n)])


@pytest.mark.oracle
@pytest.mark.parametrize("first", [12, 7], ids=["one-batch", "two-batches"])
@pytest.mark.parametrize("case", MROPE)
def test_an_image_laid_out_as_mtmd_does_gives_llama_cpps_logits_and_cells(case: str, first: int) -> None:
    """Text, an image whose patches share one time (in one batch, or in two as mtmd cuts an image longer than
    n_batch, the second at the time the memory holds), then text where mtmd continues: every step's logits are
    llama.cpp's, and so are the position, row and column of every cell, in ubatches of 5 (cut mid-row)."""
    path = _file(case)
    model = load(str(path))
    rows, (pos, after) = _image_rows(model), mtmd_image(len(TEXT), *IMAGE)
    o, ctx = LlamaCpp(path, n_ctx=64, n_ubatch=5), model.new_context(n_ctx=64, n_ubatch=5)
    try:
        ctx.decode(Batch.from_tokens(TEXT, 0, outputs="all"))
        o.decode(TEXT, range(len(TEXT)), [0] * len(TEXT))
        for part in (np.arange(first), np.arange(first, len(rows))):
            if len(part):
                ctx.decode(Batch.from_embd(rows[part], patches(pos, part), outputs="all"))
                _rows_decode(o, rows[part], patches(pos, part))
                assert_llama_logits(ctx.logits(), _llama_logits(o, len(part)), f"patches {part[0]}..{part[-1]}")
        assert graphir_cells(ctx.memory, 0) == llama_cells(o, 0)
        assert graphir_cells(ctx.memory, 0)[len(TEXT):] == [(5, 5 + r, 5 + c) for r in range(3) for c in range(4)]
        ctx.decode(Batch.from_tokens(AFTER, after, outputs="all"))
        o.decode(AFTER, range(after, after + len(AFTER)), [0] * len(AFTER))
        assert_llama_logits(ctx.logits(), _llama_logits(o, len(AFTER)), "text after the image")
        assert graphir_cells(ctx.memory, 0) == llama_cells(o, 0)
        assert (ctx.memory.seq_pos_min(0), ctx.memory.seq_pos_max(0)) == _positions_held(o) == (0, after + 2)
    finally:
        o.close()


@pytest.mark.oracle
@pytest.mark.parametrize("case", MROPE)
def test_a_saved_image_loads_with_its_rows_and_columns(case: str) -> None:
    """Text and an image's last row, saved (the whole context, and the sequence alone) and loaded into new
    contexts; then the image's first rows at the same time: they must not see the last row's patches, which only
    the saved rows and columns tell (with its cells' time alone as their row and column, they would). Each
    gives llama.cpp's logits and cells, llama.cpp having decoded it all in one context."""
    path = _file(case)
    model = load(str(path))
    rows, (pos, _) = _image_rows(model), mtmd_image(len(TEXT), *IMAGE)
    o, ctx = LlamaCpp(path, n_ctx=64), model.new_context(n_ctx=64)
    try:
        ctx.decode(Batch.from_tokens(TEXT, 0))
        o.decode(TEXT, range(len(TEXT)), [0] * len(TEXT))
        ctx.decode(Batch.from_embd(rows[LAST_ROW], patches(pos, LAST_ROW)))
        _rows_decode(o, rows[LAST_ROW], patches(pos, LAST_ROW))
        whole, alone = ctx.state_save(), ctx.state_seq_save(0)
        _rows_decode(o, rows[FIRST_ROWS], patches(pos, FIRST_ROWS))
        want, cells = _llama_logits(o, len(FIRST_ROWS)), llama_cells(o, 0)
    finally:
        o.close()
    whole_ctx, alone_ctx = model.new_context(n_ctx=64), model.new_context(n_ctx=64)
    whole_ctx.state_load(whole)
    alone_ctx.state_seq_load(alone, 0)
    for c in (whole_ctx, alone_ctx):
        assert c.state_seq_save(0) == alone
    for c in (ctx, whole_ctx, alone_ctx):
        c.decode(Batch.from_embd(rows[FIRST_ROWS], patches(pos, FIRST_ROWS), outputs="all"))
        assert_llama_logits(c.logits(), want, "the first rows after the last one")
        assert graphir_cells(c.memory, 0) == cells


def _without_planes(state: bytes, n_cells: int) -> bytes:
    """A format-3 state of one sequence of text as format 2 wrote it: its cells' rows and columns (the two
    int64 fields after the shifts, each equal to the positions) left out, its version, length and checksum
    made again."""
    import hashlib
    import struct

    pos = np.arange(n_cells, dtype="<i8").tobytes()
    at = state.index(pos + np.full(n_cells, 1, "<u8").tobytes() + bytes(8 * n_cells) + pos + pos)
    body = bytearray(state[:at + 24 * n_cells] + state[at + 40 * n_cells:-32])
    struct.pack_into("<IIQ", body, 8, 2, 1, len(body) + 32)
    return bytes(body) + hashlib.sha256(body).digest()


@pytest.mark.parametrize("case", MROPE)
def test_a_format_2_state_loads_its_cells_taking_their_positions_as_rows_and_columns(case: str) -> None:
    model = load(str(_file(case)))
    ctx = model.new_context(n_ctx=32)
    ctx.decode(Batch.from_tokens(TEXT, 0))
    saved = ctx.state_seq_save(0)
    other = model.new_context(n_ctx=32)
    other.state_seq_load(_without_planes(saved, len(TEXT)), 0)
    assert graphir_cells(other.memory, 0) == [(p, p, p) for p in range(len(TEXT))]
    assert other.state_seq_save(0) == saved


@pytest.mark.oracle
@pytest.mark.parametrize("unified", [True, False], ids=["unified", "per-sequence"])
@pytest.mark.parametrize("case", MROPE)
def test_seq_cp_and_seq_rm_carry_an_image_as_llama_cpps(case: str, unified: bool) -> None:
    """Sequence 0: text and an image's last row; copied to sequence 1, which takes the image's first rows (that
    must not see the last row: the copy carries its rows and columns); then sequence 1's image removed
    (seq_rm from its time: all its patches) and text in its place, and sequence 0 going on after its image.
    Logits and cells as llama.cpp's at every step."""
    path = _file(case)
    model = load(str(path))
    rows, (pos, after) = _image_rows(model), mtmd_image(len(TEXT), *IMAGE)
    o = LlamaCpp(path, n_ctx=64, n_seq_max=2, unified=unified)
    ctx = model.new_context(n_ctx=64, n_seq_max=2, unified=unified)
    try:
        mem = o.lib.llama_get_memory(o.ctx.ctx)
        ctx.decode(Batch.from_tokens(TEXT, 0))
        o.decode(TEXT, range(len(TEXT)), [0] * len(TEXT))
        ctx.decode(Batch.from_embd(rows[LAST_ROW], patches(pos, LAST_ROW)))
        _rows_decode(o, rows[LAST_ROW], patches(pos, LAST_ROW))
        ctx.memory.seq_cp(0, 1, -1, -1)
        o.lib.llama_memory_seq_cp(mem, 0, 1, -1, -1)
        ctx.decode(Batch.from_embd(rows[FIRST_ROWS], patches(pos, FIRST_ROWS), seq_id=1, outputs="all"))
        _rows_decode(o, rows[FIRST_ROWS], patches(pos, FIRST_ROWS), seq=1)
        assert_llama_logits(ctx.logits(), _llama_logits(o, len(FIRST_ROWS)), "seq 1's first rows")
        assert [graphir_cells(ctx.memory, s) for s in (0, 1)] == [llama_cells(o, s) for s in (0, 1)]
        assert ctx.memory.seq_rm(1, len(TEXT), -1) and o.lib.llama_memory_seq_rm(mem, 1, len(TEXT), -1)
        assert [graphir_cells(ctx.memory, s) for s in (0, 1)] == [llama_cells(o, s) for s in (0, 1)]
        for seq, at in ((1, len(TEXT)), (0, after)):
            ctx.decode(Batch.from_tokens(AFTER, at, seq_id=seq, outputs="all"))
            assert _tokens_call(o, AFTER, list(range(at, at + len(AFTER))), seq) == 0
            assert_llama_logits(ctx.logits(), _llama_logits(o, len(AFTER)), f"seq {seq}'s text")
        assert [graphir_cells(ctx.memory, s) for s in (0, 1)] == [llama_cells(o, s) for s in (0, 1)]
    finally:
        o.close()


@pytest.mark.parametrize("case", MROPE)
def test_a_failed_decode_of_an_image_leaves_the_memory_as_it_was(case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """An image in ubatches of 4 whose second fails, after text and the image's last row: every byte of the
    memory (rows and columns of the cells included) and the last logits are as they were."""
    model = load(str(_file(case)))
    rows, (pos, _) = _image_rows(model), mtmd_image(len(TEXT), *IMAGE)
    ctx = model.new_context(n_ctx=64, n_ubatch=4)
    ctx.decode(Batch.from_tokens(TEXT, 0))
    ctx.decode(Batch.from_embd(rows[LAST_ROW], patches(pos, LAST_ROW)))
    before = memory_bytes(ctx)
    calls = fail_on_run(monkeypatch, SimpleNamespace(program=ctx._rows_program()), 2)
    with pytest.raises(RuntimeError, match="compute failed"):
        ctx.decode(Batch.from_embd(rows[FIRST_ROWS], patches(pos, FIRST_ROWS)))
    assert len(calls) == 2 and memory_bytes(ctx) == before


def _plane(times: list[int]) -> np.ndarray:
    """Rows at these times, each with its time as row and column (extra 0), section-major."""
    t = np.array(times)
    return np.concatenate([t, t, t, np.zeros_like(t)])


@pytest.mark.oracle
@pytest.mark.parametrize("what, times, refusal", [
    ("rows", [4, 4], None),
    ("rows", [5, 5, 4], "token 2 of seq 0 has position 4, but the sequence is at 5 in this batch: M-RoPE "
                        "positions may repeat or grow, not go back"),
    ("rows", [3, 5], "token 0 of seq 0 has position 3, but the sequence holds position 4: M-RoPE rows may share "
                     "it or go on, not go back"),
    ("text", [6, 6, 7], None),
    ("text", [4, 5], "token 0 of seq 0 has position 4, but the sequence continues at 5 or later: M-RoPE text "
                     "follows the last position held, 4"),
    ("text", [7, 6], "token 1 of seq 0 has position 6, but the sequence is at 7 in this batch: M-RoPE positions "
                     "may repeat or grow, not go back"),
], ids=["rows-share-the-last", "rows-go-back", "rows-before-the-last", "text-repeats", "text-at-the-last",
        "text-goes-back"])
@pytest.mark.parametrize("case", MROPE)
def test_m_rope_positions_are_accepted_and_refused_as_llama_cpp_does(case: str, what: str, times: list[int],
                                                                      refusal: str | None) -> None:
    """After text at 0..4: what llama.cpp's batch check accepts gives its logits; what it refuses, graphir refuses
    in one line naming the token, the sequence and the positions, changing nothing."""
    path = _file(case)
    model = load(str(path))
    o, ctx = LlamaCpp(path, n_ctx=64), model.new_context(n_ctx=64)
    try:
        ctx.decode(Batch.from_tokens(TEXT, 0))
        o.decode(TEXT, range(len(TEXT)), [0] * len(TEXT))
        before = memory_bytes(ctx)
        if what == "rows":
            rows = np.random.default_rng(4).normal(0.0, 1.0, (len(times), model.arch.n_embd_inp)).astype(np.float32)
            batch, theirs = Batch.from_embd(rows, _plane(times), outputs="all"), _rows_call(o, rows, _plane(times))
        else:
            batch, theirs = Batch(AFTER[:len(times)], times, [(0,)] * len(times), [True] * len(times)), \
                _tokens_call(o, AFTER[:len(times)], times)
        if refusal is None:
            assert theirs == 0
            ctx.decode(batch)
            assert_llama_logits(ctx.logits(), _llama_logits(o, len(times)), what)
            assert graphir_cells(ctx.memory, 0) == llama_cells(o, 0)
        else:
            assert theirs != 0
            with pytest.raises(BatchError) as e:
                ctx.decode(batch)
            assert str(e.value) == refusal
            assert memory_bytes(ctx) == before
    finally:
        o.close()
