"""The self-attention KV cache (llama.cpp's ``llama_kv_cache``), unified or with one stream per sequence.

A cache serves the attention layers routed to it (full attention by default; the sliding-window layers in
the SWA half of an interleaved pair, :mod:`graphir.memory.composite`), each at its own K/V width. A cache
with a window masks keys that fell out of it and reuses their cells (llama.cpp's SWA cache); its inputs and
dims carry its name (``kq_mask_swa``, ``n_kv_swa``) so that two caches can feed one graph.

Graph side: each served layer owns K and V buffers of ``n_ctx`` cells. A ubatch first writes its K/V rows into the
cells chosen by slot search (``k_idxs``/``v_idxs``), then attends over the first ``n_kv`` cells under a mask
built from the cells' positions and sequence sets; so the current tokens see themselves through the cache.
The cache hands the builder those K/V views and the mask (:mod:`graphir.memory.inputs`); the builder attends.
``n_kv`` is the used prefix padded to 256 cells, as in llama.cpp: the cells past the used ones are masked, and a
decode's shapes stay the same for 256 tokens (a backend keeps one plan for them). The mask states it
(``pad=256``), so a backend emulating llama.cpp's padded lengths reads it off the graph.
The cache holds K after RoPE.

Layouts. ``unified=True``: every sequence may use any of the ``n_ctx`` cells, and a cell may belong to
several sequences (a shared prompt is stored once). ``unified=False`` is llama.cpp's non-unified mode:
sequence s owns the cell range ``[s*n, (s+1)*n)`` with ``n = n_ctx // n_seq_max`` (its "stream"), tokens
may not be shared between sequences, and ``seq_cp`` copies whole sequences (K/V rows included). It is the
same cell array and the same graph: the mask isolates the streams as it isolates sequences in the unified
layout. What differs is how the tokens of a ubatch attend: each stream's as a batch of its own, as llama.cpp's
per-stream views compute them (:func:`stream_binding`), so a sequence decoded beside others gives the bits it
gives alone; in the unified layout llama.cpp's products over all the ubatch's tokens sum in another order.

Slot search takes the first free cells from a moving head, wrapping around, and they need not be
contiguous (K/V rows are written with ``set_rows``, the mask is per cell). Fragmentation therefore never
blocks a slot: a ubatch fits whenever enough cells are free (in its stream), and compaction (llama.cpp's
former defrag) is never needed. Holes only make the used prefix longer than the used count.

Position edits (``seq_add``, ``seq_div``) are lazy, as in llama.cpp: they change the cells' positions and
accumulate a per-cell pending ``shift``; :meth:`KVCache.update` (called by the context before the next
decode) rotates the cached K rows by the angle of their shift, with the rope parameters of the layer's own
K rope node in the compiled graph (mode, n_dims, freq base/scale, YaRN, freq factors). That rotation is a
graph of its own (:meth:`KVCache.k_shift_graph`, snapshot-tested), which the context's backend runs like any other.

Planes (llama.cpp's ``llama_kv_cell_ext``). A model whose tokens take three or more positions (M-RoPE:
``ContextParams.n_pos``) has its cache keep each cell's ``row`` and ``col``, its second and third sections (an
image patch's row and column as llama.cpp's mtmd lays them out; a text token's are its position). Patches of one
image share their time, so a key at the query's own time is seen only if its (row, col) does not come after the
query's, row first: within an image attention is causal in raster order. Position edits leave the planes where
they were, as llama.cpp's cells do (its seq_add and seq_div refuse such models outright; here their K cannot be
re-roped, so the next decode refuses the edit); seq_cp, saved states, clones and a failed decode's rollback carry
them.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any, cast

import numpy as np

from graphir.batch import POS_MAX, UBatch
from graphir.graph.dims import DimDecl
from graphir.errors import BatchError, CacheFullError, GraphError, GraphirError
from graphir.graph.emit import Emitter
from graphir.graph.ir import Graph, Node
from graphir.memory import CellMemory, RunGraph
from graphir.memory.inputs import AttnInputs, PosBuckets, SelfAttention
from graphir.memory.layers import Attention, ContextParams, LayerNeeds
from graphir.memory.reuse import SharedRows, check_readers, reads_of
from graphir.graph.ops import VIEWS, infer

CACHE_DTYPES = {"f16": np.float16, "f32": np.float32}
N_KV_PAD = 256  # n_kv is the used prefix rounded up to this (and at most the cache), as llama_kv_cache::get_n_kv
PLANES = ("row", "col")  # the cell fields of a cache whose tokens take M-RoPE's sections
PLANES_SAVED = 3  # the state format (graphir.running.state) from which saved cells hold their planes
EMPTY = {"pos": -1, "seq": 0, "shift": 0, "row": 0, "col": 0}  # each cell field's value in an empty cell


def cache_dims(name: str) -> tuple[DimDecl, DimDecl, DimDecl]:
    """A cache's cells per layer, the attended prefix of them, and the cells a K-shift moves; named after the
    cache (``n_ctx``/``n_kv`` for the main one, ``n_ctx_swa``/``n_kv_swa`` for a sliding-window one)."""
    tail = f"_{name}" if name else ""
    cells = DimDecl(f"n_ctx{tail}", 1, None, "cells per layer in the cache")
    return (cells, DimDecl(f"n_kv{tail}", 1, cells.sym, "cells attended over: the used prefix of the cache, padded"),
            DimDecl("n_shift", 1, cells.sym, "cells whose pending position shift the K-shift applies"))


TURNS = ("rope", "rope_multi")  # the ops that rotate K by its position


def writes_cached_k(n: Node, role: str = "cache_k") -> bool:
    """Whether a node writes a layer's K rows into its cache: a set_rows into an input of role ``role``."""
    dst = n.inputs[0] if n.op == "set_rows" else None
    return dst is not None and dst.op == "input" and dst.attrs["role"] == role


