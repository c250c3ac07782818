"""The graph IR: typed nodes with symbolic shapes, in emission (= topological) order.

Everything is a :class:`Node`: graph inputs (op ``input``, with a role such as ``tokens`` or ``kq_mask``),
weights (op ``weight``, carrying their GGUF tensor name, type and shape, never data) and computations.
Shapes are listed in ggml order, ``ne0`` (the contiguous axis) first, so a weight reads exactly as GGUF
declares it: ``token_embd.weight : q8_0[576, 49152]``. Node names are semantic and scoped by layer
(``blk.3.Qcur``), so a change inside one layer renames nothing outside it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from graphir.graph.dims import DimDecl, Dim

# Value types: the GGML tensor types by their lowercase GGUF name (f32, f16, bf16, q4_1, q4_k, i32, ...).
FLOAT_TYPES = frozenset({"f32", "f16", "bf16"})
INDEX_TYPES = frozenset({"i32", "i64"})

_LAYER = re.compile(r"^(?:[a-z]+\.)?blk\.(\d+)\.")  # a stack's prefix may come first: enc.blk.0., dec.blk.0.


class Node:
    """One value of the graph. Immutable by convention: passes build new nodes instead of editing."""

    __slots__ = ("name", "op", "inputs", "attrs", "dtype", "shape", "layer")

    def __init__(self, name: str, op: str, inputs: tuple[Node, ...], attrs: dict[str, Any], dtype: str,
                 shape: tuple[Dim, ...]):
        self.name = name
        self.op = op
        self.inputs = inputs
        self.attrs = attrs
        self.dtype = dtype
        self.shape = shape
        self.layer: int | None = layer_of(name)  # read by every pass and form: parsed from the name once

    @property
    def type_str(self) -> str:
        return f"{self.dtype}[{', '.join(map(str, self.shape))}]"

    def __repr__(self) -> str:
        args = ", ".join("%" + i.name for i in self.inputs)
        return f"<Node %{self.name} = {self.op}({args}) : {self.type_str}>"


def layer_of(name: str) -> int | None:
    m = _LAYER.match(name)
    return int(m.group(1)) if m else None


@dataclass
class Graph:
    """A whole model graph: header facts, open dimensions, nodes in topological order, named outputs."""

    meta: dict[str, Any]  # arch, context, phase, hparams: what the graph was built from (printed in headers)
    dims: tuple[DimDecl, ...]
    nodes: list[Node]
    outputs: dict[str, Node]  # role -> node, e.g. {"logits": <result_output>}
    _by_name: dict[str, Node] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self._by_name = {n.name: n for n in self.nodes}

    def __getitem__(self, name: str) -> Node:
        return self._by_name[name]

    def __contains__(self, name: str) -> bool:
        return name in self._by_name

    def __len__(self) -> int:
        return len(self.nodes)

    @property
    def weights(self) -> list[Node]:
        return [n for n in self.nodes if n.op == "weight"]

    @property
    def inputs(self) -> list[Node]:
        return [n for n in self.nodes if n.op == "input"]

    @property
    def n_layer(self) -> int:
        return int(self.meta.get("hparams", {}).get("n_layer", 0))
