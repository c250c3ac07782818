"""The package's modules import each other without cycles: every import counts, at module level, inside
functions and under TYPE_CHECKING alike, so a layer below never reaches back into a layer above."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import networkx as nx

ROOTS = ("graphir", "graphir.arch", "graphir.backends")   # the packages installed from folders of their own


def modules() -> dict[str, Path]:
    """Every module of the installed package, by dotted name, subpackages included at any depth."""
    out: dict[str, Path] = {}
    for root in ROOTS:
        spec = importlib.util.find_spec(root)
        assert spec is not None and spec.submodule_search_locations, root
        for folder in map(Path, spec.submodule_search_locations):
            for f in folder.rglob("*.py"):
                parts = f.relative_to(folder).with_suffix("").parts
                out[".".join((root,) + (parts[:-1] if parts[-1] == "__init__" else parts))] = f
    return out


def imported(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The package modules `name` imports anywhere in its source (`from a import b` counts a.b if it is one)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            targets = [base, *(f"{base}.{a.name}" for a in node.names)]
        else:
            continue
        for t in targets:
            while t and t not in known:          # a name inside a module counts as the module
                t = t.rpartition(".")[0]
            if t and t != name:
                found.add(t)
    return found


def import_graph() -> nx.DiGraph:
    known = modules()
    g = nx.DiGraph()
    g.add_nodes_from(known)
    for name, path in known.items():
        g.add_edges_from((name, t) for t in imported(name, path, known))
    return g


def test_the_package_has_no_import_cycles() -> None:
    g = import_graph()
    assert len(g) > 30 and g.has_edge("graphir.running.context", "graphir.running.state")   # the walk sees the whole package
    cycles = sorted(" -> ".join(c + c[:1]) for c in nx.simple_cycles(g))
    assert cycles == []


def test_a_cycle_would_be_found(tmp_path: Path) -> None:
    """The walk counts function-level and TYPE_CHECKING imports: two such modules form a cycle."""
    a, b = tmp_path / "a.py", tmp_path / "b.py"
    a.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from graphir.b import X\n")
    b.write_text("def f():\n    from graphir import a\n")
    known = {"graphir.a": a, "graphir.b": b}
    g = nx.DiGraph((n, t) for n, p in known.items() for t in imported(n, p, known))
    assert sorted(map(sorted, nx.simple_cycles(g))) == [["graphir.a", "graphir.b"]]


def test_the_core_imports_neither_a_backend_nor_numba() -> None:
    """graphir's core finds its backend through an entry point (graphir.running.backend); only graphir.backends.*
    imports numba, and no core module imports graphir.backends."""
    known = modules()
    core = {n: p for n, p in known.items() if not n.startswith(("graphir.backends", "graphir.arch"))}
    reach = {n: sorted(t for t in imported(n, p, known) if t.startswith("graphir.backends")) for n, p in core.items()}
    assert {n: t for n, t in reach.items() if t} == {}
    for n, p in core.items():
        names = {a.name.split(".")[0] for node in ast.walk(ast.parse(p.read_text()))
                 if isinstance(node, (ast.Import, ast.ImportFrom))
                 for a in (node.names if isinstance(node, ast.Import) else [ast.alias(node.module or "")])}
        assert not names & {"numba", "llvmlite"}, n


NUMBA = "graphir.backends.numba"
NUMBA_LAYERS = (("primitives",), ("quant", "kernels"), ("tape",), ("steps",), ("fusion",), ("plan",), ("program",),
                ("backend",))   # lowest first; the units of one layer do not import each other


def unit_of(module: str) -> str:
    """The part of the numba backend a module belongs to: its subpackage, or its own name."""
    return module[len(NUMBA) + 1:].split(".")[0]


def back_edges(g: nx.DiGraph) -> list[str]:
    """Imports inside the numba backend that do not point to a lower layer (or within the importer's own unit)."""
    layer = {u: i for i, units in enumerate(NUMBA_LAYERS) for u in units}
    inside = [(a, b) for a, b in g.edges if a.startswith(NUMBA + ".") and b.startswith(NUMBA + ".")]
    return sorted(f"{a} -> {b}" for a, b in inside
                  if unit_of(a) != unit_of(b) and layer[unit_of(b)] >= layer[unit_of(a)])


def test_the_numba_backend_imports_one_way() -> None:
    """primitives, then quant and kernels (beside each other), then the tape, the steps, fusion, plans, the program
    and the backend object: every import inside the backend points down."""
    g = import_graph()
    units = {unit_of(n) for n in g if n.startswith(NUMBA + ".")}
    assert units == {u for layer in NUMBA_LAYERS for u in layer}   # every part has its layer
    assert g.has_edge(f"{NUMBA}.quant.exact", f"{NUMBA}.primitives.simd")   # the walk sees the backend
    assert back_edges(g) == []


def test_a_back_edge_would_be_found() -> None:
    g = nx.DiGraph([(f"{NUMBA}.kernels.moe", f"{NUMBA}.quant.weight"), (f"{NUMBA}.steps.matmul", f"{NUMBA}.tape"),
                    (f"{NUMBA}.tape", f"{NUMBA}.plan")])
    assert back_edges(g) == [f"{NUMBA}.kernels.moe -> {NUMBA}.quant.weight", f"{NUMBA}.tape -> {NUMBA}.plan"]
