"""graphir's graph of a model against llama.cpp's: the pair ``graphir diff`` compares, and whether they agree."""

from __future__ import annotations

from typing import TYPE_CHECKING

from graphir.graph.ir import Graph
from graphir.llamacpp import strip_prefix
from graphir.llamacpp.reading import N_CTX

if TYPE_CHECKING:
    from graphir.model.meta import ModelMeta


def diff_pair(a: str, b: str, context: str | None, phase: str | None) -> tuple[Graph, Graph]:
    """The graphs of A and B for ``graphir diff``: graphir's graph of a model (or a saved graph) against
    llama.cpp's, both in the normal form (:mod:`graphir.llamacpp.normalize`), the model's built for the memory
    llama.cpp gave it and its context's cells (Phi-3's LongRoPE picks its factors by them); two llama.cpp
    graphs as they are."""
    from graphir.llamacpp.normalize import compare_forms
    from graphir.source import DEFAULT_PHASE, load_graph, open_source

    llama_first = strip_prefix(a) is not None
    if llama_first and strip_prefix(b) is not None:
        return load_graph(a, context, phase), load_graph(b, context, phase)
    ours_src, theirs_src = (b, a) if llama_first else (a, b)
    ours_obj = open_source(ours_src)
    if isinstance(ours_obj, Graph):
        ours = load_graph(ours_src, context, phase)  # checks an explicit context or phase against the saved ones
        theirs = load_graph(theirs_src, context, phase or ours.meta.get("phase"))
    else:
        theirs = load_graph(theirs_src, context, phase)
        ours = ours_obj.build_graph(theirs.meta["context"], phase or DEFAULT_PHASE, n_ctx_seq=N_CTX)
    normal_ours, normal_theirs = compare_forms(ours, theirs)
    return (normal_theirs, normal_ours) if llama_first else (normal_ours, normal_theirs)


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
