"""T5 (t5, t5encoder): an encoder context and a decoder context composed, as specifications.

Models are tiny random GGUFs (2 layers, n_embd 64, 4 heads of 16, 32 relative buckets) in both FFN variants:
ReLU (T5) and GELU-gated (T5 v1.1 / FLAN-T5); the t5encoder file holds the very same encoder tensors (weights
are seeded by tensor name). llama.cpp is the oracle through its C API: ``llama_encode`` for the encoder
output (its ``llama_decode`` on a t5encoder runs the encoder causally, so it is not the reference), then
``llama_decode`` from the decoder start token. Encoder output and logits equal llama.cpp's bit for bit where
graphir runs the oracle's own path (conftest.oracle_is_exact: F32 and F16 weights, f16 KV cache, no flash attention),
else within 1e-3; greedy tokens identical. Sources are 70 tokens long, so key-query distances reach the
log-spaced buckets and their edges at 16, 32 and 64, and the dot products over them have vec_dot's tails.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import gguf
import numpy as np
import pytest
from conftest import TINY_FAMILY, TinyModels, fail_on_run, make_tiny_preset, memory_bytes, oracle_is_exact
from test_families import LlamaCpp

from graphir.cli import main
from graphir.errors import BatchError, GraphirError, StateError
from graphir.memory.layers import Attention
from graphir.model.presets import Preset
from graphir.batch import Batch
from graphir.running.encdec import EncoderDecoderContext

K = gguf.Keys
oracle = pytest.mark.oracle
START = TINY_FAMILY["t5"][K.LLM.DECODER_START_TOKEN_ID]  # decoder_start_token_id of the tiny models
GATES = r"(enc|dec)\.blk\.\d+\.ffn_gate\.weight"
# The scales llama.cpp's loader takes beside the decoder's projections, under the names of their roles (blk.<il>)
SCALES = r"blk\.\d+\.(attn_(q|k|v|output)|ffn_(gate|up|down))\.(scale|input_scale)"


def _preset(arch: str, include: str) -> Preset:
    p = make_tiny_preset(arch, tied=False)
    return Preset(arch, p.keys, tied=False, matrix_type=gguf.GGMLQuantizationType.F32, include=include)


PRESETS = {"t5-relu": _preset("t5", ""), "t5-gated": _preset("t5", GATES), "t5-scaled": _preset("t5", f"{GATES}|{SCALES}"),
           "t5encoder-relu": _preset("t5encoder", "")}
F16 = gguf.GGMLQuantizationType.F16
VARIANTS = pytest.mark.parametrize("name,dtype", [("t5-relu", None), ("t5-gated", None), ("t5-gated", F16),
                                                  ("t5-scaled", None)],
                                   ids=["relu", "gated", "gated-f16", "scaled"])

_rng = np.random.default_rng(5)
SOURCE = _rng.integers(4, 256, 70).tolist()
SOURCES = [_rng.integers(4, 256, n).tolist() for n in (9, 23)]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> TinyModels:
    return TinyModels(tmp_path_factory.mktemp("t5"), PRESETS)


@pytest.fixture(scope="module")
def llama(tiny: TinyModels) -> Callable[..., LlamaCpp]:
    """``llama(name, n_seq_max=1, dtype=None)``: llama.cpp on the tiny file (F32 matrices unless ``dtype``), one
    context per call (closed at the end)."""
    made: list[LlamaCpp] = []

    def get(name: str, n_seq_max: int = 1, dtype: Any = None) -> LlamaCpp:
        path = tiny.path(name) if dtype is None else tiny.path(name, dtype)
        made.append(LlamaCpp(path, n_ctx=128, n_seq_max=n_seq_max, pooling="none"))
        return made[-1]

    yield get  # type: ignore[misc]
    for o in made:
        o.close()


def encode(ctx: Any, *sources: list[int], seqs: tuple[int, ...] | None = None) -> None:
    """Encode each source as its own sequence (0, 1, ... unless ``seqs``), all in one batch."""
    seqs = seqs or tuple(range(len(sources)))
    tokens = [t for src in sources for t in src]
    pos = [p for src in sources for p in range(len(src))]
    ids = [(s,) for s, src in zip(seqs, sources) for _ in src]
    ctx.encode(Batch(np.array(tokens), np.array(pos), ids, np.ones(len(tokens), bool)))


def assert_llama(ours: np.ndarray, ref: np.ndarray, what: str) -> None:
    """Bit-equal on the oracle's own path, else within the 1e-3 a float32 reference allows."""
    if oracle_is_exact():
        assert np.array_equal(ours, ref), f"{what}: max |d| {np.abs(ours - ref).max():.3g}"
    else:
        assert np.abs(ours - ref).max() <= 1e-3, what


