"""Memories composed per layer, run end to end on the toy families of tests/toy_archs.py.

An interleaved sliding-window model gets two KV caches behind one memory (``iswa``), an attention+Mamba
hybrid a KV cache and a recurrent memory (``hybrid``), a latent-attention+Mamba hybrid a latent cache and a
recurrent memory (``hybrid`` too); the context, the state file and the builder are the
same code as for every other model. Expected numbers come from running the same weights another way: a
window wider than the context is plain Llama, bit for bit; a windowed model decoded token by token through
its caches matches one cacheless pass under the window mask; a hybrid decoded token by token matches the
same tokens decoded at once.
"""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest

import toy_archs  # noqa: F401  (registers test-iswa, test-hybrid and test-mla-hybrid)
from conftest import (TINY_FAMILY, TINY_INCLUDE, TINY_KEYS, fail_on_run, memory_bytes, process_folder,
                      write_model_gguf)

from graphir.batch import Batch
from graphir.errors import GraphirError, MetadataError, StateError
from graphir.graph.forms import to_text
from graphir.memory.composite import swa_cells
from graphir.memory.kinds import assemble, footprint
from graphir.memory.kv import KVCache
from graphir.memory.layers import Attention, ContextParams
from graphir.model.presets import Preset
from graphir.running.runtime import Model, load

K = gguf.Keys
TOKENS = np.random.default_rng(11).integers(0, 256, 400).tolist()
F32 = {"type_k": "f32", "type_v": "f32"}
LONG = {K.LLM.CONTEXT_LENGTH: 1024, K.LLM.BLOCK_COUNT: 4}
HYBRID = {**LONG, K.Attention.HEAD_COUNT_KV: [2, 0, 2, 0], K.SSM.CONV_KERNEL: 4, K.SSM.INNER_SIZE: 128,
          K.SSM.STATE_SIZE: 16, K.SSM.TIME_STEP_RANK: 4}
# DeepSeek-V3 in small (conftest) with Mamba layers 1 and 3, whose head_count_kv is 0
LATENT_HYBRID = {**TINY_FAMILY["deepseek2"], **{k: v for k, v in HYBRID.items() if k != K.Attention.HEAD_COUNT_KV},
                 K.Attention.HEAD_COUNT_KV: (1, 0, 1, 0)}
CLOSE = 2e-4  # max |logit difference| between two evaluation orders of the same f32 model (tiny logits ~ 1..5)


@lru_cache(maxsize=None)
def model(arch: str, include: str = "", **keys: Any) -> Model:
    """A tiny model of ``arch``; ``include``: the optional tensors it has."""
    d = process_folder("graphir-composite-")
    preset = Preset(arch, {**TINY_KEYS, **LONG, **dict(keys)}, tied=False, matrix_type=gguf.GGMLQuantizationType.F32,
                    include=include)
    return load(str(write_model_gguf(d / f"{arch}.gguf", preset)))


def swa(window: int) -> Model:
    return model("test-iswa", **{K.Attention.SLIDING_WINDOW: window})


def hybrid() -> Model:
    return model("test-hybrid", **{k: tuple(v) if isinstance(v, list) else v for k, v in HYBRID.items()})


def latent_hybrid() -> Model:
    return model("test-mla-hybrid", TINY_INCLUDE["deepseek2"], **LATENT_HYBRID)


def one_by_one(ctx: Any, tokens: list[int], seq: int = 0, start: int = 0) -> np.ndarray:
    rows = []
    for i, t in enumerate(tokens):
        ctx.decode(Batch.one(t, start + i, seq_id=seq))
        rows.append(ctx.logits_ith(-1).copy())
    return np.array(rows)


# ---- the registry assembles each memory from the layers' needs --------------------------------------------

