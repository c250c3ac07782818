"""The package's modules import each other without cycles: every import counts, at module level, inside
functions and under TYPE_CHECKING alike, so a layer below never reaches back into a layer above."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import networkx as nx

PACKAGES = ("graphir", "graphir.files", "graphir.graph", "graphir.memory", "graphir.model", "graphir.running",
            "graphir.tokenizer", "graphir.arch", "graphir.backends", "graphir.backends.numba.kernels",
            "graphir.backends.numba.quant")


def modules() -> dict[str, Path]:
    """Every module of the installed package, by dotted name (subpackages may live in other folders)."""
    out: dict[str, Path] = {}
    for pkg in PACKAGES:
        spec = importlib.util.find_spec(pkg)
        assert spec is not None and spec.submodule_search_locations, pkg
        for folder in spec.submodule_search_locations:
            for f in Path(folder).glob("*.py"):
                out[pkg if f.stem == "__init__" else f"{pkg}.{f.stem}"] = f
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