def oracle_encode(o: LlamaCpp, *sources: list[int]) -> np.ndarray:
    tokens = [t for src in sources for t in src]
    o.encode(tokens, [p for src in sources for p in range(len(src))], [s for s, src in enumerate(sources) for _ in src])
    return np.stack([o.embeddings_ith(i) for i in range(len(tokens))])


# ---- the relative position buckets ----------------------------------------------------------------------


def test_relative_buckets_are_t5s() -> None:
    """32 buckets, max distance 128 (values worked out by hand from T5's formula): an encoder has 16 buckets per
    direction, exact below 8, log-spaced up to 128, keys after the query in the upper half; a decoder has 32,
    exact below 16. The encoder's edges at 16, 32 and 64 fall exactly on bucket boundaries (10, 12, 14), where
    float rounding decides."""
    enc, dec = Attention(8, 8, causal=False, rel_buckets=32), Attention(8, 8, rel_buckets=32)
    before = np.array([0, 1, 7, 8, 15, 16, 31, 32, 63, 64, 127, 128, 1000])  # query minus key
    assert enc.buckets(before, 0).tolist() == [0, 1, 7, 8, 9, 10, 11, 12, 13, 14, 15, 15, 15]
    assert enc.buckets(0, before).tolist() == [0, 17, 23, 24, 25, 26, 27, 28, 29, 30, 31, 31, 31]
    assert dec.buckets(before, 0).tolist() == [0, 1, 7, 8, 15, 16, 21, 21, 26, 26, 31, 31, 31]
    assert dec.buckets(0, before).tolist() == [0] * len(before)  # keys after the query: masked anyway


# ---- conformance ---------------------------------------------------------------------------------------


def test_the_decoders_projection_scales_apply_to_its_self_attention_alone(tiny: TinyModels) -> None:
    """As llama.cpp's graph reads them: Q, K, V and the output of the decoder's self-attention; not its FFN's, not
    the cross-attention's, not the encoder's (which has no scales), and no input scale."""
    meta = tiny.model("t5-scaled").meta
    dec, enc = meta.build_graph(None, "decode"), meta.build_graph(None, "encode")
    scaled = {n.inputs[1].name for n in dec.nodes if n.name.endswith(".s")}
    assert scaled == {f"blk.{il}.attn_{t}.scale" for il in (0, 1) for t in ("q", "k", "v", "output")}
    assert not any(n.name.endswith(".s") for n in enc.nodes)


@oracle
@VARIANTS
def test_encoder_output_is_llama_encode(tiny: TinyModels, llama: Callable[..., LlamaCpp], name: str,
                                        dtype: Any) -> None:
    ctx = (tiny.model(name) if dtype is None else tiny.model(name, dtype)).new_context(n_ctx=128)
    encode(ctx, SOURCE)
    assert_llama(ctx.encoder_embeddings(), oracle_encode(llama(name, dtype=dtype), SOURCE), "encoder output")


