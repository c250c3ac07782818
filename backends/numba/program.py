"""A graph lowered to a program of steps, and the run loop: what the numba backend's compile gives the core.

A graph is lowered once into a flat list of steps (a Step, output slot, operand slots, the slots freed after it),
and planned once per binding of its dims (graphir.backends.numba.plan); values are freed after their last use.
Weights are prepared once per model (the quantized ones repacked lazily by :mod:`graphir.backends.numba.quant`)
and shared by every context. Arrays are in numpy order, the reverse of the IR's ggml order.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Mapping

import numpy as np

from graphir.backends.numba.fusion import Readers, contiguous_for_mul_mat_only, fuse_chains, fuse_siblings
from graphir.backends.numba.plan import Plan, make_plan
from graphir.backends.numba.primitives.isa import IsaPath
from graphir.backends.numba.primitives.jit import kernel_launches
from graphir.backends.numba.steps import step_for
from graphir.backends.numba.steps.base import Env, Placed, as_it_is, dense
from graphir.backends.numba.tape import Segment
from graphir.graph.dims import Sym
from graphir.graph.ir import Graph
from graphir.graph.ops import IN_PLACE, ROWS_OF_WEIGHT

PLANS = 16   # plans a Program keeps: shape classes (ubatch sizes, n_kv) by held buffers


class Program:
    """A graph ready to run: steps in topological order, leaves bound to weights or to named feeds. Each binding
    of the dims it runs with gets a plan (Plan), made at its first run and kept."""

    def __init__(self, graph: Graph, weights: Callable[..., Any], path: IsaPath):
        """Lower ``graph``: a step per computing node (steps.step_for), its weights bound through ``weights``
        (graphir.running.backend.Backend.compile), each value freed after its last reader; then the rewrites
        of graphir.backends.numba.fusion."""
        index = {id(n): i for i, n in enumerate(graph.nodes)}
        last_use = {i: i for i in range(len(graph.nodes))}
        for i, n in enumerate(graph.nodes):
            for x in n.inputs:
                last_use[index[id(x)]] = i
        keep = {index[id(n)] for n in graph.outputs.values()}
        self.n_slots = len(graph.nodes)
        self.path = path
        self.memo = threading.local()
        self.consts: list[tuple[int, Any]] = []
        self.feeds: list[tuple[int, str]] = []
        self.steps: list[Placed] = []
        matrix_use = {id(x) for n in graph.nodes if n.op in ROWS_OF_WEIGHT for x in n.inputs[:1]}
        other_use = {id(x) for n in graph.nodes if n.op not in ROWS_OF_WEIGHT for x in n.inputs}
        # experts, and the 3-D weights mul_mat multiplies matrix by matrix (MLA's per-head k_b, v_b): as rows
        stacked = {id(n.inputs[0]) for n in graph.nodes if n.op == "mul_mat_id" or (
            n.op == "mul_mat" and n.inputs[0].op == "weight" and len(n.inputs[0].shape) == 3)} - other_use
        readers = Readers(graph, index, keep)
        in_place = contiguous_for_mul_mat_only(graph, readers)
        for i, n in enumerate(graph.nodes):
            free = tuple(sorted({index[id(x)] for x in n.inputs  # values whose last reader this step is
                                 if last_use[index[id(x)]] == i and index[id(x)] not in keep}))
            if i in in_place:
                self.steps.append((as_it_is, i, (index[id(n.inputs[0])],), free))
            elif n.op == "weight":
                w = weights(n.name, stacked=True) if id(n) in stacked else weights(n.name)
                if id(n) in other_use or id(n) not in matrix_use:  # viewed or reshaped (BERT's type row): dense
                    w = dense(w)
                self.consts.append((i, w))
            elif n.op == "input":
                self.feeds.append((i, n.name))
            else:
                self.steps.append((step_for(n, self.memo, path), i, tuple(index[id(x)] for x in n.inputs), free))
        fuse_siblings(self.steps, dict(self.consts), graph, self.memo, path)
        self.plain_steps = list(self.steps)  # one step per node: what a run with taps takes
        self.steps, self.labels = fuse_chains(self.steps, graph, readers, self.memo, path)
        self.outputs = {role: index[id(n)] for role, n in graph.outputs.items()}
        self.names = [n.name for n in graph.nodes]
        self.shapes = [n.shape for n in graph.nodes]
        self.ops = [n.op for n in graph.nodes]
        self.dtypes = [n.dtype for n in graph.nodes]
        self.feed_slots = {i for i, _ in self.feeds}
        self.written = {ins[0] for _, out, ins, _ in self.plain_steps if self.ops[out] in IN_PLACE}
        self.profile: dict[str, list[float]] | None = None  # set to {}: op -> [seconds, steps] of every run
        self.plans: dict[tuple[Any, ...], Plan] = {}
        self._plans_lock = threading.Lock()

    def run(self, env: Env, feeds: Mapping[str, np.ndarray], taps: dict[str, np.ndarray] | None = None,
            held: Mapping[str, np.ndarray] | None = None,
            plans: dict[tuple[Any, ...], Plan] | None = None) -> dict[str, np.ndarray]:
        """Outputs by role. ``held``: inputs that stay the same arrays from run to run (a memory's buffers), which
        the plan for these dims may view once instead of every run; ``plans``: where the plans that keep them are
        kept, owned by the caller that owns the buffers (a context), so that they go with it (default: the
        program's own). With ``taps`` (a dict), every computed value is also copied into it by node name, like
        llama.cpp's eval callback: the way to compare engines node by node."""
        with kernel_launches():
            return self._run(self._plan(env, held or {}, taps is None, self.plans if plans is None else plans), env,
                             feeds, taps)

    def _plan(self, env: Env, held: Mapping[str, np.ndarray], fused: bool, plans: dict[tuple[Any, ...], Plan]) -> Plan:
        key = (fused, tuple(sorted(env.items())), tuple(map(id, held.values())))
        plan = plans.get(key)
        if plan is None or plan.tapes:
            # a plan's first run goes without its tape, which takes longer to make than a run takes: a binding
            # run once (a prompt or a sentence of its own length) never pays for one
            plan = make_plan(self, env, held, fused, taping=plan is not None)
            with self._plans_lock:
                while key not in plans and len(plans) >= PLANS:
                    del plans[next(iter(plans))]
                plans[key] = plan
        return plan

    def shape(self, slot: int, env: Env) -> tuple[int, ...]:
        """The numpy shape of a slot's value for this binding of the dims, from its node's shape in the graph."""
        return tuple(d.eval(env) if isinstance(d, Sym) else d for d in reversed(self.shapes[slot]))

    def _run(self, plan: Plan, env: Env, feeds: Mapping[str, np.ndarray],
             taps: dict[str, np.ndarray] | None) -> dict[str, np.ndarray]:
        self.memo.d = {}
        if plan.lock is not None:
            with plan.lock:
                return self._run_plan(plan, feeds, taps)
        return self._run_plan(plan, feeds, taps)

    def _run_plan(self, plan: Plan, feeds: Mapping[str, np.ndarray],
                  taps: dict[str, np.ndarray] | None) -> dict[str, np.ndarray]:
        if plan.run is not None and taps is None and self.profile is None:
            return plan.run(feeds)
        vals: list[Any] = [None] * self.n_slots
        for i, v in plan.known:
            vals[i] = v
        for i, name in plan.feeds:
            vals[i] = feeds[name]
        profile, labels = self.profile, plan.labels
        for fn, out, ins, free in plan.steps:
            if profile is not None:
                t0 = time.perf_counter()
            if out < 0:   # a tape's segment times its instructions itself; the feeds' copy is the run's own
                if profile is not None and isinstance(fn, Segment):
                    fn.profiled(profile)
                else:
                    fn(*[vals[j] for j in ins])
                continue
            vals[out] = fn(*[vals[j] for j in ins])
            if profile is not None:
                spent = profile.setdefault(labels.get(out, self.ops[out]), [0.0, 0])
                spent[0] += time.perf_counter() - t0
                spent[1] += 1
            if taps is not None:
                taps[self.names[out]] = np.array(vals[out])
            for j in free:
                vals[j] = None
        return {role: vals[i].copy() if role in plan.copied else vals[i] for role, i in self.outputs.items()}
