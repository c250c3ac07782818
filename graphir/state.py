"""Saved state: a context's memory (and last outputs), or one sequence of it, as versioned bytes.

After llama.cpp's ``llama_state_*`` / ``llama_state_seq_*`` (§2.12 of the reference), with a self-describing
header and a checksum so that a file from another model, another cache type, or a damaged copy is refused
before anything changes. All integers little-endian.

Format version 1::

    magic        8 bytes  b"GIRSTATE"
    version      u32      1
    scope        u32      0 = whole context, 1 = one sequence
    total_len    u64      length of the whole blob, checksum included (detects truncation)
    arch         str      architecture name                        (str = u32 byte length + UTF-8)
    hp_hash      32 bytes SHA-256 of the canonical JSON of the hparams
    hp_json      str      that JSON (to name the differing fields in an error)
    kind         str      memory kind ("kv" or "recurrent")
    type_k       str      cache types ("f16", "f32")
    type_v       str
    n_ctx        u32      cells per layer
    n_seq_max    u32
    unified      u8       1 unified, 0 one stream per sequence
    n_layer      u32
    k_width      u32      K row width (n_embd_k_gqa) and V row width, in elements (recurrent: the widths of
                          the rolling and the recurrent state rows, n_embd_r and n_embd_s; n_ctx = cells)
    v_width      u32
    seq          i32      scope 1: the saved sequence id; scope 0: -1
    n_cells      u32      non-empty cells saved (scope 1: the cells holding seq), in index order
    cell         i32[n]   cell indices
    pos          i64[n]   positions
    shift        i64[n]   pending position shifts (not yet applied to K)
    seqs         u64[n]   sequence bitmasks (scope 1: 1 << seq)
    per layer:   K rows (n * k_width cache elements), then V rows (n * v_width)
    scope 0 only, the last decode's outputs:
    n_out        u32      output rows;  n_vocab u32;  batch index i64[n_out];  logits f32[n_out * n_vocab]
    n_embd_rows  u32      rows of embeddings (0 when off);  n_embd u32;  embeddings f32[rows * n_embd]
    checksum     32 bytes SHA-256 of every byte before it
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
from graphir.hparams import HParams
from graphir.memory import CellMemory
from graphir.memory.kv import CACHE_DTYPES

MAGIC = b"GIRSTATE"
VERSION = 1
SCOPE_CONTEXT, SCOPE_SEQ = 0, 1
_SUM = 32


def hparams_json(hp: Any) -> str:
    return json.dumps(hp.as_dict(), sort_keys=True, separators=(",", ":"))


def hparams_hash(hp: Any) -> bytes:
    return hashlib.sha256(hparams_json(hp).encode()).digest()


class _Writer:
    def __init__(self) -> None:
        self.parts: list[bytes] = []

    def u(self, fmt: str, *v: Any) -> None:
        self.parts.append(struct.pack("<" + fmt, *v))

    def s(self, text: str) -> None:
        b = text.encode()
        self.u("I", len(b))
        self.parts.append(b)

    def raw(self, b: bytes) -> None:
        self.parts.append(b)

    def arr(self, a: np.ndarray, dtype: Any) -> None:
        self.parts.append(np.ascontiguousarray(a, dtype=np.dtype(dtype).newbyteorder("<")).tobytes())


class _Reader:
    def __init__(self, data: bytes, end: int):
        self.data, self.off, self.end = data, 0, end

    def take(self, n: int, what: str) -> bytes:
        if n < 0 or self.off + n > self.end:
            raise StateError(f"state data is malformed: {what} runs past the end of the data")
        b = self.data[self.off:self.off + n]
        self.off += n
        return b

    def u(self, fmt: str, what: str) -> Any:
        size = struct.calcsize("<" + fmt)
        v = struct.unpack("<" + fmt, self.take(size, what))
        return v[0] if len(v) == 1 else v

    def s(self, what: str) -> str:
        n = self.u("I", what)
        try:
            return self.take(n, what).decode()
        except UnicodeDecodeError:
            raise StateError(f"state data is malformed: {what} is not UTF-8") from None

    def arr(self, dtype: Any, count: int, what: str) -> np.ndarray:
        dt = np.dtype(dtype).newbyteorder("<")
        return np.frombuffer(self.take(count * dt.itemsize, what), dtype=dt).astype(np.dtype(dtype).newbyteorder("="))


@dataclass
class Saved:
    """A parsed, checksum-verified state blob, not yet checked against any context."""

    scope: int
    arch: str
    hp_hash: bytes
    hp_json: str
    layout: dict[str, Any]
    n_layer: int
    k_width: int
    v_width: int
    seq: int
    cell: np.ndarray
    pos: np.ndarray
    shift: np.ndarray
    seqs: np.ndarray
    k_rows: list[np.ndarray]
    v_rows: list[np.ndarray]
    out_index: np.ndarray | None = None
    logits: np.ndarray | None = None
    embd: np.ndarray | None = None


@dataclass
class Outputs:
    """A context's last outputs as a whole-context state keeps them: the logits rows, which batch index each
    row answers (batch index -> row), and the embeddings (None when the context computes none)."""

    logits: np.ndarray
    row: dict[int, int]
    embd: np.ndarray | None


def _memory(mem: Any) -> CellMemory:
    if not mem.keeps_cells:
        raise StateError(f"memory kind '{mem.kind}' keeps no state to save or load")
    return mem


def write(hp: HParams, memory: Any, outputs: Outputs | None, seq: int | None = None) -> bytes:
    """The state of a whole context (seq None: its memory and ``outputs``) or of one sequence's cells."""
    mem = _memory(memory)
    if seq is None:
        sel = np.flatnonzero(mem.pos >= 0)
        seqs = mem.seq[sel]
    else:
        if not 0 <= seq < mem.n_seq_max:
            raise StateError(f"seq id {seq} is outside [0, {mem.n_seq_max})")
        sel = np.flatnonzero((mem.pos >= 0) & mem._holds(seq))
        seqs = np.full(len(sel), 1 << seq, dtype=np.uint64)
    w = _Writer()
    w.raw(MAGIC)
    w.u("II", VERSION, SCOPE_CONTEXT if seq is None else SCOPE_SEQ)
    w.u("Q", 0)  # total length, patched below
    w.s(hp.arch)
    w.raw(hparams_hash(hp))
    w.s(hparams_json(hp))
    lay = mem.layout()
    w.s(lay["kind"])
    w.s(lay["type_k"])
    w.s(lay["type_v"])
    w.u("IIB", lay["n_ctx"], lay["n_seq_max"], int(lay["unified"]))
    k_rows, v_rows = mem.cell_rows(0) if hp.n_layer else (np.zeros((0, 0)), np.zeros((0, 0)))
    w.u("IIIi", hp.n_layer, k_rows.shape[1], v_rows.shape[1], -1 if seq is None else seq)
    w.u("I", len(sel))
    w.arr(sel, np.int32)
    w.arr(mem.pos[sel], np.int64)
    w.arr(mem.shift[sel], np.int64)
    w.arr(seqs, np.uint64)
    for il in range(hp.n_layer):
        for b in mem.cell_rows(il):
            w.arr(b[sel], b.dtype)
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


