"""The little-endian byte codec saved states are written in: the state file's framing and every memory's
own section use it, so a memory kind can save what it keeps without knowing the file around it."""

from __future__ import annotations

import json
import struct
from typing import Any

import numpy as np

from graphir.errors import StateError


class Writer:
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


class Reader:
    """Reads what a Writer wrote; anything that runs past ``end`` is a StateError naming what was read.
    ``version``: the format the data is in (a memory reads an older one's section as that format wrote it)."""

    def __init__(self, data: bytes, end: int, off: int = 0, version: int | None = None):
        self.data, self.off, self.end, self.version = data, off, end, version

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

    def json(self, what: str) -> dict[str, Any]:
        """A string holding a JSON object (a layout, the hparams): anything else, however deep, is malformed."""
        text = self.s(what)
        try:
            value = json.loads(text)
        except (ValueError, RecursionError):
            raise StateError(f"state data is malformed: the {what} is not JSON") from None
        if not isinstance(value, dict):
            raise StateError(f"state data is malformed: the {what} is not a JSON object")
        return value

    def arr(self, dtype: Any, count: int, what: str) -> np.ndarray:
        dt = np.dtype(dtype).newbyteorder("<")
        return np.frombuffer(self.take(count * dt.itemsize, what), dtype=dt).astype(np.dtype(dtype).newbyteorder("="))
