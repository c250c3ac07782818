"""No memory: attention sees only the tokens of the current ubatch (encoders, single-shot prompts)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from graphir.batch import UBatch
from graphir.ir import Node
from graphir.memory import Memory

if TYPE_CHECKING:
    from graphir.builder import GraphBuilder


def ubatch_mask(ub: UBatch, causal: bool) -> np.ndarray:
    """[n_tokens(query), n_tokens(key)]: 0 where a key is visible (same first seq id, and not in the future)."""
    seq = np.array([ids[0] for ids in ub.seq_ids])
    ok = seq[:, None] == seq[None, :]
    if causal:
        ok &= ub.pos[None, :] <= ub.pos[:, None]
    return np.where(ok, np.float32(0), np.float32(-np.inf)).astype(np.float32)


class NoMemory(Memory):
    kind = "none"
    phases = ("prefill",)  # decoding token by token needs a cache to see the earlier tokens

    def build_attn(self, b: GraphBuilder, q: Node, k: Node, v: Node, *, kq_scale: float) -> Node:
        # NOTE: the mask is filled per ubatch: same first seq id, and key pos <= query pos when causal.
        mask = b.input("kq_mask", "f32", (b.n_tokens, b.n_tokens), causal=self.hp.causal)
        return b.attn_mha(q, k, v, mask, kq_scale)

    def refuse(self, batch: Any, pos: np.ndarray, n_ctx: int, n_ubatch: int) -> str | None:
        if len(batch) > n_ubatch:
            return (f"a context without cache attends within one ubatch: {len(batch)} tokens exceed "
                    f"n_ubatch={n_ubatch}")
        if len(pos) and pos.max() >= n_ctx:
            i = int(np.argmax(pos >= n_ctx))
            return (f"token {i} of seq {batch.seq_ids[i][0]} has position {int(pos[i])}, beyond the context size "
                    f"n_ctx={n_ctx}")
        return None

    def next_pos(self, n_seq_max: int) -> list[int]:
        return [0] * n_seq_max  # every decode starts afresh: nothing is remembered

    def apply(self, ub: UBatch, plan: Any) -> dict[str, Any]:
        return {"kq_mask": ubatch_mask(ub, self.hp.causal)}
