"""What every step of a program is: the Step protocol, the registry of kernel makers (one per computing op of the
catalogue), windows, and the numpy helpers the steps share.

Arrays are in numpy order, the reverse of the IR's ggml order.
"""

from __future__ import annotations

import threading
from functools import partial
from typing import Any, Callable, Mapping

import numpy as np

from graphir.backends.numba.primitives.isa import IsaPath
from graphir.backends.numba.quant.weight import QWeight
from graphir.backends.numba.tape import Tape
from graphir.graph.dims import Sym
from graphir.graph.ir import Node
from graphir.graph.ops import OPS

Env = Mapping[str, int]
F32 = np.float32


class Step:
    """A node's kernel in a program, with three faces, each a way of running it:

    ``__call__(env, *operands)``: the interpreted run, the dims bound by ``env``, the operands as they come.
    ``bind(env, known, shape)``: a plan's, made once per binding of the dims: a function of the operands alone,
    which may use the operands known before the run (``known``: weights, a memory's buffers, windows of them;
    None where not known) and the operands' shapes (``shape(i)``: operand i's). By default the interpreted run
    with ``env`` bound.
    ``record(tape, args)``: a tape's, every operand known (arena arrays): the kernel calls appended to the tape
    and the value they will make, or None where they cannot be (the step then runs from Python). None on a
    step that has no tape face.
    """

    record: Callable[[Tape, list[Any]], np.ndarray | None] | None = None

    def __call__(self, env: Env, *operands: Any) -> Any:
        raise NotImplementedError

    def bind(self, env: Env, known: list[Any], shape: Callable[[int], tuple[int, ...]]) -> Callable[..., Any]:
        return partial(self, env)


class Function(Step):
    """A step that is one function of (env, *operands): nothing to bind, no tape face."""

    def __init__(self, fn: Callable[..., Any]):
        self.fn = fn

    def __call__(self, env: Env, *operands: Any) -> Any:
        return self.fn(env, *operands)

    def bind(self, env: Env, known: list[Any], shape: Callable[[int], tuple[int, ...]]) -> Callable[..., Any]:
        return partial(self.fn, env)


class Window(Step):
    """A step whose value is a window on its operand's memory (reshape, view, permute, transpose; a cont that need
    not copy): ``at(env)`` is the function of the operand for one binding of the dims. A plan binds it once, and
    where the operand is known before the run (a weight, a memory's buffer) computes the window itself once."""

    def __init__(self, at: Callable[[Env], Callable[[np.ndarray], np.ndarray]]):
        self.at = at

    def __call__(self, env: Env, x: np.ndarray) -> np.ndarray:
        return self.at(env)(x)


as_it_is = Window(lambda env: lambda x: x)

Placed = tuple[Step, int, tuple[int, ...], tuple[int, ...]]   # a step in a program: output slot, operands, freed


# ---- the registry: a kernel maker per non-leaf op of the catalogue ----------------------------------------
# A kernel maker takes the node (its attributes), the run's memo and the numerics path, and returns its Step.
# ``memo.d`` lives for one run of one thread: values every layer would recompute (RoPE's cos/sin) are made once,
# and contexts sharing a program from several threads never see each other's.

Maker = Callable[[Node, threading.local, IsaPath], Step]
KERNELS: dict[str, Maker] = {}


def kernel(*ops: str) -> Callable[[Maker], Maker]:
    """Register a kernel maker for ops of graphir.graph.ops.OPS; an op without one, or with two, is an error."""
    def register(make: Maker) -> Maker:
        for op in ops:
            if op not in OPS or OPS[op].kind == "leaf":
                raise ValueError(f"kernel for {op!r}: not a computing op of the catalogue")
            if op in KERNELS:
                raise ValueError(f"two kernels for op {op!r}")
            KERNELS[op] = make
        return make
    return register


def step_for(n: Node, memo: threading.local, path: IsaPath) -> Step:
    make = KERNELS.get(n.op)
    if make is None:
        raise NotImplementedError(f"the numba backend has no kernel for op '{n.op}' (node {n.name})")
    return make(n, memo, path)


# ---- helpers the steps share ----------------------------------------------------------------------------

def dense(x: Any) -> np.ndarray:
    return x.dequantize() if isinstance(x, QWeight) else x


def dense_kept() -> Callable[[Any], np.ndarray]:
    """dense for one step's weight operand (conv kernel, A, time_first): a QWeight is dequantized on the first
    run and kept, since a Program's weights never change; per token this saves a copy per layer. Threads
    running the Program at once may both dequantize it the first time; the slot is replaced whole, so each
    reads a complete pair."""
    slot: list[tuple[Any, Any]] = [(None, None)]

    def dense(w: Any) -> np.ndarray:
        if not isinstance(w, QWeight):
            return w
        kept = slot[0]
        if kept[0] is not w:
            kept = slot[0] = (w, w.dequantize())
        return kept[1]

    return dense


def rows_of(*xs: Any) -> bool:
    """Whether each x is a C-contiguous float32 array: a tape's kernels read them as rows."""
    return all(isinstance(x, np.ndarray) and x.dtype == F32 and x.flags.c_contiguous and x.ndim for x in xs)


def broadcast(b: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """ggml repeats b to a's shape when each of b's sizes divides a's; numpy only broadcasts 1s.
    b may have more (size-1) dimensions than a, as RWKV's [E, 1, 1] mix parameters do."""
    b = b.reshape((1,) * (len(shape) - b.ndim) + b.shape[max(b.ndim - len(shape), 0):])
    if all(n == 1 or n == m for n, m in zip(b.shape, shape)):
        return b
    return np.tile(b, tuple(m // n for n, m in zip(b.shape, shape)))


def ints_fn(values: tuple[Any, ...]) -> Callable[[Env], tuple[int, ...]]:
    """Attribute integers that may name dims (shapes, strides, offsets): computed once when static, per run
    when one is a Sym."""
    if any(isinstance(d, Sym) for d in values):
        return lambda env: tuple(d.eval(env) if isinstance(d, Sym) else d for d in values)
    fixed = tuple(values)
    return lambda env: fixed


def shape_fn(shape: tuple[Any, ...]) -> Callable[[Env], tuple[int, ...]]:
    """numpy shape of an attribute shape (ggml order reversed)."""
    return ints_fn(tuple(reversed(shape)))
