"""graphir: LLM architectures as a backend-agnostic symbolic compute-graph IR."""

__version__ = "0.1.0"
