"""Hugging Face model configs -> the metadata llama.cpp's ``convert_hf_to_gguf.py`` writes, without converting.

A model directory (or its ``config.json``) becomes the :class:`~graphir.model.meta.ModelMeta` that a
header-only GGUF of the converted model holds: the ``<arch>.*`` keys the converter's class for the config's
``architectures[0]`` writes, with the defaults it (and the transformers config class it loads the file
through) applies, and the tensor table the architecture expects, typed as the converter types it by default
(``--outtype auto``: BF16 or F16 as the checkpoint's first float matrix, F16 when there is none; F32 for 1-D
tensors, norms and the tensors it always keeps in F32). Nothing but ``config.json``, a sentence-transformers
pooling module and the safetensors *headers* (whether the checkpoint has an LM head, its dtype) is read.

The mapping is data: :data:`FAMILIES` has one entry per Hugging Face architecture name, each a GGUF
architecture and a tuple of *rules*, small functions of the config returning the GGUF keys they set (later
rules override earlier ones, as the converter's subclasses override their parents). Adding a family is one
entry. ``graphir convert`` writes its BERT keys from the same entry.

Two choices where the converter's default would give a file graphir does not build: Qwen3.5's
multi-token-prediction layers are left out (as ``--no-mtp``), and the vocabulary is ``vocab_size`` (the token
list the converter writes is padded to it).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Callable, Mapping

from gguf import GGMLQuantizationType as Q
from gguf import Keys, PoolingType

from graphir.errors import CheckpointError
from graphir.files.checkpoint import clip, read_json, safetensors_header
from graphir.model.discovery import discover
from graphir.model.presets import Preset


__all__ = ["CONFIG", "FAMILIES", "Config", "is_hf_source", "preset_of", "converted_type", "read_config", "gguf_keys",
           "sentence_pooling"]

L, A, R, S = Keys.LLM, Keys.Attention, Keys.Rope, Keys.SSM
CONFIG = "config.json"
_F32_MAX = 3.4028234663852886e38  # the largest float a GGUF float32 key holds
_ABSENT = object()

# What the converter keeps in F32 whatever the output type, by GGUF name (1-D tensors are F32 as well): norms,
# MoE routers, position and token-type tables, conv kernels of state-space layers, RWKV's mixes, and every
# tensor whose name does not end in ".weight" (Mamba's A and D).
KEEP_F32 = (r"(.*_norm|.*\.ffn_gate_inp(_shexp)?|position_embd|token_types|.*\.ssm_conv1d|.*\.shortconv\.conv"
            r"|.*\.time_mix_(first|w1|w2|decay_w1|decay_w2|lerp_fused))\.weight|.*(?<!\.weight)")


# ---- the config, read with errors naming file and key ------------------------------------------------------


class Config:
    """One model config as the converter sees it: the family's defaults (those of the transformers config class it
    loads the file through) under the file's keys, under its ``text_config`` (moved to the root)."""

    def __init__(self, path: Path, doc: Mapping[str, Any], defaults: Mapping[str, Any] = {}):
        self.path = path
        text = doc.get("text_config")
        self.doc: dict[str, Any] = {**defaults, **doc, **(text if isinstance(text, dict) else {})}

    def error(self, message: str) -> CheckpointError:
        return CheckpointError(f"{self.path}: {message}")

    def find(self, *names: str, kind: str = "count", default: Any = _ABSENT) -> Any:
        """The value of the first of ``names`` the config gives (None counts as absent), checked to be of
        ``kind``: count (an integer > 0), size (>= 0), number (a positive float32), flag, text, list, map, any.
        Absent: ``default``, or an error naming the first name when there is none."""
        for n in names:
            v = self.doc.get(n)
            if v is not None:
                return self.check(n, v, kind)
        if default is _ABSENT:
            also = f" (or {', '.join(names[1:])})" if len(names) > 1 else ""
            raise self.error(f"missing key '{names[0]}'{also}")
        return default

    def check(self, name: str, v: Any, kind: str) -> Any:
        integer = isinstance(v, int) and not isinstance(v, bool)
        if kind in ("count", "size"):
            if not integer or v < (1 if kind == "count" else 0) or v >= 1 << 32:
                what = "a positive integer" if kind == "count" else "an integer >= 0"
                raise self.error(f"{name} must be {what}, not {clip(v)}")
        elif kind == "number":
            if not (integer or isinstance(v, float)) or isinstance(v, bool) or not 0 < v <= _F32_MAX:
                raise self.error(f"{name} must be a positive number (a float32), not {clip(v)}")
            return float(v)
        elif kind in _KINDS and not isinstance(v, _KINDS[kind]):
            raise self.error(f"{name} must be {_kind_name(kind)}, not {clip(v)}")
        return v

    @cached_property
    def rope(self) -> dict[str, Any]:
        """The RoPE parameters as the converter gathers them: ``rope_parameters`` (or ``rope_scaling``), with the
        top-level theta, local theta, type, partial factor and original context mirrored in."""
        p = self.doc.get("rope_parameters", self.doc.get("rope_scaling")) or {}
        p = dict(self.check("rope_parameters", p, "map"))
        if "full_attention" not in p and "sliding_attention" not in p:
            local = self.find("local_rope_theta", "rope_local_theta", "rope_theta_local", "swa_rope_theta",
                              "rope_local_base_freq", kind="number", default=None)
            if local is not None:
                p["sliding_attention"] = {"rope_theta": local}
            mirrored = {"rope_theta": ("global_rope_theta", "rope_global_theta", "rope_theta_global", "rope_theta",
                                       "rotary_emb_base"),
                        "rope_type": ("type",), "partial_rotary_factor": ("partial_rotary_factor", "rope_pct",
                                                                           "rope_percent"),
                        "original_max_position_embeddings": ("original_max_position_embeddings",)}
            for key, names in mirrored.items():
                source = p if key == "rope_type" else self.doc
                v = next((source[n] for n in names if source.get(n) is not None), None)
                if key not in p and v is not None:
                    p[key] = v
        return p

    @property
    def full_rope(self) -> dict[str, Any]:
        """The RoPE parameters of the global layers (``full_attention``, where a config splits them)."""
        return self.check("rope_parameters.full_attention", self.rope.get("full_attention", self.rope), "map")

    def rope_value(self, params: Mapping[str, Any], key: str, kind: str = "number", default: Any = _ABSENT) -> Any:
        v = params.get(key)
        if v is None:
            if default is _ABSENT:
                raise self.error(f"missing key 'rope_scaling.{key}'")
            return default
        return self.check(f"rope_scaling.{key}", v, kind)


