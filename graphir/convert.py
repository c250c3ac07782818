"""Hugging Face BERT checkpoint -> GGUF that llama.cpp loads as ``bert``.

The GGUF holds what llama.cpp's ``convert_hf_to_gguf.py`` writes for a ``BertModel``, without torch or
transformers: safetensors headers are parsed and checked here and their data memory-mapped with numpy (gguf's
``LocalTensor``), names come from gguf's ``TensorNameMap``, the general keys from gguf's ``Metadata`` (model
card and config heuristics), special tokens from gguf's ``SpecialVocab``. The rules kept from the converter:

- Tensors: the position-id buffer, the pooler and the pre-training heads are dropped; a Linear's
  ``(out, in)`` weight is ggml's ``{in, out}``, so nothing is transposed. 1-D tensors (norms, biases) and the
  position and token-type tables stay f32; the other matrices take ``outtype``.
- Vocabulary (llama.cpp's WPM tokenizer marks word starts, WordPiece marks continuations): special tokens
  keep their text and are *control*; ``##x`` becomes ``x``; every other token gets a U+2581 prefix and is
  *normal* (``[UNK]`` is special, hence control, not *unknown*); added tokens that are not special are
  *user-defined*; ids the vocabulary lacks become ``[PAD<i>]`` (*unused*).
- ``pooling_type`` only when a sentence-transformers Pooling module says mean, cls or last token; a plain
  BERT gets no key (llama.cpp then returns token embeddings unless the context asks for a pooling).

Tensors are written one at a time from the mapped files, so memory holds at most one converted tensor.
Every input is a stranger's file: whatever is wrong with one (missing, cut short, not JSON or YAML, a value of
the wrong type, a safetensors header whose offsets lie) is a :class:`~graphir.errors.CheckpointError` naming
it, found before the output is opened; the output is written to a temporary file renamed into place at the end.
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import gguf
import numpy as np
import yaml
from gguf.utility import LocalTensor

from graphir.errors import CheckpointError, GraphirError, TensorError
from graphir.model import hf_config
from graphir.files.atomic import atomic_path
from graphir.files.checkpoint import clip, read_json, reason, safetensors_header
from graphir.progress import counting

__all__ = ["OUTTYPES", "CheckpointTensorError", "convert_bert"]


class CheckpointTensorError(CheckpointError, TensorError):
    """A checkpoint's tensor is missing, unexpected, or has the wrong shape or dtype: the checkpoint cannot be
    converted (a CheckpointError) because of one tensor (a TensorError)."""


_T = gguf.MODEL_TENSOR
_QT = gguf.GGMLQuantizationType
_TT = gguf.TokenType

# outtype -> (type of the weight matrices, general.file_type)
OUTTYPES: dict[str, tuple[gguf.GGMLQuantizationType, gguf.LlamaFileType]] = {
    "f32": (_QT.F32, gguf.LlamaFileType.ALL_F32),
    "f16": (_QT.F16, gguf.LlamaFileType.MOSTLY_F16),
}
_HF_ARCHITECTURES = ("BertModel", "BertForMaskedLM")
_ARCH = gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH.BERT]
# Storage of each supported safetensors dtype; BF16 is widened to f32 by shifting its bits.
_SOURCE_DTYPES = {"F32": np.dtype("<f4"), "F16": np.dtype("<f2"), "BF16": np.dtype("<u2")}
# HF tensors llama.cpp's bert never reads (after a "bert." prefix is removed).
_DROPPED = ("embeddings.position_ids", "pooler.", "cls.predictions.", "cls.seq_relationship.")
# tokenizer.ggml.<kind>_token_id keys gguf knows; it has none for cls (bos is [CLS]).
_SPECIAL_KINDS = ("bos", "eos", "unk", "sep", "pad", "mask")
_SPECIAL_FALLBACK = {"bos": "cls", "eos": "sep"}  # as gguf's SpecialVocab reads a BERT tokenizer_config.json
_SPECIAL_FILES = ("tokenizer.json", "tokenizer_config.json", "config.json")  # what gguf's SpecialVocab reads
_CARD_LISTS = ("tags", "languages", "license")  # model card values that may be lists of text
_CARD_ENTRIES = ("base_models", "datasets")  # lists of entries, each a JSON object of text
_WORD_START = "\u2581"
_PRE_TOKENIZER = "default"  # llama.cpp ignores tokenizer.ggml.pre for WPM vocabularies


@dataclass(frozen=True)
class _Config:
    n_vocab: int
    n_ctx: int
    n_embd: int
    n_ff: int
    n_layer: int
    n_head: int
    n_token_types: int
    norm_eps: float
    metadata: dict[str, Any]  # the GGUF keys the mapping gives (bert.*, and the token type count)


@dataclass(frozen=True)
class _Tensor:
    name: str  # GGUF name
    hf_name: str
    source: LocalTensor
    qtype: gguf.GGMLQuantizationType


def convert_bert(src_dir: str | os.PathLike[str], out_path: str | os.PathLike[str], outtype: str = "f16",
                 progress: IO[str] | None = None) -> Path:
    """Write ``out_path``, a GGUF of the BERT checkpoint in ``src_dir`` that llama.cpp loads; return its path.

    ``outtype`` ("f32" or "f16") is the type of the weight matrices; ``progress``: where to draw a bar of the
    tensors written (graphir.progress). Everything is checked before the file is
    written, and it appears only once complete: an interrupted or failed write leaves ``out_path`` as it was.
    Raises :class:`~graphir.errors.CheckpointError` naming the file for a missing or malformed file or a model
    that is not BERT (:class:`CheckpointTensorError`, also a :class:`~graphir.errors.TensorError`, naming the
    tensor for a missing, unexpected, wrong-shape or unsupported-dtype one), and
    :class:`~graphir.errors.GraphirError` when ``out_path`` cannot be written.

    >>> convert_bert("all-MiniLM-L6-v2", "minilm.gguf", outtype="f16")  # doctest: +SKIP
    PosixPath('minilm.gguf')
    """
    if outtype not in OUTTYPES:
        raise ValueError(f"outtype must be one of {', '.join(OUTTYPES)}, not {outtype!r}")
    src, out = Path(src_dir), Path(out_path)
    if not src.is_dir():
        raise CheckpointError(f"{src}: not a directory (expected a Hugging Face model directory)")
    if out.exists() and not out.is_file():  # a device or directory is never replaced by the renamed output
        raise GraphirError(f"{out}: cannot write (not a regular file)")
    cfg = _config(src)
    matrix_type, file_type = OUTTYPES[outtype]
    tensors = _tensors(src, cfg, matrix_type)
    special_names = _special_names(src)
    tokens, toktypes = _vocab(src, cfg.n_vocab, special_names)

    w = gguf.GGUFWriter(None, gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH.BERT])
    for t in tensors:
        dtype = np.dtype(np.float32 if t.qtype == _QT.F32 else np.float16)
        w.add_tensor_info(t.name, t.source.shape, dtype, math.prod(t.source.shape) * dtype.itemsize, raw_dtype=t.qtype)
    _add_general(w, src, cfg, file_type)
    _add_vocab(w, src, cfg, tokens, toktypes, special_names)
    _write(w, tensors, out, progress)
    return out


def _write(w: gguf.GGUFWriter, tensors: list[_Tensor], out: Path, progress: IO[str] | None) -> None:
    """The header, then the tensors one at a time, into a temporary file renamed to ``out`` once complete."""
    bar = counting(progress, len(tensors), f"writing {out.name}")
    try:
        with atomic_path(out) as tmp:
            try:
                w.write_header_to_file(tmp)
                w.write_kv_data_to_file()
                w.write_ti_data_to_file()
                for t in tensors:
                    w.write_tensor_data(_data(t))
                    bar.update(1)
            finally:
                w.close()
                bar.close()
    except OSError as e:
        raise GraphirError(f"{out}: cannot write ({e.strerror or e})") from None


# ---- config ------------------------------------------------------------------------------------------------


def _config(src: Path) -> _Config:
    """The BERT hparams the GGUF gets, mapped by graphir.model.hf_config's BertModel entry (the one mapping from
    Hugging Face configs to GGUF keys), checked to make a model whose tensors can be named."""
    path = src / hf_config.CONFIG
    cfg = hf_config.read_config(path)
    model_type, archs = cfg.get("model_type"), cfg.get("architectures") or []
    if model_type != "bert" or not isinstance(archs, list) or any(a not in _HF_ARCHITECTURES for a in archs):
        raise CheckpointError(f"{path}: not a BERT model (model_type {model_type!r}, architectures {archs!r}); "
                              f"converted: model_type 'bert' as {' or '.join(_HF_ARCHITECTURES)}")
    if not isinstance(cfg.get("_name_or_path", ""), str):  # gguf's name heuristics read it as text
        raise CheckpointError(f"{path}: _name_or_path must be text, not {cfg['_name_or_path']!r}")
    keys = hf_config.gguf_keys(path, cfg, hf_config.families()[_HF_ARCHITECTURES[0]])
    L, A = gguf.Keys.LLM, gguf.Keys.Attention
    c = _Config(n_vocab=keys[L.VOCAB_SIZE], n_ctx=keys[L.CONTEXT_LENGTH], n_embd=keys[L.EMBEDDING_LENGTH],
                n_ff=keys.get(L.FEED_FORWARD_LENGTH, 0), n_layer=keys[L.BLOCK_COUNT], n_head=keys.get(A.HEAD_COUNT, 0),
                n_token_types=keys[gguf.Keys.Tokenizer.TOKEN_TYPE_COUNT], norm_eps=keys[A.LAYERNORM_EPS],
                metadata={k.format(arch=_ARCH): v for k, v in keys.items() if k != L.VOCAB_SIZE})
    for key, v in (("intermediate_size", c.n_ff), ("num_attention_heads", c.n_head)):
        if v <= 0:
            raise CheckpointError(f"{path}: missing key '{key}'")
    if c.n_embd % c.n_head:
        raise CheckpointError(f"{path}: hidden_size {c.n_embd} is not a multiple of num_attention_heads {c.n_head}")
    return c


# ---- tensors -----------------------------------------------------------------------------------------------


def _expected_shapes(cfg: _Config) -> dict[str, tuple[int, ...]]:
    """GGUF name -> numpy shape (ggml's reversed) of every tensor llama.cpp's bert reads from a BERT checkpoint."""
    E, F = cfg.n_embd, cfg.n_ff
    shapes: dict[str, tuple[int, ...]] = {}

    def add(kind: gguf.MODEL_TENSOR, shape: tuple[int, ...], bid: int | None = None, bias: bool = True) -> None:
        base = gguf.TENSOR_NAMES[kind].format(bid=bid)
        shapes[f"{base}.weight"] = shape
        if bias:
            shapes[f"{base}.bias"] = shape[:1]

    add(_T.TOKEN_EMBD, (cfg.n_vocab, E), bias=False)
    add(_T.TOKEN_TYPES, (cfg.n_token_types, E), bias=False)
    add(_T.POS_EMBD, (cfg.n_ctx, E), bias=False)
    add(_T.TOKEN_EMBD_NORM, (E,))
    for il in range(cfg.n_layer):
        for kind in (_T.ATTN_Q, _T.ATTN_K, _T.ATTN_V, _T.ATTN_OUT):
            add(kind, (E, E), il)
        add(_T.ATTN_OUT_NORM, (E,), il)
        add(_T.FFN_UP, (F, E), il)
        add(_T.FFN_DOWN, (E, F), il)
        add(_T.LAYER_OUT_NORM, (E,), il)
    return shapes


def _bert_name(hf_name: str) -> str:
    """The name as a BertModel spells it: no "bert." prefix, TF-era gamma/beta as weight/bias."""
    name = hf_name.removeprefix("bert.")
    if name.endswith(".gamma"):
        return name.removesuffix(".gamma") + ".weight"
    if name.endswith(".beta"):
        return name.removesuffix(".beta") + ".bias"
    return name


def _tensors(src: Path, cfg: _Config, matrix_type: gguf.GGMLQuantizationType) -> list[_Tensor]:
    """Every tensor to write, in llama.cpp's loading order, each checked for name, shape, dtype and size."""
    parts = {part: safetensors_header(part) for part in sorted(src.glob("model*.safetensors"))}
    if not parts:
        raise CheckpointError(f"{src}: no model.safetensors (only safetensors checkpoints are converted)")
    n_declared = sum(len(t) for t in parts.values())
    if cfg.n_layer > n_declared:  # before naming the tensors of every layer config.json claims
        raise CheckpointError(f"{src / 'config.json'}: num_hidden_layers {cfg.n_layer} is more layers than the "
                              f"{n_declared} tensors of the safetensors hold")
    expected = _expected_shapes(cfg)
    tmap = gguf.TensorNameMap(gguf.MODEL_ARCH.BERT, cfg.n_layer)
    found: dict[str, _Tensor] = {}
    for part, declared in parts.items():
        for hf_name, t in declared.items():
            name = _bert_name(hf_name)
            if name.startswith(_DROPPED):
                continue
            kind, gguf_name = tmap.get_type_and_name(name, try_suffixes=(".weight", ".bias")) or (None, "")
            if gguf_name not in expected:
                raise CheckpointTensorError(f"{part}: unexpected tensor {hf_name} (not a tensor llama.cpp's bert "
                                            f"reads)")
            if gguf_name in found:
                raise CheckpointTensorError(f"{part}: tensors {found[gguf_name].hf_name} and {hf_name} are both "
                                            f"{gguf_name}")
            shape = expected[gguf_name]
            if t.dtype not in _SOURCE_DTYPES:
                raise CheckpointTensorError(f"{part}: tensor {hf_name} has dtype {t.dtype} (converted: "
                                            f"{', '.join(_SOURCE_DTYPES)})")
            if t.shape != shape:
                raise CheckpointTensorError(f"{part}: tensor {hf_name} has shape {clip(list(t.shape))}, "
                                            f"config.json makes it {list(shape)}")
            if t.data_range.size != math.prod(shape) * _SOURCE_DTYPES[t.dtype].itemsize:
                raise CheckpointError(f"{part}: corrupt safetensors header (tensor {hf_name} holds "
                                      f"{t.data_range.size} bytes, not those of {t.dtype}{list(shape)})")
            # NOTE: as convert_hf_to_gguf: norms, biases and the position/token-type tables stay f32
            keep_f32 = len(shape) == 1 or kind in (_T.POS_EMBD, _T.TOKEN_TYPES)
            found[gguf_name] = _Tensor(gguf_name, hf_name, t, _QT.F32 if keep_f32 else matrix_type)
    missing = [n for n in expected if n not in found]
    if missing:
        where = next(iter(parts)) if len(parts) == 1 else src
        more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
        raise CheckpointTensorError(f"{where}: missing tensor {_hf_name(tmap, missing[0], found)} ({missing[0]})"
                                    f"{more}")
    return [found[n] for n in expected]


def _hf_name(tmap: gguf.TensorNameMap, gguf_name: str, found: dict[str, _Tensor]) -> str:
    """The HF spelling of a missing tensor: the map's candidate rooted like the tensors that are present."""
    base, _, suffix = gguf_name.rpartition(".")
    roots = {_bert_name(t.hf_name).split(".")[0] for t in found.values()}
    candidates = [k for k, (_, v) in tmap.mapping.items() if v == base and k != base]
    return next((f"{k}.{suffix}" for k in candidates if k.split(".")[0] in roots), gguf_name)


def _data(t: _Tensor) -> np.ndarray:
    """One tensor's data in its output type, read from the mapped file (a copy only where types differ)."""
    a = t.source.mmap_bytes().view(_SOURCE_DTYPES[t.source.dtype]).reshape(t.source.shape)
    if t.source.dtype == "BF16":
        a = (a.astype(np.uint32) << 16).view(np.float32)
    return a.astype(np.float32 if t.qtype == _QT.F32 else np.float16, copy=False)


# ---- metadata and vocabulary -------------------------------------------------------------------------------


def _add_general(w: gguf.GGUFWriter, src: Path, cfg: _Config, file_type: gguf.LlamaFileType) -> None:
    w.add_type(gguf.GGUFType.MODEL)
    total, shared, expert, n_expert = w.get_total_parameter_count()
    meta = _model_card(src, total)
    meta.name = meta.name or src.resolve().name
    meta.size_label = meta.size_label or gguf.size_label(total, shared, expert, n_expert)
    meta.set_gguf_meta_model(w)
    for key, value in cfg.metadata.items():
        if key != gguf.Keys.Tokenizer.TOKEN_TYPE_COUNT:  # written with the vocabulary
            _add_key(w, key, value)
    w.add_file_type(file_type)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)


