"""Saved state: a context's memory (and last outputs), or one sequence of it, as versioned bytes.

After llama.cpp's ``llama_state_*`` / ``llama_state_seq_*`` (§2.12 of the reference), with a self-describing
header and a checksum so that a file from another model, another cache type, or a damaged copy is refused
before anything changes. This module only frames the data: what a memory keeps it writes and reads itself
(``Memory.state_write``/``state_read``, each kind its own section; composites one section per part). All
integers little-endian.

Format version 3::

    magic        8 bytes  b"GIRSTATE"
    version      u32      3
    scope        u32      0 = whole context, 1 = one sequence
    total_len    u64      length of the whole blob, checksum included (detects truncation)
    arch         str      architecture name                        (str = u32 byte length + UTF-8)
    hp_hash      32 bytes SHA-256 of the canonical JSON of the hparams
    hp_json      str      that JSON (to name the differing fields in an error)
    kind         str      memory kind
    seq          i32      scope 1: the saved sequence id; scope 0: -1
    memory       ...      the memory's own section (a cell memory: its layout as JSON, the saved cells'
                          indices and fields, then per served layer the cells' rows; a KV cache of a model
                          with M-RoPE sections keeps each cell's row and column among its fields)
    scope 0 only, the last decode's outputs:
    n_out        u32      output rows;  n_vocab u32;  batch index i64[n_out];  logits f32[n_out * n_vocab]
    n_embd_rows  u32      rows of embeddings (0 when off);  n_embd u32;  embeddings f32[rows * n_embd]
    checksum     32 bytes SHA-256 of every byte before it

Version 2 is read as well: it is version 3 without the cells' rows and columns, which its cells take from their
positions (as a text token's are; graphir.memory.kv). Version 1 (graphir 0.1's first layout, with one
K/V-shaped section for every memory kind) is refused with a StateError that says so: its recurrent sections
carried made-up cache fields, and its cells no layer map.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

from graphir.errors import StateError
from graphir.model.hparams import HParams
from graphir.memory.io import Reader, Writer

MAGIC = b"GIRSTATE"
VERSION = 3
READS = (2, VERSION)  # the versions this graphir loads
SCOPE_CONTEXT, SCOPE_SEQ = 0, 1
_HEAD, _SUM = len(MAGIC) + 16, 32  # magic, version, scope and total length; the checksum


def hparams_json(hp: Any) -> str:
    return json.dumps(hp.as_dict(), sort_keys=True, separators=(",", ":"))


def hparams_hash(hp: Any) -> bytes:
    return hashlib.sha256(hparams_json(hp).encode()).digest()


@dataclass
class Outputs:
    """A context's last outputs as a whole-context state keeps them: the logits rows, which batch index each
    row answers (batch index -> row), and the embeddings (None when the context computes none)."""

    logits: np.ndarray
    row: dict[int, int]
    embd: np.ndarray | None


def _keeping(mem: Any) -> Any:
    if not mem.keeps_cells:
        raise StateError(f"memory kind '{mem.kind}' keeps no state to save or load")
    return mem


def write(hp: HParams, memory: Any, outputs: Outputs | None, seq: int | None = None) -> bytes:
    """The state of a whole context (seq None: its memory and ``outputs``) or of one sequence."""
    mem = _keeping(memory)
    w = Writer()
    w.raw(MAGIC)
    w.u("II", VERSION, SCOPE_CONTEXT if seq is None else SCOPE_SEQ)
    w.u("Q", 0)  # total length, patched below
    w.s(hp.arch)
    w.raw(hparams_hash(hp))
    w.s(hparams_json(hp))
    w.s(mem.kind)
    w.u("i", -1 if seq is None else seq)
    mem.state_write(w, seq)
    if seq is None:
        assert outputs is not None, "a whole-context state holds the outputs"
        logits = outputs.logits
        w.u("II", logits.shape[0], logits.shape[1])
        index = np.full(len(logits), -1, dtype=np.int64)
        for b, r in outputs.row.items():
            index[r] = b
        w.arr(index, np.int64)
        w.arr(logits, np.float32)
        embd = outputs.embd if outputs.embd is not None else np.zeros((0, hp.n_embd), np.float32)
        w.u("II", embd.shape[0], embd.shape[1])
        w.arr(embd, np.float32)
    body = bytearray(b"".join(w.parts))
    struct.pack_into("<Q", body, len(MAGIC) + 8, len(body) + _SUM)
    return bytes(body) + hashlib.sha256(body).digest()


def _read(path: str | os.PathLike[str]) -> bytes:
    """A state file's bytes, no further than its header says they go (and one more, to see that more follow): a
    model file given by mistake is refused after its first bytes, and /dev/zero cannot fill the memory."""
    try:
        with open(path, "rb") as f:
            data = bytearray(f.read(_HEAD))
            whole_head = len(data) == _HEAD and data.startswith(MAGIC)
            total = struct.unpack_from("<Q", data, _HEAD - 8)[0] if whole_head else 0
            while len(data) <= total and (chunk := f.read(min(total + 1 - len(data), 1 << 24))):
                data += chunk
    except OSError as e:
        raise StateError(f"cannot read state file {os.fspath(path)!r}: {e.strerror}") from None
    return bytes(data)


def _open(data: bytes | bytearray | memoryview | str | os.PathLike[str]) -> tuple[Reader, int]:
    """Check the framing (magic, version, length, checksum); a reader at the model identity, and the scope."""
    data = _read(data) if isinstance(data, (str, os.PathLike)) else bytes(data)
    if len(data) < len(MAGIC) or data[:len(MAGIC)] != MAGIC:
        raise StateError("not graphir state data (bad magic)" if len(data) >= len(MAGIC) else
                         f"state data is truncated: {len(data)} bytes, not even a header")
    if len(data) < _HEAD:
        raise StateError(f"state data is truncated: {len(data)} bytes, not even a header")
    version, scope, total = struct.unpack_from("<IIQ", data, len(MAGIC))
    if version == 1:
        raise StateError("state format version 1 is no longer read: it predates memories that save their own "
                         "sections (per-layer caches, composite memories); save the state again")
    if version not in READS:
        raise StateError(f"state format version {version} is not supported (this graphir reads versions "
                         f"{', '.join(map(str, READS))})")
    if len(data) < total:
        raise StateError(f"state data is truncated: {len(data)} of {total} bytes")
    if len(data) > total:
        raise StateError(f"state data goes on after the {total} bytes its header gives")
    if hashlib.sha256(data[:-_SUM]).digest() != data[-_SUM:]:
        raise StateError("state data is corrupt: checksum mismatch")
    if scope not in (SCOPE_CONTEXT, SCOPE_SEQ):
        raise StateError(f"state data is malformed: unknown scope {scope}")
    return Reader(data, len(data) - _SUM, _HEAD, version), scope


def _check_model(hp: HParams, mem: Any, r: Reader) -> int:
    """The saved model and memory kind against this context's; the saved sequence id."""
    arch = r.s("architecture name")
    hp_hash = r.take(32, "hparams hash")
    theirs = r.json("hparams")
    if arch != hp.arch:
        raise StateError(f"state was saved from a '{arch}' model; this model is '{hp.arch}'")
    if hp_hash != hparams_hash(hp):
        ours = hp.as_dict()
        diff = [f"{k}={theirs.get(k)!r} (this model: {ours.get(k)!r})" for k in sorted(set(ours) | set(theirs))
                if theirs.get(k) != ours.get(k)]
        raise StateError("state was saved from a model with different hyperparameters: "
                         + (", ".join(diff) if diff else "hparams hash differs"))
    kind = r.s("memory kind")
    if kind != mem.kind:
        raise StateError(f"state has kind={kind!r}, this context has kind={mem.kind!r}")
    return int(r.u("i", "sequence id"))


