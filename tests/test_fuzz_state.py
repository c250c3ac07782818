"""Saved states under mutation: whatever bytes ``state_load`` / ``state_seq_load`` get, the context either
refuses them with StateError and stays byte-identical (cells, buffers, last logits: conftest.memory_bytes), or,
when the bytes still form a well-formed state, loads one that it can save again and decode from. Never another
exception, a hang, or an allocation the data does not justify.

Every memory kind: kv (unified and per sequence), iswa (test-iswa), recurrent (Mamba), hybrid (test-hybrid) and
cross (T5's decoder), each a context holding two sequences. Per kind and per scope (whole context, one sequence):

- raw: bit flips, truncation at every length, splices of two states: the framing (length, checksum) refuses them;
- resealed: truncation at every length, splices, bit flips, byte overwrites, insertions, deletions and scalar
  fields set to extremes, with the length and checksum recomputed, so that they reach each memory's own parser
  (half of the mutations land where the parser reads a scalar, a string or an array from, found by watching it
  parse the unmutated state);
- crafted: well-framed states holding what no memory writes: hparams or layouts that are not JSON objects or
  nest 100,000 deep, positions beyond llama_pos (int32), pending shifts from below position 0, a recurrent
  sequence in two cells, logits of another width, output rows out of order, embeddings of another width;
- foreign: every other kind's states, the same model with another context size, layout, cache type or number of
  sequences, another model, and a one-sequence state loaded as a whole one and vice versa: all refused.

Random choices come from fixed seeds, so every run tries the same 112,486 cases (most of them the truncations at
every length), in about 15 s on two cores. ``GRAPHIR_FUZZ_SCALE=N`` multiplies the random ones by N: N=50 tries
394,591 mutated states (22 minutes on two cores shared with other work); ``-s`` prints the tally per kind:

    GRAPHIR_FUZZ_SCALE=50 python3 -m pytest -p no:cacheprovider tests/test_fuzz_state.py -s -k mutated
"""

from __future__ import annotations

import hashlib
import os
import struct
import time
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import gguf
import numpy as np
import pytest

import toy_archs  # noqa: F401  (registers test-iswa and test-hybrid)
from conftest import TINY_KEYS, TinyModels, make_tiny_preset, memory_bytes

from graphir.errors import GraphirError, StateError
from graphir.memory.io import Reader
from graphir.model.presets import Preset
from graphir.running import state
from graphir.batch import Batch

K = gguf.Keys
SCALE = int(os.environ.get("GRAPHIR_FUZZ_SCALE", "1"))
HEAD, SUM = 24, 32  # the state's framing: magic, version, scope, total length ... checksum
HANG_S = 30.0  # a case slower than this counts as a hang (the first decode of a kind may compile a K-shift)
SIZES = {"n_ctx": 16, "n_seq_max": 2, "n_ubatch": 8}
SMALL_SSM = {K.SSM.INNER_SIZE: 32, K.SSM.STATE_SIZE: 4}  # small states: truncation at every length stays quick

PRESETS = {
    "llama": make_tiny_preset("llama", tied=False),
    "llama-rope": make_tiny_preset("llama", tied=False, **{K.Rope.FREQ_BASE: 500000.0}),
    "qwen2": make_tiny_preset("qwen2", tied=False),
    "iswa": Preset("test-iswa", {**TINY_KEYS, K.Attention.SLIDING_WINDOW: 4}, tied=False,
                   matrix_type=gguf.GGMLQuantizationType.F32),
    "mamba": make_tiny_preset("mamba", tied=False, **SMALL_SSM),
    "hybrid": Preset("test-hybrid", {**TINY_KEYS, K.LLM.BLOCK_COUNT: 4, K.Attention.HEAD_COUNT_KV: (2, 0, 2, 0),
                                     K.SSM.CONV_KERNEL: 4, K.SSM.TIME_STEP_RANK: 4, **SMALL_SSM}, tied=False,
                     matrix_type=gguf.GGMLQuantizationType.F32),
    "deepseek2": make_tiny_preset("deepseek2", tied=False),
    "deepseek32": make_tiny_preset("deepseek32", tied=False),
    "t5": make_tiny_preset("t5", tied=False, **{K.Attention.HEAD_COUNT_KV: 4, K.Attention.KEY_LENGTH: 16,
                                                K.Attention.VALUE_LENGTH: 16, K.Attention.REL_BUCKETS_COUNT: 32,
                                                K.LLM.DECODER_START_TOKEN_ID: 3, K.Attention.LAYERNORM_EPS: 1e-5}),
}
KINDS = {  # memory kind -> (model, context parameters beyond SIZES)
    "kv": ("llama", {}), "kv-per-seq": ("llama", {"unified": False}), "iswa": ("iswa", {}),
    "recurrent": ("mamba", {}), "hybrid": ("hybrid", {}), "cross": ("t5", {}), "mla": ("deepseek2", {}),
    "kv_dsa": ("deepseek32", {}),
}
VARIANTS = [{"n_ctx": 32}, {"n_seq_max": 3}, {"type_k": "f32", "type_v": "f32"}, {"unified": False}]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> TinyModels:
    return TinyModels(tmp_path_factory.mktemp("fuzz-state"), PRESETS)


