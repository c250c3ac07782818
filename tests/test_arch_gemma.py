"""Gemma 2 and Gemma 3 (arch/gemma.py) as specifications, against llama.cpp (llama-cpp-python).

Models are tiny random GGUFs (conftest.write_model_gguf): gemma2 with 4 layers (the even ones local), gemma3
with 6 (layers 0-4 local, 5 global), a head size of 32 (not n_embd / n_head, as in the real models), a window
of 8 positions, small soft caps for gemma2 (3 on the scores, 2 on the logits, so that capping bends the
numbers), and gemma3's global layers at RoPE base 1e6 with linear scaling 8 while its local ones use 10000.

A 300-token prompt runs in ubatches of 16 through a context whose SWA cache has llama.cpp's size (the window
plus a ubatch, padded to 256 cells: ``swa_full`` off), so that cells which left the window are taken again;
llama.cpp runs the same context (swa_full off, the same cache type, no flash attention).

Bounds: with Q8_0 weights and an f16 cache (the path graphir emulates operation by operation) the logits are
llama.cpp's bit for bit (where graphir runs the oracle's CPU path, conftest.oracle_is_exact; elsewhere
isa.APPROX). With F32 weights and an F32 cache they are within 1e-3 on this prompt: graphir's F32 matmuls
and F32-cache attention do not add in llama.cpp's order to the last bit, and ggml's GELU reads an f16 table,
so a one-ulp difference in its input can pick the neighbouring entry (a 1e-4 step) that the post-FFN norms
carry on to the logits (measured on this prompt: gemma2 5.8e-4, gemma3 6.7e-4; 1.2e-3 for gemma3 on another
one, beyond this bound; a Llama of the same size, whose SiLU has no table, 3e-6). Greedy continuations are
llama.cpp's for F32, F16 and Q8_0 weights.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import gguf
import numpy as np
import pytest
from conftest import TinyModels, assert_llama_logits, make_tiny_preset, memory_bytes, write_vocab_gguf
from test_families import LlamaCpp, graphir_greedy, llama_cpp_greedy

from graphir.cli import main
from graphir.errors import GraphirError, MetadataError
from graphir.memory.composite import swa_cells
from graphir.memory.layers import ContextParams
from graphir.model.hparams import f32
from graphir.model.meta import from_preset, open_model
from graphir.model.presets import Preset
from graphir.batch import Batch
from graphir.running.context import Context
from graphir.running.runtime import Model

Q = gguf.GGMLQuantizationType
K = gguf.Keys
oracle = pytest.mark.oracle
FAMILIES = pytest.mark.parametrize("arch", ["gemma2", "gemma3"])

WINDOW, N_UBATCH, N_CTX = 8, 16, 512
TOKENS = np.random.default_rng(7).integers(0, 256, 400).tolist()
LONG = 300  # more positions than the SWA cache's 256 cells
F32_BOUND = 1e-3  # F32 weights against llama.cpp (see the module docstring)
CLOSE = 2e-4  # graphir against itself, the same numbers computed in another order

COMMON = {K.LLM.CONTEXT_LENGTH: 1024, K.Attention.KEY_LENGTH: 32, K.Attention.VALUE_LENGTH: 32,
          K.Attention.SLIDING_WINDOW: WINDOW, K.Attention.LAYERNORM_RMS_EPS: 1e-6}
GEMMA3 = {**COMMON, K.LLM.BLOCK_COUNT: 6, K.Rope.FREQ_BASE: 1e6, K.Rope.FREQ_BASE_SWA: 10000.0,
          K.Rope.SCALING_TYPE: "linear", K.Rope.SCALING_FACTOR: 8.0}
MODELS: dict[str, Preset] = {
    "gemma2": make_tiny_preset("gemma2", **{**COMMON, K.LLM.BLOCK_COUNT: 4, K.LLM.ATTN_LOGIT_SOFTCAPPING: 3.0,
                                            K.LLM.FINAL_LOGIT_SOFTCAPPING: 2.0}),
    "gemma3": make_tiny_preset("gemma3", tied=False, **GEMMA3),
    # no window at all: every layer global, one plain KV cache
    "gemma3-global": make_tiny_preset("gemma3", tied=False, **{k: v for k, v in GEMMA3.items()
                                                               if k != K.Attention.SLIDING_WINDOW}),
    # local layers from a per-layer array; tied LM head; capped logits
    "gemma3-pattern": make_tiny_preset("gemma3", **{**GEMMA3, K.LLM.FINAL_LOGIT_SOFTCAPPING: 2.0,
                                                    K.Attention.SLIDING_WINDOW_PATTERN: [True, False, True, True,
                                                                                         False, True]}),
}


# ---- fixtures and helpers ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tinies(tmp_path_factory: pytest.TempPathFactory) -> TinyModels:
    return TinyModels(tmp_path_factory.mktemp("gemma"), MODELS)


@pytest.fixture(scope="module")
def gemma_file(tinies: TinyModels) -> Callable[..., Path]:
    """``gemma_file(name, dtype=F32)``: the tiny model's GGUF, written once per module."""
    return tinies.path


