"""The families, one module each, found by GGUF ``general.architecture`` name (an mmproj file's tower by its
projector type, ``clip:<projector>``).

A family module registers its architectures, Hugging Face mappings and presets when it is imported;
:func:`load_all` imports every module of this package, so adding a family is adding a module. A family
defined elsewhere (a plugin, a test's toy model) registers itself when its module is imported and is found
by name as well."""

from __future__ import annotations

import importlib
import pkgutil

from graphir.errors import MetadataError
from graphir.model.architecture import REGISTRY, Architecture
from graphir.model.tower import FILE_ARCH, projector_of


def load_all() -> None:
    for m in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{m.name}")


def _ours(tower: bool) -> list[str]:
    load_all()
    return sorted(n for n, cls in REGISTRY.items() if cls.__module__.startswith(f"{__name__}.") and cls.tower == tower)


def names() -> list[str]:
    """The architectures of this package's families (text models and their encoders)."""
    return _ours(tower=False)


def towers() -> list[str]:
    """The vision and audio towers of this package's families, ``clip:<projector>`` (graphir.model.tower)."""
    return _ours(tower=True)


def get(name: str) -> type[Architecture]:
    if name not in REGISTRY:
        load_all()
    if name not in REGISTRY:
        tower = name.startswith(f"{FILE_ARCH}:")
        raise MetadataError(f"unknown {'projector type' if tower else 'architecture'} "
                            f"'{projector_of(name) if tower else name}' (known: "
                            f"{', '.join(projector_of(n) for n in towers()) if tower else ', '.join(names())})")
    return REGISTRY[name]
