"""The reference backend: every op of the catalogue in numpy, written to be read (ops), and a graph interpreted
node by node (backend), registered as the entry point ``reference``. It is the executable statement of what the
IR's ops compute: the numba backend is held to it op by op (tests/test_backend_ops.py) and model by model
(tests/test_reference_backend.py), and a new backend has a model to follow. It imports no numba."""
