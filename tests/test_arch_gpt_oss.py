"""gpt-oss (arch/gpt_oss.py) as specifications, against llama.cpp (llama-cpp-python).

Models are tiny random GGUFs (conftest.write_model_gguf): 4 layers (0 and 2 slide through a window of 4
positions, 1 and 3 attend to everything), 4 query and 2 KV heads of 16, 4 experts of 64 with 2 per token,
NEOX RoPE with YaRN (factor 32 from 64 positions). Two draws are pinned by the family's features, not left to
the generic random weights: the pre-FFN norm's scales are 4 to 8, so that expert gates and ups pass +-7 and the
clamped SwiGLU's clamps are hit; the attention sinks are N(0, 2), as large as the scores, so that they take a
real share of each softmax. The sinks test writes the same model with sinks of 3 to 6 and with sinks of -10^4
(none: their exp is 0), and the window test the same model with a window of 64. The window test runs 300
tokens in ubatches of 16, more than the 256 cells of the SWA cache, which then reuses cells (swa_full off, in
llama.cpp too).

Bounds: F32, F16 and Q8_0 weights, and MXFP4 experts (the converter's type for them), give llama.cpp's logits
bit for bit where graphir runs the oracle's own CPU path (conftest.oracle_is_exact; elsewhere within 1e-3),
greedy tokens identical. MXFP4 is also checked on a 256-wide model (experts of 256: eight blocks per row, where
another summation order than that of llama.cpp's repacked MXFP4 kernels shows; one measured 4.8e-7 on a
512-wide model).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable
from unittest import mock

import conftest
import gguf
import numpy as np
from gguf import MODEL_TENSOR as T
import pytest
from conftest import make_tiny_preset, oracle_is_exact, write_model_gguf
from test_families import (divergent_continuations_equal_fresh_contexts, failing_second_ubatch_changes_nothing,
                           greedy_against_llama_cpp, interleaved_against_llama_cpp)

from graphir.backends.numba.quant.blocks import e8m0_half
from graphir.backends.numba.quant.weight import SUPPORTED, QWeight
from graphir.cli import main
from graphir.errors import MetadataError
from graphir.model.meta import from_preset, open_model
from graphir.model.presets import Preset
from graphir.model.tensors import tensor_name
from graphir.batch import Batch
from graphir.running.runtime import Model, load

Q = gguf.GGMLQuantizationType
K = gguf.Keys
oracle = pytest.mark.oracle

WINDOW = 4
_rng = np.random.default_rng(41)
PROMPT = _rng.integers(0, 256, 12).tolist()  # three times the window
LONG = _rng.integers(0, 256, 300).tolist()  # more positions than the SWA cache's 256 cells
SEQS = [_rng.integers(0, 256, n).tolist() for n in (7, 3, 10)]

KEYS = {K.LLM.CONTEXT_LENGTH: 1024, K.LLM.BLOCK_COUNT: 4, K.LLM.EXPERT_COUNT: 4, K.LLM.EXPERT_USED_COUNT: 2,
        K.LLM.EXPERT_FEED_FORWARD_LENGTH: 64, K.Attention.KEY_LENGTH: 16, K.Attention.VALUE_LENGTH: 16,
        K.Attention.SLIDING_WINDOW: WINDOW, K.Rope.FREQ_BASE: 150000.0, K.Rope.SCALING_TYPE: "yarn",
        K.Rope.SCALING_FACTOR: 32.0, K.Rope.SCALING_ORIG_CTX_LEN: 64}
PRESET = make_tiny_preset("gpt-oss", tied=False, **KEYS)
PRESETS = {"base": PRESET,
           "window-64": make_tiny_preset("gpt-oss", tied=False, **{**KEYS, K.Attention.SLIDING_WINDOW: 64}),
           "wide": make_tiny_preset("gpt-oss", tied=False, **{**KEYS, K.LLM.EMBEDDING_LENGTH: 256,
                                                              K.LLM.EXPERT_FEED_FORWARD_LENGTH: 256})}

Draw = Callable[[np.random.Generator, tuple[int, ...]], np.ndarray]


def _draws(sinks: Draw) -> dict[str, Draw]:
    """Per-layer values the family's features need (see the module docstring), by tensor name."""
    out: dict[str, Draw] = {}
    for il in range(4):
        out[tensor_name(T.ATTN_POST_NORM, il)] = lambda r, shp: r.uniform(4, 8, shp)
        out[tensor_name(T.ATTN_SINKS, il)] = sinks
    return out


