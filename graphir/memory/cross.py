"""What an encoder-decoder's decoder keeps: its self-attention KV cache and the encoder output it reads.

llama.cpp keeps the output of the last ``llama_encode`` in the context (``llama_cross``: the rows and, per
encoded token, the set of sequences it belongs to) and every decoder graph takes it as an input, computing
each cross-attention layer's K and V from it and masking by sequence. Here that output is one more part of
the decoder's memory (:class:`EncoderOutput`), serving the layers' ``cross`` needs, beside the KV cache
serving their self-attention (:class:`CrossMemory`, kind ``cross``).

The encoder output belongs to sequences, not to positions: encoding a batch replaces the output of the
sequences it holds and keeps the others' (so sequences can be encoded apart, or together as llama.cpp's
``seq_ids_enc`` allows); ``seq_cp`` gives the destination the source's output, ``seq_keep`` drops the
others', ``clear`` drops all, and position edits (``seq_rm``, ``seq_add``, ``seq_div``) leave it alone. A
decode whose tokens belong to a sequence without encoder output is refused before anything changes.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import numpy as np

from graphir.errors import GraphirError, StateError
from graphir.graph.dims import DimDecl
from graphir.graph.emit import Emitter
from graphir.graph.ir import Node
from graphir.memory import Commit, Memory
from graphir.memory.composite import Composite
from graphir.memory.inputs import CrossMask, CrossRows
from graphir.memory.io import Reader, Writer
from graphir.memory.kv import KVCache
from graphir.memory.layers import ContextParams, LayerNeeds
from graphir.batch import UBatch

N_ENC = DimDecl("n_enc", 1, None, "encoder outputs held, of every sequence")


def seq_mask(seq_ids: Any) -> np.ndarray:
    """Per token, its sequence ids as a bit set."""
    return np.array([sum(1 << int(s) for s in ids) for ids in seq_ids], dtype=np.uint64)


class EncoderOutput(Memory):
    """Rows of encoder output (``rows`` [n_enc, n_embd]) with the set of sequences each belongs to (``seq``)."""

    kind = "enc"
    serves = frozenset({"cross"})
    keeps_cells = True
    positions = False
    cell_fields = ("seq", "rows")  # what it holds per encoded token

    def __init__(self, needs: LayerNeeds, params: ContextParams = ContextParams(),
                 layer_kinds: frozenset[str] | None = None):
        super().__init__(needs, params, layer_kinds)
        widths = {n.n_embd for n in self.need.values()}  # type: ignore[union-attr]
        if len(widths) > 1:
            raise GraphirError(f"cross-attention layers read encoder outputs of different widths {sorted(widths)}")
        self.n_embd = widths.pop() if widths else 0
        self.n_seq_max = params.n_seq_max
        self.rows = np.zeros((0, self.n_embd), np.float32)
        self.seq = np.zeros(0, np.uint64)

    def layout(self) -> dict[str, Any]:
        return {"kind": self.kind, "n_embd": self.n_embd, "n_seq_max": self.n_seq_max}

    def dims(self) -> list[DimDecl]:
        return [N_ENC]

    # ---- graph side ------------------------------------------------------------------------------------

    def _rows(self, e: Emitter, il: int, r: CrossRows) -> Node:
        return e.input("cross_embd", "f32", (self.n_embd, N_ENC.sym))

    def _mask(self, e: Emitter, il: int, r: CrossMask) -> Node:
        # NOTE: 0 where the query token and the encoder token share a sequence, else -inf (llama.cpp's rule)
        return e.input("cross_mask", "f32", (N_ENC.sym, e.n_tokens), by="shared sequence")

    answers = {CrossRows: _rows, CrossMask: _mask}

    # ---- run time -------------------------------------------------------------------------------------

    def held(self, seq: int) -> np.ndarray:
        return (self.seq >> np.uint64(seq)) & np.uint64(1) == 1

    def refuse(self, batch: Any, pos: np.ndarray) -> str | None:
        for i, ids in enumerate(batch.seq_ids):
            for s in ids:
                if not self.held(int(s)).any():
                    return (f"token {i} belongs to seq {int(s)}, which has no encoder output: encode the sequence "
                            f"first (ctx.encode)")
        return None

    def apply(self, ub: UBatch, plan: Any) -> dict[str, Any]:
        shared = (seq_mask(ub.seq_ids)[:, None] & self.seq[None, :]) != 0
        return {"cross_embd": self.rows, "cross_mask": np.where(shared, np.float32(0), np.float32(-np.inf)),
                N_ENC.name: len(self.rows)}

    def store(self, rows: np.ndarray, seq_ids: Any) -> None:
        """An encode's output: its sequences' rows replace whatever those sequences held."""
        sets = seq_mask(seq_ids)
        replaced = np.uint64(np.bitwise_or.reduce(sets)) if len(sets) else np.uint64(0)
        kept = self.seq & ~replaced
        self.rows = np.concatenate([self.rows[kept != 0], np.asarray(rows, np.float32)])
        self.seq = np.concatenate([kept[kept != 0], sets])

    def _prune(self) -> None:
        """Forget rows no sequence holds any more."""
        keep = self.seq != 0
        self.rows, self.seq = self.rows[keep], self.seq[keep]

    # ---- the memory API: by sequence; position edits do not concern it ---------------------------------

    def clear(self, data: bool = True) -> None:
        self.rows, self.seq = self.rows[:0], self.seq[:0]

    def can_seq_rm(self, seq: int, p0: int = -1, p1: int = -1) -> bool:
        return True

    def seq_rm(self, seq: int, p0: int = -1, p1: int = -1) -> bool:
        return True

    def seq_cp(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None:
        if src == dst:
            return
        self.seq &= ~np.uint64(1 << dst)
        self.seq[self.held(src)] |= np.uint64(1 << dst)
        self._prune()

    def seq_keep(self, seq: int) -> None:
        self.seq &= np.uint64(1 << seq)
        self._prune()

    def seq_add(self, seq: int, p0: int, p1: int, delta: int) -> None:
        pass

    def seq_div(self, seq: int, p0: int, p1: int, d: int) -> None:
        pass

    def can_shift(self) -> bool:
        return True

    def clone(self) -> EncoderOutput:
        new = copy.copy(self)
        new.rows, new.seq = self.rows.copy(), self.seq.copy()
        return new

    # ---- saved state ----------------------------------------------------------------------------------

    def state_write(self, w: Writer, seq: int | None) -> None:
        sel = np.ones(len(self.seq), bool) if seq is None else self.held(seq)
        w.s(json.dumps(self.layout(), sort_keys=True))
        w.u("I", int(sel.sum()))
        w.arr(self.seq[sel] if seq is None else np.full(int(sel.sum()), 1 << seq, np.uint64), np.uint64)
        w.arr(self.rows[sel], np.float32)

    def state_read(self, r: Reader, dst: int | None) -> Commit:
        theirs = r.json("encoder output layout")
        ours = self.layout()
        for k in ours if dst is None else ("kind", "n_embd"):
            if theirs.get(k) != ours[k]:
                raise StateError(f"state has encoder output {k}={theirs.get(k)!r}, this context has {k}={ours[k]!r}")
        n = r.u("I", "encoder output count")
        seqs = r.arr(np.uint64, n, "encoder output sequences")
        rows = r.arr(np.float32, n * self.n_embd, "encoder output rows").reshape(n, self.n_embd)
        if n and ((seqs == 0).any() or (seqs >> np.uint64(self.n_seq_max)).any()):
            raise StateError(f"state data is malformed: an encoder output has no sequence or one >= "
                             f"n_seq_max={self.n_seq_max}")

        def commit() -> None:
            if dst is None:
                self.rows, self.seq = rows.copy(), seqs.copy()
            else:
                self.store(rows, [[dst]] * n)
                if not n:  # an empty saved sequence replaces dst's output with nothing
                    self.seq &= ~np.uint64(1 << dst)
                    self._prune()
        return commit


class CrossMemory(Composite):
    """An encoder-decoder's decoder memory: self-attention in a KV cache, cross-attention over the encoder
    output (see the module docstring for what each memory operation does to the latter)."""

    kind = "cross"
    serves = frozenset({"full", "cross"})
    requires = frozenset({"cross"})

    def make_parts(self, needs: LayerNeeds, params: ContextParams) -> dict[str, Memory]:
        return {"self": KVCache(needs, params, frozenset({"full"})), "enc": EncoderOutput(needs, params)}

    @property
    def encoder_output(self) -> EncoderOutput:
        return self.parts["enc"]  # type: ignore[return-value]