def parse(data: bytes | bytearray | memoryview | str | os.PathLike[str]) -> Saved:
    """Check framing (magic, version, length, checksum) and decode; raises StateError, changes nothing."""
    if isinstance(data, (str, os.PathLike)):
        try:
            with open(data, "rb") as f:
                data = f.read()
        except OSError as e:
            raise StateError(f"cannot read state file {os.fspath(data)!r}: {e.strerror}") from None
    data = bytes(data)
    head = len(MAGIC) + 16
    if len(data) < len(MAGIC) or data[:len(MAGIC)] != MAGIC:
        raise StateError("not graphir state data (bad magic)" if len(data) >= len(MAGIC) else
                         f"state data is truncated: {len(data)} bytes, not even a header")
    if len(data) < head:
        raise StateError(f"state data is truncated: {len(data)} bytes, not even a header")
    version, scope, total = struct.unpack_from("<IIQ", data, len(MAGIC))
    if version != VERSION:
        raise StateError(f"state format version {version} is not supported (this graphir reads version {VERSION})")
    if len(data) < total:
        raise StateError(f"state data is truncated: {len(data)} of {total} bytes")
    if len(data) > total:
        raise StateError(f"state data has {len(data) - total} unexpected trailing bytes after its {total}")
    if hashlib.sha256(data[:-_SUM]).digest() != data[-_SUM:]:
        raise StateError("state data is corrupt: checksum mismatch")
    if scope not in (SCOPE_CONTEXT, SCOPE_SEQ):
        raise StateError(f"state data is malformed: unknown scope {scope}")
    r = _Reader(data, len(data) - _SUM)
    r.off = head
    arch = r.s("architecture name")
    hp_hash = r.take(32, "hparams hash")
    hp_json = r.s("hparams")
    kind, type_k, type_v = r.s("memory kind"), r.s("type_k"), r.s("type_v")
    n_ctx, n_seq_max, unified = r.u("IIB", "cache sizes")
    n_layer, k_width, v_width, seq = r.u("IIIi", "layer sizes")
    layout = {"kind": kind, "type_k": type_k, "type_v": type_v, "n_ctx": n_ctx, "n_seq_max": n_seq_max,
              "unified": bool(unified)}
    for which, t in (("type_k", type_k), ("type_v", type_v)):
        if t not in CACHE_DTYPES:
            raise StateError(f"state data is malformed: unknown cache type {which}={t!r}")
    n = r.u("I", "cell count")
    cell = r.arr(np.int32, n, "cell indices").astype(np.int64)
    pos = r.arr(np.int64, n, "positions")
    shift = r.arr(np.int64, n, "shifts")
    seqs = r.arr(np.uint64, n, "sequence sets")
    k_rows, v_rows = [], []
    for il in range(n_layer):
        k_rows.append(r.arr(CACHE_DTYPES[type_k], n * k_width, f"layer {il} K rows").reshape(n, k_width))
        v_rows.append(r.arr(CACHE_DTYPES[type_v], n * v_width, f"layer {il} V rows").reshape(n, v_width))
    saved = Saved(scope, arch, hp_hash, hp_json, layout, n_layer, k_width, v_width, seq, cell, pos, shift, seqs,
                  k_rows, v_rows)
    if scope == SCOPE_CONTEXT:
        n_out, n_vocab = r.u("II", "output sizes")
        saved.out_index = r.arr(np.int64, n_out, "output batch indices")
        saved.logits = r.arr(np.float32, n_out * n_vocab, "logits").reshape(n_out, n_vocab)
        n_rows, n_embd = r.u("II", "embedding sizes")
        saved.embd = r.arr(np.float32, n_rows * n_embd, "embeddings").reshape(n_rows, n_embd)
    if r.off != r.end:
        raise StateError(f"state data is malformed: {r.end - r.off} unread bytes before the checksum")
    if (pos < 0).any():
        raise StateError("state data is malformed: a saved cell has a negative position")
    return saved


