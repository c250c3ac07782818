"""Running a model: batches and their split into ubatches, contexts and their decode loop, saved state,
pooling inputs, loading a GGUF to run, and how the core reaches a backend.
"""
