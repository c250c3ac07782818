"""The unified self-attention KV cache (llama.cpp's ``llama_kv_cache`` with one stream).

Graph side: each layer owns K and V buffers of ``n_ctx`` cells. A ubatch first writes its K/V rows into the
cells chosen by slot search (``k_idxs``/``v_idxs``), then attends over the first ``n_kv`` cells under a mask
built from the cells' positions and sequence sets; so the current tokens see themselves through the cache.
The cache holds K after RoPE.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from graphir.dims import DimDecl
from graphir.hparams import HParams
from graphir.ir import Node
from graphir.memory import Memory

if TYPE_CHECKING:
    from graphir.builder import GraphBuilder

N_CTX = DimDecl("n_ctx", 1, None, "cells per layer in the cache")
N_KV = DimDecl("n_kv", 1, N_CTX.sym, "cells attended over: the used prefix of the cache")


class KVCache(Memory):
    kind = "kv"

    def __init__(self, hp: HParams, type_k: str = "f16", type_v: str = "f16"):
        super().__init__(hp)
        self.type_k, self.type_v = type_k, type_v

    def dims(self) -> list[DimDecl]:
        return [N_KV, N_CTX]

    def _store_and_view(self, b: GraphBuilder, x: Node, which: str, dtype: str) -> Node:
        d, n_head_kv, n_tokens = x.shape
        width = d * n_head_kv
        cache = b.input(f"cache_{which}", dtype, (width, N_CTX.sym), scoped=True)
        idxs = b.input(f"{which}_idxs", "i64", (n_tokens,))
        rows = b.reshape(x, (width, n_tokens), name=f"{which}_rows")
        written = b.op("set_rows", cache, rows, idxs, name=f"cache_{which}.write")
        return b.op("view", written, shape=(d, n_head_kv, N_KV.sym), strides=(1, d, width), offset=0,
                    name=f"cache_{which}.view")

    def build_attn(self, b: GraphBuilder, q: Node, k: Node, v: Node, *, kq_scale: float) -> Node:
        k_all = self._store_and_view(b, k, "k", self.type_k)
        v_all = self._store_and_view(b, v, "v", self.type_v)
        mask = b.input("kq_mask", "f32", (N_KV.sym, b.n_tokens), causal=self.hp.causal)
        return b.attn_mha(q, k_all, v_all, mask, kq_scale)
