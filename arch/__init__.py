"""Architectures by GGUF ``general.architecture`` name. Adding one: a class in a family module, a line here.

A family defined elsewhere (a plugin, a test's toy model) registers itself when its module is imported and
is found by name as well."""

from __future__ import annotations

import importlib

from graphir.model.architecture import REGISTRY, Architecture
from graphir.errors import MetadataError

# architecture name -> module of this package that defines it (imported only when asked for)
MODULES = {
    "bert": "bert",
    "deepseek2": "deepseek2",
    "gemma2": "gemma",
    "gemma3": "gemma",
    "gpt-oss": "gpt_oss",
    "gpt2": "gpt2",
    "granitehybrid": "granite",
    "llama": "llama",
    "mamba": "mamba",
    "mamba2": "mamba",
    "nomic-bert": "bert",
    "phi3": "phi3",
    "qwen2": "llama",
    "qwen3": "llama",
    "qwen35": "qwen35",
    "qwen3moe": "llama",
    "rwkv6": "rwkv",
    "smollm3": "llama",
    "t5": "t5",
    "t5encoder": "t5",
}


def names() -> list[str]:
    return sorted(MODULES)


def get(name: str) -> type[Architecture]:
    module = MODULES.get(name)
    if module is None:
        if name in REGISTRY:
            return REGISTRY[name]
        raise MetadataError(f"unknown architecture '{name}' (known: {', '.join(names())})")
    importlib.import_module(f"{__name__}.{module}")
    return REGISTRY[name]
