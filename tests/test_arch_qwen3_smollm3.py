"""Qwen3 (QK-norm) and SmolLM3 (NoPE every fourth layer): Llama with one change each, against llama.cpp.

Tiny random GGUFs (4 layers, so SmolLM3 has one layer without RoPE), F32 weights and an F32 cache: logits at
every position of a 40-token prompt within 1e-3 of llama.cpp's, through several ubatches; F16 and Q8_0
weights give llama.cpp's greedy tokens; batching does not change the numbers beyond float rounding.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
from conftest import make_tiny_preset, write_model_gguf
from test_runtime import graphir_greedy, llama_cpp_greedy, llama_cpp_logits

from graphir.batch import Batch
from graphir.model.meta import ModelMeta, from_preset
from graphir.running.runtime import load

Q = gguf.GGMLQuantizationType
ARCHS = pytest.mark.parametrize("arch", ["qwen3", "smollm3"])
PROMPT = np.random.default_rng(33).integers(0, 256, 40).tolist()
oracle = pytest.mark.oracle


def tiny(tmp_path: Path, arch: str, dtype: Q = Q.F32) -> Path:
    keys = {gguf.Keys.LLM.BLOCK_COUNT: 4}
    if dtype != Q.F32:  # rows of 256 so that quantized blocks fit
        keys.update({gguf.Keys.LLM.EMBEDDING_LENGTH: 256, gguf.Keys.LLM.FEED_FORWARD_LENGTH: 512})
    return write_model_gguf(tmp_path / f"{arch}-{dtype.name}.gguf", make_tiny_preset(arch, tied=False, **keys), dtype)


def all_logits(path: Path, tokens: list[int], **kw: int) -> np.ndarray:
    ctx = load(str(path)).new_context(n_ctx=64, type_k="f32", type_v="f32", **kw)
    ctx.decode(Batch.from_tokens(tokens, 0, outputs="all"))
    return ctx.logits()


def tiny_meta(arch: str) -> ModelMeta:
    return from_preset(arch, make_tiny_preset(arch, **{gguf.Keys.LLM.BLOCK_COUNT: 4}))


def test_qwen3_normalises_each_head_of_q_and_k_before_rope() -> None:
    g = tiny_meta("qwen3").build_graph("kv", "decode")
    assert g["blk.0.Qcur_normed"].inputs[0].inputs[0].name == "blk.0.Qcur.heads"
    assert g["blk.0.Qcur.rope"].inputs[0].name == "blk.0.Qcur_normed"
    assert g["blk.0.Kcur.rope"].inputs[0].name == "blk.0.Kcur_normed"
    assert g["blk.0.attn_q_norm.weight"].shape == (16,)


def test_smollm3_leaves_every_fourth_layer_without_rope() -> None:
    g = tiny_meta("smollm3").build_graph("kv", "decode")
    roped = {n.layer for n in g.nodes if n.op == "rope"}
    assert roped == {0, 1, 2}
    assert g["blk.3.cache_k.write"].inputs[1].inputs[0].name == "blk.3.Kcur.heads"


@oracle
@ARCHS
def test_f32_logits_match_llama_cpp_at_every_position_over_several_ubatches(tmp_path: Path, arch: str) -> None:
    path = tiny(tmp_path, arch)
    ref = llama_cpp_logits(path, PROMPT, "f32")
    ours = all_logits(path, PROMPT, n_ubatch=16)
    assert ref.std() > 0.5
    assert np.abs(ours - ref).max() <= 1e-3


@oracle
@ARCHS
@pytest.mark.parametrize("dtype", [Q.F16, Q.Q8_0])
def test_quantized_weights_give_llama_cpps_greedy_tokens(tmp_path: Path, arch: str, dtype: Q) -> None:
    path = tiny(tmp_path, arch, dtype)
    assert graphir_greedy(load(str(path)), PROMPT[:6], 16) == llama_cpp_greedy(path, PROMPT[:6], 16)


@ARCHS
def test_logits_do_not_depend_on_how_tokens_are_batched(tmp_path: Path, arch: str) -> None:
    path = tiny(tmp_path, arch)
    once = all_logits(path, PROMPT[:20])
    by_5 = all_logits(path, PROMPT[:20], n_ubatch=5)
    ctx = load(str(path)).new_context(n_ctx=64, type_k="f32", type_v="f32")
    step = []
    for i, t in enumerate(PROMPT[:20]):
        ctx.decode(Batch.one(t, i))
        step.append(ctx.logits_ith(-1).copy())
    assert np.abs(once - by_5).max() <= 1e-4 and np.abs(once - np.array(step)).max() <= 1e-4


def test_a_shifted_smollm3_history_equals_one_decoded_at_the_new_positions(tmp_path: Path) -> None:
    """The K-shift re-ropes the RoPE layers' cached K and leaves the NoPE layer's as it is."""
    model = load(str(tiny(tmp_path, "smollm3")))
    ctx = model.new_context(n_ctx=64, type_k="f32", type_v="f32")
    ctx.decode(Batch.from_tokens(PROMPT[:10], 0))
    ctx.memory.seq_add(0, 0, -1, 7)
    ctx.decode(Batch.one(PROMPT[10], 17))
    fresh = model.new_context(n_ctx=64, type_k="f32", type_v="f32")
    fresh.decode(Batch.from_tokens(PROMPT[:11], 7))
    assert np.abs(ctx.logits_ith(-1) - fresh.logits_ith(-1)).max() <= 2e-5
