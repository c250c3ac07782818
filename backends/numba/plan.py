"""Plans: a program's steps bound to one binding of the dims, and each plan's steps generated as one Python function.

A plan binds windows to their geometry and computes them where their operand is known before the run (a weight,
a memory's buffer), binds each step to what it knows (Step.bind), and for a small graph records what it can on a
tape (Step.record), its values in the tape's arena. The plan's steps then run as one generated function of the
feeds (straight_line), a call per step on local variables.
"""

from __future__ import annotations

import math
import threading
from functools import lru_cache, partial
from types import CodeType, FunctionType
from typing import Any, Callable, Mapping, NamedTuple, Protocol

import numpy as np

from graphir.backends.numba import tape as T
from graphir.backends.numba.primitives.isa import IsaPath
from graphir.backends.numba.steps.base import F32, Env, Placed, Step, Window
from graphir.backends.numba.tape import Tape
from graphir.graph.ops import IN_PLACE

Bound = tuple[Callable[..., Any], int, tuple[int, ...], tuple[int, ...]]   # a plan's step: a function of its
# operands alone, output slot (-1: none, a tape's segment or the feeds' copy), operands, freed


class Lowered(Protocol):
    """What a plan is made from: a graph lowered to steps (graphir.backends.numba.program.Program)."""
    path: IsaPath
    consts: list[tuple[int, Any]]   # weights by slot
    feeds: list[tuple[int, str]]    # inputs by slot
    steps: list[Placed]             # the steps, fused
    plain_steps: list[Placed]       # one step per node: what a run with taps takes
    labels: dict[int, str]          # a fused step's name in a profile, by output slot
    outputs: dict[str, int]
    ops: list[str]
    dtypes: list[str]
    feed_slots: set[int]
    written: set[int]               # slots written in place (operand 0 of an in-place op)

    def shape(self, slot: int, env: Env) -> tuple[int, ...]:
        ...


_ARENA_TYPES = {"f32": np.float32, "i32": np.int64, "i64": np.int64}   # of the values a tape's arena holds (ids and
# positions as int64, what the tape's kernels take: a feed is copied in, and Python steps read the feed itself)


def _before_tape(tape: Tape, arrays: list[np.ndarray], *feeds: np.ndarray) -> None:
    """A taped plan's first step: this run's feeds copied into the arena, then what the tape derives from them."""
    for dst, x in zip(arrays, feeds):
        dst[...] = x.reshape(dst.shape)
    for f in tape.before:
        f()


def _into(dst: np.ndarray, fn: Callable[..., Any], *args: Any) -> Any:
    """fn's value, also written into dst (a tape's arena array, which recorded steps read; of its size)."""
    y = fn(*args)
    dst[...] = np.reshape(y, dst.shape)
    return y


class Plan(NamedTuple):
    """A Program's steps for one binding of the dims: the values known before the run, by slot (weights, held
    buffers, windows of them, a tape's arena), the feeds by slot, and the steps, each a function of its operands
    alone (a step of out slot -1 makes no value: it plays a tape's instructions, or copies feeds in first)."""
    known: list[tuple[int, Any]]
    feeds: list[tuple[int, str]]
    steps: list[Bound]
    labels: dict[int, str]
    run: Callable[[Mapping[str, np.ndarray]], dict[str, np.ndarray]] | None  # the steps as one function of the feeds
    lock: threading.Lock | None        # a plan with a tape: its arena serves one run at a time
    tapes: bool                        # made without the tape it would have: its next run makes it with one
    copied: frozenset[str]             # the outputs a run copies out: a tape's (the next run writes over its
                                       # arena), not a memory's buffers written in place


