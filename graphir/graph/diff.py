"""Readable differences between two graphs, in three layers of detail.

A hash says *whether* two graphs differ; a reviewer needs *what* and *where*. So a diff gives (a) a summary:
header changes, node and op counts per layer, weights added, removed or retyped; (b) the first mismatch, the
earliest node whose own signature (op, type, operands by slot, attributes) differs, named by its layer-scoped
path, which is usually the root cause since everything downstream merely inherits it; (c) a unified diff of
the unfolded canonical text. Nodes are matched by name, which is sound because names are semantic and scoped
by layer. Every list comes out in emission or sorted order, so the same two graphs always give the same text.
"""

from __future__ import annotations

import difflib
from collections import Counter
from dataclasses import dataclass
from typing import Any

from graphir.graph.forms import _attr, node_line, to_text
from graphir.graph.hashing import graph_hash
from graphir.graph.ir import Graph, Node, layer_of
from graphir.graph.ops import OPS

ABSENT = "-"


@dataclass
class GraphDiff:
    same: bool  # graph_hash equal and canonical unfolded text equal
    summary: list[str]
    first: str | None  # the earliest differing node (a's emission order, b-only nodes where b emits them)
    layers: list[int]  # layers holding a node that differs, sorted
    unified: str  # unified diff of the unfolded texts
    hashes: tuple[str, str]
    labels: tuple[str, str]

    def render(self) -> str:
        """Summary, first mismatch, then the unified diff (or one line when the graphs are identical)."""
        if self.same:
            return f"graphs are identical (hash {self.hashes[0][:16]})\n"
        lines = list(self.summary)
        if self.first is not None:
            lines.append(f"first mismatch: {self.first}")
        return "\n".join(lines) + "\n\n" + self.unified

    def as_dict(self) -> dict[str, Any]:
        """JSON-able form, for ``graphir diff --json``."""
        return {
            "same": self.same,
            "a": {"label": self.labels[0], "hash": self.hashes[0]},
            "b": {"label": self.labels[1], "hash": self.hashes[1]},
            "summary": self.summary,
            "first": self.first,
            "layers": self.layers,
            "unified": self.unified,
        }


def diff_graphs(a: Graph, b: Graph, a_label: str = "a", b_label: str = "b") -> GraphDiff:
    hashes = graph_hash(a), graph_hash(b)
    text_a, text_b = to_text(a, fold=False), to_text(b, fold=False)
    labels = a_label, b_label
    if hashes[0] == hashes[1] and text_a == text_b:
        return GraphDiff(True, [], None, [], "", hashes, labels)

    order = _merged_order(a, b)
    differing = [name for name in order
                 if name not in a or name not in b or _signature(a[name]) != _signature(b[name])]
    layers = sorted({il for il in map(layer_of, differing) if il is not None})
    added = sum(1 for name in differing if name not in a)
    removed = sum(1 for name in differing if name not in b)

    if hashes[0] == hashes[1]:
        summary = [f"hash: {hashes[0][:16]} on both sides (same structure; names or header differ)"]
    else:
        summary = [f"hash: {hashes[0][:16]} -> {hashes[1][:16]}"]
    found = _header_changes(a, b)
    if differing:
        found.append(f"nodes: {len(a)} -> {len(b)} ({added} added, {removed} removed, "
                     f"{len(differing) - added - removed} changed)")
    if layers:
        found.append(f"layers: {_ranges(layers)}")
    found += _op_count_changes(a, b) + _weight_changes(a, b, order)
    summary += found or ["nodes and header are equal; only the emission order differs"]
    first = _describe(differing[0], a, b, labels) if differing else None
    unified = "".join(difflib.unified_diff(text_a.splitlines(keepends=True), text_b.splitlines(keepends=True),
                                           fromfile=a_label, tofile=b_label, n=3))
    return GraphDiff(False, summary, first, layers, unified, hashes, labels)


# ---- matching nodes --------------------------------------------------------------------------------------

def _merged_order(a: Graph, b: Graph) -> list[str]:
    """a's emission order, each b-only node placed just before the next node b emits that a also has."""
    before: dict[str, list[str]] = {}
    pending: list[str] = []
    for n in b.nodes:
        if n.name in a:
            if pending:
                before[n.name], pending = pending, []
        else:
            pending.append(n.name)
    order: list[str] = []
    for n in a.nodes:
        order += before.get(n.name, [])
        order.append(n.name)
    return order + pending


def _attr_texts(n: Node) -> dict[str, str]:
    return {k: _attr(v) for k, v in n.attrs.items()}


def _signature(n: Node) -> tuple[Any, ...]:
    """What a node says about itself: op, type, operand names by slot, attributes as printed (in order)."""
    return n.op, n.type_str, tuple(x.name for x in n.inputs), tuple(_attr_texts(n).items())


