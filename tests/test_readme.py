"""README.md as tests: every code block says what it is in its fence, and every block but an illustration runs.

* ``console``: a shell transcript. Its ``$`` lines (and ``>`` lines, a command's next lines) run in one bash, in a scratch directory where ``tests`` is this
  repository's tests; what they print on stdout must be the block's other lines, figure for figure.
* ``python``: runs, the blocks in README order sharing one namespace and the scratch directory (a file one block
  writes, the next may read).
* ``sh setup``: a set-up command of the quick start. Its steps after the installation run as written; the test
  command must be the one .ci/run runs (it is CI itself, so it is not run again here).
* ``text``: an illustration (an excerpt, a layout, a workflow): not run.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
KINDS = ("console", "python", "sh setup", "text")
SETUP_STEPS = ("python3 -m venv ", ". .venv/bin/activate", "python3 -m pip install ")


def blocks() -> list[tuple[int, str, str]]:
    """(line, fence info, body) of every fenced block of README.md."""
    out, lines = [], (ROOT / "README.md").read_text().splitlines()
    i = 0
    while i < len(lines):
        if lines[i].startswith("```"):
            start, info = i, lines[i][3:].strip()
            i += 1
            while not lines[i].startswith("```"):
                i += 1
            out.append((start + 1, info, "\n".join(lines[start + 1:i])))
        i += 1
    return out


BLOCKS = blocks()


def test_every_block_says_what_it_is() -> None:
    unmarked = [f"README.md:{line} ```{info}" for line, info, _ in BLOCKS if info not in KINDS]
    assert not unmarked, f"mark these blocks as one of {KINDS}: {unmarked}"


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("readme")
    (d / "tests").symlink_to(ROOT / "tests")
    (d / "docs").mkdir()
    return d


@pytest.fixture(scope="module")
def namespace() -> dict[str, Any]:
    return {"__name__": "readme"}


def shell_env() -> dict[str, str]:
    """This interpreter's python3 and graphir first on PATH, as an activated virtual environment has them."""
    bin_dir = Path(sys.executable).parent
    return {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}", "PYTHONWARNINGS": "ignore"}


def run_transcript(body: str, cwd: Path) -> tuple[str, str]:
    """(what the $ lines print, what the block says they print)."""
    commands, expected = [], []
    for line in body.split("\n"):  # a blank last line is output too
        if line.startswith("$ "):
            commands.append(line[2:])
        elif line.startswith("> ") and commands:  # a command's next line, as the shell prompts for it
            commands[-1] += "\n" + line[2:]
        else:
            expected.append(line + "\n")
    done = subprocess.run(["bash", "-c", "\n".join(commands)], cwd=cwd, capture_output=True, text=True,
                          env=shell_env(), timeout=900)
    assert done.returncode == 0, done.stderr
    return done.stdout, "".join(expected)


def ci_test_command() -> str:
    found = re.search(r'^TEST_COMMAND="(.*)"$', (ROOT / ".ci" / "run").read_text(), re.M)
    assert found, ".ci/run names no TEST_COMMAND"
    return found.group(1)


@pytest.mark.parametrize("line, info, body", [b for b in BLOCKS if b[1] != "text"], ids=lambda v: str(v)[:20])
def test_the_block_does_what_it_says(line: int, info: str, body: str, scratch: Path, namespace: dict[str, Any],
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    if info == "console":
        got, expected = run_transcript(body, scratch)
        assert got == expected, f"README.md:{line}"
    elif info == "python":
        monkeypatch.chdir(scratch)
        exec(compile(body, f"README.md:{line}", "exec"), namespace)
    else:
        steps = [s.strip() for s in body.strip().split(" && ")]
        rest = [s for s in steps if not s.startswith(SETUP_STEPS)]
        assert steps[:len(steps) - len(rest)] == [s for s in steps if s.startswith(SETUP_STEPS)], \
            "the set-up steps come first"
        if rest == ["python3 -m pytest"]:
            assert body.strip() == ci_test_command()
            return
        done = subprocess.run(["bash", "-c", " && ".join(rest)], cwd=scratch, capture_output=True, text=True,
                              env=shell_env(), timeout=600)
        assert done.returncode == 0 and done.stdout, done.stderr


def test_both_set_up_commands_make_and_use_a_virtual_environment() -> None:
    setups = [body.strip() for _, info, body in BLOCKS if info == "sh setup"]
    assert len(setups) == 2
    for command in setups:
        assert command.startswith("python3 -m venv .venv && . .venv/bin/activate && python3 -m pip install -e ")
    assert shlex.split(setups[1])[-3:] == ["python3", "-m", "pytest"]