_KINDS: dict[str, type | tuple[type, ...]] = {"flag": bool, "text": str, "list": list, "map": dict}


def _kind_name(kind: str) -> str:
    return {"flag": "true or false", "text": "text", "list": "a list", "map": "a JSON object"}.get(kind, kind)


# ---- rules: config -> the GGUF keys (templates) they set -----------------------------------------------------

Rule = Callable[[Config], Mapping[str, Any]]


def hf(template: str, *names: str, kind: str = "count", default: Any = _ABSENT) -> Rule:
    """The key ``template`` from the first of ``names`` the config gives; ``default`` None: left out when absent."""
    def rule(c: Config) -> Mapping[str, Any]:
        v = c.find(*names, kind=kind, default=default)
        return {} if v is None else {template: v}
    return rule


def fixed(template: str, value: Any) -> Rule:
    return lambda c: {template: value}


def derived(template: str, fn: Callable[[Config], Any]) -> Rule:
    """The key from a function of the config (None: left out)."""
    def rule(c: Config) -> Mapping[str, Any]:
        v = fn(c)
        return {} if v is None else {template: v}
    return rule


BLOCKS = ("n_layers", "num_hidden_layers", "n_layer", "num_layers")
CONTEXT = ("max_position_embeddings", "n_ctx", "n_positions", "max_length", "max_sequence_length",
           "model_max_length")
