"""GPT-2 and Phi-3 (Phi-3.5, Phi-4-mini), as specifications.

Models are tiny random GGUFs (conftest.write_model_gguf: 2 layers, n_embd 64, 4 heads over 2 KV heads, 256
tokens), written once per module; llama.cpp (llama-cpp-python) is the oracle, driven through test_families'
LlamaCpp. The tiny Phi-3 models carry everything the real ones do: a fused attn_qkv, LongRoPE factors (original
context 256 of 1024) with an attention factor, and a sliding window smaller than the prompt, which llama.cpp
ignores (so must graphir); "phi3-partial" rotates 8 of its 16 head values and ties its LM head, as Phi-4-mini.

Bounds: prompt logits within 1e-3 of llama.cpp's with F32 weights and an F32 KV cache on both sides, the prompt
(40 tokens) cut into ubatches of 16; 16 greedy tokens identical for F32, F16 and Q8_0 weights; one batch vs one
token per decode vs ubatches of 5 within 1e-4 (f32 cache: only the order of float sums may differ).
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any, Callable

import gguf
import numpy as np
import pytest
from conftest import TinyModels, make_tiny_preset, write_model_gguf
from test_families import LlamaCpp, graphir_greedy, llama_cpp_greedy

from graphir.cli import main
from graphir.errors import GraphirError
from graphir.files.gguf_file import strip
from graphir.graph.forms import to_text
from graphir.model.meta import open_model
from graphir.model.presets import Preset
from graphir.batch import Batch
from graphir.running.runtime import Model

Q = gguf.GGMLQuantizationType
K, A, R = gguf.Keys.LLM, gguf.Keys.Attention, gguf.Keys.Rope
oracle = pytest.mark.oracle

PROMPT = np.random.default_rng(7).integers(0, 256, 40).tolist()
N_UBATCH = 16
ORIG_CTX = 256  # the tiny Phi-3 models' original context: contexts beyond it use the long factors

_FUSED = r"blk\.\d+\.attn_qkv\.weight"
_FACTORS = r"rope_factors_(long|short)\.weight"


def _phi3(include: str = _FUSED, tied: bool = False, **keys: object) -> Preset:
    base = make_tiny_preset("phi3", tied=tied, **{
        K.CONTEXT_LENGTH: 1024, R.SCALING_ORIG_CTX_LEN: ORIG_CTX, R.SCALING_ATTN_FACTOR: 1.19,
        A.SLIDING_WINDOW: 16, **keys})
    return dataclasses.replace(base, include=f"{include}|{_FACTORS}")


MODELS: dict[str, Preset] = {
    "gpt2": make_tiny_preset("gpt2", tied=False, **{A.LAYERNORM_EPS: 1e-5}),
    "gpt2-tied": make_tiny_preset("gpt2", **{A.LAYERNORM_EPS: 1e-5}),  # as GPT-2 itself (greedy: one token forever)
    "phi3": _phi3(),
    "phi3-partial": _phi3(tied=True, **{R.DIMENSION_COUNT: 8}),
    # what llama.cpp also reads, though the converter does not write it: separate q/k/v (with biases), and a
    # fused weight with separate biases (llama.cpp joins them)
    "phi3-split": _phi3(include=r"blk\.\d+\.attn_[qkv]\.(weight|bias)"),
    "phi3-fused-split-bias": _phi3(include=_FUSED + r"|blk\.\d+\.attn_[qkv]\.bias"),
}
MAIN = pytest.mark.parametrize("name", ["gpt2", "phi3", "phi3-partial"])


@pytest.fixture(scope="module")
def tinies(tmp_path_factory: pytest.TempPathFactory) -> TinyModels:
    return TinyModels(tmp_path_factory.mktemp("gpt2-phi3"), MODELS)


@pytest.fixture(scope="module")
def gguf_file(tinies: TinyModels) -> Callable[..., Path]:
    """``gguf_file(name, dtype=F32)``: the tiny model's GGUF, written once per module."""
    return tinies.path


@pytest.fixture(scope="module")
def tiny(tinies: TinyModels) -> Callable[..., Model]:
    """``tiny(name, dtype=F32)``: the loaded tiny model, shared by the module's tests."""
    return tinies.model


