"""Weight access by memory map: a GGUF's tensors as numpy views of the file, never copied wholesale.

Quantized tensors come out as their raw blocks, ``uint8[rows, row_bytes]``; float tensors as arrays of
their own dtype in numpy order (the reverse of ggml's). Backends repack what they need, lazily.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from graphir.errors import TensorError
from graphir.files.gguf_file import GGUFHeader

_FLOAT_VIEWS = {
    GGMLQuantizationType.F32: np.float32,
    GGMLQuantizationType.F16: np.float16,
    GGMLQuantizationType.BF16: np.uint16,  # bf16 bits; numpy has no bfloat16
}


@dataclass(frozen=True)
class Tensor:
    name: str
    qtype: GGMLQuantizationType
    shape: tuple[int, ...]  # ggml order
    data: np.ndarray  # float: numpy order; quantized: uint8[rows, row_bytes]

    @property
    def ne0(self) -> int:
        return self.shape[0]

    @property
    def rows(self) -> int:
        return int(np.prod(self.shape[1:], dtype=np.int64))


class GGUFWeights:
    """The tensors of one GGUF file, mapped read-only."""

    def __init__(self, header: GGUFHeader):
        if header.header_only:
            raise TensorError(f"{header.path}: header-only file (no tensor data): graphs only, nothing to run")
        self.header = header

    @cached_property
    def _map(self) -> np.memmap:
        """The file mapped when the first weight is asked for; refused if it is no longer as long as its
        header said (touching a page past the end of a mapped file is a SIGBUS, not an exception)."""
        path, size = self.header.path, self.header.file_size
        try:
            m = np.memmap(path, dtype=np.uint8, mode="r")
        except (OSError, ValueError) as e:
            raise TensorError(f"{path}: cannot map the tensor data ({getattr(e, 'strerror', None) or e})") from None
        if m.size != size:
            raise TensorError(f"{path}: the file changed since its header was read ({m.size} bytes, was {size})")
        return m

    def __contains__(self, name: str) -> bool:
        return name in self.header.tensors

    def __getitem__(self, name: str) -> Tensor:
        info = self.header.tensors.get(name)
        if info is None:
            raise TensorError(f"{self.header.path}: no tensor '{name}'")
        start = self.header.data_start + info.offset
        raw = self._map[start:start + info.n_bytes]  # within the file: read_header checked every extent
        if info.dtype in _FLOAT_VIEWS:
            data = raw.view(_FLOAT_VIEWS[info.dtype]).reshape(tuple(reversed(info.shape)))
        else:
            block, size = GGML_QUANT_SIZES[info.dtype]
            rows = int(np.prod(info.shape[1:], dtype=np.int64))
            data = raw.reshape(rows, info.shape[0] // block * size)
        return Tensor(name, info.dtype, tuple(info.shape), data)
