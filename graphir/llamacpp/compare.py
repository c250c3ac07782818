"""Whether graphir's graph of a model is llama.cpp's, and where a difference sits in each graph's own names."""

from __future__ import annotations

from typing import TYPE_CHECKING

from graphir.graph.ir import Graph
from graphir.llamacpp.reading import N_CTX

if TYPE_CHECKING:
    from graphir.model.meta import ModelMeta


def agreement(meta: ModelMeta) -> dict[str, str | None]:
    """Per phase of the memory llama.cpp gives the model (prefill, and decode when graphir's memory of that kind
    has one): None when graphir's graph and llama.cpp's have the same normal form, else the first difference."""
    from graphir.graph.diff import diff_graphs
    from graphir.llamacpp.model import graphs
    from graphir.llamacpp.normalize import compare_forms
    from graphir.memory.kinds import KINDS

    theirs = graphs(meta, ("prefill", "decode"))
    context = theirs[0].meta["context"]
    phases = KINDS[context].phases if context in KINDS else ("prefill",)
    out: dict[str, str | None] = {}
    for g in theirs:
        phase = g.meta["phase"]
        if phase not in phases:
            continue
        a, b = compare_forms(meta.build_graph(context, phase, n_ctx_seq=N_CTX), g)
        d = diff_graphs(a, b, "graphir", "llama.cpp")
        out[phase] = None if d.same else (d.first or "; ".join(d.summary[1:2]))
    return out


def origins(first: str | None, a: Graph, b: Graph) -> tuple[str, str] | None:
    """The names the first differing node had in each graph before the normal form (``-``: not in that graph),
    so that a difference between normal names (``blk.0.mul.3``) reads in the graphs' own (``blk.0.ffn_norm``)."""
    if first is None or ": " not in first:
        return None
    name = first.split(": ", 1)[0]
    names = [g.meta.get("origin", {}).get(name, "-") for g in (a, b)]
    return None if names == ["-", "-"] else (names[0], names[1])
