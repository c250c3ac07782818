"""What a graph computes, counted from its nodes: the floating-point operations of its matrix products as a size
in the graph's own symbols (``n_tokens``, ``n_outputs``, ``n_kv``, ...), so that the count at any batch and
context length is one substitution away. Matrix products are counted alone: each output value of a product
over rows of K costs K multiplies and K adds; the elementwise ops, norms and softmaxes around them add a few
operations per value, well under a percent of a transformer's total."""

from __future__ import annotations

from typing import Mapping

from graphir.graph.dims import Dim, Sym, numel
from graphir.graph.ir import Graph
from graphir.graph.ops import PRODUCTS


def flops(graph: Graph) -> Dim:
    """2 x K x (output values) summed over the graph's matrix products (the catalogue's ``product`` ops: operand
    0 is a matrix, or a stack of expert matrices, with rows of its ne0; mul_mat_id's output holds the chosen
    experts' rows only, so its count follows the experts a token uses, not those a layer holds)."""
    total: Dim = 0
    for n in graph.nodes:
        if n.op in PRODUCTS:
            total = total + 2 * n.inputs[0].shape[0] * numel(n.shape)
    return total


def substitute(size: Dim, values: Mapping[str, int]) -> Dim:
    """``size`` with the symbols ``values`` names replaced by their values; the others stay symbols."""
    if not isinstance(size, Sym):
        return size
    acc: dict[tuple[str, ...], int] = {}
    for symbols, coefficient in size.terms:
        for s in symbols:
            coefficient *= values.get(s, 1)
        kept = tuple(s for s in symbols if s not in values)
        acc[kept] = acc.get(kept, 0) + coefficient
    return Sym.make(acc)