SINKS = {"random": lambda r, shp: r.normal(0, 2, shp), "large": lambda r, shp: r.uniform(3, 6, shp),
         "none": lambda r, shp: np.full(shp, -1e4)}


class Models:
    """The tiny GGUFs of this module, each written (per matrix type) and loaded once."""

    def __init__(self, directory: Path):
        self.dir = directory
        self._paths: dict[tuple[Any, ...], Path] = {}
        self._models: dict[tuple[Any, ...], Model] = {}

    def path(self, dtype: Q = Q.F32, experts: Q | None = None, sinks: str = "random", preset: str = "base") -> Path:
        key = (dtype, experts, sinks, preset)
        if key not in self._paths:
            name = f"gpt-oss-{preset}-{dtype.name}-{experts.name if experts else ''}-{sinks}.gguf"
            with mock.patch.dict(conftest._DENSE, {"gpt-oss": _draws(SINKS[sinks])}):
                self._paths[key] = write_model_gguf(self.dir / name, PRESETS[preset], dtype, experts=experts)
        return self._paths[key]

    def model(self, *args: Any, **kw: Any) -> Model:
        key = (*args, *sorted(kw.items()))
        if key not in self._models:
            self._models[key] = load(str(self.path(*args, **kw)))
        return self._models[key]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Models:
    return Models(tmp_path_factory.mktemp("gpt-oss"))


def max_delta(ours: np.ndarray, ref: np.ndarray) -> float:
    return float(np.abs(np.asarray(ours, np.float64) - np.asarray(ref, np.float64)).max())


def prompt_logits(model: Model, tokens: list[int], **kw: Any) -> np.ndarray:
    ctx = model.new_context(n_ctx=64, **kw)
    ctx.decode(Batch.from_tokens(tokens, 0, outputs="all"))
    return ctx.logits().copy()


def exact_or_within(bound: float) -> Callable[[np.ndarray, np.ndarray, str], None]:
    """A greedy_against_llama_cpp check: every row bit-exact where graphir runs the oracle's path, else within
    ``bound``."""
    def check(ours: np.ndarray, ref: np.ndarray, what: str) -> None:
        d = max_delta(ours, ref)
        assert d <= bound, f"{what}: max |d| {d:.3g}"
        if oracle_is_exact():
            assert np.array_equal(ours, ref), f"{what}: max |d| {d:.3g}, not bit-exact"

    return check


# ---------------------------------------------------------------------------------------------------- hparams, graphs


def test_even_layers_slide_through_the_window_and_odd_layers_see_everything(tiny: Models) -> None:
    hp = tiny.model().hparams
    assert (hp.n_swa, hp.swa_type, hp.swa_layers) == (WINDOW, "standard", (1, 0, 1, 0))
    g = tiny.model().meta.build_graph(context="iswa", phase="decode")
    masks = {n.layer: n.inputs[1].name for n in g.nodes if n.op == "soft_max" and n.name.endswith("kq_soft_max")}
    assert masks == {0: "kq_mask_swa", 1: "kq_mask", 2: "kq_mask_swa", 3: "kq_mask"}


