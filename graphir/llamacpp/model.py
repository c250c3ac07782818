"""llama.cpp's graphs of a model graphir has opened: which memory, which phases, and the graphs themselves."""

from __future__ import annotations

from typing import TYPE_CHECKING

from graphir.errors import GraphirError
from graphir.llamacpp.convert import to_graph
from graphir.llamacpp.reading import N_CTX, PHASE_SIZES, reserve

if TYPE_CHECKING:
    from graphir.graph.ir import Graph
    from graphir.model.meta import ModelMeta


def context_of(g: Graph) -> str:
    """The memory llama.cpp gave the model, by graphir's name for it, read off the graph's inputs: an encoder's
    output (cross), caches of keys and of recurrent states (hybrid; hybrid_iswa with a sliding-window mask), of
    states (recurrent), of keys with a second, sliding-window mask (iswa), of latent keys beside an indexer's keys
    (kv_dsa), of keys alone (mla: values are read from the key cache), of keys and
    values (kv), or none. A recurrent state is either kind of row (LFM2's convolutions keep rolling rows only)."""
    roles = {n.attrs["role"] for n in g.inputs}
    states = bool(roles & {"rs_r", "rs_s"})
    if "cross_embd" in roles:
        return "cross"
    if "cache_k" in roles:
        if "cache_k_lid" in roles:
            return "kv_dsa"
        if states:
            return "hybrid_iswa" if "kq_mask_swa" in roles else "hybrid"
        if "kq_mask_swa" in roles:
            return "iswa"
        return "kv" if "cache_v" in roles else "mla"
    return "recurrent" if states else "none"


def graphs(meta: ModelMeta, phases: tuple[str, ...], context: str | None = None) -> list[Graph]:
    """llama.cpp's graph of ``meta`` for each phase (prefill: one ubatch of N_UBATCH tokens, all output;
    decode: one token), in a cache of N_CTX cells."""
    for phase in phases:
        if phase not in PHASE_SIZES:
            raise GraphirError(f"llama.cpp's graphs are of phase {' or '.join(PHASE_SIZES)}, not '{phase}'")
    weights = frozenset(meta.tensors)
    out = []
    for phase, records in zip(phases, reserve(meta, phases)):
        n_tokens, _, n_outputs = PHASE_SIZES[phase]
        sizes = {"n_layer": meta.metadata.get(f"{meta.arch_name}.block_count", 0), "n_ctx": N_CTX,
                 "n_tokens": n_tokens, "n_outputs": n_outputs}  # printed as the graph's hparams
        g = to_graph(records, weights, {}, N_CTX)
        own = context_of(g)
        if context is not None and context != own:
            raise GraphirError(f"{meta.label}: llama.cpp builds a '{meta.arch_name}' model with its own memory "
                               f"({own}), not '{context}'")
        g.meta = {"arch": meta.arch_name, "context": own, "phase": phase, "hparams": sizes}
        out.append(g)
    return out
