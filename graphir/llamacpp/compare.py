"""``graphir diff`` with a ``llama.cpp:`` source: the two graphs, in the normal form when only one is llama.cpp's."""

from __future__ import annotations

from graphir.graph.ir import Graph
from graphir.llamacpp import strip_prefix


def diff_pair(a: str, b: str, context: str | None, phase: str | None) -> tuple[Graph, Graph]:
    """The graphs of A and B for ``graphir diff``: graphir's graph of a model (or a saved graph) against
    llama.cpp's, both in the normal form (:mod:`graphir.llamacpp.normalize`), the model's built for the memory
    llama.cpp gave it; two llama.cpp graphs as they are."""
    from graphir.llamacpp.normalize import compare_forms
    from graphir.source import DEFAULT_PHASE, load_graph, open_source

    if strip_prefix(a) is not None and strip_prefix(b) is not None:
        return load_graph(a, context, phase), load_graph(b, context, phase)
    ours_src, theirs_src = (b, a) if strip_prefix(a) is not None else (a, b)
    ours_obj = open_source(ours_src)
    if isinstance(ours_obj, Graph):
        ours = load_graph(ours_src, context, phase)
        theirs = load_graph(theirs_src, context, phase or ours.meta.get("phase"))
    else:
        theirs = load_graph(theirs_src, context, phase)
        ours = ours_obj.build_graph(theirs.meta["context"], phase or DEFAULT_PHASE)
    normal_ours, normal_theirs = compare_forms(ours, theirs)
    return (normal_theirs, normal_ours) if ours_src == b else (normal_ours, normal_theirs)
