"""Batches of tokens and their split into ubatches, after llama.cpp's ``llama_batch`` / ``llama_ubatch``.

A batch carries, per token: its id, its position, the sequences it belongs to, and whether its output
(logits) is wanted. Validation happens before anything runs, so a rejected batch changes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from graphir.errors import BatchError

POS_MAX = 2**31 - 1  # positions are llama.cpp's llama_pos, an int32: graphs take them as such


@dataclass
class Batch:
    tokens: np.ndarray  # int32 [n]
    pos: np.ndarray | None  # int32 [n]; None: continue each sequence where the memory left it
    seq_ids: list[tuple[int, ...]]  # per token, one or more sequence ids
    output: np.ndarray  # bool [n]: produce logits for this token

    def __post_init__(self) -> None:
        try:  # what does not convert (ids beyond int64, text, ragged lists) is the user's batch, not a crash
            self.tokens = np.asarray(self.tokens, dtype=np.int64).reshape(-1)
            if self.pos is not None:
                self.pos = np.asarray(self.pos, dtype=np.int64).reshape(-1)
            self.output = np.asarray(self.output, dtype=bool).reshape(-1)
            self.seq_ids = [tuple(int(s) for s in ids) for ids in self.seq_ids]
        except (OverflowError, TypeError, ValueError) as e:
            raise BatchError(f"batch fields must be integer ids, positions and sequence ids: {e}") from None
        n = len(self.tokens)
        lengths = {"pos": None if self.pos is None else len(self.pos), "seq_ids": len(self.seq_ids),
                   "output": len(self.output)}
        for field, m in lengths.items():
            if m is not None and m != n:
                raise BatchError(f"batch has {n} tokens but {m} {field} entries")

    def __len__(self) -> int:
        return len(self.tokens)

    def every_output(self) -> Batch:
        """This batch with every token's output wanted (what a pooled context makes of it), its fields as they
        are: converted and checked once, when it was made."""
        b = object.__new__(Batch)
        b.__dict__.update(self.__dict__, output=np.ones(len(self), dtype=bool))
        return b

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

    def positions(self, per_token: int) -> np.ndarray:
        """The positions a graph taking ``per_token`` a token is fed, section-major: a text token's M-RoPE
        time, height and width are its position and its extra position is 0 (llama.cpp's inp_pos)."""
        if per_token == 1:
            return self.pos
        return np.concatenate([self.pos] * (per_token - 1) + [np.zeros_like(self.pos)])


def validate(batch: Batch, n_vocab: int, n_seq_max: int, last_pos: Callable[[int], int]) -> np.ndarray:
    """Check a batch against the model and the memory; return its positions (filled in where absent).

    ``last_pos(s)`` is the last position the memory holds for sequence s, asked only of the batch's sequences:
    the batch must continue from the next one, and an empty sequence (-1) may start anywhere (0 when positions
    are left out), as in llama.cpp. The checks run on Python ints: a generation step's one token is checked in
    a few microseconds, not in a dozen numpy calls.
    """
    n = len(batch)
    if n == 0:
        raise BatchError("empty batch: nothing to decode")
    tokens = batch.tokens.tolist()
    if min(tokens) < 0 or max(tokens) >= n_vocab:
        i = next(i for i, t in enumerate(tokens) if not 0 <= t < n_vocab)
        raise BatchError(f"token {i} has id {tokens[i]}, outside the vocabulary [0, {n_vocab})")
    expect: dict[int, int | None] = {}
    for i, ids in enumerate(batch.seq_ids):
        if not ids:
            raise BatchError(f"token {i} belongs to no sequence")
        for s in ids:
            if s not in expect:
                if not 0 <= s < n_seq_max:
                    raise BatchError(f"token {i} has seq id {s}, outside [0, {n_seq_max}) (n_seq_max={n_seq_max})")
                last = last_pos(s)
                expect[s] = last + 1 if last >= 0 else None
    given = batch.pos.tolist() if batch.pos is not None else None
    pos = []
    for i, ids in enumerate(batch.seq_ids):
        p = given[i] if given is not None else min((e for s in ids if (e := expect[s]) is not None), default=0)
        if p < 0:
            raise BatchError(f"token {i} has position {p}: positions start at 0")
        if p > POS_MAX:
            raise BatchError(f"token {i} has position {p}, beyond {POS_MAX}: positions are int32, as llama.cpp's")
        for s in ids:
            if expect[s] is not None and p != expect[s]:
                raise BatchError(f"token {i} of seq {s} has position {p}, but the sequence continues at {expect[s]}"
                                 f" (positions must be consecutive per sequence)")
            expect[s] = p + 1
        pos.append(p)
    return np.array(pos, dtype=np.int64)


def _ubatch(batch: Batch, pos: np.ndarray, idx: np.ndarray | slice) -> UBatch:
    """The tokens of ``batch`` at indices ``idx`` (or in a slice of it: a consecutive chunk, taken without numpy's
    fancy indexing), in that order."""
    seq_ids = batch.seq_ids[idx] if isinstance(idx, slice) else [batch.seq_ids[i] for i in idx]
    return UBatch(batch.tokens[idx].astype(np.int32), pos[idx].astype(np.int32), seq_ids,
                  np.flatnonzero(batch.output[idx]).astype(np.int32),
                  np.arange(idx.start, idx.stop) if isinstance(idx, slice) else idx)


def split_simple(batch: Batch, pos: np.ndarray, n_ubatch: int) -> list[UBatch]:
    """Consecutive chunks of at most n_ubatch tokens (what a KV cache needs: cells are chosen per token)."""
    return [_ubatch(batch, pos, slice(a, min(a + n_ubatch, len(batch)))) for a in range(0, len(batch), n_ubatch)]


def split_equal(batch: Batch, pos: np.ndarray, n_ubatch: int, sequential: bool = False) -> list[UBatch]:
    """Ubatches holding the same number of tokens from each of several sequence sets, set by set.

    For memories that advance one state per sequence per ubatch (recurrent). Sequence sets that overlap
    without being equal (a token shared by sequences that also have tokens of their own) cannot be split so.
    ``sequential``: a ubatch's sets are taken in the order of their first unused token, each one's first sequence
    id following the previous one's (llama.cpp's split_equal with ``sequential``, as its recurrent memory splits).
    """
    if all(ids == batch.seq_ids[0] for ids in batch.seq_ids):  # one sequence set: chunks, as split_simple's
        return split_simple(batch, pos, n_ubatch)
    sets = [frozenset(ids) for ids in batch.seq_ids]
    distinct = list(dict.fromkeys(sets))
    for i, a in enumerate(distinct):
        for b in distinct[i + 1:]:
            if a & b:
                raise BatchError(f"sequences {sorted(a)} and {sorted(b)} are coupled (a token belongs to both): "
                                 f"this memory splits ubatches per sequence; use a KV cache context")
    queues = {s: [i for i, t in enumerate(sets) if t == s] for s in distinct}
    out = []
    while any(queues.values()):
        live = _consecutive(batch, queues) if sequential else [s for s in distinct if queues[s]]
        live = live[:n_ubatch]
        n = min(min(len(queues[s]) for s in live), max(1, n_ubatch // len(live)))
        idx = [i for s in live for i in queues[s][:n]]
        for s in live:
            del queues[s][:n]
        out.append(_ubatch(batch, pos, np.array(idx)))
    return out


def _consecutive(batch: Batch, queues: dict[frozenset[int], list[int]]) -> list[frozenset[int]]:
    """The sets with tokens left, by their first unused token, keeping each whose first sequence id is one past
    the last kept one's (a set skipped there may still follow a later one)."""
    live: list[frozenset[int]] = []
    last = -1
    for i in sorted(i for q in queues.values() for i in q):
        s = frozenset(batch.seq_ids[i])
        if s in live or live and batch.seq_ids[i][0] != last + 1:
            continue
        live.append(s)
        last = batch.seq_ids[i][0]
    return live


def split_seq(batch: Batch, pos: np.ndarray, n_ubatch: int) -> list[UBatch]:
    """Ubatches of one sequence set each: from the first unused token, add later tokens whose set is a subset
    of the current one (narrowing it), up to n_ubatch (llama.cpp's split_seq)."""
    used = np.zeros(len(batch), dtype=bool)
    out = []
    while not used.all():
        first = int(np.flatnonzero(~used)[0])
        current, idx = frozenset(batch.seq_ids[first]), []
        for i in range(first, len(batch)):
            if len(idx) == n_ubatch:
                break
            s = frozenset(batch.seq_ids[i])
            if not used[i] and s <= current:
                idx.append(i)
                used[i] = True
                current = s
        out.append(_ubatch(batch, pos, np.array(idx)))
    return out


SPLITS = {"simple": split_simple, "equal": split_equal, "seq": split_seq,
          "sequential": lambda batch, pos, n_ubatch: split_equal(batch, pos, n_ubatch, sequential=True)}
