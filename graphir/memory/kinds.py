"""The memory kinds a context can be made with, by the name users pick them by: the only such table.

A model's layer needs (:mod:`graphir.memory.layers`) decide which kinds fit it: a kind fits when it serves
every kind of layer the model has and the model has the kinds it requires. The first that fits, in this
table's order, is the model's default (llama.cpp's ``create_memory`` as data); ``none`` comes last, for
running a prompt in one ubatch without a cache. Adding a kind is one class and one entry here; contexts,
graph dumps and the command line all read this table.
"""

from __future__ import annotations

import numpy as np

from graphir.errors import GraphirError
from graphir.graph.ir import Graph
from graphir.memory import Memory
from graphir.memory.composite import HybridISWA, HybridMemory, SWAPair
from graphir.memory.cross import CrossMemory
from graphir.memory.dsa import DSACache
from graphir.memory.kv import KVCache
from graphir.memory.latent import LatentCache
from graphir.memory.layers import ContextParams, LayerNeeds, kinds_of
from graphir.memory.none import NoMemory
from graphir.memory.recurrent import RecurrentMemory

KINDS: dict[str, type[Memory]] = {m.kind: m for m in (KVCache, SWAPair, RecurrentMemory, HybridMemory, HybridISWA,
                                                      CrossMemory, LatentCache, DSACache, NoMemory)}


def fitting(needs: LayerNeeds) -> tuple[str, ...]:
    """The kinds that can hold a model with these layer needs, its default first."""
    layer_kinds = kinds_of(needs)
    return tuple(name for name, m in KINDS.items() if m.fits(layer_kinds))


def assemble(kind: str, needs: LayerNeeds, params: ContextParams = ContextParams()) -> Memory:
    """The memory of kind ``kind`` for these needs (graph-only when params.n_ctx is 0)."""
    m = KINDS.get(kind)
    if m is None:
        raise GraphirError(f"unknown context '{kind}' (known: {', '.join(KINDS)})")
    if not m.fits(kinds_of(needs)):
        raise GraphirError(f"memory kind '{kind}' cannot hold layers of kind {', '.join(sorted(kinds_of(needs)))}")
    return m(needs, params)


ITEM_BYTES = {"f16": 2, "bf16": 2, "f32": 4}  # the element types memory buffers are kept in


def footprint(graph: Graph, memory: Memory) -> dict[str, tuple[int, int, int]]:
    """What a memory holds, read off a graph it built: per size dim (``n_ctx``, ``n_ctx_swa``, ``n_rs``), the
    cells it stands for, how many per-layer buffers are sized by it, and their bytes. The graph declares each
    buffer (an input of one of the memory's ``buffer_roles``) with its type, width and cells dim (its last);
    the memory says how many cells each dim is (``Memory.sizes``)."""
    sizes, declared, out = memory.sizes(), memory.buffer_shapes(), {}
    for n in graph.nodes:
        if n.op != "input" or n.attrs["role"] not in memory.buffer_roles:
            continue
        dim = str(n.shape[-1])
        cells, count, nbytes = out.get(dim, (sizes[dim], 0, 0))
        width = int(np.prod([int(d) for d in n.shape[:-1]]))
        # the memory's own type where it declares the buffer (its cache types), else the graph's
        item = np.dtype(declared[n.name][1]).itemsize if n.name in declared else ITEM_BYTES[n.dtype]
        out[dim] = (cells, count + 1, nbytes + width * cells * item)
    return out
