"""Golden graphs: one readable text file per (preset, context, phase) under snapshots/test_graphs/.

A change that alters any graph fails here until the snapshot is updated on purpose
(``python -m pytest tests/test_graphs.py --snapshot-update``) and the diff is reviewed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from syrupy.extensions.single_file import SingleFileSnapshotExtension, WriteMode

from conftest import graph_cases

from graphir.forms import to_text
from graphir.model import open_model

SNAPSHOT_DIR = Path(__file__).resolve().parent.parent / "snapshots"
CASES = graph_cases()


class GraphText(SingleFileSnapshotExtension):
    """Stores the folded canonical text as-is, so a snapshot diff is a graph diff."""

    file_extension = "graph.txt"
    _write_mode = WriteMode.TEXT

    @classmethod
    def dirname(cls, *, test_location: Any) -> str:
        return str(SNAPSHOT_DIR / test_location.basename)

    def serialize(self, data: Any, **kwargs: Any) -> str:
        return str(data)


@pytest.fixture
def graph_snapshot(snapshot: Any) -> Any:
    return snapshot.use_extension(GraphText)


@pytest.mark.parametrize("preset,context,phase", CASES, ids=[f"{p}-{c}-{ph}" for p, c, ph in CASES])
def test_graph(preset: str, context: str, phase: str, graph_snapshot: Any) -> None:
    assert to_text(open_model(preset).build_graph(context, phase)) == graph_snapshot


def test_every_snapshot_file_belongs_to_a_case() -> None:
    # NOTE: syrupy reports unused snapshots only when pytest runs without path arguments; this holds always.
    expected = {f"test_graph[{p}-{c}-{ph}].graph.txt" for p, c, ph in CASES}
    assert sorted(p.name for p in (SNAPSHOT_DIR / "test_graphs").iterdir()) == sorted(expected)
