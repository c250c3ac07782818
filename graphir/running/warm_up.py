"""A model made ready before anything is timed: one prompt and two generation steps, so that the backend compiles
(a first run) or loads from its cache the kernels of both, and the weights are prepared (two steps: a plan's
second run is the first to play its kernels from a tape, whose player compiles too).

On a first run the two are compiled at once: when the backend starts compiling, a second process (this module
run as a program) takes the generation steps of the same model while this one runs the prompt; each compiles its
own kernels on its own core, into the cache they share, and this process's step then finds the step's kernels
there. The prompt's context has 256 cells, a full block of KV padding, so that its kernels are those a real
prompt takes (a few cells pick the serial variants of the attention products).
"""

from __future__ import annotations

import subprocess
import sys
from typing import IO, Any

from graphir.batch import Batch

N_CTX = 256


def warm_up(model: Any, out: IO[str] | None) -> None:
    """Run a two-token prompt and two steps of ``model``; ``out``: where the backend reports what it compiles."""
    helpers: list[subprocess.Popen[bytes]] = []
    prompting = [True]

    def step_elsewhere() -> None:
        if not prompting[0]:  # only the step compiles (a cache that has the prompt's kernels): nothing to share
            return
        cmd = [sys.executable, "-m", __name__, str(model.meta.header.path), model.numerics.path.name,
               model.backend_name]
        try:
            helpers.append(subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                            stderr=subprocess.DEVNULL))
        except OSError:  # no second process: this one compiles everything, as it would anyway
            pass

    try:
        with model.backend.compiling(out, step_elsewhere):
            ctx = model.new_context(n_ctx=N_CTX)
            n = ctx.prompt([0, 0])
            prompting[0] = False
            for helper in helpers:
                helper.wait()
            _steps(ctx, n)
    finally:
        for helper in helpers:  # interrupted: the helper's work is not wanted any more
            if helper.poll() is None:
                helper.kill()
                helper.wait()


def _step(path: str, isa: str, backend: str) -> None:
    from graphir.running.runtime import load

    _steps(load(path, isa, backend).new_context(n_ctx=N_CTX), 0)


def _steps(ctx: Any, pos: int) -> None:
    for i in range(2):
        ctx.decode(Batch.one(0, pos + i))


if __name__ == "__main__":
    _step(*sys.argv[1:4])
