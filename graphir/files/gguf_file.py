"""Read the header of a GGUF file (metadata + tensor infos) without touching tensor data, and write header-only GGUFs.

Why our own reader: building a graph only needs the header, and `gguf.GGUFReader`
(a) memory-maps the whole file and parses element by element (seconds for a real
vocabulary), and (b) refuses a *header-only* file -- a GGUF cut right after its
tensor-info section -- which is exactly what we ship as a weightless test fixture
(see `strip`). This reader reads only the header bytes with plain buffered reads,
decodes numeric arrays with numpy in one go, and reports every malformation as a
one-line `GGUFError` naming the file and what is wrong.

Layout (versions 2 and 3, little-endian; all counts and string lengths are uint64):
    magic "GGUF" | u32 version | u64 n_tensors | u64 n_kv
    n_kv x (string key | u32 value type | value)
    n_tensors x (string name | u32 n_dims | n_dims x u64 ne | u32 ggml type | u64 offset)
    padding up to `general.alignment` | tensor data (offsets are relative to its start)
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass, field

import gguf
import numpy as np

from graphir.errors import GGUFError, MetadataError
from graphir.files.atomic import atomic_open

__all__ = ["TensorInfo", "GGUFHeader", "read_header", "strip"]

_VT = gguf.GGUFValueType
_QT = gguf.GGMLQuantizationType

SUPPORTED_VERSIONS = (2, 3)
# ggml's GGML_MAX_DIMS: a tensor info with more dimensions is corrupt, not exotic.
_MAX_DIMS = 4
# Bytes pulled from the file per refill. Reading never goes further than this past
# the end of what the header needs, so tensor data is (almost) never read.
_CHUNK = 1 << 18

# struct format / numpy dtype of each fixed-size GGUF value type (all little-endian).
_SCALAR_FMT: dict[_VT, struct.Struct] = {
    _VT.UINT8: struct.Struct("<B"),
    _VT.INT8: struct.Struct("<b"),
    _VT.UINT16: struct.Struct("<H"),
    _VT.INT16: struct.Struct("<h"),
    _VT.UINT32: struct.Struct("<I"),
    _VT.INT32: struct.Struct("<i"),
    _VT.FLOAT32: struct.Struct("<f"),
    _VT.BOOL: struct.Struct("<B"),  # decoded as `!= 0`
    _VT.UINT64: struct.Struct("<Q"),
    _VT.INT64: struct.Struct("<q"),
    _VT.FLOAT64: struct.Struct("<d"),
}
_NP_DTYPE: dict[_VT, np.dtype] = {
    _VT.UINT8: np.dtype("<u1"),
    _VT.INT8: np.dtype("<i1"),
    _VT.UINT16: np.dtype("<u2"),
    _VT.INT16: np.dtype("<i2"),
    _VT.UINT32: np.dtype("<u4"),
    _VT.INT32: np.dtype("<i4"),
    _VT.FLOAT32: np.dtype("<f4"),
    _VT.BOOL: np.dtype("<u1"),
    _VT.UINT64: np.dtype("<u8"),
    _VT.INT64: np.dtype("<i8"),
    _VT.FLOAT64: np.dtype("<f8"),
}
_VALUE_TYPES: dict[int, _VT] = {int(t): t for t in _VT}
_TENSOR_TYPES: dict[int, _QT] = {int(t): t for t in _QT}

_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_FIXED_HEADER = struct.Struct("<4sIQQ")  # magic, version, n_tensors, n_kv
_MAGIC = struct.pack("<I", gguf.GGUF_MAGIC)


@dataclass(frozen=True)
class TensorInfo:
    """One tensor-info record: enough to know a weight's shape, type and place without reading it."""

    name: str
    shape: tuple[int, ...]  # ggml ne order (ne0 = fastest varying), exactly as stored in the file
    dtype: gguf.GGMLQuantizationType
    offset: int  # relative to GGUFHeader.data_start

    @property
    def n_elements(self) -> int:
        """Number of scalar elements (1 for a 0-d tensor), since quantized byte sizes derive from it."""
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def n_bytes(self) -> int:
        """Size of the tensor's data in the file, so data extents can be checked without reading the data."""
        block_size, type_size = gguf.GGML_QUANT_SIZES[self.dtype]
        ne0 = self.shape[0] if self.shape else 1
        if ne0 % block_size:
            raise GGUFError(
                f"tensor {self.name!r}: ne0={ne0} is not a multiple of the {self.dtype.name} block size {block_size}"
            )
        return self.n_elements // block_size * type_size


