"""Specification of graphir.files.gguf_file: header parsing checked against gguf.GGUFReader, strip, and every error message."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf.quants import quantize

import graphir.files.gguf_file as gguf_file
from graphir.errors import GGUFError, GraphirError, MetadataError
from graphir.files.gguf_file import GGUFHeader, TensorInfo, read_header, strip

VT = gguf.GGUFValueType
QT = gguf.GGMLQuantizationType

# --------------------------------------------------------------------------- fixtures


def _write_fixture(path: Path, alignment: int | None = None) -> Path:
    """A small llama GGUF with a key of every value type and tensors of types F32, F16, Q8_0, Q4_K."""
    w = gguf.GGUFWriter(str(path), "llama")
    if alignment is not None:
        w.add_custom_alignment(alignment)
    w.add_block_count(2)
    w.add_uint8("t.u8", 200)
    w.add_int8("t.i8", -100)
    w.add_uint16("t.u16", 60000)
    w.add_int16("t.i16", -30000)
    w.add_uint32("t.u32", 4_000_000_000)
    w.add_int32("t.i32", -2_000_000_000)
    w.add_uint64("t.u64", 2**64 - 1)
    w.add_int64("t.i64", -(2**63))
    w.add_float32("t.f32", 0.1)
    w.add_float64("t.f64", 0.1)
    w.add_bool("t.true", True)
    w.add_bool("t.false", False)
    w.add_string("t.str", "héllo ✓")
    w.add_array("t.strs", ["a", "", "Ġthe", "<|im_end|>", "日本"])
    w.add_array("t.i32s", [1, -2, 3])
    w.add_key_value("t.u8s", [0, 7, 255], VT.ARRAY, sub_type=VT.UINT8)
    w.add_key_value("t.i64s", [-(2**40), 0, 2**62], VT.ARRAY, sub_type=VT.INT64)
    w.add_key_value("t.u64s", [2**64 - 1], VT.ARRAY, sub_type=VT.UINT64)
    w.add_array("t.f32s", [0.5, 0.1, -3.25])
    w.add_key_value("t.f64s", [0.1, 1e300], VT.ARRAY, sub_type=VT.FLOAT64)
    w.add_array("t.bools", [True, False, True])

    rng = np.random.default_rng(0)
    w.add_tensor("a.f32", rng.standard_normal((3, 5)).astype(np.float32))  # numpy (3, 5) -> ne (5, 3)
    w.add_tensor("b.f16", rng.standard_normal(7).astype(np.float16))
    q8 = quantize(rng.standard_normal((4, 64)).astype(np.float32), QT.Q8_0)  # bytes (4, 68)
    w.add_tensor("c.q8_0", q8, raw_dtype=QT.Q8_0)
    w.add_tensor("d.q4_k", np.zeros((2, 144), dtype=np.uint8), raw_dtype=QT.Q4_K)  # two Q4_K blocks per row
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture
def small(tmp_path: Path) -> Path:
    return _write_fixture(tmp_path / "small.gguf")


EXPECTED_METADATA = {
    "general.architecture": "llama",
    "llama.block_count": 2,
    "t.u8": 200,
    "t.i8": -100,
    "t.u16": 60000,
    "t.i16": -30000,
    "t.u32": 4_000_000_000,
    "t.i32": -2_000_000_000,
    "t.u64": 2**64 - 1,
    "t.i64": -(2**63),
    "t.f32": float(np.float32(0.1)),  # the exact float32 value, not 0.1
    "t.f64": 0.1,
    "t.true": True,
    "t.false": False,
    "t.str": "héllo ✓",
    "t.strs": ["a", "", "Ġthe", "<|im_end|>", "日本"],
    "t.i32s": [1, -2, 3],
    "t.u8s": [0, 7, 255],
    "t.i64s": [-(2**40), 0, 2**62],
    "t.u64s": [2**64 - 1],
    "t.f32s": [0.5, float(np.float32(0.1)), -3.25],
    "t.f64s": [0.1, 1e300],
    "t.bools": [True, False, True],
}
EXPECTED_TYPES = {
    "general.architecture": VT.STRING,
    "llama.block_count": VT.UINT32,
    "t.u8": VT.UINT8,
    "t.i8": VT.INT8,
    "t.u16": VT.UINT16,
    "t.i16": VT.INT16,
    "t.u32": VT.UINT32,
    "t.i32": VT.INT32,
    "t.u64": VT.UINT64,
    "t.i64": VT.INT64,
    "t.f32": VT.FLOAT32,
    "t.f64": VT.FLOAT64,
    "t.true": VT.BOOL,
    "t.false": VT.BOOL,
    "t.str": VT.STRING,
    **{k: VT.ARRAY for k in ("t.strs", "t.i32s", "t.u8s", "t.i64s", "t.u64s", "t.f32s", "t.f64s", "t.bools")},
}
EXPECTED_ARRAY_TYPES = {
    "t.strs": VT.STRING,
    "t.i32s": VT.INT32,
    "t.u8s": VT.UINT8,
    "t.i64s": VT.INT64,
    "t.u64s": VT.UINT64,
    "t.f32s": VT.FLOAT32,
    "t.f64s": VT.FLOAT64,
    "t.bools": VT.BOOL,
}
# name -> (ne shape, dtype, n_bytes)
EXPECTED_TENSORS = {
    "a.f32": ((5, 3), QT.F32, 60),
    "b.f16": ((7,), QT.F16, 14),
    "c.q8_0": ((64, 4), QT.Q8_0, 4 * 2 * 34),
    "d.q4_k": ((256, 2), QT.Q4_K, 2 * 144),
}


# --------------------------------------------------------------------------- hand-made GGUF bytes


def _s(text: str | bytes) -> bytes:
    b = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(b)) + b


def _kv(key: str | bytes, vtype: int, payload: bytes) -> bytes:
    return _s(key) + struct.pack("<I", vtype) + payload


def _ti(name: str, shape: tuple[int, ...], ttype: int, offset: int) -> bytes:
    return _s(name) + struct.pack(f"<I{len(shape)}QIQ", len(shape), *shape, ttype, offset)


def _gguf(kvs: list[bytes], tis: list[bytes] = (), version: int = 3) -> bytes:
    return struct.pack("<IIQQ", gguf.GGUF_MAGIC, version, len(tis), len(kvs)) + b"".join(kvs) + b"".join(tis)


ARCH_KV = _kv("general.architecture", VT.STRING, _s("llama"))


def _write(tmp_path: Path, data: bytes, name: str = "x.gguf") -> Path:
    p = tmp_path / name
    p.write_bytes(data)
    return p


def _error(path) -> str:
    with pytest.raises(GGUFError) as ei:
        read_header(path)
    msg = str(ei.value)
    assert "\n" not in msg
    return msg


# --------------------------------------------------------------------------- parsing vs the reference reader


def test_metadata_matches_expectations_and_reference(small: Path):
    h = read_header(small)
    ref = gguf.GGUFReader(small)
    ref_fields = {k: f for k, f in ref.fields.items() if not k.startswith("GGUF.")}

    assert h.metadata == EXPECTED_METADATA
    assert list(h.metadata) == list(EXPECTED_METADATA) == list(ref_fields)  # file order
    assert h.types == EXPECTED_TYPES
    assert h.array_types == EXPECTED_ARRAY_TYPES
    for key, f in ref_fields.items():
        assert h.metadata[key] == f.contents(), key
        assert h.types[key] == f.types[0], key
        if f.types[0] == VT.ARRAY:
            assert h.array_types[key] == f.types[-1], key
    for key, value in h.metadata.items():  # plain python values, never numpy scalars
        items = value if isinstance(value, list) else [value]
        assert all(type(v) in (int, float, bool, str) for v in items), key
    assert type(h.metadata["t.true"]) is bool and type(h.metadata["t.u8"]) is int
    assert h.version == 3 == ref.fields["GGUF.version"].contents()
    assert h.architecture == "llama"
    assert h.path == str(small)


def test_tensors_match_expectations_and_reference(small: Path):
    h = read_header(small)
    ref = gguf.GGUFReader(small)

    assert {n: (t.shape, t.dtype, t.n_bytes) for n, t in h.tensors.items()} == EXPECTED_TENSORS
    assert list(h.tensors) == [t.name for t in ref.tensors] == list(EXPECTED_TENSORS)
    for rt in ref.tensors:
        t = h.tensors[rt.name]
        assert isinstance(t, TensorInfo) and t.name == rt.name
        assert t.shape == tuple(rt.shape.tolist())
        assert t.dtype == rt.tensor_type and isinstance(t.dtype, QT)
        assert h.data_start + t.offset == rt.data_offset
        assert t.n_bytes == rt.n_bytes
    assert [t.offset for t in h.tensors.values()] == [0, 64, 96, 384]  # each padded to 32 bytes
    assert h.alignment == gguf.GGUF_DEFAULT_ALIGNMENT == 32
    assert h.data_start == ref.data_offset
    assert h.data_start % 32 == 0 and h.header_end <= h.data_start < h.header_end + 32
    assert h.file_size == small.stat().st_size
    assert h.header_only is False


def test_custom_alignment(tmp_path: Path):
    p = _write_fixture(tmp_path / "aligned.gguf", alignment=256)
    h = read_header(p)
    ref = gguf.GGUFReader(p)
    assert h.alignment == 256
    assert h.metadata["general.alignment"] == 256 and h.types["general.alignment"] == VT.UINT32
    assert h.data_start == ref.data_offset and h.data_start % 256 == 0
    assert [t.offset for t in h.tensors.values()] == [0, 256, 512, 1024]  # c.q8_0 (272 B) takes two slots
    assert [h.data_start + t.offset for t in h.tensors.values()] == [t.data_offset for t in ref.tensors]


def test_version_2_is_read_like_version_3(small: Path, tmp_path: Path):
    data = bytearray(small.read_bytes())
    data[4:8] = struct.pack("<I", 2)
    p = _write(tmp_path, bytes(data), "v2.gguf")
    h2, h3 = read_header(p), read_header(small)
    assert h2.version == 2
    assert (h2.metadata, h2.types, h2.tensors, h2.data_start) == (h3.metadata, h3.types, h3.tensors, h3.data_start)


def test_accepts_pathlike_and_keeps_path_as_given(small: Path, monkeypatch):
    monkeypatch.chdir(small.parent)
    assert read_header("small.gguf").path == "small.gguf"
    assert read_header(Path("small.gguf")).path == "small.gguf"


def test_empty_arrays_and_no_tensors(tmp_path: Path):
    # GGUFWriter silently drops empty arrays, so write them by hand.
    data = _gguf([ARCH_KV, _kv("e.strs", VT.ARRAY, struct.pack("<IQ", VT.STRING, 0)),
                  _kv("e.ints", VT.ARRAY, struct.pack("<IQ", VT.INT32, 0))])
    h = read_header(_write(tmp_path, data))
    assert h.metadata == {"general.architecture": "llama", "e.strs": [], "e.ints": []}
    assert h.array_types == {"e.strs": VT.STRING, "e.ints": VT.INT32}
    assert h.tensors == {}
    assert h.header_end == len(data) and h.data_start == -(-len(data) // 32) * 32


def test_reads_only_header_bytes(tmp_path: Path, monkeypatch):
    """A header announcing 256 MiB of (sparse) tensor data is parsed reading at most a chunk past the header."""
    p = tmp_path / "big.gguf"
    w = gguf.GGUFWriter(str(p), "llama")
    w.add_tensor_info("huge", (1024, 65536), np.dtype(np.float32), 1024 * 65536 * 4)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()
    header_end = p.stat().st_size
    with open(p, "r+b") as f:
        f.truncate(-(-header_end // 32) * 32 + 1024 * 65536 * 4)

    read_bytes = []

    class Counting:
        def __init__(self, f):
            self._f = f

        def read(self, n=-1):
            b = self._f.read(n)
            read_bytes.append(len(b))
            return b

        def __getattr__(self, name):
            return getattr(self._f, name)

    real_open = open
    monkeypatch.setattr(gguf_file, "open", lambda *a, **k: Counting(real_open(*a, **k)), raising=False)
    h = read_header(p)
    assert h.header_end == header_end and not h.header_only
    assert h.tensors["huge"].shape == (65536, 1024) and h.tensors["huge"].n_bytes == 2**28
    assert header_end <= sum(read_bytes) <= header_end + (1 << 20)


def test_header_repr_is_short(tmp_path: Path):
    p = _write(tmp_path, _gguf([ARCH_KV, _kv("big", VT.ARRAY, struct.pack("<IQ", VT.STRING, 1000) + _s("tok") * 1000)]))
    r = repr(read_header(p))
    assert "tok" not in r and "header_end=" in r


def test_architecture_errors(tmp_path: Path):
    h = read_header(_write(tmp_path, _gguf([]), "noarch.gguf"))
    with pytest.raises(MetadataError, match=r"noarch\.gguf: .*'general\.architecture' is missing"):
        h.architecture
    h = read_header(_write(tmp_path, _gguf([_kv("general.architecture", VT.UINT32, struct.pack("<I", 7))]), "int.gguf"))
    with pytest.raises(MetadataError, match=r"int\.gguf: .*'general\.architecture' is not a string"):
        h.architecture


def test_n_bytes_follows_ggml_quant_sizes():
    assert TensorInfo("w", (576, 576), QT.Q4_1, 0).n_bytes == 576 * 576 // 32 * 20
    assert TensorInfo("w", (576, 49152), QT.Q8_0, 0).n_bytes == 576 * 49152 // 32 * 34
    assert TensorInfo("w", (256, 3), QT.Q4_K, 0).n_bytes == 3 * 144
    assert TensorInfo("w", (10,), QT.BF16, 0).n_bytes == 20
    with pytest.raises(GGUFError, match=r"'w': ne0=100 is not a multiple of the Q8_0 block size 32"):
        TensorInfo("w", (100, 2), QT.Q8_0, 0).n_bytes


# --------------------------------------------------------------------------- strip


def test_strip_writes_header_only_file(small: Path, tmp_path: Path):
    dst = tmp_path / "stripped.gguf"
    full = read_header(small)
    h = strip(small, dst)

    assert dst.read_bytes() == small.read_bytes()[: full.header_end]
    assert isinstance(h, GGUFHeader) and h.path == str(dst)
    assert h.header_only is True and full.header_only is False
    assert h.file_size == full.header_end
    assert (h.metadata, h.types, h.array_types, h.tensors) == (full.metadata, full.types, full.array_types, full.tensors)
    assert (h.version, h.alignment, h.header_end, h.data_start) == (full.version, full.alignment, full.header_end, full.data_start)
    assert read_header(dst) == h
    # The reference reader cannot open a header-only file -- the reason this module exists.
    with pytest.raises(ValueError):
        gguf.GGUFReader(dst)


def test_strip_of_stripped_is_identical(small: Path, tmp_path: Path):
    a, b = tmp_path / "a.gguf", tmp_path / "b.gguf"
    strip(small, a)
    strip(a, b)
    assert a.read_bytes() == b.read_bytes()


def test_strip_refuses_to_overwrite_its_source(small: Path):
    before = small.read_bytes()
    with pytest.raises(GGUFError, match=r"small\.gguf: refusing to strip a file onto itself"):
        strip(small, small)
    assert small.read_bytes() == before


def test_strip_reports_unwritable_destination(small: Path, tmp_path: Path):
    with pytest.raises(GGUFError, match=r"nodir[/\\]out\.gguf: cannot write"):
        strip(small, tmp_path / "nodir" / "out.gguf")


def test_header_only_cut_within_padding_is_fine(small: Path, tmp_path: Path):
    full = read_header(small)
    assert full.header_end % 32 != 0  # precondition: there is padding before the data
    p = _write(tmp_path, small.read_bytes()[: full.data_start - 1], "pad.gguf")
    h = read_header(p)
    assert h.header_only and h.tensors == full.tensors
    p = _write(tmp_path, small.read_bytes()[: full.data_start], "exact.gguf")
    assert read_header(p).header_only


# --------------------------------------------------------------------------- errors


def test_error_is_a_graphir_error():
    assert issubclass(GGUFError, GraphirError)


def test_missing_file(tmp_path: Path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert _error("nope.gguf") == "nope.gguf: no such file"


def test_directory(tmp_path: Path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "d.gguf").mkdir()
    assert _error("d.gguf").startswith("d.gguf: is a directory")


def test_empty_file(tmp_path: Path):
    p = _write(tmp_path, b"", "empty.gguf")
    assert _error(p) == f"{p}: empty file"


def test_not_a_gguf(tmp_path: Path):
    p = _write(tmp_path, b"PK\x03\x04" + bytes(100), "zip.gguf")
    assert _error(p) == f"{p}: not a GGUF file (magic b'PK\\x03\\x04')"
    p = _write(tmp_path, b"hi", "tiny.gguf")
    assert _error(p) == f"{p}: not a GGUF file (magic b'hi')"


def test_cut_inside_fixed_header(small: Path, tmp_path: Path):
    for n in (2, 4, 10, 23):
        p = _write(tmp_path, small.read_bytes()[:n], f"cut{n}.gguf")
        assert _error(p) == f"{p}: truncated inside the file header ({n} of 24 bytes)"


def test_unsupported_versions(small: Path, tmp_path: Path):
    data = bytearray(small.read_bytes())
    data[4:8] = struct.pack("<I", 1)
    p = _write(tmp_path, bytes(data), "v1.gguf")
    assert _error(p) == f"{p}: unsupported GGUF version 1 (supported: 2, 3)"
    data[4:8] = struct.pack(">I", 3)
    p = _write(tmp_path, bytes(data), "be.gguf")
    assert _error(p) == f"{p}: big-endian GGUF (version 3) is not supported"


def _cuts(small: Path):
    """Cut points inside the fixture, located with the reference reader, and the message each must produce."""
    ref = gguf.GGUFReader(small)
    keys = [k for k in ref.fields if not k.startswith("GGUF.")]
    n_kv = len(keys)
    off = {k: ref.fields[k].offset for k in keys}
    nk = lambda k: f"key {keys.index(k) + 1} of {n_kv}"  # noqa: E731
    key_len = lambda k: 8 + len(k.encode())  # noqa: E731
    tis = [t.field.offset for t in ref.tensors]
    names = [t.name for t in ref.tensors]
    return [
        # inside the first key's length / name: the key name is not known yet
        (off[keys[0]] + 3, f"truncated inside metadata ({nk(keys[0])})"),
        (off["t.u32"] + 10, f"truncated inside metadata ({nk('t.u32')})"),
        # key read, value type or value cut
        (off["t.u32"] + key_len("t.u32") + 2, f"truncated inside metadata ({nk('t.u32')}, 't.u32')"),
        (off["t.u64"] + key_len("t.u64") + 4 + 5, f"truncated inside metadata ({nk('t.u64')}, 't.u64')"),
        (off["t.str"] + key_len("t.str") + 4 + 8 + 2, f"truncated inside metadata ({nk('t.str')}, 't.str')"),
        # inside arrays: element type, count, string elements, numeric elements
        (off["t.strs"] + key_len("t.strs") + 4 + 2, f"truncated inside metadata ({nk('t.strs')}, 't.strs')"),
        (off["t.strs"] + key_len("t.strs") + 4 + 4 + 8 + 8 + 1, f"truncated inside metadata ({nk('t.strs')}, 't.strs')"),
        (off["t.f64s"] + key_len("t.f64s") + 4 + 12 + 9, f"truncated inside metadata ({nk('t.f64s')}, 't.f64s')"),
        (off[keys[-1]] + key_len(keys[-1]) + 4 + 12 + 1, f"truncated inside metadata ({nk(keys[-1])}, '{keys[-1]}')"),
        # tensor infos
        (tis[0], "truncated inside tensor infos (tensor 1 of 4)"),
        (tis[1] + 5, "truncated inside tensor infos (tensor 2 of 4)"),
        (tis[1] + 8 + len(names[1]) + 2, f"truncated inside tensor infos (tensor 2 of 4, '{names[1]}')"),
        (tis[3] + 8 + len(names[3]) + 4 + 8, f"truncated inside tensor infos (tensor 4 of 4, '{names[3]}')"),
    ]


def test_cut_inside_metadata_and_tensor_infos(small: Path, tmp_path: Path):
    data = small.read_bytes()
    cuts = _cuts(small)
    assert len(cuts) == 13
    for i, (n, what) in enumerate(cuts):
        p = _write(tmp_path, data[:n], f"cut{i}.gguf")
        assert _error(p) == f"{p}: {what}", n


def test_cut_inside_tensor_data(small: Path, tmp_path: Path):
    data = small.read_bytes()
    h = read_header(small)
    first, last = h.tensors["a.f32"], h.tensors["d.q4_k"]
    end_first = h.data_start + first.offset + first.n_bytes
    end_last = h.data_start + last.offset + last.n_bytes
    p = _write(tmp_path, data[: h.data_start + 1], "cut_first.gguf")
    assert _error(p) == f"{p}: tensor data truncated: 'a.f32' ends at byte {end_first} but the file has {h.data_start + 1} bytes"
    p = _write(tmp_path, data[: end_last - 1], "cut_last.gguf")
    assert _error(p) == f"{p}: tensor data truncated: 'd.q4_k' ends at byte {end_last} but the file has {end_last - 1} bytes"
    # the trailing padding after the last tensor is not data
    assert not read_header(_write(tmp_path, data[:end_last], "no_tail_pad.gguf")).header_only


def test_unknown_value_type(tmp_path: Path):
    p = _write(tmp_path, _gguf([ARCH_KV, _kv("odd", 99, b"\0" * 8)]))
    assert _error(p) == f"{p}: unknown value type id 99 for key 'odd'"
    p = _write(tmp_path, _gguf([ARCH_KV, _kv("odd", VT.ARRAY, struct.pack("<IQ", 42, 1))]), "arr.gguf")
    assert _error(p) == f"{p}: unknown value type id 42 for the elements of 'odd'"


def test_nested_array_rejected(tmp_path: Path):
    p = _write(tmp_path, _gguf([_kv("nest", VT.ARRAY, struct.pack("<IQ", VT.ARRAY, 1) + struct.pack("<IQ", VT.INT32, 0))]))
    assert _error(p) == f"{p}: 'nest' is a nested array, which is not supported"


def test_unknown_tensor_type(tmp_path: Path):
    p = _write(tmp_path, _gguf([ARCH_KV], [_ti("w", (4, 4), 200, 0)]))
    assert _error(p) == f"{p}: tensor 'w' has unknown ggml type id 200"


def test_duplicate_key(tmp_path: Path):
    p = _write(tmp_path, _gguf([ARCH_KV, _kv("k", VT.UINT32, b"\1\0\0\0"), _kv("k", VT.INT8, b"\2")]))
    assert _error(p) == f"{p}: duplicate metadata key 'k' (key 3 of 3)"


def test_duplicate_tensor_name(tmp_path: Path):
    p = _write(tmp_path, _gguf([ARCH_KV], [_ti("w", (4,), QT.F32, 0), _ti("w", (4,), QT.F32, 32)]))
    assert _error(p) == f"{p}: duplicate tensor name 'w' (tensor 2 of 2)"


def test_bad_tensor_shapes(tmp_path: Path):
    p = _write(tmp_path, _gguf([ARCH_KV], [_ti("w", (1, 1, 1, 1, 1), QT.F32, 0)]), "dims.gguf")
    assert _error(p) == f"{p}: tensor 'w' has 5 dimensions (at most 4)"
    p = _write(tmp_path, _gguf([ARCH_KV], [_ti("q", (100, 2), QT.Q8_0, 0)]), "block.gguf")
    assert _error(p) == f"{p}: tensor 'q' has ne0=100, not a multiple of the Q8_0 block size 32"
    p = _write(tmp_path, _gguf([ARCH_KV], [_ti("n", (2**64 - 1,), QT.F32, 0)]), "neg.gguf")
    assert _error(p).startswith(f"{p}: tensor 'n' has a negative dimension")


def test_bad_alignment(tmp_path: Path):
    p = _write(tmp_path, _gguf([ARCH_KV, _kv("general.alignment", VT.UINT32, struct.pack("<I", 48))]), "a48.gguf")
    assert _error(p) == f"{p}: 'general.alignment' must be a UINT32 power of two, got 48"
    p = _write(tmp_path, _gguf([ARCH_KV, _kv("general.alignment", VT.UINT64, struct.pack("<Q", 64))]), "a64.gguf")
    assert _error(p) == f"{p}: 'general.alignment' must be a UINT32 power of two, got type UINT64"


def test_invalid_utf8(tmp_path: Path):
    p = _write(tmp_path, _gguf([ARCH_KV, _kv(b"k\xff", VT.UINT8, b"\0")]), "key.gguf")
    assert _error(p).startswith(f"{p}: key 2 of 2 is not valid UTF-8")
    p = _write(tmp_path, _gguf([ARCH_KV, _kv("toks", VT.ARRAY, struct.pack("<IQ", VT.STRING, 3) + _s("a") + _s("b") + _s(b"\xc3"))]), "arr.gguf")
    assert _error(p).startswith(f"{p}: element 2 of 'toks' is not valid UTF-8")
    p = _write(tmp_path, _gguf([ARCH_KV], [_s(b"\xfe") + struct.pack("<IQIQ", 1, 4, QT.F32, 0)]), "ten.gguf")
    assert _error(p).startswith(f"{p}: the name of tensor 1 of 1 is not valid UTF-8")


def test_absurd_counts_are_truncation_not_crashes(tmp_path: Path):
    p = _write(tmp_path, _gguf([ARCH_KV, _kv("toks", VT.ARRAY, struct.pack("<IQ", VT.STRING, 2**62))]), "s.gguf")
    assert _error(p) == f"{p}: truncated inside metadata (key 2 of 2, 'toks')"
    p = _write(tmp_path, _gguf([ARCH_KV, _kv("ints", VT.ARRAY, struct.pack("<IQ", VT.INT64, 2**62))]), "i.gguf")
    assert _error(p) == f"{p}: truncated inside metadata (key 2 of 2, 'ints')"
    p = _write(tmp_path, _gguf([ARCH_KV, _kv("s", VT.STRING, struct.pack("<Q", 2**63))]), "l.gguf")
    assert _error(p) == f"{p}: truncated inside metadata (key 2 of 2, 's')"
    data = struct.pack("<IIQQ", gguf.GGUF_MAGIC, 3, 0, 2**64 - 1) + ARCH_KV
    p = _write(tmp_path, data, "n.gguf")
    assert _error(p) == f"{p}: truncated inside metadata (key 2 of {2**64 - 1})"


# --------------------------------------------------------------------------- the real SmolLM2 GGUF

@pytest.fixture(scope="module")
def smol(smollm2_gguf: Path) -> Path:
    return smollm2_gguf


def test_smollm2_header(smol: Path):
    h = read_header(smol)
    assert h.architecture == "llama"
    assert h.version == 3
    assert len(h.tensors) == 272
    assert h.metadata["llama.block_count"] == 30
    assert h.metadata["llama.embedding_length"] == 576
    assert len(h.metadata["tokenizer.ggml.tokens"]) == 49152
    assert len(h.metadata["tokenizer.ggml.merges"]) == 48900
    assert h.array_types["tokenizer.ggml.tokens"] == VT.STRING
    tt = h.metadata["tokenizer.ggml.token_type"]
    assert isinstance(tt, list) and len(tt) == 49152 and h.array_types["tokenizer.ggml.token_type"] == VT.INT32
    assert h.tensors["token_embd.weight"].shape == (576, 49152)
    assert h.tensors["token_embd.weight"].dtype == QT.Q8_0
    assert h.tensors["blk.0.attn_q.weight"].shape == (576, 576)
    assert h.tensors["blk.0.attn_q.weight"].dtype == QT.Q4_1
    assert "output.weight" not in h.tensors  # tied embeddings
    assert not h.header_only
    assert h.file_size == smol.stat().st_size


def test_smollm2_matches_reference_reader(smol: Path):
    h = read_header(smol)
    ref = gguf.GGUFReader(smol)
    fields = {k: f for k, f in ref.fields.items() if not k.startswith("GGUF.")}
    assert list(h.metadata) == list(fields)
    for k, f in fields.items():
        assert h.metadata[k] == f.contents(), k
        assert h.types[k] == f.types[0], k
    assert h.data_start == ref.data_offset
    assert [(t.name, t.shape, t.dtype, h.data_start + t.offset, t.n_bytes) for t in h.tensors.values()] == [
        (t.name, tuple(t.shape.tolist()), t.tensor_type, t.data_offset, t.n_bytes) for t in ref.tensors
    ]


def test_smollm2_strip(smol: Path, tmp_path: Path):
    full = read_header(smol)
    dst = tmp_path / "smol-header.gguf"
    h = strip(smol, dst)
    assert h.header_only and dst.stat().st_size == full.header_end
    with open(smol, "rb") as f:
        assert dst.read_bytes() == f.read(full.header_end)
    assert (h.metadata, h.types, h.array_types, h.tensors) == (full.metadata, full.types, full.array_types, full.tensors)
    assert (h.alignment, h.header_end, h.data_start) == (full.alignment, full.header_end, full.data_start)


# --------------------------------------------------------------------------- robustness


def test_every_prefix_is_an_error_or_header_only(small: Path, tmp_path: Path):
    data = small.read_bytes()
    full = read_header(small)
    p = tmp_path / "prefix.gguf"
    for n in range(full.data_start + 1):
        p.write_bytes(data[:n])
        if n < full.header_end:
            msg = _error(p)
            assert msg.startswith(f"{p}: ") and ("truncated" in msg or msg.endswith("empty file")), (n, msg)
        else:
            h = read_header(p)
            assert h.header_only and h.tensors == full.tensors and h.metadata == full.metadata


def test_corrupted_bytes_raise_only_gguf_error(small: Path, tmp_path: Path):
    data = small.read_bytes()
    header_end = read_header(small).header_end
    rng = np.random.default_rng(1234)
    p = tmp_path / "fuzz.gguf"
    for _ in range(1500):
        buf = bytearray(data)
        for i in rng.integers(4, header_end, size=int(rng.integers(1, 4))):
            buf[i] = int(rng.integers(0, 256))
        p.write_bytes(bytes(buf))
        try:
            read_header(p)
        except GGUFError as e:
            assert str(e).startswith(f"{p}: ") and "\n" not in str(e)
