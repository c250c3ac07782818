"""A context stopped midway is the context it was, and one that cannot be made fails before it allocates.

Whatever stops a batch (KeyboardInterrupt or a failing ``taps`` callback halfway through the graph of its third
ubatch, a kernel failure when the third of four ubatches runs: conftest.fail_on_run), the context is
byte-identical to what it was before the batch (conftest.memory_bytes: cells, buffers, last logits), pending
position shifts included, for every memory kind; decoding the batch again then gives what an uninterrupted
context gives. A consumer of ``Model.generate`` that stops or raises between tokens leaves a context holding
exactly the tokens decoded so far. A random batch (fixed seeds: 900 of them, valid ones with one field at an
edge) decodes whole or is refused changing nothing. ``new_context`` whose memory does not fit in the available
memory fails up front with the bytes it needed, and sizes that are not positive integers are refused naming
them; a context longer than the trained one warns as llama.cpp does; ``state_save(path)`` writes the whole file
or nothing. The models are test_fuzz_state's tiny ones; about 30 s on two cores.
"""

from __future__ import annotations

import os
import re
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import TinyModels, fail_on_run, memory_bytes
from test_fuzz_state import KINDS, PRESETS

from graphir.errors import GraphirError, StateError
from graphir.running import context
from graphir.batch import Batch

TOKENS = np.random.default_rng(3).integers(4, 256, 40).tolist()
SIZES = {"n_ctx": 32, "n_seq_max": 2, "n_ubatch": 2}
BATCH = Batch(TOKENS[10:18], None, [(0,)] * 8, [True] * 8)  # four ubatches of two tokens


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> TinyModels:
    return TinyModels(tmp_path_factory.mktemp("interrupt"), PRESETS)


def started(tiny: TinyModels, kind: str) -> Any:
    """A context of ``kind`` holding two sequences, sequence 1's positions moved (a pending shift, where the
    memory keeps K rows)."""
    model, kw = KINDS[kind]
    ctx = tiny.model(model).new_context(**{**SIZES, **kw})
    if hasattr(ctx, "encode"):
        for seq in (0, 1):
            ctx.encode(Batch.from_tokens(TOKENS[30 + seq:32 + seq], 0, seq_id=seq))
    ctx.decode(Batch(TOKENS[:6], None, [(0,)] * 3 + [(1,)] * 3, [True] * 6))
    ctx.memory.seq_add(1, -1, -1, 2)
    return ctx


class Stop(dict):  # type: ignore[type-arg]
    """Decode taps that raise ``exc`` at the ``at``-th intermediate the graph computes."""

    def __init__(self, exc: BaseException, at: int):
        super().__init__()
        self.exc, self.at, self.seen = exc, at, 0

    def __setitem__(self, name: str, value: Any) -> None:
        self.seen += 1
        if self.seen == self.at:
            raise self.exc
        super().__setitem__(name, value)


def steps(ctx: Any) -> int:
    """How many intermediates one ubatch computes (the taps of a one-ubatch decode, in a throwaway copy)."""
    counted = Stop(RuntimeError("never"), 0)
    ctx.decode(Batch.one(TOKENS[20], seq_id=0), counted)
    return counted.seen


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("stop", ["KeyboardInterrupt in the third ubatch", "failing taps in the third ubatch",
                                  "kernel failure on the third run"])