WIDTH = ("hidden_size", "n_embd", "dim")


def heads(c: Config) -> int:
    return c.find("num_attention_heads", "n_head", "n_heads")


def head_dim(c: Config) -> int:
    return c.find("head_dim", default=None) or c.find(*WIDTH) // heads(c)


def _rope_scaling(c: Config) -> dict[str, Any]:
    """rope_type linear and yarn with their factor, longrope; llama3's factors become the rope_freqs tensor."""
    p = c.full_rope
    kind = p.get("rope_type")
    factor = p.get("factor")
    if kind == "linear" and factor is not None:
        return {R.SCALING_TYPE: "linear", R.SCALING_FACTOR: c.rope_value(p, "factor")}
    if kind == "yarn" and factor is not None:
        out = {R.SCALING_TYPE: "yarn", R.SCALING_FACTOR: c.rope_value(p, "factor"),
               R.SCALING_ORIG_CTX_LEN: c.rope_value(p, "original_max_position_embeddings", "count")}
        for key, names in ((R.SCALING_YARN_EXT_FACTOR, ("extrapolation_factor",)),
                           (R.SCALING_YARN_ATTN_FACTOR, ("attention_factor", "attn_factor")),
                           (R.SCALING_YARN_BETA_FAST, ("beta_fast",)), (R.SCALING_YARN_BETA_SLOW, ("beta_slow",))):
            name = next((n for n in names if p.get(n) is not None), None)
            if name is not None:
                out[key] = c.rope_value(p, name)
        return out
    if kind in ("su", "longrope"):
        return {R.SCALING_TYPE: "longrope"}
    return {}


def _rope_theta(c: Config) -> dict[str, Any]:
    out = {}
    theta = c.full_rope.get("rope_theta")
    if theta is not None:
        out[R.FREQ_BASE] = c.check("rope_theta", theta, "number")
    local = c.rope.get("sliding_attention", {})
    if isinstance(local, dict) and local.get("rope_theta") is not None:
        out[R.FREQ_BASE_SWA] = c.check("rope_local_base_freq", local["rope_theta"], "number")
    if "mrope_section" in c.rope:
        sections = c.check("mrope_section", c.rope["mrope_section"], "list")
        out[R.DIMENSION_SECTIONS] = [c.check("mrope_section", s, "size") for s in (sections + [0] * 4)[:4]]
    return out


# gguf.ExpertGatingFuncType; dots.llm1 names its sigmoid routing with a selection bias by the top-k method
_GATING = {"softmax": 1, "sigmoid": 2, "noaux_tc": 2}


def _gating(c: Config) -> int | None:
    f = c.find("score_function", "scoring_func", "score_func", "moe_router_activation",
               "moe_router_activation_func", "expert_selection_fn", kind="text", default=None)
    if f is not None and f not in _GATING:
        raise c.error(f"scoring_func '{f}' is not supported (supported: {', '.join(_GATING)})")
    return None if f is None else _GATING[f]


