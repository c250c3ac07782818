"""The numba backend: graphs run bit for bit like llama.cpp's CPU backend, registered as the entry point ``numba``
(:mod:`.backend`).

Layers, each importing only those below it (tests/test_imports.py checks it):
    primitives  numba helpers every kernel sits on: the numerics paths (isa), exact float bits, SIMD registers,
                compile options and native calls (jit), numba's cache stamped by the whole backend's source
                (cache), ggml's and glibc's expf
    quant       GGUF weights as matmul / get_rows operands, and their kernels
    kernels     the activation kernels of the IR's ops
    tape        a plan's kernel calls recorded once and replayed in native code
    steps       a Step per op, grouped by kind of op as the kernels are, each with its three faces
    fusion      rewrites of a program's steps (chains run as one step, sibling products)
    plan        a program's steps bound to one binding of the dims, as one generated function
    program     lowering a graph to steps, and the run loop
    backend     what the core sees (graphir.running.backend.Backend)
"""
