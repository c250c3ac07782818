"""The memory interface: how attention (or recurrent state) meets what a context keeps between ubatches.

A memory serves some layers of a model: those whose need (:mod:`graphir.memory.layers`) is of a kind it
``serves`` (and that a composite routes to it). The builder asks it for each layer's inputs with one request
per need (:meth:`Memory.input_for`, :mod:`graphir.memory.inputs`), so each layer gets the cache, mask and
inputs of its own kind, and does the maths over them itself; architectures stay ignorant of caches and
caches of architectures and of the builder. A request a memory cannot serve is refused with a clear error.

At run time a memory places each ubatch (``prepare`` simulates all placements first and mutates nothing,
``apply`` commits one), feeds the graph inputs it declared (indices, masks, buffers), and answers position
queries. ``snapshot``/``restore`` let a context undo a ubatch whose computation failed. Each kind writes and
reads its own section of a saved state (``state_write``/``state_read``); :mod:`graphir.running.state` only frames it.

The user-facing half is llama.cpp's ``llama_memory_*`` API: ``clear``, the sequence operations ``seq_rm``,
``seq_cp``, ``seq_keep``, ``seq_add``, ``seq_div``, ``seq_pos_min``/``seq_pos_max``, ``can_shift`` and
``update`` (which materialises pending position edits), plus ``clone``. Range conventions are llama.cpp's:
positions ``[p0, p1)`` with ``p0 < 0`` meaning 0 and ``p1 < 0`` meaning +infinity; ``seq < 0`` means any
sequence (``seq_rm`` only). A kind that cannot do one of these raises :class:`GraphirError` saying so.
"""

from __future__ import annotations

import copy
import json
from typing import Any, Callable, ClassVar

import numpy as np

from graphir.batch import POS_MAX, UBatch
from graphir.graph.dims import Dim, DimDecl
from graphir.errors import GraphError, GraphirError, StateError
from graphir.graph.emit import Emitter
from graphir.graph.ir import Node
from graphir.memory.inputs import R, Request
from graphir.memory.io import Reader, Writer
from graphir.memory.layers import ContextParams, LayerNeeds, Need, needs_of
from graphir.memory.reuse import reads_of

Commit = Callable[[], None]
"""What a checked saved section does to the memory: called only once every part of the state has parsed."""

RunGraph = Callable[[tuple[Any, ...], Callable[[], Any], dict[str, int], dict[str, np.ndarray]], Any]
"""run(key, make_graph, env, feeds): compile (once per key) and run a graph of the memory's own, e.g. the
K-shift; the context supplies it (``bind_shift``), so memories never name a backend."""


