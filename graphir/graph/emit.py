"""What a layer below the model needs to add nodes to a graph being built: the emitter protocol.

The graph builder (:class:`graphir.model.builder.GraphBuilder`) implements it. A memory receives it to declare
the inputs it feeds (caches, indices, masks) and the few nodes that write into and view its buffers, and
returns them as data; the maths over them (attention, state updates) stays in the builder, as llama.cpp's
``build_attn_inp_*`` hand ``build_attn`` its inputs. So a memory never names the builder.
"""

from __future__ import annotations

from typing import Any, Protocol

from graphir.graph.dims import Dim
from graphir.graph.ir import Node


class Emitter(Protocol):
    """Appends typed, named nodes in the current layer's scope; the ubatch's sizes say the shapes of inputs."""

    n_tokens: Dim  # tokens in the ubatch
    n_seqs: Dim  # sequences in the ubatch

    def op(self, op: str, *inputs: Node, name: str | None = None, **attrs: Any) -> Node:
        """One node of the op catalogue, its type inferred; ``name`` is a tag inside the current scope."""
        ...

    def input(self, role: str, dtype: str, shape: tuple[Dim, ...], scoped: bool = False, **facts: Any) -> Node:
        """A runtime-fed tensor, declared once per name (``scoped``: one per layer); ``facts`` state how it is
        filled, as data on the node that printed forms show and backends read."""
        ...

    def reshape(self, x: Node, shape: tuple[Dim, ...], *, name: str) -> Node: ...
