"""The families, one module each, found by GGUF ``general.architecture`` name.

A family module registers its architectures, Hugging Face mappings and presets when it is imported;
:func:`load_all` imports every module of this package, so adding a family is adding a module. A family
defined elsewhere (a plugin, a test's toy model) registers itself when its module is imported and is found
by name as well."""

from __future__ import annotations

import importlib
import pkgutil

from graphir.errors import MetadataError
from graphir.model.architecture import REGISTRY, Architecture


def load_all() -> None:
    for m in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{m.name}")


def names() -> list[str]:
    """The architectures of this package's families."""
    load_all()
    return sorted(n for n, cls in REGISTRY.items() if cls.__module__.startswith(f"{__name__}."))


def get(name: str) -> type[Architecture]:
    if name not in REGISTRY:
        load_all()
    if name not in REGISTRY:
        raise MetadataError(f"unknown architecture '{name}' (known: {', '.join(names())})")
    return REGISTRY[name]
