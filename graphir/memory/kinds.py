"""The memory kinds a context can be made with, by the name users pick them by: the only such table.

A model's layer needs (:mod:`graphir.memory.layers`) decide which kinds fit it: a kind fits when it serves
every kind of layer the model has and the model has the kinds it requires. The first that fits, in this
table's order, is the model's default (llama.cpp's ``create_memory`` as data); ``none`` comes last, for
running a prompt in one ubatch without a cache. Adding a kind is one class and one entry here; contexts,
graph dumps and the command line all read this table.
"""

from __future__ import annotations

from graphir.errors import GraphirError
from graphir.memory import Memory
from graphir.memory.composite import HybridMemory, SWAPair
from graphir.memory.kv import KVCache
from graphir.memory.layers import ContextParams, LayerNeeds, kinds_of
from graphir.memory.none import NoMemory
from graphir.memory.recurrent import RecurrentMemory

KINDS: dict[str, type[Memory]] = {m.kind: m for m in (KVCache, SWAPair, RecurrentMemory, HybridMemory, NoMemory)}


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