def test_layer_needs_choose_the_memory_and_route_each_layer_to_its_part() -> None:
    ctx = swa(6).new_context(n_ctx=512, n_ubatch=32, **F32)
    mem = ctx.memory
    assert swa(6).arch.contexts == ("iswa", "none") and mem.kind == "iswa"
    assert {name: p.layers for name, p in mem.parts.items()} == {"base": (1, 3), "swa": (0, 2)}
    assert (mem.parts["base"].n_ctx, mem.parts["swa"].n_ctx, mem.parts["swa"].rule.window) == (512, 256, 6)
    assert sorted(mem.buffers()) == [f"blk.{il}.cache_{w}" for il in range(4) for w in "kv"]

    h = hybrid().new_context(n_ctx=64, n_seq_max=2, **F32).memory
    assert hybrid().arch.contexts == ("hybrid",) and h.kind == "hybrid" and h.split == "equal"
    assert {name: p.layers for name, p in h.parts.items()} == {"attn": (0, 2), "recr": (1, 3)}
    assert sorted(h.buffers()) == ["blk.0.cache_k", "blk.0.cache_v", "blk.1.rs_r", "blk.1.rs_s",
                                   "blk.2.cache_k", "blk.2.cache_v", "blk.3.rs_r", "blk.3.rs_s"]


def test_the_swa_cache_is_sized_as_llama_cpp_sizes_it() -> None:
    """min(n_ctx, window * streams + n_ubatch), padded up to 256."""
    assert swa_cells(ContextParams(n_ctx=4096, n_seq_max=4, n_ubatch=512), 1024) == 4096
    assert swa_cells(ContextParams(n_ctx=4096, n_seq_max=4, n_ubatch=512, unified=False), 1024) == 1536
    assert swa_cells(ContextParams(n_ctx=100, n_ubatch=512), 10) == 256
    assert swa_cells(ContextParams(), 10) == 0


def test_each_kind_of_layer_gets_its_own_mask_and_cache_inputs() -> None:
    g = swa(6).meta.build_graph("iswa", "decode")
    assert g["kq_mask"].attrs == {"role": "kq_mask", "causal": True, "pad": 256}
    assert g["kq_mask_swa"].attrs == {"role": "kq_mask_swa", "causal": True, "window": 6, "swa": "standard", "pad": 256}
    assert g["blk.0.cache_k"].type_str == "f16[32, n_ctx_swa]" and g["blk.1.cache_k"].type_str == "f16[32, n_ctx]"
    assert g["blk.0.k"].inputs[0].name == "blk.0.cache_k.view"
    assert g["blk.0.cache_k.write"].inputs[2].name == "k_idxs_swa" and g["blk.1.cache_k.write"].inputs[2].name == "k_idxs"
    assert g["blk.0.kq_soft_max"].inputs[1].name == "kq_mask_swa" and g["blk.1.kq_soft_max"].inputs[1].name == "kq_mask"
    h = hybrid().meta.build_graph()
    assert h.outputs["blk.1.rs_s"].op == "set_rows" and h["blk.0.kq_soft_max"].inputs[1].name == "kq_mask"
    assert "blk.1.kq_mask" not in {n.name for n in h.nodes} and "blk.0.rs_s" not in h.outputs


# ---- numbers -----------------------------------------------------------------------------------------------

def test_a_window_wider_than_the_context_computes_exactly_what_llama_does() -> None:
    wide, plain = swa(100000), model("llama")
    outs = []
    for m in (wide, plain):
        ctx = m.new_context(n_ctx=128, **F32)
        ctx.decode(Batch.from_tokens(TOKENS[:20], 0, outputs="all"))
        first = ctx.logits().copy()
        outs.append((first, one_by_one(ctx, TOKENS[20:26], start=20)))
    assert np.array_equal(outs[0][0], outs[1][0]) and np.array_equal(outs[0][1], outs[1][1])


def test_a_sliding_window_through_the_caches_matches_one_pass_under_the_window_mask() -> None:
    m = swa(5)
    ctx = m.new_context(n_ctx=64, **F32)
    cached = one_by_one(ctx, TOKENS[:30])
    once = m.new_context(n_ctx=64, kind="none", n_ubatch=64, **F32)
    once.decode(Batch.from_tokens(TOKENS[:30], 0, outputs="all"))
    assert np.abs(cached - once.logits()).max() <= CLOSE
    full = model("llama").new_context(n_ctx=64, **F32)  # the window really cuts: Llama sees all 30 tokens
    full.decode(Batch.from_tokens(TOKENS[:30], 0, outputs="all"))
    assert np.abs(full.logits()[10:] - once.logits()[10:]).max() > 100 * CLOSE


