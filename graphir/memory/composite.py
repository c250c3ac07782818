"""Memories made of parts, each serving the layers of its kind (llama.cpp's layer filters).

A composite routes every layer to the part that holds it and implements the whole memory API by delegating,
with llama.cpp's semantics: placement is planned by every part before any commits, a failed ubatch restores
every part, ``seq_rm`` succeeds only where every part can (and otherwise changes nothing), positions are the
ones all parts agree on (the latest first position and the earliest last), and a saved state holds each
part's own section in turn.

- :class:`SWAPair` (``iswa``, llama.cpp's ``llama_kv_cache_iswa``): full-attention layers in one KV cache of
  n_ctx cells, sliding-window layers in a second, smaller one whose cells are reused once out of the window.
- :class:`HybridMemory` (``hybrid``, ``llama_memory_hybrid``): attention layers in a KV cache (a latent
  cache when they are multi-head latent attention), recurrent layers in a recurrent memory; ubatches are split
  equally, as the recurrent part needs.
- :class:`HybridISWA` (``hybrid_iswa``, ``llama_memory_hybrid_iswa``): the hybrid whose attention part is an
  iswa pair (attention layers that slide, as LFM2's do with a window), its recurrent part as the hybrid's.

The graph side is one route: each layer's request (:mod:`graphir.memory.inputs`) goes to the part keeping
that kind of need of that layer, whatever the request is.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np

from graphir.batch import UBatch
from graphir.graph.dims import Dim, DimDecl
from graphir.errors import GraphError, GraphirError, StateError
from graphir.graph.emit import Emitter
from graphir.graph.ir import Graph
from graphir.memory import Commit, Memory, RunGraph
from graphir.memory.inputs import R, Request
from graphir.memory.io import Reader, Writer
from graphir.memory.kv import KVCache
from graphir.memory.latent import LatentCache
from graphir.memory.layers import ContextParams, LayerNeeds, kinds_of, needs_of
from graphir.memory.recurrent import RecurrentMemory


class Composite(Memory):
    """Parts by name, in a fixed order (the order they are planned, restored and saved in)."""

    keeps_cells = True

    def __init__(self, needs: LayerNeeds, params: ContextParams = ContextParams(),
                 layer_kinds: frozenset[str] | None = None):
        super().__init__(needs, params, layer_kinds)
        self.parts = {name: p for name, p in self.make_parts(needs, params).items() if p.layers}
        self.route = self._routes(self.parts)
        self.split = next((p.split for p in self.parts.values() if p.split != "simple"), "simple")
        self.buffer_roles = frozenset().union(*(p.buffer_roles for p in self.parts.values()))

    def make_parts(self, needs: LayerNeeds, params: ContextParams) -> dict[str, Memory]:
        raise NotImplementedError

    @staticmethod
    def _routes(parts: dict[str, Memory]) -> dict[tuple[int, type], Memory]:
        """Which part keeps each (layer, type of need): a layer may have needs of two types in two parts."""
        return {(il, type(n)): p for p in parts.values() for il, n in p.need.items()}

    def _part(self, il: int, need: type) -> Memory:
        part = self.route.get((il, need))
        if part is None:
            raise GraphError(f"layer {il} keeps no {need.__name__} need in this '{self.kind}' memory")
        return part

    def layout(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind}
        for name, p in self.parts.items():
            out.update((f"{name}.{k}", v) for k, v in p.layout().items() if k != "kind")
        return out

    # ---- graph side: each layer's request goes to its part ------------------------------------------

    def ubatch_dims(self) -> tuple[Dim, Dim | None, list[DimDecl]]:
        split_by = next((p for p in self.parts.values() if p.split != "simple"), None)
        return (split_by or super()).ubatch_dims()

    def dims(self) -> list[DimDecl]:
        seen: dict[str, DimDecl] = {}
        for p in self.parts.values():
            for d in p.dims():
                seen.setdefault(d.name, d)
        return list(seen.values())

    def sizes(self) -> dict[str, int]:
        return {k: v for p in self.parts.values() for k, v in p.sizes().items()}

    def input_for(self, e: Emitter, il: int, request: Request[R]) -> R:
        return self._part(il, request.need).input_for(e, il, request)

    # ---- run time ---------------------------------------------------------------------------------------

    def refuse(self, batch: Any, pos: np.ndarray) -> str | None:
        return next((why for p in self.parts.values() if (why := p.refuse(batch, pos))), None)

    def bind_shift(self, graph: Graph, run: RunGraph) -> None:
        for p in self.parts.values():
            p.bind_shift(graph, run)

    def seq_pos_max(self, seq: int) -> int:
        return min(p.seq_pos_max(seq) for p in self.parts.values() if p.positions)

    def seq_pos_min(self, seq: int) -> int:
        return max(p.seq_pos_min(seq) for p in self.parts.values() if p.positions)

    def prepare(self, ubatches: list[UBatch]) -> list[Any]:
        per_part = [p.prepare(ubatches) for p in self.parts.values()]  # any part may refuse: nothing changed
        return [list(plans) for plans in zip(*per_part)]

    def apply(self, ub: UBatch, plan: Any) -> dict[str, Any]:
        feeds: dict[str, Any] = {}
        for p, part_plan in zip(self.parts.values(), plan):
            feeds.update(p.apply(ub, part_plan))
        return feeds

    def buffers(self) -> dict[str, np.ndarray]:
        return {k: v for p in self.parts.values() for k, v in p.buffers().items()}

    def buffer_shapes(self) -> dict[str, tuple[tuple[int, ...], Any]]:
        return {k: v for p in self.parts.values() for k, v in p.buffer_shapes().items()}

    def snapshot(self, plans: list[Any]) -> Any:
        return [p.snapshot([plan[i] for plan in plans]) for i, p in enumerate(self.parts.values())]

    def restore(self, snap: Any) -> None:
        for p, s in zip(self.parts.values(), snap):
            p.restore(s)

    # ---- saved state: each part's section, named -----------------------------------------------------

    def state_write(self, w: Writer, seq: int | None) -> None:
        for name, p in self.parts.items():
            w.s(name)
            p.state_write(w, seq)

    def state_read(self, r: Reader, dst: int | None) -> Commit:
        commits = []
        for name, p in self.parts.items():
            got = r.s("memory part name")
            if got != name:
                raise StateError(f"state data is malformed: memory part '{got}' where this context has '{name}'")
            try:
                commits.append(p.state_read(r, dst))
            except StateError as e:
                raise StateError(f"memory part '{name}': {e}") from None

        def commit() -> None:
            for c in commits:
                c()
        return commit

    # ---- the memory API, part by part ------------------------------------------------------------------

    def clear(self, data: bool = True) -> None:
        for p in self.parts.values():
            p.clear(data)

    def can_seq_rm(self, seq: int, p0: int = -1, p1: int = -1) -> bool:
        return all(p.can_seq_rm(seq, p0, p1) for p in self.parts.values())

    def seq_rm(self, seq: int, p0: int = -1, p1: int = -1) -> bool:
        if not self.can_seq_rm(seq, p0, p1):
            return False
        for p in self.parts.values():
            p.seq_rm(seq, p0, p1)
        return True

    def seq_cp(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None:
        for p in self.parts.values():
            p.seq_cp(src, dst, p0, p1)

    def seq_keep(self, seq: int) -> None:
        for p in self.parts.values():
            p.seq_keep(seq)

    def seq_add(self, seq: int, p0: int, p1: int, delta: int) -> None:
        for p in self.parts.values():
            p.seq_add(seq, p0, p1, delta)

    def seq_div(self, seq: int, p0: int, p1: int, d: int) -> None:
        for p in self.parts.values():
            p.seq_div(seq, p0, p1, d)

    def can_shift(self) -> bool:
        return all(p.can_shift() for p in self.parts.values())

    def update(self) -> bool:
        return any([p.update() for p in self.parts.values()])  # a list: every part updates

    def clone(self) -> Composite:
        new = copy.copy(self)
        new.parts = {name: p.clone() for name, p in self.parts.items()}
        new.route = self._routes(new.parts)
        return new


def swa_cells(params: ContextParams, window: int) -> int:
    """llama.cpp's SWA cache size: the window of every sequence plus a ubatch, padded to 256, at most n_ctx
    before padding; n_ctx with ``swa_full``."""
    if not params.n_ctx:
        return 0
    if params.swa_full:
        return params.n_ctx
    n = min(params.n_ctx, window * (params.n_seq_max if params.unified else 1) + params.n_ubatch)
    return (n + 255) // 256 * 256


class SWAPair(Composite):
    """Without ``swa_full`` the SWA cache forgets what its window left behind, so two edits llama.cpp would
    accept and then compute wrongly (or abort on) are refused here, changing nothing: cutting a sequence's
    tail back to where the window of its next token reaches into forgotten positions (``seq_rm`` answers
    False), and position edits (``seq_add``/``seq_div`` raise), which would need the forgotten K rows."""

    kind = "iswa"
    serves = frozenset({"full", "swa"})
    requires = frozenset({"swa"})

    def make_parts(self, needs: LayerNeeds, params: ContextParams) -> dict[str, Memory]:
        windows = {n.window for e in needs for n in needs_of(e) if n.kind == "swa"}  # type: ignore[union-attr]
        size = swa_cells(params, max(windows)) if windows else 0
        return {"base": KVCache(needs, params, frozenset({"full"})),
                "swa": KVCache(needs, params, frozenset({"swa"}), name="swa", size=size, recycle=not params.swa_full)}

    def _windowed(self) -> bool:
        """Whether the SWA cache forgets what left the window: it reuses cells and has fewer than n_ctx."""
        swa = self.parts.get("swa")
        return swa is not None and swa.recycle and swa.n_ctx < self.params.n_ctx  # type: ignore[attr-defined]

    def can_shift(self) -> bool:
        """As llama.cpp: only when the SWA cache keeps every cell (else it lost K rows a shift needs)."""
        return super().can_shift() and not self._windowed()

    def can_seq_rm(self, seq: int, p0: int = -1, p1: int = -1) -> bool:
        if not super().can_seq_rm(seq, p0, p1):
            return False
        if not self._windowed():
            return True
        seqs = [seq] if seq >= 0 else range(self.params.n_seq_max)
        return all(self._window_kept(s, max(p0, 0), p1) for s in seqs)

    def _window_kept(self, seq: int, p0: int, p1: int) -> bool:
        """Whether, once seq's positions [p0, p1) are gone, the window of its next token holds everything it
        held before: only a cut of the tail matters (later tokens' rows were computed already). What the
        sequence held is what the full layers keep; a model whose layers all slide is taken to have held every
        position from 0 (a cut it cannot check is refused)."""
        swa: KVCache = self.parts["swa"]  # type: ignore[assignment]
        base: KVCache | None = self.parts.get("base")  # type: ignore[assignment]
        last = self.seq_pos_max(seq)
        if last < 0 or (0 <= p1 <= last) or p0 == 0:
            return True
        held = np.arange(min(p0, last + 1)) if base is None else base.pos[base._holds(seq) & (base.pos < p0)]
        history = np.unique(held)
        if not len(history):
            return True
        nxt = int(history[-1]) + 1
        wanted = history[swa.rule.sees(nxt, history)]
        return bool(np.isin(wanted, swa.pos[swa._holds(seq)]).all())

    def _edit(self, what: str) -> None:
        if self._windowed():
            raise GraphirError(f"{what}: this iswa memory's SWA cache holds only the window (swa_full=False), so "
                               f"it cannot move positions; make the context with swa_full=True")

    def seq_add(self, seq: int, p0: int, p1: int, delta: int) -> None:
        self._edit("seq_add")
        super().seq_add(seq, p0, p1, delta)

    def seq_div(self, seq: int, p0: int, p1: int, d: int) -> None:
        self._edit("seq_div")
        super().seq_div(seq, p0, p1, d)


class HybridMemory(Composite):
    """Recurrent layers beside attention layers of one kind: per-head K and V (a KV cache) or multi-head
    latent attention (a latent cache, as an MLA + linear-attention hybrid such as Kimi-Linear needs)."""

    kind = "hybrid"
    serves = frozenset({"full", "latent", "recurrent"})
    requires = frozenset({"recurrent"})

    @classmethod
    def fits(cls, layer_kinds: set[str]) -> bool:
        """Recurrent layers and attention layers of exactly one of the two kinds."""
        return super().fits(layer_kinds) and len(layer_kinds & {"full", "latent"}) == 1

    def make_parts(self, needs: LayerNeeds, params: ContextParams) -> dict[str, Memory]:
        attn = (LatentCache(needs, params, frozenset({"latent"})) if "latent" in kinds_of(needs)
                else KVCache(needs, params, frozenset({"full"})))
        return {"attn": attn, "recr": RecurrentMemory(needs, params, frozenset({"recurrent"}))}

    def __init__(self, needs: LayerNeeds, params: ContextParams = ContextParams(),
                 layer_kinds: frozenset[str] | None = None):
        super().__init__(needs, params, layer_kinds)
        if "recr" in self.parts:  # llama.cpp's hybrid: equal parts, sequential only with a stream per sequence
            self.split = "equal" if params.unified else "sequential"

class HybridISWA(Composite):
    """Recurrent layers beside attention layers of which some or all slide: the attention part is an
    :class:`SWAPair` (its refusals of edits the window forgot are the whole memory's), the recurrent part a
    recurrent memory; ubatches are split equally, as the recurrent part needs."""

    kind = "hybrid_iswa"
    serves = frozenset({"full", "swa", "recurrent"})
    requires = frozenset({"swa", "recurrent"})

    def make_parts(self, needs: LayerNeeds, params: ContextParams) -> dict[str, Memory]:
        return {"attn": SWAPair(needs, params, frozenset({"full", "swa"})),
                "recr": RecurrentMemory(needs, params, frozenset({"recurrent"}))}
