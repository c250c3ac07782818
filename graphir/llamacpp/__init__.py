"""llama.cpp's own graph of a model, read without weights, as a graphir graph: the ``llama.cpp:SRC`` source.

SRC is anything graphir reads as a model (a GGUF, full or header-only, a preset, a Hugging Face config).
llama.cpp (through llama-cpp-python, an optional dependency) builds the model with no weight memory and
reserves the graph of one ubatch (:mod:`~graphir.llamacpp.reading`); the graph is converted into graphir's IR
(:mod:`~graphir.llamacpp.convert`) and can be compared with graphir's own after a written-down normalization
(:mod:`~graphir.llamacpp.normalize`).
"""

PREFIX = "llama.cpp:"


def strip_prefix(src: str) -> str | None:
    """SRC of a ``llama.cpp:SRC`` source, else None."""
    return src[len(PREFIX):] if src.startswith(PREFIX) else None
