"""The backends that run graphir's graphs, each in its own package and registered as an entry point of the group
``graphir.backends`` (graphir.running.backend states what the core asks of one): ``numba``, the bit-exact and
fast one, and ``reference``, the numpy one that says what every op computes."""
