"""The memory of DeepSeek's sparse attention (llama.cpp's ``llama_kv_cache_dsa``): a latent cache beside an
indexer key cache.

A DSA layer keeps two things per token: its MLA latent row (:class:`~graphir.memory.latent.LatentCache`) and
its lightning indexer's key (one head of ``indexer_head_size`` values, after RoPE and a Hadamard rotation).
Later tokens score the cached indexer keys (``lightning_indexer``), keep the ``top_k`` best and attend over the
latent rows of those alone. llama.cpp keeps the two in two ``llama_kv_cache`` objects of the same size that place
every ubatch alike; here they are the two parts of a composite (:class:`DSACache`), so the whole memory API
(sequence edits, saved states, clones, undoing a failed ubatch) is the composite's, part by part.

The indexer cache (:class:`IndexerCache`) is a K-only cache named ``lid``: its inputs are ``cache_k_lid``,
``k_idxs_lid`` and ``kq_mask_lid`` (f16: llama.cpp's fused indexer reads an f16 mask), and it hands the layer the
rotation its queries and keys go through (``k_rot``, the normalised Sylvester-Hadamard matrix of the key
width).

Position edits move both caches' cells and each re-ropes its own rows at the next update, as llama.cpp's
``llama_kv_cache_dsa`` does: the latent cache turns the key part of its rows (:mod:`graphir.memory.latent`),
the indexer cache the last ``n_rot`` values of each cached key, NeoX-style (llama.cpp makes its indexer cache
with its own hyperparameters: one key head of ``indexer_head_size`` values, NeoX RoPE, and the model's
``kv_lora_rank``, by which its K-shift views the RoPE'd part at the end of the head), with the layer's rope
frequencies. llama.cpp turns back the Hadamard rotation around that rope for quantized caches only; f16 and f32
ones (the types graphir keeps) are roped as stored, rotated, so that is the shift here too.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from graphir.batch import UBatch
from graphir.errors import GraphError, GraphirError
from graphir.graph.dims import DimDecl
from graphir.graph.emit import Emitter
from graphir.graph.ir import Graph, Node
from graphir.graph.ops import VIEWS
from graphir.memory import Memory, RunGraph
from graphir.memory.composite import Composite
from graphir.memory.inputs import IndexerInputs, IndexerRotation, IndexerRows
from graphir.memory.kv import CACHE_DTYPES, N_KV_PAD, KVCache, writes_cached_k
from graphir.memory.latent import LatentCache
from graphir.memory.layers import ContextParams, LayerNeeds, needs_of


def hadamard(n: int) -> np.ndarray:
    """The Sylvester-Hadamard matrix of order n (a power of two) over sqrt(n), in float32 as llama.cpp's
    ``ggml_gen_hadamard``: symmetric, so its ggml and numpy layouts agree."""
    h = np.full((1, 1), np.float32(1.0) / np.sqrt(np.float32(n)), np.float32)
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    return h


def rotation_width(n_embd: int) -> int:
    """The order of llama.cpp's key rotation for rows of n_embd values: the largest power of two from 64 up
    that divides them (``build_input_k_rot``)."""
    n = 64
    while n_embd % (2 * n) == 0:
        n *= 2
    return n


def indexer_ropes(graph: Graph) -> dict[int, Node]:
    """Per layer, the rope its cached indexer keys went through before their rotation (a ``mul_mat`` by the
    rotation matrix), followed back from each ``cache_k_lid`` write."""
    out: dict[int, Node] = {}
    for n in graph.nodes:
        if not writes_cached_k(n, "cache_k_lid"):
            continue
        x = n.inputs[1]
        while x.op in VIEWS:
            x = x.inputs[0]
        if x.op != "mul_mat":
            continue
        k = x.inputs[1]
        while k.op in VIEWS:
            k = k.inputs[0]
        if k.op == "rope" and n.layer is not None:
            out[n.layer] = k
    return out


class IndexerCache(KVCache):
    """Cells as the KV cache's; per served layer one buffer of indexer keys and no V."""

    kind = "indexer"
    serves = frozenset({"indexer"})
    requires = frozenset({"indexer"})
    buffer_roles = frozenset({"cache_k_lid"})
    k_role = "cache_k_lid"

    def __init__(self, needs: LayerNeeds, params: ContextParams = ContextParams()):
        widths = {n.n_embd for entry in needs for n in needs_of(entry) if n.kind in self.serves}  # type: ignore[union-attr]
        if len(widths) > 1:
            raise GraphirError(f"one indexer cache keeps keys of one width; layers ask for {sorted(widths)}")
        self.width = widths.pop() if widths else 0  # before the buffers are made
        super().__init__(needs, params, self.serves, name="lid")
        self.rotation = hadamard(rotation_width(self.width)) if self.width else np.zeros((0, 0), np.float32)
        self.top_k = min((n.top_k for n in self.need.values()), default=0)  # type: ignore[union-attr]
        self.top_dim = DimDecl("n_top_k", 1, self.top_k, "cached keys each token's indexer keeps: min(n_kv_lid, top_k)")

    def buffer_shapes(self) -> dict[str, tuple[tuple[int, ...], Any]]:
        if not self.n_ctx:
            return {}
        return {f"blk.{il}.cache_k_lid": ((self.n_ctx, self.width), CACHE_DTYPES[self.type_k]) for il in self.need}

    def layer_rows(self, il: int) -> tuple[Any, ...]:
        return (self._buffers[f"blk.{il}.cache_k_lid"],)

    def dims(self) -> list[DimDecl]:
        return super().dims() + [self.top_dim]

    def layout(self) -> dict[str, Any]:
        return {**super().layout(), "top_k": self.top_k}

    def _rotation(self, e: Emitter, il: int, r: IndexerRotation) -> Node:
        n = self.rotation.shape[0]
        return e.input("k_rot", "f32", (n, n))

    def _keys(self, e: Emitter, il: int, r: IndexerRows) -> IndexerInputs:
        """Write the ubatch's keys k [d, 1, T] into their cells; the first n_kv cells' keys and the f16 mask."""
        k = r.k
        if k.shape[0] != self.width or k.shape[1] != 1:
            raise GraphError(f"layer {il}: indexer keys {k.type_str} are not one head of {self.width} values")
        cache = e.input("cache_k_lid", self.type_k, (self.width, self.size_dim.sym), scoped=True)
        idxs = e.input("k_idxs_lid", "i64", (k.shape[2],))
        rows = e.reshape(k, (self.width, k.shape[2]), name="k_lid_rows")
        written = e.op("set_rows", cache, rows, idxs, name="cache_k_lid.write")
        keys = e.op("view", written, shape=(self.width, 1, self.kv_dim.sym), strides=(1, self.width, self.width),
                    offset=0, name="cache_k_lid.view")
        mask = e.input("kq_mask_lid", "f16", (self.kv_dim.sym, e.n_tokens), **self.rule.mask_facts(), pad=N_KV_PAD)
        return IndexerInputs(keys, mask, self.top_dim.sym)

    answers = {IndexerRotation: _rotation, IndexerRows: _keys}

    def apply(self, ub: UBatch, plan: Any) -> dict[str, Any]:
        feeds = super().apply(ub, plan)
        feeds["kq_mask_lid"] = feeds["kq_mask_lid"].astype(np.float16)
        feeds["k_rot"] = self.rotation
        feeds[self.top_dim.name] = min(feeds[self.kv_dim.name], self.top_k)
        return feeds

    def bind_shift(self, graph: Graph, run: RunGraph) -> None:
        """Each served layer's indexer key rope, as llama.cpp's K-shift of this cache turns it: NeoX over the
        last n_rot values of the stored (rotated) key; a layer whose stored key is not a rotation of a roped
        one cannot be shifted."""
        self._graph, self._run = graph, run
        ropes = {il: r for il, r in indexer_ropes(graph).items() if il in self.layers}
        self._ropes = {il: Node(r.name, r.op, r.inputs, {**r.attrs, "mode": "neox"}, r.dtype, r.shape)
                       for il, r in ropes.items()}
        self._split = {il: (self.width, 1) for il in self._ropes}
        self.shiftable = set(self._ropes) == set(self.layers)


class DSACache(Composite):
    """MLA layers' latent rows and their indexer keys, in two caches that place every ubatch alike."""

    kind = "kv_dsa"
    serves = frozenset({"latent", "indexer"})
    requires = frozenset({"indexer"})

    def make_parts(self, needs: LayerNeeds, params: ContextParams) -> dict[str, Memory]:
        return {"mla": LatentCache(needs, params, frozenset({"latent"})), "lid": IndexerCache(needs, params)}
