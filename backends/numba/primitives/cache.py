"""numba's on-disk cache, keyed by the whole backend's source rather than by each kernel's own file.

numba keeps a kernel under the file that defines it and reuses it while that file's bytes are unchanged. But a
kernel carries compiled into it the helpers it inlines or calls from other modules (the exact GEMVs hold the
activation quantizer, every kernel the SIMD and int8 primitives): edit one of those, say by a ``git pull``, and
the kernels of the untouched files load from the cache with the old helper inside, computing what the source no
longer says. So every kernel of this backend takes as its cache stamp one digest of all of the backend's
sources: a change to any of them recompiles them all on first use, and nothing stale is ever loaded.
The primitives every kernel module builds on (bits, expf, jit, simd) import this module before their own kernels,
which installs the stamp; the package does not, so that importing the backend for its paths (as the CLI's parser
does) imports no numba.
"""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

from numba.core import caching

BACKEND = Path(__file__).resolve().parents[1]


@functools.cache
def source_digest() -> bytes:
    """sha256 over the backend's Python files, each by its path inside the backend and its bytes."""
    h = hashlib.sha256()
    for f in sorted(BACKEND.rglob("*.py")):
        h.update(f.relative_to(BACKEND).as_posix().encode() + b"\0" + f.read_bytes() + b"\0")
    return h.digest()


class _WholeBackendStamp:
    """Mixed into numba's locators: theirs for the functions of other files, this stamp for the backend's."""

    @classmethod
    def from_function(cls, py_func, py_file):  # type: ignore[no-untyped-def]
        if not Path(py_file).resolve().is_relative_to(BACKEND):
            return None
        return super().from_function(py_func, py_file)  # type: ignore[misc]

    def get_source_stamp(self) -> bytes:
        return source_digest()


def _numba(name: str) -> type:
    """A class of numba.core.caching by its name (older numba spelt it with a leading underscore)."""
    return getattr(caching, name, None) or getattr(caching, f"_{name}")


def _install() -> None:
    """Put the stamped locators first, in numba's own order of preference (a NUMBA_CACHE_DIR, the source's
    __pycache__, the user's cache folder), once per process."""
    classes = _numba("CacheImpl")._locator_classes
    if not any(issubclass(c, _WholeBackendStamp) for c in classes):
        classes[:0] = [type(f"Backend{c.__name__}", (_WholeBackendStamp, c), {})
                       for c in map(_numba, ("UserProvidedCacheLocator", "InTreeCacheLocator", "UserWideCacheLocator"))]


_install()
