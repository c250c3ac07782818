"""Batches of tokens and their split into ubatches, after llama.cpp's ``llama_batch`` / ``llama_ubatch``.

A batch carries, per token: its id (or, in its place, an embedding row: llama.cpp's ``llama_batch.embd``, e.g. an
image's or an audio clip's rows from an encoder), its position, the sequences it belongs to, and whether its output
(logits) is wanted. A model whose RoPE turns by several position sections (M-RoPE) takes, for embedding rows, one
position per section, section-major (an image patch's time, row, column and extra positions); a token gives each
section its one position. Validation happens before anything runs, so a rejected batch changes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from graphir.errors import BatchError

POS_MAX = 2**31 - 1  # positions are llama.cpp's llama_pos, an int32: graphs take them as such


@dataclass
class Batch:
    tokens: np.ndarray  # int32 [n]; empty when the batch carries embedding rows
    pos: np.ndarray | None  # int32 [n], or [k * n] section-major (rows of an M-RoPE model); None: continue each
    #                         sequence where the memory left it
    seq_ids: list[tuple[int, ...]]  # per token, one or more sequence ids
    output: np.ndarray  # bool [n]: produce logits for this token
    embd: np.ndarray | None = None  # float32 [n, width]: rows entering the model in place of token ids

    def __post_init__(self) -> None:
        try:  # what does not convert (ids beyond int64, text, ragged lists) is the user's batch, not a crash
            self.tokens = np.asarray(self.tokens, dtype=np.int64).reshape(-1)
            if self.pos is not None:
                self.pos = np.asarray(self.pos, dtype=np.int64).reshape(-1)
            self.output = np.asarray(self.output, dtype=bool).reshape(-1)
            self.seq_ids = [tuple(int(s) for s in ids) for ids in self.seq_ids]
            if self.embd is not None:
                self.embd = np.ascontiguousarray(self.embd, dtype=np.float32)
        except (OverflowError, TypeError, ValueError) as e:
            raise BatchError(f"batch fields must be integer ids, positions and sequence ids: {e}") from None
        if self.embd is not None:
            if self.embd.ndim != 2:
                raise BatchError(f"embedding rows must be a 2-D array [n, width], not of shape {self.embd.shape}")
            if len(self.tokens):
                raise BatchError("a batch carries token ids or embedding rows, not both (as llama.cpp's llama_batch)")
        n = len(self)
        lengths = {"seq_ids": len(self.seq_ids), "output": len(self.output)}
        for field, m in lengths.items():
            if m != n:
                raise BatchError(f"batch has {n} tokens but {m} {field} entries")
        if self.pos is not None and len(self.pos) != n and (self.embd is None or not n or len(self.pos) % n):
            raise BatchError(f"batch has {n} tokens but {len(self.pos)} pos entries" + (
                " (embedding rows may give k positions each, section-major)" if self.embd is not None else ""))

    def __len__(self) -> int:
        return len(self.tokens) if self.embd is None else len(self.embd)

    @property
    def sections(self) -> int:
        """The positions each token gives (1, or an M-RoPE model's sections for embedding rows)."""
        return 1 if self.pos is None or not len(self) else len(self.pos) // len(self)

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
    def from_embd(cls, rows: np.ndarray, pos: Sequence[int] | np.ndarray | None = None, seq_id: int = 0,
                  outputs: str = "last") -> Batch:
        """One sequence's embedding rows [n, width]; ``pos``: None (continue the sequence), n positions, or
        k * n section-major (an M-RoPE model's time, height, width and extra position of each row)."""
        batch = cls.from_tokens(range(len(rows)), None, seq_id, outputs)
        return cls(np.zeros(0, np.int64), pos, batch.seq_ids, batch.output, rows)

    @classmethod
    def one(cls, token: int, pos: int | None = None, seq_id: int = 0) -> Batch:
        """A single token whose logits are wanted: the generation step."""
        return cls.from_tokens([token], pos, seq_id, "last")


@dataclass(frozen=True)
class UBatch:
    """One graph's worth of tokens (or of embedding rows: a ubatch holds either, as llama.cpp's): positions
    filled in, indices into the batch kept for output order."""

    tokens: np.ndarray  # int32 [n]; empty in a ubatch of rows
    pos: np.ndarray  # int32 [n]: each token's position in its sequence (an M-RoPE row's time)
    seq_ids: list[tuple[int, ...]]
    out_ids: np.ndarray  # int32 [n_outputs]: rows of this ubatch whose outputs are wanted
    batch_index: np.ndarray  # int64 [n]: where each token sits in the user's batch
    embd: np.ndarray | None = None  # float32 [n, width]: the rows, in a ubatch of rows
    sections: np.ndarray | None = None  # int32 [k, n]: the rows' positions per M-RoPE section, where given
    # False: its tokens see every cell of their sequences, later positions too (llama.cpp's causal_attn off, which
    # mtmd sets while a Gemma 3 decoder takes an image's rows)
    causal: bool = True

    def __len__(self) -> int:
        return len(self.pos)

    def positions(self, per_token: int) -> np.ndarray:
        """The positions a graph taking ``per_token`` a token is fed, section-major: rows' given sections as
        they are; a text token's M-RoPE time, height and width are its position and its extra position is 0
        (llama.cpp's inp_pos)."""
        if per_token == 1:
            return self.pos
        if self.sections is not None:
            return self.sections.reshape(-1)
        return np.concatenate([self.pos] * (per_token - 1) + [np.zeros_like(self.pos)])

    def feeds(self, per_token: int) -> dict[str, np.ndarray]:
        """The graph inputs this ubatch fills: its tokens or its rows, and its positions."""
        first = {"tokens": self.tokens} if self.embd is None else {"embd": self.embd}
        return {**first, "pos": self.positions(per_token)}


def validate(batch: Batch, n_vocab: int, n_seq_max: int, last_pos: Callable[[int], int], n_embd_inp: int = 0,
             per_token: int = 1) -> np.ndarray:
    """Check a batch against the model and the memory; return its positions (filled in where absent).

    ``last_pos(s)`` is the last position the memory holds for sequence s, asked only of the batch's sequences:
    the batch must continue from the next one, and an empty sequence (-1) may start anywhere (0 when positions
    are left out), as in llama.cpp. ``n_embd_inp`` is the width of the rows the model takes in place of tokens,
    ``per_token`` the positions its RoPE turns a token by (M-RoPE's sections), and there llama.cpp's rules for
    M-RoPE hold: a sequence's positions may jump forward and, within a batch, repeat (an image's patches share one
    time); text continues after the last position the memory holds, embedding rows may share it (an image sent in
    several batches); no position goes back. Embedding rows may give each section its own position. The checks
    run on Python ints: a generation step's one token is checked in a few microseconds, not in a dozen numpy calls.
    """
    n = len(batch)
    if n == 0:
        raise BatchError("empty batch: nothing to decode")
    if batch.embd is not None:
        if batch.embd.shape[1] != n_embd_inp:
            raise BatchError(f"embedding rows of width {batch.embd.shape[1]}: this model takes rows of {n_embd_inp}")
        if batch.sections > 1 and per_token == 1:
            raise BatchError(f"{batch.sections} positions a row are M-RoPE's: this model's RoPE has no sections "
                             f"(one position a token)")
        if batch.sections not in (1, per_token):
            raise BatchError(f"{batch.sections} positions a row: this model's M-RoPE takes {per_token} (time, height, "
                             f"width, extra), section-major")
    else:
        tokens = batch.tokens.tolist()
        if min(tokens) < 0 or max(tokens) >= n_vocab:
            i = next(i for i, t in enumerate(tokens) if not 0 <= t < n_vocab)
            raise BatchError(f"token {i} has id {tokens[i]}, outside the vocabulary [0, {n_vocab})")
    mrope, rows = per_token > 1, batch.embd is not None
    expect: dict[int, int | None] = {}  # per sequence: its next position (one past the last, held or given)
    held: dict[int, bool] = {}  # whether that last position is the memory's (else this batch's)
    for i, ids in enumerate(batch.seq_ids):
        if not ids:
            raise BatchError(f"token {i} belongs to no sequence")
        for s in ids:
            if s not in expect:
                if not 0 <= s < n_seq_max:
                    raise BatchError(f"token {i} has seq id {s}, outside [0, {n_seq_max}) (n_seq_max={n_seq_max})")
                last = last_pos(s)
                expect[s] = last + 1 if last >= 0 else None
                held[s] = True
    given = batch.pos[:n].tolist() if batch.pos is not None else None
    if given is not None:
        for k in range(1, batch.sections):  # a row's other sections: positions as int32, as its first
            section = batch.pos[k * n:(k + 1) * n]
            if section.min() < 0 or section.max() > POS_MAX:
                i = int(np.argmax((section < 0) | (section > POS_MAX)))
                raise BatchError(f"token {i} has position {int(section[i])} in section {k}: positions are int32 "
                                 f"from 0, as llama.cpp's")
    pos = []
    for i, ids in enumerate(batch.seq_ids):
        p = given[i] if given is not None else min((e for s in ids if (e := expect[s]) is not None), default=0)
        if p < 0:
            raise BatchError(f"token {i} has position {p}: positions start at 0")
        if p > POS_MAX:
            raise BatchError(f"token {i} has position {p}, beyond {POS_MAX}: positions are int32, as llama.cpp's")
        for s in ids:
            e = expect[s]
            if e is not None and mrope and p < e - (rows or not held[s]):
                raise BatchError(f"token {i} of seq {s} has position {p}, but " + _mrope_floor(e - 1, held[s], rows))
            if e is not None and not mrope and p != e:
                raise BatchError(f"token {i} of seq {s} has position {p}, but the sequence continues at {e} "
                                 f"(positions must be consecutive per sequence)")
            expect[s], held[s] = p + 1, False
        pos.append(p)
    return np.array(pos, dtype=np.int64)


def _mrope_floor(last: int, held: bool, rows: bool) -> str:
    """Why an M-RoPE position is too low, after ``last`` (held by the memory, or given earlier in the batch)."""
    if not held:
        return f"the sequence is at {last} in this batch: M-RoPE positions may repeat or grow, not go back"
    if rows:
        return f"the sequence holds position {last}: M-RoPE rows may share it or go on, not go back"
    return f"the sequence continues at {last + 1} or later: M-RoPE text follows the last position held, {last}"


def _ubatch(batch: Batch, pos: np.ndarray, idx: np.ndarray | slice) -> UBatch:
    """The tokens of ``batch`` at indices ``idx`` (or in a slice of it: a consecutive chunk, taken without numpy's
    fancy indexing), in that order."""
    seq_ids = batch.seq_ids[idx] if isinstance(idx, slice) else [batch.seq_ids[i] for i in idx]
    rows = None if batch.embd is None else batch.embd[idx]
    sections = None
    if batch.sections > 1:
        sections = np.ascontiguousarray(batch.pos.reshape(batch.sections, len(batch))[:, idx], dtype=np.int32)
    return UBatch((batch.tokens if rows is not None else batch.tokens[idx]).astype(np.int32),
                  pos[idx].astype(np.int32), seq_ids, np.flatnonzero(batch.output[idx]).astype(np.int32),
                  np.arange(idx.start, idx.stop) if isinstance(idx, slice) else idx, rows, sections)


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
