"""What the numba backend's kernels and weight kernels are both built from: the llama.cpp CPU paths they
reproduce (isa), float bits and exact roundings (bits), SIMD registers (simd), how kernels are compiled and
called (jit), how numba's cache knows them (cache), and the exp and log of ggml and glibc (expf)."""