def _straight_line(steps: list[Bound], known: dict[int, Any], feeds: list[tuple[int, str]], outputs: dict[str, int],
                   copied: frozenset[str]) -> Callable[[Mapping[str, np.ndarray]], dict[str, np.ndarray]]:
    """The steps as one Python function of the feeds, a call per step on local variables (v<slot>; a value known
    before the run is a constant, k<slot>), each deleted after its last reader: what a run does, without the
    interpreting loop's indexing and bookkeeping around every step. Its source is kept as ``run.source``."""
    local = {out for _, out, _, _ in steps if out >= 0} | {i for i, _ in feeds}
    names = {j: (f"v{j}" if j in local else f"k{j}") for j in set(known) | local}
    space: dict[str, Any] = {f"k{j}": v for j, v in known.items() if j not in local}
    lines = ["def run(feeds):"] + [f"    v{i} = feeds[{name!r}]" for i, name in feeds]
    gone: set[int] = set()
    for s, (fn, out, ins, free) in enumerate(steps):
        space[f"f{s}"] = fn
        lines.append(f"    {f'v{out} = ' if out >= 0 else ''}f{s}({', '.join(names[j] for j in ins)})")
        dead = [j for j in free if j in local and j not in gone]
        gone.update(dead)
        if dead:
            lines.append("    del " + ", ".join(names[j] for j in dead))
    lines.append("    return {" + ", ".join(f"{role!r}: {names[i]}{'.copy()' if role in copied else ''}"
                                       for role, i in outputs.items()) + "}")
    source = "\n".join(lines) + "\n"
    code = _compiled(source)
    run = FunctionType(code, space, "run")
    run.source = source  # type: ignore[attr-defined]
    return run


@lru_cache(maxsize=64)
def _compiled(source: str) -> CodeType:
    """A plan's function compiled once per text: plans of another context or of weights alike (same steps, same
    slots) share it, each with its own functions and constants; compiling takes ~15 ms for a 30-layer decoder."""
    module = compile(source, "<graphir plan>", "exec")
    return next(c for c in module.co_consts if isinstance(c, CodeType))


