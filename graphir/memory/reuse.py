"""Layers that attend over another layer's cache instead of keeping one (llama.cpp's layer reuse).

A layer whose :class:`~graphir.memory.layers.Attention` need ``reads`` layer j writes no K or V: it attends
over what layer j attends over, under its own mask (llama.cpp's ``map_layer_ids[il] = map_layer_ids[j]``). The
memory keeping layer j serves it; nothing is allocated, saved or shifted for it. Graph side, the memory notes
the K and V it handed each owning layer of the graph being built, and hands the same nodes to the layers that
read them, so a reader follows its owner's write by data flow.
"""

from __future__ import annotations

import weakref
from typing import Any

from graphir.errors import GraphError, GraphirError
from graphir.memory.inputs import AttnInputs
from graphir.memory.layers import Attention, Need


def reads_of(need: Need) -> int | None:
    """The layer whose cache a need reads, or None when it keeps rows of its own."""
    return need.reads if isinstance(need, Attention) else None


def check_readers(need: dict[int, Need], kind: str) -> None:
    """Each reader reads a layer this memory keeps rows for, earlier than itself (llama.cpp asserts both)."""
    for il, n in need.items():
        j = reads_of(n)
        if j is not None and (j >= il or j not in need or reads_of(need[j]) is not None):
            raise GraphirError(f"layer {il} reads the cache of layer {j}, which the '{kind}' memory serving it "
                               f"does not keep rows for before layer {il}")


class SharedRows:
    """Per graph being built (by its emitter), the K and V each owning layer attends over."""

    def __init__(self) -> None:
        self._by_graph: weakref.WeakKeyDictionary[Any, dict[int, tuple[Any, Any]]] = weakref.WeakKeyDictionary()

    def keep(self, e: Any, il: int, k: Any, v: Any) -> None:
        self._by_graph.setdefault(e, {})[il] = (k, v)

    def read(self, e: Any, il: int, j: int, mask: Any) -> AttnInputs:
        """Layer il's inputs: layer j's K and V of this graph, under ``mask``."""
        rows = self._by_graph.get(e, {}).get(j)
        if rows is None:
            raise GraphError(f"layer {il} reads the cache of layer {j}, which this graph has not built")
        return AttnInputs(rows[0], rows[1], mask)