class LlamaCppF32(LlamaCpp):
    """test_families.LlamaCpp with an F32 KV cache (llama.cpp's default is F16), as graphir's type_k/type_v f32."""

    def __init__(self, path: Path, **kw: Any):
        os.environ.setdefault("GGML_NO_BACKTRACE", "1")
        import llama_cpp

        default = llama_cpp.llama_context_default_params

        def params() -> Any:
            p = default()
            p.type_k = p.type_v = llama_cpp.GGML_TYPE_F32
            return p

        llama_cpp.llama_context_default_params = params
        try:
            super().__init__(path, **kw)
        finally:
            llama_cpp.llama_context_default_params = default


def llama_cpp_prompt_logits(path: Path, n_ctx: int, tokens: list[int] = PROMPT) -> np.ndarray:
    ref = LlamaCppF32(path, n_ctx=n_ctx, n_ubatch=N_UBATCH)
    try:
        ref.decode(tokens, range(len(tokens)), [0] * len(tokens))
        return np.array([ref.logits_ith(i) for i in range(len(tokens))])
    finally:
        ref.close()


def graphir_prompt_logits(model: Model, n_ctx: int, n_ubatch: int = N_UBATCH) -> np.ndarray:
    ctx = model.new_context(n_ctx=n_ctx, n_ubatch=n_ubatch, type_k="f32", type_v="f32")
    ctx.decode(Batch.from_tokens(PROMPT, 0, outputs="all"))
    return ctx.logits().copy()


# ---- against llama.cpp ----------------------------------------------------------------------------------------


@oracle
@pytest.mark.parametrize("name", list(MODELS))
def test_prompt_logits_match_llama_cpp_at_every_position(gguf_file: Callable[..., Path], tiny: Callable[..., Model],
                                                          name: str) -> None:
    """40 tokens in ubatches of 16, every position an output, F32 weights and cache on both sides. The Phi-3
    models' sliding window (16) is shorter than the prompt: llama.cpp turns it off, and the logits agree only
    if graphir does too."""
    ref = llama_cpp_prompt_logits(gguf_file(name), ORIG_CTX)
    got = graphir_prompt_logits(tiny(name), ORIG_CTX)
    assert ref.std() > 0.5  # spread logits: a wrong position or mask would move them
    worst = float(np.abs(got - ref).max())
    print(f"{name}: prompt logits max |d| {worst:.3g}")
    assert worst <= 1e-3


@oracle
@MAIN
@pytest.mark.parametrize("dtype", [Q.F32, Q.F16, Q.Q8_0], ids=["F32", "F16", "Q8_0"])
def test_greedy_continuation_is_llama_cpps_token_for_token(gguf_file: Callable[..., Path],
                                                           tiny: Callable[..., Model], name: str, dtype: Q) -> None:
    ours = graphir_greedy(tiny(name, dtype), PROMPT[:12], 16)
    assert ours == llama_cpp_greedy(gguf_file(name, dtype), PROMPT[:12], 16)
    assert len(set(ours)) > 1  # not a degenerate repetition


@oracle
@pytest.mark.parametrize("name", ["phi3", "phi3-partial"])
@pytest.mark.parametrize("n_ctx,factors", [(ORIG_CTX, "short"), (2 * ORIG_CTX, "long")])
def test_phi3_picks_the_long_rope_factors_beyond_the_original_context_as_llama_cpp_does(
        gguf_file: Callable[..., Path], tiny: Callable[..., Model], name: str, n_ctx: int, factors: str) -> None:
    """The context size chooses the factors (llama.cpp's get_rope_factors: long iff n_ctx_seq > the original
    context): the graph names the chosen vector, and the logits are llama.cpp's for the same n_ctx, and differ
    from those of the other choice."""
    model = tiny(name)
    other = "long" if factors == "short" else "short"
    text = to_text(open_model(str(gguf_file(name))).build_graph("kv", "prefill", n_ctx_seq=n_ctx))
    assert f"rope_factors_{factors}.weight" in text and f"rope_factors_{other}.weight" not in text
    assert model.arch.variant(n_ctx) == (factors == "long")
    got = graphir_prompt_logits(model, n_ctx)
    ref = llama_cpp_prompt_logits(gguf_file(name), n_ctx)
    worst = float(np.abs(got - ref).max())
    print(f"{name} n_ctx={n_ctx} ({factors}): prompt logits max |d| {worst:.3g}")
    assert worst <= 1e-3
    flipped = graphir_prompt_logits(model, 2 * ORIG_CTX if factors == "short" else ORIG_CTX)
    assert np.abs(flipped - got).max() > 0.05  # the choice matters: the test would see a wrong one