def _check_model(hp: HParams, mem: CellMemory, s: Saved) -> None:
    if s.arch != hp.arch:
        raise StateError(f"state was saved from a '{s.arch}' model; this model is '{hp.arch}'")
    if s.hp_hash != hparams_hash(hp):
        try:
            theirs = json.loads(s.hp_json)
        except ValueError:
            theirs = {}
        ours = hp.as_dict()
        diff = [f"{k}={theirs.get(k)!r} (this model: {ours.get(k)!r})" for k in sorted(set(ours) | set(theirs))
                if theirs.get(k) != ours.get(k)]
        raise StateError("state was saved from a model with different hyperparameters: "
                         + (", ".join(diff) if diff else "hparams hash differs"))
    widths = tuple(b.shape[1] for b in mem.cell_rows(0)) if hp.n_layer else (0, 0)
    if (s.n_layer, s.k_width, s.v_width) != (hp.n_layer, *widths):
        raise StateError("state data is malformed: layer sizes disagree with its own hyperparameters")


def _check_layout(mem: CellMemory, s: Saved, keys: tuple[str, ...]) -> None:
    ours = mem.layout()
    for k in keys:
        if s.layout[k] != ours[k]:
            raise StateError(f"state has {k}={s.layout[k]!r}, this context has {k}={ours[k]!r}")