def test_the_swa_cache_reuses_cells_that_left_the_window() -> None:
    """300 tokens through a 256-cell SWA cache: cells out of every sequence's window are taken again."""
    m = swa(8)
    ctx = m.new_context(n_ctx=512, n_batch=32, n_ubatch=32, **F32)
    for a in range(0, 300, 30):
        ctx.decode(Batch.from_tokens(TOKENS[a:a + 30], a))
    last = ctx.logits_ith(-1).copy()
    part = ctx.memory.parts["swa"]
    assert part.n_ctx == 256 and (part.pos >= 0).sum() == 256 and part.pos.max() == 299
    assert ctx.memory.seq_pos_min(0) == part.pos[part.pos >= 0].min() > 0 and ctx.memory.seq_pos_max(0) == 299
    once = m.new_context(n_ctx=512, kind="none", n_batch=512, n_ubatch=512, **F32)
    once.decode(Batch.from_tokens(TOKENS[:300], 0))
    assert np.abs(last - once.logits_ith(-1)).max() <= CLOSE


def test_a_hybrid_decodes_token_by_token_what_it_decodes_at_once() -> None:
    m = hybrid()
    ctx = m.new_context(n_ctx=64, **F32)
    step = one_by_one(ctx, TOKENS[:12])
    once = m.new_context(n_ctx=64, **F32)
    once.decode(Batch.from_tokens(TOKENS[:12], 0, outputs="all"))
    assert np.abs(step - once.logits()).max() <= CLOSE
    two = m.new_context(n_ctx=64, n_seq_max=2, **F32)  # two sequences in one batch: split equally
    two.decode(Batch(TOKENS[:12] + TOKENS[50:62], [*range(12)] * 2, [(0,)] * 12 + [(1,)] * 12, [False] * 11 + [True]
                     + [False] * 11 + [True]))
    alone = m.new_context(n_ctx=64, **F32)
    alone.decode(Batch.from_tokens(TOKENS[50:62], 0))
    assert np.abs(two.logits()[0] - step[-1]).max() <= CLOSE
    assert np.abs(two.logits()[1] - alone.logits_ith(-1)).max() <= CLOSE


def test_a_latent_attention_hybrid_routes_each_layer_to_its_part_and_decodes_as_at_once() -> None:
    """Multi-head latent attention is one more need a composite routes: MLA layers to a latent cache, Mamba
    layers to the recurrent memory (an MLA + linear-attention hybrid, as Kimi-Linear)."""
    m = latent_hybrid()
    assert m.arch.contexts == ("hybrid",)
    ctx = m.new_context(n_ctx=64, **F32)
    mem = ctx.memory
    assert {name: (p.kind, p.layers) for name, p in mem.parts.items()} == {"attn": ("mla", (0, 2)),
                                                                            "recr": ("recurrent", (1, 3))}
    assert sorted(mem.buffers()) == ["blk.0.cache_k", "blk.1.rs_r", "blk.1.rs_s", "blk.2.cache_k", "blk.3.rs_r",
                                     "blk.3.rs_s"]
    g = m.meta.build_graph("hybrid", "decode")
    assert g["blk.0.cache_v.view"].inputs[0].name == "blk.0.cache_k.write"   # V: a view of the latent rows
    assert g["blk.2.kq_soft_max"].inputs[1].attrs == {"role": "kq_mask", "causal": True, "pad": 256}
    assert g.outputs["blk.3.rs_s"].op == "set_rows"
    step = one_by_one(ctx, TOKENS[:10])
    once = m.new_context(n_ctx=64, **F32)
    once.decode(Batch.from_tokens(TOKENS[:10], 0, outputs="all"))
    assert np.abs(step - once.logits()).max() <= CLOSE
    assert np.isfinite(step).all() and np.abs(step).max() > 0.1


# ---- the memory API, part by part ------------------------------------------------------------------------

