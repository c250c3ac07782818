"""What one layer needs kept between ubatches, as an architecture states it from its hparams.

An architecture answers ``layers()`` with one of these per layer (``None``: the layer keeps nothing, e.g. a
dense block without attention). They name sizes and semantics only, never a cache class: the memory
registry (:mod:`graphir.memory.kinds`) picks the memory that serves a model's mix of needs, and a composite
memory routes each layer to the part that serves its kind, as llama.cpp's layer filters do.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Union


@dataclass(frozen=True)
class Attention:
    """Self-attention over the layer's own K and V rows: all earlier tokens (``window`` 0) or, with a
    sliding window, the last ``window`` positions (a key at p_k is seen from p_q while p_q - p_k < window).
    ``causal`` False: every token of a sequence sees every other (encoders; nothing can be cached)."""

    n_embd_k: int
    n_embd_v: int
    window: int = 0
    causal: bool = True

    @property
    def kind(self) -> str:
        return "encoder" if not self.causal else "swa" if self.window else "full"


@dataclass(frozen=True)
class Recurrent:
    """Per sequence, a rolling state (conv columns, token shifts) of ``n_embd_r`` floats and a recurrent
    state (SSM state, WKV matrices) of ``n_embd_s`` floats, replaced by each ubatch."""

    n_embd_r: int
    n_embd_s: int
    kind = "recurrent"


@dataclass(frozen=True)
class CrossAttention:
    """Attention over another context's stored output (an encoder-decoder's decoder layers): K and V rows
    computed once from the encoder output and read by every decode."""

    n_embd_k: int
    n_embd_v: int
    kind = "cross"


@dataclass(frozen=True)
class LatentAttention:
    """A K-only latent cache (multi-head latent attention): one compressed row of ``n_embd_latent`` floats per
    token, from which the layer rebuilds K and V."""

    n_embd_latent: int
    kind = "latent"


Need = Union[Attention, Recurrent, CrossAttention, LatentAttention]
LayerNeeds = tuple[Optional[Need], ...]  # one per layer, None where a layer keeps nothing


def kinds_of(needs: LayerNeeds) -> set[str]:
    """The kinds of layer a model has: ``full`` and ``swa`` attention, ``encoder`` (non-causal) attention,
    ``recurrent``, ``cross``, ``latent``; what the memory registry matches memories against."""
    return {n.kind for n in needs if n is not None}


@dataclass(frozen=True)
class ContextParams:
    """The sizes a context gives its memory. ``n_ctx`` 0: a memory for building graphs only (no buffers)."""

    n_ctx: int = 0
    n_seq_max: int = 1
    n_ubatch: int = 512
    type_k: str = "f16"
    type_v: str = "f16"
    unified: bool = True
    owner: Any = None  # the hparams of the model the memory is for: compared by set_memory, never read
