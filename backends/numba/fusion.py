"""Rewrites of a program's steps before any plan: chains of nodes run as one step (a list of rules, each a
pattern and a maker), runs of sibling products on one x run as one kernel call, and f16 conts that only a
mul_mat reads passed through. Every rewrite gives the same bits as the steps it replaces."""

from __future__ import annotations

import threading
from typing import Callable, NamedTuple

from graphir.backends.numba.primitives.isa import IsaPath
from graphir.backends.numba.quant.weight import QWeight, QWeightGroup
from graphir.backends.numba.steps.attention import Attention
from graphir.backends.numba.steps.base import Placed, Step
from graphir.backends.numba.steps.matmul import Siblings, SiblingTake
from graphir.backends.numba.steps.norm import RmsNormWeighted
from graphir.graph.ir import Graph, Node


class Readers:
    """Who reads each value of a graph, and which values are its outputs: whether a value is private to one
    reader, the condition for folding it into that reader's step."""

    def __init__(self, graph: Graph, index: dict[int, int], keep: set[int]):
        self.index, self.keep = index, keep
        self.of: dict[int, list[tuple[Node, int]]] = {}   # id of a node -> the nodes reading it, with the slot
        for n in graph.nodes:
            for slot, x in enumerate(n.inputs):
                self.of.setdefault(id(x), []).append((n, slot))

    def private(self, n: Node, op: str, slot: int) -> bool:
        """Whether n is no output of the graph and only an ``op`` reads it, as its operand ``slot``."""
        return self.index[id(n)] not in self.keep and [(r.op, s) for r, s in self.of.get(id(n), [])] == [(op, slot)]


def contiguous_for_mul_mat_only(graph: Graph, readers: Readers) -> set[int]:
    """The f16 cont steps whose value only a mul_mat reads, as its first operand: mul_mat takes any layout (a
    copy where its kernels need rows, reading a permuted V cache in place where they do not), so these pass
    their operand through instead of copying it. The value is the same array element for element."""
    return {readers.index[id(n)] for n in graph.nodes
            if n.op == "cont" and n.dtype == "f16" and readers.private(n, "mul_mat", 0)}


class Rule(NamedTuple):
    """A chain of nodes run as one step. ``match(node, readers)``: the chain that ends at ``node`` (whose value is
    the step's), or None; ``make(nodes, steps, memo, path)``: the one step and its operand slots, from the chain's
    nodes and their steps."""
    label: str   # the step's name in a profile
    match: Callable[[Node, Readers], tuple[Node, ...] | None]
    make: Callable[[tuple[Node, ...], list[Placed], threading.local, IsaPath], tuple[Step, tuple[int, ...]]]


def _attention_chain(kqv: Node, readers: Readers) -> tuple[Node, ...] | None:
    """(kq, soft_max, kqv), which kernels.attention computes as one: mul_mat of an f16 K with q, soft_max of it
    with a mask and nothing else (no sinks, no ALiBi), mul_mat of an f16 V with that; kq and the probabilities
    read by nothing else and not outputs."""
    sm = kqv.inputs[1] if kqv.op == "mul_mat" else None
    if sm is None or sm.op != "soft_max" or len(sm.inputs) != 2 or sm.attrs["max_bias"] != 0:
        return None
    kq = sm.inputs[0]
    if kq.op != "mul_mat" or kq.inputs[0].dtype != "f16" or kqv.inputs[0].dtype != "f16" \
            or not readers.private(kq, "soft_max", 0) or not readers.private(sm, "mul_mat", 1):
        return None
    return kq, sm, kqv


def _attention_step(nodes: tuple[Node, ...], steps: list[Placed], memo: threading.local,
                    path: IsaPath) -> tuple[Step, tuple[int, ...]]:
    (fk, _, (k, q), _), (fs, _, (_, mask), _), (fv, _, (v, _), _) = steps
    return Attention(nodes[1], fk, fs, fv, memo, path), (k, q, mask, v)


