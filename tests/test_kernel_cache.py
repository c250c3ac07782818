"""numba's cache of the backend's kernels is stamped by the whole backend's source, so a kernel whose file is
unchanged but whose inlined helper changed (another module, after a ``git pull``) is compiled again, not loaded
stale; functions outside the backend keep numba's own per-file stamp."""

from __future__ import annotations

import importlib
import shutil
from pathlib import Path

import numba
import pytest

from graphir.backends.numba.primitives import cache


def _backend_kernels() -> list[numba.core.registry.CPUDispatcher]:
    """Every cached numba function defined at module level in the backend's modules."""
    out = []
    for f in sorted(cache.BACKEND.rglob("*.py")):
        parts = f.relative_to(cache.BACKEND).with_suffix("").parts
        name = ".".join(("graphir.backends.numba",) + (parts[:-1] if parts[-1] == "__init__" else parts))
        module = importlib.import_module(name)
        out += [v for v in vars(module).values()
                if isinstance(v, numba.core.registry.CPUDispatcher) and v._cache.__class__.__name__ != "NullCache"
                and v.__module__ == module.__name__]
    return out


def test_every_backend_kernel_is_stamped_by_the_whole_backend_source() -> None:
    kernels = _backend_kernels()
    assert len(kernels) > 100
    for k in kernels:
        assert k._cache._impl.locator.get_source_stamp() == cache.source_digest(), k.py_func.__qualname__


def test_the_stamp_changes_with_any_file_of_the_backend(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    copy = tmp_path / "numba"
    shutil.copytree(cache.BACKEND, copy, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(cache, "BACKEND", copy)
    cache.source_digest.cache_clear()
    try:
        before = cache.source_digest()
        helper = copy / "quant" / "activation.py"         # inlined into the exact kernels of quant/exact.py
        helper.write_text(helper.read_text() + "\n")
        cache.source_digest.cache_clear()
        assert cache.source_digest() != before
    finally:
        cache.source_digest.cache_clear()


def test_a_function_outside_the_backend_keeps_numbas_own_stamp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "outside_kernel.py").write_text("from numba import njit\n\n@njit(cache=True)\ndef twice(x):\n"
                                                "    return 2 * x\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    twice = importlib.import_module("outside_kernel").twice
    assert twice(3) == 6
    assert twice._cache._impl.locator.get_source_stamp() != cache.source_digest()
    assert not isinstance(twice._cache._impl.locator, cache._WholeBackendStamp)