def test_the_presets_slide_even_layers_by_128_with_yarn_32_from_4096() -> None:
    for name, n_layer, n_expert in (("gpt-oss-20b", 24, 32), ("gpt-oss-120b", 36, 128)):
        hp = open_model(name).arch.hp
        assert (hp.n_layer, hp.n_expert, hp.n_expert_used, hp.n_ff_exp) == (n_layer, n_expert, 4, 2880)
        assert hp.swa_layers == tuple(int(il % 2 == 0) for il in range(n_layer)) and hp.n_swa == 128
        assert (hp.rope_scaling, hp.rope_freq_scale, hp.n_ctx_orig_yarn) == ("yarn", 1 / 32, 4096)
        types = {t.dtype for n, t in open_model(name).tensors.items() if "_exps.weight" in n}
        assert types == {Q.MXFP4}


def test_every_layer_attends_with_sinks_and_runs_biased_clamped_experts(tiny: Models) -> None:
    g = tiny.model().meta.build_graph(phase="decode")
    soft = [n for n in g.nodes if n.name.endswith("kq_soft_max")]
    assert [n.inputs[2].name for n in soft] == [f"blk.{il}.attn_sinks.weight" for il in range(4)]
    names = {n.name: n for n in g.nodes}
    for il in range(4):
        assert names[f"blk.{il}.ffn_moe_logits_biased"].inputs[1].name == f"blk.{il}.ffn_gate_inp.bias"
        for part in ("up", "gate", "down"):
            biased = names[f"blk.{il}.ffn_moe_{part}_biased"]
            assert biased.op == "add_id" and biased.inputs[1].name == f"blk.{il}.ffn_{part}_exps.bias"
        act = names[f"blk.{il}.ffn_moe_swiglu_oai"]
        assert [x.name for x in act.inputs] == [f"blk.{il}.ffn_moe_gate_biased", f"blk.{il}.ffn_moe_up_biased"]
        assert act.attrs == {"alpha": np.float32(1.702), "limit": 7.0}
        assert names[f"blk.{il}.ffn_moe_weights_softmax"].op == "soft_max"  # softmax over the chosen logits only


def test_a_file_without_a_sliding_window_is_refused_naming_the_key(tmp_path: Path) -> None:
    keys = {k: v for k, v in PRESET.keys.items() if k != K.Attention.SLIDING_WINDOW}
    with pytest.raises(MetadataError, match=r"missing key 'gpt-oss\.attention\.sliding_window'"):
        from_preset("no-window", Preset("gpt-oss", keys, tied=False))


def test_check_accepts_mxfp4_experts_and_the_backend_multiplies_them(tiny: Models,
                                                                     capsys: pytest.CaptureFixture) -> None:
    assert Q.MXFP4 in SUPPORTED
    path = tiny.path(Q.F16, Q.MXFP4)
    assert main(["check", str(path)]) == 0
    assert capsys.readouterr().out.startswith("ok: ")
    types = {t.dtype for n, t in open_model(str(path)).tensors.items() if "_exps." in n}
    assert types == {Q.MXFP4, Q.F32}  # the stacked experts and their biases


# ---------------------------------------------------------------------------------------------------- MXFP4


def test_mxfp4_rows_are_ggufs_dequantization_bit_for_bit_subnormal_scales_included() -> None:
    rng = np.random.default_rng(5)
    w = (rng.standard_normal((24, 96)) * np.exp2(rng.integers(-140, 20, (24, 1)))).astype(np.float32)
    raw = gguf.quants.quantize(w, Q.MXFP4)
    raw.reshape(24, 3, 17)[:2, 0, 0] = (0, 1)  # the two scales ggml builds as subnormals
    q = QWeight.prepare(raw, Q.MXFP4, 96)
    assert np.array_equal(q.dequantize(), gguf.quants.dequantize(raw, Q.MXFP4))
    assert np.array_equal(q.get_rows(np.array([3, 0, 3])), gguf.quants.dequantize(raw, Q.MXFP4)[[3, 0, 3]])
    assert e8m0_half(np.array([0, 1, 2, 127, 128, 254])).tolist() == [2.0 ** -128, 2.0 ** -127, 2.0 ** -126, 0.5, 1.0,
                                                                      2.0 ** 126]


# ---------------------------------------------------------------------------------------------------- llama.cpp


