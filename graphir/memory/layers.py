"""What one layer needs kept between ubatches, as an architecture states it from its hparams.

An architecture answers ``layers()`` with one of these per layer (``None``: the layer keeps nothing, e.g. a
dense block without attention), or a tuple of them where a layer keeps two things (an encoder-decoder's
decoder layer: its self-attention and the encoder output it cross-attends to). They name sizes and semantics
only, never a cache class: the memory
registry (:mod:`graphir.memory.kinds`) picks the memory that serves a model's mix of needs, and a composite
memory routes each layer to the part that serves its kind, as llama.cpp's layer filters do.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional, Union

import numpy as np

# Which keys a sliding window keeps visible, by llama.cpp's swa_type: (query positions, key positions, window)
# -> bool; a key outside is masked. Adding a kind of window is one entry (llama_hparams::is_masked_swa).
WINDOWS: dict[str, Callable[[np.ndarray, np.ndarray, int], np.ndarray]] = {
    "standard": lambda q, k, n: q - k < n,                    # the last n positions, the query's own included
    "chunked": lambda q, k, n: k >= q // n * n,               # the query's chunk of n positions (Llama 4)
    "symmetric": lambda q, k, n: np.abs(q - k) <= n // 2,     # n/2 either side (bidirectional encoders)
}


@dataclass(frozen=True)
class Attention:
    """Self-attention over the layer's own K and V rows: all earlier tokens (``window`` 0) or, with a
    sliding window, the positions ``WINDOWS[swa_type]`` keeps (standard: a key at p_k is seen from p_q while
    p_q - p_k < window); with ``reads`` j, over the rows layer j keeps (same window), keeping none itself. ``causal`` False: every token of a sequence sees every other (encoders; nothing can
    be cached)."""

    n_embd_k: int
    n_embd_v: int
    window: int = 0
    causal: bool = True
    swa_type: str = "standard"
    rel_buckets: int = 0  # T5: scores get a learned bias per bucket of key-query distance (:meth:`buckets`)
    alibi: bool = False  # ALiBi: a seen key's mask value is -|key pos - query pos| (softmax scales it per head)
    reads: Optional[int] = None  # the layer whose cache this one attends over, writing none (graphir.memory.reuse)

    @property
    def kind(self) -> str:
        return "encoder" if not self.causal else "swa" if self.window else "full"

    def sees(self, q_pos: np.ndarray, k_pos: np.ndarray) -> np.ndarray:
        """Whether keys at ``k_pos`` are visible from queries at ``q_pos`` (broadcast), by position alone: not
        in the future when causal, inside the window when sliding. Sequences are the caller's business."""
        q, k = np.asarray(q_pos, np.int64), np.asarray(k_pos, np.int64)
        ok = k <= q if self.causal else np.ones(np.broadcast_shapes(q.shape, k.shape), bool)
        return ok & WINDOWS[self.swa_type](q, k, self.window) if self.window else ok

    def mask_facts(self) -> dict[str, Any]:
        """What a mask input states of the rule that fills it (printed in graphs)."""
        return {"causal": self.causal, **({"window": self.window, "swa": self.swa_type} if self.window else {}),
                **({"alibi": True} if self.alibi else {})}

    def mask(self, seen: np.ndarray, q_pos: np.ndarray, k_pos: np.ndarray) -> np.ndarray:
        """The float32 mask of keys at ``k_pos`` from queries at ``q_pos`` (broadcast): -inf where not
        ``seen``, else 0, or with ALiBi minus the distance (llama.cpp's mask for it)."""
        if not self.alibi:
            return np.where(seen, np.float32(0), np.float32(-np.inf))
        d = np.abs(np.asarray(k_pos, np.int64) - np.asarray(q_pos, np.int64)).astype(np.float32)
        return np.where(seen, -d, np.float32(-np.inf)).astype(np.float32)

    def buckets(self, q_pos: np.ndarray, k_pos: np.ndarray) -> np.ndarray:
        """T5's relative position bucket of each (query, key) pair (broadcast), llama.cpp's
        ``llama_relative_position_bucket``: distances below half the buckets (of a direction, when not
        causal) get their own bucket, longer ones share log-spaced buckets up to 128 positions, beyond which
        all share the last. The log is taken in float32 and the quotient in float64, as there: bucket edges at
        exact powers of two depend on it."""
        d = np.asarray(k_pos, np.int64) - np.asarray(q_pos, np.int64)
        n = self.rel_buckets if self.causal else self.rel_buckets >> 1
        exact = n >> 1
        if self.causal:
            base, d = 0, -np.minimum(d, 0)
        else:
            base, d = np.where(d > 0, n, 0), np.abs(d)
        with np.errstate(divide="ignore"):
            lg = np.log(d / exact).astype(np.float32)
        far = np.floor((exact + (lg * np.float32(n - exact)).astype(np.float64) / np.log(128 / exact))
                       .astype(np.float32))
        far = np.minimum(np.where(d < exact, 0, far), n - 1).astype(np.int64)
        return (base + np.where(d < exact, d, far)).astype(np.int32)


