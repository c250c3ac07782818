"""How the activation kernels are compiled and run: numba options, parallel and serial variants, float32 rows.

Most kernels work row by row over the last axis and come in a parallel variant (prange over rows) and a
serial one, which small values take: waking the worker threads costs more than it saves below PAR_MIN.
"""

from __future__ import annotations

import contextlib
import threading
from types import FunctionType
from typing import IO, Any, Callable, ContextManager, Iterator

import numpy as np
import numba
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from graphir.backends.numba.primitives import cache  # noqa: F401  (installed before this module's kernels)

# error_model="numpy": a float division by zero gives inf/nan as in C; numba's default (raise) keeps a branch in
# every division that stops loops from vectorizing (silu: 8x slower)
SER = dict(cache=True, error_model="numpy")
PAR = dict(parallel=True, cache=True, error_model="numpy")
INL = dict(cache=True, error_model="numpy", inline="always")

PAR_MIN = 1 << 15       # elements from which a kernel's parallel variant pays for waking the worker threads
ARITH_PAR_MIN = 1 << 18  # the same for a kernel of one arithmetic operation an element (add, relu): memory's pace


def f32_rows(x: np.ndarray) -> np.ndarray:
    """x as C-contiguous float32 rows of its last axis (a copy only when x is not that already)."""
    return np.ascontiguousarray(x, dtype=np.float32).reshape(-1, x.shape[-1] if x.ndim else 1)


def parallel_and_serial(kernel: Callable) -> tuple[Callable, Callable]:
    """kernel compiled twice: with its prange loops on numba's worker threads, and for the calling thread alone
    (where prange is range). numba's cache knows a function by its qualified name and first line, not by its
    options, so the serial copy gets a name of its own; under one name both would load whichever was cached."""
    serial = FunctionType(kernel.__code__, kernel.__globals__, f"{kernel.__name__}_serial", kernel.__defaults__,
                          kernel.__closure__)
    serial.__qualname__ = f"{kernel.__qualname__}_serial"
    return njit(**PAR)(kernel), njit(**SER)(serial)


def native_address(kernel: Callable, *args: Any) -> int:
    """The address of ``kernel``'s native code for arguments of the types of ``args`` (compiled, or loaded from
    numba's cache, here), which call_at calls. Only a value's numba type counts, so an argument may be a stand-in
    of the right type, shape aside. Its callers keep what it returns (functools.cache)."""
    sig = tuple(numba.typeof(a) for a in args)
    kernel.compile(sig)  # type: ignore[attr-defined]
    cres = kernel.overloads[sig]  # type: ignore[attr-defined]
    return int(cres.library.get_pointer_to_function(cres.fndesc.mangled_name))


@intrinsic
def call_at(typingctx, address, args):  # type: ignore[no-untyped-def]
    """Call the kernel (returning None) whose native code is at ``address`` (native_address) with the tuple
    ``args``, which must have the types it was compiled for: nothing checks them. A kernel called by name is
    linked into its caller and optimized again with it, and a parallel caller's loop body is compiled in layers
    (the body, a gufunc, its wrapper), each linking it again: attention's head kernel in a prange body took 21.7 s
    to compile, called at its address 8.5 s; the caller's cached code holds no address, only the argument."""
    def codegen(context, builder, sig, llargs):  # type: ignore[no-untyped-def]
        types_ = list(args.types)
        values = [builder.extract_value(llargs[1], i) for i in range(len(types_))]
        fnty = context.call_conv.get_function_type(types.void, types_)
        fn = builder.inttoptr(llargs[0], fnty.as_pointer())
        status, _ = context.call_conv.call_function(builder, fn, types.void, types_, values)
        with cgutils.if_unlikely(builder, status.is_error):
            context.call_conv.return_status_propagate(builder, status)
        return context.get_dummy_value()

    return types.void(address, args), codegen


def _touch(a: np.ndarray) -> None:
    for i in prange(a.shape[0]):
        a[i] = 0.0


_probe = njit(**PAR)(_touch)
_LAUNCH = threading.Lock()
_pool_is_shared: list[bool] = []  # found once, by the first graph to run


def kernel_launches() -> ContextManager[object]:
    """What a graph runs under: nothing where numba's threading layer takes parallel launches from several
    threads at once (TBB, OpenMP); a process-wide lock where it does not (``workqueue``, which numba falls back
    to where neither is installed, and which aborts the process when a second thread launches meanwhile), so
    that contexts in several threads take turns. Which layer numba chose is known once a parallel kernel ran:
    the first call runs one, under the lock."""
    if not _pool_is_shared:
        with _LAUNCH:
            if not _pool_is_shared:
                _probe(np.zeros(2, np.float32))
                try:
                    layer = numba.threading_layer()
                except ValueError:  # no layer started: kernels compiled without parallel (bounds checking)
                    layer = None
                _pool_is_shared.append(layer == "workqueue")
    return _LAUNCH if _pool_is_shared[0] else contextlib.nullcontext()


@contextlib.contextmanager
def compiling(out: IO[str] | None, on_first: Callable[[], None] | None = None) -> Iterator[None]:
    """While the block runs, count on ``out`` (a tqdm line) the kernels numba compiles, naming the latest; a
    kernel's compile compiles what it calls too, and only the outermost ones count. ``on_first`` is called when
    the first kernel starts compiling: a cache that lacks it, as on a first run. A kernel found in numba's cache
    compiles nothing, so a warm run draws nothing at all and calls nothing."""
    if out is None and on_first is None:
        yield
        return
    from numba.core import event

    bars: list[Any] = []
    depth = [0]
    started = [False]

    class Counter(event.Listener):  # type: ignore[misc]
        def on_start(self, ev: event.Event) -> None:
            depth[0] += 1
            if depth[0] > 1:
                return
            if not started[0]:
                started[0] = True
                if on_first is not None:
                    on_first()
                if out is not None:  # made at the first compile: a cached run gets no line
                    from tqdm import tqdm

                    from graphir.progress import size

                    bars.append(tqdm(desc="compiling kernels (first run only; numba caches them)", file=out,
                                     bar_format="{desc}: {n} in {elapsed}{postfix}", **size(out)))
            if bars:
                bars[0].set_postfix_str(ev.data["dispatcher"].py_func.__name__)

        def on_end(self, ev: event.Event) -> None:
            depth[0] -= 1
            if depth[0] == 0 and bars:
                bars[0].update(1)

    counter = Counter()
    event.register("numba:compile", counter)
    try:
        yield
    finally:
        event.unregister("numba:compile", counter)
        if bars:
            bars[0].close()