@pytest.fixture(scope="module")
def gemma(tinies: TinyModels) -> Callable[..., Model]:
    """``gemma(name, dtype=F32)``: the loaded tiny model, shared by the module's tests."""
    return tinies.model


class GemmaCpp(LlamaCpp):
    """llama.cpp with graphir's context settings: the cache type (f32 or f16) and, unless asked, an SWA cache of
    window size."""

    def __init__(self, path: Path, *, cache: str = "f32", swa_full: bool = False, **kw: Any):
        import llama_cpp

        defaults = llama_cpp.llama_context_default_params
        ggml_type = {"f32": llama_cpp.GGML_TYPE_F32, "f16": llama_cpp.GGML_TYPE_F16}[cache]

        def params() -> Any:
            p = defaults()
            p.swa_full, p.type_k, p.type_v = swa_full, ggml_type, ggml_type
            return p

        llama_cpp.llama_context_default_params = params  # read once, by LlamaCpp.__init__
        try:
            super().__init__(path, **kw)
        finally:
            llama_cpp.llama_context_default_params = defaults

    def memory(self) -> Any:
        return self.lib.llama_get_memory(self.ctx.ctx)

    def logits(self, n: int) -> np.ndarray:
        return np.array([self.logits_ith(i) for i in range(n)])


def context(model: Model, cache: str = "f32", **kw: Any) -> Context:
    """The context the comparisons run in: 512 cells, ubatches of 16, SWA cache of llama.cpp's size."""
    return model.new_context(**{"n_ctx": N_CTX, "n_batch": N_CTX, "n_ubatch": N_UBATCH, "type_k": cache,
                                "type_v": cache, **kw})


def one_by_one(ctx: Context, tokens: list[int], start: int = 0) -> np.ndarray:
    rows = []
    for i, t in enumerate(tokens):
        ctx.decode(Batch.one(t, start + i))
        rows.append(ctx.logits_ith(-1).copy())
    return np.array(rows)


def long_prompt(model: Model, cache: str = "f32", **kw: Any) -> Context:
    ctx = context(model, cache, **kw)
    ctx.decode(Batch.from_tokens(TOKENS[:LONG], 0, outputs="all"))
    return ctx


# ---- against llama.cpp -----------------------------------------------------------------------------------


@oracle
@FAMILIES
@pytest.mark.parametrize("dtype,cache", [(Q.Q8_0, "f16"), (Q.F32, "f32")], ids=["Q8_0-f16", "F32-f32"])
def test_logits_of_a_prompt_through_a_recycled_swa_cache_match_llama_cpp(
        gemma_file: Callable[..., Path], gemma: Callable[..., Model], arch: str, dtype: Q, cache: str) -> None:
    """300 tokens in ubatches of 16, every position's logits; both keep the same window of the sequence."""
    ref = GemmaCpp(gemma_file(arch, dtype), cache=cache, n_ctx=N_CTX, n_ubatch=N_UBATCH)
    try:
        ref.decode(TOKENS[:LONG], range(LONG), [0] * LONG)
        want = ref.logits(LONG)
        ref_pos_min = ref.lib.llama_memory_seq_pos_min(ref.memory(), 0)
    finally:
        ref.close()
    ctx = long_prompt(gemma(arch, dtype), cache)
    assert want.std() > 0.5  # spread logits: a wrong window, cap or rotation would move them
    if dtype == Q.Q8_0:
        assert_llama_logits(ctx.logits(), want)
    else:
        assert np.abs(ctx.logits() - want).max() <= F32_BOUND
    swa = ctx.memory.parts["swa"]
    assert swa.n_ctx == 256 < LONG and (swa.pos >= 0).sum() == 256  # every cell in use, some of them twice
    assert ctx.memory.seq_pos_min(0) == ref_pos_min == LONG - 256


