"""DeepSeek Sparse Attention's lightning indexer (DeepSeek-V3.2, GLM-5): which cached keys each token attends to.

From the compressed query ``qr`` the indexer makes ``indexer.head_count`` query heads of ``indexer.key_length``
values (``indexer.attn_q_b``), from the layer's input one key head (``indexer.attn_k``, LayerNorm with a bias)
and a weight per head (``indexer.proj``); queries and keys are RoPE'd over their first ``n_rot`` values and
turned by a Hadamard rotation (the memory's), the keys kept in the indexer cache (memory ``kv_dsa``). Each token
scores every cached key (``lightning_indexer``: the heads' ReLU'd dot products times their weights, pre-scaled by
1 / sqrt(key length x heads)) and keeps its ``indexer.top_k`` best (all when fewer are cached); attention then
sees those alone (:meth:`graphir.model.builder.GraphBuilder.selected_mask`). What differs between the families
is data, a :class:`Sparse` record.

References: DeepSeek-AI 2025, "DeepSeek-V3.2-Exp"; llama.cpp src/models/deepseek32.cpp, glm-dsa.cpp.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from gguf import MODEL_TENSOR as T
from gguf import Keys

from graphir.errors import MetadataError
from graphir.graph.floats import f32
from graphir.graph.ir import Node
from graphir.model.builder import Gating, GraphBuilder
from graphir.model.hparams import HParams, Key
from graphir.model.tensors import TensorSpec, spec

I = Keys.Attention.Indexer  # noqa: E741
INDEXER_TYPES = "{arch}.attention.indexer.types"  # 1: the layer runs its indexer; 0: it takes the last selection

KEYS = (Key("indexer_n_head", I.HEAD_COUNT, int, 0, minimum=1), Key("indexer_head_size", I.KEY_LENGTH, int, 0, minimum=1),
        Key("indexer_top_k", I.TOP_K, int, 0, minimum=1))
REQUIRED = (I.HEAD_COUNT, I.KEY_LENGTH, I.TOP_K)


def every_layer(hp: HParams, n_trunk: int) -> tuple[int, ...]:
    return (1,) * n_trunk


@dataclass(frozen=True)
class Sparse:
    """How a family's indexer differs: the RoPE layout it turns its queries and keys in, its LayerNorm's eps,
    whether the loader asks for its tensors as not required, the gating a file without the key takes (None: the
    family's own rule), and which layers run an indexer when the file does not say (``indexer.types``)."""

    rope_mode: str
    norm_eps: float
    optional: bool = False
    gating: Gating | None = None
    default_types: Callable[[HParams, int], tuple[int, ...]] = every_layer


def indexer_layers(sparse: Sparse, hp: HParams, n_trunk: int, arch: str) -> tuple[int, ...]:
    """Per trunk layer, 1 where it runs its own indexer: the file's ``indexer.types``, else the family's default."""
    given = getattr(hp, "indexer_types", None)
    full = tuple((sparse.default_types(hp, n_trunk) if given is None else given)[:n_trunk])
    if n_trunk and not full[0]:
        raise MetadataError(f"'{INDEXER_TYPES.format(arch=arch)}': layer 0 runs no indexer, but a layer without one "
                            f"takes the selection of an earlier layer that has one")
    return full


def indexer_tensors(hp: HParams, il: int, optional: bool) -> list[TensorSpec]:
    E, D, H = hp.n_embd, hp.indexer_head_size, hp.indexer_n_head
    return [spec(T.INDEXER_K_NORM, (D,), il, kind="vector", optional=optional),
            spec(T.INDEXER_K_NORM, (D,), il, "bias", kind="vector", optional=optional),
            spec(T.INDEXER_PROJ, (E, H), il, optional=optional), spec(T.INDEXER_ATTN_K, (E, D), il, optional=optional),
            spec(T.INDEXER_ATTN_Q_B, (hp.n_lora_q, H * D), il, optional=optional)]


def select_keys(b: GraphBuilder, sparse: Sparse, h: Node, qr: Node, pos: Node, il: int, attn_factor: float) -> Node:
    """The cells each token attends to [n_top_k, T]: the indexer's best-scored cached keys."""
    hp, w, T_ = b.hp, b.w, b.n_tokens
    D, H = hp.indexer_head_size, hp.indexer_n_head

    def rope(x: Node, name: str) -> Node:
        return b.rope(x, pos, name=name, attn_factor=attn_factor, mode=sparse.rope_mode)
    q = b.linear(qr, w(T.INDEXER_ATTN_Q_B, il), name="indexer_q")  # type: ignore[arg-type]
    q = rope(b.reshape(q, (D, H, T_), name="indexer_q.heads"), "indexer_q.rope")
    k = b.linear(h, w(T.INDEXER_ATTN_K, il), name="indexer_k")  # type: ignore[arg-type]
    k = b.op("norm", k, eps=sparse.norm_eps, name="indexer_k.norm")
    k = b.op("mul", k, w(T.INDEXER_K_NORM, il), name="indexer_k.w")  # type: ignore[arg-type]
    k = b.op("add", k, w(T.INDEXER_K_NORM, il, "bias"), name="indexer_k.b")  # type: ignore[arg-type]
    k = rope(b.reshape(k, (D, 1, T_), name="indexer_k.heads"), "indexer_k.rope")
    rot = b.build_indexer_rotation()
    q = b.op("mul_mat", rot, q, name="indexer_q.rot")
    k = b.op("mul_mat", rot, k, name="indexer_k.rot")
    keys, mask, n_top = b.build_indexer_keys(k)
    weights = b.linear(h, w(T.INDEXER_PROJ, il), name="indexer_weights")  # type: ignore[arg-type]
    weights = b.op("scale", weights, s=f32(1.0 / math.sqrt(float(D * H))), name="indexer_weights.scaled")
    score = b.op("lightning_indexer", q, keys, weights, mask, name="indexer_score")
    return b.op("cont", b.op("argsort_top_k", score, k=n_top, name="top_k.sel"), name="top_k")
