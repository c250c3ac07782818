"""DeepSeek-V2/V3 (``deepseek2``) as specifications: multi-head latent attention over a K-only latent cache,
the legacy decompressed form over an ordinary KV cache, and mixtures of experts with shared experts and
group-limited routing.

Tiny random-weight models (conftest's writer), 3 layers of which the first is dense, 4 heads whose keys are 16
values without positions plus 16 RoPE'd, a latent of 32, values of 16:

- ``mla``: the absorbed form with a query compression (q_lora_rank 32), softmax routing over 8 experts (2 used,
  1 shared);
- ``lite``: the absorbed form without query compression (``attn_q``, q_lora_rank 0, as DeepSeek-V2-Lite), the
  LM head tied;
- ``legacy``: one ``attn_kv_b`` decompressing per-head K and V (older GGUFs), over the ordinary KV cache;
- ``v3``: DeepSeek-V3's routing (sigmoid scores, a selection bias, the 2 best of 4 groups of 4 experts, 3 used,
  renormalised and scaled by 2.5) and YaRN x4 with ``yarn_log_multiplier`` 0.0707 (mscale_all_dim 0.707).

llama.cpp (llama-cpp-python, in the same test) is the oracle: logits within 1e-3 (F32 weights; bit for bit on
the oracle's own CPU path), greedy tokens identical, sequences interleaved, seq_rm and the K-shift after
seq_add; Q8_0 and Q4_K experts give its greedy tokens; llama.cpp's own Q8_0 and F16 files of the MLA families
(per-head attn_k_b and attn_v_b stacks of that type) its intermediates and logits bit for bit.
"""

from __future__ import annotations

import math
from pathlib import Path

import gguf
import numpy as np
import pytest
from conftest import TINY_KEYS, TinyModels, memory_bytes, oracle_is_exact, write_model_gguf
from test_families import (LlamaCpp, divergent_continuations_equal_fresh_contexts, failing_second_ubatch_changes_nothing,
                           greedy_against_llama_cpp, last_index, multi, seq_rm_against_llama_cpp)

from graphir.arch.deepseek2 import EXPERT_STACKS
from graphir.errors import GraphError, MetadataError, TensorError
from graphir.graph.ir import Node
from graphir.memory.kinds import assemble
from graphir.memory.layers import Attention, ContextParams, LatentAttention
from graphir.memory.latent import LatentCache
from graphir.model.builder import GraphBuilder
from graphir.model.meta import from_preset, open_model
from graphir.model.presets import Preset
from graphir.batch import Batch

oracle = pytest.mark.oracle
Q = gguf.GGMLQuantizationType
L, A, R = gguf.Keys.LLM, gguf.Keys.Attention, gguf.Keys.Rope
_rng = np.random.default_rng(37)
PROMPT = _rng.integers(0, 256, 12).tolist()
SEQS = [_rng.integers(0, 256, n).tolist() for n in (7, 3, 10)]
KV_LORA, ROT = 32, 16  # the latent and the RoPE'd key part: a cached row holds 48 values

MLA = {**TINY_KEYS, L.BLOCK_COUNT: 3, A.HEAD_COUNT: 4, A.HEAD_COUNT_KV: 1, A.KEY_LENGTH: KV_LORA + ROT,
       A.VALUE_LENGTH: KV_LORA, A.KEY_LENGTH_MLA: 32, A.VALUE_LENGTH_MLA: 16, R.DIMENSION_COUNT: ROT,
       A.KV_LORA_RANK: KV_LORA, A.Q_LORA_RANK: 32, L.LEADING_DENSE_BLOCK_COUNT: 1, L.EXPERT_COUNT: 8,
       L.EXPERT_USED_COUNT: 2, L.EXPERT_FEED_FORWARD_LENGTH: 32, L.EXPERT_SHARED_COUNT: 1, L.EXPERT_GATING_FUNC: 1}
V3 = {**MLA, L.EXPERT_COUNT: 16, L.EXPERT_USED_COUNT: 3, L.EXPERT_GROUP_COUNT: 4, L.EXPERT_GROUP_USED_COUNT: 2,
      L.EXPERT_GATING_FUNC: 2, L.EXPERT_WEIGHTS_NORM: True, L.EXPERT_WEIGHTS_SCALE: 2.5, R.SCALING_TYPE: "yarn",
      R.SCALING_FACTOR: 4.0, R.SCALING_ORIG_CTX_LEN: 64, R.SCALING_YARN_LOG_MUL: 0.0707}
LEGACY = {**{k: v for k, v in MLA.items() if k not in (A.KEY_LENGTH_MLA, A.VALUE_LENGTH_MLA)},
          A.HEAD_COUNT_KV: 4, A.KEY_LENGTH: 32, A.VALUE_LENGTH: 16}
# Q4_K blocks span 256 values: every quantized matrix's ne0 is 256 (no query compression, values of 64)
WIDE = {**MLA, L.EMBEDDING_LENGTH: 256, L.FEED_FORWARD_LENGTH: 256, L.EXPERT_FEED_FORWARD_LENGTH: 256,
        A.VALUE_LENGTH_MLA: 64, A.Q_LORA_RANK: 0}
BIAS = r"blk\.\d+\.exp_probs_b\.bias"

