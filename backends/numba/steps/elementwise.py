"""The elementwise steps: binary ops with ggml's repetition, unary ops, scale, clamp, xielu, and the gated units
(silu, swiglu, geglu, reglu, swiglu_oai, swiglu_clamp); with their tape faces."""

from __future__ import annotations

import math
import threading
from functools import partial
from typing import Any, Callable

import numpy as np

from graphir.backends.numba import tape as T
from graphir.backends.numba.kernels import rows as R
from graphir.backends.numba.kernels.unary import (LIBM, exp, geglu, gelu, gelu_erf, gelu_kernel, gelu_quick,
                                                  gelu_table, libm_kernel, neg, reglu, relu, scale_bias, sigmoid, silu,
                                                  silu_kernel, softplus, sqr, sqrt, swiglu, swiglu_clamp, swiglu_oai,
                                                  tanh, xielu)
from graphir.backends.numba.primitives.isa import IsaPath
from graphir.backends.numba.primitives.jit import PAR_MIN
from graphir.backends.numba.quant.weight import QWeight
from graphir.backends.numba.steps.base import F32, Env, Function, Step, broadcast, dense, kernel, rows_of
from graphir.backends.numba.tape import Tape
from graphir.graph.dims import Sym
from graphir.graph.ir import Node

_BINARY = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide}
_ROW_OPS = {np.add: R.ADD, np.subtract: R.SUB, np.multiply: R.MUL, np.divide: R.DIV}   # a tape's kernel for each
_UNARY_FN = {"gelu": gelu, "gelu_quick": gelu_quick, "gelu_erf": gelu_erf, "relu": relu, "sqr": sqr, "sqrt": sqrt,
             "neg": neg, "exp": exp, "tanh": tanh, "sigmoid": sigmoid, "softplus": softplus}


@kernel("clamp")
def _clamp(n: Node, memo: threading.local, path: IsaPath) -> Step:
    lo, hi = np.float32(n.attrs["min"]), np.float32(n.attrs["max"])
    return Function(lambda env, x: np.maximum(np.minimum(x, hi, dtype=np.float32), lo))


@kernel(*_BINARY)
def _binary(n: Node, memo: threading.local, path: IsaPath) -> Step:
    return _Binary(_BINARY[n.op])


class _Binary(Step):
    """add, sub, mul, div: y repeated over x as ggml does; a plan where y's shape broadcasts numpy's way (each of
    its sizes 1 or x's, no more dims than x) binds the ufunc alone, or from PAR_MIN elements the row kernel where
    y's rows repeat by a period (_row_period), which a prompt's sizes run on both threads."""

    def __init__(self, f: np.ufunc):
        self.f = f

    def __call__(self, env: Env, x: np.ndarray, y: Any) -> np.ndarray:
        return self.f(x, broadcast(dense(y), x.shape), dtype=np.float32)

    def bind(self, env: Env, known: list[Any], shape: Callable[[int], tuple[int, ...]]) -> Callable[..., Any]:
        xs, ys, f = shape(0), shape(1), self.f
        if isinstance(known[1], QWeight) or len(ys) > len(xs) \
                or any(n != 1 and n != m for n, m in zip(reversed(ys), reversed(xs))):
            return partial(self, env)
        div, size = _row_period(xs, ys), math.prod(xs)
        if div is None or size < PAR_MIN:    # numpy's call costs less than a kernel's below PAR_MIN
            return lambda x, y: f(x, y, dtype=np.float32)
        kernel, op, width = R.binary_kernel(size), _ROW_OPS[f], xs[-1]

        def rows(x: np.ndarray, y: np.ndarray) -> np.ndarray:
            if not rows_of(x, y):
                return f(x, y, dtype=np.float32)
            out = np.empty(xs, np.float32)
            kernel(x.reshape(-1, width), y.reshape(-1, width), div, out.reshape(-1, width), op)
            return out

        return rows

    def record(self, tape: Tape, args: list[Any]) -> np.ndarray | None:
        """x op y on the tape where y has x's shape or x's trailing dims (a bias, a scale: one row, or a block that
        repeats, as Mamba-2's grouped norm weight), taken as rows of y's size."""
        x, y = args
        if not rows_of(x, y):
            return None
        trailing = y.shape[next((i for i, n in enumerate(y.shape) if n != 1), len(y.shape)):]
        if x.shape != y.shape and x.shape[len(x.shape) - len(trailing):] != trailing:
            return None
        if not y.flags.writeable:   # a weight (a bias, a scale): it never changes, so the arena holds a copy
            y = tape.constant(y)
        width = x.shape[-1] if x.shape == y.shape else max(y.size, 1)
        out = tape.arena(x.shape)
        x2, y2, o2 = x.reshape(-1, width), y.reshape(-1, width), out.reshape(-1, width)
        op = _ROW_OPS[self.f]
        ok = tape.record(T.BINARY, R.binary_kernel(x.size), (x2, y2, 1, o2, op))
        return out if ok else None


def _row_period(xs: tuple[int, ...], ys: tuple[int, ...]) -> int | None:
    """For y broadcasting numpy's way to x (no dims of its own): the div by which binary_kernel takes y's rows, if
    y's sizes other than 1 lie in one run of x's dims past the last (x's 1s aside) and y's last is x's: x's row
    r then takes y's row (r // div) % len(y), div the rows of x's dims after the run. None otherwise."""
    if not ys or ys[-1] != xs[-1] or 0 in xs:
        return None
    lead = [(m, n) for m, n in zip(xs[:-1], (1,) * (len(xs) - len(ys)) + ys[:-1]) if m != 1]
    run = [i for i, (m, n) in enumerate(lead) if n != 1]
    if run and run[-1] - run[0] + 1 != len(run):
        return None
    return math.prod(m for m, _ in lead[run[-1] + 1:]) if run else 1


