"""The memory interface: how attention (or recurrent state) meets what a context keeps between ubatches.

Every memory kind builds its part of the graph through the same small interface, so architectures stay
ignorant of caches and caches stay ignorant of architectures. Kinds that cannot serve a builder request
(MLA, recurrent state) refuse it with a clear error rather than building something wrong.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from graphir.dims import DimDecl
from graphir.errors import GraphError
from graphir.hparams import HParams
from graphir.ir import Node

if TYPE_CHECKING:
    from graphir.builder import GraphBuilder


class Memory:
    """Base of all memory kinds. ``kind`` is the name users pick a context by."""

    kind: str = ""
    phases: tuple[str, ...] = ("prefill", "decode")

    def __init__(self, hp: HParams):
        self.hp = hp

    def dims(self) -> list[DimDecl]:
        """The symbolic sizes this memory adds to a graph (e.g. ``n_kv``)."""
        return []

    def build_attn(self, b: GraphBuilder, q: Node, k: Node, v: Node, *, kq_scale: float) -> Node:
        raise GraphError(f"memory kind '{self.kind}' has no attention")

    def build_attn_mla(self, b: GraphBuilder, *args: Any, **kw: Any) -> Node:
        raise GraphError(f"memory kind '{self.kind}' does not implement MLA attention (latent KV cache)")

    def build_rs(self, b: GraphBuilder, *args: Any, **kw: Any) -> Node:
        raise GraphError(f"memory kind '{self.kind}' holds no recurrent state")