def rope_plan(graph: Graph) -> tuple[bool, dict[int, Node]]:
    """(can_shift, per layer the rope node its cached K went through), followed back from each ``cache_k``
    write of a compiled graph.

    A layer whose K reaches the cache through views from a rope node is re-roped with that node's attributes;
    so is a layer whose K heads are [part without positions | RoPE'd part] (a concat whose second part comes
    from a rope, through views or a repeat over heads: MLA, :func:`split_heads`), at that part alone;
    a layer whose K has no rope upstream in the layer needs no re-roping (positions only live in the mask:
    NoPE layers, GPT-2); a layer whose K went through other arithmetic after a rope cannot be shifted.
    """
    plan: dict[int, Node] = {}
    ok = True
    for n in graph.nodes:
        if not writes_cached_k(n):
            continue
        x = n.inputs[1]
        while x.op in VIEWS:
            x = x.inputs[0]
        if x.op == "rope":
            plan[n.layer if n.layer is not None else -1] = x
            continue
        if x.op == "concat" and _roped_tail(x) is not None:
            plan[n.layer if n.layer is not None else -1] = _roped_tail(x)  # type: ignore[assignment]
            continue
        if x.op in TURNS:  # another rotation (M-RoPE's sections): llama.cpp cannot shift it either
            ok = False
            break
        seen, todo = set(), [x]
        while todo:  # a rope further up in this layer means K was rotated and then changed: no exact shift
            y = todo.pop()
            if id(y) in seen or y.layer != n.layer:  # earlier layers reach K only as content, not as a turn
                continue
            seen.add(id(y))
            if y.op in TURNS:
                ok = False
                break
            todo.extend(y.inputs)
    return ok, plan


def _roped_tail(k: Node) -> Node | None:
    """The rope node the second part of a K concat comes from (through views and a repeat over heads), or None."""
    t = k.inputs[1]
    while t.op in VIEWS or t.op == "repeat":
        t = t.inputs[0]
    return t if t.op == "rope" else None


def stream_binding(kv_dim: str) -> str:
    """The run-time binding by which a cache in per-sequence streams (unified=False) tells a backend its cells
    per stream. llama.cpp views such a cache per stream, so each stream's tokens attend as a batch of their own
    (one token: its single-row products; several: its matrix products): the order its kernels sum in, and so
    a sequence's bits, do not depend on what other sequences share the ubatch."""
    return f"{kv_dim}.stream"


def split_heads(graph: Graph) -> dict[int, tuple[int, int]]:
    """Per layer whose cached K heads are [part without positions | RoPE'd part] (see :func:`rope_plan`), the
    (head size, heads) of its cached rows: the K-shift turns the last n_rot values of each such head."""
    out: dict[int, tuple[int, int]] = {}
    for n in graph.nodes:
        if writes_cached_k(n):
            x = n.inputs[1]
            while x.op in VIEWS:
                x = x.inputs[0]
            if x.op == "concat" and _roped_tail(x) is not None:
                d, h = x.shape[:2]
                out[n.layer if n.layer is not None else -1] = (int(d), int(h))
    return out


