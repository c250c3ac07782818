"""No memory: attention sees only the tokens of the current ubatch (encoders, single-shot prompts)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from graphir.batch import UBatch
from graphir.graph.emit import Emitter
from graphir.graph.ir import Node
from graphir.memory import Memory
from graphir.memory.inputs import AttnInputs, PosBuckets, SelfAttention
from graphir.memory.layers import Attention, ContextParams, LayerNeeds
from graphir.memory.reuse import SharedRows, check_readers, reads_of


def ubatch_mask(ub: UBatch, need: Attention) -> np.ndarray:
    """[n_tokens(query), n_tokens(key)]: 0 (ALiBi: minus the distance) where a key is visible (same first seq id, and seen by the layer's
    rule: not in the future when causal, inside its window when sliding)."""
    need = need if ub.causal else replace(need, causal=False)
    ok = need.sees(ub.pos[:, None], ub.pos[None, :])
    first = [ids[0] for ids in ub.seq_ids]
    if first.count(first[0]) != len(first):   # several sequences (one, as a sentence of its own: every key)
        ok &= np.equal.outer(first, first)
    return need.mask(ok, ub.pos[:, None], ub.pos[None, :])


class NoMemory(Memory):
    kind = "none"
    serves = frozenset({"full", "swa", "encoder"})
    phases = ("prefill",)  # decoding token by token needs a cache to see the earlier tokens

    def __init__(self, needs: LayerNeeds, params: ContextParams = ContextParams(),
                 layer_kinds: frozenset[str] | None = None):
        super().__init__(needs, params, layer_kinds)
        check_readers(self.need, self.kind)
        self.shared = SharedRows()

    def _mask_name(self, il: int) -> str:
        return "kq_mask_swa" if self.need[il].window else "kq_mask"  # type: ignore[union-attr]

    def _attend(self, e: Emitter, il: int, r: SelfAttention) -> AttnInputs:
        """The ubatch's own K and V, under a mask over its tokens."""
        # NOTE: the mask is filled per ubatch: same first seq id, and key pos <= query pos when causal.
        facts = self.need[il].mask_facts()  # type: ignore[union-attr]
        mask = e.input(self._mask_name(il), "f32", (e.n_tokens, e.n_tokens), **facts)
        j = reads_of(self.need[il])
        if j is not None:  # layer j's K and V of the ubatch (graphir.memory.reuse)
            return self.shared.read(e, il, j, mask)
        self.shared.keep(e, il, r.k, r.v)
        return AttnInputs(r.k, r.v, mask)

    def _buckets(self, e: Emitter, il: int, r: PosBuckets) -> Node:
        """Buckets of (key position - query position) within the ubatch."""
        need = self.need[il]
        return e.input("pos_bucket", "i32", (e.n_tokens, e.n_tokens), buckets=need.rel_buckets,  # type: ignore[union-attr]
                       causal=need.causal)  # type: ignore[union-attr]

    answers = {SelfAttention: _attend, PosBuckets: _buckets}

    def refuse(self, batch: Any, pos: np.ndarray) -> str | None:
        n_ctx, n_ubatch = self.params.n_ctx, self.params.n_ubatch
        if len(batch) > n_ubatch:
            return (f"a context without cache attends within one ubatch: {len(batch)} tokens exceed "
                    f"n_ubatch={n_ubatch}")
        if len(pos) and pos.max() >= n_ctx:
            i = int(np.argmax(pos >= n_ctx))
            return (f"token {i} of seq {batch.seq_ids[i][0]} has position {int(pos[i])}, beyond the context size "
                    f"n_ctx={n_ctx}")
        return None

    def last_pos(self, seq: int) -> int:
        return -1  # every decode starts afresh: nothing is remembered

    def apply(self, ub: UBatch, plan: Any) -> dict[str, Any]:
        masks = {self._mask_name(il): self.need[il] for il in self.layers}  # one mask per kind of layer
        feeds = {name: ubatch_mask(ub, need) for name, need in masks.items()}  # type: ignore[arg-type]
        bucketed = next((n for n in self.need.values() if n.rel_buckets), None)  # type: ignore[union-attr]
        if bucketed is not None:
            feeds["pos_bucket"] = bucketed.buckets(ub.pos[:, None], ub.pos[None, :])  # type: ignore[union-attr]
        return feeds