@dataclass(frozen=True)
class GGUFHeader:
    """Everything in a GGUF except tensor data; also describes a header-only (stripped) file."""

    path: str
    version: int
    metadata: dict[str, object] = field(repr=False)  # key -> value; arrays are lists; file order
    tensors: dict[str, TensorInfo] = field(repr=False)  # name -> info; file order
    alignment: int
    header_end: int  # byte offset where the tensor-info section ends
    data_start: int  # header_end rounded up to `alignment`; tensor offsets are relative to it
    file_size: int
    # The stored value type of each key (ARRAY for arrays) and, for arrays, the element
    # type -- Python values alone lose e.g. UINT32 vs INT64, needed to write metadata back.
    types: dict[str, gguf.GGUFValueType] = field(repr=False)
    array_types: dict[str, gguf.GGUFValueType] = field(repr=False)

    @property
    def header_only(self) -> bool:
        """True when the file holds no tensor data at all (a stripped fixture), so weights must not be loaded."""
        return self.file_size <= self.data_start

    @property
    def architecture(self) -> str:
        """`general.architecture`: selects the graph builder, so its absence is a metadata error."""
        key = gguf.Keys.General.ARCHITECTURE
        arch = self.metadata.get(key)
        if arch is None:
            raise MetadataError(f"{self.path}: metadata key {key!r} is missing")
        if not isinstance(arch, str):
            raise MetadataError(f"{self.path}: metadata key {key!r} is not a string ({arch!r})")
        return arch


class _HeaderReader:
    """Incremental reader: the header is read in chunks into one growing buffer whose indexes are file offsets."""

    __slots__ = ("path", "f", "size", "buf", "where")

    def __init__(self, path: str, f, size: int):
        self.path = path
        self.f = f
        self.size = size
        self.buf = bytearray()
        self.where = "inside the file header"  # what is being read, for truncation messages

    def fail(self, what: str) -> GGUFError:
        return GGUFError(f"{self.path}: {what}")

    def need(self, pos: int, n: int) -> bytearray:
        """Make buf[pos:pos+n] available (reading more of the file) and return the buffer."""
        end = pos + n
        buf = self.buf
        if end <= len(buf):
            return buf
        if end > self.size:
            raise self.fail(f"truncated {self.where}")
        want = min(max(end - len(buf), _CHUNK), self.size - len(buf))
        while want > 0:
            chunk = self.f.read(want)
            if not chunk:  # file shrank under us
                raise self.fail(f"truncated {self.where}")
            buf += chunk
            want -= len(chunk)
        return buf

    def u32(self, pos: int) -> int:
        return _U32.unpack_from(self.need(pos, 4), pos)[0]

    def u64(self, pos: int) -> int:
        return _U64.unpack_from(self.need(pos, 8), pos)[0]

    def string(self, pos: int, what: str) -> tuple[str, int]:
        n = self.u64(pos)
        pos += 8
        buf = self.need(pos, n)
        try:
            return buf[pos : pos + n].decode("utf-8"), pos + n
        except UnicodeDecodeError:
            raise self.fail(f"{what} is not valid UTF-8 (at byte {pos})") from None

    def value_type(self, pos: int, what: str) -> _VT:
        raw = self.u32(pos)
        vt = _VALUE_TYPES.get(raw)
        if vt is None:
            raise self.fail(f"unknown value type id {raw} for {what}")
        return vt

    def value(self, pos: int, vt: _VT, key: str) -> tuple[object, int]:
        """Read one non-array value of type vt at pos; return (value, next pos)."""
        if vt is _VT.STRING:
            return self.string(pos, f"the value of {key!r}")
        fmt = _SCALAR_FMT[vt]
        v = fmt.unpack_from(self.need(pos, fmt.size), pos)[0]
        if vt is _VT.BOOL:
            v = v != 0
        return v, pos + fmt.size

    def array(self, pos: int, key: str) -> tuple[list, _VT, int]:
        """Read an array value (element type, count, elements); return (list, element type, next pos)."""
        et = self.value_type(pos, f"the elements of {key!r}")
        n = self.u64(pos + 4)
        pos += 12
        if et is _VT.ARRAY:
            raise self.fail(f"{key!r} is a nested array, which is not supported")
        if et is _VT.STRING:
            if n * 8 > self.size - pos:  # every string needs at least its length field
                raise self.fail(f"truncated {self.where}")
            out, pos = self._strings(pos, n, key)
            return out, et, pos
        dt = _NP_DTYPE[et]
        nbytes = n * dt.itemsize
        buf = self.need(pos, nbytes)
        arr = np.frombuffer(buf, dtype=dt, count=n, offset=pos)
        if et is _VT.BOOL:
            arr = arr != 0
        out = arr.tolist()
        del arr  # release the buffer export so `buf` can grow again
        return out, et, pos + nbytes

    def _strings(self, pos: int, n: int, key: str) -> tuple[list[str], int]:
        # The hot loop for vocabularies (~100k strings): locals only, refill rarely.
        out: list[str] = []
        append = out.append
        unpack = _U64.unpack_from
        buf = self.buf
        avail = len(buf)
        i = 0
        try:
            for i in range(n):
                if pos + 8 > avail:
                    buf = self.need(pos, 8)
                    avail = len(buf)
                ln = unpack(buf, pos)[0]
                pos += 8
                end = pos + ln
                if end > avail:
                    buf = self.need(pos, ln)
                    avail = len(buf)
                append(buf[pos:end].decode("utf-8"))
                pos = end
        except UnicodeDecodeError:
            raise self.fail(f"element {i} of {key!r} is not valid UTF-8 (at byte {pos})") from None
        return out, pos


