"""Finding the families: every module of the ``graphir.arch`` plugin package fills the registries (architectures,
Hugging Face mappings, presets) as it is imported, so a lookup that must see them all imports them first.

The core imports the plugin package here, when a lookup runs, never at its own import time.
"""

from __future__ import annotations


def discover() -> None:
    from graphir.arch import load_all

    load_all()