PRESETS = {  # the experts' gate and up stacks one each, as the converter writes them (EXPERT_STACKS)
    "mla": Preset("deepseek2", MLA, tied=False, matrix_type=Q.F32, include=EXPERT_STACKS),
    "lite": Preset("deepseek2", {**MLA, A.Q_LORA_RANK: 0}, tied=True, matrix_type=Q.F32, include=EXPERT_STACKS),
    "legacy": Preset("deepseek2", LEGACY, tied=False, matrix_type=Q.F32, include=EXPERT_STACKS),
    "v3": Preset("deepseek2", V3, tied=False, matrix_type=Q.F32, include=f"{EXPERT_STACKS}|{BIAS}"),
    "wide": Preset("deepseek2", WIDE, tied=False, matrix_type=Q.F32, include=EXPERT_STACKS),
}
F32_MODELS = ["mla", "lite", "legacy", "v3"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> TinyModels:
    return TinyModels(tmp_path_factory.mktemp("deepseek2"), PRESETS)


def max_delta(ours: np.ndarray, ref: np.ndarray) -> float:
    return float(np.abs(np.asarray(ours, np.float64) - np.asarray(ref, np.float64)).max())


# ---------------------------------------------------------------------------------------------------- memory

@pytest.mark.parametrize("name", ["mla", "lite", "v3"])
def test_the_latent_cache_holds_one_row_of_latent_and_key_part_per_token_per_layer_and_no_v(
        tiny: TinyModels, name: str) -> None:
    ctx = tiny.model(name).new_context(n_ctx=64)
    assert isinstance(ctx.memory, LatentCache) and ctx.memory.kind == "mla"
    bufs = ctx.memory.buffers()
    assert sorted(bufs) == [f"blk.{il}.cache_k" for il in range(3)]
    assert {b.shape for b in bufs.values()} == {(64, KV_LORA + ROT)}
    assert ctx.memory.nbytes() == 3 * 64 * (KV_LORA + ROT) * 2  # f16


def test_the_legacy_form_decompresses_per_head_k_and_v_into_an_ordinary_kv_cache(tiny: TinyModels) -> None:
    ctx = tiny.model("legacy").new_context(n_ctx=64)
    assert ctx.memory.kind == "kv"
    assert {k: b.shape for k, b in ctx.memory.buffers().items() if k.startswith("blk.0.")} == {
        "blk.0.cache_k": (64, 4 * 32), "blk.0.cache_v": (64, 4 * 16)}


def test_a_model_with_latent_layers_runs_on_the_latent_memory_only(tiny: TinyModels) -> None:
    assert tiny.model("mla").meta.arch.contexts == ("mla",)
    assert tiny.model("legacy").meta.arch.contexts[0] == "kv"


def _builder(memory: object) -> GraphBuilder:
    meta = from_preset("mla", PRESETS["mla"])
    return GraphBuilder(meta.arch, "mla", meta.tensors, memory, "decode")  # type: ignore[arg-type]


def _leaf(name: str, *shape: int) -> Node:
    return Node(name, "input", (), {"role": name}, "f32", shape)


def test_latent_attention_on_a_kv_memory_is_refused_naming_the_layer() -> None:
    b = _builder(assemble("kv", (Attention(64, 64),), ContextParams()))
    q, k, v = _leaf("q", 48, 4, 1), _leaf("k", 48, 1, 1), _leaf("v", 32, 1, 1)
    with b.layer(0), pytest.raises(GraphError, match="memory kind 'kv' keeps no latent .*layer 0"):
        b.build_attn_mla(q, k, v, wo=_leaf("wo", 64, 64), v_mla=_leaf("v_b", 32, 16, 4), kq_scale=0.25)


def test_plain_attention_on_a_latent_memory_is_refused_naming_the_layer() -> None:
    b = _builder(assemble("mla", (LatentAttention(48),), ContextParams()))
    q, k, v = _leaf("q", 16, 4, 1), _leaf("k", 16, 4, 1), _leaf("v", 16, 4, 1)
    with b.layer(0), pytest.raises(GraphError, match="memory kind 'mla' keeps latent rows for layer 0.*build_attn_mla"):
        b.build_attn(q, k, v, wo=None, kq_scale=0.25)


def test_rows_that_do_not_fit_the_latent_cache_are_refused() -> None:
    b = _builder(assemble("mla", (LatentAttention(48),), ContextParams()))
    with b.layer(0), pytest.raises(GraphError, match=r"latent rows f32\[40, 1, 1\] do not fit .* 48 values"):
        b.build_attn_mla(_leaf("q", 40, 4, 1), _leaf("k", 40, 1, 1), _leaf("v", 32, 1, 1), wo=_leaf("wo", 64, 64),
                         v_mla=_leaf("v_b", 32, 16, 4), kq_scale=0.25)


def test_the_k_shift_turns_only_the_key_part_of_each_latent_row(tiny: TinyModels) -> None:
    """After seq_add the latent values of every row are untouched bit for bit and the last n_rot values move."""
    ctx = tiny.model("mla").new_context(n_ctx=64)
    ctx.decode(Batch.from_tokens(PROMPT, 0))
    before = {k: b.copy() for k, b in ctx.memory.buffers().items()}
    ctx.memory.seq_add(0, 4, -1, 3)
    assert ctx.memory.update()
    for k, b in ctx.memory.buffers().items():
        n = len(PROMPT)
        assert np.array_equal(b[:n, :KV_LORA], before[k][:n, :KV_LORA]), k
        assert np.array_equal(b[:4], before[k][:4]), k
        assert (b[4:n, KV_LORA:] != before[k][4:n, KV_LORA:]).any(), k


def test_a_shift_and_its_inverse_give_the_unshifted_logits(tiny: TinyModels) -> None:
    model = tiny.model("v3")
    ctx, fresh = model.new_context(n_ctx=64), model.new_context(n_ctx=64)
    ctx.decode(Batch.from_tokens(PROMPT, 0))
    fresh.decode(Batch.from_tokens(PROMPT + [7], 0))
    ctx.memory.seq_add(0, -1, -1, 5)
    ctx.memory.seq_add(0, -1, -1, -5)
    ctx.decode(Batch.one(7, len(PROMPT)))
    assert max_delta(ctx.logits_ith(-1), fresh.logits_ith(-1)) <= 1e-3


@pytest.mark.parametrize("name", ["mla", "legacy"])
def test_state_save_and_load_round_trip_bit_for_bit(tiny: TinyModels, name: str) -> None:
    model = tiny.model(name)
    ctx = model.new_context(n_ctx=64, n_seq_max=2)
    ctx.decode(Batch.from_tokens(PROMPT, 0))
    saved, seq = ctx.state_save(), ctx.state_seq_save(0)
    other = model.new_context(n_ctx=64, n_seq_max=2)
    other.state_load(saved)
    assert memory_bytes(other) == memory_bytes(ctx)
    ctx.decode(Batch.one(9, len(PROMPT)))
    other.decode(Batch.one(9, len(PROMPT)))
    assert np.array_equal(ctx.logits_ith(-1), other.logits_ith(-1))
    third = model.new_context(n_ctx=64, n_seq_max=2)
    third.state_seq_load(seq, 1)
    third.decode(Batch(np.array([9]), np.array([len(PROMPT)]), [(1,)], np.ones(1, bool)))
    assert np.array_equal(third.logits_ith(-1), other.logits_ith(-1))


def test_a_state_of_the_latent_cache_does_not_load_into_a_kv_cache_of_the_legacy_form(tiny: TinyModels) -> None:
    from graphir.errors import StateError

    ctx = tiny.model("mla").new_context(n_ctx=64)
    ctx.decode(Batch.from_tokens(PROMPT, 0))
    other = tiny.model("legacy").new_context(n_ctx=64)
    before = memory_bytes(other)
    with pytest.raises(StateError):
        other.state_load(ctx.state_save())
    assert memory_bytes(other) == before


def test_divergent_continuations_equal_fresh_contexts(tiny: TinyModels) -> None:
    divergent_continuations_equal_fresh_contexts(tiny.model("mla"), PROMPT)


def test_a_failing_second_ubatch_changes_nothing(tiny: TinyModels, monkeypatch: pytest.MonkeyPatch) -> None:
    failing_second_ubatch_changes_nothing(tiny.model("v3"), PROMPT, monkeypatch)


def test_the_legacy_k_shift_turns_only_the_last_n_rot_values_of_each_head(tiny: TinyModels) -> None:
    """The legacy form caches per-head K as [16 without positions | 16 RoPE'd]: a shift moves only the latter."""
    ctx = tiny.model("legacy").new_context(n_ctx=64)
    ctx.decode(Batch.from_tokens(PROMPT, 0))
    assert ctx.memory.can_shift()
    before = {k: b.copy() for k, b in ctx.memory.buffers().items()}
    ctx.memory.seq_add(0, 4, -1, 3)
    assert ctx.memory.update()
    n = len(PROMPT)
    for il in range(3):
        k, was = (x[:n].reshape(n, 4, 32) for x in (ctx.memory.buffers()[f"blk.{il}.cache_k"],
                                                    before[f"blk.{il}.cache_k"]))
        assert np.array_equal(k[:, :, :16], was[:, :, :16]) and np.array_equal(k[:4], was[:4]), il
        assert (k[4:, :, 16:] != was[4:, :, 16:]).all(axis=2).any(), il
        assert np.array_equal(ctx.memory.buffers()[f"blk.{il}.cache_v"], before[f"blk.{il}.cache_v"]), il


def test_a_damaged_latent_state_raises_state_error_and_changes_nothing(tiny: TinyModels) -> None:
    from graphir.errors import StateError

    ctx = tiny.model("mla").new_context(n_ctx=64)
    ctx.decode(Batch.from_tokens(PROMPT, 0))
    data = ctx.state_save()
    other = tiny.model("mla").new_context(n_ctx=64)
    other.decode(Batch.from_tokens(PROMPT[:3], 0))
    before = memory_bytes(other)
    flipped = bytearray(data)
    flipped[len(data) // 2] ^= 4
    for bad in (data[: len(data) // 2], bytes(flipped)):
        with pytest.raises(StateError):
            other.state_load(bad)
        assert memory_bytes(other) == before


# ---------------------------------------------------------------------------------------------------- hparams

def test_attention_scores_are_scaled_by_mscale_squared_over_the_mla_head_size() -> None:
    """DeepSeek-V2-Lite: mscale = 0.1 * 0.707 * ln(40) + 1 (the stored 0.0707 divided by 0.1), over sqrt(128 + 64),
    not sqrt(576) (the cached row); the rope's own magnitude cancels ggml's YaRN factor exactly."""
    g = open_model("DeepSeek-V2-Lite").build_graph("mla", "decode")
    scale = g["blk.0.kq_soft_max"].attrs["scale"]
    assert scale == pytest.approx((0.1 * 0.707 * math.log(40) + 1) ** 2 / math.sqrt(192), rel=1e-6)
    v3 = open_model("DeepSeek-V3").build_graph("mla", "decode")["blk.0.kq_soft_max"].attrs["scale"]
    assert v3 == pytest.approx((0.1 * math.log(40) + 1) ** 2 / math.sqrt(192), rel=1e-6)
    rope = g["blk.0.k_pe.rope"].attrs
    assert rope["attn_factor"] * (1 + 0.1 * math.log(40)) == pytest.approx(1.0, rel=1e-6)


def test_v2_lite_projects_queries_directly_and_v3_through_the_compression() -> None:
    lite, v3 = open_model("DeepSeek-V2-Lite").arch, open_model("DeepSeek-V3").arch
    assert "blk.0.attn_q.weight" in lite.specs and "blk.0.attn_q_a.weight" not in lite.specs
    assert v3.specs["blk.0.attn_q_b.weight"].shape == (1536, 128 * 192)
    assert v3.specs["blk.0.attn_k_b.weight"].shape == (128, 512, 128)
    assert v3.specs["blk.0.attn_v_b.weight"].shape == (512, 128, 128)
    assert "blk.2.ffn_up.weight" in v3.specs and "blk.3.ffn_up_exps.weight" in v3.specs


def test_the_lite_sizes_ignore_q_lora_rank_and_the_others_require_it(tmp_path: Path) -> None:
    """llama.cpp reads q_lora_rank for every variant but 26- and 27-layer ones."""
    from graphir.running.runtime import load

    md = {k.format(arch="deepseek2"): v for k, v in {A.Q_LORA_RANK: 32}.items()}
    with pytest.raises(MetadataError, match="missing key 'deepseek2.attention.q_lora_rank'"):
        from_preset("no-q-lora", Preset("deepseek2", {k: v for k, v in MLA.items() if k != A.Q_LORA_RANK},
                                        tied=False))
    lite = from_preset("lite-27", Preset("deepseek2", {**MLA, L.BLOCK_COUNT: 27}, tied=False))
    assert "blk.0.attn_q.weight" in lite.tensors and "blk.0.attn_q_b.weight" not in lite.tensors
    path = write_model_gguf(tmp_path / "m.gguf", PRESETS["lite"], extra_md=md)  # a q_lora_rank the tensors lack
    with pytest.raises(Exception, match="attn_q_a"):
        load(str(path)).new_context(n_ctx=16)


@pytest.mark.parametrize("keys,match", [
    ({L.EXPERT_GROUP_COUNT: 3}, r"8 experts in 3 groups"),
    ({L.EXPERT_GROUP_COUNT: 4, L.EXPERT_GROUP_USED_COUNT: 4}, r"8 experts in 4 groups .* of which 4 are used"),
    ({L.EXPERT_GROUP_COUNT: 4}, r"of which 0 are used"),
    ({L.EXPERT_GROUP_COUNT: 8, L.EXPERT_GROUP_USED_COUNT: 2}, r"8 experts in 8 groups"),
    ({A.VALUE_LENGTH_MLA: 0}, r"key_length_mla' and '.*value_length_mla' must both be set"),
    ({A.KEY_LENGTH_MLA: 16}, r"heads of 16 values .* leave no part without positions"),
    ({A.KEY_LENGTH: 32}, r"a latent row of 32 \+ 16 values is one KV head"),
    ({L.EXPERT_GATING_FUNC: 4}, r"expert_gating_func' = 4"),
    ({L.EXPERT_COUNT: 0, L.EXPERT_USED_COUNT: 0}, r"layers 1\.\. are mixtures of experts"),
    ({A.TEMPERATURE_SCALE: 0.1}, r"temperature_scale' is set"),
    ({L.NEXTN_PREDICT_LAYERS: 99}, r"nextn_predict_layers' = 99 of \d+ layers leaves no layer to run"),
])
def test_what_llama_cpp_refuses_is_refused_naming_the_key(keys: dict, match: str) -> None:
    with pytest.raises(MetadataError, match=match):
        from_preset("bad", Preset("deepseek2", {**MLA, **keys}, tied=False))


def test_a_legacy_file_must_decompress_every_head() -> None:
    with pytest.raises(MetadataError, match=r"legacy form .* 'deepseek2.attention.head_count_kv' = 2 of 4 heads"):
        from_preset("bad", Preset("deepseek2", {**LEGACY, A.HEAD_COUNT_KV: 2}, tied=False))


def test_an_absent_gating_function_is_softmax_as_for_the_first_v2_files() -> None:
    keys = {k: v for k, v in MLA.items() if k != L.EXPERT_GATING_FUNC}
    g = from_preset("no-gating", Preset("deepseek2", keys, tied=False, include=EXPERT_STACKS)).build_graph("mla",
                                                                                                          "decode")
    assert g["blk.1.ffn_moe_probs"].op == "soft_max"


def test_the_experts_gate_and_up_stacks_may_be_one_stack_or_two_but_not_neither() -> None:
    """llama.cpp's loader takes ffn_gate_up_exps (each expert's gate rows, then its up rows) in place of the two
    stacks, as the files it writes itself hold them; a file with neither form is refused naming both."""
    fused = from_preset("fused", Preset("deepseek2", MLA, tied=False, include=r"blk\.\d+\.ffn_gate_up_exps\.weight"))
    assert fused.arch.check(fused.tensors) == []
    g = fused.build_graph("mla", "decode")
    gate, up = g["blk.1.ffn_moe_gate"], g["blk.1.ffn_moe_up"]
    assert gate.inputs[0].name == up.inputs[0].name == "blk.1.ffn_moe_gate_up"
    assert (gate.attrs["offset"], up.attrs["offset"]) == (0, 32) and "blk.1.ffn_up_exps.weight" not in fused.tensors
    neither = from_preset("neither", Preset("deepseek2", MLA, tied=False))
    assert neither.arch.check(neither.tensors) == [
        f"missing tensor 'blk.{il}.ffn_{t}_exps.weight' (or 'blk.{il}.ffn_gate_up_exps.weight' of both stacks)"
        for il in (1, 2) for t in ("up", "gate")]
    with pytest.raises(TensorError, match=r"missing tensor 'blk\.1\.ffn_up_exps\.weight' \(or "
                                          r"'blk\.1\.ffn_gate_up_exps\.weight' of both stacks\)"):
        neither.build_graph("mla", "decode")


# ---------------------------------------------------------------------------------------------------- routing

def test_tokens_take_different_experts(tiny: TinyModels) -> None:
    """The routing is not degenerate: the prompt's tokens do not all take the same experts (from the router)."""
    taps: dict[str, np.ndarray] = {}
    tiny.model("mla").new_context(n_ctx=64).decode(Batch.from_tokens(PROMPT, 0, outputs="all"), taps=taps)
    chosen = taps["blk.1.ffn_moe_topk"]
    assert len({tuple(sorted(row)) for row in chosen}) > 1, f"every token took experts {chosen[0]}"
    assert len(set(chosen.ravel())) > chosen.shape[1]


def test_group_limited_routing_chooses_within_the_best_groups_by_their_top_two(tiny: TinyModels) -> None:
    """V3 routing by its definition (float64): sigmoid scores plus the selection bias, 4 groups of 4 scored by the
    sum of their two best, the 2 best groups kept, the 3 best experts of those; weights the unbiased scores of
    the chosen, renormalised and scaled by 2.5. Some token's best 3 experts overall differ (the groups matter)."""
    model = tiny.model("v3")
    taps: dict[str, np.ndarray] = {}
    model.new_context(n_ctx=64).decode(Batch.from_tokens(PROMPT, 0, outputs="all"), taps=taps)
    for il in (1, 2):
        probs = 1 / (1 + np.exp(-taps[f"blk.{il}.ffn_moe_logits"].astype(np.float64)))
        n = len(probs)
        choice = probs + model.weight(f"blk.{il}.exp_probs_b.bias").astype(np.float64)
        groups = choice.reshape(n, 4, 4)
        score = np.sort(groups, axis=2)[:, :, -2:].sum(2)
        kept = np.argsort(-score, axis=1, kind="stable")[:, :2]
        masked = np.full_like(groups, -np.inf)
        rows = np.arange(n)[:, None]
        masked[rows, kept] = groups[rows, kept]
        want = np.argsort(-masked.reshape(n, 16), axis=1, kind="stable")[:, :3]
        assert np.array_equal(taps[f"blk.{il}.ffn_moe_topk"], want), il
        w = probs[rows, want]
        assert max_delta(taps[f"blk.{il}.ffn_moe_weights_scaled"].reshape(n, 3), w / w.sum(1, keepdims=True) * 2.5) \
            <= 1e-6
        if il == 1:
            assert (np.sort(want, 1) != np.sort(np.argsort(-choice, axis=1, kind="stable")[:, :3], 1)).any()


# ---------------------------------------------------------------------------------------------------- llama.cpp

@oracle
@pytest.mark.parametrize("name", F32_MODELS)
def test_prompt_logits_and_greedy_continuation_are_llama_cpps(tiny: TinyModels, name: str) -> None:
    def check(ours: np.ndarray, ref: np.ndarray, what: str) -> None:
        d = max_delta(ours, ref)
        assert d <= 1e-3, f"{what}: max |d| {d:.3g}"
        if what == "prompt logits" and oracle_is_exact():
            assert np.array_equal(ours, ref), f"prompt logits: max |d| {d:.3g}, not bit-exact"

    ours, theirs = greedy_against_llama_cpp(tiny.model(name), tiny.path(name), PROMPT, 10, check)
    assert ours == theirs


@oracle
def test_each_token_takes_llama_cpps_experts_in_its_groups(tiny: TinyModels) -> None:
    """Group-limited routing node by node: the masked selection scores and the chosen experts' scaled weights
    of every token are llama.cpp's."""
    from llama_taps import llama_cpp_taps

    taps: dict[str, np.ndarray] = {}
    tiny.model("v3").new_context(n_ctx=64).decode(Batch.from_tokens(PROMPT, 0, outputs="all"), taps=taps)
    theirs = llama_cpp_taps(str(tiny.path("v3")), PROMPT)
    ref = theirs["ffn_moe_probs_masked-1"].reshape(len(PROMPT), 16)
    ours = taps["blk.1.ffn_moe_probs_masked"].reshape(len(PROMPT), 16)
    assert np.array_equal(np.isinf(ours), np.isinf(ref)) and (np.isinf(ref).sum(1) == 8).all()
    assert max_delta(np.where(np.isinf(ours), 0, ours), np.where(np.isinf(ref), 0, ref)) <= 1e-6
    assert max_delta(taps["blk.1.ffn_moe_weights_scaled"].ravel(), theirs["ffn_moe_weights_scaled-1"].ravel()) <= 1e-6


@oracle
@pytest.mark.parametrize("ftype", ["Q8_0", "F16"])
@pytest.mark.parametrize("arch", ["deepseek2", "kimi-linear", "bailingmoe3"])
def test_per_head_stacks_of_a_llama_cpp_quantized_file_multiply_as_llama_cpp_does(
        tmp_path: Path, arch: str, ftype: str) -> None:
    """llama.cpp's tiny model of each MLA family through its own quantizer (attn_k_b and attn_v_b become Q8_0 or
    F16 stacks of per-head matrices): llama.cpp multiplies each head's matrix by activations it first converts to
    the type's dot-product format (Q8_0 blocks; f16), and graphir as well, so the absorbed queries and the
    decompressed heads of layer 0 (its eval callback's tensors, where it names them), every position's logits and
    each greedy step's are llama.cpp's (conftest's assert_llama_logits), and so are the greedy tokens."""
    import llama_made
    from conftest import assert_llama_logits
    from llama_taps import llama_cpp_taps

    from graphir import load

    f32 = llama_made.make(tmp_path / "F32.gguf", arch, moe=True)
    path = llama_made.quantize(f32, tmp_path / f"{ftype}.gguf", ftype)
    stored = {t.name: t.tensor_type for t in gguf.GGUFReader(path).tensors}
    assert stored["blk.0.attn_k_b.weight"] == stored["blk.0.attn_v_b.weight"] == Q[ftype]
    prompt = [t % llama_made.DEFAULTS["n_vocab"] for t in PROMPT]
    model, taps = load(str(path)), {}
    model.new_context(n_ctx=64).decode(Batch.from_tokens(prompt, 0, outputs="all"), taps=taps)
    theirs = llama_cpp_taps(str(path), prompt)
    latent = [name for name in ("q_nope_absorbed", "kqv_mla") if f"{name}-0" in theirs]
    assert "kqv_mla" in latent
    for name in latent:
        ref = theirs[f"{name}-0"]
        assert_llama_logits(taps[f"blk.0.{name}"].reshape(ref.shape), ref, name)
    ours, llamas = greedy_against_llama_cpp(model, path, prompt, 8, assert_llama_logits)
    assert ours == llamas


@oracle
def test_a_q4_0_stack_of_several_heads_multiplies_unrepacked_as_llama_cpp_does(tiny: TinyModels,
                                                                               tmp_path: Path) -> None:
    """ggml repacks Q4_0 matrices whose rows come in eights, but only 2-D ones: the 4 heads' attn_v_b [32, 16, 4]
    of the mla model through llama.cpp's Q4_0 quantizer multiply in its vec_dot order (attn_k_b, 16 values a row,
    stays F16), so the decompressed heads, the logits and the greedy tokens are llama.cpp's."""
    import llama_made
    from conftest import assert_llama_logits
    from llama_taps import llama_cpp_taps

    from graphir import load

    path = llama_made.quantize(tiny.path("mla"), tmp_path / "Q4_0.gguf", "Q4_0")
    stored = {t.name: t.tensor_type for t in gguf.GGUFReader(path).tensors}
    assert (stored["blk.0.attn_v_b.weight"], stored["blk.0.attn_k_b.weight"]) == (Q.Q4_0, Q.F16)
    model, taps = load(str(path)), {}
    model.new_context(n_ctx=64).decode(Batch.from_tokens(PROMPT, 0, outputs="all"), taps=taps)
    ref = llama_cpp_taps(str(path), PROMPT)["kqv_mla-0"]
    assert_llama_logits(taps["blk.0.kqv_mla"].reshape(ref.shape), ref, "kqv_mla")
    ours, llamas = greedy_against_llama_cpp(model, path, PROMPT, 8, assert_llama_logits)
    assert ours == llamas


@oracle
def test_a_stack_of_one_head_multiplies_as_the_matrix_ggml_takes_it_for(tmp_path: Path) -> None:
    """A stack of one matrix is 2-D to ggml, which repacks it as any matrix: the single head's Q4_0 attn_v_b of
    llama.cpp's tiny deepseek2 model, multiplied by llama.cpp's own input to it, gives its kqv_mla bit for bit."""
    import llama_made
    from conftest import assert_llama_logits
    from llama_taps import llama_cpp_taps

    from graphir.backends.numba.quant.weight import QWeight, stack_matrices

    path = llama_made.quantize(llama_made.make(tmp_path / "F32.gguf", "deepseek2", moe=True), tmp_path / "Q4_0.gguf",
                               "Q4_0")
    v_b = next(t for t in gguf.GGUFReader(path).tensors if t.name == "blk.0.attn_v_b.weight")
    assert v_b.tensor_type == Q.Q4_0 and len(v_b.shape) == 2  # [kv_lora_rank, d_v], the one head's
    theirs = llama_cpp_taps(str(path), [t % llama_made.DEFAULTS["n_vocab"] for t in PROMPT])
    kqv, ref = theirs["kqv-0"], theirs["kqv_mla-0"]
    (head,) = stack_matrices(QWeight.prepare(v_b.data, v_b.tensor_type, int(v_b.shape[0])), 1)
    assert_llama_logits(head.matmul(np.ascontiguousarray(kqv, np.float32)), ref, "kqv_mla")


@oracle
@pytest.mark.parametrize("name", ["mla", "v3", "legacy"])
@pytest.mark.parametrize("n_ubatch", [64, 4])
def test_several_sequences_of_different_lengths_in_one_batch(tiny: TinyModels, name: str, n_ubatch: int) -> None:
    """Three sequences interleaved in one batch (several ubatches when n_ubatch is 4): each sequence's last logits
    are llama.cpp's for the same batch (within 1e-3), and within 1e-3 of what the sequence gives alone. Not within
    test_families' 1e-5: llama.cpp itself moves a sequence's logits by 1.5e-4 between alone and in company here
    (tinyBLAS sums a cache's cells lane by lane, so where a sequence's cells lie changes the rounding, and MLA's
    576-wide rows, rounded to f16, carry it far)."""
    tokens, pos, ids = multi(SEQS, "interleaved")
    model, path = tiny.model(name), tiny.path(name)
    ctx = model.new_context(n_ctx=64, n_seq_max=len(SEQS), n_ubatch=n_ubatch)
    ctx.decode(Batch(np.array(tokens), np.array(pos), [(s,) for s in ids], np.ones(len(tokens), bool)))
    o = LlamaCpp(path, n_ctx=64, n_seq_max=len(SEQS), n_ubatch=n_ubatch)
    try:
        o.decode(tokens, pos, ids)
        for j, seq in enumerate(SEQS):
            i = last_index(ids, j)
            assert max_delta(ctx.logits_ith(i), o.logits_ith(i)) <= 1e-3, j
            alone = model.new_context(n_ctx=64)
            alone.decode(Batch.from_tokens(seq, 0))
            assert max_delta(ctx.logits_ith(i), alone.logits_ith(-1)) <= 1e-3, j
    finally:
        o.close()


@oracle
@pytest.mark.parametrize("n_ubatch", [1, 3])
def test_small_ubatches_give_llama_cpps_logits_at_the_same_ubatch_size(tiny: TinyModels, n_ubatch: int) -> None:
    """A prompt cut into ubatches of 1 or 3 tokens: llama.cpp's own last logits move with the cut (its matmuls
    change kernels with the number of columns, 3e-4 here between 1 and 3), and graphir's follow them."""
    model, path = tiny.model("v3"), tiny.path("v3")
    ctx, o = model.new_context(n_ctx=64, n_ubatch=n_ubatch), LlamaCpp(path, n_ctx=64, n_ubatch=n_ubatch)
    try:
        ctx.decode(Batch.from_tokens(PROMPT, 0))
        o.decode(PROMPT, range(len(PROMPT)), [0] * len(PROMPT))
        d = max_delta(ctx.logits_ith(-1), o.logits_ith(len(PROMPT) - 1))
        assert d <= 1e-3, d
        if oracle_is_exact() and n_ubatch == 1:
            assert d == 0.0
    finally:
        o.close()


@oracle
@pytest.mark.parametrize("p0,p1", [(2, -1), (4, 9), (-1, -1)], ids=["tail", "middle", "whole"])
def test_seq_rm_succeeds_as_in_llama_cpp_and_the_next_token_sees_what_is_left(tiny: TinyModels, p0: int,
                                                                             p1: int) -> None:
    """A cache cuts anywhere (llama.cpp too); then a token at the next position attends to what is left: the
    same logits as llama.cpp after the same removal."""
    model, path = tiny.model("mla"), tiny.path("mla")
    assert seq_rm_against_llama_cpp(model, path, PROMPT, p0, p1) == (True, True)
    ctx, o = model.new_context(n_ctx=64), LlamaCpp(path, n_ctx=64)
    try:
        ctx.decode(Batch.from_tokens(PROMPT, 0))
        o.decode(PROMPT, range(len(PROMPT)), [0] * len(PROMPT))
        ctx.memory.seq_rm(0, p0, p1)
        assert o.lib.llama_memory_seq_rm(o.lib.llama_get_memory(o.ctx.ctx), 0, p0, p1)
        nxt = max(ctx.memory.seq_pos_max(0) + 1, 0)
        ctx.decode(Batch.one(11, nxt))
        o.decode([11], [nxt], [0])
        assert max_delta(ctx.logits_ith(-1), o.logits_ith(0)) <= 1e-3
    finally:
        o.close()


@oracle
@pytest.mark.parametrize("name", ["mla", "v3", "legacy"])
def test_a_window_slid_by_seq_rm_and_seq_add_gives_llama_cpps_logits(tiny: TinyModels, name: str) -> None:
    """Positions [2, 6) removed and the rest moved back by 4 (llama.cpp's context shift): the K-shift re-ropes
    the RoPE'd part of the cached keys (the last n_rot values of each latent row; of each head's K in the legacy
    form); the next token's logits are llama.cpp's."""
    model, path = tiny.model(name), tiny.path(name)
    ctx, o = model.new_context(n_ctx=64), LlamaCpp(path, n_ctx=64)
    try:
        ctx.decode(Batch.from_tokens(PROMPT, 0))
        o.decode(PROMPT, range(len(PROMPT)), [0] * len(PROMPT))
        mem = o.lib.llama_get_memory(o.ctx.ctx)
        for m in (ctx.memory, None):
            if m is None:
                assert o.lib.llama_memory_seq_rm(mem, 0, 2, 6)
                o.lib.llama_memory_seq_add(mem, 0, 6, -1, -4)
            else:
                assert m.seq_rm(0, 2, 6)
                m.seq_add(0, 6, -1, -4)
        n = len(PROMPT) - 4
        ctx.decode(Batch.one(11, n))
        o.decode([11], [n], [0])
        d = max_delta(ctx.logits_ith(-1), o.logits_ith(0))
        assert d <= 1e-3, d
    finally:
        o.close()


# max |d| of the prompt's logits: bit-exact where graphir runs the oracle's own CPU path; elsewhere F16 and Q8_0
# within 1e-3, Q4_K within the bound test_arch_moe measured when graphir summed it in another order
QUANT_BOUND = {("mla", Q.F16): 1e-3, ("legacy", Q.F16): 1e-3, ("mla", Q.Q8_0): 1e-3, ("v3", Q.Q8_0): 1e-3,
               ("wide", Q.Q4_K): 0.075}


@oracle
@pytest.mark.parametrize("name,dtype", list(QUANT_BOUND), ids=[f"{n}-{t.name}" for n, t in QUANT_BOUND])
def test_quantized_weights_give_llama_cpps_greedy_tokens(tiny: TinyModels, name: str, dtype: Q) -> None:
    """Every matrix (experts included) in the type; the 3-D k_b/v_b stay f32, as the writer keeps stacked
    parameters."""
    bound = 0.0 if oracle_is_exact() else QUANT_BOUND[name, dtype]

    def check(ours: np.ndarray, ref: np.ndarray, what: str) -> None:
        if what == "prompt logits":
            assert max_delta(ours, ref) <= bound, f"prompt logits: max |d| {max_delta(ours, ref):.3g}"

    model = tiny.model(name, dtype)
    assert model.weights["blk.1.ffn_up_exps.weight"].qtype == dtype
    ours, theirs = greedy_against_llama_cpp(model, tiny.path(name, dtype), PROMPT, 8, check)
    assert ours == theirs


def test_a_failing_ubatch_after_a_pending_shift_leaves_the_unshifted_rows_and_the_shift(
        tiny: TinyModels, monkeypatch: pytest.MonkeyPatch) -> None:
    """The K-shift runs first, then the batch's second ubatch fails: the latent rows are as before the shift
    and the shift is still pending; the next decode shifts and gives what an undisturbed context gives."""
    from conftest import fail_on_run

    model = tiny.model("v3")
    ctx, calm = model.new_context(n_ctx=64, n_ubatch=2), model.new_context(n_ctx=64, n_ubatch=2)
    for c in (ctx, calm):
        c.decode(Batch.from_tokens(PROMPT, 0))
        c.memory.seq_add(0, 6, -1, 2)
    before = memory_bytes(ctx)
    calls = fail_on_run(monkeypatch, ctx, 2)  # after the K-shift (a graph of its own), the second ubatch fails
    with pytest.raises(RuntimeError, match="compute failed"):
        ctx.decode(Batch.from_tokens([5, 6, 7], len(PROMPT) + 2))
    assert len(calls) == 2 and memory_bytes(ctx) == before and ctx.memory.has_shift()
    monkeypatch.undo()
    for c in (ctx, calm):
        c.decode(Batch.from_tokens([5, 6, 7], len(PROMPT) + 2))
    assert np.array_equal(ctx.logits_ith(-1), calm.logits_ith(-1))


@pytest.mark.parametrize("unified", [True, False])
def test_seq_cp_then_divergent_tokens_in_either_layout(tiny: TinyModels, unified: bool) -> None:
    """One stream for all sequences or one per sequence (seq_cp copies the latent rows across streams): a copied
    prompt continued by another token gives a fresh context's logits for that history."""
    model = tiny.model("mla")
    ctx = model.new_context(n_ctx=64, n_seq_max=2, unified=unified)
    ctx.decode(Batch.from_tokens(PROMPT, 0))
    ctx.memory.seq_cp(0, 1)
    assert ctx.memory.seq_pos_max(1) == len(PROMPT) - 1
    ctx.decode(Batch(np.array([50]), np.array([len(PROMPT)]), [(1,)], np.ones(1, bool)))
    fresh = model.new_context(n_ctx=64)
    fresh.decode(Batch.from_tokens(PROMPT + [50], 0))
    assert max_delta(ctx.logits_ith(-1), fresh.logits_ith(-1)) <= 1e-5