@oracle
def test_a_shifted_gpt2_cache_gives_llama_cpps_logits(gguf_file: Callable[..., Path], tiny: Callable[..., Model]) -> None:
    """seq_rm of the first 5 positions, seq_add -5 on the rest, one more token: nothing to re-rope in GPT-2."""
    import llama_cpp

    ref = LlamaCppF32(gguf_file("gpt2"), n_ctx=ORIG_CTX)
    try:
        ref.decode(PROMPT[:20], range(20), [0] * 20)
        mem = llama_cpp.llama_get_memory(ref.ctx.ctx)
        assert llama_cpp.llama_memory_seq_rm(mem, 0, 0, 5)
        llama_cpp.llama_memory_seq_add(mem, 0, 5, -1, -5)
        ref.decode([7], [15], [0])
        want = ref.logits_ith(0)
    finally:
        ref.close()
    ctx = tiny("gpt2").new_context(n_ctx=ORIG_CTX, type_k="f32", type_v="f32")
    ctx.decode(Batch.from_tokens(PROMPT[:20], 0))
    assert ctx.memory.seq_rm(0, 0, 5)
    ctx.memory.seq_add(0, 5, -1, -5)
    ctx.decode(Batch.one(7, 15))
    assert np.abs(ctx.logits_ith(-1) - want).max() <= 1e-3


def test_a_shifted_phi3_cache_equals_one_decoded_at_the_new_positions(tiny: Callable[..., Model]) -> None:
    """The K-shift is a pure rotation: the LongRoPE magnitude (rope.scaling.attn_factor, 1.19 here) the forward
    rope gave K is not applied a second time. llama.cpp's shift applies it again (its logits then differ by
    0.74 on this model; by 1e-6 with an attn_factor of 1): a deliberate difference, README Memory API."""
    m = tiny("phi3")
    ctx = m.new_context(n_ctx=ORIG_CTX, type_k="f32", type_v="f32")
    ctx.decode(Batch.from_tokens(PROMPT[:12], 0))
    ctx.memory.seq_add(0, 0, -1, 7)
    ctx.decode(Batch.one(PROMPT[12], 19))
    fresh = m.new_context(n_ctx=ORIG_CTX, type_k="f32", type_v="f32")
    fresh.decode(Batch.from_tokens(PROMPT[:13], 7))
    assert np.abs(ctx.logits_ith(-1) - fresh.logits_ith(-1)).max() <= 2e-5


# ---- graphir alone ------------------------------------------------------------------------------------------


@MAIN
def test_logits_do_not_depend_on_how_the_prompt_is_cut_into_ubatches(tiny: Callable[..., Model], name: str) -> None:
    """One batch = one token per decode = ubatches of 5, with an f32 cache: within 1e-4 (the F32 matmuls may sum
    in another order for another batch shape). GPT-2 within 5e-4: its GELU reads ggml's fp16 table, where a
    one-ulp change of the input can pick the neighbouring entry; llama.cpp's own logits of this model move by
    2.1e-4 between one batch and one token per decode (measured)."""
    bound = 5e-4 if name.startswith("gpt2") else 1e-4
    model = tiny(name)
    whole = graphir_prompt_logits(model, ORIG_CTX, n_ubatch=512)
    assert np.abs(graphir_prompt_logits(model, ORIG_CTX, n_ubatch=5) - whole).max() <= bound
    step = model.new_context(n_ctx=ORIG_CTX, type_k="f32", type_v="f32")
    rows = []
    for p, t in enumerate(PROMPT):
        step.decode(Batch.one(t, p))
        rows.append(step.logits_ith(-1).copy())
    assert np.abs(np.array(rows) - whole).max() <= bound


def test_gpt2_refuses_a_context_beyond_its_position_table(tiny: Callable[..., Model]) -> None:
    model = tiny("gpt2-tied")
    n_train = model.hparams.n_ctx_train
    with pytest.raises(GraphirError, match=f"n_ctx={n_train + 1} exceeds the {n_train} positions"):
        model.new_context(n_ctx=n_train + 1)
    ctx = model.new_context(n_ctx=n_train)  # the whole table fits
    ctx.decode(Batch.from_tokens((PROMPT * 7)[:n_train], 0))
    assert np.isfinite(ctx.logits_ith(-1)).all()


