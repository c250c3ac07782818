"""The latent cache of multi-head latent attention (MLA): llama.cpp's K-only ``llama_kv_cache`` of DeepSeek-V2/V3.

An absorbed-MLA layer attends with one shared head whose K row is the token's compressed latent (``kv_lora_rank``
values, RMS-normed) followed by its RoPE'd key part (``n_rot`` values); V is a view of the first ``kv_lora_rank``
values of the same row. So the cache keeps one row of ``kv_lora_rank + n_rot`` values per token per layer and no
V buffer at all, a fraction of what full per-head K and V would take (576 values per token instead of
128 x (192 + 128) in DeepSeek-V3). Everything else (cells, slot search, masks, the sequence operations, saved states, undoing a
failed ubatch) is the KV cache's: this is a :class:`~graphir.memory.kv.KVCache` whose layers keep K rows only.

Position edits re-rope the key part alone: the K-shift (the KV cache's, for rows written as [latent | key part])
turns the last ``n_rot`` values of each shifted row and writes the latent back as it was (llama.cpp's
``build_rope_shift`` on a view at the latent's offset).
"""

from __future__ import annotations

from typing import Any

from graphir.errors import GraphError, GraphirError
from graphir.graph.emit import Emitter
from graphir.memory.inputs import AttnInputs, LatentRows, SelfAttention
from graphir.memory.kv import CACHE_DTYPES, KVCache
from graphir.memory.layers import LatentAttention


class LatentCache(KVCache):
    """Cells as the KV cache's; per served layer one K buffer of latent rows, V read from it."""

    kind = "mla"
    serves = frozenset({"latent"})
    requires = frozenset({"latent"})
    buffer_roles = frozenset({"cache_k"})
    seq_layout = ("kind", "type_k")

    def __init__(self, *args: Any, **kw: Any):
        super().__init__(*args, **kw)
        if self.params.type_k != self.params.type_v:  # llama.cpp refuses it too: V is a view of K
            raise GraphirError(f"type_k '{self.type_k}' and type_v '{self.type_v}' differ: a latent cache keeps "
                               f"V inside K's rows, so they must be the same type")

    def buffer_shapes(self) -> dict[str, tuple[tuple[int, ...], Any]]:
        """One K buffer per served layer: ``n_embd_latent`` values per cell; no V buffer."""
        if not self.n_ctx:
            return {}
        return {f"blk.{il}.cache_k": ((self.n_ctx, need.n_embd_latent), CACHE_DTYPES[self.type_k])  # type: ignore[union-attr]
                for il, need in self.need.items()}

    def layer_rows(self, il: int) -> tuple[Any, ...]:
        return (self._buffers[f"blk.{il}.cache_k"],)

    def _per_head(self, e: Emitter, il: int, r: SelfAttention) -> AttnInputs:
        raise GraphError(f"memory kind '{self.kind}' keeps latent rows for layer {il}, not per-head K and V: the "
                         f"layer's attention must be multi-head latent attention (build_attn_mla)")

    def _attend_latent(self, e: Emitter, il: int, r: LatentRows) -> AttnInputs:
        """Write the ubatch's latent rows k [width, 1, T]; the cached rows as one shared head, V being the first
        ``v``'s width values of each row."""
        k, v = r.k, r.v
        need = self.need.get(il)
        width = k.shape[0] * k.shape[1]
        if not isinstance(need, LatentAttention) or need.n_embd_latent != width or k.shape[1] != 1:
            raise GraphError(f"layer {il}: latent rows {k.type_str} do not fit the latent cache's "
                             f"{getattr(need, 'n_embd_latent', 0)} values per cell (one shared head)")
        if not (isinstance(v.shape[0], int) and 0 < v.shape[0] <= width):
            raise GraphError(f"layer {il}: V {v.type_str} is not a leading part of the latent rows {k.type_str}")
        k_all = self._store_and_view(e, k, "k", self.type_k)
        v_all = e.op("view", k_all.inputs[0], shape=(v.shape[0], 1, self.kv_dim.sym), strides=(1, width, width),
                     offset=0, name="cache_v.view")
        return AttnInputs(k_all, v_all, self._mask(e))

    answers = {**KVCache.answers, SelfAttention: _per_head, LatentRows: _attend_latent}
