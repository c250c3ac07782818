"""Layers that attend over another layer's cache (graphir.memory.reuse; llama.cpp's layer reuse, Gemma 3n).

A reader writes no K or V: its memory allocates, saves and shifts nothing for it, and its attention reads the
rows its owner wrote in the same graph. Checked on the memories directly, on Gemma-3n-E2B's graphs and on a
tiny Gemma 3n run through a context (sequence operations, state, a ubatch decoded again after a rollback).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import pytest
from conftest import make_tiny_preset, process_folder, write_model_gguf

from graphir.batch import Batch
from graphir.errors import GraphirError
from graphir.memory.kinds import assemble
from graphir.memory.layers import Attention, ContextParams
from graphir.model.meta import open_model
from graphir.running.runtime import Model, load

OWN, READ = Attention(32, 32), Attention(32, 32, reads=0)
PROMPT = np.random.default_rng(3).integers(0, 128, 9).tolist()


@lru_cache(maxsize=None)
def tiny() -> Model:
    return load(str(write_model_gguf(process_folder("reuse-") / "gemma3n.gguf", make_tiny_preset("gemma3n"))))


def test_a_reader_gets_no_buffers_and_no_saved_rows():
    kv = assemble("kv", (OWN, Attention(32, 32), READ), ContextParams(n_ctx=8))
    assert kv.layers == (0, 1) and sorted(kv.buffers()) == [f"blk.{il}.cache_{w}" for il in (0, 1) for w in "kv"]


@pytest.mark.parametrize("needs", [(READ, OWN), (OWN, Attention(32, 32, reads=1)), (OWN, OWN, Attention(32, 32, reads=1, window=4))],
                         ids=["reads-a-later-layer", "reads-itself", "reads-another-window"])
def test_a_reader_of_a_layer_its_memory_does_not_keep_first_is_refused(needs):
    kind = "iswa" if any(n.window for n in needs) else "kv"
    with pytest.raises(GraphirError, match="reads the cache of layer"):
        assemble(kind, needs, ContextParams(n_ctx=8))


@pytest.mark.parametrize("phase", ["prefill", "decode"])
def test_gemma_3n_e2b_layers_past_twenty_attend_over_layer_18_or_19s_rows(phase):
    g = open_model("Gemma-3n-E2B").build_graph("iswa", phase)
    caches = {n.name for n in g.nodes if n.op == "input" and n.attrs["role"] in ("cache_k", "cache_v")}
    assert caches == {f"blk.{il}.cache_{w}" for il in range(20) for w in "kv"}
    by_name = {n.name: n for n in g.nodes}
    for il in range(20, 30):
        owner = 18 if il % 5 != 4 else 19  # four sliding layers, then a global one
        assert by_name[f"blk.{il}.k"].inputs[0].name == f"blk.{owner}.cache_k.view"
        assert by_name[f"blk.{il}.v"].inputs[0].name == f"blk.{owner}.cache_v.view"


def test_sequence_operations_and_state_hold_the_owners_rows_only():
    m = tiny()
    ctx = m.new_context(n_ctx=64, n_seq_max=2)
    ctx.decode(Batch.from_tokens(PROMPT, 0))
    ctx.memory.seq_cp(0, 1)
    ctx.memory.seq_rm(1, 5, -1)
    ctx.decode(Batch.from_tokens(PROMPT[5:7], 5, seq_id=1))
    saved = ctx.state_save()
    other = m.new_context(n_ctx=64, n_seq_max=2)
    other.state_load(saved)
    for c in (ctx, other):
        c.decode(Batch.one(PROMPT[-1], len(PROMPT), seq_id=0))
    assert np.array_equal(ctx.logits_ith(-1), other.logits_ith(-1))
    assert not any(f"blk.{il}." in k for part in ctx.memory.parts.values() for k in part.buffers() for il in (20, 21))