class Memory:
    """Base of all memory kinds. ``kind`` is the name users pick a context by."""

    kind: str = ""
    phases: tuple[str, ...] = ("prefill", "decode")
    serves: frozenset[str] = frozenset()  # the kinds of layer (graphir.memory.layers) this memory can hold
    requires: frozenset[str] = frozenset()  # ... of which a model must have these for the registry to pick it
    keeps_cells: bool = False  # cells that survive between decodes (and go into saved states)
    split: str = "simple"  # how batches are cut into ubatches for this kind: simple | equal | seq (graphir.batch)
    positions: bool = True  # its entries have positions (seq_pos_min/max answer for it)
    buffer_roles: frozenset[str] = frozenset()  # the roles of the graph inputs that are its per-layer buffers
    # the requests (graphir.memory.inputs) it answers, by type: what declares a layer's inputs of that kind
    answers: ClassVar[dict[type[Request[Any]], Callable[[Any, Emitter, int, Any], Any]]] = {}

    def __init__(self, needs: LayerNeeds, params: ContextParams = ContextParams(),
                 layer_kinds: frozenset[str] | None = None):
        """Serve the layers of ``needs`` whose kind is in ``layer_kinds`` (default: every kind it serves)."""
        kinds = self.serves if layer_kinds is None else layer_kinds
        self.needs, self.params = needs, params
        # per served layer, the need this memory keeps for it (a layer may have others, kept by other parts)
        self.need: dict[int, Need] = {il: n for il, entry in enumerate(needs) for n in needs_of(entry) if n.kind in kinds}
        # the served layers that keep rows of their own (the others read another layer's: graphir.memory.reuse)
        self.layers = tuple(il for il, n in self.need.items() if reads_of(n) is None)

    @classmethod
    def fits(cls, layer_kinds: set[str]) -> bool:
        """Whether this kind can be the whole memory of a model with these kinds of layer."""
        return layer_kinds <= cls.serves and cls.requires <= layer_kinds

    def layout(self) -> dict[str, Any]:
        """What must agree for two memories (or a memory and a saved state) to be interchangeable."""
        return {"kind": self.kind}

    def refuse(self, batch: Any, pos: np.ndarray) -> str | None:
        """Why this kind cannot take a (validated) batch whose tokens have positions ``pos``, or None: checked
        before anything runs, so a refused batch changes nothing."""
        return None

    def bind_shift(self, plan: tuple[bool, dict[int, Node]], run: RunGraph) -> None:
        """The compiled graph's rope plan (:func:`graphir.memory.kv.rope_plan`) and how to run a K-shift graph;
        memories without rotated K ignore it."""

    def ubatch_dims(self) -> tuple[Dim, Dim | None, list[DimDecl]]:
        """A prefill ubatch's token count, its tokens per sequence when split equally (else None), and the dims
        they name. Simple splits: any tokens from any sequences."""
        tok = DimDecl("n_tokens", 1, None, "tokens in the ubatch")
        return tok.sym, None, [tok]

    def dims(self) -> list[DimDecl]:
        """The symbolic sizes this memory adds to a graph (e.g. ``n_kv``)."""
        return []

    def sizes(self) -> dict[str, int]:
        """The values of the dims its buffers are sized by (e.g. ``n_ctx``, ``n_ctx_swa``), for its params."""
        return {}

    def input_for(self, e: Emitter, il: int, request: Request[R]) -> R:
        """Layer il's inputs for one of its needs, declared through ``e`` and returned as data (a composite
        asks the part keeping that need of the layer); refused, naming the layer, when this memory keeps
        nothing of that kind for it."""
        answer = self.answers.get(type(request))
        if answer is None:
            raise GraphError(request.refusal(self.kind, il))
        return answer(self, e, il, request)  # type: ignore[no-any-return]

    # ---- run time -------------------------------------------------------------------------------------

    def last_pos(self, seq: int) -> int:
        """The last position held for a sequence (-1: none), which its next batch must continue from."""
        return self.seq_pos_max(seq)

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

    def buffer_shapes(self) -> dict[str, tuple[tuple[int, ...], Any]]:
        """The (shape, dtype) of each buffer its params call for, allocated or not (``ContextParams.buffers``)."""
        return {}

    def nbytes(self) -> int:
        """What its buffers take, known before they are allocated (a context checks it fits first)."""
        return sum(int(np.prod(shape)) * np.dtype(dt).itemsize for shape, dt in self.buffer_shapes().values())

    def snapshot(self, plans: list[Any]) -> Any:
        """What :meth:`restore` needs to undo applying ``plans`` (from :meth:`prepare`), should a ubatch fail."""
        return None

    def restore(self, snap: Any) -> None:
        pass

    # ---- saved state ----------------------------------------------------------------------------------

    def state_write(self, w: Writer, seq: int | None) -> None:
        """Write this memory's section: everything it keeps (seq None) or what sequence ``seq`` owns."""
        raise StateError(f"memory kind '{self.kind}' keeps no state to save or load")

    def state_read(self, r: Reader, dst: int | None) -> Commit:
        """Parse and check a section :meth:`state_write` wrote (into sequence ``dst`` for a sequence state),
        changing nothing; return what installs it. Raises StateError naming what does not fit."""
        raise StateError(f"memory kind '{self.kind}' keeps no state to save or load")

    # ---- the user-facing memory API (llama.cpp's llama_memory_*) ---------------------------------------

    def _cannot(self, what: str) -> GraphirError:
        return GraphirError(f"memory kind '{self.kind}' cannot {what}: it keeps no cells between decodes")

    def clear(self, data: bool = True) -> None:
        """Forget everything; with ``data`` also zero the buffers."""
        raise self._cannot("clear")

    def can_seq_rm(self, seq: int, p0: int = -1, p1: int = -1) -> bool:
        """Whether :meth:`seq_rm` would succeed, answered without changing anything."""
        raise self._cannot("seq_rm")

    def seq_rm(self, seq: int, p0: int = -1, p1: int = -1) -> bool:
        """Remove ``seq``'s entries with position in [p0, p1) (seq < 0: every sequence). True on success;
        False, with nothing changed, where the memory cannot cut there."""
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


POS_INF = np.iinfo(np.int64).max
MAX_SEQ = 64  # sequence sets are uint64 bitmasks (llama.cpp allows 256)


