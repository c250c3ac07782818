"""How the core reaches a backend without importing one: the contract, every call the core makes of a backend.

A backend registers an object under the entry-point group ``graphir.backends`` (this package's ``numba`` and
``reference``, see pyproject.toml); :func:`get` loads it by name when a model is loaded to run. What the core asks
of it, and nothing else (tests/test_backend_contract.py runs models through a backend that records every call):

* its numerics: the paths it can reproduce (``paths``, for ``--isa``) and the one in use (``numerics``);
* the weight types it multiplies (``weight_types``: a model holding another is refused at load) and a matrix
  in its own form (``prepare_weight``, once per tensor, shared by contexts);
* a program for a graph (``compile``), whose weights it binds through a callback; the graph's symbolic dims
  are bound at each run (``env``);
* a program's ``run``: the feeds, a memory's buffers (``held``: the same arrays from run to run, which set_rows
  writes in place and views read), where the plans made for those buffers are kept (``plans``, owned by the
  context that owns the buffers), and taps; its ``outputs`` (the roles it makes) and its ``profile``;
* ``compiling``: what it compiles while a block runs, for progress reports.
"""

from __future__ import annotations

import functools
from importlib.metadata import entry_points
from typing import IO, Any, Callable, Collection, ContextManager, Mapping, Protocol

from graphir.errors import GraphirError
from graphir.graph.ir import Graph

GROUP = "graphir.backends"
DEFAULT = "numba"


class NumericsPath(Protocol):
    name: str   # what --isa names it, and what numerics(name) takes to choose it again (a warm-up's second process)


class Numerics(Protocol):
    """The numbers a backend's programs compute: its path, and whether they are the host's llama.cpp's."""

    path: NumericsPath
    host: str        # the host's llama.cpp path as detected, or a description of the host
    exact: bool      # whether the numbers are bit for bit those of a native llama.cpp build on this host
    chosen_by: str   # "detected", "GRAPHIR_ISA" or "chosen" (by the caller)

    def describe(self) -> str:
        """One line for people: the path and what it reproduces."""


class Program(Protocol):
    """A graph ready to run (Backend.compile)."""

    outputs: Collection[str]   # the roles of the graph's outputs (logits, embd, pooled, ...)
    profile: dict[str, list[float]] | None   # None; set to {} to have every run add [seconds, count] by op label

    def run(self, env: Mapping[str, int], feeds: Mapping[str, Any], taps: dict[str, Any] | None = None,
            held: Mapping[str, Any] | None = None, plans: dict[Any, Any] | None = None) -> dict[str, Any]:
        """The outputs by role, for the dims ``env`` binds and the inputs ``feeds`` names. ``held``: inputs that are
        a memory's buffers, the same arrays from run to run (set_rows writes them in place); ``plans``: where
        what the backend makes for those buffers is kept (a context's, so it goes with the buffers; default: the
        program's own). ``taps``: a dict that receives every computed value by node name."""


class Backend(Protocol):
    paths: tuple[str, ...]   # the numerics paths it can reproduce, for --isa

    def numerics(self, isa: str | None = None) -> Numerics:
        """The path to run (``isa``, else the environment's or the host's)."""

    def compiling(self, out: IO[str] | None, on_first: Callable[[], None] | None = None) -> ContextManager[None]:
        """While the block runs, report on ``out`` (None: nowhere) the kernels the backend compiles, if any, and
        call ``on_first`` when it starts compiling the first (none compiled: not called)."""

    def weight_types(self) -> frozenset[Any]:
        """The GGUF types of the matrices it multiplies (a model holding another is refused at load)."""

    def prepare_weight(self, data: Any, qtype: Any, ne0: int, numerics: Numerics) -> Any:
        """A matrix in the form the backend multiplies, from its raw GGUF rows (``data``: uint8 rows of blocks for
        a quantized type, else the values), ``ne0`` values a row (repacked once, shared by contexts), laid out
        for the model's numerics path (llama.cpp repacks other types on other paths)."""

    def compile(self, graph: Graph, weight: Callable[..., Any], numerics: Numerics) -> Program:
        """A graph ready to run, its weights bound through ``weight(name)`` (a vector as a float32 array, a
        matrix as prepare_weight made it), or ``weight(name, stacked=True)`` for a 3-D tensor of matrices that
        only matrix products read (a mixture's experts, MLA's per-head k_b and v_b: one prepared weight of all
        their rows)."""

    def set_threads(self, n: int) -> None:
        """Run the kernels on ``n`` threads (llama.cpp's -t/--threads); a count it cannot run is a GraphirError."""


@functools.cache
def get(name: str = DEFAULT) -> Backend:
    found = {ep.name: ep for ep in entry_points(group=GROUP)}
    if name not in found:
        raise GraphirError(f"no backend '{name}' is installed (installed: {', '.join(sorted(found)) or 'none'}; "
                           f"backends register under the entry-point group '{GROUP}')")
    backend: Backend = found[name].load()
    return backend