@oracle
@VARIANTS
def test_decoder_logits_and_greedy_tokens_are_llama_cpps(tiny: TinyModels, llama: Callable[..., LlamaCpp],
                                                          name: str, dtype: Any) -> None:
    model = tiny.model(name) if dtype is None else tiny.model(name, dtype)
    ctx, o = model.new_context(n_ctx=128), llama(name, dtype=dtype)
    encode(ctx, SOURCE)
    oracle_encode(o, SOURCE)
    ours, theirs, tok = [], [], START
    for p in range(24):
        ctx.decode(Batch.one(tok, p))
        o.decode([tok], [p], [0])
        a, b = ctx.logits_ith(-1), o.logits_ith(0)
        assert_llama(a, b, f"step {p}")
        ours.append(int(np.argmax(a)))
        theirs.append(int(np.argmax(b)))
        tok = theirs[-1]
    assert ours == theirs


@oracle
def test_a_prompt_decoded_at_once_is_llama_cpps(tiny: TinyModels, llama: Callable[..., LlamaCpp]) -> None:
    """A decoder prefill of several tokens (the KV cache's relative buckets between cells and queries)."""
    ctx, o = tiny.model("t5-relu").new_context(n_ctx=128), llama("t5-relu")
    encode(ctx, SOURCE)
    oracle_encode(o, SOURCE)
    prefix = [START] + SOURCE[:20]
    ctx.decode(Batch.from_tokens(prefix, 0, outputs="all"))
    o.decode(prefix, list(range(len(prefix))), [0] * len(prefix))
    assert_llama(ctx.logits(), np.stack([o.logits_ith(i) for i in range(len(prefix))]), "prefill logits")


@oracle
def test_two_sequences_encoded_and_decoded_together(tiny: TinyModels, llama: Callable[..., LlamaCpp]) -> None:
    """One encode of two sources (seq 0 and 1) and one decode batch of both: each sequence attends to its own
    source only, as in llama.cpp (unified KV, n_seq_max 2)."""
    ctx, o = tiny.model("t5-gated").new_context(n_ctx=128, n_seq_max=2), llama("t5-gated", n_seq_max=2)
    encode(ctx, *SOURCES)
    assert_llama(ctx.encoder_embeddings(), oracle_encode(o, *SOURCES), "encoder output")
    tokens, pos, seqs = [START, START, 11, 12], [0, 0, 1, 1], [0, 1, 0, 1]
    ctx.decode(Batch(np.array(tokens), np.array(pos), [(s,) for s in seqs], np.ones(4, bool)))
    o.decode(tokens, pos, seqs)
    assert_llama(ctx.logits(), np.stack([o.logits_ith(i) for i in range(4)]), "logits")


def test_sequences_encoded_apart_keep_their_own_output(tiny: TinyModels) -> None:
    """Encoding seq 1 later replaces seq 1's output only: seq 0 decodes as if both had been encoded together
    (float rounding aside: the encoder outputs are laid out in another order)."""
    model = tiny.model("t5-relu")
    together, apart = model.new_context(n_ctx=128, n_seq_max=2), model.new_context(n_ctx=128, n_seq_max=2)
    encode(together, *SOURCES)
    encode(apart, SOURCES[1], seqs=(1,))
    encode(apart, SOURCES[0], seqs=(0,))
    encode(apart, SOURCES[1][::-1], seqs=(1,))  # seq 1 again, with another source: seq 0 keeps its own
    for ctx in (together, apart):
        ctx.decode(Batch.from_tokens([START, 5, 6], 0, outputs="all"))
    assert np.abs(together.logits() - apart.logits()).max() <= 1e-5


# ---- composition: the encoder alone ----------------------------------------------------------------------


def test_encoder_context_is_the_encoder_half_bit_for_bit(tiny: TinyModels) -> None:
    model = tiny.model("t5-gated")
    full, alone = model.new_context(n_ctx=128), model.new_context(kind="encoder", n_ctx=128)
    assert isinstance(full, EncoderDecoderContext) and alone.kind == "encoder"
    encode(full, SOURCE)
    alone.decode(Batch.from_tokens(SOURCE, 0, outputs="all"))
    assert np.array_equal(alone.embeddings(), full.encoder_embeddings())


