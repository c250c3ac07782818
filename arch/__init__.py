"""Architectures by GGUF ``general.architecture`` name. Adding one: a class in a family module, a line here."""

from __future__ import annotations

import importlib

from graphir.architecture import REGISTRY, Architecture
from graphir.errors import MetadataError

# architecture name -> module of this package that defines it (imported only when asked for)
MODULES = {
    "bert": "bert",
    "llama": "llama",
    "mamba": "mamba",
    "nomic-bert": "bert",
    "qwen2": "llama",
    "rwkv6": "rwkv",
}


def names() -> list[str]:
    return sorted(MODULES)


def get(name: str) -> type[Architecture]:
    module = MODULES.get(name)
    if module is None:
        raise MetadataError(f"unknown architecture '{name}' (known: {', '.join(names())})")
    importlib.import_module(f"{__name__}.{module}")
    return REGISTRY[name]