# TextModel.set_gguf_parameters: what every family that calls it writes, but head_dim (which Granite drops)
TEXT_BASE: tuple[Rule, ...] = (
    hf(L.BLOCK_COUNT, *BLOCKS),
    hf(L.CONTEXT_LENGTH, *CONTEXT),
    hf(L.EMBEDDING_LENGTH, *WIDTH),
    hf(L.FEED_FORWARD_LENGTH, "prefix_dense_intermediate_size", "dense_intermediate_size", "intermediate_size",
       "n_inner", "hidden_dim", default=None),
    hf(A.HEAD_COUNT, "num_attention_heads", "n_head", "n_heads", default=None),
    hf(A.HEAD_COUNT_KV, "num_key_value_heads", "n_kv_heads", default=None),
    derived(A.CAUSAL, lambda c: False if c.find("is_causal", kind="flag", default=None) is False else None),
    _rope_scaling,
    _rope_theta,
    hf(A.LAYERNORM_RMS_EPS, "rms_norm_eps", "norm_eps", kind="number", default=None),
    hf(A.LAYERNORM_EPS, "layer_norm_eps", "layer_norm_epsilon", "norm_epsilon", kind="number", default=None),
    hf(L.EXPERT_COUNT, "num_local_experts", "num_experts", "n_routed_experts", kind="size", default=None),
    hf(L.EXPERT_USED_COUNT, "num_experts_per_tok", "num_experts_per_token", "top_k_experts", kind="size",
       default=None),
    hf(L.EXPERT_GROUP_COUNT, "n_group", kind="size", default=None),
    hf(L.EXPERT_GROUP_USED_COUNT, "topk_group", kind="size", default=None),
    derived(L.EXPERT_GATING_FUNC, _gating),
)


def _head_dim_keys(c: Config) -> Mapping[str, Any]:
    d = c.find("head_dim", default=None)
    return {} if d is None else {A.KEY_LENGTH: d, A.VALUE_LENGTH: d}


TEXT = TEXT_BASE + (_head_dim_keys,)
VOCAB = hf(L.VOCAB_SIZE, "vocab_size")


def pooling_rule(c: Config) -> Mapping[str, Any]:
    pooling = sentence_pooling(c.path.parent)
    return {} if pooling is None else {L.POOLING_TYPE: int(pooling)}


# ---- tensors the converter writes beyond the required ones (regexes over GGUF names) ------------------------

Include = Callable[[Config], str]  # what a family's converter writes beyond the required tensors (a regex)


def _mxfp4(c: Config) -> bool:
    """Whether the checkpoint's experts are MXFP4 blocks, which the converter repacks rather than converts."""
    q = c.find("quantization_config", kind="map", default={})
    return q.get("quant_method") == "mxfp4"


def _none(c: Config) -> str:
    return ""


# ---- the table --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Family:
    """How the converter turns one Hugging Face architecture into GGUF metadata."""

    arch: str  # GGUF general.architecture
    rules: tuple[Rule, ...]
    defaults: Mapping[str, Any] = field(default_factory=dict)  # the transformers config class's (tie_word_embeddings)
    include: Include = _none  # optional tensors the converter writes
    pad_vocab: int = 1  # the vocabulary is padded to a multiple of this (Mamba: 8, Mamba-2: 16) ...
    pad_vocab_key: str = ""  # ... unless the config says otherwise under this key
    tie_drops_head: bool = False  # a tied config's LM head is dropped (DeepSeek-V2; Mamba's, equal to the embedding)
    mxfp4: str = ""  # tensors written in MXFP4 when the checkpoint holds them so (quantization_config)
    squeezed: str = ""  # tensors written without their trailing dimensions of 1 (Preset.squeezed)
    other_shape: str = ""  # tensors written in the family's other shape (Preset.other_shape)
    # the architecture, where the converter picks it by the config (XLM-RoBERTa with LoRA adaptations: jina-bert-v3),
    # and the others than ``arch`` it may pick
    arch_of: Callable[[Config], str] | None = None
    other_archs: tuple[str, ...] = ()


# Hugging Face architecture name -> its family: the family modules (graphir.arch) register theirs with
# :func:`register` when they are imported; :func:`families` imports them all before a lookup.
FAMILIES: dict[str, Family] = {}


def register(family: Family, *names: str) -> None:
    """Record that the converter turns each Hugging Face architecture of ``names`` into ``family``."""
    for name in names:
        FAMILIES[name] = family


def families() -> dict[str, Family]:
    """Every registered mapping, after importing every family module."""
    discover()
    return FAMILIES


def supported() -> list[str]:
    return sorted(families())