def _outputs(r: Reader, hp: HParams, embeddings: bool) -> Outputs:
    """The last decode's outputs as a context keeps them: a row per output token, in batch order."""
    n_out, n_vocab = r.u("II", "output sizes")
    index = r.arr(np.int64, n_out, "output batch indices")
    logits = r.arr(np.float32, n_out * n_vocab, "logits").reshape(n_out, n_vocab)
    n_rows, n_embd = r.u("II", "embedding sizes")
    embd = r.arr(np.float32, n_rows * n_embd, "embeddings").reshape(n_rows, n_embd)
    if n_vocab != hp.n_vocab:
        raise StateError(f"state data is malformed: logits have {n_vocab} columns, n_vocab={hp.n_vocab}")
    if n_out and (index[0] < 0 or (np.diff(index) <= 0).any()):
        raise StateError("state data is malformed: the output rows are not of distinct tokens in batch order")
    if n_embd != hp.n_embd or n_rows not in (0, n_out):
        raise StateError(f"state data is malformed: {n_rows} embeddings of {n_embd} values for {n_out} outputs "
                         f"of n_embd={hp.n_embd}")
    kept = embd if embeddings else None
    return Outputs(logits, {int(b): i for i, b in enumerate(index)}, kept)


def _finish(r: Reader) -> None:
    if r.off != r.end:
        raise StateError(f"state data is malformed: {r.end - r.off} unread bytes before the checksum")


def read(hp: HParams, memory: Any, data: Any, embeddings: bool) -> Outputs:
    """Replace a context's memory with a saved context state; return the saved outputs for the context to
    install (embeddings only if it computes them). Raises StateError, changing nothing, if anything is off."""
    mem = _keeping(memory)
    r, scope = _open(data)
    seq = _check_model(hp, mem, r)
    if scope != SCOPE_CONTEXT:
        raise StateError(f"this is the state of one sequence (seq {seq}): load it with state_seq_load")
    commit = mem.state_read(r, None)
    out = _outputs(r, hp, embeddings)
    _finish(r)
    commit()  # everything checked: now mutate
    return out


def read_seq(hp: HParams, memory: Any, data: Any, dst: int) -> None:
    """Replace sequence ``dst`` of a context's memory with a saved sequence (whatever its saved id was)."""
    mem = _keeping(memory)
    r, scope = _open(data)
    _check_model(hp, mem, r)
    if scope != SCOPE_SEQ:
        raise StateError("this is the state of a whole context: load it with state_load")
    commit = mem.state_read(r, dst)
    _finish(r)
    commit()