@oracle
@pytest.mark.parametrize("name,kind,local", [("gemma3-global", "kv", ()), ("gemma3-pattern", "iswa", (0, 2, 3, 5))])
def test_a_gemma3_without_window_or_with_a_per_layer_pattern_matches_llama_cpp(
        gemma_file: Callable[..., Path], gemma: Callable[..., Model], name: str, kind: str,
        local: tuple[int, ...]) -> None:
    """No attention.sliding_window: one KV cache, every layer global at the model's RoPE; a bool array as
    attention.sliding_window_pattern: those layers local."""
    model = gemma(name, Q.Q8_0)
    assert model.arch.contexts[0] == kind
    assert tuple(il for il in range(6) if model.hparams.is_swa(il)) == local
    n = 40
    ref = GemmaCpp(gemma_file(name, Q.Q8_0), cache="f16", n_ctx=N_CTX, n_ubatch=N_UBATCH)
    try:
        ref.decode(TOKENS[:n], range(n), [0] * n)
        want = ref.logits(n)
    finally:
        ref.close()
    ctx = context(model, "f16")
    assert ctx.memory.kind == kind
    ctx.decode(Batch.from_tokens(TOKENS[:n], 0, outputs="all"))
    assert_llama_logits(ctx.logits(), want)


@oracle
@FAMILIES
@pytest.mark.parametrize("dtype", [Q.F32, Q.F16, Q.Q8_0], ids=["F32", "F16", "Q8_0"])
def test_greedy_continuation_is_llama_cpps_token_for_token(gemma_file: Callable[..., Path],
                                                           gemma: Callable[..., Model], arch: str, dtype: Q) -> None:
    """12 prompt tokens and 16 generated ones, each fed back alone: the window slides over all of them. (The
    random gemma2 repeats one token: its input embedding, scaled by sqrt(n_embd), dominates the tied head; the
    next test follows its decode steps logit by logit.)"""
    ours = graphir_greedy(gemma(arch, dtype), TOKENS[:12], 16)
    assert ours == llama_cpp_greedy(gemma_file(arch, dtype), TOKENS[:12], 16)
    assert len(set(ours)) > 2 or arch == "gemma2"


@oracle
@FAMILIES
def test_decoding_one_token_at_a_time_gives_llama_cpps_logits(gemma_file: Callable[..., Path],
                                                              gemma: Callable[..., Model], arch: str) -> None:
    """24 single-token decodes (three windows): each step's logits are llama.cpp's (Q8_0 weights, f16 cache)."""
    n = 24
    ref = GemmaCpp(gemma_file(arch, Q.Q8_0), cache="f16", n_ctx=64)
    try:
        want = []
        for i in range(n):
            ref.decode([TOKENS[i]], [i], [0])
            want.append(ref.logits_ith(0))
    finally:
        ref.close()
    assert_llama_logits(one_by_one(gemma(arch, Q.Q8_0).new_context(n_ctx=64), TOKENS[:n]), np.array(want))


@oracle
@FAMILIES
def test_seq_add_on_a_full_size_swa_cache_re_ropes_each_layer_as_llama_cpp_does(
        gemma_file: Callable[..., Path], gemma: Callable[..., Model], arch: str) -> None:
    """With swa_full, moving a sequence by 5 positions re-rotates every cached K with its own layer's RoPE
    (gemma3: base 10000 unscaled on local layers, 1e6 with scaling 8 on global ones): the next token's logits
    are llama.cpp's after the same edit, and a fresh context's for the prompt placed 5 positions later."""
    n, delta = 20, 5
    ref = GemmaCpp(gemma_file(arch, Q.Q8_0), cache="f16", n_ctx=64, swa_full=True)
    try:
        ref.decode(TOKENS[:n], range(n), [0] * n)
        ref.lib.llama_memory_seq_add(ref.memory(), 0, -1, -1, delta)
        ref.decode([TOKENS[n]], [n + delta], [0])
        want = ref.logits_ith(0)
    finally:
        ref.close()
    model = gemma(arch, Q.Q8_0)
    for cache in ("f16", "f32"):
        ctx = model.new_context(n_ctx=64, type_k=cache, type_v=cache, swa_full=True)
        ctx.decode(Batch.from_tokens(TOKENS[:n], 0))
        ctx.memory.seq_add(0, -1, -1, delta)
        got = one_by_one(ctx, [TOKENS[n]], start=n + delta)[0]
        if cache == "f16":
            assert_llama_logits(got, want)
        else:  # K turned twice is K turned once, up to rounding (an f16 cache rounds each turn: ~5e-2 here)
            fresh = model.new_context(n_ctx=64, type_k=cache, type_v=cache, swa_full=True)
            fresh.decode(Batch.from_tokens(TOKENS[:n + 1], delta))
            assert np.abs(got - fresh.logits_ith(-1)).max() <= CLOSE


