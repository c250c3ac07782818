"""Activation kernels of the IR's ops, written to reproduce ggml's CPU arithmetic (llama.cpp's oracle) bit for bit.

Arrays are in numpy order (the reverse of the IR's ggml order): a ggml ``[576, n_tokens]`` value is a
numpy ``(n_tokens, 576)`` array. The reference is llama.cpp's ggml-cpu as built on x86 (GCC, FMA contraction
on, llamafile's tinyBLAS enabled) for one of the paths of :mod:`graphir.backends.numba.primitives.isa`: the kernels that
depend on it take an ``IsaPath`` (its register width ``lanes``, its final vector reduction, its ggml_v_expf).
Each kernel says which ggml function it follows and in what order it sums; where ggml sums in double, so do
these. "A register" below is ``lanes`` floats: 16 on the AVX-512 path, 8 on the AVX2 path.

What makes the attention exact:
    mul_mat of f16/f32 activations: ggml converts the other operand to the cache type (f32 -> f16, nearest
    even), then per output element either tinyBLAS (llamafile sgemm, taken for n >= 2 columns when the inner
    length is a multiple of a register: one FMA chain per lane, then the register's sum) or
    ggml_vec_dot_f16/f32 (n = 1: four registers of FMA chains over steps of 4 registers, reduced (0+2, 1+3,
    then 0+1) and summed by the path's final reduction, the tail added in double for f16 / fused in float
    for f32).
    llama.cpp's KV length n_kv is padded to a multiple of 256 with masked cells; graphir attends over the used
    cells only. Padding changes the paths (SIMD blocks instead of scalar tails) but not the values (masked
    probabilities are exactly 0), so soft_max with a mask and the mul_mat that consumes its output emulate the
    padded length (``pad``; by default taken from the mask / from soft_max's result).
    soft_max: ggml_soft_max_f32 (scale, + mask, max, ggml_vec_soft_max_f32: ggml_v_expf per register and a
    double sum of each register's sum, then * (float)(1/sum)).
RoPE: cos/sin from glibc's cosf/sinf (numba's math.cos on float32; numpy's float32 cos differs in ~15% of
    angles), angles by repeated float32 multiplication; the rotation as GCC vectorized it: x0*cos - x1*sin with
    the second product rounded and the first fused, x0*sin + x1*cos with x1*cos rounded and x0*sin fused.
rms_norm: squares in float, summed sequentially in double.

Modules (on graphir.backends.numba.primitives: jit, how they are compiled and run over the rows of a value;
expf, ggml_v_expf in the variant of each path)
    unary      silu, relu, reglu, gelu, geglu, gelu_quick and the libm unary ops (exp, tanh, sigmoid), sqr, neg
    norm       rms_norm, norm
    softmax    soft_max, with llama.cpp's KV padding
    mul_mat    mul_mat of two activations (attention's KQ and KQV), f16 or f32
    rope       RoPE: the cos/sin cache and the rotation
    recurrent  Mamba's ssm_conv / ssm_scan, RWKV6's wkv6
    attention  one query token's kq, soft_max and kqv in one kernel
    moe        mul_mat_id and the routing's small reductions
    rows       the row kernels a tape plays (binary, unary, moves, concat)

A kernel is compiled with the helpers it inlines or calls from other modules inside it; its cached copy is
stamped by the whole backend's source (primitives.cache), so an edit anywhere recompiles it.
"""
