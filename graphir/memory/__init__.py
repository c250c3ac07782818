"""The memory interface: how attention (or recurrent state) meets what a context keeps between ubatches.

Every memory kind builds its part of the graph through the same small interface, so architectures stay
ignorant of caches and caches stay ignorant of architectures. Kinds that cannot serve a builder request
(MLA, recurrent state) refuse it with a clear error rather than building something wrong.

At run time a memory places each ubatch (``prepare`` simulates all placements first and mutates nothing,
``apply`` commits one), feeds the graph inputs it declared (indices, masks, buffers), and answers position
queries. ``snapshot``/``restore`` let a context undo a ubatch whose computation failed.

The user-facing half is llama.cpp's ``llama_memory_*`` API: ``clear``, the sequence operations ``seq_rm``,
``seq_cp``, ``seq_keep``, ``seq_add``, ``seq_div``, ``seq_pos_min``/``seq_pos_max``, ``can_shift`` and
``update`` (which materialises pending position edits), plus ``clone``. Range conventions are llama.cpp's:
positions ``[p0, p1)`` with ``p0 < 0`` meaning 0 and ``p1 < 0`` meaning +infinity; ``seq < 0`` means any
sequence (``seq_rm`` only). A kind that cannot do one of these raises :class:`GraphirError` saying so.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from graphir.batch import UBatch
from graphir.dims import Dim, DimDecl
from graphir.errors import GraphError, GraphirError
from graphir.hparams import HParams
from graphir.ir import Node

if TYPE_CHECKING:
    from graphir.builder import GraphBuilder


class Memory:
    """Base of all memory kinds. ``kind`` is the name users pick a context by."""

    kind: str = ""
    phases: tuple[str, ...] = ("prefill", "decode")
    keeps_cells: bool = False  # CellMemory: cells that survive between decodes (and go into saved states)
    split: str = "simple"  # how batches are cut into ubatches for this kind: simple | equal | seq (graphir.batch)

    def __init__(self, hp: HParams):
        self.hp = hp

    @classmethod
    def for_context(cls, hp: HParams, *, n_ctx: int, n_seq_max: int, type_k: str, type_v: str,
                    unified: bool) -> Memory:
        """This kind's memory for a context of these parameters (each kind takes what it uses)."""
        return cls(hp)

    def layout(self) -> dict[str, Any]:
        """What must agree for two memories (or a memory and a saved state) to be interchangeable."""
        return {"kind": self.kind}

    def refuse(self, batch: Any, pos: np.ndarray, n_ctx: int, n_ubatch: int) -> str | None:
        """Why this kind cannot take a (validated) batch whose tokens have positions ``pos``, or None: checked
        before anything runs, so a refused batch changes nothing."""
        return None

    def bind_shift(self, shiftable: bool, run: Any) -> None:
        """How to re-rope cached K (a KV cache's K-shift); memories without rotated K ignore it."""

    def ubatch_dims(self) -> tuple[Dim, Dim | None, list[DimDecl]]:
        """A prefill ubatch's token count, its tokens per sequence when split equally (else None), and the dims
        they name. Simple splits: any tokens from any sequences."""
        tok = DimDecl("n_tokens", 1, None, "tokens in the ubatch")
        return tok.sym, None, [tok]

    def dims(self) -> list[DimDecl]:
        """The symbolic sizes this memory adds to a graph (e.g. ``n_kv``)."""
        return []

    def build_attn(self, b: GraphBuilder, q: Node, k: Node, v: Node, *, kq_scale: float) -> Node:
        raise GraphError(f"memory kind '{self.kind}' has no attention")

    def build_attn_mla(self, b: GraphBuilder, *args: Any, **kw: Any) -> Node:
        raise GraphError(f"memory kind '{self.kind}' does not implement MLA attention (latent KV cache)")

    def build_rs(self, b: GraphBuilder, which: str) -> Node:
        raise GraphError(f"memory kind '{self.kind}' holds no recurrent state")

    def store_rs(self, b: GraphBuilder, which: str, states: Node) -> None:
        raise GraphError(f"memory kind '{self.kind}' holds no recurrent state")

    # ---- run time -------------------------------------------------------------------------------------

    def next_pos(self, n_seq_max: int) -> list[int]:
        """Per sequence, the position its next token must have."""
        return [self.seq_pos_max(s) + 1 for s in range(n_seq_max)]

    def seq_pos_max(self, seq: int) -> int:
        return -1

    def seq_pos_min(self, seq: int) -> int:
        return -1

    def prepare(self, ubatches: list[UBatch]) -> list[Any]:
        """Where each ubatch would go, computed without changing anything; raises CacheFullError."""
        return [None] * len(ubatches)

    def apply(self, ub: UBatch, plan: Any) -> dict[str, Any]:
        """Commit one ubatch's placement; return the graph inputs (arrays) and dim bindings (ints) it needs."""
        raise NotImplementedError

    def buffers(self) -> dict[str, np.ndarray]:
        """Graph inputs that persist between ubatches (cache tensors), by input name."""
        return {}

    def snapshot(self, plans: list[Any]) -> Any:
        """What :meth:`restore` needs to undo applying ``plans`` (from :meth:`prepare`), should a ubatch fail."""
        return None

    def restore(self, snap: Any) -> None:
        pass

    # ---- the user-facing memory API (llama.cpp's llama_memory_*) ---------------------------------------

    def _cannot(self, what: str) -> GraphirError:
        return GraphirError(f"memory kind '{self.kind}' cannot {what}: it keeps no cells between decodes")

    def clear(self, data: bool = True) -> None:
        """Forget everything; with ``data`` also zero the buffers."""
        raise self._cannot("clear")

    def seq_rm(self, seq: int, p0: int = -1, p1: int = -1) -> bool:
        """Remove ``seq``'s entries with position in [p0, p1) (seq < 0: every sequence). True on success."""
        raise self._cannot("seq_rm")

    def seq_cp(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None:
        """Make ``src``'s entries with position in [p0, p1) belong to ``dst`` as well."""
        raise self._cannot("seq_cp")

    def seq_keep(self, seq: int) -> None:
        """Remove everything that does not belong to ``seq``."""
        raise self._cannot("seq_keep")

    def seq_add(self, seq: int, p0: int, p1: int, delta: int) -> None:
        """Add ``delta`` to the positions of ``seq``'s entries in [p0, p1); entries pushed below 0 are removed."""
        raise self._cannot("seq_add")

    def seq_div(self, seq: int, p0: int, p1: int, d: int) -> None:
        """Integer-divide the positions of ``seq``'s entries in [p0, p1) by ``d``."""
        raise self._cannot("seq_div")

    def can_shift(self) -> bool:
        """Whether position edits (seq_add/seq_div) can be materialised."""
        return False

    def update(self) -> bool:
        """Apply pending maintenance (K-shift); True if anything was done. Contexts call it before decoding."""
        return False

    def clone(self) -> Memory:
        """A deep copy (cells and buffers), compatible with the same contexts."""
        raise self._cannot("clone")


class CellMemory(Memory):
    """A memory of cells, each with a position (``pos``, -1 empty) and a set of sequences (bit s of ``seq``)."""

    keeps_cells = True

    pos: np.ndarray
    seq: np.ndarray
    n_seq_max: int

    def _holds(self, seq: int) -> np.ndarray:
        return (self.seq >> np.uint64(seq)) & np.uint64(1) == 1

    def cell_rows(self, il: int) -> tuple[np.ndarray, np.ndarray]:
        """Layer il's two per-cell buffers (what a saved state holds per cell): K and V, or r and s states."""
        raise NotImplementedError

    def cell_range(self, seq: int) -> tuple[int, int]:
        """The cells sequence ``seq`` may occupy, as [lo, hi) (all of them unless the kind partitions cells)."""
        return 0, len(self.pos)

    def check_saved(self, cells: np.ndarray, seqs: np.ndarray) -> str | None:
        """Why saved cells (indices, sequence sets) cannot be this memory's, or None (the kind's own rules)."""
        return None

    def restored(self) -> None:
        """After a saved state was written into the cells: rebuild what is derived from them."""

    def _check_seq(self, seq: int, what: str) -> None:
        if not 0 <= seq < self.n_seq_max:
            raise GraphirError(f"{what}: seq id {seq} is outside [0, {self.n_seq_max}) (n_seq_max={self.n_seq_max})")