@oracle
@pytest.mark.parametrize("dtype", [Q.F32, Q.F16, Q.Q8_0], ids=lambda t: t.name)
def test_prompt_logits_and_greedy_continuation_are_llama_cpps(tiny: Models, dtype: Q) -> None:
    ours, theirs = greedy_against_llama_cpp(tiny.model(dtype), tiny.path(dtype), PROMPT, 10, exact_or_within(1e-3))
    assert ours == theirs and len(set(ours)) > 1


@oracle
@pytest.mark.parametrize("dtype,preset", [(Q.F32, "base"), (Q.F16, "base"), (Q.F32, "wide")],
                         ids=["F32", "F16", "F32-wide"])
def test_mxfp4_experts_give_llama_cpps_logits_and_greedy_tokens(tiny: Models, dtype: Q, preset: str) -> None:
    model, path = tiny.model(dtype, Q.MXFP4, preset=preset), tiny.path(dtype, Q.MXFP4, preset=preset)
    assert {t.dtype for n, t in model.meta.tensors.items() if n.endswith("_exps.weight")} == {Q.MXFP4}
    ours, theirs = greedy_against_llama_cpp(model, path, PROMPT, 8, exact_or_within(1e-3))
    assert ours == theirs


@oracle
def test_each_token_takes_llama_cpps_experts_with_its_weights(tiny: Models) -> None:
    """Layer 0's routing for every prompt token (llama.cpp's ``ffn_moe_weights_softmax-0``): the same experts in
    the same order with the same weights; and it is not degenerate: tokens choose different experts."""
    from llama_taps import llama_cpp_taps

    taps: dict[str, np.ndarray] = {}
    tiny.model().new_context(n_ctx=64).decode(Batch.from_tokens(PROMPT, 0, outputs="all"), taps=taps)
    theirs = llama_cpp_taps(str(tiny.path()), PROMPT)
    ref = theirs["ffn_moe_weights_softmax-0"].reshape(len(PROMPT), 2)
    assert max_delta(taps["blk.0.ffn_moe_weights_softmax.3d"].reshape(len(PROMPT), 2), ref) <= 1e-6
    chosen = taps["blk.0.ffn_moe_topk"]
    assert len({tuple(sorted(row)) for row in chosen}) > 1, f"every token took experts {chosen[0]}"
    assert len(set(chosen.ravel())) > chosen.shape[1], f"the prompt used only experts {set(chosen.ravel())}"


@oracle
def test_the_clamped_swiglu_is_llama_cpps_where_the_clamps_bite(tiny: Models) -> None:
    """Gates above 7 and ups beyond +-7 occur in layer 0 (so a SwiGLU without the clamps, or with them on the
    wrong side, would differ), and its output is llama.cpp's ``ffn_moe_swiglu_oai-0`` bit for bit on its path."""
    from llama_taps import llama_cpp_taps

    taps: dict[str, np.ndarray] = {}
    tiny.model().new_context(n_ctx=64).decode(Batch.from_tokens(PROMPT, 0, outputs="all"), taps=taps)
    gate, up = taps["blk.0.ffn_moe_gate_biased"], taps["blk.0.ffn_moe_up_biased"]
    assert (gate > 7).mean() > 0.01 and (up > 7).mean() > 0.01 and (up < -7).mean() > 0.01
    ref = llama_cpp_taps(str(tiny.path()), PROMPT)["ffn_moe_swiglu_oai-0"].reshape(gate.shape)
    assert max_delta(taps["blk.0.ffn_moe_swiglu_oai"], ref) <= 1e-4 * np.abs(ref).max()
    if oracle_is_exact():
        assert np.array_equal(taps["blk.0.ffn_moe_swiglu_oai"], ref)