def _add_key(w: gguf.GGUFWriter, key: str, value: Any) -> None:
    """One mapped key in the GGUF type the converter gives it: flags bool, counts u32, numbers f32, names text,
    per-layer or per-section values arrays."""
    if isinstance(value, bool):
        w.add_bool(key, value)
    elif isinstance(value, int):
        w.add_uint32(key, value)
    elif isinstance(value, float):
        w.add_float32(key, value)
    elif isinstance(value, str):
        w.add_string(key, value)
    else:
        w.add_array(key, list(value))


def _model_card(src: Path, total: int) -> gguf.Metadata:
    """gguf's general metadata (name, license, tags, base models, ...) from README.md's YAML front matter and
    config.json, checked to be what a GGUF holds: text, lists of text, entries of text. (A BERT has no
    sampling parameters: generation_config.json is not read.)"""
    readme = src / "README.md"
    try:
        card = gguf.Metadata.load_model_card(src)
    except OSError as e:
        raise CheckpointError(f"{readme}: cannot read ({e.strerror or e})") from None
    except (yaml.YAMLError, ValueError, RecursionError) as e:  # ValueError: bad UTF-8
        raise CheckpointError(f"{readme}: front matter is not readable YAML ({reason(e)})") from None
    meta = gguf.Metadata.apply_metadata_heuristic(gguf.Metadata(), card, gguf.Metadata.load_hf_parameters(src), src,
                                                  total)
    for field in dataclasses.fields(meta):
        v = getattr(meta, field.name)
        if not (v is None or _is_text(v)
                or field.name in _CARD_LISTS and isinstance(v, list) and all(map(_is_text, v))
                or field.name in _CARD_ENTRIES and isinstance(v, list)
                and all(isinstance(e, dict) and all(map(_is_text, e.values())) for e in v)):
            raise CheckpointError(f"{readme}: model card value {field.name} is {clip(v)}, not text")
    return meta


