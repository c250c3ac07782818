"""Golden graphs: one readable text file per (preset, context, phase) under snapshots/test_graphs/.

A change that alters any graph fails here until the snapshot is updated on purpose
(``python -m pytest tests/test_graphs.py --snapshot-update``) and the diff is reviewed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from syrupy.extensions.single_file import SingleFileSnapshotExtension, WriteMode

from graphir.forms import to_text
from graphir.model import open_model
from graphir.presets import PRESETS

SNAPSHOT_DIR = Path(__file__).resolve().parent.parent / "snapshots"
CONTEXTS = [("none", "prefill"), ("kv", "prefill"), ("kv", "decode")]


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


@pytest.mark.parametrize("context,phase", CONTEXTS, ids=[f"{c}-{p}" for c, p in CONTEXTS])
@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_graph(preset: str, context: str, phase: str, graph_snapshot: Any) -> None:
    assert to_text(open_model(preset).build_graph(context, phase)) == graph_snapshot


def test_every_snapshot_file_belongs_to_a_case() -> None:
    # NOTE: syrupy reports unused snapshots only when pytest runs without path arguments; this holds always.
    expected = {f"test_graph[{p}-{c}-{ph}].graph.txt" for p in PRESETS for c, ph in CONTEXTS}
    assert sorted(p.name for p in (SNAPSHOT_DIR / "test_graphs").iterdir()) == sorted(expected)