def test_hybrid_seq_rm_succeeds_only_where_both_parts_can_and_otherwise_changes_nothing() -> None:
    ctx = hybrid().new_context(n_ctx=64, **F32)
    ctx.decode(Batch.from_tokens(TOKENS[:10], 0))
    mem = ctx.memory
    assert (mem.seq_pos_min(0), mem.seq_pos_max(0)) == (9, 9)  # the KV part holds 0..9, the state only 9
    before = memory_bytes(ctx)
    assert mem.parts["attn"].can_seq_rm(0, 5, -1) and not mem.parts["recr"].can_seq_rm(0, 5, -1)
    assert mem.seq_rm(0, 5, -1) is False and memory_bytes(ctx) == before
    assert mem.seq_rm(0, -1, -1) is True
    assert mem.seq_pos_max(0) == -1 and (mem.parts["attn"].pos < 0).all() and (mem.parts["recr"].pos < 0).all()


def test_hybrid_fork_clone_and_failed_decode(monkeypatch: pytest.MonkeyPatch) -> None:
    m = hybrid()
    ctx = m.new_context(n_ctx=64, n_seq_max=2, n_ubatch=2, **F32)
    ctx.decode(Batch.from_tokens(TOKENS[:8], 0))
    ctx.memory.seq_cp(0, 1)
    a = one_by_one(ctx, TOKENS[8:10], seq=0, start=8)
    b = one_by_one(ctx, TOKENS[8:10], seq=1, start=8)
    assert np.abs(a - b).max() <= CLOSE  # the fork continues as the original (its new rows sit in other cells)

    snap = ctx.memory.clone()
    want = one_by_one(ctx, [TOKENS[20]], seq=0, start=10)
    ctx.set_memory(snap.clone())
    assert np.array_equal(one_by_one(ctx, [TOKENS[20]], seq=0, start=10), want)

    before = memory_bytes(ctx)
    calls = fail_on_run(monkeypatch, ctx, 2)
    with pytest.raises(RuntimeError, match="compute failed"):  # two ubatches of one token per sequence
        ctx.decode(Batch([TOKENS[30], TOKENS[31], TOKENS[32], TOKENS[33]], [11, 12, 10, 11], [(0,), (0,), (1,), (1,)],
                         [True] * 4))
    assert len(calls) == 2 and memory_bytes(ctx) == before


@pytest.mark.parametrize("which", ["iswa", "hybrid"])
def test_a_composite_state_saves_each_part_and_loads_into_a_fresh_context(which: str) -> None:
    m = swa(5) if which == "iswa" else hybrid()
    ctx = m.new_context(n_ctx=64, n_seq_max=2, **F32)
    ctx.decode(Batch(TOKENS[:12], [*range(6)] * 2, [(0,)] * 6 + [(1,)] * 6, [True] * 12))
    data, seq1 = ctx.state_save(), ctx.state_seq_save(1)
    want = one_by_one(ctx, TOKENS[40:43], seq=1, start=6)

    fresh = m.new_context(n_ctx=64, n_seq_max=2, **F32)
    fresh.state_load(data)
    assert np.array_equal(one_by_one(fresh, TOKENS[40:43], seq=1, start=6), want)

    other = m.new_context(n_ctx=64, n_seq_max=2, **F32)
    other.state_seq_load(seq1, 0)  # into other cells: the same numbers up to summation order
    assert np.abs(one_by_one(other, TOKENS[40:43], seq=0, start=6) - want).max() <= CLOSE

    small = m.new_context(n_ctx=32, n_seq_max=2, **F32)
    before = memory_bytes(small)
    part = "base" if which == "iswa" else "attn"
    with pytest.raises(StateError, match=f"memory part '{part}': state has n_ctx=64, this context has n_ctx=32"):
        small.state_load(data)
    assert memory_bytes(small) == before


