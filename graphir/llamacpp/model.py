"""llama.cpp's graphs of a model graphir has opened: which memory, which phases, and the graphs themselves."""

from __future__ import annotations

from typing import TYPE_CHECKING

from graphir.errors import GraphirError
from graphir.llamacpp.convert import to_graph
from graphir.llamacpp.reading import N_CTX, PHASE_SIZES, reserve

if TYPE_CHECKING:
    from graphir.graph.ir import Graph
    from graphir.model.meta import ModelMeta


def context_of(meta: ModelMeta) -> str:
    """The memory llama.cpp gives the model, by graphir's name for it: the architecture's own when graphir has
    the architecture (llama.cpp has one memory per architecture), else ``llama.cpp``."""
    from graphir import arch as archs

    return meta.arch.contexts[0] if meta.arch_name in archs.names() else "llama.cpp"


def graphs(meta: ModelMeta, phases: tuple[str, ...], context: str | None = None) -> list[Graph]:
    """llama.cpp's graph of ``meta`` for each phase (prefill: one ubatch of N_UBATCH tokens, all output;
    decode: one token), in a cache of N_CTX cells."""
    own = context_of(meta)
    if context is not None and context != own:
        raise GraphirError(f"{meta.label}: llama.cpp builds a '{meta.arch_name}' model with its own memory "
                           f"({own}), not '{context}'")
    for phase in phases:
        if phase not in PHASE_SIZES:
            raise GraphirError(f"llama.cpp's graphs are of phase {' or '.join(PHASE_SIZES)}, not '{phase}'")
    weights = frozenset(meta.tensors)
    out = []
    for phase, records in zip(phases, reserve(meta, phases)):
        n_tokens, _, n_outputs = PHASE_SIZES[phase]
        hparams = {"n_layer": meta.metadata.get(f"{meta.arch_name}.block_count", 0), "n_ctx": N_CTX, "n_tokens": n_tokens,
                   "n_outputs": n_outputs}
        out.append(to_graph(records, weights, {"arch": meta.arch_name, "context": own, "phase": phase,
                                               "source": "llama.cpp", "hparams": hparams}))
    return out
