"""The verifier: every node re-checked against the op catalogue, in topological order.

It runs on every parsed graph and in the tests on every built one. A failure names the node, its op, and
what was recorded versus what the rules infer, so the message alone points at the bug.
"""

from __future__ import annotations

from graphir.errors import GraphError
from graphir.graph.ir import FLOAT_TYPES, Graph
from graphir.graph.ops import OPS, ShapeError, infer

_TYPE_NAMES: frozenset[str] | None = None


def _known_types() -> frozenset[str]:
    global _TYPE_NAMES
    if _TYPE_NAMES is None:
        from gguf import GGMLQuantizationType

        _TYPE_NAMES = frozenset(t.name.lower() for t in GGMLQuantizationType)
    return _TYPE_NAMES


def verify(g: Graph) -> None:
    """Raise GraphError at the first node whose operands, attributes or type break the catalogue's rules."""
    seen: set[int] = set()
    names: set[str] = set()
    for n in g.nodes:
        where = f"node {n.name} ({n.op})"
        if n.name in names:
            raise GraphError(f"{where}: name used twice")
        names.add(n.name)
        if n.op not in OPS:
            raise GraphError(f"{where}: unknown op")
        if n.dtype not in _known_types():
            raise GraphError(f"{where}: unknown dtype {n.dtype!r}")
        for slot, x in enumerate(n.inputs):
            if id(x) not in seen:
                raise GraphError(f"{where}: operand {slot} %{x.name} is not defined before use")
        if OPS[n.op].kind == "leaf":
            if n.inputs:
                raise GraphError(f"{where}: a leaf takes no operands")
            if n.op == "weight" and n.attrs != {"tensor": n.name}:
                raise GraphError(f"{where}: a weight's tensor attribute must be its name")
            if n.op == "input" and not isinstance(n.attrs.get("role"), str):
                raise GraphError(f"{where}: an input needs a role")
        else:
            try:
                dtype, shape = infer(n.op, list(n.inputs), n.attrs)
            except ShapeError as e:
                raise GraphError(f"{where}: {e}") from None
            if (dtype, tuple(shape)) != (n.dtype, tuple(n.shape)):
                got = f"{n.dtype}[{', '.join(map(str, n.shape))}]"
                want = f"{dtype}[{', '.join(map(str, shape))}]"
                raise GraphError(f"{where}: recorded type {got}, but its operands give {want}")
        seen.add(id(n))
    for role, n in g.outputs.items():
        if id(n) not in seen:
            raise GraphError(f"output {role} (%{n.name}) is not a node of the graph")
        if n.dtype not in FLOAT_TYPES:
            raise GraphError(f"output {role} (%{n.name}) has non-float type {n.dtype}")
