"""Feedback on long work: a first run says that numba is compiling, a conversion draws its tensors, and nothing
is drawn off a terminal, under --quiet, or when the kernels come from numba's cache."""

from __future__ import annotations

import io
import os
import pty
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from conftest import make_tiny_preset, write_model_gguf
from numba import njit

from graphir.cli import main
from graphir.convert import convert_bert
from graphir.backends.numba.primitives.jit import compiling
from graphir.progress import stream

COMPILING = "compiling kernels (first run only; numba caches them)"


def test_a_compile_is_counted_and_named_and_a_compiled_kernel_draws_nothing_and_calls_nothing() -> None:
    def twice(x: np.ndarray) -> np.ndarray:
        return x * 2

    kernel = njit(twice)  # no cache: compiled in this process, on its first call
    out = io.StringIO()
    with compiling(out):
        kernel(np.ones(3))
    assert f"{COMPILING}: 1 in 00:0" in out.getvalue() and out.getvalue().endswith(", twice\n")
    again, calls = io.StringIO(), []
    with compiling(again, lambda: calls.append(1)):
        kernel(np.ones(3))
    assert again.getvalue() == "" and calls == []   # nothing compiled: nothing drawn, nothing called
    with compiling(None, lambda: calls.append(1)):
        njit(twice)(np.ones(3))
        njit(twice)(np.ones(3))
    assert calls == [1]                               # once, at the first of the compiles


def test_progress_is_drawn_only_on_a_terminal_and_not_when_quiet(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys.stderr, "isatty", lambda: False, raising=False)
    assert stream() is None
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    assert stream() is sys.stderr and stream(quiet=True) is None


def test_a_conversion_draws_each_tensor_written(minilm_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    out = io.StringIO()
    convert_bert(minilm_dir, tmp_path / "a.gguf", "f16", progress=out)
    assert "writing a.gguf" in out.getvalue() and "101/101" in out.getvalue()
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    assert main(["convert", str(minilm_dir), "-o", str(tmp_path / "b.gguf")]) == 0
    assert "writing b.gguf" in capsys.readouterr().err
    assert main(["convert", str(minilm_dir), "-o", str(tmp_path / "c.gguf"), "--quiet"]) == 0
    assert capsys.readouterr().err == ""


def test_a_first_run_on_a_terminal_says_numba_is_compiling(tmp_path: Path) -> None:
    """``graphir run`` in a process whose stderr is a terminal (a pseudo-terminal here) and whose numba cache is
    empty, as on a fresh install; then again with the cache filled: no compile, no progress line."""
    model = write_model_gguf(tmp_path / "tiny.gguf", make_tiny_preset("llama"))
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "numba-cache")}

    def run() -> tuple[str, str]:
        main_fd, term = pty.openpty()
        got: list[bytes] = []
        reader = threading.Thread(target=lambda: got.extend(iter(lambda: _read(main_fd), b"")))
        reader.start()
        p = subprocess.run([sys.executable, "-m", "graphir", "run", str(model), "-p", "hello", "-n", "2"],
                           stdout=subprocess.PIPE, stderr=term, env=env, timeout=600)
        os.close(term)
        reader.join(60)
        os.close(main_fd)
        assert p.returncode == 0
        return p.stdout.decode(), b"".join(got).decode(errors="replace")

    first_out, first_err = run()
    assert COMPILING in first_err
    again_out, again_err = run()
    assert COMPILING not in again_err and again_out == first_out


def _read(fd: int) -> bytes:
    try:
        return os.read(fd, 4096)
    except OSError:  # the terminal's other end closed
        return b""


def test_a_generation_written_to_a_file_draws_its_tokens(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Text streaming to the terminal is its own progress; text redirected elsewhere gets a bar on stderr."""
    model = write_model_gguf(tmp_path / "tiny.gguf", make_tiny_preset("llama"))
    argv = ["run", str(model), "-p", "hello", "-n", "5", "--temp", "0"]
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    monkeypatch.setattr(sys.stdout, "isatty", lambda: False, raising=False)
    assert main(argv) == 0
    out, err = capsys.readouterr()
    generated = int(err.rsplit("generation: ", 1)[1].split(" tokens")[0])
    assert generated >= 1 and "generating: " in err and f"| {generated}/5 " in err
    assert main([*argv, "--quiet"]) == 0
    quiet_out, quiet_err = capsys.readouterr()
    assert "generating" not in quiet_err and quiet_out == out
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True, raising=False)  # the text itself shows progress
    assert main(argv) == 0
    assert "generating" not in capsys.readouterr().err
