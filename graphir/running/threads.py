"""The number of threads the kernels run on (llama.cpp's ``-t/--threads``): numba's parallel loops take it from
``numba.set_num_threads``, which can only lower the pool numba starts with (NUMBA_NUM_THREADS, the host's cores),
so a larger count must be in the environment before numba is first imported."""

from __future__ import annotations

import os
import sys

from graphir.errors import GraphirError


def set_threads(n: int) -> None:
    if n < 1:
        raise GraphirError(f"threads={n}: the kernels need at least one thread")
    if "numba" not in sys.modules:
        pool = max(n, os.cpu_count() or 1)
        os.environ["NUMBA_NUM_THREADS"] = str(max(pool, int(os.environ.get("NUMBA_NUM_THREADS", "0") or 0)))
    import numba

    if n > numba.config.NUMBA_NUM_THREADS:
        raise GraphirError(f"threads={n}: numba started with a pool of {numba.config.NUMBA_NUM_THREADS} threads "
                           f"(NUMBA_NUM_THREADS); it cannot run more")
    numba.set_num_threads(n)