@oracle
def test_t5encoder_file_loads_as_the_encoder(tiny: TinyModels, llama: Callable[..., LlamaCpp]) -> None:
    """A t5encoder GGUF (encoder tensors only) runs as the t5 model's encoder: same numbers, bit for bit, and
    llama.cpp's llama_encode on the t5encoder file."""
    enc = tiny.model("t5encoder-relu").new_context(n_ctx=128)
    enc.decode(Batch.from_tokens(SOURCE, 0, outputs="all"))
    half = tiny.model("t5-relu").new_context(kind="encoder", n_ctx=128)
    half.decode(Batch.from_tokens(SOURCE, 0, outputs="all"))
    assert np.array_equal(enc.embeddings(), half.embeddings())
    assert_llama(enc.embeddings(), oracle_encode(llama("t5encoder-relu"), SOURCE), "t5encoder output")


def test_an_encoder_context_needs_an_encoder(tiny: TinyModels, tmp_path: Path) -> None:
    from conftest import write_model_gguf
    from graphir.running.runtime import load

    llama_model = load(str(write_model_gguf(tmp_path / "l.gguf", make_tiny_preset("llama"))))
    with pytest.raises(GraphirError, match="'llama' model has no encoder"):
        llama_model.new_context(kind="encoder")
    with pytest.raises(GraphirError, match="'t5' model runs with context encoder-decoder or encoder or cross, not 'kv'"):
        tiny.model("t5-relu").new_context(kind="kv")


def test_what_llama_cpp_requires_is_required(tmp_path: Path) -> None:
    """The bucket count is a required key; layer 0's relative-bias table is required (llama.cpp loads it as
    optional but cannot build a graph without it), the other layers' fall back to it; a decoder start token
    left out means none."""
    from conftest import write_model_gguf
    from graphir.errors import MetadataError, TensorError
    from graphir.running.runtime import load

    p = PRESETS["t5-relu"]
    with pytest.raises(MetadataError, match=r"a\.gguf: missing key .t5\.attention\.relative_buckets_count."):
        load(str(write_model_gguf(tmp_path / "a.gguf", p, drop_md=("t5.attention.relative_buckets_count",)))).hparams
    with pytest.raises(TensorError, match="missing tensor 'dec.blk.0.attn_rel_b.weight'"):
        load(str(write_model_gguf(tmp_path / "b.gguf", p, drop=("dec.blk.0.attn_rel_b.weight",))))
    assert main(["check", str(tmp_path / "b.gguf")]) == 1
    model = load(str(write_model_gguf(tmp_path / "c.gguf", p, drop_md=("t5.decoder_start_token_id",))))
    assert model.arch.decoder_start() is None


# ---- refusals change nothing ---------------------------------------------------------------------------


def test_decoding_before_encoding_is_refused(tiny: TinyModels) -> None:
    ctx = tiny.model("t5-relu").new_context(n_ctx=128)
    before = memory_bytes(ctx)
    with pytest.raises(BatchError, match="seq 0, which has no encoder output: encode the sequence first"):
        ctx.decode(Batch.one(START, 0))
    assert memory_bytes(ctx) == before


def test_a_sequence_without_encoder_output_is_refused(tiny: TinyModels) -> None:
    ctx = tiny.model("t5-relu").new_context(n_ctx=128, n_seq_max=2)
    encode(ctx, SOURCES[0])
    ctx.decode(Batch.one(START, 0))
    before = memory_bytes(ctx)
    batch = Batch(np.array([7, START]), np.array([1, 0]), [(0,), (1,)], np.ones(2, bool))
    with pytest.raises(BatchError, match="token 1 belongs to seq 1, which has no encoder output"):
        ctx.decode(batch)
    assert memory_bytes(ctx) == before