@dataclass(frozen=True)
class Recurrent:
    """Per sequence, a rolling state (conv columns, token shifts) of ``n_embd_r`` floats and a recurrent
    state (SSM state, WKV matrices) of ``n_embd_s`` floats, replaced by each ubatch."""

    n_embd_r: int
    n_embd_s: int
    kind = "recurrent"


@dataclass(frozen=True)
class CrossAttention:
    """Attention over the output of an encoder, ``n_embd`` floats per encoded token, kept per sequence
    between decodes (an encoder-decoder's decoder layers); the layer computes its K and V from it at every
    decode, as llama.cpp does."""

    n_embd: int
    kind = "cross"


@dataclass(frozen=True)
class LatentAttention:
    """A K-only latent cache (multi-head latent attention): one compressed row of ``n_embd_latent`` floats per
    token, from which the layer rebuilds K and V."""

    n_embd_latent: int
    kind = "latent"


@dataclass(frozen=True)
class IndexerKeys:
    """A sparse-attention indexer's keys (DeepSeek-V3.2's lightning indexer): one row of ``n_embd`` floats per
    token, which later tokens score to pick the ``top_k`` keys their attention may see."""

    n_embd: int
    top_k: int
    kind = "indexer"


Need = Union[Attention, Recurrent, CrossAttention, LatentAttention, IndexerKeys]
LayerNeed = Union[Need, tuple[Need, ...], None]
LayerNeeds = tuple[LayerNeed, ...]  # one per layer: a need, several, or None where a layer keeps nothing


def needs_of(entry: LayerNeed) -> tuple[Need, ...]:
    """One layer's needs as a tuple (empty when it keeps nothing)."""
    return () if entry is None else entry if isinstance(entry, tuple) else (entry,)


def kinds_of(needs: LayerNeeds) -> set[str]:
    """The kinds of need a model's layers have: ``full`` and ``swa`` attention, ``encoder`` (non-causal)
    attention, ``recurrent``, ``cross``, ``latent``, ``indexer``; what the memory registry matches memories against."""
    return {n.kind for entry in needs for n in needs_of(entry)}


@dataclass(frozen=True)
class ContextParams:
    """The sizes a context gives its memory. ``n_ctx`` 0: a memory for building graphs only (no buffers)."""

    n_ctx: int = 0
    n_seq_max: int = 1
    n_ubatch: int = 512
    type_k: str = "f16"
    type_v: str = "f16"
    unified: bool = True
    swa_full: bool = False  # sliding-window layers keep every cell, as full layers do (llama.cpp's swa_full)
    n_pos: int = 1  # positions a token takes (llama.cpp's n_pos_per_embd): with M-RoPE's 4 a KV cache keeps each
    #                 cell's row and column too (its second and third sections: graphir.memory.kv)
    buffers: bool = True  # False: sizes only, nothing allocated (what a context of these sizes would hold)
    owner: Any = None  # the hparams of the model the memory is for: compared by set_memory, never read