def filled(tiny: TinyModels, model: str, seed: int, **kw: Any) -> Any:
    """A context of ``model`` holding two sequences of random tokens (encoded first where there is an encoder)."""
    m = tiny.model(model)
    ctx = m.new_context(**{**SIZES, **kw})
    tokens = np.random.default_rng(seed).integers(4, 256, 20).tolist()
    if hasattr(ctx, "encode"):
        ctx.encode(Batch(tokens[12:20], None, [(0,)] * 5 + [(1,)] * 3, [True] * 8))
    ctx.decode(Batch(tokens[:8], None, [(0,)] * 5 + [(1,)] * 3, [False] * 4 + [True] + [False] * 2 + [True]))
    return ctx


def seal(body: bytes) -> bytes:
    """State bytes with their total length and checksum made right again, so that only the parser can object."""
    b = bytearray(body)
    struct.pack_into("<Q", b, 16, len(b) + SUM)
    return bytes(b) + hashlib.sha256(b).digest()


@contextmanager
def reads() -> Iterator[list[int]]:
    """The offsets at which state parsing reads something: a scalar, a string's length, an array's start."""
    seen: list[int] = []
    take = Reader.take

    def watched(self: Reader, n: int, what: str) -> bytes:
        if n > 0:
            seen.append(self.off)
        return take(self, n, what)

    Reader.take = watched  # type: ignore[method-assign]
    try:
        yield seen
    finally:
        Reader.take = take  # type: ignore[method-assign]


@dataclass
class Tally:
    """Outcomes by category; examples of the bad ones (anything but a clean refusal or a consistent load)."""

    counts: Counter[tuple[str, str]] = field(default_factory=Counter)
    bad: list[str] = field(default_factory=list)

    def add(self, category: str, outcome: str, case: str) -> None:
        self.counts[category, outcome.split(":")[0]] += 1
        if outcome not in ("refused", "loaded"):
            self.bad.append(f"{category} {case}: {outcome}")

    def summary(self, kind: str) -> str:
        total = sum(self.counts.values())
        rows = [f"  {c:<22} {o:<10} {n}" for (c, o), n in sorted(self.counts.items())]
        return f"{kind}: {total} cases, {len(self.bad)} bad\n" + "\n".join(rows)


class Target:
    """A filled context that states are loaded into, with a twin to check loaded states against."""

    def __init__(self, ctx: Any, twin: Any):
        self.ctx, self.twin = ctx, twin
        self.home = ctx.state_save()  # what the context holds between cases, exactly (loading it sets every byte)
        ctx.state_load(self.home)
        self.home_bytes = memory_bytes(ctx)

    def loaders(self) -> dict[str, Callable[[bytes], None]]:
        return {"whole": self.ctx.state_load, "seq": lambda d: self.ctx.state_seq_load(d, 0)}

    def attempt(self, scope: str, data: bytes, may_load: bool) -> str:
        """Load ``data`` as ``scope``: 'refused' (StateError, nothing changed), 'loaded' (only where ``may_load``,
        and the result is consistent), or what went wrong."""
        t0 = time.perf_counter()
        try:
            self.loaders()[scope](data)
        except StateError:
            moved = memory_bytes(self.ctx) != self.home_bytes
            outcome = "changed: StateError, but the memory moved" if moved else "refused"
        except Exception as e:  # noqa: BLE001 (any other exception is what the fuzzer is looking for)
            outcome = f"crash: {type(e).__name__}: {e}"
        else:
            outcome = self._consistent() if may_load else "accepted: a damaged state loaded"
            self.ctx.state_load(self.home)
        if time.perf_counter() - t0 > HANG_S:
            outcome = f"hang: {time.perf_counter() - t0:.1f} s"
        return outcome

    def _consistent(self) -> str:
        """A loaded state saves and loads again to the same bytes, and the context decodes from it (or refuses
        the token with a GraphirError that changes nothing)."""
        try:
            saved = self.ctx.state_save()
            self.twin.state_load(saved)
            if self.twin.state_save() != saved:
                return "inconsistent: saved, loaded and saved again, the state differs"
            before, last = memory_bytes(self.ctx), self.ctx.memory.seq_pos_max(0)
            try:
                self.ctx.decode(Batch.one(5, seq_id=0))
            except GraphirError:
                if memory_bytes(self.ctx) != before:
                    return "inconsistent: a refused decode changed the memory"
            else:
                if self.ctx.memory.seq_pos_max(0) != last + 1:
                    return f"inconsistent: a token after position {last} went to {self.ctx.memory.seq_pos_max(0)}"
        except Exception as e:  # noqa: BLE001
            return f"crash after loading: {type(e).__name__}: {e}"
        return "loaded"


