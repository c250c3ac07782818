"""Reading llama.cpp's graphs of a model: the file llama.cpp opens, the child process that opens it, the answers.

llama.cpp opens only files, and checks that every tensor's data lies inside the file even when it allocates no
weight; so it gets a *sparse* file: the model's GGUF header (copied from a GGUF, or written for a preset or a
Hugging Face config), then a hole up to where the tensor data would end. Nothing is read from the hole or kept
in memory. The work runs in a child process (:mod:`graphir.llamacpp.reserve`), since llama.cpp aborts its
process on some metadata; its answers are kept for the session, keyed by the header's bytes and the request.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
from typing import TYPE_CHECKING, Any

from graphir.errors import GraphirError
from graphir.model.hparams import POOLING_UNSPECIFIED

if TYPE_CHECKING:
    from graphir.model.meta import ModelMeta

N_CTX = 1024  # the cells of llama.cpp's cache: every n_kv and n_ctx of its graphs
N_UBATCH = 512  # a prompt's graph is one whole ubatch of this many tokens, all of them output
PHASE_SIZES = {"prefill": (N_UBATCH, 1, N_UBATCH), "decode": (1, 1, 1)}  # (n_tokens, n_seqs, n_outputs)
INSTALL = "llama.cpp's graphs need llama-cpp-python 0.3.36 or newer: pip install 'graphir[llamacpp]'"

_answers: dict[str, dict[str, Any]] = {}


def require_library() -> None:
    """A one-line error, before any work, when llama-cpp-python is not installed."""
    if importlib.util.find_spec("llama_cpp") is None:
        raise GraphirError(INSTALL)


def write_header(meta: ModelMeta, path: str) -> None:
    """A GGUF of ``meta``'s metadata and tensor table (as a converter would write them), with a tokenizer of no
    vocabulary when the metadata names none: llama.cpp then sizes the vocabulary by ``<arch>.vocab_size``."""
    import gguf
    import numpy as np

    from graphir.convert import add_key

    arch = meta.arch_name
    md = dict(meta.metadata)
    md.setdefault("tokenizer.ggml.model", "none")
    embd = meta.tensors.get("token_embd.weight")
    if embd is not None and len(embd.shape) == 2:
        md.setdefault(f"{arch}.vocab_size", embd.shape[1])
    w = gguf.GGUFWriter(path, arch)
    for key, value in md.items():
        if key != gguf.Keys.General.ARCHITECTURE:
            add_key(w, key, value)
    for t in meta.tensors.values():
        w.add_tensor_info(t.name, tuple(reversed(t.shape)), np.dtype(np.float32), t.n_bytes, raw_dtype=t.dtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()


def _sparse_model(meta: ModelMeta, directory: str) -> tuple[str, str]:
    """(path of the file llama.cpp opens, digest of its header)."""
    from graphir.files.gguf_file import read_header

    path = os.path.join(directory, "model.gguf")
    if meta.header is not None:
        with open(meta.header.path, "rb") as src, open(path, "wb") as dst:
            dst.write(src.read(meta.header.header_end))
    else:
        write_header(meta, path)
    h = read_header(path)
    end = max([h.data_start] + [h.data_start + t.offset + t.n_bytes for t in h.tensors.values()])
    with open(path, "rb+") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
        f.truncate(end)
    return path, digest


def _cause(stderr: str) -> str:
    """The line of a failed child that says why: its own message, or the assertion llama.cpp aborted on."""
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    for ln in reversed(lines):
        if ln.startswith("graphir-llamacpp: "):
            return ln[len("graphir-llamacpp: "):]
    for ln in reversed(lines):
        m = re.search(r"([\w.-]+:\d+: .*)$", ln)
        if m and ("GGML_ASSERT" in ln or "GGML_ABORT" in ln or "error" in ln.lower()):
            return "aborted at " + m.group(1)
    return lines[-1] if lines else "the process ended without an answer"


def _run(request: dict[str, Any], label: str) -> dict[str, Any]:
    require_library()
    env = dict(os.environ, GGML_NO_BACKTRACE="1")
    p = subprocess.run([sys.executable, "-m", "graphir.llamacpp.reserve", json.dumps(request)],
                       capture_output=True, env=env, text=True)
    if p.returncode < 0 and not p.stderr.strip():  # killed by a signal before a word: a crash of llama.cpp
        raise GraphirError(f"{label}: llama.cpp: crashed ({signal.Signals(-p.returncode).name})")
    if p.returncode != 0:
        raise GraphirError(f"{label}: llama.cpp: {_cause(p.stderr)}")
    return json.loads(p.stdout)


def reserve(meta: ModelMeta, phases: tuple[str, ...]) -> list[list[list[Any]]]:
    """The records of llama.cpp's graph of ``meta`` for each phase (see :mod:`graphir.llamacpp.reserve`)."""
    with tempfile.TemporaryDirectory(prefix="graphir-llamacpp-") as d:
        path, digest = _sparse_model(meta, d)
        # llama.cpp's own saver writes -1 (unspecified) for none; graphir's reading of the family is not asked for
        pooled = meta.metadata.get(f"{meta.arch_name}.pooling_type", 0) not in (0, None, *POOLING_UNSPECIFIED)
        request = {"n_ctx": N_CTX, "n_ubatch": N_UBATCH, "embeddings": pooled,
                   "graphs": [PHASE_SIZES[p] for p in phases]}
        key = digest + json.dumps(request)
        if key not in _answers:
            _answers[key] = _run({**request, "path": path}, meta.label)
    return _answers[key]["graphs"]


def known_archs() -> list[str]:
    """Every architecture name the installed llama.cpp knows, in its own order."""
    key = "archs"
    if key not in _answers:
        _answers[key] = _run({}, "llama.cpp")
    return _answers[key]["archs"]