class CellMemory(Memory):
    """A memory of cells, each with a position (``pos``, -1 empty) and a set of sequences (bit s of ``seq``),
    and per served layer some rows per cell (K and V, or the r and s states)."""

    keeps_cells = True
    cell_fields: tuple[str, ...] = ("pos", "seq")  # the per-cell arrays a saved state holds, beside the rows
    seq_layout: tuple[str, ...] = ("kind",)  # what a one-sequence state must share with the memory it loads into

    pos: np.ndarray
    seq: np.ndarray
    _buffers: dict[str, np.ndarray]

    def __init__(self, needs: LayerNeeds, params: ContextParams = ContextParams(),
                 layer_kinds: frozenset[str] | None = None):
        super().__init__(needs, params, layer_kinds)
        if not 1 <= params.n_seq_max <= MAX_SEQ:
            raise GraphirError(f"n_seq_max={params.n_seq_max} is outside [1, {MAX_SEQ}]")
        self.n_seq_max = params.n_seq_max

    def _holds(self, seq: int) -> np.ndarray:
        return (self.seq >> np.uint64(seq)) & np.uint64(1) == 1

    def buffers(self) -> dict[str, np.ndarray]:
        return self._buffers

    def _allocate(self) -> dict[str, np.ndarray]:
        """The zeroed buffers of :meth:`buffer_shapes`, unless the params ask for sizes only."""
        shapes = self.buffer_shapes() if self.params.buffers else {}
        return {k: np.zeros(shape, dt) for k, (shape, dt) in shapes.items()}

    def layer_rows(self, il: int) -> tuple[np.ndarray, ...]:
        """Layer il's per-cell buffers (what a saved state holds per cell): K and V, or r and s states."""
        raise NotImplementedError

    def cell_range(self, seq: int) -> tuple[int, int]:
        """The cells sequence ``seq`` may occupy, as [lo, hi) (all of them unless the kind partitions cells)."""
        return 0, len(self.pos)

    def check_saved(self, cells: np.ndarray, fields: dict[str, np.ndarray]) -> str | None:
        """Why saved cells, about to go to the cells ``cells`` with the per-cell ``fields``, cannot be this
        memory's, or None (the kind's own rules)."""
        return None

    def restored(self) -> None:
        """After a saved state was written into the cells: rebuild what is derived from them."""

    def saved_fields(self, version: int | None) -> tuple[str, ...]:
        """The cell fields a state of format ``version`` (None: the current one) holds, in order."""
        return self.cell_fields

    def older_fields(self, fields: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """All the cell fields, from those an older format saved (what it did not save, made from them)."""
        return fields

    def _check_seq(self, seq: int, what: str) -> None:
        if not 0 <= seq < self.n_seq_max:
            raise GraphirError(f"{what}: seq id {seq} is outside [0, {self.n_seq_max}) (n_seq_max={self.n_seq_max})")

    @staticmethod
    def _check_move(what: str, pos: np.ndarray, delta: int) -> None:
        """seq_add's delta checked before anything moves: no position may pass POS_MAX (llama_pos)."""
        if not -POS_MAX <= delta <= POS_MAX or (len(pos) and int(pos.max()) + delta > POS_MAX):
            raise GraphirError(f"{what}: moving positions up to {int(pos.max()) if len(pos) else -1} by {delta} "
                               f"leaves the positions a model takes, [0, {POS_MAX}]")

    def _copy_needed(self, src: int, dst: int) -> bool:
        """seq_cp's arguments checked; False when there is nothing to copy (src is dst)."""
        self._check_seq(src, "seq_cp")
        self._check_seq(dst, "seq_cp")
        return src != dst

    def _range(self, p0: int, p1: int) -> np.ndarray:
        """Non-empty cells with position in [p0, p1), llama.cpp's -1 conventions."""
        lo = max(int(p0), 0)
        hi = POS_INF if p1 < 0 else int(p1)
        return (self.pos >= 0) & (self.pos >= lo) & (self.pos < hi)

    def clone(self) -> CellMemory:
        new = copy.copy(self)
        for f in self.cell_fields:
            setattr(new, f, getattr(self, f).copy())
        new._buffers = {k: v.copy() for k, v in self._buffers.items()}
        return new

    def _full_layout(self) -> dict[str, Any]:
        rows = [[il, *(b.shape[1] for b in self.layer_rows(il))] for il in self.layers] if len(self.pos) else []
        return {**self.layout(), "layers": rows}

    # ---- saved state: the cells, their fields and their rows -------------------------------------------

    def state_write(self, w: Writer, seq: int | None) -> None:
        """Layout (JSON), cell count, cell indices, then each cell field, then per layer its rows."""
        if seq is None:
            sel = np.flatnonzero(self.pos >= 0)
        else:
            if not 0 <= seq < self.n_seq_max:
                raise StateError(f"seq id {seq} is outside [0, {self.n_seq_max})")
            sel = np.flatnonzero((self.pos >= 0) & self._holds(seq))
        w.s(json.dumps(self._full_layout(), sort_keys=True))
        w.u("I", len(sel))
        w.arr(sel, np.int32)
        for f in self.cell_fields:
            a = getattr(self, f)[sel]
            w.arr(np.full(len(sel), 1 << seq, np.uint64) if f == "seq" and seq is not None else a, a.dtype)
        for il in self.layers:
            for b in self.layer_rows(il):
                w.arr(b[sel], b.dtype)

    def state_read(self, r: Reader, dst: int | None) -> Commit:
        theirs = r.json("memory layout")
        ours = self._full_layout()
        for k in (tuple(ours) if dst is None else self.seq_layout):
            if k != "layers" and theirs.get(k) != ours[k]:
                raise StateError(f"state has {k}={theirs.get(k)!r}, this context has {k}={ours[k]!r}")
        if theirs.get("layers") != ours["layers"]:
            raise StateError("state data is malformed: its layers and row widths disagree with this model's")
        n = r.u("I", "cell count")
        cell = r.arr(np.int32, n, "cell indices").astype(np.int64)
        fields = self.older_fields({f: r.arr(getattr(self, f).dtype, n, f"cell {f}")
                                    for f in self.saved_fields(r.version)})
        rows = {il: [r.arr(b.dtype, n * b.shape[1], f"layer {il} rows").reshape(n, b.shape[1])
                     for b in self.layer_rows(il)] for il in self.layers}
        if ((fields["pos"] < 0) | (fields["pos"] > POS_MAX)).any():
            raise StateError(f"state data is malformed: a saved cell has a position outside [0, {POS_MAX}]")
        if dst is None:
            return self._read_all(cell, fields, rows)
        return self._read_seq(fields, rows, dst)

    def _read_all(self, cell: np.ndarray, fields: dict[str, np.ndarray], rows: dict[int, list[np.ndarray]]) -> Commit:
        n, seqs = len(cell), fields["seq"]
        if n and (cell.min() < 0 or cell.max() >= len(self.pos) or len(np.unique(cell)) != n):
            raise StateError("state data is malformed: cell indices are out of range or repeated")
        if n and ((seqs == 0).any() or (seqs >> np.uint64(self.n_seq_max)).any()):
            raise StateError(f"state data is malformed: a cell has no sequence or one >= n_seq_max={self.n_seq_max}")
        self._check_saved(cell, fields)

        def commit() -> None:
            self.clear(data=True)
            for f, a in fields.items():
                getattr(self, f)[cell] = a
            for il, saved in rows.items():
                for buf, a in zip(self.layer_rows(il), saved):
                    buf[cell] = a
            self.restored()
        return commit

    def _check_saved(self, cells: np.ndarray, fields: dict[str, np.ndarray]) -> None:
        why = self.check_saved(cells, fields) if len(cells) else None
        if why:
            raise StateError(f"state data is malformed: {why}")

    def _read_seq(self, fields: dict[str, np.ndarray], rows: dict[int, list[np.ndarray]], dst: int) -> Commit:
        if not 0 <= dst < self.n_seq_max:
            raise StateError(f"destination seq id {dst} is outside [0, {self.n_seq_max})")
        n = len(fields["pos"])
        lo, hi = self.cell_range(dst)
        free = (self.pos < 0) | (self._holds(dst) & (self.seq == np.uint64(1 << dst)))  # dst's own cells go first
        free[:lo] = False
        free[hi:] = False
        cells = np.flatnonzero(free)
        if len(cells) < n:
            raise StateError(f"no room for the saved sequence: it has {n} cells, {len(cells)} are free for seq {dst}")
        cells = cells[:n]
        fields = {**fields, "seq": np.full(n, 1 << dst, np.uint64)}
        self._check_saved(cells, fields)

        def commit() -> None:
            self.seq_rm(dst, -1, -1)
            for f, a in fields.items():
                getattr(self, f)[cells] = a
            for il, saved in rows.items():
                for buf, a in zip(self.layer_rows(il), saved):
                    buf[cells] = a
        return commit