def test_an_iswa_cache_shifts_positions_like_one_cache_when_both_parts_are_the_same_size() -> None:
    m = swa(5)
    ctx = m.new_context(n_ctx=256, **F32)
    assert ctx.memory.can_shift()
    ctx.decode(Batch.from_tokens(TOKENS[:8], 0))
    ctx.memory.seq_add(0, -1, -1, 3)  # 0..7 -> 3..10: every cached K of both parts is turned by 3 positions
    got = one_by_one(ctx, [TOKENS[8]], start=11)
    ref = m.new_context(n_ctx=256, **F32)
    ref.decode(Batch.from_tokens(TOKENS[:9], 3))
    assert np.abs(got[0] - ref.logits_ith(-1)).max() <= CLOSE
    assert not m.new_context(n_ctx=512, n_ubatch=32, **F32).memory.can_shift()  # a 256-cell SWA part lost cells


# ---- windows as data, swa_full, and what a window-sized cache cannot do ------------------------------------

@pytest.mark.parametrize("kind,window,q,visible", [
    ("standard", 4, 9, [6, 7, 8, 9]),          # the last 4 positions, the query's own included
    ("chunked", 4, 9, [8, 9]),                 # the query's chunk [8, 12), up to itself
    ("symmetric", 4, 9, [7, 8, 9, 10, 11]),    # 2 either side, the future too (an encoder's window)
])
def test_each_kind_of_window_is_one_rule_of_the_table(kind: str, window: int, q: int, visible: list[int]) -> None:
    need = Attention(8, 8, window, causal=kind != "symmetric", swa_type=kind)
    keys = np.arange(16)
    assert np.flatnonzero(need.sees(q, keys)).tolist() == visible
    assert need.mask_facts() == {"causal": kind != "symmetric", "window": window, "swa": kind}


def test_a_chunked_window_recycles_the_cells_of_finished_chunks() -> None:
    """The rule decides reuse as well as masking: with chunks of 8, once position 16 comes, 0..15 are dead."""
    need = Attention(32, 32, 8, swa_type="chunked")
    cache = KVCache((need,), ContextParams(n_ctx=32), frozenset({"swa"}), name="swa")
    cache.pos[:20] = np.arange(20)
    cache.seq[:20] = 1
    assert np.flatnonzero(cache._usable(cache.pos, cache.seq)[:20]).tolist() == list(range(16))


def test_swa_full_keeps_every_cell_and_allows_position_edits() -> None:
    m = swa(5)
    ctx = m.new_context(n_ctx=512, n_ubatch=32, swa_full=True, **F32)
    assert ctx.memory.parts["swa"].n_ctx == 512 and ctx.memory.can_shift()
    ctx.decode(Batch.from_tokens(TOKENS[:40], 0))
    assert ctx.memory.seq_pos_min(0) == 0 and (ctx.memory.parts["swa"].pos >= 0).sum() == 40
    small = m.new_context(n_ctx=512, n_ubatch=32, **F32)
    small.decode(Batch.from_tokens(TOKENS[:40], 0))
    assert np.abs(small.logits_ith(-1) - ctx.logits_ith(-1)).max() <= CLOSE  # the same numbers either way


def test_a_window_sized_cache_refuses_what_would_need_forgotten_positions_and_changes_nothing() -> None:
    ctx = swa(5).new_context(n_ctx=512, n_batch=32, n_ubatch=32, **F32)
    for a in range(0, 300, 30):  # 300 tokens through a 256-cell SWA cache: the oldest are gone
        ctx.decode(Batch.from_tokens(TOKENS[a:a + 30], a))
    mem, before = ctx.memory, memory_bytes(ctx)
    assert mem.parts["swa"].seq_pos_min(0) > 10
    assert mem.seq_rm(0, 10, -1) is False and memory_bytes(ctx) == before  # the window of 10 reaches 6..9: gone
    with pytest.raises(GraphirError, match="swa_full=True"):
        mem.seq_add(0, 100, -1, -3)
    assert memory_bytes(ctx) == before
    assert mem.seq_rm(0, 250, -1) is True  # 245..249 are still held: the cut is fine
    assert mem.seq_pos_max(0) == 249 and mem.seq_rm(0, -1, -1) is True


def test_a_middle_cut_keeps_what_later_tokens_already_computed() -> None:
    ctx = swa(5).new_context(n_ctx=512, n_batch=32, n_ubatch=32, **F32)
    for a in range(0, 300, 30):
        ctx.decode(Batch.from_tokens(TOKENS[a:a + 30], a))
    assert ctx.memory.seq_rm(0, 5, 20) is True and ctx.memory.seq_pos_max(0) == 299