def test_a_failed_decode_rolls_back(tiny: TinyModels, monkeypatch: pytest.MonkeyPatch) -> None:
    ctx = tiny.model("t5-relu").new_context(n_ctx=128, n_ubatch=4)
    encode(ctx, SOURCE[:4])
    ctx.decode(Batch.from_tokens([START, 5], 0))
    before = memory_bytes(ctx)
    fail_on_run(monkeypatch, ctx, 2)  # the second ubatch of the next batch fails
    with pytest.raises(RuntimeError, match="compute failed"):
        ctx.decode(Batch.from_tokens(list(range(10, 16)), 2))
    assert memory_bytes(ctx) == before


def test_a_failed_encode_keeps_the_old_output(tiny: TinyModels, monkeypatch: pytest.MonkeyPatch) -> None:
    ctx = tiny.model("t5-relu").new_context(n_ctx=128)
    encode(ctx, SOURCE[:8])
    before = memory_bytes(ctx)
    fail_on_run(monkeypatch, ctx.encoder, 1)
    with pytest.raises(RuntimeError, match="compute failed"):
        encode(ctx, SOURCE[8:20])
    assert memory_bytes(ctx) == before
    with pytest.raises(BatchError, match="exceed n_ubatch=64"):
        encode(tiny.model("t5-relu").new_context(n_ctx=128, n_ubatch=64), SOURCE)  # the encoder takes one ubatch


# ---- memory and state ------------------------------------------------------------------------------------


def test_memory_operations_on_the_encoder_output(tiny: TinyModels) -> None:
    """seq_cp gives the copy its source (beams of one source), position edits leave it, seq_keep and clear
    drop it."""
    ctx = tiny.model("t5-relu").new_context(n_ctx=128, n_seq_max=3)
    encode(ctx, SOURCES[0])
    ctx.decode(Batch.from_tokens([START, 5], 0))
    ctx.memory.seq_cp(0, 2)
    ctx.decode(Batch.one(9, 2, seq_id=0))
    ref = ctx.logits_ith(-1).copy()
    ctx.decode(Batch.one(9, 2, seq_id=2))
    assert np.abs(ctx.logits_ith(-1) - ref).max() <= 1e-6  # seq 0's last cell, masked, lengthens the attended cells
    assert ctx.memory.seq_rm(2, 1, -1)  # a position cut: the source stays
    ctx.decode(Batch.one(5, 1, seq_id=2))
    ctx.memory.seq_keep(2)
    with pytest.raises(BatchError, match="seq 0, which has no encoder output"):
        ctx.decode(Batch.one(4, 3, seq_id=0))
    ctx.memory.clear()
    with pytest.raises(BatchError, match="seq 2, which has no encoder output"):
        ctx.decode(Batch.one(START, 0, seq_id=2))


