"""graphir.testing: another project golden-checks its model's graph in three lines, with graphir's workflow.

The downstream project is made by pytester in a directory of its own: its test file is DOWNSTREAM and its
model a tiny Llama GGUF. Its first run with ``--snapshot-update`` stores the graph's canonical text; a plain
run passes; a file whose graph changed (another FFN width) fails with the lines that differ; a snapshot that no
test uses any more fails the run, as graphir's own snapshots do.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import pytest
from conftest import make_tiny_preset, write_model_gguf

from graphir.graph.forms import to_text
from graphir.source import load_graph

pytest_plugins = ["pytester"]

DOWNSTREAM = '''
def test_my_model_graph(graphir_snapshot):
    graphir_snapshot("model.gguf", context="kv", phase="decode")
'''
SNAPSHOT = Path("__snapshots__", "test_model_graph", "test_my_model_graph.graph.txt")


def model(directory: Path, n_ff: int) -> Path:
    preset = make_tiny_preset("llama", **{gguf.Keys.LLM.FEED_FORWARD_LENGTH: n_ff})
    return write_model_gguf(directory / "model.gguf", preset)


def test_a_downstream_project_stores_checks_and_catches_a_changed_graph(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_model_graph=DOWNSTREAM)
    path = model(pytester.path, 128)
    pytester.runpytest("--snapshot-update").assert_outcomes(passed=1)
    stored = (pytester.path / SNAPSHOT).read_text()
    assert stored == to_text(load_graph(str(path), "kv", "decode"))
    assert "blk.1.ffn_up" in stored and "128" in stored

    pytester.runpytest().assert_outcomes(passed=1)

    model(pytester.path, 96)  # the model's FFN narrows: its graph is another one
    changed = pytester.runpytest()
    changed.assert_outcomes(failed=1)
    assert changed.ret == pytest.ExitCode.TESTS_FAILED
    changed.stdout.fnmatch_lines(["*test_my_model_graph*", "*96*"])
    assert (pytester.path / SNAPSHOT).read_text() == stored  # nothing is rewritten without --snapshot-update

    pytester.runpytest("--snapshot-update").assert_outcomes(passed=1)
    assert (pytester.path / SNAPSHOT).read_text() == to_text(load_graph(str(path), "kv", "decode")) != stored


def test_a_snapshot_no_test_uses_fails_the_run(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_model_graph=DOWNSTREAM)
    model(pytester.path, 128)
    pytester.runpytest("--snapshot-update").assert_outcomes(passed=1)
    pytester.makepyfile(test_model_graph="def test_nothing():\n    pass\n")
    result = pytester.runpytest()
    result.stdout.fnmatch_lines(["*1 snapshot unused*"])
    assert result.ret == pytest.ExitCode.TESTS_FAILED


def test_a_source_graphir_cannot_read_is_its_one_line_error(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_model_graph=DOWNSTREAM)  # no model.gguf: the source names no file and no preset
    result = pytester.runpytest()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*graphir: model.gguf: no such file*"])
    result.stdout.no_fnmatch_line("*Traceback*")


def test_a_changed_graph_shows_its_diff_in_an_editable_install_too(pytester: pytest.Pytester) -> None:
    """pytest rewrites the asserts of plugins installed from a wheel only; graphir installed with pip install -e
    (as the README installs it) must still show the lines that changed, in a pytest process of its own."""
    pytester.makepyfile(test_model_graph=DOWNSTREAM)
    model(pytester.path, 128)
    pytester.runpytest_subprocess("--snapshot-update").assert_outcomes(passed=1)
    model(pytester.path, 96)
    changed = pytester.runpytest_subprocess()
    changed.assert_outcomes(failed=1)
    changed.stdout.fnmatch_lines(["*the graph is not the stored snapshot:*",
                                  "-*128*", "+*96*"])