def test_a_batch_stopped_midway_leaves_the_context_as_it_was(tiny: TinyModels, monkeypatch: pytest.MonkeyPatch,
                                                             kind: str, stop: str) -> None:
    alone = started(tiny, kind)
    n = steps(started(tiny, kind))
    alone.decode(BATCH)
    ctx = started(tiny, kind)
    before = memory_bytes(ctx)
    if stop.startswith("kernel"):
        calls = fail_on_run(monkeypatch, ctx, 3)
        with pytest.raises(RuntimeError, match="compute failed"):
            ctx.decode(BATCH)
        assert len(calls) == 3
        monkeypatch.undo()
    else:
        exc = KeyboardInterrupt() if stop.startswith("Keyboard") else ValueError("the callback failed")
        taps = Stop(exc, 2 * n + n // 2)  # halfway through the third ubatch: the first two wrote their rows
        with pytest.raises(type(exc)):
            ctx.decode(BATCH, taps)
    assert memory_bytes(ctx) == before
    ctx.decode(BATCH)
    assert memory_bytes(ctx) == memory_bytes(alone)


def greedy(ctx: Any, prompt: list[int], n: int) -> list[int]:
    """The prompt, then n greedy tokens decoded one by one (what generate does); the tokens decoded."""
    past, out = ctx.prompt(prompt), []
    for _ in range(n):
        out.append(int(np.argmax(ctx.logits_ith(-1))))
        ctx.decode(Batch.one(out[-1], past + len(out) - 1))
    return out


@pytest.mark.parametrize("kind", ["kv", "recurrent", "hybrid", "cross"])
@pytest.mark.parametrize("how", ["stops", "raises"])
def test_a_generation_its_consumer_leaves_holds_exactly_the_tokens_decoded(tiny: TinyModels, kind: str,
                                                                           how: str) -> None:
    model, kw = KINDS[kind]
    m = tiny.model(model)
    ctx = m.new_context(n_ctx=32, **kw)
    pieces, taken = m.generate("hello there", max_tokens=20, ctx=ctx), []

    def consume() -> None:
        for piece in pieces:
            taken.append(piece)
            if len(taken) == 5:
                if how == "raises":
                    raise ValueError("the consumer failed")
                return

    if how == "raises":
        with pytest.raises(ValueError, match="the consumer failed"):
            consume()
    else:
        consume()
    pieces.close()
    held = ctx.memory.seq_pos_max(0) + 1  # the decoded tokens: the prompt, then the sampled ones but the last
    prompt = m.tokenize("hello there", add_special=True, parse_special=True)
    alone = m.new_context(n_ctx=32, **kw)
    greedy(alone, prompt, held - (1 if hasattr(ctx, "encode") else len(prompt)))
    assert len(taken) == 5 and memory_bytes(ctx) == memory_bytes(alone)


def test_a_generation_whose_decode_fails_keeps_the_tokens_decoded_before(tiny: TinyModels,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    m = tiny.model("llama")
    prompt = m.tokenize("hello there", add_special=True, parse_special=True)
    alone = m.new_context(n_ctx=32)
    greedy(alone, prompt, 2)
    ctx = m.new_context(n_ctx=32)
    fail_on_run(monkeypatch, ctx, 4)  # the prompt (one ubatch), two tokens, then the third token's decode fails
    with pytest.raises(RuntimeError, match="compute failed"):
        list(m.generate("hello there", max_tokens=20, ctx=ctx))
    assert memory_bytes(ctx) == memory_bytes(alone)


# ---- batches: run whole or refused before anything changes -------------------------------------------------

def random_batch(rng: np.random.Generator, next0: int) -> Batch:
    """Up to 6 tokens continuing sequence 0 or starting sequence 1 (empty) at 0, 9 or 4 short of llama_pos's end;
    then, five times in six, one field set to an edge: a token outside the vocabulary, a position below 0, past
    llama_pos or out of step, a token in no sequence, in both or in one outside [0, n_seq_max), output flags of
    another length, or positions left out."""
    def pick(values: list[Any]) -> Any:
        return values[int(rng.integers(0, len(values)))]

    n = int(rng.integers(1, 7))
    seqs = rng.integers(0, 2, n).tolist()
    nxt = {0: next0, 1: pick([0, 9, 2**31 - 4])}
    pos = []
    for s in seqs:
        pos.append(nxt[s])
        nxt[s] += 1
    tokens, seq_ids, output = rng.integers(0, 256, n).tolist(), [(s,) for s in seqs], (rng.random(n) < 0.5).tolist()
    how, i = pick(["none", "token", "pos", "seq", "output", "implicit"]), int(rng.integers(0, n))
    if how == "token":
        tokens[i] = pick([-1, 256, 2**40, 2**70])
    elif how == "pos":
        pos[i] = pick([-1, 2**31, 10**12, 2**70, pos[i] + 1])
    elif how == "seq":
        seq_ids[i] = pick([(), (2,), (-1,), (0, 1)])
    elif how == "output":
        output = output[:-1]
    return Batch(tokens, None if how == "implicit" else pos, seq_ids, output)


@pytest.mark.parametrize("kind", list(KINDS))
def test_a_random_batch_runs_whole_or_is_refused_changing_nothing(tiny: TinyModels, kind: str) -> None:
    """150 batches per kind from a fixed seed (about 1 s per kind): each decodes, leaving every sequence at the
    position its last token gave it, or raises a GraphirError that changed nothing."""
    ctx = started(tiny, kind)
    ctx.memory.seq_rm(1, -1, -1)
    home, next0 = ctx.state_save(), ctx.memory.seq_pos_max(0) + 1
    rng, outcomes = np.random.default_rng(list(KINDS).index(kind)), Counter[str]()
    for case in range(150):
        ctx.state_load(home)
        try:
            batch = random_batch(rng, next0)
        except GraphirError as e:
            outcomes[type(e).__name__] += 1
            continue
        before = memory_bytes(ctx)
        try:
            ctx.decode(batch)
            outcomes["decoded"] += 1
        except GraphirError as e:
            assert memory_bytes(ctx) == before, (case, batch, e)
            outcomes[type(e).__name__] += 1
            continue
        for s in {s for ids in batch.seq_ids for s in ids}:  # each sequence now ends where the batch left it
            mine = [i for i, ids in enumerate(batch.seq_ids) if s in ids]
            if batch.pos is not None:
                assert ctx.memory.seq_pos_max(s) == batch.pos[mine[-1]], (case, batch)
    print(kind, dict(outcomes))
    assert outcomes["decoded"] and outcomes["BatchError"], outcomes


# ---- resources: refused before anything is allocated ---------------------------------------------------------

def test_a_memory_larger_than_the_machine_is_refused_up_front_with_its_size(tiny: TinyModels) -> None:
    """2^40 cells of 2 layers x (32 K + 32 V) f16 values: 2^48 bytes, refused before one is allocated."""
    with pytest.warns(UserWarning, match=r"may hold 1099511627776 positions, more than the 256 the model was"), \
            pytest.raises(GraphirError, match=r"^context #\d+ \(llama, kind kv, n_ctx 1099511627776\) needs "
                                              r"281474976710656 bytes \(262144\.0 GiB\) for its memory, but only \d+ "
                                              r"bytes \(.* GiB\) are available \(MemAvailable\); lower n_ctx or "
                                              r"n_seq_max$"):
        tiny.model("llama").new_context(n_ctx=2**40)


@pytest.mark.parametrize("kind", list(KINDS))
def test_a_memory_is_sized_before_it_is_allocated(tiny: TinyModels, monkeypatch: pytest.MonkeyPatch,
                                                  kind: str) -> None:
    model, kw = KINDS[kind]
    ctx = tiny.model(model).new_context(**{**SIZES, **kw})
    need = ctx.memory.nbytes()
    assert need == sum(b.nbytes for b in ctx.memory.buffers().values()) > 0
    monkeypatch.setattr(context, "available_bytes", lambda: need - 1)
    with pytest.raises(GraphirError, match=f"needs {need} bytes .* but only {need - 1} bytes"):
        tiny.model(model).new_context(**{**SIZES, **kw})
    monkeypatch.setattr(context, "available_bytes", lambda: need)
    tiny.model(model).new_context(**{**SIZES, **kw})
    monkeypatch.setattr(context, "available_bytes", lambda: None)  # where the system does not say: no check
    tiny.model(model).new_context(**{**SIZES, **kw})


def test_a_context_beyond_the_trained_one_warns_as_llama_cpp_does(tiny: TinyModels) -> None:
    m = tiny.model("llama")
    with pytest.warns(UserWarning) as warned:
        m.new_context(n_ctx=512)
    assert [re.sub(r"#\d+", "#N", str(w.message)) for w in warned] == [
        "context #N (llama, kind kv, n_ctx 512): a sequence may hold 512 positions, more than the 256 the model was "
        "trained with; outputs beyond them may degrade"]
    assert warned[0].filename == __file__  # it points at the caller
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        m.new_context(n_ctx=512, n_seq_max=2, unified=False)  # 256 cells per sequence: within the trained context
        m.new_context(n_ctx=256)


@pytest.mark.parametrize("sizes,message", [
    ({"n_ubatch": 0}, "n_ubatch=0: a context size must be a positive integer"),
    ({"n_batch": -1}, "n_batch=-1: a context size must be a positive integer"),
    ({"n_ctx": -5}, "n_ctx=-5: a context size must be a positive integer"),
    ({"n_ctx": 16.5}, "n_ctx=16.5: a context size must be a positive integer"),
    ({"n_seq_max": 0}, "n_seq_max=0: a context size must be a positive integer"),
])
def test_a_context_size_that_is_not_a_positive_integer_is_refused_naming_it(tiny: TinyModels, sizes: dict[str, Any],
                                                                            message: str) -> None:
    with pytest.raises(GraphirError, match=f"^{message}$"):
        tiny.model("llama").new_context(**sizes)


def test_a_position_past_the_trained_table_or_llama_pos_is_refused_and_changes_nothing(tiny: TinyModels) -> None:
    m = tiny.model("llama")
    ctx = m.new_context(**SIZES)
    ctx.decode(Batch.from_tokens(TOKENS[:3], 0))
    before = memory_bytes(ctx)
    with pytest.raises(GraphirError, match=r"^token 0 has position 2147483648, beyond 2147483647: positions are "
                                           r"int32, as llama.cpp's$"):
        ctx.decode(Batch.one(7, 2**31, seq_id=1))
    with pytest.raises(GraphirError, match=r"^seq_add: moving positions up to 2 by 2147483646 leaves the positions "
                                           r"a model takes, \[0, 2147483647\]$"):
        ctx.memory.seq_add(0, -1, -1, 2**31 - 2)
    assert memory_bytes(ctx) == before


# ---- state files: whole or nothing --------------------------------------------------------------------------

def test_an_interrupted_state_save_leaves_the_old_file_and_no_other(tiny: TinyModels, tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    ctx = started(tiny, "kv")
    path = tmp_path / "chat.state"
    path.write_bytes(b"the old state")

    def interrupted(src: Any, dst: Any) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", interrupted)  # the data is written; the rename never happens
    with pytest.raises(KeyboardInterrupt):
        ctx.state_save(path)
    monkeypatch.undo()
    assert path.read_bytes() == b"the old state" and os.listdir(tmp_path) == ["chat.state"]
    data = ctx.state_save(path)
    assert path.read_bytes() == data and os.listdir(tmp_path) == ["chat.state"]


def test_a_state_file_that_cannot_be_written_is_a_state_error_naming_it(tiny: TinyModels, tmp_path: Path) -> None:
    path = tmp_path / "missing" / "chat.state"
    with pytest.raises(StateError, match=f"^cannot write state file '{re.escape(str(path))}': No such file or "
                                         f"directory$"):
        started(tiny, "kv").state_save(path)
    assert not path.parent.exists()
