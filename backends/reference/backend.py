"""The reference backend as the core sees it (graphir.running.backend.Backend), registered as the entry point
``reference``: a graph interpreted node by node with the numpy definitions of graphir.backends.reference.ops.

Every value is stored in its node's type (f32, f16 for a cache's, i32 for ids); each op computes in float64 from
its operands. Weights are dequantized once by gguf-py, of every type it reads; activations are multiplied as
floats, where llama.cpp (and the numba backend) first quantize them to the weight type's dot-product format:
on a quantized model the two differ by that rounding, on a float one by float rounding only.
"""

from __future__ import annotations

import contextlib
import functools
import time
from dataclasses import dataclass
from typing import IO, Any, Callable, ContextManager, Mapping

import gguf
import numpy as np
from gguf.quants import dequantize

from graphir.backends.reference.ops import REFERENCES
from graphir.errors import GraphirError
from graphir.graph.dims import Sym
from graphir.graph.ir import Graph, Node
from graphir.graph.ops import IN_PLACE, PRODUCTS, ROWS_OF_WEIGHT, VIEWS

_TYPES = {"f32": np.float32, "f16": np.float16, "i32": np.int32, "i64": np.int64}
PATH = "float64"


@dataclass(frozen=True)
class Path:
    name: str


@dataclass(frozen=True)
class ReferenceNumerics:
    """The reference's one path: the ops' definitions in float64, no llama.cpp build's bits."""

    path: Path = Path(PATH)
    host: str = "any"
    exact: bool = False
    chosen_by: str = "detected"

    def describe(self) -> str:
        return "float64 (the ops' numpy definitions, graphir.backends.reference): no llama.cpp build's bits"


class ReferenceBackend:
    paths = (PATH,)

    def numerics(self, isa: str | None = None) -> ReferenceNumerics:
        if isa not in (None, PATH):
            raise GraphirError(f"the reference backend computes in {PATH} only, not {isa!r}")
        return ReferenceNumerics(chosen_by="detected" if isa is None else "chosen")

    def compiling(self, out: IO[str] | None, on_first: Callable[[], None] | None = None) -> ContextManager[None]:
        return contextlib.nullcontext()   # nothing to compile

    def weight_types(self) -> frozenset[Any]:
        return _dequantized_types()

    def prepare_weight(self, data: Any, qtype: Any, ne0: int, numerics: Any) -> np.ndarray:
        """The matrix as floats: F16 as it is (a product with it rounds x to f16, as ggml's does), every other
        type dequantized to float32 (the same on every numerics path)."""
        if qtype == gguf.GGMLQuantizationType.F16:
            return np.asarray(data, np.float16).reshape(-1, ne0)
        return np.asarray(dequantize(np.asarray(data), qtype), np.float32).reshape(-1, ne0)

    def compile(self, graph: Graph, weight: Callable[..., Any], numerics: Any) -> Program:
        return Program(graph, weight)

    def set_threads(self, n: int) -> None:
        """numpy runs the ops on its own threads (its BLAS's): there is no pool of the backend's to size."""
        if n < 1:
            raise GraphirError(f"threads={n}: the kernels need at least one thread")


@functools.cache
def _dequantized_types() -> frozenset[gguf.GGMLQuantizationType]:
    """The GGUF types gguf-py dequantizes: a zero block of each is tried once."""
    found = set()
    for q in gguf.GGMLQuantizationType:
        if q not in gguf.GGML_QUANT_SIZES:
            continue
        block, nbytes = gguf.GGML_QUANT_SIZES[q]
        try:
            dequantize(np.zeros((1, nbytes), np.uint8) if block > 1 else np.zeros((1, 1), _float_of(q)), q)
        except (NotImplementedError, ValueError, TypeError, KeyError):
            continue
        found.add(q)
    return frozenset(found)


def _float_of(q: gguf.GGMLQuantizationType) -> Any:
    return {gguf.GGMLQuantizationType.F16: np.float16, gguf.GGMLQuantizationType.BF16: np.uint16}.get(q, np.float32)