# ---- batching and the SWA cache -------------------------------------------------------------------------------


@FAMILIES
def test_one_batch_and_token_by_token_give_the_same_logits(gemma: Callable[..., Model], arch: str) -> None:
    """64 tokens as one batch (four ubatches) and one decode per token (Q8_0 weights: activations are
    quantized per row, so rows do not depend on their batch)."""
    model = gemma(arch, Q.Q8_0)
    once = context(model)
    once.decode(Batch.from_tokens(TOKENS[:64], 0, outputs="all"))
    step = one_by_one(context(model), TOKENS[:64])
    assert np.abs(step - once.logits()).max() <= CLOSE


@FAMILIES
def test_the_swa_cache_keeps_its_size_while_the_sequence_grows_past_it(gemma: Callable[..., Model], arch: str) -> None:
    """llama.cpp's size: min(n_ctx, window + n_ubatch) padded to 256 cells. Decoding 300 tokens 16 at a time,
    the SWA cache never holds more, its cells are taken again once out of the window (the oldest first), the
    next token sees the last 7 positions in it (8 with its own), and the full cache holds every position."""
    model = gemma(arch)
    ctx = context(model)
    size = swa_cells(ContextParams(n_ctx=N_CTX, n_ubatch=N_UBATCH), WINDOW)
    swa, base = ctx.memory.parts["swa"], ctx.memory.parts["base"]
    assert size == swa.n_ctx == 256 and base.n_ctx == N_CTX
    for a in range(0, LONG, N_UBATCH):
        end = min(a + N_UBATCH, LONG)
        ctx.decode(Batch.from_tokens(TOKENS[a:end], a))
        held = swa.pos[swa.pos >= 0]
        assert len(held) == min(end, size) and held.max() == end - 1 and held.min() == max(0, end - size)
        assert swa.rule.sees(end, held).sum() == WINDOW - 1  # and itself: a window of 8
        assert sorted(base.pos[base.pos >= 0]) == list(range(end))


@FAMILIES
def test_seq_rm_that_needs_forgotten_positions_is_refused_and_changes_nothing(gemma: Callable[..., Model],
                                                                              arch: str) -> None:
    """After 300 tokens the SWA cache holds positions 44..299: cutting the sequence back to 20 would leave its
    next token a window (12..19) nobody kept, so seq_rm answers False; a cut the window survives works, and
    the sequence goes on as if the cut-off tokens had never come."""
    model = gemma(arch)
    ctx = long_prompt(model)
    before = memory_bytes(ctx)
    assert ctx.memory.seq_rm(0, 20, -1) is False
    assert memory_bytes(ctx) == before
    keep = LONG - 10
    assert ctx.memory.seq_rm(0, keep, -1) is True
    assert ctx.memory.seq_pos_max(0) == keep - 1
    ctx.decode(Batch.from_tokens(TOKENS[LONG:LONG + 4], keep))
    fresh = context(model)
    fresh.decode(Batch.from_tokens(TOKENS[:keep] + TOKENS[LONG:LONG + 4], 0))
    assert np.abs(ctx.logits_ith(-1) - fresh.logits_ith(-1)).max() <= CLOSE


