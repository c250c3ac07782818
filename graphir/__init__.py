"""graphir: LLM architectures as a backend-agnostic symbolic compute-graph IR, checked by golden snapshots
without weights and executed by a numba backend.

>>> import graphir                                                   # doctest: +SKIP
>>> model = graphir.load("SmolLM2-135M-Instruct.Q4_1.gguf")
>>> ctx = model.new_context(n_ctx=512)
>>> ctx.decode(graphir.Batch.from_tokens(model.tokenize("The capital of France is")))
>>> ctx.logits().shape
(1, 49152)
"""

from typing import Any

__version__ = "0.1.0"
__all__ = ["Batch", "__version__", "load", "open_model"]

# Attributes load lazily (PEP 562) so that `graphir --help` and graph dumps import only what they use.
_LAZY = {"load": ("graphir.running.runtime", "load"), "Batch": ("graphir.batch", "Batch"),
         "open_model": ("graphir.model.meta", "open_model")}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'graphir' has no attribute {name!r}")
    import importlib

    module, attr = _LAZY[name]
    return getattr(importlib.import_module(module), attr)