def _describe(name: str, a: Graph, b: Graph, labels: tuple[str, str]) -> str:
    """``<path>: <what differs>`` for one node, every differing part of its signature in order."""
    if name not in b:
        return f"{name}: only in {labels[0]} ({node_line(a[name])})"
    if name not in a:
        return f"{name}: only in {labels[1]} ({node_line(b[name])})"
    x, y = a[name], b[name]
    parts = []
    if x.op != y.op:
        parts.append(f"op {x.op} -> {y.op}")
    if x.type_str != y.type_str:
        parts.append(f"type {x.type_str} -> {y.type_str}")
    slots = OPS[x.op].operands if x.op == y.op and x.op in OPS else ()
    for slot in range(max(len(x.inputs), len(y.inputs))):
        old, new = (_operand(n, slot) for n in (x, y))
        if old != new:
            role = f" ({slots[slot].rstrip('?')})" if slot < len(slots) else ""
            parts.append(f"operand {slot}{role}: {old} -> {new}")
    parts += _keyed_changes("attr", _attr_texts(x), _attr_texts(y))
    return f"{name}: " + "; ".join(parts)


def _operand(n: Node, slot: int) -> str:
    return "%" + n.inputs[slot].name if slot < len(n.inputs) else ABSENT


def _keyed_changes(what: str, old: dict[str, str], new: dict[str, str]) -> list[str]:
    """``<what> <key>: <old> -> <new>`` per differing key (old's order, then new's extra keys); else order."""
    keys = list(old) + [k for k in new if k not in old]
    out = [f"{what} {k}: {old.get(k, ABSENT)} -> {new.get(k, ABSENT)}" for k in keys if old.get(k) != new.get(k)]
    if not out and list(old) != list(new):
        out.append(f"{what} order: {', '.join(old)} -> {', '.join(new)}")
    return out


# ---- summary ---------------------------------------------------------------------------------------------

def _hparams(g: Graph) -> dict[str, str]:
    return {k: _attr(v) for k, v in g.meta.get("hparams", {}).items()}


def _dims(g: Graph) -> dict[str, str]:
    return {d.name: f"[{d.min}, {'inf' if d.max is None else d.max}]" for d in g.dims}


def _outputs(g: Graph) -> dict[str, str]:
    return {role: "%" + n.name for role, n in g.outputs.items()}


def _header_changes(a: Graph, b: Graph) -> list[str]:
    out = [f"{k}: {a.meta.get(k, ABSENT)} -> {b.meta.get(k, ABSENT)}"
           for k in ("arch", "context", "phase") if a.meta.get(k) != b.meta.get(k)]
    for what, facts in (("hparams", _hparams), ("dim", _dims), ("output", _outputs)):
        out += _keyed_changes(what, facts(a), facts(b))
    return out


def _op_counts(g: Graph) -> dict[int | None, Counter[str]]:
    counts: dict[int | None, Counter[str]] = {}
    for n in g.nodes:
        counts.setdefault(n.layer, Counter())[n.op] += 1
    return counts


def _count_changes(old: Counter[str], new: Counter[str]) -> str:
    return ", ".join(f"{op} {old[op]} -> {new[op]}" for op in sorted(old.keys() | new.keys()) if old[op] != new[op])


def _op_count_changes(a: Graph, b: Graph) -> list[str]:
    """Op counts that changed: in total, outside layers, then per layer (runs of equal changes folded)."""
    ca, cb = _op_counts(a), _op_counts(b)
    out = []
    total = _count_changes(sum(ca.values(), Counter()), sum(cb.values(), Counter()))
    if total:
        out.append(f"ops: {total}")
    top = _count_changes(ca.get(None, Counter()), cb.get(None, Counter()))
    if top:
        out.append(f"global: {top}")
    runs: list[tuple[list[int], str]] = []
    for il in sorted(k for k in ca.keys() | cb.keys() if k is not None):
        change = _count_changes(ca.get(il, Counter()), cb.get(il, Counter()))
        if not change:
            continue
        if runs and runs[-1][1] == change and runs[-1][0][-1] == il - 1:
            runs[-1][0].append(il)
        else:
            runs.append(([il], change))
    out += [f"blk.{_ranges(ils)}: {change}" for ils, change in runs]
    return out


def _weight_changes(a: Graph, b: Graph, order: list[str]) -> list[str]:
    wa = {n.name: n.type_str for n in a.weights}
    wb = {n.name: n.type_str for n in b.weights}
    out = []
    for name in order:
        old, new = wa.get(name), wb.get(name)
        if old == new:
            continue
        if new is None:
            out.append(f"weight removed: %{name} : {old}")
        elif old is None:
            out.append(f"weight added: %{name} : {new}")
        else:
            out.append(f"weight changed: %{name}: {old} -> {new}")
    return out


def _ranges(ils: list[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``0-2, 5`` (input sorted)."""
    spans: list[list[int]] = []
    for il in ils:
        if spans and spans[-1][1] == il - 1:
            spans[-1][1] = il
        else:
            spans.append([il, il])
    return ", ".join(str(lo) if lo == hi else f"{lo}-{hi}" for lo, hi in spans)