def _node(name: str, op: str, *inputs: Node, **attrs: Any) -> Node:
    return Node(name, op, inputs, attrs, *infer(op, list(inputs), attrs))


class KVCache(CellMemory):
    """Cells with a position (-1 = empty) and a set of sequence ids; K/V rows per served layer per cell."""

    kind = "kv"
    serves = frozenset({"full"})
    requires = frozenset({"full"})
    buffer_roles = frozenset({"cache_k", "cache_v"})
    k_role = "cache_k"  # the buffer a K-shift turns
    cell_fields: tuple[str, ...] = ("pos", "seq", "shift")  # with planes, "row" and "col" too
    seq_layout = ("kind", "type_k", "type_v")

    def __init__(self, needs: LayerNeeds, params: ContextParams = ContextParams(),
                 layer_kinds: frozenset[str] | None = None, name: str = "", size: int | None = None,
                 recycle: bool = True):
        """``name`` tells its inputs and dims apart from another cache's; ``size``: cells (default n_ctx);
        ``recycle``: a windowed cache reuses the cells its sequences can no longer see (else it keeps them)."""
        super().__init__(needs, params, layer_kinds)
        self.recycle = recycle
        for which, t in (("type_k", params.type_k), ("type_v", params.type_v)):
            if t not in CACHE_DTYPES:
                raise GraphirError(f"{which} '{t}' is not supported (supported: {', '.join(CACHE_DTYPES)})")
        check_readers(self.need, self.kind)
        self.shared = SharedRows()
        rules = {replace(n, n_embd_k=0, n_embd_v=0, reads=None) for n in self.need.values()  # type: ignore[type-var]
                 if isinstance(n, Attention)}  # latent rows (graphir.memory.latent) attend causally, unwindowed
        if len(rules) > 1:
            raise GraphirError(f"one KV cache serves one attention window; layers ask for "
                               f"{sorted((r.window, r.swa_type) for r in rules)}")
        self.rule = rules.pop() if rules else Attention(0, 0)  # which keys a query sees, by position
        self.name, self.size_dim, self.kv_dim, self.shift_dim = name, *cache_dims(name)
        self.type_k, self.type_v = params.type_k, params.type_v
        n_ctx = params.n_ctx if size is None else size
        self.n_ctx, self.unified = n_ctx, bool(params.unified)
        self.n_stream = 1 if self.unified else self.n_seq_max
        if not self.unified:  # llama.cpp cuts a batch for streams into equal parts per sequence (split_equal)
            self.split = "equal"
        self.stream_size = n_ctx // self.n_stream  # cells per stream; per-sequence: n_ctx % n_seq_max stay unused
        if n_ctx and not self.stream_size:
            raise GraphirError(f"n_ctx={n_ctx} gives no cells per sequence with n_seq_max={self.n_seq_max} "
                               f"(unified=False needs n_ctx >= n_seq_max)")
        cells = n_ctx if params.buffers else 0  # a memory for sizing allocates nothing
        self.pos = np.full(cells, -1, dtype=np.int64)  # -1: empty cell
        self.seq = np.zeros(cells, dtype=np.uint64)  # bit s: the cell belongs to sequence s
        self.shift = np.zeros(cells, dtype=np.int64)  # pending position delta not yet applied to K
        self.planar = params.n_pos >= 3  # llama.cpp's is_pos_2d: the cells keep their row and column
        if self.planar:
            self.cell_fields = (*self.cell_fields, *PLANES)
            self.row = np.zeros(cells, dtype=np.int64)  # the cell's second section (an image patch's row)
            self.col = np.zeros(cells, dtype=np.int64)  # and third (its column)
        self.heads = [s * self.stream_size for s in range(self.n_stream)]  # per stream: where the next slot search starts (not state)
        self._run: RunGraph | None = None  # by the context
        self._graph: Graph | None = None
        self._split: dict[int, tuple[int, int]] = {}  # layers whose K heads end in their RoPE'd part (split_heads)
        self.shiftable = True
        self._buffers = self._allocate()

    def buffer_shapes(self) -> dict[str, tuple[tuple[int, ...], Any]]:
        """K and V rows of every cell, per served layer."""
        if not self.n_ctx:
            return {}
        out: dict[str, tuple[tuple[int, ...], Any]] = {}
        k, v = CACHE_DTYPES[self.type_k], CACHE_DTYPES[self.type_v]
        for il in self.layers:
            need = self.need[il]
            out[f"blk.{il}.cache_k"] = (self.n_ctx, need.n_embd_k), k  # type: ignore[union-attr]
            out[f"blk.{il}.cache_v"] = (self.n_ctx, need.n_embd_v), v  # type: ignore[union-attr]
        return out

    def _tail(self, role: str) -> str:
        return f"{role}_{self.name}" if self.name else role

    def dims(self) -> list[DimDecl]:
        return [self.kv_dim, self.size_dim]

    def sizes(self) -> dict[str, int]:
        return {self.size_dim.name: self.n_ctx}

    def _store_and_view(self, e: Emitter, x: Node, which: str, dtype: str) -> Node:
        """Write the ubatch's rows x [d, n_head_kv, n_tokens] into their cells; a view of the first n_kv cells."""
        d, n_head_kv, n_tokens = x.shape
        width = d * n_head_kv
        cache = e.input(f"cache_{which}", dtype, (width, self.size_dim.sym), scoped=True)
        idxs = e.input(self._tail(f"{which}_idxs"), "i64", (n_tokens,))
        rows = e.reshape(x, (width, n_tokens), name=f"{which}_rows")
        written = e.op("set_rows", cache, rows, idxs, name=f"cache_{which}.write")
        return e.op("view", written, shape=(d, n_head_kv, self.kv_dim.sym), strides=(1, d, width), offset=0,
                    name=f"cache_{which}.view")

    def _mask(self, e: Emitter) -> Node:
        """Which of the first n_kv cells each token sees; they are padded to N_KV_PAD (the cells past the used
        ones masked), which the mask states for backends that follow llama.cpp's padded lengths."""
        return e.input(self._tail("kq_mask"), "f32", (self.kv_dim.sym, e.n_tokens), **self.rule.mask_facts(),
                       pad=N_KV_PAD)

    def _attend(self, e: Emitter, il: int, r: SelfAttention) -> AttnInputs:
        j = reads_of(self.need[il])
        if j is not None:  # the rows layer j wrote and attends over
            return self.shared.read(e, il, j, self._mask(e))
        if r.k is None or r.v is None:
            raise GraphError(f"layer {il} keeps its own K and V in this cache: its attention needs them")
        k, v = self._store_and_view(e, r.k, "k", self.type_k), self._store_and_view(e, r.v, "v", self.type_v)
        self.shared.keep(e, il, k, v)
        return AttnInputs(k, v, self._mask(e))

    def _buckets(self, e: Emitter, il: int, r: PosBuckets) -> Node:
        """Buckets of (cell position - query position); an empty cell counts as position -1 (it is masked)."""
        return e.input(self._tail("pos_bucket"), "i32", (self.kv_dim.sym, e.n_tokens), buckets=self.rule.rel_buckets)

    answers = {SelfAttention: _attend, PosBuckets: _buckets}

    # ---- run time -------------------------------------------------------------------------------------

    def bind_shift(self, graph: Graph, run: RunGraph) -> None:
        """The compiled graph this cache feeds (its K ropes are the K-shift's) and how to run a K-shift graph;
        needed by :meth:`update`."""
        ok, ropes = rope_plan(graph)
        self._graph, self._run = graph, run
        self._ropes = {il: r for il, r in ropes.items() if il in self.layers}
        self._split = {il: s for il, s in split_heads(graph).items() if il in self.layers}
        self.shiftable = ok

    def k_shift_graph(self, meta: dict[str, Any], ropes: dict[int, Node],
                      split: dict[int, tuple[int, int]] | None = None) -> Graph:
        """llama.cpp's K-shift as a graph: for every served layer whose K was roped, the cached rows of the
        shifted cells (``shift_idxs``) are rotated by their pending deltas (``shift_pos``) with that layer's
        rope and written back in place. RoPE at position p turns channel pair i by p*theta_i (YaRN mixes
        theta_i but keeps it linear in p), so turning by delta*theta_i moves a row from p to p + delta. The turn
        has unit magnitude: the YaRN/attention magnitude factor the forward rope applied is not applied again.
        ``split``: layers whose cached heads are [part without positions | RoPE'd part], as (head size, heads)
        (:func:`split_heads`): only the last n_dims values of each head (the rope's) turn, the rest is written
        back as read (llama.cpp's K-shift of MLA caches, a rope over a view at that offset)."""
        n = self.shift_dim.sym
        idxs = Node("shift_idxs", "input", (), {"role": "shift_idxs"}, "i64", (n,))
        delta = Node("shift_pos", "input", (), {"role": "shift_pos"}, "i32", (n,))
        nodes, outputs = [idxs, delta], {}
        shared: set[str] = set()
        for il, rope in sorted(ropes.items()):
            d, h = rope.inputs[0].shape[:2]
            a = dict(rope.attrs)
            a["attn_factor"] = 1.0 / (1.0 + 0.1 * math.log(1.0 / float(a["freq_scale"]))) if a["ext_factor"] else 1.0
            if il in (split or {}):  # the head's turned tail: as many values as the rope turns
                (d_head, h), d = split[il], int(a["n_dims"])  # type: ignore[index]
            else:
                d_head = d
            width, role = d_head * h, self.k_role
            cache = Node(f"blk.{il}.{role}", "input", (), {"role": role}, self.type_k, (width, self.size_dim.sym))
            rows = _node(f"blk.{il}.k_shift.rows", "get_rows", cache, idxs)
            heads = _node(f"blk.{il}.k_shift.heads", "reshape", rows, shape=(d_head, h, n))
            kept: list[Node] = []
            if d_head == d:
                turned = _node(f"blk.{il}.k_shift.rope", "rope", heads, delta, *rope.inputs[2:], **a)
            else:  # only each head's RoPE'd tail turns; the part before it is written back as it was read
                tail = _node(f"blk.{il}.k_shift.pe", "view", heads, shape=(d, h, n), strides=(1, d_head, width),
                             offset=d_head - d)
                kept = [_node(f"blk.{il}.k_shift.nope", "view", heads, shape=(d_head - d, h, n),
                              strides=(1, d_head, width), offset=0), tail]
                pe = _node(f"blk.{il}.k_shift.rope", "rope", tail, delta, *rope.inputs[2:], **a)
                turned = _node(f"blk.{il}.k_shift.joined", "concat", kept[0], pe, dim=0)
                kept.append(pe)
            flat = _node(f"blk.{il}.k_shift.rows_out", "reshape", turned, shape=(width, n))
            write = _node(f"blk.{il}.{role}.shift", "set_rows", cache, flat, idxs)
            factors = [f for f in rope.inputs[2:] if f.name not in shared]     # one leaf for all layers
            shared.update(f.name for f in factors)
            nodes += [cache, *factors, rows, heads, *kept, turned, flat, write]
            outputs[f"blk.{il}.{role}"] = write
        return Graph({**meta, "phase": "k_shift"}, (self.size_dim, self.shift_dim), nodes, outputs)

    def cell_range(self, seq: int) -> tuple[int, int]:
        return self.stream_range(self.stream_of(seq))

    def check_saved(self, cells: np.ndarray, fields: dict[str, np.ndarray]) -> str | None:
        roped = fields["pos"] - fields["shift"]  # where K was roped: a shift moves it from there
        if ((roped < 0) | (roped > POS_MAX)).any():
            return f"a saved cell's pending shift starts outside the positions [0, {POS_MAX}]"
        if any(((fields[f] < 0) | (fields[f] > POS_MAX)).any() for f in PLANES if f in fields):
            return f"a saved cell's row or column is outside the positions [0, {POS_MAX}]"
        if not self.unified:
            for c, m in zip(cells, fields["seq"]):
                if int(m) != 1 << (int(c) // self.stream_size):
                    return f"cell {int(c)} is not in its sequence's stream"
        return None

    def saved_fields(self, version: int | None) -> tuple[str, ...]:
        """Formats before PLANES_SAVED hold no planes."""
        return self.cell_fields if version is None or version >= PLANES_SAVED else self.cell_fields[:3]

    def older_fields(self, fields: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Cells saved without their planes take their position as row and column, as text's: such a state
        held no image whose patches share a time (they were refused), though its rows may have had other
        rows and columns, which only a later batch of rows at the same time could have told apart."""
        return {**fields, **{f: fields["pos"].copy() for f in self.cell_fields if f not in fields}}

    def restored(self) -> None:
        for st in range(self.n_stream):  # heads: just after the last used cell of each stream
            a, b = self.stream_range(st)
            used = np.flatnonzero(self.pos[a:b] >= 0)
            self.heads[st] = a + int(used[-1]) + 1 if len(used) and a + int(used[-1]) + 1 < b else a

    def stream_of(self, seq: int) -> int:
        return 0 if self.unified else seq

    def stream_range(self, stream: int) -> tuple[int, int]:
        a = stream * self.stream_size
        return a, a + self.stream_size

    def seq_pos_max(self, seq: int) -> int:
        return int(self.pos.max(where=self._holds(seq), initial=-1))

    def seq_pos_min(self, seq: int) -> int:
        p = self.pos[self._holds(seq)]
        return int(p.min()) if len(p) else -1

    def _usable(self, pos: np.ndarray, seq: np.ndarray) -> np.ndarray:
        """Cells a slot may take: empty ones and, in a recycling windowed cache, cells of one sequence that its
        next token can no longer see (for a standard window: ``window`` or more positions behind it)."""
        free = pos < 0
        if self.rule.window and self.recycle:
            for s in range(self.n_seq_max):
                mine = seq == np.uint64(1 << s)
                if mine.any():
                    free |= mine & ~self.rule.sees(int(pos[mine].max()) + 1, pos)
        return free

    def _find_cells(self, free: np.ndarray, n: int, head: int, lo: int, hi: int) -> np.ndarray | None:
        """The first n usable cells of [lo, hi) at or after head, wrapping around (need not be contiguous)."""
        order = np.concatenate([np.flatnonzero(free[head:hi]) + head, np.flatnonzero(free[lo:head]) + lo])
        return order[:n] if len(order) >= n else None

    def _next_head(self, cell: int) -> int:
        lo, hi = self.stream_range(cell // self.stream_size if not self.unified else 0)
        return cell + 1 if cell + 1 < hi else lo

    def prepare(self, ubatches: list[UBatch]) -> list[Any]:
        pos, seq, heads, plans = self.pos.copy(), self.seq.copy(), list(self.heads), []
        for k, ub in enumerate(ubatches):
            cells = np.empty(len(ub), dtype=np.int64)
            if self.unified:
                groups = {0: np.arange(len(ub))}
            else:
                for i, ids in enumerate(ub.seq_ids):
                    if len(ids) > 1:
                        raise BatchError(f"token {int(ub.batch_index[i])} belongs to sequences {ids}: a token shared "
                                         f"by several sequences needs the unified KV layout (unified=True)")
                first = np.array([ids[0] for ids in ub.seq_ids])
                groups = {int(s): np.flatnonzero(first == s) for s in np.unique(first)}
            free = self._usable(pos, seq)
            for stream, rows in groups.items():
                lo, hi = self.stream_range(stream)
                got = self._find_cells(free, len(rows), heads[stream], lo, hi)
                if got is None:
                    n_free = int(free[lo:hi].sum())
                    if self.unified:
                        raise CacheFullError(f"KV cache full: ubatch {k} needs {len(rows)} cells, {n_free} of "
                                             f"{self.n_ctx} are free")
                    raise CacheFullError(f"KV cache full: ubatch {k} needs {len(rows)} cells of sequence {stream}'s "
                                         f"stream, {n_free} of {self.stream_size} are free")
                free[got] = False
                cells[rows] = got
                heads[stream] = self._next_head(int(got[-1]))
            pos[cells] = ub.pos
            seq[cells] = [sum(1 << s for s in ids) for ids in ub.seq_ids]
            plans.append(cells)
        return plans

    def apply(self, ub: UBatch, plan: Any) -> dict[str, Any]:
        cells = plan
        self.pos[cells] = ub.pos
        self.seq[cells] = [sum(1 << s for s in ids) for ids in ub.seq_ids]
        self.shift[cells] = 0
        planes = ub.positions(self.params.n_pos).reshape(self.params.n_pos, -1)[1:3] if self.planar else None
        if planes is not None:
            self.row[cells], self.col[cells] = planes
        if self.unified:  # after the last cell written in each stream
            self.heads[0] = self._next_head(int(cells[-1]))
        else:
            streams = cells // self.stream_size
            for st_ in np.unique(streams):
                self.heads[int(st_)] = self._next_head(int(cells[np.flatnonzero(streams == st_)[-1]]))
        n_kv = min(len(self.pos), -(-(int(np.flatnonzero(self.pos >= 0).max()) + 1) // N_KV_PAD) * N_KV_PAD)
        first = np.array([ids[0] for ids in ub.seq_ids], dtype=np.uint64)
        pos, seq = self.pos[:n_kv], self.seq[:n_kv]
        q_pos = ub.pos[:, None].astype(np.int64)
        # NOTE: visibility is decided by the cells, not the ubatch: same first seq id, key pos <= query pos.
        ok = (pos[None, :] >= 0) & (((seq[None, :] >> first[:, None]) & np.uint64(1)) == 1)
        rule = self.rule if ub.causal else replace(self.rule, causal=False)
        ok &= rule.sees(q_pos, pos[None, :])
        if planes is not None and rule.causal:  # a key at the query's time: seen up to the query's (row, col)
            row, col = self.row[None, :n_kv], self.col[None, :n_kv]
            q_row, q_col = planes[:, :, None].astype(np.int64)
            ok &= (pos[None, :] != q_pos) | (row < q_row) | ((row == q_row) & (col <= q_col))
        mask = self.rule.mask(ok, q_pos, pos[None, :]).astype(np.float32)
        idxs = cells.astype(np.int64)
        feeds = {self._tail("kq_mask"): mask, self._tail("k_idxs"): idxs, self._tail("v_idxs"): idxs,
                 self.kv_dim.name: n_kv, self.size_dim.name: self.n_ctx}
        if self.rule.rel_buckets:
            feeds[self._tail("pos_bucket")] = self.rule.buckets(q_pos, pos[None, :])
        if not self.unified:
            feeds[stream_binding(self.kv_dim.name)] = self.stream_size
        return feeds

    def _stream_of_cell(self, cell: int) -> int:
        return 0 if self.unified else cell // self.stream_size

    def snapshot(self, plans: list[Any]) -> Any:
        """The cells, and the rows the plans will overwrite or a pending K-shift will turn, so that a failed
        ubatch leaves every byte as it was."""
        shifted = np.flatnonzero((self.pos >= 0) & (self.shift != 0))
        taken = np.unique(np.concatenate([shifted, *plans]))
        if len(taken) and taken[-1] - taken[0] + 1 == len(taken):  # a run of cells (a generation step's one):
            run = slice(int(taken[0]), int(taken[-1]) + 1)             # sliced, not gathered (60 buffers: 3x faster)
            rows = {k: v[run].copy() for k, v in self._buffers.items()}
        else:
            rows = {k: v[taken] for k, v in self._buffers.items()} if len(taken) else {}
        return {f: getattr(self, f).copy() for f in self.cell_fields}, list(self.heads), taken, rows

    def restore(self, snap: Any) -> None:
        fields, heads, taken, rows = snap
        for f, a in fields.items():
            setattr(self, f, a.copy())
        self.heads = list(heads)
        for k, saved in rows.items():
            self._buffers[k][taken] = saved

    # ---- the memory API -----------------------------------------------------------------------------

    def _free(self, cells: np.ndarray) -> None:
        """Empty the given cells (bool mask) and move the heads back to the first freed cell of their stream."""
        idx = np.flatnonzero(cells)
        for f in self.cell_fields:
            getattr(self, f)[idx] = EMPTY[f]
        for c in idx[::-1]:
            s = self._stream_of_cell(int(c))
            if c < self.heads[s]:
                self.heads[s] = int(c)

    def clear(self, data: bool = True) -> None:
        for f in self.cell_fields:
            getattr(self, f)[:] = EMPTY[f]
        self.heads = [self.stream_range(s)[0] for s in range(self.n_stream)]
        if data:
            for b in self._buffers.values():
                b[...] = 0

    def can_seq_rm(self, seq: int, p0: int = -1, p1: int = -1) -> bool:
        if seq >= 0:
            self._check_seq(seq, "seq_rm")
        return True  # any cells can be emptied

    def seq_rm(self, seq: int, p0: int = -1, p1: int = -1) -> bool:
        sel = self._range(p0, p1)
        if seq < 0:
            self._free(sel)
            return True
        self._check_seq(seq, "seq_rm")
        sel &= self._holds(seq)
        self.seq[sel] &= ~np.uint64(1 << seq)
        self._free(sel & (self.seq == 0))
        return True

    def seq_cp(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None:
        if not self._copy_needed(src, dst):
            return
        if self.stream_of(src) == self.stream_of(dst):
            self.seq[self._range(p0, p1) & self._holds(src)] |= np.uint64(1 << dst)
            return
        # per-sequence layout: dst's stream becomes a copy of src's (llama.cpp: whole sequences only)
        if p0 > 0 or p1 >= 0:
            raise GraphirError(f"seq_cp({src}, {dst}, {p0}, {p1}): with one stream per sequence (unified=False) "
                               f"only whole sequences are copied; pass p0=-1, p1=-1")
        (a, b), (c, d) = self.stream_range(self.stream_of(src)), self.stream_range(self.stream_of(dst))
        keep = self._holds(src)[a:b]
        for f in self.cell_fields:
            if f != "seq":
                cell = getattr(self, f)
                cell[c:d] = np.where(keep, cell[a:b], EMPTY[f])
        self.seq[c:d] = np.where(keep, np.uint64(1 << dst), np.uint64(0))
        for buf in self._buffers.values():
            buf[c:d] = buf[a:b]
        self.heads[self.stream_of(dst)] = self.heads[self.stream_of(src)] - a + c

    def seq_keep(self, seq: int) -> None:
        self._check_seq(seq, "seq_keep")
        mine = self._holds(seq)
        self.seq[mine] = np.uint64(1 << seq)
        self._free((self.pos >= 0) & ~mine)

    def seq_add(self, seq: int, p0: int, p1: int, delta: int) -> None:
        self._check_seq(seq, "seq_add")
        if delta == 0:
            return
        sel = self._range(p0, p1) & self._holds(seq)
        self._check_move("seq_add", self.pos[sel], delta)
        self.pos[sel] += delta
        self.shift[sel] += delta
        self._free(sel & (self.pos < 0))  # pushed below position 0: removed, as llama.cpp does
        s = self.stream_of(seq)
        gone = np.flatnonzero(sel & (self.pos < 0))
        self.heads[s] = int(gone[0]) if len(gone) else self.stream_range(s)[0]

    def seq_div(self, seq: int, p0: int, p1: int, d: int) -> None:
        self._check_seq(seq, "seq_div")
        if d <= 0:
            raise GraphirError(f"seq_div: divisor {d} must be positive")
        if d == 1:
            return
        sel = self._range(p0, p1) & self._holds(seq)
        old = self.pos[sel]
        new = old // min(d, POS_MAX + 1)  # positions are in [0, POS_MAX]: floor division is C's truncation
        self.pos[sel] = new
        self.shift[sel] += new - old  # NOTE: new - old like seq_add; llama.cpp records old - new (trap 9)

    def can_shift(self) -> bool:
        return self.shiftable

    def has_shift(self) -> bool:
        return bool(self.shift.any()) and bool((self.shift[self.pos >= 0] != 0).any())

    def update(self) -> bool:
        """Re-rope cached K by each cell's pending shift (llama.cpp's K-shift); True if any row moved."""
        if not self.has_shift():
            self.shift[:] = 0
            return False
        if not self.shiftable:
            raise GraphirError("this model's cached K cannot be re-roped (K changes after its rope): positions "
                               "were edited with seq_add/seq_div but the cache cannot follow")
        if self._run is None or self._graph is None:
            raise GraphirError("this KV cache is not bound to a compiled model (bind_shift), so pending position "
                               "shifts cannot be applied; use the memory of a context")
        idx = np.flatnonzero((self.pos >= 0) & (self.shift != 0))
        feeds = {f"blk.{il}.{self.k_role}": self._buffers[f"blk.{il}.{self.k_role}"] for il in self._ropes}
        feeds.update(shift_idxs=idx.astype(np.int64), shift_pos=self.shift[idx].astype(np.int32))
        graph, ropes, split = self._graph, self._ropes, self._split
        self._run(("k_shift", self.name, self.type_k), lambda: self.k_shift_graph(graph.meta, ropes, split),
                  {self.size_dim.name: self.n_ctx, self.shift_dim.name: len(idx)}, feeds)   # writes K in place
        self.shift[:] = 0
        return True

    def clone(self) -> KVCache:
        new = cast(KVCache, super().clone())
        new.heads = list(self.heads)
        return new

    def layer_rows(self, il: int) -> tuple[np.ndarray, ...]:
        return self._buffers[f"blk.{il}.cache_k"], self._buffers[f"blk.{il}.cache_v"]

    def layout(self) -> dict[str, Any]:
        """What must agree for two caches (or a cache and a saved state) to be interchangeable."""
        return {"kind": self.kind, "type_k": self.type_k, "type_v": self.type_v, "n_ctx": self.n_ctx,
                "n_seq_max": self.n_seq_max, "unified": self.unified, "window": self.rule.window,
                **({"swa": self.rule.swa_type} if self.rule.window else {})}
