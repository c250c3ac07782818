"""The unified self-attention KV cache (llama.cpp's ``llama_kv_cache`` with one stream).

Graph side: each layer owns K and V buffers of ``n_ctx`` cells. A ubatch first writes its K/V rows into the
cells chosen by slot search (``k_idxs``/``v_idxs``), then attends over the first ``n_kv`` cells under a mask
built from the cells' positions and sequence sets; so the current tokens see themselves through the cache.
The cache holds K after RoPE.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from graphir.batch import UBatch
from graphir.dims import DimDecl
from graphir.errors import CacheFullError, GraphirError
from graphir.hparams import HParams
from graphir.ir import Node
from graphir.memory import Memory

if TYPE_CHECKING:
    from graphir.builder import GraphBuilder

N_CTX = DimDecl("n_ctx", 1, None, "cells per layer in the cache")
N_KV = DimDecl("n_kv", 1, N_CTX.sym, "cells attended over: the used prefix of the cache")


CACHE_DTYPES = {"f16": np.float16, "f32": np.float32}
MAX_SEQ = 64  # sequence sets are uint64 bitmasks (llama.cpp allows 256)


class KVCache(Memory):
    """Cells with a position (-1 = empty) and a set of sequence ids; K/V rows per layer per cell."""

    kind = "kv"

    def __init__(self, hp: HParams, type_k: str = "f16", type_v: str = "f16", n_ctx: int = 0, n_seq_max: int = 1):
        super().__init__(hp)
        for which, t in (("type_k", type_k), ("type_v", type_v)):
            if t not in CACHE_DTYPES:
                raise GraphirError(f"{which} '{t}' is not supported (supported: {', '.join(CACHE_DTYPES)})")
        if not 1 <= n_seq_max <= MAX_SEQ:
            raise GraphirError(f"n_seq_max={n_seq_max} is outside [1, {MAX_SEQ}]")
        self.type_k, self.type_v = type_k, type_v
        self.n_ctx, self.n_seq_max = n_ctx, n_seq_max
        self.pos = np.full(n_ctx, -1, dtype=np.int64)
        self.seq = np.zeros(n_ctx, dtype=np.uint64)
        self.head = 0
        self._buffers: dict[str, np.ndarray] = {}
        if n_ctx:
            for il in range(hp.n_layer):
                self._buffers[f"blk.{il}.cache_k"] = np.zeros((n_ctx, hp.n_embd_k_gqa), CACHE_DTYPES[type_k])
                self._buffers[f"blk.{il}.cache_v"] = np.zeros((n_ctx, hp.n_embd_v_gqa), CACHE_DTYPES[type_v])

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

    # ---- run time -------------------------------------------------------------------------------------

    def buffers(self) -> dict[str, np.ndarray]:
        return self._buffers

    def _holds(self, seq: int) -> np.ndarray:
        return (self.seq >> np.uint64(seq)) & np.uint64(1) == 1

    def seq_pos_max(self, seq: int) -> int:
        p = self.pos[self._holds(seq)]
        return int(p.max()) if len(p) else -1

    def seq_pos_min(self, seq: int) -> int:
        p = self.pos[self._holds(seq)]
        return int(p.min()) if len(p) else -1

    def _find_cells(self, free: np.ndarray, n: int, head: int) -> np.ndarray | None:
        """The first n free cells at or after head, wrapping around (cells need not be contiguous)."""
        order = np.concatenate([np.flatnonzero(free[head:]) + head, np.flatnonzero(free[:head])])
        return order[:n] if len(order) >= n else None

    def prepare(self, ubatches: list[UBatch]) -> list[Any]:
        free, head, plans = self.pos < 0, self.head, []
        for k, ub in enumerate(ubatches):
            cells = self._find_cells(free, len(ub), head)
            if cells is None:
                raise CacheFullError(f"KV cache full: ubatch {k} needs {len(ub)} cells, {int(free.sum())} of "
                                     f"{self.n_ctx} are free")
            free = free.copy()
            free[cells] = False
            head = int(cells[-1]) + 1 if cells[-1] + 1 < self.n_ctx else 0
            plans.append(cells)
        return plans

    def apply(self, ub: UBatch, plan: Any) -> dict[str, Any]:
        cells = plan
        self.pos[cells] = ub.pos
        self.seq[cells] = [sum(1 << s for s in ids) for ids in ub.seq_ids]
        self.head = int(cells[-1]) + 1 if cells[-1] + 1 < self.n_ctx else 0
        n_kv = int(np.flatnonzero(self.pos >= 0).max()) + 1
        first = np.array([ids[0] for ids in ub.seq_ids], dtype=np.uint64)
        pos, seq = self.pos[:n_kv], self.seq[:n_kv]
        # NOTE: visibility is decided by the cells, not the ubatch: same first seq id, key pos <= query pos.
        ok = (pos[None, :] >= 0) & (((seq[None, :] >> first[:, None]) & np.uint64(1)) == 1)
        ok &= pos[None, :] <= ub.pos[:, None].astype(np.int64)
        mask = np.where(ok, np.float32(0), np.float32(-np.inf)).astype(np.float32)
        idxs = cells.astype(np.int64)
        return {"kq_mask": mask, "k_idxs": idxs, "v_idxs": idxs, "n_kv": n_kv}

    def snapshot(self) -> Any:
        return self.pos.copy(), self.seq.copy(), self.head

    def restore(self, snap: Any) -> None:
        self.pos, self.seq, self.head = snap[0].copy(), snap[1].copy(), snap[2]