def make_plan(p: Lowered, env: Env, held: Mapping[str, np.ndarray], fused: bool, taping: bool = True) -> Plan:
    """The steps bound to one binding of the dims: windows bound to their geometry, and computed here where
    their operand is known before the run (a weight, a held buffer, a window of one; set_rows writes its held
    buffer in place, so its value is known too); a step that can use known operands bound to them. A small
    graph's steps go on a tape where they can (backends.numba.tape): their values in its arena, known here. Without
    ``tape``, a plan that would have one says so (``tapes``), to be made again with it."""
    known: dict[int, Any] = dict(p.consts)
    feeds = []
    for i, name in p.feeds:
        if name in held:
            known[i] = held[name]
        else:
            feeds.append((i, name))
    small = fused and _values_bytes(p, env) <= T.ARENA_MAX
    tape = Tape(p.path.lanes) if small and taping else None
    fed: dict[int, np.ndarray] = {}   # feeds a tape reads: the arena array each run's feed is copied into
    copies: dict[int, np.ndarray] = {}  # values of Python steps a tape reads: the arena array each is copied into
    steps: list[Bound] = []

    def add(fn: Step, out: int, ins: tuple[int, ...], free: tuple[int, ...]) -> None:
        """One step of the graph into the plan: a window made here, an instruction on the tape, or a step."""
        if isinstance(fn, Window):
            window = fn.at(env)
            x = known.get(ins[0])
            if fused and isinstance(x, np.ndarray):
                y = window(x)
                if y.size == 0 or np.may_share_memory(x, y):  # not a copy (numpy copies some reshapes of
                    # strided arrays); an empty view (a one-token batch's previous tokens) shares nothing
                    if tape is not None and x.flags.writeable:  # a tape's kernels take writable rows
                        y.flags.writeable = True
                    known[out] = y
                    return
            steps.append((window, out, ins, free))
            return
        if p.ops[out] in IN_PLACE and ins[0] in known:
            known[out] = known[ins[0]]
        if tape is not None and fn.record is not None:
            tape.label = p.labels.get(out, p.ops[out])  # type: ignore[union-attr]
            new: dict[int, np.ndarray] = {}
            args = [_in_arena(p, j, env, known, fed, copies, new, tape) for j in ins]  # type: ignore[arg-type]
            y = fn.record(tape, args) if all(a is not None for a in args) else None
            if y is not None:
                known[out] = y
                for j, a in new.items():   # from now on copied each run
                    if j in p.feed_slots:
                        fed[j] = a
                    else:
                        copies[j] = a
                        k = next(k for k in range(len(steps) - 1, -1, -1) if steps[k][1] == j)
                        fn_j, _, ins_j, free_j = steps[k]
                        steps[k] = (partial(_into, a, fn_j), j, ins_j, free_j)
                return
        if tape is not None and tape.pending:
            steps.append((tape.segment(), -1, (), ()))
        if tape is not None and p.ops[out] in IN_PLACE and isinstance(known.get(ins[0]), np.ndarray):
            tape.writes_rows(known[ins[0]], None)   # a buffer written from Python
        steps.append((fn.bind(env, [known.get(j) for j in ins], lambda i: p.shape(ins[i], env)) if fused
                      else partial(fn, env), out, ins, free))

    holding: set[int] = set()   # slots whose value holds its arena storage
    for fn, out, ins, free in (p.steps if fused else p.plain_steps):
        add(fn, out, ins, free)
        if tape is not None:    # liveness: a value's storage goes back to the tape's pool after its last reader
            if out in known and out not in holding:
                holding.add(out)
                tape.hold(known[out])
            for j in free:
                if j in holding:
                    holding.discard(j)
                    tape.release(known[j])
    if tape is not None:
        if tape.pending:
            steps.append((tape.segment(), -1, (), ()))
        place = tape.finish([known[j] for fn, out, ins, _ in steps if out >= 0 for j in ins
                             if isinstance(known.get(j), np.ndarray)]
                            + [known[i] for i in p.outputs.values() if isinstance(known.get(i), np.ndarray)])
        if place is not None:
            tape.before.append(place)
        if fed or tape.before:
            steps.insert(0, (partial(_before_tape, tape, list(fed.values())), -1, tuple(fed), ()))
    held_ids = {id(a) for a in held.values()}
    copied = frozenset(role for role, i in p.outputs.items()
                       if tape is not None and id(known.get(i)) not in held_ids)
    return Plan(list(known.items()), feeds, steps, p.labels if fused else {},
                _straight_line(steps, known, feeds, p.outputs, copied) if fused else None,
                threading.Lock() if tape is not None else None, small and tape is None, copied)


def _values_bytes(p: Lowered, env: Env) -> int:
    """The bytes of the values the steps make for this binding (not windows, nor what is written in place)."""
    return sum(4 * math.prod(p.shape(out, env)) for fn, out, _, _ in p.steps
               if not isinstance(fn, Window) and p.ops[out] not in IN_PLACE)


def _in_arena(p: Lowered, slot: int, env: Env, known: dict[int, Any], fed: dict[int, np.ndarray],
              copies: dict[int, np.ndarray], new: dict[int, np.ndarray], tape: Tape) -> Any:
    """A recorded step's operand, known at plan time: as it is where known; else an arena array, into which
    a feed is copied before each run, or the Python step that makes the value copies it as it makes it (added
    to ``new``: the caller makes it so if the step is recorded). Python steps go on reading the values
    themselves (a copy drops a view's layout and soft_max's mark, which choose mul_mat's path). None where
    the value's type has no arena array (the step then runs from Python)."""
    if slot in known:
        return known[slot]
    a = fed.get(slot, copies.get(slot))
    if a is not None:
        return a
    dtype = _ARENA_TYPES.get(p.dtypes[slot])
    if dtype is None or slot in p.written or (slot not in p.feed_slots and dtype != F32):
        return None   # a buffer written in place must be the caller's, not a copy of it
    a = new[slot] = tape.arena(p.shape(slot, env), dtype, fresh=True)
    return a