def _special_names(src: Path) -> dict[str, str]:
    """Special-token texts by kind ("unk", "cls", ...) from tokenizer_config.json and special_tokens_map.json."""
    names: dict[str, str] = {}
    for file in ("special_tokens_map.json", "tokenizer_config.json"):
        path = src / file
        doc = read_json(path) if path.exists() else {}
        for key, v in (doc.items() if isinstance(doc, dict) else ()):
            text = v.get("content") if isinstance(v, dict) else v
            if key.endswith("_token") and isinstance(text, str):
                names.setdefault(key.removesuffix("_token"), text)
    return names


def _wordpiece(src: Path, n_vocab: int) -> tuple[dict[str, int], dict[str, bool]]:
    """(token -> id, added token -> special) from tokenizer.json, else from vocab.txt and tokenizer_config.json;
    every id below ``n_vocab``."""
    path = src / "tokenizer.json"
    if path.exists():
        doc = read_json(path)
        model = doc.get("model") if isinstance(doc, dict) else None
        if not isinstance(model, dict) or model.get("type") != "WordPiece" or not isinstance(model.get("vocab"), dict):
            kind = model.get("type") if isinstance(model, dict) else None
            raise CheckpointError(f"{path}: not a WordPiece tokenizer (model type {clip(kind)})")
        vocab, added_list = dict(model["vocab"]), doc.get("added_tokens") or []
    else:
        path = src / "vocab.txt"
        try:
            with open(path, encoding="utf-8") as f:  # one token per line, as transformers' BertTokenizer reads it
                vocab = {line.rstrip("\n"): i for i, line in enumerate(f.readlines())}
        except FileNotFoundError:
            raise CheckpointError(f"{src}: no tokenizer.json or vocab.txt") from None
        except (OSError, ValueError) as e:
            raise CheckpointError(f"{path}: not readable ({reason(e)})") from None
        config = src / "tokenizer_config.json"
        doc = read_json(config) if config.exists() else {}
        decoder = (doc.get("added_tokens_decoder") if isinstance(doc, dict) else None) or {}
        if not isinstance(decoder, dict):
            raise CheckpointError(f"{config}: added_tokens_decoder is not a JSON object")
        added_list = [{**v, "id": int(i)} for i, v in decoder.items()
                      if isinstance(v, dict) and i.isascii() and i.isdigit()]
    if not isinstance(added_list, list):
        raise CheckpointError(f"{path}: added_tokens is not a list")
    added: dict[str, bool] = {}
    for a in added_list:
        if not (isinstance(a, dict) and _is_text(a.get("content")) and isinstance(a.get("id"), int)):
            raise CheckpointError(f"{path}: malformed added token {clip(a)}")
        vocab[a["content"]] = a["id"]
        added[a["content"]] = bool(a.get("special"))
    for t, i in vocab.items():
        if not _is_text(t) or not isinstance(i, int) or isinstance(i, bool) or i < 0:
            raise CheckpointError(f"{path}: token {clip(t)} has id {clip(i)}")
        if i >= n_vocab:
            raise CheckpointError(f"{path}: token {clip(t)} has id {i}, beyond config.json's vocab_size {n_vocab}")
    return vocab, added