@kernel(*_UNARY_FN)
def _unary(n: Node, memo: threading.local, path: IsaPath) -> Step:
    return _Unary(n.op)


@kernel("scale")
def _scale(n: Node, memo: threading.local, path: IsaPath) -> Step:
    s = n.attrs["s"]
    if isinstance(s, Sym):  # a size of the ubatch (lightning attention's block length), known when it runs
        return Function(lambda env, x: np.multiply(x, F32(s.eval(env)), dtype=np.float32))
    return _Unary("scale", np.float32(s))


@kernel("scale_bias")
def _scale_bias(n: Node, memo: threading.local, path: IsaPath) -> Step:
    s, b = n.attrs["s"], n.attrs["b"]
    return Function(lambda env, x: scale_bias(x, s, b, path))


_ROW_UNARY = {"relu": R.RELU, "sqr": R.SQR, "neg": R.NEG, "scale": R.SCALE}   # numpy's, as row kernels


class _Unary(Step):
    """A unary op (or scale by s); on a tape, the glibc ones (exp, tanh, ...), numpy's (relu, sqr, neg, scale) and
    gelu (ggml's table); numpy's also as row kernels from PAR_MIN elements (a prompt's, on both threads)."""

    def __init__(self, op: str, s: np.float32 = np.float32(1.0)):
        self.op, self.s = op, s
        self.f = (lambda x: x * s) if op == "scale" else _UNARY_FN[op]

    def __call__(self, env: Env, x: np.ndarray) -> np.ndarray:
        if self.op not in _ROW_UNARY or x.size < PAR_MIN or not rows_of(x):
            return self.f(x)
        out = np.empty_like(x)
        x2 = x.reshape(-1, x.shape[-1])
        R.unary_kernel(x.size)(x2, out.reshape(x2.shape), _ROW_UNARY[self.op], self.s)
        return out

    def record(self, tape: Tape, args: list[Any]) -> np.ndarray | None:
        x = args[0]
        if not rows_of(x) or (self.op not in LIBM and self.op not in _ROW_UNARY and self.op != "gelu"):
            return None
        out = tape.arena(x.shape)
        x2, o2 = x.reshape(-1, x.shape[-1]), out.reshape(-1, x.shape[-1])
        if self.op == "gelu":
            table = gelu_table()
            ok = tape.record(T.GELU, gelu_kernel(x.size), (x2, x2, False, table, o2))
        elif self.op in LIBM:
            which = LIBM[self.op]
            ok = tape.record(T.LIBM, libm_kernel(x.size), (x2, which, o2))
        else:
            which = _ROW_UNARY[self.op]
            ok = tape.record(T.UNARY, R.unary_kernel(x.size), (x2, o2, which, self.s))
        return out if ok else None


@kernel("silu")
def _silu(n: Node, memo: threading.local, path: IsaPath) -> Step:
    return _Silu(path)


class _Silu(Step):
    def __init__(self, path: IsaPath):
        self.path = path

    def __call__(self, env: Env, x: np.ndarray) -> np.ndarray:
        return silu(x, self.path)

    def record(self, tape: Tape, args: list[Any]) -> np.ndarray | None:
        x = args[0]
        if not rows_of(x):
            return None
        out = tape.arena(x.shape)
        x2, o2 = x.reshape(-1, x.shape[-1]), out.reshape(-1, x.shape[-1])
        none = tape.arena((x2.shape[0], 0))                       # no gate
        lanes, expf = self.path.lanes, self.path.expf
        ok = tape.record(T.SILU, silu_kernel(x.size), (x2, lanes, expf, none, o2))
        return out if ok else None


@kernel("swiglu")
def _swiglu(n: Node, memo: threading.local, path: IsaPath) -> Step:
    return _Swiglu(path)


class _Swiglu(Step):
    def __init__(self, path: IsaPath):
        self.path = path

    def __call__(self, env: Env, g: np.ndarray, u: np.ndarray) -> np.ndarray:
        return swiglu(g, u, self.path)

    def record(self, tape: Tape, args: list[Any]) -> np.ndarray | None:
        g, u = args
        if not rows_of(g, u) or g.shape != u.shape:
            return None
        out = tape.arena(g.shape)
        g2, u2, o2 = (a.reshape(-1, g.shape[-1]) for a in (g, u, out))
        lanes, expf = self.path.lanes, self.path.expf
        ok = tape.record(T.SILU, silu_kernel(g.size), (g2, lanes, expf, u2, o2))
        return out if ok else None


@kernel("geglu")
def _geglu(n: Node, memo: threading.local, path: IsaPath) -> Step:
    return Function(lambda env, g, u: geglu(g, u))


@kernel("reglu")
def _reglu(n: Node, memo: threading.local, path: IsaPath) -> Step:
    return Function(lambda env, g, u: reglu(g, u))


@kernel("swiglu_oai")
def _swiglu_oai(n: Node, memo: threading.local, path: IsaPath) -> Step:
    alpha, limit = n.attrs["alpha"], n.attrs["limit"]
    return Function(lambda env, g, u: swiglu_oai(g, u, alpha, limit))


@kernel("xielu")
def _xielu(n: Node, memo: threading.local, path: IsaPath) -> Step:
    a = n.attrs
    return Function(lambda env, x: xielu(x, a["alpha_n"], a["alpha_p"], a["beta"], a["eps"]))


@kernel("swiglu_clamp")
def _swiglu_clamp(n: Node, memo: threading.local, path: IsaPath) -> Step:
    limit = n.attrs["limit"]
    return Function(lambda env, g, u: swiglu_clamp(g, u, limit))