# ---- reading ----------------------------------------------------------------------------------------------


def read_config(path: Path) -> dict[str, Any]:
    """config.json as a JSON object (a one-line CheckpointError for a missing, unreadable or other file)."""
    if not path.exists():
        raise CheckpointError(f"{path}: not found (not a Hugging Face model directory)")
    doc = read_json(path)
    if not isinstance(doc, dict):
        raise CheckpointError(f"{path}: not a model config (a JSON object)")
    return doc


def architecture(path: Path, doc: Mapping[str, Any]) -> str:
    """The Hugging Face architecture the converter picks: ``architectures[0]`` (a ``text_config``'s first), or a
    mamba_ssm config's ``ssm_cfg.layer`` + ForCausalLM."""
    text = doc.get("text_config")
    archs = text.get("architectures") if isinstance(text, dict) and text.get("architectures") else \
        doc.get("architectures")
    if isinstance(archs, list) and archs and isinstance(archs[0], str):
        return archs[0]
    ssm = doc.get("ssm_cfg")
    if archs is None and isinstance(ssm, dict):
        layer = ssm.get("layer", "Mamba")
        return f"{layer}ForCausalLM" if isinstance(layer, str) else ""
    raise CheckpointError(f"{path}: missing key 'architectures' (a list naming the model class, e.g. "
                          f"LlamaForCausalLM)" if archs is None else f"{path}: architectures must be a list of "
                          f"model class names, not {clip(archs)}")


def family(path: Path, doc: Mapping[str, Any]) -> tuple[str, Family]:
    name = architecture(path, doc)
    fam = families().get(name)
    if fam is None:
        raise CheckpointError(f"{path}: architecture '{name}' is not supported (supported: {', '.join(supported())})")
    return name, fam


