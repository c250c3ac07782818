"""Feedback on long work, drawn by tqdm on a terminal's stderr: what the commands show while the backend compiles
its kernels (``Backend.compiling``: a first run takes a minute or more, then they are cached) and while a
conversion writes its tensors. Nothing is drawn when stderr is not a terminal or the user asked for quiet, and
output (stdout) never changes."""

from __future__ import annotations

import io
import os
import sys
from typing import IO, Any


def stream(quiet: bool = False) -> IO[str] | None:
    """Where to draw progress: stderr when it is a terminal and the user did not ask for quiet, else None."""
    return None if quiet or not sys.stderr.isatty() else sys.stderr


def counting(out: IO[str] | None, total: int | None, what: str) -> Any:
    """A bar of ``total`` steps (None: a count without an end) on ``out`` (``update(n)``, ``close()``), drawing
    nothing where ``out`` is None."""
    from tqdm import tqdm

    return tqdm(total=total, desc=what, file=out, disable=out is None, **size(out))


def size(out: IO[str] | None) -> dict[str, int]:
    """The terminal's columns and lines for tqdm, 80 x 24 where it has none or says 0 (a terminal whose size was
    never set: tqdm would fit its line into 0 columns and hide it below line 0)."""
    try:
        term = os.get_terminal_size(out.fileno())  # type: ignore[union-attr]
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        return {"ncols": 80, "nrows": 24}
    return {"ncols": term.columns or 80, "nrows": term.lines or 24}
