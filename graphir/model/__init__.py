"""A model before any weight is read: hyperparameters, tensor specs, the architecture interface and
registry, the graph builder architectures call, presets, and the model metadata that builds graphs.
"""