def gguf_keys(path: Path, doc: Mapping[str, Any], fam: Family) -> dict[str, Any]:
    """The ``<arch>.*`` key templates (and tokenizer.ggml.token_type_count) the converter writes for this config,
    with ``vocab_size``, padded as the family pads its token list."""
    c = Config(path, doc, fam.defaults)
    keys: dict[str, Any] = {}
    for rule in fam.rules:
        keys.update(rule(c))
    if L.VOCAB_SIZE not in keys:
        keys[L.VOCAB_SIZE] = c.find("vocab_size")
    pad = c.find(fam.pad_vocab_key, default=fam.pad_vocab) if fam.pad_vocab_key else fam.pad_vocab
    keys[L.VOCAB_SIZE] = -(keys[L.VOCAB_SIZE] // -pad) * pad
    return keys


def sentence_pooling(model_dir: Path) -> PoolingType | None:
    """The pooling of a sentence-transformers model (its Pooling module's config); None when it has none."""
    modules_path = model_dir / "modules.json"
    if not modules_path.exists():
        return None
    modules = read_json(modules_path)
    if not isinstance(modules, list):
        raise CheckpointError(f"{modules_path}: not a list of modules")
    pooling_dir = next((m.get("path") for m in modules
                        if isinstance(m, dict) and m.get("type") == "sentence_transformers.models.Pooling"), None)
    if not isinstance(pooling_dir, str):
        return None
    path = model_dir / pooling_dir / CONFIG
    cfg = read_json(path)
    if isinstance(cfg, dict):
        for key, kind in _POOLING:
            if cfg.get(key):
                return kind
        if cfg.get("pooling_mode") in _POOLING_MODES:
            return _POOLING_MODES[cfg["pooling_mode"]]
    raise CheckpointError(f"{path}: unsupported pooling (llama.cpp pools by mean, cls or last token)")


_POOLING = (("pooling_mode_mean_tokens", PoolingType.MEAN), ("pooling_mode_cls_token", PoolingType.CLS),
            ("pooling_mode_lasttoken", PoolingType.LAST))
_POOLING_MODES = {"mean": PoolingType.MEAN, "cls": PoolingType.CLS, "lasttoken": PoolingType.LAST}


def _checkpoint(model_dir: Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    """(dtype, shape) of every tensor the safetensors headers of model_dir declare, in the converter's order
    (files sorted, names sorted within each); empty when there are none. No tensor data is read."""

    out: dict[str, tuple[str, tuple[int, ...]]] = {}
    for part in sorted(model_dir.glob("model*.safetensors")):
        out.update((n, (t.dtype, tuple(t.shape))) for n, t in sorted(safetensors_header(part).items()))
    return out


def outtype(tensors: Mapping[str, tuple[str, tuple[int, ...]]]) -> Q:
    """``--outtype auto``: the type of the first BF16 or F16 matrix of the checkpoint, else F16."""
    first = next((dtype for dtype, shape in tensors.values() if len(shape) >= 2 and dtype in ("BF16", "F16")), "F16")
    return Q.BF16 if first == "BF16" else Q.F16


def _has_head(tensors: Mapping[str, Any]) -> bool:
    return any(n.split(".")[-2:-1] in (["lm_head"], ["head"]) and n.endswith(".weight") for n in tensors)


def preset_of(src: str | os.PathLike[str]) -> tuple[Preset, str]:
    """The metadata and type policy of the converted model, as a preset of graphir.model.presets, and the tensors
    (a regex) the converter writes in MXFP4 because the checkpoint holds them so."""
    path = Path(src)
    config = path / CONFIG if path.is_dir() else path
    doc = read_config(config)
    name, fam = family(config, doc)
    keys = gguf_keys(config, doc, fam)
    c = Config(config, doc, fam.defaults)
    tensors = _checkpoint(config.parent)
    tie = c.find("tie_embeddings", "tie_word_embeddings", kind="flag", default=False)  # mamba_ssm's name first
    tied = tie if not tensors or fam.tie_drops_head and tie else not _has_head(tensors)
    preset = Preset(fam.arch_of(c) if fam.arch_of else fam.arch, keys, tied=tied, matrix_type=outtype(tensors),
                    include=fam.include(c), f32=KEEP_F32, source=f"{config} ({name})", squeezed=fam.squeezed,
                    other_shape=fam.other_shape)
    return preset, fam.mxfp4 if fam.mxfp4 and _mxfp4(c) else ""


def converted_type(name: str, shape: tuple[int, ...], dtype: Q, mxfp4: str) -> Q:
    """A tensor's type in the converted file, where it departs from the preset's policy: the converter writes
    every tensor of one dimension in F32, whatever the architecture calls it, and MXFP4 blocks (``mxfp4``: the
    names :func:`preset_of` gives) as they are."""
    return Q.F32 if len(shape) == 1 else Q.MXFP4 if mxfp4 and re.fullmatch(mxfp4, name) else dtype


def is_hf_source(src: str | os.PathLike[str]) -> bool:
    """Whether src names a Hugging Face model: a directory, or a file holding a JSON object that says its
    architecture (``architectures``, ``model_type`` or a mamba_ssm ``ssm_cfg``), not a saved graph."""
    path = Path(src)
    if path.is_dir():
        return True
    try:
        if not path.is_file() or path.stat().st_size > _MAX_CONFIG:
            return False
        data = path.read_bytes()
    except OSError:
        return False
    if not data.lstrip(b" \t\r\n\xef\xbb\xbf").startswith(b"{") or b'"graphir-graph"' in data[:_SNIFF]:
        return False  # not JSON, or a saved graph (its "format" comes first)
    try:
        doc = json.loads(data.decode("utf-8-sig"))
    except (ValueError, RecursionError):
        return False
    return isinstance(doc, dict) and any(k in doc for k in ("architectures", "model_type", "ssm_cfg"))


_SNIFF = 256
_MAX_CONFIG = 16 << 20  # a config is a few kilobytes; a larger JSON file is a saved graph
