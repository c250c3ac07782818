"""Writing a file all at once or not at all: what every command that writes (convert, strip, dump -o,
state_save) goes through, so that an interrupted or failed write never leaves a partial output behind."""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from pathlib import Path
from typing import IO, Iterator


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """A path to write ``path``'s new content to. For a regular file (or a new one) it is a temporary file beside
    it, renamed over it when the block ends normally and removed when it raises, so the old file stays as it
    was; a symbolic link is followed, so the file it names is replaced and the link stays. A device or pipe
    (/dev/null, /dev/stdout) is the path itself: renaming over it would replace it by a file."""
    try:
        special = not stat.S_ISREG(os.stat(path).st_mode)
    except FileNotFoundError:
        special = False
    if special:
        yield Path(path)
        return
    dst = Path(os.path.realpath(path))
    # a fresh name the writer creates (so the file gets the usual permissions, which mkstemp's 0600 would not)
    tmp = dst.parent / f".{dst.name}.{os.getpid()}.{secrets.token_hex(6)}.tmp"
    try:
        yield tmp
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