def _norm_weight_chain(mul: Node, readers: Readers) -> tuple[Node, ...] | None:
    """rms_norm then mul by a weight row (a norm's scale), the rms_norm read by nothing else: kernels.norm's
    rms_norm with the weight, which rounds x * scale and then * w as the two steps do."""
    norm, w = mul.inputs if mul.op == "mul" else (None, None)
    if norm is None or norm.op != "rms_norm" or w.op != "weight" or len(w.shape) != 1 \
            or w.shape[0] != norm.shape[0] or not readers.private(norm, "mul", 0):
        return None
    return norm, mul


def _norm_weight_step(nodes: tuple[Node, ...], steps: list[Placed], memo: threading.local,
                      path: IsaPath) -> tuple[Step, tuple[int, ...]]:
    (fn, _, (x,), _), (fm, _, (_, w), _) = steps
    return RmsNormWeighted(nodes[0].attrs["eps"], fn, fm), (x, w)


RULES = (
    Rule("attention", _attention_chain, _attention_step),
    Rule("rms_norm*weight", _norm_weight_chain, _norm_weight_step),
)


def fuse_chains(steps: list[Placed], graph: Graph, readers: Readers, memo: threading.local,
                path: IsaPath) -> tuple[list[Placed], dict[int, str]]:
    """The steps with each rule's chains made one step at the place of the chain's last, and the fused steps'
    labels by output slot. The values the chain's steps freed are freed there, but for those only the chain
    made."""
    index = readers.index
    at = {out: pos for pos, (_, out, _, _) in enumerate(steps)}
    steps, labels, dropped = list(steps), {}, set()
    for rule in RULES:
        for node in graph.nodes:
            nodes = rule.match(node, readers)
            if nodes is None:
                continue
            chain = [steps[at[index[id(n)]]] for n in nodes]
            made = {st[1] for st in chain[:-1]}
            fn, ins = rule.make(nodes, chain, memo, path)
            out = chain[-1][1]
            steps[at[out]] = (fn, out, ins, tuple(sorted(set().union(*(st[3] for st in chain)) - made)))
            labels[out] = rule.label
            dropped |= {at[i] for i in made}
    return [st for pos, st in enumerate(steps) if pos not in dropped], labels


def fuse_siblings(steps: list[Placed], consts: dict[int, object], graph: Graph, memo: threading.local,
                  path: IsaPath) -> None:
    """Runs of consecutive mul_mat steps whose weights are 2-D QWeights of one type and whose x is the same
    value become one step computing them all (a QWeightGroup) and steps that take their results from the
    run's memo. Consecutive only: nothing can run between them, so x is the same value for all."""
    def weight_of(step: Placed) -> QWeight | None:
        _, out, ins, _ = step
        n = graph.nodes[out]
        w = consts.get(ins[0])
        if n.op != "mul_mat" or len(n.inputs[0].shape) != 2 or not isinstance(w, QWeight) \
                or not QWeightGroup.joins(w):              # f32/f16 weights take mul_mat's float paths
            return None
        return w

    s = 0
    while s < len(steps):
        w0 = weight_of(steps[s])
        e = s + 1
        while w0 is not None and e < len(steps) and (w := weight_of(steps[e])) is not None \
                and steps[e][2][1] == steps[s][2][1] and w.qtype == w0.qtype:
            e += 1
        if e - s >= 2:
            run = steps[s:e]
            group = QWeightGroup(tuple(consts[st[2][0]] for st in run))  # type: ignore[misc]
            _, out, ins, free = run[0]
            steps[s] = (Siblings(memo, group, tuple(st[1] for st in run[1:])), out, ins, free)
            for k in range(s + 1, e):
                _, out, ins, free = steps[k]
                steps[k] = (SiblingTake(memo, out, path), out, ins, free)
        s = e