def test_phi3_reads_its_sliding_window_and_slides_nowhere(tiny: Callable[..., Model]) -> None:
    """As llama.cpp (it warns "Phi SWA is currently disabled"): one full-context KV cache for every layer."""
    model = tiny("phi3")
    assert model.hparams.n_swa == 0 and not any(model.hparams.is_swa(il) for il in range(model.hparams.n_layer))
    assert model.arch.contexts[0] == "kv"


def test_phi3_without_any_qkv_projection_is_reported(tmp_path: Path) -> None:
    path = write_model_gguf(tmp_path / "no-qkv.gguf", MODELS["phi3"], drop=("blk.1.attn_qkv.weight",))
    assert main(["check", str(path)]) == 1
    with pytest.raises(GraphirError, match="missing tensor .blk.1.attn_qkv.weight. \\(or .blk.1.attn_q.weight. "):
        open_model(str(path)).build_graph("kv", "decode")


@oracle
def test_phi3_has_no_output_bias_and_a_file_with_one_is_refused_as_llama_cpp_refuses_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """llama.cpp's phi3 graph would add an output bias, but its loader never creates one: a file that has one
    holds a tensor too many and does not load. graphir check names it."""
    from gguf import MODEL_TENSOR

    from graphir.arch import get
    from graphir.model.tensors import spec

    cls = get("phi3")
    declared = cls.tensors
    monkeypatch.setattr(cls, "tensors", lambda self: declared(self) + [
        spec(MODEL_TENSOR.OUTPUT, (self.hp.n_vocab,), suffix="bias", kind="vector")])
    path = write_model_gguf(tmp_path / "output-bias.gguf", MODELS["phi3"])
    monkeypatch.undo()
    with pytest.raises(ValueError, match="Failed to load model"):
        LlamaCppF32(path, n_ctx=ORIG_CTX)
    assert main(["check", str(path)]) == 1
    assert "unexpected tensor 'output.bias'" in capsys.readouterr().out


@pytest.mark.parametrize("preset", ["GPT-2", "Phi-3-mini-4k", "Phi-3.5-mini", "Phi-4-mini"])
def test_each_new_preset_builds_its_decode_graph(preset: str) -> None:
    meta = open_model(preset)
    g = meta.build_graph("kv", "decode")
    text, hp = to_text(g), meta.arch.hp
    if preset == "GPT-2":
        assert "rope(" not in text and "%pos_embd = get_rows(%position_embd.weight, %pos)" in text
        assert "weight %output.weight" not in text and "weight %position_embd.weight : f32[768, 1024]" in text
        return
    ropes = [n for n in g.nodes if n.op == "rope"]
    assert len(ropes) == 2 * hp.n_layer and {(n.attrs["mode"], n.attrs["n_dims"]) for n in ropes} == {("neox", 96)}
    assert sum(n.op == "swiglu" for n in g.nodes) == hp.n_layer
    if preset == "Phi-3-mini-4k":
        assert "rope_factors" not in text
    else:  # LongRoPE: short factors up to the original 4096 positions, long beyond
        assert abs(hp.rope_attn_factor - 1.1902381) < 1e-6
        assert "rope_factors_short.weight : f32[48]" in text
        long_text = to_text(meta.build_graph("kv", "decode", n_ctx_seq=4097))
        assert "rope_factors_long.weight : f32[48]" in long_text and "rope_factors_short" not in long_text
    assert ("weight %output.weight" in text) == (preset != "Phi-4-mini")  # Phi-4-mini ties its head


@pytest.mark.parametrize("name", ["gpt2-tied", "phi3", "phi3-partial"])
def test_graphir_dump_of_a_gguf_equals_the_dump_of_its_header_only_strip(
        gguf_file: Callable[..., Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str) -> None:
    full = gguf_file(name)
    header = strip(full, tmp_path / "header.gguf")
    assert header.header_only and header.file_size < full.stat().st_size // 10
    outs = []
    for path in (full, header.path):
        assert main(["dump", str(path), "--context", "kv", "--phase", "decode"]) == 0
        outs.append(capsys.readouterr().out)
    assert outs[0] == outs[1] and f"arch {name.split('-')[0]}" in outs[0]
