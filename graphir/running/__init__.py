"""Running a model: contexts and their decode loop (over the batches of :mod:`graphir.batch`), saved state,
pooling inputs, loading a GGUF to run, and how the core reaches a backend.
"""