def test_a_saved_exchange_resumes_in_a_new_process(tiny: TinyModels, tmp_path: Path) -> None:
    """The state holds the decoder's cache and the encoder output: a new process loads it and decodes on
    without encoding, to the same logits."""
    path = tiny.path("t5-gated")
    ctx = tiny.model("t5-gated").new_context(n_ctx=128)
    encode(ctx, SOURCE)
    ctx.decode(Batch.from_tokens([START, 17, 18], 0))
    ctx.state_save(tmp_path / "state.bin")
    ctx.decode(Batch.one(19, 3))
    np.save(tmp_path / "expected.npy", ctx.logits_ith(-1))
    code = (f"import numpy as np, graphir\nfrom graphir.batch import Batch\n"
            f"ctx = graphir.load({str(path)!r}).new_context(n_ctx=128)\n"
            f"ctx.state_load({str(tmp_path / 'state.bin')!r})\n"
            f"ctx.decode(Batch.one(19, 3))\n"
            f"assert np.array_equal(ctx.logits_ith(-1), np.load({str(tmp_path / 'expected.npy')!r}))\n"
            f"print('resumed')\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and p.stdout.strip() == "resumed", p.stderr


def test_a_corrupt_or_foreign_state_changes_nothing(tiny: TinyModels) -> None:
    ctx = tiny.model("t5-relu").new_context(n_ctx=128)
    encode(ctx, SOURCE[:10])
    ctx.decode(Batch.from_tokens([START, 5], 0))
    data = ctx.state_save()
    other = tiny.model("t5-relu").new_context(n_ctx=128)
    encode(other, SOURCE[10:20])
    before = memory_bytes(other)
    for bad in (data[: len(data) - 9], data[:-4] + b"\xff\xff\xff\xff"):
        with pytest.raises(StateError):
            other.state_load(bad)
        assert memory_bytes(other) == before
    other.state_load(data)
    assert memory_bytes(other) == memory_bytes(ctx)


def test_one_sequence_state_carries_its_encoder_output(tiny: TinyModels) -> None:
    model = tiny.model("t5-relu")
    ctx = model.new_context(n_ctx=128, n_seq_max=2)
    encode(ctx, *SOURCES)
    ctx.decode(Batch.from_tokens([START, 8], 0, seq_id=1))
    saved = ctx.state_seq_save(1)
    ctx.decode(Batch.one(9, 2, seq_id=1))
    ref = ctx.logits_ith(-1).copy()
    fresh = model.new_context(n_ctx=128, n_seq_max=2)
    fresh.state_seq_load(saved, 0)  # seq 1's source and cache, now as seq 0
    fresh.decode(Batch.one(9, 2, seq_id=0))
    assert np.abs(fresh.logits_ith(-1) - ref).max() <= 1e-6


# ---- command line ---------------------------------------------------------------------------------------


@oracle
def test_run_encodes_the_prompt_and_generates(tiny: TinyModels, llama: Callable[..., LlamaCpp],
                                              capsys: pytest.CaptureFixture[str]) -> None:
    model = tiny.model("t5-gated")
    ids = model.tokenize("ab cd", add_special=True, parse_special=True)
    o = llama("t5-gated")
    oracle_encode(o, ids)
    tok, out = START, []
    for p in range(8):
        o.decode([tok], [p], [0])
        tok = int(np.argmax(o.logits_ith(0)))
        if model.vocab.is_eog(tok):
            break
        out.append(tok)
    assert main(["run", str(tiny.path("t5-gated")), "-p", "ab cd", "-n", "8"]) == 0
    assert capsys.readouterr().out == "ab cd" + model.detokenize(out) + "\n"  # the prompt, then its continuation


@oracle
def test_embed_prints_the_encoder_output(tiny: TinyModels, llama: Callable[..., LlamaCpp],
                                         capsys: pytest.CaptureFixture[str]) -> None:
    ids = tiny.model("t5-relu").tokenize("ab cd", add_special=True, parse_special=True)
    ref = oracle_encode(llama("t5-relu"), ids)[-1]  # no pooling: the last token's row
    assert main(["embed", str(tiny.path("t5-relu")), "-p", "ab cd"]) == 0
    printed = np.array([float(x) for x in capsys.readouterr().out.split()])
    assert np.abs(printed - ref).max() <= 1e-3


def test_the_phases_of_an_encoder_decoder(capsys: pytest.CaptureFixture[str]) -> None:
    for phase, context in (("encode", "none"), ("prefill", "cross"), ("decode", "cross")):
        assert main(["dump", "T5-small", "--phase", phase]) == 0
        head = capsys.readouterr().out.splitlines()[:4]
        assert head == ["graphir graph v1", "arch t5", f"context {context}", f"phase {phase}"]
    assert main(["dump", "Llama-3.1-8B", "--phase", "encode"]) == 2
    assert "no encoder; phase 'encode' is an encoder-decoder's" in capsys.readouterr().err