@FAMILIES
def test_seq_add_needs_a_full_size_swa_cache(gemma: Callable[..., Model], arch: str) -> None:
    """Without swa_full the SWA cache forgot the K rows a shift would re-rotate: seq_add raises naming the
    option and changes nothing. With swa_full it shifts (see the llama.cpp comparison above)."""
    model = gemma(arch)
    ctx = context(model)
    ctx.decode(Batch.from_tokens(TOKENS[:20], 0))
    before = memory_bytes(ctx)
    with pytest.raises(GraphirError, match=r"^seq_add: .*swa_full=True"):
        ctx.memory.seq_add(0, -1, -1, 3)
    assert memory_bytes(ctx) == before
    full = context(model, swa_full=True)
    full.decode(Batch.from_tokens(TOKENS[:20], 0))
    full.memory.seq_add(0, -1, -1, 3)
    assert full.memory.seq_pos_min(0) == 3 and full.memory.seq_pos_max(0) == 22
    full.decode(Batch.one(TOKENS[20], 23))
    assert np.isfinite(full.logits_ith(-1)).all()


# ---- metadata --------------------------------------------------------------------------------------------


def header_file(path: Path, arch: str, **keys: Any) -> Path:
    """A tensor-less GGUF of the tiny model's metadata with some keys changed (None: left out)."""
    md = {k: v for k, v in {**MODELS[arch].keys, **keys}.items() if v is not None}
    return write_vocab_gguf(path, {}, arch=arch.split("-")[0], hparams=md)


