"""Facts of the pre-norm decoder families (graphir.model.prenorm) and MPT that the conformance table does not
reach: ALiBi past 256 tokens (where llama.cpp pads its mask) with a head count that is not a power of two, the
K-shift a QK-norm after RoPE rules out, MPT's QK LayerNorm (refused) and its optional position table."""

from __future__ import annotations

from pathlib import Path

from dataclasses import replace

import numpy as np
import pytest
from conftest import assert_llama_logits, make_tiny_preset, write_model_gguf
from test_families import LlamaCpp

import llama_made
from graphir.batch import Batch
from graphir.errors import GraphirError, TensorError
from graphir.memory.kv import rope_plan
from graphir.model.meta import open_model
from graphir.running.runtime import load


@pytest.mark.oracle
@pytest.mark.parametrize("arch, n_layer", [("baichuan", 40), ("refact", 2), ("bloom", 2), ("mpt", 2),
                                           ("jais", 2)])  # Baichuan 13B: 40
def test_alibi_past_256_tokens_with_12_heads_is_llama_cpps(tmp_path: Path, arch: str, n_layer: int) -> None:
    """12 heads: the last four take the second slope base; 300 tokens: past the 256 cells llama.cpp pads to."""
    path = llama_made.make(tmp_path / f"{arch}.gguf", arch, n_layer=n_layer, n_embd=384, n_head=12, n_ctx=512)
    assert open_model(str(path)).arch.hp.max_alibi_bias == 8.0
    prompt = np.random.default_rng(3).integers(0, 128, 300).tolist()
    ctx, o = load(str(path)).new_context(n_ctx=512), LlamaCpp(path, n_ctx=512)
    try:
        ctx.decode(Batch.from_tokens(prompt, 0, outputs="all"))  # as llama.cpp's context here: every row out
        o.decode(prompt, range(len(prompt)), [0] * len(prompt))
        assert_llama_logits(ctx.logits(), np.stack([o.logits_ith(i) for i in range(len(prompt))]), "prompt logits")
        token = int(np.argmax(o.logits_ith(-1)))
        ctx.decode(Batch.one(token, len(prompt)))
        o.decode([token], [len(prompt)], [0])
        assert_llama_logits(ctx.logits_ith(-1), o.logits_ith(0), "a step past it")
    finally:
        o.close()


@pytest.mark.parametrize("preset, shiftable", [("Hunyuan-dense-tiny", False), ("Maincoder-tiny", False),
                                               ("Arcee-tiny", True)])
def test_a_k_normalised_after_its_rope_cannot_be_reroped(preset: str, shiftable: bool) -> None:
    """Hunyuan dense and Maincoder cache K as norm(rope(K)): no rotation of it is the rotation of K, so the
    cache refuses a K-shift (graphir.memory.kv.rope_plan) where another family re-ropes."""
    assert rope_plan(open_model(preset).build_graph("kv", "prefill"))[0] is shiftable


def test_an_mpt_file_with_qk_layernorms_is_refused_by_name(tmp_path: Path) -> None:
    """llama.cpp loads MPT's Q LayerNorm but its graph cannot apply it (ggml refuses to reshape the strided view
    of the fused QKV): graphir names the tensor instead of running a graph llama.cpp never builds."""
    preset = make_tiny_preset("mpt")
    path = write_model_gguf(tmp_path / "mpt.gguf", replace(preset, include=r"blk\.\d+\.attn_[qk]_norm\.(weight|bias)"))
    with pytest.raises(TensorError, match=r"tensor 'blk\.0\.attn_q_norm\.weight': MPT's QK LayerNorm is not run"):
        load(str(path))
    load(str(write_model_gguf(tmp_path / "plain.gguf", preset)))  # without them it loads


@pytest.mark.parametrize("table, limit", [(True, 256), (False, 0)])
def test_an_mpt_runs_as_far_as_its_position_table_and_without_one_further(tmp_path: Path, table: bool,
                                                                         limit: int) -> None:
    """The context's bound is the file's position table (its rows), not the family: MPT-7B has none (ALiBi alone)."""
    preset = make_tiny_preset("mpt", **{"mpt.attention.max_alibi_bias": 8.0})
    path = write_model_gguf(tmp_path / "mpt.gguf", replace(preset, include=r"position_embd\.weight" if table else ""))
    model = load(str(path))
    assert model.position_rows == limit
    if table:
        with pytest.raises(GraphirError, match="n_ctx=512 exceeds the 256 positions"):
            model.new_context(n_ctx=512)
    else:
        with pytest.warns(UserWarning, match="more than the 256 the model was trained with"):
            ctx = model.new_context(n_ctx=512)
        ctx.decode(Batch.from_tokens(list(range(64)) * 5, 0))  # 320 tokens, past the 256 it was trained with
        assert np.isfinite(ctx.logits()).all()
