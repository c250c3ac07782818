"""Graphviz DOT rendering of a graph, whole or a slice of its layers.

ggml's own DOT dump names nodes by pointer, so two dumps of one model never compare; here a node's id is its
semantic name and nodes and edges come in emission order, so the output is byte-identical across runs.
Edges carry the operand slot, without which swapped operands look the same. A whole large model is too big
for Graphviz to lay out, hence ``layers``: a few layers, with the values they read from elsewhere drawn as
dashed boundary nodes.
"""

from __future__ import annotations

import shutil
import subprocess

from graphir.errors import GraphirError
from graphir.graph.ir import Graph, Node

SVG_TIMEOUT_S = 600  # Graphviz lays out a whole small model in seconds; a hang past this is reported, not waited on

# shape and fill colour of the leaves; computations are plain boxes
_LEAF_LOOK = {"weight": ("note", "#e8e8e8"), "input": ("invhouse", "#d8e8f8")}


def _escape(s: str) -> str:
    return s.replace("\\", "\\\\").replace('"', '\\"')


def _quote(s: str) -> str:
    return f'"{_escape(s)}"'


def _node(n: Node, boundary: bool, output: bool) -> str:
    shape, fill = _LEAF_LOOK.get(n.op, ("box", ""))
    label = "\\n".join(_escape(part) for part in (n.op, n.name, n.type_str))
    attrs = [f'label="{label}"', f"shape={shape}"]
    styles = (["filled"] if fill else []) + (["dashed"] if boundary else [])
    if styles:
        attrs.append(f'style="{",".join(styles)}"')
    if fill:
        attrs.append(f'fillcolor="{fill}"')
    if output:
        attrs.append("peripheries=2")
    return f"  {_quote(n.name)} [{', '.join(attrs)}];"


def to_dot(g: Graph, layers: tuple[int, int] | None = None) -> str:
    """DOT text of ``g``; ``layers=(A, B)`` keeps layers A..B-1 plus the nodes they read as boundary nodes."""
    if layers is None:
        kept = g.nodes
    else:
        lo, hi = layers
        kept = [n for n in g.nodes if n.layer is not None and lo <= n.layer < hi]
    kept_names = {n.name for n in kept}
    read = {x.name for n in kept for x in n.inputs}
    shown = [n for n in g.nodes if n.name in kept_names or n.name in read]
    outputs = {n.name for n in g.outputs.values()}
    lines = ["digraph graphir {", '  node [fontname="monospace", fontsize=10];',
             '  edge [fontname="monospace", fontsize=9];']
    lines += [_node(n, n.name not in kept_names, n.name in outputs) for n in shown]
    lines += [f'  {_quote(x.name)} -> {_quote(n.name)} [label="{slot}"];'
              for n in kept for slot, x in enumerate(n.inputs)]
    lines.append("}")
    return "\n".join(lines) + "\n"


def parse_layers(spec: str, n_layer: int) -> tuple[int, int]:
    """A command-line layer range as a half-open ``(A, B)``: ``3:5``, ``3:``, ``:2``, ``7``; negatives count back."""
    try:
        bounds = [int(p) if p.strip() else None for p in spec.split(":")]
    except ValueError:
        bounds = []
    if len(bounds) == 1 and bounds[0] is not None:
        il = bounds[0]
        if not -n_layer <= il < n_layer:
            raise ValueError(f"layer {il} is out of range: the model has {n_layer} layers (0..{n_layer - 1})")
        il += n_layer if il < 0 else 0
        return il, il + 1
    if len(bounds) != 2:
        raise ValueError(f"expected A:B, A:, :B or N with whole numbers, got {spec!r}")
    start, stop = (0 if bounds[0] is None else bounds[0]), (n_layer if bounds[1] is None else bounds[1])
    for b in (start, stop):
        if not -n_layer <= b <= n_layer:
            raise ValueError(f"layer bound {b} is out of range: the model has {n_layer} layers (0..{n_layer - 1})")
    start, stop = (b + n_layer if b < 0 else b for b in (start, stop))
    if start >= stop:
        raise ValueError(f"{spec!r} selects no layer (it means {start}:{stop}; the start must be below the stop)")
    return start, stop


def to_svg(dot: str) -> str:
    """The picture of DOT text, laid out by Graphviz's ``dot`` (a program, not a Python package: no package on
    PyPI ships it, so graphir draws through the one the system has, and says where to get it when there is none)."""
    exe = shutil.which("dot")
    if exe is None:
        raise GraphirError("--format svg needs Graphviz's 'dot' program, which is not on PATH: install the "
                           "'graphviz' package of your system (apt-get install graphviz, brew install graphviz, "
                           "conda install graphviz)")
    try:
        done = subprocess.run([exe, "-Tsvg"], input=dot.encode(), capture_output=True, timeout=SVG_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise GraphirError(f"Graphviz's dot did not finish laying out the graph in {SVG_TIMEOUT_S} s: draw fewer "
                           f"layers (--layers)") from None
    if done.returncode != 0:
        why = done.stderr.decode(errors="replace").strip().splitlines()
        raise GraphirError(f"Graphviz's dot ({exe}) failed with exit {done.returncode}: "
                           f"{why[-1] if why else 'no message'}")
    return done.stdout.decode()
