"""Granite 4.0-H (granitehybrid): Mamba-2 layers and attention layers in one model, as specifications.

The tiny model (conftest TINY_FAMILY["granitehybrid"]) has four layers, head_count_kv [0, 2, 0, 2]: layers 0
and 2 are Mamba-2 blocks (8 heads of 16, 2 groups, 80 states), layers 1 and 3 grouped-query attention with
RoPE, and all four of Granite's multipliers are set. Its memory is the ``hybrid`` kind: a KV cache for layers
1 and 3, a state cell per sequence for 0 and 2. llama.cpp is the oracle through its C API: logits within 1e-3
(equal on the AVX-512 path; the AVX2 build's conv order is not reproduced yet), greedy tokens identical.
Granite's mixture-of-experts FFNs (with a shared expert) are specified in tests/test_arch_moe.py.
"""

from __future__ import annotations

import gguf
import numpy as np
import pytest
from conftest import TinyModels, make_tiny_preset
from test_families import (SEQ_RM_CASES, divergent_continuations_equal_fresh_contexts,
                           failing_second_ubatch_changes_nothing, greedy_against_llama_cpp,
                           interleaved_against_llama_cpp, seq_rm_against_llama_cpp)

from graphir.memory.composite import HybridMemory
from graphir.memory.layers import Attention, Recurrent
from graphir.batch import Batch

oracle = pytest.mark.oracle
_rng = np.random.default_rng(11)
PROMPT = _rng.integers(0, 256, 12).tolist()
SEQS = [_rng.integers(0, 256, n).tolist() for n in (7, 4, 9)]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> TinyModels:
    return TinyModels(tmp_path_factory.mktemp("granite"), {"granite": make_tiny_preset("granitehybrid", tied=False)})


def assert_llama(ours: np.ndarray, ref: np.ndarray, what: str) -> None:
    """Within 1e-3 (F32): the Mamba-2 conv follows llama.cpp's AVX-512 build, not yet its AVX2 one (3.4e-5)."""
    assert np.abs(ours - ref).max() <= 1e-3, f"{what}: max |d| {np.abs(ours - ref).max():.3g}"


def test_layers_with_no_kv_heads_are_recurrent_and_the_memory_is_hybrid(tiny: TinyModels) -> None:
    model = tiny.model("granite")
    assert [type(n) for n in model.arch.needs] == [Recurrent, Attention, Recurrent, Attention]
    ctx = model.new_context(n_ctx=64)
    assert isinstance(ctx.memory, HybridMemory)
    assert ctx.memory.parts["attn"].layers == (1, 3) and ctx.memory.parts["recr"].layers == (0, 2)


@oracle
def test_prompt_logits_and_greedy_continuation_are_llama_cpps(tiny: TinyModels) -> None:
    ours, theirs = greedy_against_llama_cpp(tiny.model("granite"), tiny.path("granite"), PROMPT, 10, assert_llama)
    assert ours == theirs


@oracle
@pytest.mark.parametrize("n_ubatch", [64, 3])
def test_several_sequences_of_different_lengths_in_one_batch(tiny: TinyModels, n_ubatch: int) -> None:
    """Three sequences, interleaved, split equally as the recurrent part needs: each sequence's logits are
    llama.cpp's, and (float rounding of other batch shapes aside) what it gives alone."""
    interleaved_against_llama_cpp(tiny.model("granite"), tiny.path("granite"), SEQS, n_ubatch)


def test_a_decode_failing_in_its_second_ubatch_leaves_both_parts_as_they_were(tiny: TinyModels,
                                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    failing_second_ubatch_changes_nothing(tiny.model("granite"), PROMPT, monkeypatch)


@oracle
@SEQ_RM_CASES
def test_seq_rm_succeeds_only_where_both_parts_can(tiny: TinyModels, p0: int, p1: int, ours: bool,
                                                  llama_cpps: bool) -> None:
    """Positions 0..4 held. Cutting the tail would need the state of an earlier token: False, and neither part
    changes, as in llama.cpp. Removing everything, or past the end, works. A cut in the middle is where graphir
    differs on purpose: llama.cpp answers True, drops those positions from the KV cache and keeps the recurrent
    state that has already absorbed them, so the two parts no longer describe the same sequence; graphir
    refuses it like any other cut into a state's history."""
    assert seq_rm_against_llama_cpp(tiny.model("granite"), tiny.path("granite"), PROMPT[:5], p0, p1) == \
        (ours, llama_cpps)


def test_divergent_continuations_of_a_copied_sequence_equal_fresh_contexts(tiny: TinyModels) -> None:
    divergent_continuations_equal_fresh_contexts(tiny.model("granite"), PROMPT[:6])


def test_state_save_and_load_restore_both_parts(tiny: TinyModels) -> None:
    model = tiny.model("granite")
    ctx = model.new_context(n_ctx=64)
    ctx.decode(Batch.from_tokens(PROMPT[:6], 0))
    data = ctx.state_save()
    ctx.decode(Batch.one(9, 6))
    want = ctx.logits_ith(-1).copy()
    other = model.new_context(n_ctx=64)
    other.state_load(data)
    other.decode(Batch.one(9, 6))
    assert np.array_equal(other.logits_ith(-1), want)


def test_the_graph_says_which_layers_hold_kv_and_which_state(tiny: TinyModels) -> None:
    from graphir.graph.forms import to_text

    text = to_text(tiny.model("granite").meta.build_graph(phase="decode"), fold=False)
    inputs = [line.split()[1] for line in text.splitlines() if line.startswith("input %blk.")]
    assert inputs == ["%blk.0.rs_r", "%blk.0.rs_s", "%blk.1.cache_k", "%blk.1.cache_v", "%blk.2.rs_r", "%blk.2.rs_s",
                      "%blk.3.cache_k", "%blk.3.cache_v"]
    assert gguf.Keys.LLM.LOGIT_SCALE.format(arch="granitehybrid") in tiny.model("granite").meta.metadata
