"""The package's modules import each other without cycles (every import counts, at module level, inside
functions and under TYPE_CHECKING alike), and the core's packages are layered: each imports only the ones
below it in :data:`LAYERS`, so a layer below never reaches back into a layer above."""

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


def imports(name: str, path: Path, known: dict[str, Path]) -> set[tuple[str, bool]]:
    """The package modules `name` imports anywhere in its source (`from a import b` counts a.b if it is one),
    each with whether the import sits inside a function (runs when called, not when `name` is imported)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[tuple[str, bool]] = set()

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            targets = [base, *(f"{base}.{a.name}" for a in node.names)]
        else:
            return
        for t in targets:
            while t and t not in known:          # a name inside a module counts as the module
                t = t.rpartition(".")[0]
            if t and t != name:
                found.add((t, in_function))

    visit(ast.parse(path.read_text(), str(path)), False)
    return found


def imported(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The package modules `name` imports anywhere in its source, wherever the import sits."""
    return {t for t, _ in imports(name, path, known)}


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


# The core's packages from the bottom up: a module may import its own package and the ones on earlier rows,
# never a later row. The first row holds leaves every layer uses (the package root holds only the version and
# attributes it loads lazily by name).
LAYERS: tuple[tuple[str, ...], ...] = (
    ("graphir", "graphir.errors", "graphir.progress"),
    ("graphir.graph",),          # the IR, its ops and forms
    ("graphir.files",),          # file formats: GGUF, tensors, safetensors headers
    ("graphir.tokenizer",),
    ("graphir.batch",),          # batches and ubatch splits (llama-batch sits below llama-memory)
    ("graphir.memory",),         # what a context keeps; hands the builder its layers' inputs
    ("graphir.model",),          # hparams, tensors, architectures' interface, the graph builder, HF configs
    ("graphir.convert",),        # Hugging Face checkpoints to GGUF, by the model's mapping
    ("graphir.llamacpp",),       # llama.cpp's own graphs, read through llama-cpp-python, and their normal form
    ("graphir.media",),          # pictures as llama.cpp's mtmd prepares them for a tower
    ("graphir.running",),        # contexts, state files, runtime
    ("graphir.serving",),        # the HTTP server: many requests as sequences of one context
    ("graphir.source",),
    ("graphir.testing",),
    ("graphir.cli", "graphir.__main__"),
)
# The plugins sit above the whole core; the core reaches them only from inside functions (graphir.model's
# discovery loading the families of graphir.arch, the command line listing them): that lazy import is the plugin
# mechanism, not a layer violation. graphir.backends is not imported by the core at all (see above).
PLUGINS = ("graphir.arch", "graphir.backends")


def layer_of(module: str) -> int | None:
    """The row of LAYERS a core module's package is on (None: a plugin's module)."""
    if module.startswith(tuple(p + "." for p in PLUGINS)) or module in PLUGINS:
        return None
    rows = [(len(pkg), i) for i, row in enumerate(LAYERS) for pkg in row
            if module == pkg or (pkg != "graphir" and module.startswith(pkg + "."))]   # the root is only itself
    assert rows, f"{module} is on no row of LAYERS: add its package where it belongs"
    return max(rows)[1]


def upward_imports(known: dict[str, Path]) -> list[str]:
    """Every import of a core module that points to a later row of LAYERS, or to a plugin outside a function."""
    bad = []
    for name, path in sorted(known.items()):
        mine = layer_of(name)
        if mine is None:
            continue
        for target, lazy in sorted(imports(name, path, known)):
            theirs = layer_of(target)
            if theirs is None and not lazy:
                bad.append(f"{name} -> {target} (a plugin, imported when the module loads)")
            elif theirs is not None and theirs > mine:
                bad.append(f"{name} -> {target}")
    return bad


def test_every_core_package_imports_only_the_layers_below_it() -> None:
    assert upward_imports(modules()) == []


def test_an_upward_import_would_be_found(tmp_path: Path) -> None:
    """A memory module importing the builder (under TYPE_CHECKING too) points up; a function importing a
    family module is the plugin mechanism, the same import at module level is not."""
    mem, fam, lazy, eager = (tmp_path / f"{n}.py" for n in ("mem", "fam", "lazy", "eager"))
    mem.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from graphir.model.builder import B\n")
    fam.write_text("")
    lazy.write_text("def load():\n    from graphir.arch import fam\n")
    eager.write_text("from graphir.arch import fam\n")
    known = {"graphir.memory.mem": mem, "graphir.model.builder": fam, "graphir.arch.fam": fam,
             "graphir.model.lazy": lazy, "graphir.model.eager": eager}
    assert upward_imports(known) == ["graphir.memory.mem -> graphir.model.builder",
                                     "graphir.model.eager -> graphir.arch.fam (a plugin, imported when the "
                                     "module loads)"]


NUMBA = "graphir.backends.numba"
NUMBA_LAYERS = (("primitives", "heap"), ("quant", "kernels"), ("tape",), ("steps",), ("fusion",), ("plan",), ("program",),
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
    """primitives (and, beside them, the heap's setting), then quant and kernels (beside each other), then the tape,
    the steps, fusion, plans, the program and the backend object: every import inside the backend points down."""
    g = import_graph()
    units = {unit_of(n) for n in g if n.startswith(NUMBA + ".")}
    assert units == {u for layer in NUMBA_LAYERS for u in layer}   # every part has its layer
    assert g.has_edge(f"{NUMBA}.quant.exact", f"{NUMBA}.primitives.simd")   # the walk sees the backend
    assert back_edges(g) == []


def test_a_back_edge_would_be_found() -> None:
    g = nx.DiGraph([(f"{NUMBA}.kernels.moe", f"{NUMBA}.quant.weight"), (f"{NUMBA}.steps.matmul", f"{NUMBA}.tape"),
                    (f"{NUMBA}.tape", f"{NUMBA}.plan")])
    assert back_edges(g) == [f"{NUMBA}.kernels.moe -> {NUMBA}.quant.weight", f"{NUMBA}.tape -> {NUMBA}.plan"]
