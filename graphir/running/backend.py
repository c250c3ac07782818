"""How the core reaches a backend without importing one.

A backend registers an object under the entry-point group ``graphir.backends`` (this package's numba backend
as ``numba``, see pyproject.toml); :func:`get` loads it by name when a model is loaded to run. The core only
asks what this protocol names: the numerics paths it reproduces, a prepared weight, a compiled graph.
"""

from __future__ import annotations

import functools
from importlib.metadata import entry_points
from typing import IO, Any, Callable, ContextManager, Protocol

from graphir.errors import GraphirError
from graphir.graph.ir import Graph

GROUP = "graphir.backends"
DEFAULT = "numba"


class Program(Protocol):
    def run(self, env: dict[str, int], feeds: dict[str, Any], taps: dict[str, Any] | None = None) -> dict[str, Any]:
        ...


class Backend(Protocol):
    paths: tuple[str, ...]  # the numerics paths it can reproduce (llama.cpp CPU builds), for --isa

    def numerics(self, isa: str | None = None) -> Any:
        """The path to run (``isa``, else the environment's or the host's), with ``describe()``."""

    def compiling(self, out: IO[str] | None, on_first: Callable[[], None] | None = None) -> ContextManager[None]:
        """While the block runs, report on ``out`` (None: nowhere) the kernels the backend compiles, if any, and
        call ``on_first`` when it starts compiling the first (none compiled: not called)."""

    def weight_types(self) -> frozenset[Any]:
        """The GGUF types of the matrices it multiplies (a model holding another is refused at load)."""

    def prepare_weight(self, data: Any, qtype: Any, ne0: int) -> Any:
        """A matrix in the form the backend multiplies (repacked once, shared by contexts)."""

    def compile(self, graph: Graph, weight: Callable[..., Any], numerics: Any) -> Program:
        """A graph ready to run, its weights bound through ``weight(name)``, or ``weight(name, stacked=True)``
        for a 3-D tensor of matrices that only the expert-indexed matmul reads (one weight of all their rows)."""


@functools.cache
def get(name: str = DEFAULT) -> Backend:
    found = {ep.name: ep for ep in entry_points(group=GROUP)}
    if name not in found:
        raise GraphirError(f"no backend '{name}' is installed (installed: {', '.join(sorted(found)) or 'none'}; "
                           f"backends register under the entry-point group '{GROUP}')")
    backend: Backend = found[name].load()
    return backend
