"""Nemotron-H (nemotron_h, nemotron_h_moe) and Jamba as specifications, where the conformance table does not reach:
which memory part each layer holds, per-layer expert widths (NVIDIA's Puzzle models) and the files llama.cpp
refuses. The tiny models are conftest's TINY_FAMILY ones; the table (tests/test_conformance.py) runs them against
llama.cpp.
"""

from __future__ import annotations

import gguf
import pytest
from conftest import TinyModels, make_tiny_preset

from graphir.errors import MetadataError
from graphir.memory.layers import Attention, Recurrent
from graphir.model.meta import from_preset

L, S = gguf.Keys.LLM, gguf.Keys.SSM


def test_an_ffn_layer_keeps_nothing_and_the_others_their_own_part(tmp_path) -> None:
    """Layer 0 attends, layer 1 is Mamba-2, layer 2 an FFN: the hybrid memory holds K/V for layer 0 and states for
    layer 1 only (llama.cpp's layer filters for Nemotron-H)."""
    model = TinyModels(tmp_path, {"nemotron_h": make_tiny_preset("nemotron_h", tied=False)}).model("nemotron_h")
    assert [type(n) for n in model.arch.needs] == [Attention, Recurrent, type(None)]
    ctx = model.new_context(n_ctx=16)
    assert ctx.memory.parts["attn"].layers == (0,) and ctx.memory.parts["recr"].layers == (1,)


def test_each_moe_layer_sizes_its_experts_by_its_own_entry() -> None:
    """expert_feed_forward_length per layer (NVIDIA's Puzzle models): each mixture's experts take their layer's
    width; a layer whose entry is 0 shares its FFN width among its used experts."""
    preset = make_tiny_preset("nemotron_h_moe", tied=False, **{
        L.BLOCK_COUNT: 5, "{arch}.attention.head_count_kv": [2, 0, 2, 0, 2],
        L.FEED_FORWARD_LENGTH: [0, 0, 128, 0, 96], L.EXPERT_FEED_FORWARD_LENGTH: [0, 0, 48, 0, 0],
        L.EXPERT_USED_COUNT: [2, 2, 2, 2, 2]})
    specs = from_preset("tiny", preset).arch.specs
    assert specs["blk.2.ffn_up_exps.weight"].shape == (32, 48, 4)  # the latent width of 32
    assert specs["blk.4.ffn_up_exps.weight"].shape == (32, 48, 4)  # 96 over 2 used experts


def test_experts_without_a_width_are_refused_naming_the_keys() -> None:
    preset = make_tiny_preset("nemotron_h_moe", tied=False, **{
        L.EXPERT_FEED_FORWARD_LENGTH: 0, L.FEED_FORWARD_LENGTH: [0, 0, 1], L.EXPERT_USED_COUNT: 2})
    with pytest.raises(MetadataError, match="layer 2's experts have no width .*expert_feed_forward_length"):
        from_preset("tiny", preset).arch


def test_jamba_refuses_a_mamba_expansion_other_than_two() -> None:
    """llama.cpp asserts Jamba's inner size is twice the width."""
    preset = make_tiny_preset("jamba", tied=False, **{
        "{arch}.attention.head_count_kv": [2, 0], S.CONV_KERNEL: 4, S.INNER_SIZE: 96, S.STATE_SIZE: 16,
        S.TIME_STEP_RANK: 4})
    with pytest.raises(MetadataError, match="'jamba.ssm.inner_size' = 96"):
        from_preset("tiny", preset).arch