class Program:
    """A graph interpreted node by node: every run evaluates every node from its operands."""

    def __init__(self, graph: Graph, weight: Callable[..., Any]):
        self.graph = graph
        self.outputs = dict(graph.outputs)
        self.weights = {n.name: weight(n.name) for n in graph.nodes if n.op == "weight"}
        self.profile: dict[str, list[float]] | None = None

    def run(self, env: Mapping[str, int], feeds: Mapping[str, Any], taps: dict[str, Any] | None = None,
            held: Mapping[str, Any] | None = None, plans: dict[Any, Any] | None = None) -> dict[str, Any]:
        """Outputs by role; ``held`` buffers are read and written where they lie; ``plans`` is not used (there is
        nothing to keep between runs)."""
        given = {**feeds, **(held or {})}
        env = _with_input_dims(self.graph, dict(env), given)
        values: dict[int, Any] = {}
        for n in self.graph.nodes:
            if n.op == "weight":
                values[id(n)] = np.asarray(self.weights[n.name]).reshape(_shape(n, env))
            elif n.op == "input":
                values[id(n)] = np.asarray(given[n.name])
            else:
                t0 = time.perf_counter()
                values[id(n)] = _evaluate(n, [values[id(x)] for x in n.inputs], env)
                if self.profile is not None:
                    spent = self.profile.setdefault(n.op, [0.0, 0])
                    spent[0] += time.perf_counter() - t0
                    spent[1] += 1
                if taps is not None:
                    taps[n.name] = np.array(values[id(n)])
        return {role: values[id(n)] for role, n in self.outputs.items()}


def _evaluate(n: Node, operands: list[Any], env: dict[str, int]) -> Any:
    """The node's value from its operands, stored in its type (a layout's: its operand's, which may be a memory's
    buffer of another type than the graph says). Operand 0 of an op that reads a weight's rows or writes a buffer
    in place comes as it is stored; the other float operands as float64, x of a product by an f16 matrix (a
    cache's) rounded to f16 first, as ggml's CPU products convert it to the matrix's type."""
    as_stored = n.op in ROWS_OF_WEIGHT or n.op in IN_PLACE
    if n.op in PRODUCTS and operands[0].dtype == np.float16:   # ggml first converts x to an f16 matrix's type
        operands = [operands[0], operands[1].astype(np.float16), *operands[2:]]
    xs = [x if (i == 0 and as_stored) or x.dtype.kind != "f" else x.astype(np.float64)
          for i, x in enumerate(operands)]
    y = REFERENCES[n.op](xs, n.attrs, _shape(n, env), env)
    if n.op in IN_PLACE:
        return y   # the buffer itself, written
    if n.op in VIEWS or n.op == "cont":   # operand 0's values in another layout: its type (a cache's f16 or f32)
        return np.asarray(y).astype(operands[0].dtype).reshape(_shape(n, env))
    return np.asarray(y).astype(_TYPES[n.dtype]).reshape(_shape(n, env))


def _shape(n: Node, env: Mapping[str, int]) -> tuple[int, ...]:
    return tuple(d.eval(env) if isinstance(d, Sym) else d for d in reversed(n.shape))   # type: ignore[arg-type]


def _with_input_dims(graph: Graph, env: dict[str, int], given: Mapping[str, Any]) -> dict[str, int]:
    """env with the dims that only an input's size tells (a memory's buffer sizes its own rows), read off the
    arrays given for them."""
    for n in graph.nodes:
        if n.op != "input" or n.name not in given:
            continue
        for d, size in zip(reversed(n.shape), np.shape(given[n.name])):
            if isinstance(d, Sym) and len(d.terms) == 1 and d.terms[0][1] == 1 and len(d.terms[0][0]) == 1:
                env.setdefault(d.terms[0][0][0], size)
    return env


BACKEND = ReferenceBackend()
