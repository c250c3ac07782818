"""Threads: contexts of one model run at once; one context is never used by two threads at once.

Several contexts of one freshly loaded model, made and driven from several threads that start together, give
exactly (bit for bit) the logits and memory each gives alone, for every memory kind; the model prepares each
weight once and compiles each graph once, whichever thread asks first. A context (or an encoder-decoder pair)
that is busy in one thread refuses every call from another with a GraphirError naming it and what it is busy
with, at once (never queued behind the first, which would hide the bug), and the first call finishes as if
alone. The models are test_fuzz_state's tiny ones; about 15 s.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
from collections import Counter
from typing import Any, Callable

import numpy as np
import pytest
from conftest import TinyModels, memory_bytes
from test_fuzz_state import KINDS, PRESETS

from graphir.errors import GraphirError
from graphir.graph.hashing import graph_hash
from graphir.batch import Batch
from graphir.running.runtime import Model, load

TOKENS = np.random.default_rng(4).integers(4, 256, 64).tolist()
THREADS = 4
WAIT_S = 60.0  # a thread that waits longer than this for another is a failed test, not a hang


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> TinyModels:
    return TinyModels(tmp_path_factory.mktemp("threads"), PRESETS)


class Counting:
    """A backend that counts what it prepares and compiles, so that a test can see each is done once."""

    def __init__(self, backend: Any):
        self.backend, self.prepared, self.compiled = backend, Counter[int](), Counter[str]()
        self.lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.backend, name)

    def prepare_weight(self, data: Any, qtype: Any, ne0: int, numerics: Any) -> Any:
        with self.lock:
            self.prepared[np.asarray(data).ctypes.data] += 1  # where the tensor's bytes are mapped
        return self.backend.prepare_weight(data, qtype, ne0, numerics)

    def compile(self, graph: Any, weight: Callable[[str], Any], numerics: Any) -> Any:
        with self.lock:
            self.compiled[graph_hash(graph)] += 1
        return self.backend.compile(graph, weight, numerics)


def fresh(tiny: TinyModels, model: str) -> tuple[Model, Counting]:
    """The model loaded anew (nothing prepared or compiled yet), with its backend counted."""
    m = load(str(tiny.path(model)))
    m.backend = counting = Counting(m.backend)  # type: ignore[assignment]
    return m, counting


def work(m: Model, kw: dict[str, Any], i: int) -> tuple[np.ndarray, bytes]:
    """Thread i's conversation: a context of its own, a prompt of its own in two sequences, four greedy steps,
    a position edit and two more; every logits row, and the memory at the end."""
    ctx = m.new_context(n_ctx=32, n_seq_max=2, n_ubatch=4, **kw)
    prompt = TOKENS[8 * i:8 * i + 8]
    if hasattr(ctx, "encode"):
        ctx.encode(Batch(prompt[4:], None, [(0,)] * 2 + [(1,)] * 2, [True] * 4))
    ctx.decode(Batch(prompt[:6], None, [(0,)] * 3 + [(1,)] * 3, [True] * 6))
    rows = [ctx.logits().copy()]
    for step in range(6):
        if step == 4 and ctx.memory.can_shift():
            ctx.memory.seq_add(1, -1, -1, 3)  # the next decode re-ropes K first
        nxt = [int(np.argmax(ctx.logits_ith(j))) for j in (-2, -1)]
        ctx.decode(Batch(nxt, None, [(0,), (1,)], [True, True]))
        rows.append(ctx.logits().copy())
    return np.concatenate(rows), memory_bytes(ctx)


def together(n: int, job: Callable[[int], Any]) -> list[Any]:
    """job(0..n-1), each in its own thread, all released at once; what each returned (or raised)."""
    start, out = threading.Barrier(n), [None] * n

    def run(i: int) -> None:
        start.wait(WAIT_S)
        try:
            out[i] = job(i)
        except BaseException as e:  # noqa: BLE001 (reported by the test)
            out[i] = e

    threads = [threading.Thread(target=run, args=(i,), name=f"worker-{i}") for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT_S)
    assert not any(t.is_alive() for t in threads), "a thread did not finish"
    return out


@pytest.mark.parametrize("kind", list(KINDS))
def test_contexts_of_one_model_in_parallel_threads_give_what_each_gives_alone(tiny: TinyModels, kind: str) -> None:
    model, kw = KINDS[kind]
    m, counting = fresh(tiny, model)
    got = together(THREADS, lambda i: work(m, kw, i))
    errors = [g for g in got if isinstance(g, BaseException)]
    assert not errors, errors
    assert set(counting.prepared.values()) == {1} and set(counting.compiled.values()) == {1}, counting.compiled
    for i, (logits, memory) in enumerate(got):
        want_logits, want_memory = work(m, kw, i)  # now alone
        assert np.array_equal(logits, want_logits) and memory == want_memory


class Held(dict):  # type: ignore[type-arg]
    """Decode taps that hold the decoding thread inside the graph until the test lets it go."""

    def __init__(self) -> None:
        super().__init__()
        self.inside, self.go = threading.Event(), threading.Event()

    def __setitem__(self, name: str, value: Any) -> None:
        if not self.inside.is_set():
            self.inside.set()
            assert self.go.wait(WAIT_S)
        super().__setitem__(name, value)


@pytest.mark.parametrize("kind", ["kv", "cross"])
def test_a_context_busy_in_one_thread_refuses_every_call_from_another(tiny: TinyModels, kind: str) -> None:
    model, kw = KINDS[kind]
    m = tiny.model(model)
    contexts = [m.new_context(n_ctx=32, n_seq_max=2, **kw) for _ in range(2)]
    for ctx in contexts:
        if hasattr(ctx, "encode"):
            ctx.encode(Batch.from_tokens(TOKENS[:6], 0))
        ctx.decode(Batch.from_tokens(TOKENS[6:10], 0))
    ctx, alone = contexts
    saved, one = ctx.state_save(), ctx.state_seq_save(0)
    batch = Batch.from_tokens(TOKENS[10:14], 4)
    alone.decode(batch)
    held = Held()
    worker = threading.Thread(target=ctx.decode, args=(batch, held), name="worker")
    worker.start()
    assert held.inside.wait(WAIT_S)
    busy = f"^{re.escape(repr(ctx))} is busy \\(decode in thread 'worker'\\): "
    calls: dict[str, Callable[[], Any]] = {
        "decode": lambda: ctx.decode(Batch.one(5, 4, seq_id=1)), "state_save": ctx.state_save,
        "state_load": lambda: ctx.state_load(saved), "state_seq_save": lambda: ctx.state_seq_save(0),
        "state_seq_load": lambda: ctx.state_seq_load(one, 1),
        "set_memory": lambda: ctx.set_memory(alone.memory.clone()),
    }
    if hasattr(ctx, "encode"):
        calls["encode"] = lambda: ctx.encode(Batch.from_tokens(TOKENS[:3], 0, seq_id=1))
    try:
        for what, call in calls.items():
            with pytest.raises(GraphirError, match=busy + f"{what} from thread 'MainThread' is refused; a context "
                                                          f"serves one thread at a time"):
                call()
    finally:
        held.go.set()
        worker.join(WAIT_S)
    assert memory_bytes(ctx) == memory_bytes(alone)
    ctx.decode(Batch.one(5, 8))  # free again


def test_under_numbas_workqueue_layer_graphs_take_turns_instead_of_aborting() -> None:
    """numba falls back to its ``workqueue`` threading layer where neither TBB nor OpenMP is installed; that
    layer aborts the process when two threads launch parallel kernels at once. There the backend runs one
    graph at a time (a process-wide lock), and the parallel test above passes; elsewhere graphs run at once."""
    env = {**os.environ, "NUMBA_THREADING_LAYER": "workqueue"}
    probe = ("import numba; from graphir.backends.numba.primitives.jit import _LAUNCH, kernel_launches; "
             "guard = kernel_launches(); print(numba.threading_layer(), guard is _LAUNCH)")
    p = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=300)
    assert p.stdout.split() == ["workqueue", "True"], p.stderr
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__, "-k", "parallel"],
                       capture_output=True, text=True, env=env, timeout=600)
    assert p.returncode == 0 and f"\n{len(KINDS)} passed, " in p.stdout, p.stdout[-3000:] + p.stderr[-3000:]
