"""Long subprocess runs that start when their test is collected and run beside the rest of the suite.

The suite is one process, busy on one core most of the time (numba compiles on one thread); the bounds-checking
run and the AVX2 re-run, subprocesses of about three minutes each, took turns with the other tests and made up a
fifth of the suite's time. A test marked ``apart(work=...)`` puts its subprocess in ``work``, a function of no
arguments that returns what the test checks (None where the test will skip); when the test is selected, work
starts at the end of collection on a thread of its own, so its subprocess uses the other core, and the test's
``apart_result`` fixture waits for its result; such tests run last. Runs a test never reached are killed when the session ends.

A work shares nothing with the suite's process that the two could change at once: it gets its own numba cache
(``own_numba_cache``: numba writes a function's cache index without a lock, and two processes adding to one index
lose each other's entries) and its own temporary folders.
"""

from __future__ import annotations

import concurrent.futures
import shutil
import subprocess
import tempfile
import threading
from typing import Any, Callable

import pytest

_started: dict[str, concurrent.futures.Future] = {}
_running: list[subprocess.Popen] = []
_folders: list[tempfile.TemporaryDirectory] = []


def run(args: list[str], timeout: float, **kwargs: Any) -> subprocess.CompletedProcess:
    """subprocess.run with its output captured as text, the process known to the session (killed at its end) and
    at the lowest priority where ``nice`` is at hand: the suite's own process, whose tests run threads of their
    own, comes first on a busy core."""
    nice = shutil.which("nice")
    with subprocess.Popen([nice, "-n", "19", *args] if nice else args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, **kwargs) as p:
        _running.append(p)
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.communicate()
            raise
    return subprocess.CompletedProcess(args, p.returncode, out, err)


def scratch(prefix: str) -> str:
    """A temporary folder for a work, removed when the interpreter exits."""
    folder = tempfile.TemporaryDirectory(prefix=prefix)
    _folders.append(folder)
    return folder.name


def own_numba_cache(env: dict[str, str]) -> dict[str, str]:
    """env with a numba cache folder of the work's own (see the module's docstring)."""
    return {**env, "NUMBA_CACHE_DIR": scratch("graphir-apart-numba-")}


def _start(work: Callable[[], Any]) -> concurrent.futures.Future:
    future: concurrent.futures.Future = concurrent.futures.Future()

    def body() -> None:
        try:
            future.set_result(work())
        except BaseException as e:  # the test re-raises it
            future.set_exception(e)

    threading.Thread(target=body, name=f"apart {work.__name__}", daemon=True).start()
    return future


def last(items: list[pytest.Item]) -> None:
    """The tests that wait for a work go last, in their order (conftest's collection hook calls it): the suite runs everything else while the works run
    (a waiting test early in the suite left a core idle for minutes when a work ran slow)."""
    items.sort(key=lambda item: item.get_closest_marker("apart") is not None)


def pytest_collection_finish(session: pytest.Session) -> None:
    if session.config.option.collectonly:
        return
    for item in session.items:
        marker = item.get_closest_marker("apart")
        if marker is not None and item.get_closest_marker("skip") is None:
            _started[item.nodeid] = _start(marker.kwargs["work"])


def pytest_sessionfinish(session: pytest.Session) -> None:
    for p in _running:
        if p.poll() is None:
            p.kill()
            p.wait()
    for folder in _folders:
        folder.cleanup()


@pytest.fixture
def apart_result(request: pytest.FixtureRequest) -> Any:
    """The result of the test's apart(work=...): started at collection, or now where it was not."""
    marker = request.node.get_closest_marker("apart")
    if marker is None:
        raise TypeError(f"{request.node.nodeid} uses apart_result without an apart(work=...) marker")
    future = _started.pop(request.node.nodeid, None) or _start(marker.kwargs["work"])
    return future.result()
