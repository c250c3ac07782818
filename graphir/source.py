"""Where a graph comes from on the command line: a GGUF (full or header-only), a Hugging Face model directory
or config.json, a preset, or a saved graph; prefixed with ``llama.cpp:``, the graph llama.cpp itself builds for
such a model (:mod:`graphir.llamacpp`).

A source string is resolved by *content*, never by extension: an existing file starting with the GGUF magic
is a model, one starting with the text form's magic line is a saved text graph; a JSON object is a Hugging Face
config when it names an architecture (``architectures``, ``model_type``), else a saved JSON graph; a directory
is a Hugging Face model (its config.json). Anything else that names no file is looked up as a preset
(case-insensitive). Every
failure is a one-line :class:`~graphir.errors.GraphirError` naming the source as the user spelled it.

Models can be built for any context kind and phase; a saved graph *is* one (context, phase), so asking a
saved graph for a different one is an error rather than a silent mismatch.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Union

from graphir.errors import GraphirError

if TYPE_CHECKING:
    from graphir.graph.ir import Graph
    from graphir.model.meta import ModelMeta

__all__ = ["DEFAULT_PHASE", "sniff", "open_source", "open_model", "open_llamacpp", "load_graph"]

DEFAULT_PHASE = "prefill"

_GGUF_MAGIC = b"GGUF"
_SNIFF_BYTES = 64


def sniff(path: str) -> str | None:
    """What an existing regular file holds: ``gguf``, ``text`` or ``json`` (by its first bytes), else None."""
    from graphir.graph.forms import TEXT_MAGIC

    try:
        with open(path, "rb") as f:
            head = f.read(_SNIFF_BYTES)
    except OSError:
        return None  # let the GGUF reader produce its precise message (directory, permission, ...)
    if head.startswith(_GGUF_MAGIC):
        return "gguf"
    if head.startswith(TEXT_MAGIC.encode()):
        return "text"
    if head.lstrip(b" \t\r\n\xef\xbb\xbf").startswith(b"{"):
        return "json"
    return None


def _read_saved(src: str, kind: str) -> Graph:
    from graphir.graph.forms import from_json, from_text

    try:
        with open(src, "rb") as f:
            data = f.read()
    except OSError as e:
        raise GraphirError(f"{src}: cannot read ({e.strerror or e})") from None
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise GraphirError(f"{src}: saved graph is not valid UTF-8 (at byte {e.start})") from None
    try:
        return from_text(text) if kind == "text" else from_json(text)
    except GraphirError as e:
        raise GraphirError(f"{src}: {e}") from None


def open_source(src: str | os.PathLike[str]) -> Union[ModelMeta, Graph]:
    """A :class:`ModelMeta` for a GGUF path, Hugging Face model directory or config.json, or preset name, or the
    :class:`Graph` a saved graph file holds, or the one llama.cpp builds (``llama.cpp:SRC``)."""
    from graphir.model import hf_config
    from graphir.model.meta import open_model as _open_model

    llama = open_llamacpp(src)
    if llama is not None:  # llama.cpp's graph is a graph, as a saved one is: of its default phase
        from graphir.llamacpp.model import graphs

        return graphs(llama, (DEFAULT_PHASE,))[0]
    src = os.fsdecode(os.fspath(src))
    if not src:
        raise GraphirError("empty source: give a GGUF file, a Hugging Face model directory or config.json, a preset "
                           "name or a saved graph")
    if os.path.isfile(src):
        kind = sniff(src)
        if kind == "text" or kind == "json" and not hf_config.is_hf_source(src):
            return _read_saved(src, kind)
    m = _open_model(src)  # HF config, GGUF reader or preset lookup: all raise one-line GraphirErrors
    m.arch  # resolve the architecture now: an unknown one is an error of this source, not of a later step
    return m


def open_model(src: str | os.PathLike[str], what: str = "this command") -> ModelMeta:
    """Like :func:`open_source`, but a graph (saved, or llama.cpp's) is an error: it has no tensor table or
    metadata."""
    from graphir.llamacpp import strip_prefix
    from graphir.model.meta import ModelMeta

    label = os.fsdecode(os.fspath(src))
    if strip_prefix(label) is not None:
        raise GraphirError(f"{label}: is llama.cpp's graph; {what} needs a GGUF file or a preset")
    m = open_source(src)
    if not isinstance(m, ModelMeta):
        raise GraphirError(f"{label}: is a saved graph; {what} needs a GGUF file or a preset")
    return m


def open_llamacpp(src: str | os.PathLike[str]) -> ModelMeta | None:
    """The model of a ``llama.cpp:SRC`` source (its architecture left to llama.cpp to know), else None."""
    from graphir.llamacpp import strip_prefix

    inner = strip_prefix(os.fsdecode(os.fspath(src)))
    if inner is None:
        return None
    from graphir.llamacpp.reading import require_library
    from graphir.model.meta import open_model as _open_model

    require_library()
    if os.path.isfile(inner) and sniff(inner) in ("text", "json") and not _is_hf(inner):
        raise GraphirError(f"{inner}: is a saved graph; llama.cpp needs a GGUF file, a preset or a Hugging Face "
                           f"config")
    return _open_model(inner)


def _is_hf(src: str) -> bool:
    from graphir.model import hf_config

    return hf_config.is_hf_source(src)


def _check_choice(kind: str, value: str, known: tuple[str, ...] | list[str]) -> None:
    if value not in known:
        raise GraphirError(f"unknown {kind} '{value}' (known: {', '.join(known)})")


def load_graph(src: str | os.PathLike[str], context: str | None = None, phase: str | None = None) -> Graph:
    """The graph of SRC for (context, phase).

    For a GGUF or a preset, ``None`` means the default (``kv``, ``prefill``; a tower's ``encode``). A saved graph
    already is one (context, phase): ``None`` accepts it as saved, and an explicit value must match what it was
    saved with.
    """
    from graphir.model.builder import PHASES
    from graphir.graph.ir import Graph
    from graphir.memory.kinds import KINDS

    if context is not None:
        _check_choice("context", context, list(KINDS))
    if phase is not None:
        _check_choice("phase", phase, PHASES)
    llama = open_llamacpp(src)
    if llama is not None:
        from graphir.llamacpp.model import graphs

        return graphs(llama, (phase or DEFAULT_PHASE,), context)[0]
    m = open_source(src)
    if isinstance(m, Graph):
        label = os.fsdecode(os.fspath(src))
        for key, asked in (("context", context), ("phase", phase)):
            saved = m.meta.get(key)
            if asked is not None and asked != saved:
                raise GraphirError(f"{label}: saved graph has {key} '{saved}', but {key} '{asked}' was asked for")
        return m
    return m.build_graph(context, phase)  # None: the architecture's default context, the model's phase