def mutate(rng: np.random.Generator, body: bytes, scalars: list[int]) -> tuple[str, bytes]:
    """One random change of a state's body (framing included): what was done and the result."""
    b = bytearray(body)
    at = int(rng.choice(scalars)) if scalars and rng.random() < 0.5 else int(rng.integers(0, len(b)))
    how = str(rng.choice(["flip", "byte", "u32", "u64", "insert", "delete", "repeat"]))
    if how == "flip":
        for _ in range(int(rng.integers(1, 4))):
            b[at] ^= 1 << int(rng.integers(0, 8))
            at = min(at + int(rng.integers(0, 3)), len(b) - 1)
    elif how == "byte":
        b[at] = int(rng.integers(0, 256))
    elif how in ("u32", "u64"):
        size = 4 if how == "u32" else 8
        extremes = [0, 1, 2**31 - 1, 2**31, 2**32 - 1, 2**63, 2**64 - 1, int(rng.integers(2, 300))]
        fits = [e for e in extremes if e < 2 ** (8 * size)]
        v = fits[int(rng.integers(0, len(fits)))]
        b[at:at + size] = v.to_bytes(size, "little")
    elif how == "insert":
        b[at:at] = rng.integers(0, 256, int(rng.integers(1, 9)), dtype=np.uint8).tobytes()
    elif how == "delete":
        del b[at:at + int(rng.integers(1, 9))]
    else:
        n = int(rng.integers(1, 33))
        b[at:at] = b[at:at + n]
    return f"{how}@{at}", bytes(b)


@pytest.fixture(scope="module")
def states(tiny: TinyModels) -> dict[str, dict[str, bytes]]:
    """Per kind, its source context's whole state and its sequence 1's state."""
    out = {}
    for kind, (model, kw) in KINDS.items():
        src = filled(tiny, model, 1, **kw)
        out[kind] = {"whole": src.state_save(), "seq": src.state_seq_save(1)}
    return out


def foreign(tiny: TinyModels, kind: str, states: dict[str, dict[str, bytes]]) -> list[tuple[str, str, bytes]]:
    """(label, scope loaded as, data) that a context of ``kind`` must refuse."""
    model, kw = KINDS[kind]
    target = filled(tiny, model, 2, **kw)
    out = [(f"{other} {scope}", load_as, data) for other, saved in states.items() if other != kind
           for scope, data in saved.items() for load_as in ("whole", "seq")
           if KINDS[other][0] != model or scope == "whole" or load_as == "whole"]  # kv <-> kv-per-seq seq states fit
    out += [("seq as whole", "whole", states[kind]["seq"]), ("whole as seq", "seq", states[kind]["whole"])]
    for variant in VARIANTS:
        try:
            ctx = filled(tiny, model, 3, **{**kw, **variant})
        except GraphirError:  # e.g. per-sequence layout for a kind without cells per sequence
            continue
        if ctx.memory.layout() != target.memory.layout():
            out.append((f"{variant} whole", "whole", ctx.state_save()))
        if "type_k" in variant and any(k.endswith("type_k") for k in target.memory.layout()):
            out.append((f"{variant} seq", "seq", ctx.state_seq_save(0)))
    if model == "llama":
        for other in ("llama-rope", "qwen2"):
            ctx = filled(tiny, other, 3, **kw)
            out += [(f"{other} whole", "whole", ctx.state_save()), (f"{other} seq", "seq", ctx.state_seq_save(0))]
    return out


