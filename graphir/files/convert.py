"""Hugging Face BERT checkpoint -> GGUF that llama.cpp loads as ``bert``.

The GGUF holds what llama.cpp's ``convert_hf_to_gguf.py`` writes for a ``BertModel``, without torch or
transformers: safetensors are memory-mapped with numpy (gguf's ``SafetensorsLocal``), names come from gguf's
``TensorNameMap``, the general keys from gguf's ``Metadata`` (model card and config heuristics), special
tokens from gguf's ``SpecialVocab``. The rules kept from the converter:

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
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf
import numpy as np
from gguf.utility import LocalTensor, SafetensorsLocal

from graphir.errors import CheckpointError, GraphirError, TensorError

__all__ = ["OUTTYPES", "convert_bert"]

_T = gguf.MODEL_TENSOR
_QT = gguf.GGMLQuantizationType
_TT = gguf.TokenType

# outtype -> (type of the weight matrices, general.file_type)
OUTTYPES: dict[str, tuple[gguf.GGMLQuantizationType, gguf.LlamaFileType]] = {
    "f32": (_QT.F32, gguf.LlamaFileType.ALL_F32),
    "f16": (_QT.F16, gguf.LlamaFileType.MOSTLY_F16),
}
_HF_ARCHITECTURES = ("BertModel", "BertForMaskedLM")
# Storage of each supported safetensors dtype; BF16 is widened to f32 by shifting its bits.
_SOURCE_DTYPES = {"F32": np.dtype("<f4"), "F16": np.dtype("<f2"), "BF16": np.dtype("<u2")}
# HF tensors llama.cpp's bert never reads (after a "bert." prefix is removed).
_DROPPED = ("embeddings.position_ids", "pooler.", "cls.predictions.", "cls.seq_relationship.")
_POOLING = (("pooling_mode_mean_tokens", gguf.PoolingType.MEAN), ("pooling_mode_cls_token", gguf.PoolingType.CLS),
            ("pooling_mode_lasttoken", gguf.PoolingType.LAST))
# tokenizer.ggml.<kind>_token_id keys gguf knows; it has none for cls (bos is [CLS]).
_SPECIAL_KINDS = ("bos", "eos", "unk", "sep", "pad", "mask")
_SPECIAL_FALLBACK = {"bos": "cls", "eos": "sep"}  # as gguf's SpecialVocab reads a BERT tokenizer_config.json
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


@dataclass(frozen=True)
class _Tensor:
    name: str  # GGUF name
    hf_name: str
    source: LocalTensor
    qtype: gguf.GGMLQuantizationType


def convert_bert(src_dir: str | os.PathLike[str], out_path: str | os.PathLike[str], outtype: str = "f16") -> Path:
    """Write ``out_path``, a GGUF of the BERT checkpoint in ``src_dir`` that llama.cpp loads; return its path.

    ``outtype`` ("f32" or "f16") is the type of the weight matrices. Everything is checked before the file is
    written, and it appears only once complete. Raises :class:`~graphir.errors.CheckpointError` for a missing or
    malformed file or a model that is not BERT, :class:`~graphir.errors.TensorError` for a missing, unexpected,
    wrong-shape or unsupported-dtype tensor.

    >>> convert_bert("all-MiniLM-L6-v2", "minilm.gguf", outtype="f16")  # doctest: +SKIP
    PosixPath('minilm.gguf')
    """
    if outtype not in OUTTYPES:
        raise ValueError(f"outtype must be one of {', '.join(OUTTYPES)}, not {outtype!r}")
    src, out = Path(src_dir), Path(out_path)
    if not src.is_dir():
        raise CheckpointError(f"{src}: not a directory (expected a Hugging Face model directory)")
    cfg = _config(src)
    matrix_type, file_type = OUTTYPES[outtype]
    tensors = _tensors(src, cfg, matrix_type)
    special_names = _special_names(src)
    tokens, toktypes = _vocab(src, cfg.n_vocab, special_names)
    pooling = _pooling(src)

    w = gguf.GGUFWriter(None, gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH.BERT])
    for t in tensors:
        dtype = np.dtype(np.float32 if t.qtype == _QT.F32 else np.float16)
        w.add_tensor_info(t.name, t.source.shape, dtype, math.prod(t.source.shape) * dtype.itemsize, raw_dtype=t.qtype)
    _add_general(w, src, cfg, file_type, pooling)
    _add_vocab(w, src, cfg, tokens, toktypes, special_names)

    part = out.with_name(out.name + ".part")
    try:
        w.write_header_to_file(part)
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        for t in tensors:
            w.write_tensor_data(_data(t))
        w.close()
        os.replace(part, out)
    except OSError as e:
        raise GraphirError(f"{out}: cannot write ({e.strerror or e})") from None
    finally:
        w.close()
        part.unlink(missing_ok=True)
    return out


# ---- config ------------------------------------------------------------------------------------------------


def _json(path: Path) -> Any:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        raise CheckpointError(f"{path}: not found") from None
    except (OSError, ValueError) as e:  # ValueError: bad JSON or bad UTF-8
        raise CheckpointError(f"{path}: not readable JSON ({e})") from None


def _config(src: Path) -> _Config:
    path = src / "config.json"
    if not path.exists():
        raise CheckpointError(f"{path}: not found (not a Hugging Face model directory)")
    cfg = _json(path)
    if not isinstance(cfg, dict):
        raise CheckpointError(f"{path}: not a model config (a JSON object)")
    model_type, archs = cfg.get("model_type"), cfg.get("architectures") or []
    if model_type != "bert" or not isinstance(archs, list) or any(a not in _HF_ARCHITECTURES for a in archs):
        raise CheckpointError(f"{path}: not a BERT model (model_type {model_type!r}, architectures {archs!r}); "
                              f"converted: model_type 'bert' as {' or '.join(_HF_ARCHITECTURES)}")

    def count(key: str, default: int | None = None) -> int:
        v = cfg.get(key, default)
        if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
            raise CheckpointError(f"{path}: {key} must be a positive integer, not {v!r}")
        return v

    eps = cfg.get("layer_norm_eps", 1e-12)  # defaults are transformers' BertConfig's
    if not isinstance(eps, (int, float)) or isinstance(eps, bool) or not eps > 0:
        raise CheckpointError(f"{path}: layer_norm_eps must be a positive number, not {eps!r}")
    return _Config(n_vocab=count("vocab_size"), n_ctx=count("max_position_embeddings"), n_embd=count("hidden_size"),
                   n_ff=count("intermediate_size"), n_layer=count("num_hidden_layers"),
                   n_head=count("num_attention_heads"), n_token_types=count("type_vocab_size", 2),
                   norm_eps=float(eps))


def _pooling(src: Path) -> gguf.PoolingType | None:
    """The pooling of a sentence-transformers model; None (key left out) when there is no Pooling module."""
    modules_path = src / "modules.json"
    if not modules_path.exists():
        return None
    modules = _json(modules_path)
    if not isinstance(modules, list):
        raise CheckpointError(f"{modules_path}: not a list of modules")
    pooling_dir = next((m.get("path") for m in modules
                        if isinstance(m, dict) and m.get("type") == "sentence_transformers.models.Pooling"), None)
    if not isinstance(pooling_dir, str):
        return None
    path = src / pooling_dir / "config.json"
    cfg = _json(path)
    for key, kind in _POOLING:
        if isinstance(cfg, dict) and cfg.get(key):
            return kind
    raise CheckpointError(f"{path}: unsupported pooling (llama.cpp pools by mean, cls or last token)")


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


def _safetensors(path: Path) -> dict[str, LocalTensor]:
    """The tensors a safetensors file declares, each checked to lie inside the file (data stays unread)."""
    try:
        tensors = SafetensorsLocal(path).tensors
        size = path.stat().st_size
    except OSError as e:
        raise CheckpointError(f"{path}: cannot read ({e.strerror or e})") from None
    except (ValueError, KeyError, TypeError, AttributeError, IndexError) as e:  # what a malformed header raises
        raise CheckpointError(f"{path}: corrupt safetensors header ({type(e).__name__}: {e})") from None
    for name, t in tensors.items():
        r = t.data_range
        if not 0 <= r.size <= size - r.offset:
            raise CheckpointError(f"{path}: corrupt safetensors header (tensor {name}'s data_offsets lie outside "
                                  f"the file)")
    return tensors


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
    parts = sorted(src.glob("model*.safetensors"))
    if not parts:
        raise CheckpointError(f"{src}: no model.safetensors (only safetensors checkpoints are converted)")
    expected = _expected_shapes(cfg)
    tmap = gguf.TensorNameMap(gguf.MODEL_ARCH.BERT, cfg.n_layer)
    found: dict[str, _Tensor] = {}
    for part in parts:
        for hf_name, t in _safetensors(part).items():
            name = _bert_name(hf_name)
            if name.startswith(_DROPPED):
                continue
            kind, gguf_name = tmap.get_type_and_name(name, try_suffixes=(".weight", ".bias")) or (None, "")
            if gguf_name not in expected:
                raise TensorError(f"{part}: unexpected tensor {hf_name} (not a tensor llama.cpp's bert reads)")
            if gguf_name in found:
                raise TensorError(f"{part}: tensors {found[gguf_name].hf_name} and {hf_name} are both {gguf_name}")
            shape = expected[gguf_name]
            if t.dtype not in _SOURCE_DTYPES:
                raise TensorError(f"{part}: tensor {hf_name} has dtype {t.dtype} (converted: "
                                  f"{', '.join(_SOURCE_DTYPES)})")
            if t.shape != shape:
                raise TensorError(f"{part}: tensor {hf_name} has shape {list(t.shape)}, config.json makes it "
                                  f"{list(shape)}")
            if t.data_range.size != math.prod(shape) * _SOURCE_DTYPES[t.dtype].itemsize:
                raise CheckpointError(f"{part}: corrupt safetensors header (tensor {hf_name} holds "
                                      f"{t.data_range.size} bytes, not those of {t.dtype}{list(shape)})")
            # NOTE: as convert_hf_to_gguf: norms, biases and the position/token-type tables stay f32
            keep_f32 = len(shape) == 1 or kind in (_T.POS_EMBD, _T.TOKEN_TYPES)
            found[gguf_name] = _Tensor(gguf_name, hf_name, t, _QT.F32 if keep_f32 else matrix_type)
    missing = [n for n in expected if n not in found]
    if missing:
        where = parts[0] if len(parts) == 1 else src
        more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
        raise TensorError(f"{where}: missing tensor {_hf_name(tmap, missing[0], found)} ({missing[0]}){more}")
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


def _add_general(w: gguf.GGUFWriter, src: Path, cfg: _Config, file_type: gguf.LlamaFileType,
                 pooling: gguf.PoolingType | None) -> None:
    w.add_type(gguf.GGUFType.MODEL)
    total, shared, expert, n_expert = w.get_total_parameter_count()
    meta = gguf.Metadata.load(None, src, None, total)
    meta.name = meta.name or src.resolve().name
    meta.size_label = meta.size_label or gguf.size_label(total, shared, expert, n_expert)
    meta.set_gguf_meta_model(w)
    w.add_block_count(cfg.n_layer)
    w.add_context_length(cfg.n_ctx)
    w.add_embedding_length(cfg.n_embd)
    w.add_feed_forward_length(cfg.n_ff)
    w.add_head_count(cfg.n_head)
    w.add_layer_norm_eps(cfg.norm_eps)
    w.add_file_type(file_type)
    w.add_causal_attention(False)
    if pooling is not None:
        w.add_pooling_type(pooling)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)


def _special_names(src: Path) -> dict[str, str]:
    """Special-token texts by kind ("unk", "cls", ...) from tokenizer_config.json and special_tokens_map.json."""
    names: dict[str, str] = {}
    for file in ("special_tokens_map.json", "tokenizer_config.json"):
        path = src / file
        doc = _json(path) if path.exists() else {}
        for key, v in (doc.items() if isinstance(doc, dict) else ()):
            text = v.get("content") if isinstance(v, dict) else v
            if key.endswith("_token") and isinstance(text, str):
                names.setdefault(key.removesuffix("_token"), text)
    return names


def _wordpiece(src: Path) -> tuple[dict[str, int], dict[str, bool]]:
    """(token -> id, added token -> special) from tokenizer.json, else from vocab.txt and tokenizer_config.json."""
    path = src / "tokenizer.json"
    if path.exists():
        doc = _json(path)
        model = doc.get("model") if isinstance(doc, dict) else None
        if not isinstance(model, dict) or model.get("type") != "WordPiece" or not isinstance(model.get("vocab"), dict):
            kind = model.get("type") if isinstance(model, dict) else None
            raise CheckpointError(f"{path}: not a WordPiece tokenizer (model type {kind!r})")
        vocab, added_list = dict(model["vocab"]), doc.get("added_tokens") or []
    else:
        path = src / "vocab.txt"
        try:
            with open(path, encoding="utf-8") as f:  # one token per line, as transformers' BertTokenizer reads it
                vocab = {line.rstrip("\n"): i for i, line in enumerate(f.readlines())}
        except FileNotFoundError:
            raise CheckpointError(f"{src}: no tokenizer.json or vocab.txt") from None
        except (OSError, ValueError) as e:
            raise CheckpointError(f"{path}: not readable ({e})") from None
        config = src / "tokenizer_config.json"
        doc = _json(config) if config.exists() else {}
        decoder = (doc.get("added_tokens_decoder") if isinstance(doc, dict) else None) or {}
        added_list = [{**v, "id": int(i)} for i, v in decoder.items() if isinstance(v, dict) and str(i).isdigit()]
    added: dict[str, bool] = {}
    for a in added_list:
        if not (isinstance(a, dict) and isinstance(a.get("content"), str) and isinstance(a.get("id"), int)):
            raise CheckpointError(f"{path}: malformed added token {a!r}")
        vocab[a["content"]] = a["id"]
        added[a["content"]] = bool(a.get("special"))
    bad = next(((t, i) for t, i in vocab.items() if not isinstance(i, int) or isinstance(i, bool) or i < 0), None)
    if bad is not None:
        raise CheckpointError(f"{path}: token {bad[0]!r} has id {bad[1]!r}")
    return vocab, added


def _vocab(src: Path, n_vocab: int, special_names: dict[str, str]) -> tuple[list[str], list[int]]:
    """Token texts and types for llama.cpp's WPM tokenizer, ``n_vocab`` of them."""
    vocab, added = _wordpiece(src)
    over = next(((t, i) for t, i in vocab.items() if i >= n_vocab), None)
    if over is not None:
        raise CheckpointError(f"{src}: token {over[0]!r} has id {over[1]}, beyond config.json's vocab_size {n_vocab}")
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
    special = gguf.SpecialVocab(src, n_vocab=len(tokens), special_token_types=_SPECIAL_KINDS)
    # NOTE: gguf resolves special ids through tokenizer.json only; a vocab.txt tokenizer names them in its configs
    ids = {t: i for i, t in enumerate(tokens) if toktypes[i] == _TT.CONTROL}
    for kind in _SPECIAL_KINDS:
        text = special_names.get(kind) or special_names.get(_SPECIAL_FALLBACK.get(kind, kind))
        if kind not in special.special_token_ids and text in ids:
            special.special_token_ids[kind] = ids[text]
    special.add_to_gguf(w, quiet=True)
