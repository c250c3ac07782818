"""A graph as a networkx ``MultiDiGraph``, for analysis: ancestors, cycles, subgraph matching.

This is the only module that imports networkx, so building, printing and hashing graphs never pay for it.
Node ids are the semantic names; each operand is its own edge keyed by slot, so ``mul(x, x)`` keeps both edges
and swapped operands stay distinguishable. graphir never stores networkx hashes (Weisfeiler-Lehman output
changed between networkx releases); structural identity is :mod:`graphir.graph.hashing`'s job.
"""

from __future__ import annotations

import networkx as nx

from graphir.graph.forms import _attr
from graphir.graph.ir import Graph


def to_networkx(g: Graph) -> nx.MultiDiGraph:
    """Nodes carry op, dtype, shape and attrs as canonical strings, plus layer; edges carry ``slot``."""
    out = nx.MultiDiGraph(outputs={role: n.name for role, n in g.outputs.items()})
    for n in g.nodes:
        out.add_node(n.name, op=n.op, dtype=n.dtype, shape="[" + ", ".join(map(str, n.shape)) + "]",
                     layer=n.layer, attrs={k: _attr(v) for k, v in n.attrs.items()})
    for n in g.nodes:
        for slot, x in enumerate(n.inputs):
            out.add_edge(x.name, n.name, key=slot, slot=slot)
    return out