@oracle
def test_sinks_take_their_share_of_attention_as_in_llama_cpp(tiny: Models) -> None:
    """Large sinks against llama.cpp, and the same model without sinks (-10^4: exp gives 0): both graphir's
    logits are llama.cpp's, and they differ by far more than the bound, so ignoring the sinks would fail."""
    def check(ours: np.ndarray, ref: np.ndarray, what: str) -> None:
        assert max_delta(ours, ref) <= 1e-3, what

    for sinks in ("large", "none"):
        greedy_against_llama_cpp(tiny.model(sinks=sinks), tiny.path(sinks=sinks), PROMPT, 2, check)
    d = max_delta(prompt_logits(tiny.model(sinks="large"), PROMPT), prompt_logits(tiny.model(sinks="none"), PROMPT))
    assert d > 0.1, f"the sinks moved the logits by {d:.3g} only"


@oracle
def test_a_prompt_longer_than_the_swa_cache_is_llama_cpps_and_the_window_matters(tiny: Models) -> None:
    """300 tokens in ubatches of 16 through an SWA cache of llama.cpp's size (256 cells, swa_full off in both:
    cells whose tokens left every window are taken again), every position's logits against llama.cpp's; the
    same weights with a window of 64 give other logits past the first window, so the window is applied."""
    from test_arch_gemma import GemmaCpp

    ctx = tiny.model().new_context(n_ctx=512, n_batch=512, n_ubatch=16)
    ctx.decode(Batch.from_tokens(LONG, 0, outputs="all"))
    ref = GemmaCpp(tiny.path(), cache="f16", n_ctx=512, n_ubatch=16)
    try:
        ref.decode(LONG, range(len(LONG)), [0] * len(LONG))
        want = ref.logits(len(LONG))
    finally:
        ref.close()
    exact_or_within(1e-3)(ctx.logits(), want, "prompt logits")
    swa = ctx.memory.parts["swa"]
    assert swa.n_ctx == 256 < len(LONG) and (swa.pos >= 0).sum() == 256  # every cell in use, some of them twice
    wide = tiny.model(preset="window-64").new_context(n_ctx=512, n_batch=512, n_ubatch=16)
    wide.decode(Batch.from_tokens(LONG, 0, outputs="all"))
    assert np.array_equal(wide.logits()[:WINDOW], ctx.logits()[:WINDOW])  # the first window: the same model
    assert max_delta(wide.logits()[2 * WINDOW:], ctx.logits()[2 * WINDOW:]) > 0.1


@oracle
@pytest.mark.parametrize("n_ubatch", [64, 4])
def test_several_sequences_of_different_lengths_in_one_batch(tiny: Models, n_ubatch: int) -> None:
    interleaved_against_llama_cpp(tiny.model(), tiny.path(), SEQS, n_ubatch)


# ---------------------------------------------------------------------------------------------------- batching, memory


def test_logits_do_not_depend_on_how_the_prompt_is_split(tiny: Models) -> None:
    """Whole, in ubatches of 3, and one token per decode: the same logits up to float rounding (routing is per
    token). Within 5e-4, not 1e-5: F32 matmuls sum in another order for one token (vec_dot) than for a ubatch
    (tinyBLAS), in llama.cpp as here (each way is llama.cpp's bit for bit: the greedy test), and this model's
    residual stream is large (pre-FFN scales of 4 to 8). Measured 1.5e-5 on the avx512 path and 1.3e-4 on the
    avx2 one; llama.cpp's own whole prompt against one token per decode: 3.6e-5 and 1.3e-4."""
    whole = prompt_logits(tiny.model(), PROMPT)
    assert max_delta(prompt_logits(tiny.model(), PROMPT, n_ubatch=3), whole) <= 5e-4
    ctx = tiny.model().new_context(n_ctx=64)
    for p, t in enumerate(PROMPT):
        ctx.decode(Batch.one(t, p))
        assert max_delta(ctx.logits_ith(-1), whole[p]) <= 5e-4, p


def test_a_failing_second_ubatch_changes_nothing(tiny: Models, monkeypatch: pytest.MonkeyPatch) -> None:
    failing_second_ubatch_changes_nothing(tiny.model(), PROMPT, monkeypatch)


def test_divergent_continuations_equal_fresh_contexts(tiny: Models) -> None:
    divergent_continuations_equal_fresh_contexts(tiny.model(), PROMPT)
