"""Inputs a graph declares with a rule and the context fills each ubatch (llama.cpp's graph inputs whose
``set_input`` computes them from the ubatch: Llama 4's attention temperature, lightning attention's decays).

A rule is registered by the module that builds the input, under the input's role; the input node carries the
rule's facts as attributes. The context asks :func:`rules_of` once per graph and calls :func:`fill` per ubatch,
so a new kind of per-ubatch input is one more entry here, never a case in the context."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Mapping

import numpy as np

if TYPE_CHECKING:
    from graphir.batch import UBatch
    from graphir.graph.ir import Graph

Rule = Callable[[Mapping[str, Any], "UBatch"], np.ndarray]
"""(the input's attributes, the ubatch) -> the input's data in numpy order (ggml's dims reversed)."""

RULES: dict[str, Rule] = {}


def register(role: str, rule: Rule) -> None:
    """Fill every graph input of ``role`` by ``rule``; a role has one rule (a module imported again registers
    the same function again)."""
    known = RULES.setdefault(role, rule)
    if _where(known) != _where(rule):
        raise ValueError(f"a per-ubatch rule for inputs '{role}' is already registered ({_where(known)})")


def _where(rule: Rule) -> str:
    return f"{rule.__module__}.{rule.__qualname__}"


def rules_of(g: Graph) -> list[tuple[str, Mapping[str, Any], Rule]]:
    """The graph's inputs that a registered rule fills: (name, attributes, rule)."""
    return [(n.name, n.attrs, RULES[n.attrs["role"]]) for n in g.inputs if n.attrs["role"] in RULES]


def fill(rules: list[tuple[str, Mapping[str, Any], Rule]], ub: UBatch) -> dict[str, np.ndarray]:
    """The data of each ruled input for one ubatch, by input name."""
    return {name: rule(attrs, ub) for name, attrs, rule in rules}
