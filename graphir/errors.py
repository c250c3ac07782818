"""Errors a user can cause. The CLI prints their message on one line and exits 2; anything else is a bug."""


class GraphirError(Exception):
    """Base of every user-facing error: the message names the file, key, tensor or node at fault."""


class GGUFError(GraphirError):
    """A file is not a readable GGUF (bad magic, cut short, malformed metadata)."""


class MetadataError(GraphirError):
    """A GGUF is readable but its metadata does not describe a model we can build (missing/bad key, unknown arch)."""


class CheckpointError(GraphirError):
    """A Hugging Face checkpoint cannot be converted: a missing or malformed file, or a model that is not BERT."""


class TensorError(GraphirError):
    """A weight tensor is missing, unexpected, or has the wrong shape or type."""


class GraphError(GraphirError):
    """A graph is malformed: the verifier or a parser found a node that does not type-check."""


class BatchError(GraphirError):
    """A batch was rejected before anything ran (bad token, sequence, position, or empty); the cache is untouched."""


class CacheFullError(GraphirError):
    """The cache has no room for a ubatch; the batch was not decoded and the cache is untouched."""


class StateError(GraphirError):
    """A memory or saved state does not fit this model or context; nothing was changed."""