@pytest.mark.parametrize("which,kw", [("iswa", {"n_ctx": 1024, "n_ubatch": 64}), ("iswa", {"n_ctx": 512, "swa_full": True}),
                                      ("hybrid", {"n_ctx": 128, "n_seq_max": 3})])
def test_the_footprint_read_off_the_graph_is_what_the_memory_allocates(which: str, kw: Any) -> None:
    m = swa(5) if which == "iswa" else hybrid()
    params = ContextParams(**kw)
    parts = footprint(m.meta.build_graph(which, "decode"), assemble(which, m.arch.needs,
                                                                    ContextParams(**kw, buffers=False)))
    allocated = assemble(which, m.arch.needs, params).buffers()
    assert sum(b for _, _, b in parts.values()) == sum(a.nbytes for a in allocated.values())
    assert sum(k for _, k, _ in parts.values()) == len(allocated)
    if which == "iswa":
        assert parts["n_ctx_swa"][0] == swa_cells(params, 5)


def toy_meta(**keys: Any) -> Any:
    from graphir.model.meta import from_preset

    return from_preset("toy", Preset("test-iswa", {**TINY_KEYS, **LONG, **keys}, tied=True))


def test_the_sliding_layers_come_from_a_period_or_a_per_layer_array() -> None:
    W, P = K.Attention.SLIDING_WINDOW, K.Attention.SLIDING_WINDOW_PATTERN
    assert toy_meta(**{W: 8}).arch.hp.swa_layers == (1, 0, 1, 0)  # the family's default period, 2
    assert toy_meta(**{W: 8, P: 4}).arch.hp.swa_layers == (1, 1, 1, 0)  # the last of every 4 is global
    assert toy_meta(**{W: 8, P: 0}).arch.hp.swa_layers == (1, 1, 1, 1)
    m = toy_meta(**{W: 8, P: [True, False, False, True]})
    assert m.arch.hp.swa_layers == (1, 0, 0, 1)
    assert {name: p.layers for name, p in assemble("iswa", m.arch.needs).parts.items()} == {"base": (1, 2), "swa": (0, 3)}
    assert "swa_layers=[1,0,0,1]" in to_text(m.build_graph("iswa", "decode"))


@pytest.mark.parametrize("keys,message", [
    ({K.Attention.SLIDING_WINDOW: 8, K.Attention.SLIDING_WINDOW_PATTERN: [True, False]},
     "key 'test-iswa.attention.sliding_window_pattern' has 2 values, one per layer needs 4"),
    ({K.Attention.SLIDING_WINDOW: 0}, "key 'test-iswa.attention.sliding_window' is 0: a sliding window needs at least one"),
    ({}, "missing key 'test-iswa.attention.sliding_window'"),
])
def test_a_bad_sliding_window_key_is_one_error_naming_it(keys: dict[str, Any], message: str) -> None:
    with pytest.raises(MetadataError, match=re.escape(message)):
        toy_meta(**keys)


def test_a_model_whose_layers_all_slide_refuses_the_same_edits() -> None:
    """No full cache to compare with: the SWA cache alone stands for the memory, and it still forgets."""
    m = model("test-iswa", **{K.Attention.SLIDING_WINDOW: 5, K.Attention.SLIDING_WINDOW_PATTERN: 0})
    ctx = m.new_context(n_ctx=512, n_batch=32, n_ubatch=32, **F32)
    assert list(ctx.memory.parts) == ["swa"] and not ctx.memory.can_shift()
    for a in range(0, 300, 30):
        ctx.decode(Batch.from_tokens(TOKENS[a:a + 30], a))
    before = memory_bytes(ctx)
    assert ctx.memory.seq_rm(0, 10, -1) is False and memory_bytes(ctx) == before
    with pytest.raises(GraphirError, match="swa_full=True"):
        ctx.memory.seq_add(0, 100, -1, -3)
    assert memory_bytes(ctx) == before and ctx.memory.seq_rm(0, 250, -1) is True
