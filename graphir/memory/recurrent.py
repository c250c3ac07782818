"""Recurrent state (llama.cpp's ``llama_memory_recurrent``): one cell per sequence holds its whole history.

A cell keeps, per layer, a rolling state ``r`` (Mamba's last d_conv-1 conv columns, RWKV's token shifts) and
a recurrent state ``s`` (the SSM state, the WKV matrices), plus the position of the last token it absorbed
and the set of sequences that share it. There are ``max(1, n_seq_max) + 1`` cells, one more than llama.cpp's,
so that a sequence advancing writes its new states into a free cell beside the old one, which it then releases:
a failed or interrupted decode leaves the old states where they were, with nothing copied first (copying them
took 38 us of a Mamba-130M generation step, 90 us of RWKV6-1.6B's). A sequence lives in at most one cell, and
sequences forked with ``seq_cp`` share one until either advances (copy-on-write).

Graph side: a ubatch holds ``n_seqs`` sequences of ``n_seq_tokens`` tokens each (an equal split). Each layer
gathers its sequences' states from the cells ``rs_src`` and writes the new states to the cells ``rs_dst``.
The two differ whenever a free cell is at hand (the step above; copy-on-write also needs one); a sequence
without state reads a fresh cell that the memory zeroed. The state writes are graph outputs (``blk.N.rs_r`` /
``blk.N.rs_s``), so snapshots and hashes cover them.

States cannot be rolled back: ``seq_rm`` that would cut into a sequence's history returns False and
changes nothing; position edits only relabel the cell (nothing in the state depends on positions).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from graphir.batch import POS_MAX, UBatch
from graphir.graph.dims import Dim, DimDecl
from graphir.errors import BatchError, CacheFullError, GraphirError
from graphir.graph.emit import Emitter
from graphir.graph.ir import Node
from graphir.memory import POS_INF, CellMemory
from graphir.memory.inputs import RecurrentState, StateInputs
from graphir.memory.layers import ContextParams, LayerNeeds, Recurrent

N_RS = DimDecl("n_rs", 1, None, "state cells: one per sequence (n_seq_max)")
N_SEQ_TOKENS = DimDecl("n_seq_tokens", 1, None, "tokens per sequence in the ubatch (equal split)")
N_SEQS = DimDecl("n_seqs", 1, N_RS.sym, "sequences in the ubatch")


class RecurrentMemory(CellMemory):
    kind = "recurrent"
    serves = frozenset({"recurrent"})
    requires = frozenset({"recurrent"})
    # every sequence of a ubatch advances by the same number of tokens; the sequences of a ubatch have consecutive
    # ids (llama.cpp's llama_memory_recurrent splits with split_equal(sequential))
    split = "sequential"
    buffer_roles = frozenset({"rs_r", "rs_s"})

    def __init__(self, needs: LayerNeeds, params: ContextParams = ContextParams(),
                 layer_kinds: frozenset[str] | None = None):
        super().__init__(needs, params, layer_kinds)
        self.size = max(1, self.n_seq_max) + 1
        self.pos = np.full(self.size, -1, dtype=np.int64)  # last absorbed position; -1: empty cell
        self.seq = np.zeros(self.size, dtype=np.uint64)  # bit s: sequence s's state is this cell
        self.widths: dict[int, Recurrent] = self.need  # type: ignore[assignment]
        self._buffers = self._allocate()

    def buffer_shapes(self) -> dict[str, tuple[tuple[int, ...], Any]]:
        """The rolling and the recurrent state of every cell, per served layer."""
        out: dict[str, tuple[tuple[int, ...], Any]] = {}
        for il, w in self.widths.items():
            out[f"blk.{il}.rs_r"] = (self.size, w.n_embd_r), np.float32
            out[f"blk.{il}.rs_s"] = (self.size, w.n_embd_s), np.float32
        return out

    # ---- graph side -------------------------------------------------------------------------------------

    def ubatch_dims(self) -> tuple[Dim, Dim | None, list[DimDecl]]:
        return N_SEQ_TOKENS.sym * N_SEQS.sym, N_SEQ_TOKENS.sym, [N_SEQ_TOKENS, N_SEQS]

    def dims(self) -> list[DimDecl]:
        return [N_RS]

    def sizes(self) -> dict[str, int]:
        return {N_RS.name: self.size}

    def _cache(self, e: Emitter, il: int, which: str) -> Node:
        w = self.widths.get(il)
        if w is None:
            raise GraphirError(f"layer {il} keeps no recurrent state in this memory")
        width = w.n_embd_r if which == "r" else w.n_embd_s
        return e.input(f"rs_{which}", "f32", (width, N_RS.sym), scoped=True)

    def _state(self, e: Emitter, il: int, r: RecurrentState) -> StateInputs:
        """The layer's buffer of one kind of state and the cells the ubatch's sequences read or write."""
        cells = e.input("rs_dst", "i64", (e.n_seqs,)) if r.write else e.input("rs_src", "i32", (e.n_seqs,))
        return StateInputs(self._cache(e, il, r.which), cells)

    answers = {RecurrentState: _state}

    # ---- run time -------------------------------------------------------------------------------------

    def _cell_of(self, seq: int, masks: list[int] | None = None) -> int:
        """The cell holding seq's state (in ``masks``, the cells' sequence sets, default the memory's), or -1;
        over Python ints (a few cells: numpy's calls cost more than the loop, and every decode asks)."""
        bit = 1 << seq
        return next((c for c, m in enumerate(self.seq.tolist() if masks is None else masks) if m & bit), -1)

    def seq_pos_max(self, seq: int) -> int:
        c = self._cell_of(seq)
        return int(self.pos[c]) if c >= 0 else -1

    seq_pos_min = seq_pos_max  # one state per sequence: its only position is its last

    def prepare(self, ubatches: list[UBatch]) -> list[Any]:
        """Per ubatch and sequence set: (read cell, write cell, zero it first?), simulated on copies. A set that
        owns its cell advances it in place, a new or shared one takes a free cell; then each set advancing in place
        moves to a cell that was free before the ubatch and still is (releasing its own), so that the ubatch
        writes no cell another ubatch of the batch, or the memory before it, still needs."""
        pos, seq, plans = self.pos.tolist(), self.seq.tolist(), []   # Python ints: a few cells, every decode
        for k, ub in enumerate(ubatches):
            sets = list(dict.fromkeys(ub.seq_ids))  # in ubatch order, each n_seq_tokens tokens long
            n = len(ub) // len(sets)
            was_free = [p < 0 for p in pos]
            plan = []
            for j, ids in enumerate(sets):
                mask = sum(1 << s for s in ids)
                cells = {self._cell_of(s, seq) for s in ids}
                if len(cells) > 1:
                    raise BatchError(f"ubatch {k}: sequences {list(ids)} share tokens but hold different states; "
                                     f"seq_cp one into the others first")
                src = cells.pop()
                if src >= 0 and seq[src] == mask:
                    dst, zero = src, False  # the set owns its cell
                else:
                    dst = next((c for c, p in enumerate(pos) if p < 0), -1)
                    if dst < 0:
                        raise CacheFullError(f"recurrent state full: ubatch {k} needs a free cell for sequences "
                                             f"{list(ids)}, all {self.size} cells are in use")
                    zero = src < 0
                    if zero:
                        src = dst
                    else:
                        seq[src] &= ~mask  # copy-on-write: the others keep the old cell
                seq[dst] = mask
                pos[dst] = int(ub.pos[(j + 1) * n - 1])
                plan.append([src, dst, zero])
            spare = [c for c, p in enumerate(pos) if p < 0 and was_free[c]]
            for step in plan:
                src, dst, zero = step
                if src == dst and not zero and spare:
                    step[1] = new = spare.pop(0)
                    seq[new], pos[new], seq[src], pos[src] = seq[src], pos[src], 0, -1
            plans.append([tuple(step) for step in plan])
        return plans

    def apply(self, ub: UBatch, plan: Any) -> dict[str, Any]:
        sets = list(dict.fromkeys(ub.seq_ids))
        n = len(ub) // len(sets)
        for j, ((src, dst, zero), ids) in enumerate(zip(plan, sets)):
            mask = np.uint64(sum(1 << s for s in ids))
            if src != dst:  # the set leaves the cell it read: the others keep it (copy-on-write), or it is empty
                self.seq[src] &= ~mask
                if self.seq[src] == 0:
                    self.pos[src] = -1
            if zero:
                for buf in self._buffers.values():
                    buf[dst] = 0
            self.seq[dst] = mask
            self.pos[dst] = int(ub.pos[(j + 1) * n - 1])
        return {"rs_src": np.array([p[0] for p in plan], np.int32), "rs_dst": np.array([p[1] for p in plan], np.int64),
                "n_seq_tokens": n, "n_seqs": len(sets)}

    def snapshot(self, plans: list[Any]) -> Any:
        """Cells, and the state rows the plans will overwrite that hold a sequence's state now: none where every
        write goes to a free cell (a generation step's)."""
        cells = sorted({dst for plan in plans for _, dst, _ in plan if self.pos[dst] >= 0})
        return self.pos.copy(), self.seq.copy(), cells, {k: v[cells] for k, v in self._buffers.items()} if cells else {}

    def restore(self, snap: Any) -> None:
        self.pos, self.seq = snap[0].copy(), snap[1].copy()
        for k, rows in snap[3].items():
            self._buffers[k][snap[2]] = rows

    # ---- the memory API -----------------------------------------------------------------------------

    def _empty(self, cells: np.ndarray) -> None:
        self.pos[cells], self.seq[cells] = -1, 0

    def clear(self, data: bool = True) -> None:
        self._empty(np.arange(self.size))
        if data:
            for b in self._buffers.values():
                b[...] = 0

    def can_seq_rm(self, seq: int, p0: int = -1, p1: int = -1) -> bool:
        """Only where [p0, p1) covers a sequence's last position or lies beyond it: a state cannot undo part
        of its history."""
        lo, hi = max(int(p0), 0), POS_INF if p1 < 0 else int(p1)
        if seq < 0:
            return lo == hi or (lo, hi) == (0, POS_INF)
        self._check_seq(seq, "seq_rm")
        c = self._cell_of(seq)
        last = int(self.pos[c]) if c >= 0 else -1
        return c < 0 or not (0 < lo <= last or 0 < hi <= last)

    def seq_rm(self, seq: int, p0: int = -1, p1: int = -1) -> bool:
        """Forget ``seq`` when [p0, p1) covers its last position or lies beyond it; False (nothing changes)
        when the range would cut into its history."""
        if not self.can_seq_rm(seq, p0, p1):
            return False
        lo, hi = max(int(p0), 0), POS_INF if p1 < 0 else int(p1)
        if seq < 0:
            self._empty(np.flatnonzero((self.pos >= lo) & (self.pos < hi)))
            return True
        c = self._cell_of(seq)
        if c < 0:
            return True
        last = int(self.pos[c])
        if lo <= last < hi:
            self.seq[c] &= ~np.uint64(1 << seq)
            if self.seq[c] == 0:
                self._empty(np.array([c]))
        return True

    def seq_cp(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None:
        """``dst`` continues from ``src``'s state (the whole state: positions cannot select part of it)."""
        if not self._copy_needed(src, dst):
            return
        self.seq_rm(dst, -1, -1)
        c = self._cell_of(src)
        if c >= 0:
            self.seq[c] |= np.uint64(1 << dst)

    def seq_keep(self, seq: int) -> None:
        self._check_seq(seq, "seq_keep")
        mine = self._holds(seq)
        self.seq[mine] = np.uint64(1 << seq)
        self._empty(np.flatnonzero(~mine))

    def _relabel(self, seq: int, p0: int, p1: int, what: str) -> int:
        self._check_seq(seq, what)
        c = self._cell_of(seq)
        lo, hi = max(int(p0), 0), POS_INF if p1 < 0 else int(p1)
        return c if c >= 0 and lo <= self.pos[c] < hi else -1

    def seq_add(self, seq: int, p0: int, p1: int, delta: int) -> None:
        c = self._relabel(seq, p0, p1, "seq_add")
        if c >= 0:
            self._check_move("seq_add", self.pos[c:c + 1], delta)
            self.pos[c] += delta

    def seq_div(self, seq: int, p0: int, p1: int, d: int) -> None:
        if d <= 0:
            raise GraphirError(f"seq_div: divisor {d} must be positive")
        c = self._relabel(seq, p0, p1, "seq_div")
        if c >= 0:
            self.pos[c] //= min(d, POS_MAX + 1)

    def can_shift(self) -> bool:
        return True  # positions are labels: shifting them needs no data change

    def layer_rows(self, il: int) -> tuple[np.ndarray, ...]:
        return self._buffers[f"blk.{il}.rs_r"], self._buffers[f"blk.{il}.rs_s"]

    def check_saved(self, cells: np.ndarray, fields: dict[str, np.ndarray]) -> str | None:
        seqs = fields["seq"]
        shared = (seqs[:, None] & seqs[None, :]) != 0
        if shared[~np.eye(len(seqs), dtype=bool)].any():
            return "a sequence has more than one recurrent state cell"
        return None

    def layout(self) -> dict[str, Any]:
        return {"kind": self.kind, "n_seq_max": self.n_seq_max}