def _open(path: str):
    try:
        return open(path, "rb", buffering=0)
    except FileNotFoundError:
        raise GGUFError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise GGUFError(f"{path}: is a directory, not a GGUF file") from None
    except OSError as e:
        raise GGUFError(f"{path}: cannot open ({e.strerror or e})") from None


def read_header(path) -> GGUFHeader:
    """Parse a GGUF's metadata and tensor infos, reading only header bytes; works on header-only files too."""
    path = os.fsdecode(os.fspath(path))
    f = _open(path)
    try:
        try:
            size = os.fstat(f.fileno()).st_size
            return _parse(path, f, size)
        except OSError as e:
            raise GGUFError(f"{path}: cannot read ({e.strerror or e})") from None
    finally:
        f.close()


def _parse(path: str, f, size: int) -> GGUFHeader:
    if size == 0:
        raise GGUFError(f"{path}: empty file")
    r = _HeaderReader(path, f, size)
    head = bytes(r.need(0, min(size, _FIXED_HEADER.size))[:4])
    if head != _MAGIC[: len(head)]:
        raise GGUFError(f"{path}: not a GGUF file (magic {head!r})")
    if size < _FIXED_HEADER.size:
        raise GGUFError(f"{path}: truncated inside the file header ({size} of {_FIXED_HEADER.size} bytes)")
    _, version, n_tensors, n_kv = _FIXED_HEADER.unpack_from(r.buf, 0)
    if version not in SUPPORTED_VERSIONS:
        swapped = int.from_bytes(version.to_bytes(4, "little"), "big")
        if swapped in SUPPORTED_VERSIONS or (version & 0xFFFF == 0 and swapped < 0x10000):
            raise GGUFError(f"{path}: big-endian GGUF (version {swapped}) is not supported")
        raise GGUFError(
            f"{path}: unsupported GGUF version {version} (supported: {', '.join(map(str, SUPPORTED_VERSIONS))})"
        )
    pos = _FIXED_HEADER.size

    # -- metadata --
    metadata: dict[str, object] = {}
    types: dict[str, _VT] = {}
    array_types: dict[str, _VT] = {}
    for i in range(n_kv):
        r.where = f"inside metadata (key {i + 1} of {n_kv})"
        key, pos = r.string(pos, f"key {i + 1} of {n_kv}")
        r.where = f"inside metadata (key {i + 1} of {n_kv}, {key!r})"
        if key in metadata:
            raise r.fail(f"duplicate metadata key {key!r} (key {i + 1} of {n_kv})")
        vt = r.value_type(pos, f"key {key!r}")
        pos += 4
        if vt is _VT.ARRAY:
            val, et, pos = r.array(pos, key)
            array_types[key] = et
        else:
            val, pos = r.value(pos, vt, key)
        metadata[key] = val
        types[key] = vt

    alignment = gguf.GGUF_DEFAULT_ALIGNMENT
    akey = gguf.Keys.General.ALIGNMENT
    if akey in metadata:
        a = metadata[akey]
        if types[akey] is not _VT.UINT32:
            raise r.fail(f"{akey!r} must be a UINT32 power of two, got type {types[akey].name}")
        if a == 0 or (a & (a - 1)) != 0:
            raise r.fail(f"{akey!r} must be a UINT32 power of two, got {a}")
        alignment = a

    # -- tensor infos --
    tensors: dict[str, TensorInfo] = {}
    for i in range(n_tensors):
        r.where = f"inside tensor infos (tensor {i + 1} of {n_tensors})"
        name, pos = r.string(pos, f"the name of tensor {i + 1} of {n_tensors}")
        r.where = f"inside tensor infos (tensor {i + 1} of {n_tensors}, {name!r})"
        if name in tensors:
            raise r.fail(f"duplicate tensor name {name!r} (tensor {i + 1} of {n_tensors})")
        n_dims = r.u32(pos)
        pos += 4
        if n_dims > _MAX_DIMS:
            raise r.fail(f"tensor {name!r} has {n_dims} dimensions (at most {_MAX_DIMS})")
        buf = r.need(pos, 8 * n_dims + 12)
        shape = struct.unpack_from(f"<{n_dims}Q", buf, pos)
        pos += 8 * n_dims
        raw_type, offset = struct.unpack_from("<IQ", buf, pos)
        pos += 12
        dtype = _TENSOR_TYPES.get(raw_type)
        if dtype is None:
            raise r.fail(f"tensor {name!r} has unknown ggml type id {raw_type}")
        if any(d >= 1 << 63 for d in shape):
            raise r.fail(f"tensor {name!r} has a negative dimension {shape}")
        block_size = gguf.GGML_QUANT_SIZES[dtype][0]
        if shape and shape[0] % block_size:
            raise r.fail(
                f"tensor {name!r} has ne0={shape[0]}, not a multiple of the {dtype.name} block size {block_size}"
            )
        if offset % alignment:
            raise r.fail(f"tensor {name!r} has offset {offset}, not a multiple of the alignment {alignment}")
        tensors[name] = TensorInfo(name, shape, dtype, offset)

    header_end = pos
    data_start = -(-header_end // alignment) * alignment
    header = GGUFHeader(
        path=path,
        version=version,
        metadata=metadata,
        tensors=tensors,
        alignment=alignment,
        header_end=header_end,
        data_start=data_start,
        file_size=size,
        types=types,
        array_types=array_types,
    )

    _check_extents(r, header)
    return header


def _check_extents(r: _HeaderReader, h: GGUFHeader) -> None:
    """Tensor data may not overlap (in any file) nor run past the end (in a file with data: none at all is a
    header-only file, some but not all is corruption), so that a weight is only ever a view of its own bytes."""
    if not h.header_only:
        data_bytes = h.file_size - h.data_start
        for t in h.tensors.values():
            if t.offset >= data_bytes and t.n_bytes:
                raise r.fail(f"tensor {t.name!r} has offset {t.offset}, past the end of the file's {data_bytes} "
                             f"bytes of tensor data")
            end = h.data_start + t.offset + t.n_bytes
            if end > h.file_size:
                raise r.fail(f"tensor data truncated: {t.name!r} ends at byte {end} but the file has {h.file_size} "
                             f"bytes")
    prev = None
    for t in sorted((t for t in h.tensors.values() if t.n_bytes), key=lambda t: t.offset):
        if prev is not None and t.offset < prev.offset + prev.n_bytes:
            raise r.fail(f"tensor {t.name!r} at offset {t.offset} overlaps tensor {prev.name!r} (offset "
                         f"{prev.offset}, {prev.n_bytes} bytes)")
        prev = t


def strip(src, dst) -> GGUFHeader:
    """Write dst = the first header_end bytes of src (a weightless GGUF for fixtures), all at once or not at
    all; return dst's header."""
    src_s = os.fsdecode(os.fspath(src))
    dst_s = os.fsdecode(os.fspath(dst))
    hdr = read_header(src_s)
    try:
        same = os.path.exists(dst_s) and os.path.samefile(src_s, dst_s)
    except OSError:
        same = False
    if same:
        raise GGUFError(f"{dst_s}: refusing to strip a file onto itself")
    f = _open(src_s)
    try:
        data = f.read(hdr.header_end)
        while len(data) < hdr.header_end:
            more = f.read(hdr.header_end - len(data))
            if not more:
                raise GGUFError(f"{src_s}: truncated while copying the header")
            data += more
    except OSError as e:
        raise GGUFError(f"{src_s}: cannot read ({e.strerror or e})") from None
    finally:
        f.close()
    try:
        with atomic_open(dst_s, "wb") as out:  # an interrupted write leaves dst as it was
            out.write(data)
    except OSError as e:
        raise GGUFError(f"{dst_s}: cannot write ({e.strerror or e})") from None
    return read_header(dst)
