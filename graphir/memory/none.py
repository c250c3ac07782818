"""No memory: attention sees only the tokens of the current ubatch (encoders, single-shot prompts)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from graphir.ir import Node
from graphir.memory import Memory

if TYPE_CHECKING:
    from graphir.builder import GraphBuilder


class NoMemory(Memory):
    kind = "none"
    phases = ("prefill",)  # decoding token by token needs a cache to see the earlier tokens

    def build_attn(self, b: GraphBuilder, q: Node, k: Node, v: Node, *, kq_scale: float) -> Node:
        # NOTE: the mask is filled per ubatch: same first seq id, and key pos <= query pos when causal.
        mask = b.input("kq_mask", "f32", (b.n_tokens, b.n_tokens), causal=self.hp.causal)
        return b.attn_mha(q, k, v, mask, kq_scale)
