"""Qwen3.5 dense (qwen35): gated DeltaNet layers and gated attention layers in one model, as specifications.

The tiny model (conftest TINY_FAMILY["qwen35"]) has four layers, full_attention_interval 2: layers 0 and 2 are
gated DeltaNet (4 value heads of 80 sharing 2 key heads, conv kernel 4), layers 1 and 3 gated grouped-query
attention with QK-norm and interleaved M-RoPE over half of each head, in sections one of which turns by position
0. Its memory is the ``hybrid`` kind: a KV cache for layers 1 and 3, a state cell per sequence for 0 and 2.
llama.cpp is the oracle through its C API: logits within 1e-3 (bit-equal where graphir runs the oracle's own
CPU path), greedy tokens identical.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
from conftest import TinyModels, make_tiny_preset, memory_bytes, oracle_is_exact, oracle_path, write_model_gguf
from test_families import (SEQ_RM_CASES, divergent_continuations_equal_fresh_contexts,
                           failing_second_ubatch_changes_nothing, greedy_against_llama_cpp,
                           interleaved_against_llama_cpp, seq_rm_against_llama_cpp)

from graphir.errors import GraphirError, MetadataError
from graphir.memory.composite import HybridMemory
from graphir.memory.layers import Attention, Recurrent
from graphir.model.meta import from_preset
from graphir.batch import Batch
from graphir.running.runtime import load

oracle = pytest.mark.oracle
K = gguf.Keys
_rng = np.random.default_rng(35)
PROMPT = _rng.integers(0, 256, 12).tolist()
SEQS = [_rng.integers(0, 256, n).tolist() for n in (7, 4, 9)]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> TinyModels:
    return TinyModels(tmp_path_factory.mktemp("qwen35"), {"qwen35": make_tiny_preset("qwen35", tied=False)})


def assert_llama(ours: np.ndarray, ref: np.ndarray, what: str) -> None:
    """Equal where graphir runs the oracle's own AVX-512 path; within 1e-3 (F32 weights) elsewhere: the DeltaNet
    conv, like Mamba-2's, follows llama.cpp's AVX-512 build, not its AVX2 one (1.6e-4 on the prompt there)."""
    worst = float(np.abs(ours - ref).max())
    exact = oracle_is_exact() and oracle_path() == "avx512"
    assert worst == 0.0 if exact else worst <= 1e-3, f"{what}: max |d| {worst:.3g}"


def kinds(**keys: object) -> list[str]:
    arch = from_preset("qwen35", make_tiny_preset("qwen35", **keys)).arch
    return ["R" if isinstance(n, Recurrent) else "A" for n in arch.needs]


def test_the_interval_or_the_per_layer_flags_say_which_layers_are_recurrent() -> None:
    assert kinds() == ["R", "A", "R", "A"]
    assert kinds(**{K.LLM.BLOCK_COUNT: 8, K.LLM.FULL_ATTENTION_INTERVAL: 4}) == ["R", "R", "R", "A"] * 2
    no_interval = make_tiny_preset("qwen35", **{K.LLM.BLOCK_COUNT: 8})  # llama.cpp's default: every fourth attends
    del no_interval.keys[K.LLM.FULL_ATTENTION_INTERVAL]
    assert ["R" if isinstance(n, Recurrent) else "A" for n in from_preset("q", no_interval).arch.needs] == \
        ["R", "R", "R", "A"] * 2
    flags = {"{arch}.attention.recurrent_layers": [False, True, True, False]}  # the flags win over the interval
    assert kinds(**flags) == ["A", "R", "R", "A"]


def test_layers_hold_a_kv_cache_or_a_state_and_the_memory_is_hybrid(tiny: TinyModels) -> None:
    model = tiny.model("qwen35")
    arch = model.arch
    assert [type(n) for n in arch.needs] == [Recurrent, Attention, Recurrent, Attention]
    # llama.cpp's sizes: (d_conv - 1) conv columns of q, k, v; a head x head state per value head
    assert arch.needs[0] == Recurrent(3 * (2 * 2 * 80 + 320), 80 * 320)
    assert arch.needs[1] == Attention(2 * 32, 2 * 32)
    ctx = model.new_context(n_ctx=64)
    assert isinstance(ctx.memory, HybridMemory)
    assert ctx.memory.parts["attn"].layers == (1, 3) and ctx.memory.parts["recr"].layers == (0, 2)


def test_the_graph_says_which_layers_hold_kv_and_which_state(tiny: TinyModels) -> None:
    from graphir.graph.forms import to_text

    text = to_text(tiny.model("qwen35").meta.build_graph(phase="decode"), fold=False)
    inputs = [line.split()[1] for line in text.splitlines() if line.startswith("input %blk.")]
    assert inputs == ["%blk.0.rs_r", "%blk.0.rs_s", "%blk.1.cache_k", "%blk.1.cache_v", "%blk.2.rs_r", "%blk.2.rs_s",
                      "%blk.3.cache_k", "%blk.3.cache_v"]
    assert "rope_multi(" in text and "gated_delta_net(" in text and "mode=imrope" in text


def test_the_preset_holds_kv_in_every_fourth_layer_and_state_in_the_others() -> None:
    from graphir.graph.forms import to_text
    from graphir.model.meta import open_model

    text = to_text(open_model("Qwen3.5-0.8B").build_graph(phase="decode"), fold=False)
    held = [line.split()[1] for line in text.splitlines() if line.startswith("input %blk.")]
    assert held == [f"%blk.{il}.{b}" for il in range(24)
                    for b in (("cache_k", "cache_v") if il % 4 == 3 else ("rs_r", "rs_s"))]


@oracle
def test_prompt_logits_and_greedy_continuation_are_llama_cpps(tiny: TinyModels) -> None:
    ours, theirs = greedy_against_llama_cpp(tiny.model("qwen35"), tiny.path("qwen35"), PROMPT, 10, assert_llama)
    assert ours == theirs


@oracle
@pytest.mark.parametrize("dtype", [gguf.GGMLQuantizationType.F16, gguf.GGMLQuantizationType.Q8_0])
def test_greedy_tokens_of_quantized_weights_are_llama_cpps(tiny: TinyModels, dtype: gguf.GGMLQuantizationType) -> None:
    ours, theirs = greedy_against_llama_cpp(tiny.model("qwen35", dtype), tiny.path("qwen35", dtype), PROMPT, 10,
                                            lambda *_: None)
    assert ours == theirs


@oracle
@pytest.mark.parametrize("n_ubatch", [64, 3])
def test_several_sequences_of_different_lengths_in_one_batch(tiny: TinyModels, n_ubatch: int) -> None:
    """Three sequences, interleaved, split equally as the recurrent part needs: each sequence's logits are within
    1e-3 of llama.cpp's, and (float rounding of other batch shapes aside) what it gives alone. Not bit-equal with
    single-token ubatches of several sequences: ggml picks tinyBLAS or vec_dot for the [d_inner, 1, n_seqs]
    input of ssm_out per sequence (one column: vec_dot), graphir's executor by all the ubatch's columns."""
    interleaved_against_llama_cpp(tiny.model("qwen35"), tiny.path("qwen35"), SEQS, n_ubatch)


def test_a_decode_failing_in_its_second_ubatch_leaves_both_parts_as_they_were(tiny: TinyModels,
                                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    failing_second_ubatch_changes_nothing(tiny.model("qwen35"), PROMPT, monkeypatch)


@oracle
@SEQ_RM_CASES
def test_seq_rm_into_a_states_history_is_refused_and_changes_nothing(tiny: TinyModels, p0: int, p1: int, ours: bool,
                                                                     llama_cpps: bool) -> None:
    """Positions 0..4 held: cutting any of them but all would need the DeltaNet state of an earlier token, so
    graphir refuses, changing nothing; llama.cpp agrees but for a cut in the middle, which it lets through to
    the KV part alone (see tests/test_arch_granite.py)."""
    assert seq_rm_against_llama_cpp(tiny.model("qwen35"), tiny.path("qwen35"), PROMPT[:5], p0, p1) == \
        (ours, llama_cpps)


def test_divergent_continuations_of_a_copied_sequence_equal_fresh_contexts(tiny: TinyModels) -> None:
    divergent_continuations_equal_fresh_contexts(tiny.model("qwen35"), PROMPT[:6])


def test_positions_cannot_be_shifted_as_in_llama_cpp(tiny: TinyModels) -> None:
    """K turned by sections (M-RoPE) has no K-shift in llama.cpp (its memory says it cannot shift); here the
    KV part says the same, and a shift requested anyway is refused at the next decode, changing nothing."""
    ctx = tiny.model("qwen35").new_context(n_ctx=64)
    ctx.decode(Batch.from_tokens(PROMPT[:6], 0))
    assert not ctx.memory.can_shift()
    ctx.memory.seq_add(0, 2, -1, 3)
    before = memory_bytes(ctx)
    with pytest.raises(GraphirError, match="cached K cannot be re-roped"):
        ctx.decode(Batch.one(40, 9))
    assert memory_bytes(ctx) == before


def test_state_save_and_load_restore_both_parts(tiny: TinyModels) -> None:
    model = tiny.model("qwen35")
    ctx = model.new_context(n_ctx=64)
    ctx.decode(Batch.from_tokens(PROMPT[:6], 0))
    data = ctx.state_save()
    ctx.decode(Batch.one(9, 6))
    want = ctx.logits_ith(-1).copy()
    other = model.new_context(n_ctx=64)
    other.state_load(data)
    other.decode(Batch.one(9, 6))
    assert np.array_equal(other.logits_ith(-1), want)


@pytest.mark.parametrize("keys,match", [
    ({K.SSM.INNER_SIZE: 300}, r"inner size 300 \('qwen35\.ssm\.inner_size'\) must be 4 value heads"),
    ({K.SSM.GROUP_COUNT: 3}, r"sharing 3 key heads \('qwen35\.ssm\.group_count'\) evenly"),
    ({K.Rope.DIMENSION_SECTIONS: [0, 0, 0, 8]}, r"RoPE sections \[0, 0, 0, 8\] \('qwen35\.rope\.dimension_sections'\)"),
    ({K.Rope.DIMENSION_SECTIONS: [3, 3, 2]}, r"'qwen35\.rope\.dimension_sections' has 3 values, 4 expected"),
    ({K.Attention.VALUE_LENGTH: 16}, r"heads of 32 keys .* and 16 values .* must be equal"),
    ({"{arch}.attention.recurrent_layers": [True, False]}, r"recurrent_layers' has 2 values, 4 expected"),
    ({K.LLM.FULL_ATTENTION_INTERVAL: 0}, r"full_attention_interval' is 0: it must be at least 1"),
    ({K.LLM.NEXTN_PREDICT_LAYERS: 4}, r"'qwen35\.nextn_predict_layers' = 4 of 4 layers leaves no layer to run"),
], ids=["inner", "key-heads", "sections-extra-only", "sections-length", "head-sizes", "flags-length", "interval",
        "mtp"])
def test_inconsistent_sizes_are_refused_naming_the_key(tmp_path: Path, keys: dict[str, object], match: str) -> None:
    path = write_model_gguf(tmp_path / "bad.gguf", make_tiny_preset("qwen35", tied=False), extra_md={
        k.format(arch="qwen35"): v for k, v in keys.items()})
    with pytest.raises(MetadataError, match=match):
        load(str(path)).hparams  # noqa: B018


def test_a_scalar_section_count_stands_for_all_four() -> None:
    arch = from_preset("q", make_tiny_preset("qwen35", **{K.Rope.DIMENSION_SECTIONS: 2})).arch
    assert arch.hp.rope_sections == (2, 2, 2, 2)


@pytest.mark.parametrize("key", [K.Rope.DIMENSION_SECTIONS, K.SSM.GROUP_COUNT, K.SSM.CONV_KERNEL],
                         ids=["sections", "group-count", "conv-kernel"])
def test_keys_llama_cpp_requires_are_required(tmp_path: Path, key: str) -> None:
    name = key.format(arch="qwen35")
    path = write_model_gguf(tmp_path / "bad.gguf", make_tiny_preset("qwen35", tied=False), drop_md=(name,))
    with pytest.raises(MetadataError, match=rf"missing key '{name}'"):
        load(str(path)).hparams  # noqa: B018
