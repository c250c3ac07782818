"""Golden graphs in any project's tests: a pytest plugin (entry point ``graphir``) with one fixture.

``graphir_snapshot(src, context=None, phase=None)`` builds the graph of a GGUF file, a preset or a saved graph,
or with ``llama.cpp:`` before it the graph llama.cpp itself builds (as ``graphir dump`` reads SRC; no weight is
read; one it cannot read fails the test with graphir's one-line error) and compares its canonical text with the
file stored beside the test, ``__snapshots__/<test file>/<test name>.graph.txt``; a changed graph fails the test
with the lines that differ. The workflow is graphir's own, through syrupy: ``pytest --snapshot-update`` writes
the files, review reads their diff, and an unused snapshot fails the run. In a downstream project::

    def test_my_model_graph(graphir_snapshot):
        graphir_snapshot("my-model.gguf", context="kv", phase="decode")
        graphir_snapshot("llama.cpp:my-model.gguf", phase="decode")   # llama.cpp's own graph of it

Loaded into every pytest run of an environment where graphir is installed, so it imports nothing heavy until
the fixture is used, and asks for syrupy only then.
"""

from __future__ import annotations

import difflib
import functools
import os
from typing import TYPE_CHECKING, Any, Callable

import pytest

if TYPE_CHECKING:
    from graphir.graph.ir import Graph


@functools.cache
def graph_text() -> type:
    """syrupy's one-file-per-snapshot extension storing a graph's canonical text as it is, so that the diff of a
    snapshot is the diff of a graph (made on first use: syrupy is needed by the fixture, not by the plugin)."""
    from syrupy.extensions.single_file import SingleFileSnapshotExtension, WriteMode

    class GraphText(SingleFileSnapshotExtension):
        file_extension = "graph.txt"
        _write_mode = WriteMode.TEXT

        def serialize(self, data: Any, **kwargs: Any) -> str:
            return str(data)

    return GraphText


@pytest.fixture
def graphir_snapshot(request: pytest.FixtureRequest) -> Callable[..., None]:
    """Assert that the graph of ``src`` (a GGUF path, a preset name, a saved graph, ``llama.cpp:`` and one of those,
    or a Graph) for ``context`` and ``phase`` (the source's defaults when None) is the stored one."""
    try:
        snapshot = request.getfixturevalue("snapshot")
    except pytest.FixtureLookupError:
        pytest.fail("graphir_snapshot stores its graphs through syrupy, which is not installed: pip install syrupy",
                    pytrace=False)
    golden = snapshot.use_extension(graph_text())

    def check(src: str | os.PathLike[str] | Graph, context: str | None = None, phase: str | None = None) -> None:
        from graphir.errors import GraphirError
        from graphir.graph.forms import to_text
        from graphir.graph.ir import Graph
        from graphir.source import load_graph

        try:
            graph = src if isinstance(src, Graph) else load_graph(src, context, phase)
        except GraphirError as e:  # the source's problem, said as graphir's CLI says it: one line
            pytest.fail(f"graphir: {e}", pytrace=False)
        # compared here, not by pytest's assert: pytest rewrites the asserts of a plugin installed from a wheel,
        # not of one installed editable (pip install -e), where a bare assert would fail with no diff
        text = to_text(graph)
        if not golden == text:  # syrupy records the comparison (and, updating, the new graph)
            stored = golden.executions[golden.num_executions - 1].recalled_data
            if stored is None:
                pytest.fail("the graph has no stored snapshot: pytest --snapshot-update writes it", pytrace=False)
            diff = difflib.unified_diff(str(stored).splitlines(), text.splitlines(), "stored", "now", lineterm="", n=1)
            pytest.fail("the graph is not the stored snapshot:\n" + "\n".join(diff), pytrace=False)

    return check
