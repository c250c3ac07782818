"""The numba backend as the core sees it (graphir.running.backend.Backend), registered as the entry point ``numba``:
numerics paths from :mod:`graphir.backends.numba.primitives.isa`, weights from the quantized matmuls, graphs
compiled by the program. The kernels (and numba) load on first use, so naming the backend's paths costs nothing."""

from __future__ import annotations

import os
import sys
from typing import IO, TYPE_CHECKING, Any, Callable, ContextManager

from graphir.backends.numba.primitives.isa import PATHS, Numerics, numerics
from graphir.errors import GraphirError
from graphir.graph.ir import Graph

if TYPE_CHECKING:
    from graphir.backends.numba.program import Program
    from graphir.backends.numba.quant.weight import QWeight


class NumbaBackend:
    paths = tuple(PATHS)

    def numerics(self, isa: str | None = None) -> Numerics:
        return numerics(isa)

    def compiling(self, out: IO[str] | None, on_first: Callable[[], None] | None = None) -> ContextManager[None]:
        from graphir.backends.numba.primitives.jit import compiling

        return compiling(out, on_first)

    def weight_types(self) -> frozenset[Any]:
        from graphir.backends.numba.quant.weight import SUPPORTED

        return SUPPORTED

    def prepare_weight(self, data: Any, qtype: Any, ne0: int, numerics: Numerics) -> QWeight:
        from graphir.backends.numba.quant.weight import QWeight

        return QWeight.prepare(data, qtype, ne0, numerics.path)

    def compile(self, graph: Graph, weight: Callable[..., Any], numerics: Numerics) -> Program:
        from graphir.backends.numba.heap import keep_freed_memory
        from graphir.backends.numba.program import Program

        keep_freed_memory()
        return Program(graph, weight, numerics.path)

    def set_threads(self, n: int) -> None:
        """numba's parallel loops take their count from ``numba.set_num_threads``, which can only lower the pool
        numba starts with (NUMBA_NUM_THREADS, the host's cores): a larger count goes into the environment while
        numba is not yet imported."""
        if "numba" not in sys.modules:
            pool = max(n, os.cpu_count() or 1, int(os.environ.get("NUMBA_NUM_THREADS", "0") or 0))
            os.environ["NUMBA_NUM_THREADS"] = str(pool)
        import numba

        if n > numba.config.NUMBA_NUM_THREADS:
            raise GraphirError(f"threads={n}: numba started with a pool of {numba.config.NUMBA_NUM_THREADS} threads "
                               f"(NUMBA_NUM_THREADS); it cannot run more")
        numba.set_num_threads(n)


BACKEND = NumbaBackend()
