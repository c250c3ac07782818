"""Feedback on long work, drawn by tqdm on a terminal's stderr: what the commands show while numba compiles
kernels (a first run: a minute or more, then cached) and while a conversion writes its tensors. Nothing is
drawn when stderr is not a terminal or the user asked for quiet, and output (stdout) never changes."""

from __future__ import annotations

import contextlib
import io
import os
import sys
from typing import IO, Any, Iterator


def stream(quiet: bool = False) -> IO[str] | None:
    """Where to draw progress: stderr when it is a terminal and the user did not ask for quiet, else None."""
    return None if quiet or not sys.stderr.isatty() else sys.stderr


@contextlib.contextmanager
def compiling(out: IO[str] | None) -> Iterator[None]:
    """While the block runs, count on ``out`` the functions numba compiles, naming the latest. A kernel found
    in numba's cache compiles nothing, so a warm run draws nothing at all."""
    if out is None:
        yield
        return
    from numba.core import event
    from tqdm import tqdm

    bars: list[Any] = []
    depth = [0]  # a kernel's compile compiles what it calls too: only the outermost ones are counted

    class Counter(event.Listener):  # type: ignore[misc]
        def on_start(self, ev: event.Event) -> None:
            depth[0] += 1
            if depth[0] > 1:
                return
            if not bars:  # made at the first compile: a cached run gets no bar
                bars.append(tqdm(desc="compiling kernels (first run only; numba caches them)", file=out,
                                 bar_format="{desc}: {n} in {elapsed}{postfix}", **_size(out)))
            bars[0].set_postfix_str(ev.data["dispatcher"].py_func.__name__)

        def on_end(self, ev: event.Event) -> None:
            depth[0] -= 1
            if depth[0] == 0:
                bars[0].update(1)

    counter = Counter()
    event.register("numba:compile", counter)
    try:
        yield
    finally:
        event.unregister("numba:compile", counter)
        if bars:
            bars[0].close()


def counting(out: IO[str] | None, total: int, what: str) -> Any:
    """A bar of ``total`` steps on ``out`` (``update(n)``, ``close()``), drawing nothing where ``out`` is None."""
    from tqdm import tqdm

    return tqdm(total=total, desc=what, file=out, disable=out is None, **_size(out))


def _size(out: IO[str] | None) -> dict[str, int]:
    """The terminal's columns and lines for tqdm, 80 x 24 where it has none or says 0 (a terminal whose size was
    never set: tqdm would fit its line into 0 columns and hide it below line 0)."""
    try:
        size = os.get_terminal_size(out.fileno())  # type: ignore[union-attr]
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        return {"ncols": 80, "nrows": 24}
    return {"ncols": size.columns or 80, "nrows": size.lines or 24}