@pytest.mark.parametrize("arch,key,value,why", [
    ("gemma3", K.Attention.SLIDING_WINDOW_PATTERN, [True, False, True], "has 3 values, one per layer needs 6"),
    ("gemma2", K.Attention.SLIDING_WINDOW, 0, "is 0: a sliding window needs at least one position"),
    ("gemma2", K.LLM.ATTN_LOGIT_SOFTCAPPING, 0.0, "is 0.0: a soft cap must be positive"),
    ("gemma2", K.LLM.FINAL_LOGIT_SOFTCAPPING, -1.0, "is -1.0: a soft cap must be positive"),
])
def test_bad_sliding_or_capping_metadata_is_a_one_line_error_naming_the_key(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], arch: str, key: str, value: Any, why: str) -> None:
    path = header_file(tmp_path / "bad.gguf", arch, **{key: value})
    name = key.format(arch=arch)
    with pytest.raises(MetadataError, match=f"key '{name}' {why}"):
        open_model(str(path)).arch
    assert main(["dump", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("graphir: error: ") and f"'{name}'" in err


def test_gemma2_keys_left_out_mean_llama_cpps_defaults() -> None:
    """Window 4096, caps 50 and 30, local RoPE base = the model's: leaving the keys out or spelling the
    defaults gives the same graph."""
    from graphir.graph.forms import to_text

    defaults = {K.Attention.SLIDING_WINDOW: 4096, K.LLM.ATTN_LOGIT_SOFTCAPPING: 50.0,
                K.LLM.FINAL_LOGIT_SOFTCAPPING: 30.0, K.Rope.FREQ_BASE_SWA: 10000.0}
    keys = {k: v for k, v in MODELS["gemma2"].keys.items() if k not in defaults}
    texts = [to_text(from_preset("tiny", Preset("gemma2", md, tied=True)).build_graph("iswa", "decode"))
             for md in ({**keys, **defaults}, keys)]
    assert texts[0] == texts[1]
    assert "n_swa=4096" in texts[0] and "attn_softcap=50.0" in texts[0] and "rope_freq_base_swa=10000.0" in texts[0]


# ---- graphs of the presets ----------------------------------------------------------------------------------

# preset -> (window, local layers among the first six, query scale, local rope (base, scale), global rope,
#            score cap, logit cap)
PRESET_FACTS = {
    "Gemma-2-2B": (4096, (0, 2, 4), 1 / 16, (1e4, 1.0), (1e4, 1.0), 50.0, 30.0),
    "Gemma-2-27B": (4096, (0, 2, 4), 1 / 12, (1e4, 1.0), (1e4, 1.0), 50.0, 30.0),  # 1/sqrt(4608 / 32)
    "Gemma-3-1B": (512, (0, 1, 2, 3, 4), 1 / 16, (1e4, 1.0), (1e6, 1.0), 0.0, 0.0),
    "Gemma-3-27B": (1024, (0, 1, 2, 3, 4), 168 ** -0.5, (1e4, 1.0), (1e6, 0.125), 0.0, 0.0),  # 1/sqrt(5376 / 32)
    "Gemma-3-270M": (512, (0, 1, 2, 3, 4), 1 / 16, (1e4, 1.0), (1e6, 1.0), 0.0, 0.0),
}


@pytest.mark.parametrize("preset", sorted(PRESET_FACTS))
def test_each_preset_builds_an_iswa_graph_with_distinct_caches_for_local_and_global_layers(preset: str) -> None:
    window, local, q_scale, local_rope, global_rope, score_cap, logit_cap = PRESET_FACTS[preset]
    meta = open_model(preset)
    assert meta.arch.contexts[0] == "iswa"
    g = meta.build_graph("iswa", "decode")
    names = {n.name for n in g.nodes}
    assert g["kq_mask"].attrs == {"role": "kq_mask", "causal": True, "pad": 256}
    assert g["kq_mask_swa"].attrs == {"role": "kq_mask_swa", "causal": True, "window": window, "swa": "standard",
                                      "pad": 256}
    assert tuple(il for il in range(6) if meta.arch.hp.is_swa(il)) == local
    for il in range(6):
        tail = "_swa" if il in local else ""
        assert g[f"blk.{il}.cache_k"].type_str.endswith(f", n_ctx{tail}]")
        assert g[f"blk.{il}.kq_soft_max"].inputs[1].name == f"kq_mask{tail}"
        assert g[f"blk.{il}.cache_k.write"].inputs[2].name == f"k_idxs{tail}"
        rope = g[f"blk.{il}.Kcur.rope"].attrs
        assert (rope["freq_base"], rope["freq_scale"]) == (local_rope if il in local else global_rope)
        assert rope["mode"] == "neox"
        assert g[f"blk.{il}.Qcur.scaled"].attrs["s"] == f32(q_scale)
        assert g[f"blk.{il}.kq_soft_max"].attrs["scale"] == 1.0
        assert (f"blk.{il}.kq.softcap" in names) == bool(score_cap)
    assert g["inp_scaled"].attrs["s"] == f32(meta.arch.hp.n_embd ** 0.5)
    logits = g.outputs["logits"]
    assert (logits.op == "scale" and logits.attrs["s"] == logit_cap) if logit_cap else logits.op == "mul_mat"
    assert logits.name == "result_output"


def test_gemma3_without_a_window_gets_one_kv_cache_and_the_models_rope_everywhere() -> None:
    meta = from_preset("tiny", MODELS["gemma3-global"])
    assert meta.arch.contexts[0] == "kv" and meta.arch.hp.n_swa == 0
    g = meta.build_graph("kv", "decode")
    assert all(n.name != "kq_mask_swa" for n in g.nodes)
    assert {(n.attrs["freq_base"], n.attrs["freq_scale"]) for n in g.nodes if n.op == "rope"} == {(1e6, 0.125)}


def test_gemma2_reads_its_lm_head_from_token_embd_and_has_no_output_weight() -> None:
    meta = from_preset("Gemma-2-2B-untied", Preset("gemma2", dict(MODELS["gemma2"].keys), tied=False))
    assert "output.weight" not in meta.tensors
    g = meta.build_graph("iswa", "decode")
    assert g["result_output.raw"].inputs[0].name == "token_embd.weight"


def test_the_27b_query_scale_of_a_width_below_its_head_count_is_a_metadata_error() -> None:
    """Gemma-2 27B scales queries by 1/sqrt(n_embd / n_head); a header with fewer channels than heads (a
    damaged file) would divide by zero: it is refused naming both keys."""
    keys = {**make_tiny_preset("gemma2").keys, gguf.Keys.LLM.BLOCK_COUNT: 46, gguf.Keys.LLM.EMBEDDING_LENGTH: 2,
            gguf.Keys.Attention.HEAD_COUNT: 4, gguf.Keys.Attention.HEAD_COUNT_KV: 4, gguf.Keys.Attention.KEY_LENGTH: 8,
            gguf.Keys.Attention.VALUE_LENGTH: 8}  # heads of their own size: the width need not divide
    with pytest.raises(MetadataError, match=r"^gemma2 with 46 layers scales queries by 1/sqrt\(embedding_length / "
                                            r"head_count\), but embedding_length 2 < head_count 4$"):
        from_preset("narrow", Preset("gemma2", keys, tied=True)).build_graph()
