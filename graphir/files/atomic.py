"""Writing a file all at once or not at all: what every command that writes (convert, strip, dump -o,
state_save) goes through, so that an interrupted or failed write never leaves a partial output behind."""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path
from typing import IO, Iterator


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """A temporary path beside ``path`` to write to; renamed over ``path`` when the block ends normally, removed
    when it raises (the old file, if any, is left as it was)."""
    dst = Path(path)
    # a fresh name the writer creates (so the file gets the usual permissions, which mkstemp's 0600 would not)
    tmp = dst.parent / f".{dst.name}.{os.getpid()}.{secrets.token_hex(6)}.tmp"
    try:
        yield Path(tmp)
        os.replace(tmp, dst)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike[str], mode: str = "wb") -> Iterator[IO]:
    """``open(path, mode)`` whose content appears at ``path`` only once the block ends normally."""
    with atomic_path(path) as tmp, open(tmp, mode) as f:
        yield f


def write_atomic(path: str | os.PathLike[str], data: bytes | str) -> None:
    """Write ``data`` (bytes, or text as UTF-8) to ``path`` all at once."""
    with atomic_open(path, "wb") as f:
        f.write(data.encode("utf-8") if isinstance(data, str) else data)