def resealed_string(data: bytes, start: bytes, text: str) -> bytes:
    """``data`` with its first length-prefixed string beginning with ``start`` replaced by ``text``, resealed."""
    i = data.index(start)
    (n,) = struct.unpack_from("<I", data, i - 4)
    new = text.encode()
    return seal(data[:i - 4] + struct.pack("<I", len(new)) + new + data[i + n:-SUM])


def cell_parts(mem: Any) -> list[Any]:
    """The parts of a memory whose cells have positions."""
    return [p for p in getattr(mem, "parts", {"": mem}).values() if "pos" in getattr(p, "cell_fields", ())]


def crafted(tiny: TinyModels, kind: str) -> list[tuple[str, str, bytes]]:
    """(label, scope, data): well-framed states of ``kind`` holding what no memory writes."""
    model, kw = KINDS[kind]
    src = filled(tiny, model, 1, **kw)
    out = []
    for label, text in [("hparams not an object", "[]"), ("hparams 100000 deep", "[" * 10**5 + "]" * 10**5)]:
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(state, "hparams_json", lambda hp: text)
            out += [(label, "whole", src.state_save()), (label, "seq", src.state_seq_save(1))]
    for label, text in [("layout null", "null"), ("layout a list", "[1]"), ("layout NaN", '{"kind": NaN}'),
                        ("layout 100000 deep", "[" * 10**5 + "]" * 10**5)]:
        out += [(label, scope, resealed_string(data, b'{"kind": ', text))
                for scope, data in (("whole", src.state_save()), ("seq", src.state_seq_save(1)))]
    hp, n_vocab, n_embd = src.model.hparams, src.model.hparams.n_vocab, src.model.hparams.n_embd
    rows = np.zeros((2, n_vocab), np.float32)
    for label, outputs in [("logits of another width", state.Outputs(np.zeros((0, 7), np.float32), {}, None)),
                           ("output rows out of order", state.Outputs(rows, {5: 0, 2: 1}, None)),
                           ("an output row of no token", state.Outputs(rows, {2: 1}, None)),
                           ("embeddings of another width", state.Outputs(rows, {0: 0, 1: 1}, np.zeros((2, 3)))),
                           ("embeddings of other rows", state.Outputs(rows, {0: 0, 1: 1}, np.zeros((3, n_embd))))]:
        out.append((label, "whole", state.write(hp, src.memory, outputs)))
    tampers: dict[str, tuple[str, Callable[[Any], np.ndarray]]] = {  # label: (cell field, its new value)
        "a position beyond llama_pos": ("pos", lambda p: p.pos + 2**40),
        "a shift from below position 0": ("shift", lambda p: p.pos + 1),
        "a sequence in two cells": ("seq", lambda p: p.seq | np.uint64(2)),  # of a recurrent memory
    }
    for label, (name, value) in tampers.items():
        ctx = filled(tiny, model, 1, **kw)
        parts = [p for p in cell_parts(ctx.memory)
                 if name in p.cell_fields and (name != "seq" or p.kind == "recurrent")]
        for p in parts:
            used = p.pos >= 0
            getattr(p, name)[used] = value(p)[used]
        if parts:
            out += [(label, "whole", ctx.state_save()), (label, "seq", ctx.state_seq_save(1))]
    return out


@pytest.mark.parametrize("kind", list(KINDS))
def test_mutated_states_are_refused_or_load_consistently(tiny: TinyModels, states: dict[str, dict[str, bytes]],
                                                          kind: str) -> None:
    model, kw = KINDS[kind]
    target = Target(filled(tiny, model, 2, **kw), filled(tiny, model, 2, **kw))
    rng = np.random.default_rng(list(KINDS).index(kind))
    tally = Tally()
    others = [d for saved in states.values() for d in saved.values()]
    for scope, data in states[kind].items():
        body = data[:-SUM]
        with reads() as scalars:
            target.loaders()[scope](data)
        target.ctx.state_load(target.home)
        assert target.attempt(scope, data, may_load=True) == "loaded"  # the unmutated state loads
        for n in range(len(data)):
            tally.add(f"raw truncation {scope}", target.attempt(scope, data[:n], False), f"at {n}")
        for n in range(HEAD, len(body)):
            tally.add(f"sealed truncation {scope}", target.attempt(scope, seal(body[:n]), False), f"at {n}")
        for _ in range(60 * SCALE):
            bad = bytearray(data)
            at = int(rng.integers(0, len(bad)))
            bad[at] ^= 1 << int(rng.integers(0, 8))
            tally.add(f"raw flip {scope}", target.attempt(scope, bytes(bad), False), f"at {at}")
        for _ in range(300 * SCALE):
            what, bad = mutate(rng, body, scalars)
            tally.add(f"sealed mutation {scope}", target.attempt(scope, seal(bad), True), what)
        for _ in range(60 * SCALE):
            other = others[int(rng.integers(0, len(others)))]
            a, b = int(rng.integers(HEAD, len(body))), int(rng.integers(HEAD, len(other) - SUM))
            spliced, resealed = data[:a] + other[b:], seal(body[:a] + other[b:-SUM])
            tally.add(f"raw splice {scope}", target.attempt(scope, spliced, spliced == data), f"{a}/{b}")
            tally.add(f"sealed splice {scope}", target.attempt(scope, resealed, True), f"{a}/{b}")
    for label, load_as, data in foreign(tiny, kind, states):
        tally.add("foreign", target.attempt(load_as, data, False), f"{label} loaded as {load_as}")
    print(tally.summary(kind))
    assert not tally.bad, "\n".join(tally.bad[:20])


