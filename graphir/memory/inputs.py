"""What a layer asks of the memory, and the graph inputs it gets back (llama.cpp's ``llm_graph_input_*``).

The builder makes one request per need of a layer (``Memory.input_for(emitter, il, request)``); a composite
routes every request by the kind of need it is for (:attr:`Request.need`) to the part keeping that need of the
layer, so a new kind of request needs no new route. What comes back is data: nodes whose facts (a mask's
causality, window and padding; a bucket count) say how they are filled. The maths over them is the builder's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Generic, TypeVar

from graphir.graph.dims import Dim
from graphir.graph.ir import Node
from graphir.memory.layers import Attention, CrossAttention, IndexerKeys, LatentAttention, Need, Recurrent

R = TypeVar("R")


# What a memory keeping no need of a kind for a layer lacks, by kind of need (with the memory's kind and the layer)
LACKS: dict[type[Need], str] = {
    Attention: "memory kind '{kind}' holds no attention for layer {il}",
    LatentAttention: ("memory kind '{kind}' keeps no latent (MLA) rows for layer {il}: multi-head latent attention "
                      "needs a memory of latent attention (kind 'mla')"),
    CrossAttention: "memory kind '{kind}' holds no encoder output for layer {il}",
    Recurrent: "memory kind '{kind}' holds no recurrent state for layer {il}",
    IndexerKeys: ("memory kind '{kind}' keeps no indexer keys for layer {il}: sparse attention with a lightning "
                  "indexer needs a memory of kind 'kv_dsa'"),
}


class Request(Generic[R]):
    """A layer's request; ``need``: the kind of need it is routed by."""

    need: ClassVar[type[Need]]

    def refusal(self, kind: str, il: int) -> str:
        """Why a memory of kind ``kind`` cannot answer it for layer il."""
        return LACKS[self.need].format(kind=kind, il=il)


@dataclass(frozen=True)
class AttnInputs:
    """What a layer attends over: K and V of every key it may see ([d, n_head_kv, n_keys]) and the mask
    [n_keys, n_tokens] (0 where a query sees a key, else -inf) whose facts say how it is filled."""

    k: Node
    v: Node
    mask: Node


@dataclass(frozen=True)
class IndexerInputs:
    """What an indexer scores: the keys of every cell it may see ([d, 1, n_keys]) and its mask [n_keys,
    n_tokens] (f16, as llama.cpp's fused indexer reads it)."""

    k: Node
    mask: Node
    n_top: Dim  # the keys a token keeps: min(cells attended over, the indexer's top_k)


@dataclass(frozen=True)
class StateInputs:
    """A layer's recurrent state of one kind: the buffer of every cell ([width, n_rs]) and the cells the
    ubatch's sequences read from (``rs_src``) or write to (``rs_dst``), one per sequence."""

    buffer: Node
    cells: Node


@dataclass(frozen=True)
class SelfAttention(Request[AttnInputs]):
    """Per-head K and V of the ubatch's tokens ([d, n_head_kv, n_tokens]), to be attended with the keys the
    memory keeps (a cache writes them first, so the tokens see themselves through it); None for a layer that
    reads another layer's cache."""

    k: Node | None
    v: Node | None
    need: ClassVar[type[Need]] = Attention


@dataclass(frozen=True)
class LatentRows(Request[AttnInputs]):
    """Multi-head latent attention's rows of the ubatch's tokens: ``k`` [width, 1, n_tokens] (one shared head)
    and ``v`` its leading values (V is a view of K's rows)."""

    k: Node
    v: Node
    need: ClassVar[type[Need]] = LatentAttention


@dataclass(frozen=True)
class PosBuckets(Request[Node]):
    """The relative position bucket [n_keys, n_tokens] of each key the layer attends over, per query (T5)."""

    need: ClassVar[type[Need]] = Attention


@dataclass(frozen=True)
class CrossRows(Request[Node]):
    """The encoder output the layer cross-attends to, [n_embd, n_enc]."""

    need: ClassVar[type[Need]] = CrossAttention


@dataclass(frozen=True)
class CrossMask(Request[Node]):
    """Which encoder outputs each token sees, [n_enc, n_tokens]: those of its sequences."""

    need: ClassVar[type[Need]] = CrossAttention


@dataclass(frozen=True)
class RecurrentState(Request[StateInputs]):
    """The layer's ``r`` (rolling) or ``s`` (recurrent) state, to read (``write`` False) or to write."""

    which: str
    write: bool = False
    need: ClassVar[type[Need]] = Recurrent


@dataclass(frozen=True)
class IndexerRotation(Request[Node]):
    """The rotation [d, d] the indexer's queries and keys go through before they are scored and kept (a
    normalised Hadamard matrix: llama.cpp's ``attn_inp_k_rot`` of the indexer cache)."""

    need: ClassVar[type[Need]] = IndexerKeys


@dataclass(frozen=True)
class IndexerRows(Request[IndexerInputs]):
    """The ubatch's indexer keys [d, 1, n_tokens], kept, then scored with the cached ones."""

    k: Node
    need: ClassVar[type[Need]] = IndexerKeys
