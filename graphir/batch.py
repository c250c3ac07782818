"""Batches of tokens and their split into ubatches, after llama.cpp's ``llama_batch`` / ``llama_ubatch``.

A batch carries, per token: its id, its position, the sequences it belongs to, and whether its output
(logits) is wanted. Validation happens before anything runs, so a rejected batch changes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from graphir.errors import BatchError


@dataclass
class Batch:
    tokens: np.ndarray  # int32 [n]
    pos: np.ndarray | None  # int32 [n]; None: continue each sequence where the memory left it
    seq_ids: list[tuple[int, ...]]  # per token, one or more sequence ids
    output: np.ndarray  # bool [n]: produce logits for this token

    def __post_init__(self) -> None:
        self.tokens = np.asarray(self.tokens, dtype=np.int64).reshape(-1)
        n = len(self.tokens)
        if self.pos is not None:
            self.pos = np.asarray(self.pos, dtype=np.int64).reshape(-1)
        self.output = np.asarray(self.output, dtype=bool).reshape(-1)
        self.seq_ids = [tuple(int(s) for s in ids) for ids in self.seq_ids]
        lengths = {"pos": None if self.pos is None else len(self.pos), "seq_ids": len(self.seq_ids),
                   "output": len(self.output)}
        for field, m in lengths.items():
            if m is not None and m != n:
                raise BatchError(f"batch has {n} tokens but {m} {field} entries")

    def __len__(self) -> int:
        return len(self.tokens)

    @classmethod
    def from_tokens(cls, tokens: Sequence[int], pos0: int | None = None, seq_id: int = 0,
                    outputs: str = "last") -> Batch:
        """One sequence's tokens; ``pos0=None`` continues the sequence; ``outputs`` is 'last', 'all' or 'none'."""
        n = len(tokens)
        if outputs not in ("last", "all", "none"):
            raise BatchError(f"outputs must be 'last', 'all' or 'none', got {outputs!r}")
        out = np.zeros(n, dtype=bool)
        if outputs == "all":
            out[:] = True
        elif outputs == "last" and n:
            out[-1] = True
        pos = None if pos0 is None else np.arange(pos0, pos0 + n)
        return cls(np.asarray(tokens), pos, [(seq_id,)] * n, out)

    @classmethod
    def one(cls, token: int, pos: int | None = None, seq_id: int = 0) -> Batch:
        """A single token whose logits are wanted: the generation step."""
        return cls.from_tokens([token], pos, seq_id, "last")


@dataclass(frozen=True)
class UBatch:
    """One graph's worth of tokens: positions filled in, indices into the batch kept for output order."""

    tokens: np.ndarray  # int32 [n]
    pos: np.ndarray  # int32 [n]
    seq_ids: list[tuple[int, ...]]
    out_ids: np.ndarray  # int32 [n_outputs]: rows of this ubatch whose outputs are wanted
    batch_index: np.ndarray  # int64 [n]: where each token sits in the user's batch

    def __len__(self) -> int:
        return len(self.tokens)


def validate(batch: Batch, n_vocab: int, n_seq_max: int, next_pos: Sequence[int]) -> np.ndarray:
    """Check a batch against the model and the memory; return its positions (filled in where absent).

    ``next_pos[s]`` is the position sequence s must continue from (0 for an empty sequence).
    """
    n = len(batch)
    if n == 0:
        raise BatchError("empty batch: nothing to decode")
    bad = np.flatnonzero((batch.tokens < 0) | (batch.tokens >= n_vocab))
    if len(bad):
        i = int(bad[0])
        raise BatchError(f"token {i} has id {int(batch.tokens[i])}, outside the vocabulary [0, {n_vocab})")
    for i, ids in enumerate(batch.seq_ids):
        if not ids:
            raise BatchError(f"token {i} belongs to no sequence")
        for s in ids:
            if not 0 <= s < n_seq_max:
                raise BatchError(f"token {i} has seq id {s}, outside [0, {n_seq_max}) (n_seq_max={n_seq_max})")
    expect = {s: int(next_pos[s]) for ids in batch.seq_ids for s in ids}
    pos = np.empty(n, dtype=np.int64)
    for i, ids in enumerate(batch.seq_ids):
        want = {expect[s] for s in ids}
        p = int(batch.pos[i]) if batch.pos is not None else min(want)
        for s in ids:
            if p != expect[s]:
                raise BatchError(f"token {i} of seq {s} has position {p}, but the sequence continues at {expect[s]}"
                                 f" (positions must be consecutive per sequence)")
            expect[s] = p + 1
        pos[i] = p
    return pos


def split_simple(batch: Batch, pos: np.ndarray, n_ubatch: int) -> list[UBatch]:
    """Consecutive chunks of at most n_ubatch tokens (what a unified KV cache needs)."""
    out = []
    for a in range(0, len(batch), n_ubatch):
        b = min(a + n_ubatch, len(batch))
        out.append(UBatch(batch.tokens[a:b].astype(np.int32), pos[a:b].astype(np.int32), batch.seq_ids[a:b],
                          np.flatnonzero(batch.output[a:b]).astype(np.int32), np.arange(a, b)))
    return out