@pytest.mark.parametrize("kind", list(KINDS))
def test_well_framed_states_holding_what_no_memory_writes_are_refused(tiny: TinyModels, kind: str) -> None:
    model, kw = KINDS[kind]
    target = Target(filled(tiny, model, 2, **kw), filled(tiny, model, 2, **kw))
    tally = Tally()
    for label, scope, data in crafted(tiny, kind):
        tally.add("crafted", target.attempt(scope, data, False), f"{label} ({scope})")
    print(tally.summary(kind))
    assert not tally.bad, "\n".join(tally.bad)


def test_a_recurrent_state_of_64_sequences_with_one_in_two_cells_is_refused(tiny: TinyModels) -> None:
    """Sequence sets are uint64 bitmasks: the check that no sequence has two cells must not overflow at bit 63."""
    ctx = tiny.model("mamba").new_context(n_seq_max=64)
    ctx.decode(Batch([7, 8], None, [(0,), (63,)], [True, True]))
    ctx.memory.seq[ctx.memory.pos >= 0] = np.uint64(1 << 63)
    data = ctx.state_save()
    target = tiny.model("mamba").new_context(n_seq_max=64)
    before = memory_bytes(target)
    with pytest.raises(StateError, match="a sequence has more than one recurrent state cell"):
        target.state_load(data)
    assert memory_bytes(target) == before


def test_a_file_is_read_no_further_than_a_state_header_says(tiny: TinyModels, tmp_path: Path) -> None:
    """A model file (or a sparse 64 GiB one) given as a state is refused after its first bytes, /dev/zero too; a
    header that claims 2^62 bytes is a truncated state, read in the memory its bytes take."""
    ctx = filled(tiny, "llama", 2)
    before = memory_bytes(ctx)
    huge, claims, longer = tmp_path / "huge", tmp_path / "claims.state", tmp_path / "longer.state"
    with open(huge, "wb") as f:
        f.truncate(2**36)
    claims.write_bytes(b"GIRSTATE" + struct.pack("<IIQ", 2, 0, 2**62) + bytes(100))
    saved = ctx.state_save()
    longer.write_bytes(saved + b"more")
    cases = [(tiny.path("llama"), r"not graphir state data \(bad magic\)"),
             (huge, r"not graphir state data \(bad magic\)"), ("/dev/zero", r"not graphir state data \(bad magic\)"),
             (claims, f"state data is truncated: 124 of {2**62} bytes"),
             (longer, f"state data goes on after the {len(saved)} bytes its header gives")]
    for path, message in cases:
        with pytest.raises(StateError, match=f"^{message}$"):
            ctx.state_load(path)
        assert memory_bytes(ctx) == before


def test_a_state_holding_a_huge_float_decodes_to_inf_without_a_warning(tiny: TinyModels) -> None:
    """Arithmetic is IEEE's, as ggml's: a value a state brings in that overflows gives inf and NaN, never an
    exception (pytest makes warnings errors). Found with GRAPHIR_FUZZ_SCALE=50: -1.77e38 at element 73 of the
    hybrid's layer-3 SSM state made a multiply in the backend's SwiGLU warn."""
    ctx = filled(tiny, "hybrid", 1)
    ctx.memory.buffers()["blk.3.rs_s"][0, 73] = -1.77e38
    ctx.decode(Batch.one(5, seq_id=0))
    assert ctx.memory.seq_pos_max(0) == 5
