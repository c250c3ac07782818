"""Structural identity: a SHA-256 Merkle hash per node and per graph, stable across versions and machines.

A node's key digests its op, dtype, shape, attributes and its operands' keys in slot order; leaves (weights
and inputs) are identified by name, while intermediate names do not count (renaming one keeps the hash).
Swapping two operands changes the key because slots are ordered. The graph hash covers the computation
(outputs and open dims), not the header: an hparam that changes no node changes no hash. We never store hashes of
third-party algorithms (networkx's Weisfeiler-Lehman changed between releases).
"""

from __future__ import annotations

import hashlib

from graphir.graph.forms import _attrs_text
from graphir.graph.ir import Graph, Node
from graphir.graph.ops import LEAVES

HASH_VERSION = "graphir-hash-v1"


def node_keys(g: Graph) -> dict[str, str]:
    """name -> hex key for every node (computed in one topological pass)."""
    keys: dict[int, str] = {}
    out: dict[str, str] = {}
    for n in g.nodes:
        ident = n.name if n.op in LEAVES else ""
        operands = ",".join(keys[id(i)] for i in n.inputs)
        text = f"{n.op}|{ident}|{n.dtype}[{','.join(map(str, n.shape))}]|{_attrs_text(n.attrs)}|{operands}"
        k = hashlib.sha256(text.encode()).hexdigest()
        keys[id(n)] = out[n.name] = k
    return out


def graph_hash(g: Graph, keys: dict[str, str] | None = None) -> str:
    """Hash of the outputs' keys and the open dims: equal iff the computations are structurally equal."""
    keys = keys or node_keys(g)
    parts = [HASH_VERSION] + [str(d) for d in g.dims] + [f"{r}={keys[n.name]}" for r, n in g.outputs.items()]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def layer_hashes(g: Graph) -> dict[int, str]:
    """Per-layer digest of the layer's own nodes' keys (changes upstream of a layer propagate into it)."""
    keys = node_keys(g)
    acc: dict[int, hashlib._Hash] = {}
    for n in g.nodes:
        if n.layer is not None:
            acc.setdefault(n.layer, hashlib.sha256()).update(keys[n.name].encode())
    return {il: h.hexdigest() for il, h in sorted(acc.items())}