def read(hp: HParams, memory: Any, data: Any, embeddings: bool) -> Outputs:
    """Replace a context's memory with a saved context state; return the saved outputs for the context to
    install (embeddings only if it computes them). Raises StateError, changing nothing, if anything is off."""
    s = parse(data)
    if s.scope != SCOPE_CONTEXT:
        raise StateError(f"this is the state of one sequence (seq {s.seq}): load it with state_seq_load")
    mem = _memory(memory)
    _check_model(hp, mem, s)
    _check_layout(mem, s, ("kind", "type_k", "type_v", "n_ctx", "n_seq_max", "unified"))
    n = len(s.cell)
    if n and (s.cell.min() < 0 or s.cell.max() >= len(mem.pos) or len(np.unique(s.cell)) != n):
        raise StateError("state data is malformed: cell indices are out of range or repeated")
    if n and ((s.seqs == 0).any() or (s.seqs >> np.uint64(mem.n_seq_max)).any()):
        raise StateError(f"state data is malformed: a cell has no sequence or one >= n_seq_max={mem.n_seq_max}")
    why = mem.check_saved(s.cell, s.seqs) if n else None
    if why:
        raise StateError(f"state data is malformed: {why}")
    if s.logits is not None and len(s.logits) and s.logits.shape[1] != hp.n_vocab:
        raise StateError(f"state data is malformed: logits have {s.logits.shape[1]} columns, n_vocab={hp.n_vocab}")
    # everything checked: now mutate
    mem.clear(data=True)
    mem.pos[s.cell], mem.seq[s.cell], mem.shift[s.cell] = s.pos, s.seqs, s.shift
    for il in range(hp.n_layer):
        k_buf, v_buf = mem.cell_rows(il)
        k_buf[s.cell], v_buf[s.cell] = s.k_rows[il], s.v_rows[il]
    mem.restored()
    assert s.logits is not None and s.out_index is not None and s.embd is not None
    embd = (s.embd.copy() if len(s.embd) else np.zeros((0, hp.n_embd), np.float32)) if embeddings else None
    return Outputs(s.logits.copy(), {int(b): r for r, b in enumerate(s.out_index) if b >= 0}, embd)


def read_seq(hp: HParams, memory: Any, data: Any, dst: int) -> None:
    """Replace sequence ``dst`` of a context's memory with a saved sequence (whatever its saved id was)."""
    s = parse(data)
    if s.scope != SCOPE_SEQ:
        raise StateError("this is the state of a whole context: load it with state_load")
    mem = _memory(memory)
    _check_model(hp, mem, s)
    _check_layout(mem, s, ("kind", "type_k", "type_v"))
    if not 0 <= dst < mem.n_seq_max:
        raise StateError(f"destination seq id {dst} is outside [0, {mem.n_seq_max})")
    n = len(s.cell)
    lo, hi = mem.cell_range(dst)
    holds = mem._holds(dst)
    free = (mem.pos < 0) | (holds & (mem.seq == np.uint64(1 << dst)))  # dst's own cells are freed first
    free[:lo] = False
    free[hi:] = False
    cells = np.flatnonzero(free)
    if len(cells) < n:
        raise StateError(f"no room for the saved sequence: it has {n} cells, {len(cells)} are free for seq {dst}")
    cells = cells[:n]
    # everything checked: now mutate
    mem.seq_rm(dst, -1, -1)
    mem.pos[cells], mem.shift[cells] = s.pos, s.shift
    mem.seq[cells] = np.uint64(1 << dst)
    for il in range(hp.n_layer):
        k_buf, v_buf = mem.cell_rows(il)
        k_buf[cells], v_buf[cells] = s.k_rows[il], s.v_rows[il]
