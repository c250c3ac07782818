"""Cutting batches into ubatches: the split modes, and outputs in batch order whichever a memory picks."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np
import pytest
from conftest import write_model_gguf

from graphir.batch import SPLITS, Batch, split_equal, split_seq, split_simple
from graphir.errors import BatchError
from graphir.model.presets import Preset
from graphir.running.runtime import load

# tokens of seq 0 at batch indices 0, 2, 4; of seq 1 at 1, 3, 5, 6, 7 (interleaved, as a server sends them)
SEQS = [(0,), (1,), (0,), (1,), (0,), (1,), (1,), (1,)]
POS = np.array([0, 0, 1, 1, 2, 2, 3, 4])


def batch(seqs: list[tuple[int, ...]] = SEQS, pos: np.ndarray = POS) -> Batch:
    return Batch(np.arange(10, 10 + len(seqs)), pos, seqs, [True] * len(seqs))


def indices(split: Callable[..., list], b: Batch, n_ubatch: int) -> list[list[int]]:
    return [ub.batch_index.tolist() for ub in split(b, b.pos, n_ubatch)]


def test_simple_cuts_consecutive_chunks() -> None:
    assert indices(split_simple, batch(), 3) == [[0, 1, 2], [3, 4, 5], [6, 7]]


def test_equal_takes_as_many_tokens_from_each_sequence_set() -> None:
    assert indices(split_equal, batch(), 4) == [[0, 2, 1, 3], [4, 5], [6, 7]]


def test_sequential_takes_only_sets_of_consecutive_sequence_ids() -> None:
    """Sequences 0, 1 and 2 (6, 3 and 8 tokens, interleaved): all three advance together until 1 ends; then 0 and 2
    are not consecutive, so each goes on alone, where the plain equal split keeps them together (llama.cpp's
    recurrent memory splits so)."""
    seqs = [(s,) for n in range(8) for s, length in enumerate((6, 3, 8)) if n < length]
    pos = np.array([n for n in range(8) for length in (6, 3, 8) if n < length])
    sets = [[tuple(seqs[i]) for i in ub] for ub in indices(split_equal, batch(seqs, pos), 5)]
    assert [sorted(set(s)) for s in sets] == [[(0,), (1,), (2,)]] * 3 + [[(0,), (2,)]] * 2 + [[(2,)]]

    def sequential(b: Batch, p: np.ndarray, n: int) -> list:
        return split_equal(b, p, n, sequential=True)
    sets = [[tuple(seqs[i]) for i in ub] for ub in indices(sequential, batch(seqs, pos), 5)]
    assert [sorted(set(s)) for s in sets] == [[(0,), (1,), (2,)]] * 3 + [[(0,)], [(2,)]]
    assert indices(SPLITS["sequential"], batch(seqs, pos), 5) == indices(sequential, batch(seqs, pos), 5)


def test_equal_refuses_coupled_sequences() -> None:
    with pytest.raises(BatchError, match=r"sequences \[0\] and \[0, 1\] are coupled"):
        split_equal(batch([(0,), (0, 1)], np.array([0, 1])), np.array([0, 1]), 4)


def test_seq_narrows_to_subsets_of_the_first_tokens_set() -> None:
    b = batch([(0, 1), (0,), (1,), (0,), (1,)], np.array([0, 1, 1, 2, 2]))
    assert indices(split_seq, b, 8) == [[0, 1, 3], [2, 4]]
    assert indices(split_seq, batch(), 2) == [[0, 2], [1, 3], [4], [5, 6], [7]]


@pytest.mark.parametrize("mode", ["equal", "sequential", "seq"])
def test_every_split_gives_the_same_logits_in_batch_order(tmp_path: Path, tiny_preset: Callable[..., Preset],
                                                          mode: str) -> None:
    model = load(str(write_model_gguf(tmp_path / "m.gguf", tiny_preset())))

    def run(split: str) -> np.ndarray:
        ctx = model.new_context(n_ctx=32, n_seq_max=2, n_ubatch=4, type_k="f32", type_v="f32")
        ctx.memory.split = split
        ctx.decode(batch())
        return ctx.logits()

    assert set(SPLITS) == {"simple", "equal", "sequential", "seq"}
    assert np.abs(run(mode) - run("simple")).max() <= 1e-5