def _is_text(v: Any) -> bool:
    """Whether v is a str a GGUF can hold (UTF-8: JSON and YAML escapes can make lone surrogates)."""
    if not isinstance(v, str):
        return False
    try:
        v.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _vocab(src: Path, n_vocab: int, special_names: dict[str, str]) -> tuple[list[str], list[int]]:
    """Token texts and types for llama.cpp's WPM tokenizer, ``n_vocab`` of them."""
    vocab, added = _wordpiece(src, n_vocab)
    special = {t for t, s in added.items() if s} | set(special_names.values())
    by_id = {i: t for t, i in vocab.items()}
    tokens, toktypes = [], []
    for i in range(n_vocab):
        tok = by_id.get(i)
        if tok is None:
            tok, kind = f"[PAD{i}]", _TT.UNUSED
        elif tok in special:
            kind = _TT.CONTROL
        elif tok in added:
            kind = _TT.USER_DEFINED
        else:
            kind = _TT.NORMAL
        if kind != _TT.CONTROL:
            tok = tok[2:] if tok.startswith("##") else _WORD_START + tok
        tokens.append(tok)
        toktypes.append(int(kind))
    return tokens, toktypes


def _add_vocab(w: gguf.GGUFWriter, src: Path, cfg: _Config, tokens: list[str], toktypes: list[int],
               special_names: dict[str, str]) -> None:
    w.add_token_type_count(cfg.n_token_types)
    w.add_tokenizer_model("bert")
    w.add_tokenizer_pre(_PRE_TOKENIZER)
    w.add_token_list(tokens)
    w.add_token_types(toktypes)
    special = _special_vocab(src, len(tokens))
    # NOTE: gguf resolves special ids through tokenizer.json only; a vocab.txt tokenizer names them in its configs
    ids = {t: i for i, t in enumerate(tokens) if toktypes[i] == _TT.CONTROL}
    for kind in _SPECIAL_KINDS:
        text = special_names.get(kind) or special_names.get(_SPECIAL_FALLBACK.get(kind, kind))
        if kind not in special.special_token_ids and text in ids:
            special.special_token_ids[kind] = ids[text]
    special.add_to_gguf(w, quiet=True)


def _special_vocab(src: Path, n_vocab: int) -> gguf.SpecialVocab:
    """gguf's reading of the special tokens (ids, whether to add them, chat template) from tokenizer.json,
    tokenizer_config.json and config.json, whose structure it takes on trust: what it cannot read, or a chat
    template that is neither text nor named templates, is a CheckpointError."""
    try:
        special = gguf.SpecialVocab(src, n_vocab=n_vocab, special_token_types=_SPECIAL_KINDS)
    except (OSError, ValueError, TypeError, AttributeError, KeyError, IndexError, RecursionError) as e:
        files = ", ".join(f for f in _SPECIAL_FILES if (src / f).exists())
        raise CheckpointError(f"{src}: special tokens not readable from {files} ({reason(e)})") from None
    template = special.chat_template
    if not (template is None or _is_text(template) or isinstance(template, list) and all(
            isinstance(t, dict) and _is_text(t.get("name", "")) and _is_text(t.get("template")) for t in template)):
        raise CheckpointError(f"{src / 'tokenizer_config.json'}: chat_template is {clip(template)}, neither text "
                              f"nor a list of named templates")
    return special
