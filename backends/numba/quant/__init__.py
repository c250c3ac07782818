"""Weight side of the numba backend: GGUF weight tensors as matmul / get_rows operands.

Why this package exists
    The conformance target is llama.cpp's CPU backend, and its matmul is not "dequantize, then float GEMM":
    the activation rows are first converted to the weight type's *vec_dot type* (Q4_0/Q8_0/MXFP4/IQ4_NL -> Q8_0,
    Q4_1/Q5_1 -> Q8_1, Q2_K..Q6_K/IQ4_XS/IQ1_*..IQ3_*/TQ1_0/TQ2_0 -> Q8_K, F16 -> f16, BF16 -> bf16) and the dot
    products are taken between the two quantized operands. A float engine that skips this lands 0.1-1.4 logit away
    on SmolLM2; one that copies it lands within float-summation noise, which the next layers' 8-bit activation
    quantization then amplifies (~0.2 in the residual after 10 layers). So `QWeight.matmul` quantizes x exactly like llama.cpp,
    then multiplies, for Q4_1 and Q8_0 in llama.cpp's exact operation order. Speed matters as much (decode
    must run near memory bandwidth), hence repacked layouts and flat numba loops.

API
    QWeight.prepare(raw, qtype, ne0) wraps the raw GGUF data of one 2-D weight: uint8 (rows, row_bytes) for
    quantized types (usually a memmap), float32 / float16 (rows, ne0) for F32 / F16, BF16 as 2-byte words.
    Nothing is copied. The first matmul repacks the tensor once into the kernel layout below and keeps it
    (`packed_nbytes`); get_rows on a tensor never multiplied (always, for Q4_1/Q8_0) repacks only the rows
    asked for. matmul(x) is
    x @ W.T for x (n, ne0) float32; get_rows(ids) and dequantize() equal gguf.quants.dequantize bit for bit.
    QWeightGroup(weights).matmul(x) is [w.matmul(x) for w in weights], bit for bit, in one kernel call.

The table (quant.weight) has one row per type: activation format, the stream layout of a row, repack function
    and the three kernels (GEMV, GEMM, dequantize). Q4_1 and Q8_0 (the SmolLM2 types) have their own exact kernels
    and layout, see below. Every other kernel (F32, F16, BF16) computes
        out[r, i] = sum_j w[i, j] * xq[r, j]
    where xq is the activation as the weight's vec_dot type takes it (exact in f32).
    Elements are taken in "stream order": for Q4_x all low nibbles of a row, then all high nibbles (Q6_K: four
    streams), so each weight byte meets activations at j and kp + j and every load/store is contiguous.

    type  act   matmul layout                                      bytes/weight   [raw GGUF]
    Q8_0  Q8_0  GGUF's bytes in groups of 16 rows (*): q apart, f16 d 1.0625      [1.0625]
    Q4_0  Q8_0  GGUF's bytes in groups of 16 rows (*), q apart, d    0.5625      [0.5625]
    Q5_0  Q8_0  as Q8_0, its values unpacked to int8 (*3)             1.0625      [0.6875]
    MXFP4 Q8_0  the raw e2m1 codes, rows side by side (*2), + f32     0.625       [0.53125]
                2^(e-128) per 32
    IQ4_NL Q8_0 the raw codes, rows side by side (*2), + f32 d per    0.625       [0.5625]
                32; other row counts:
                as Q8_0 (its values as bytes)                         1.0625
    Q4_1  Q8_1  GGUF's bytes in groups of 16 rows (*): q, f16 d, m    0.625       [0.625]
    Q5_1  Q8_1  as Q8_0 (values 0-31 as bytes, grouped) + f16 m       1.125       [0.75]
    Q4_K  Q8_K  rows in eights (quant.kquant): GGUF's nibbles, rows   0.578       [0.5625]
                side by side, scales and mins as bytes, d and dmin
                as f16, in one stream; other row counts:
                as Q5_K (GGUF's nibbles)                              0.594
    Q5_K  Q8_K  the values in GGUF's bit fields, unpacked in          0.719       [0.6875]
                registers (quant.kquant), scales, mins as bytes,
                f32 d and dmin
    Q6_K  Q8_K  as Q5_K, the int8 scales, f32 d                       0.828       [0.8203]
    Q3_K  Q8_K  the values + 4 as bytes, the scales - 32, f32 d       1.078       [0.4297]
    Q2_K  Q8_K  the values as bytes, scales then mins as bytes,       1.156       [0.3281]
                f32 d and dmin (rows in eights: llama.cpp's repacked
                order on AVX-512, quant.kquant)
    IQ4_XS Q8_K GGUF's codes, the scales less 32 as int8, f32 d       0.578       [0.5313]
                (quant.kquant)
    IQ2_XXS Q8_K the signed grid values (int8) as bytes, the scales   1.078       [0.2578]
                2s + 1 per 16 as int8, f32 d (quant.grid)
    IQ2_XS  Q8_K as IQ2_XXS (a 512-entry grid, a scale per 16)         1.078       [0.2891]
    IQ2_S   Q8_K as IQ2_XXS (a 1024-entry grid, a scale per 16)        1.078       [0.3203]
    IQ1_S Q8_K  the values 8 * grid + delta (int8) as bytes, the      1.078       [0.1953]
                scales 2s + 1 as int8, f32 d (quant.kquant)
    IQ1_M Q8_K  as IQ1_S (sixteen scales; d from the scales' top      1.078       [0.2188]
                nibbles)
    TQ1_0 Q8_K  the values plus 1 (0-2) two bits each in TQ2_0's      0.266       [0.2109]
                order, f32 d; one row of unit scales for all
                (quant.kquant)
    TQ2_0 Q8_K  as TQ1_0 (GGUF's value bytes as they are)             0.266       [0.2578]
    IQ3_S  Q8_K as IQ4_XS: the signed grid values (quant.grid), the     1.078       [0.4297]
                scales 1 + 2 * field
    IQ3_XXS Q8_K as IQ3_S (its factor 1/4 in the kernels)              1.078       [0.3828]
    F32, F16, BF16: no copy; the kernels read the data in place (F16/BF16 converted per row in registers/L1).
    (*2) MXFP4 (gpt-oss's experts) lays nibbles out as Q4_0; a code indexes ggml's doubled e2m1 table
    (0, 1, 2, 3, 4, 6, 8, 12 and their negatives), so the E8M0 scale is halved (GGML_E8M0_TO_FP32_HALF).
    Its matmul is exact, in the order of llama.cpp's repacked 8x8 MXFP4 kernels (quant.lut4), as Q4_0's is
    (quant.exact's "q4_0x8" GEMV); a Q4_0 matrix whose rows do not come in eights, which llama.cpp does not
    repack, is laid out as Q5_0. IQ4_NL is MXFP4's layout and kernel with its own table (kvalues_iq4nl) and an
    f16 d; the matrices llama.cpp does not repack take its vec_dot (one activation row) and tinyBLAS (more).
    Side by side: a group of as many rows as a register has float lanes, each block's code bytes in chunks of
    four a row, one row's after another (int8_dot.row_code_dots), so that one instruction meets four
    activation quants with every row of the group.
    (*3) ggml_vec_dot_q5_0_q8_0 unpacks a block's values to bytes and forms Q8_0's lane sums from them: Q8_0
    blocks of the same numbers give its bits, through Q8_0's kernels.
    (*) [group][block][row] (see quant.exact): a block's quant bytes of the group's rows one after another,
    their scales apart, rows padded to a whole group. get_rows of the grouped kinds repacks just the rows asked for,
    from the raw data, into the stream layout.

Numerics: what is bit-exact and what is only close
    Bit-exact: every dequantized weight value, and the activation quantization: Q8_0/Q8_1 as llama.cpp's x86
    (AVX2) code does it (d = amax/127 rounded to f16, q = round-half-even(x * (127/amax)), Q8_1's
    s = f16(d * sum q) with the unrounded d), Q8_K as quantize_row_q8_K_ref (scale -127/max of the first
    largest-magnitude value, nearest-even, clamp at 127, d = 1/iscale in f32), f16/bf16 nearest-even rounding
    of x for F16/BF16 weights. (llama.cpp's portable reference Q8_0/Q8_1 quantizer uses id = 1/d and rounds
    half away from zero; it differs in rare 1-ulp/tie cases; this machine's llama.cpp runs the x86 code.)
    Bit-exact also: Q4_1, Q5_1, Q8_0, Q5_0, Q4_0, MXFP4, IQ4_NL, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K and IQ4_XS
    (quant.kquant), IQ2_XXS, IQ2_XS, IQ2_S (quant.kquant's IQ4_XS lanes on the grid values, the 1/8 on the
    vec_dot's hsum and on the tiled d), IQ3_S and IQ3_XXS (the same kernels, IQ3_XXS's factor 1/4), IQ1_S and
    IQ1_M (quant.kquant: the vec_dot's grid and delta sums apart, tiled's values whole), TQ1_0 and TQ2_0
    (quant.kquant: their vec_dot for every number of rows)
    matmuls, every output element, for any number of rows:
    Q4_0, MXFP4 and IQ4_NL as (*2) above; the others replay ggml_vec_dot_q4_1_q8_1 / ggml_vec_dot_q8_0_q8_0 of the
    x86 build (AVX2 + VNNI: eight int32 lane sums per block, fma(d_w*d_x, lane, acc) per lane in block order,
    hsum_float_8, Q4_1's min term as an FMA chain added last); tinyBLAS_Q0_AVX, which llama.cpp takes for Q8_0
    with n >= 2, has the same per-element order.
    Checked against llama.cpp's own tensors in tests/test_llama_exact.py (SmolLM2: all 30 layers identical).
    Only close (max error ~4e-7 of max|y| against an exact emulation, tests/test_quant.py): the other types'
    products (BF16), accumulated in f32 in numba's vector order.

Speed choices (2 threads, this machine; bench/bench_quant.py)
    Exact kinds (Q4_1, Q8_0, Q5_0, Q4_0), every n, GEMV: prange over groups of 16 weight rows; per activation
    row, eight registers of two rows each (AVX-512; one row on AVX2) hold the rows' lane chains over the blocks,
    the lane sums come from the host's integer dot product (quant.int8_dot: vpdpbusd with VNNI) and a block's 16
    d_w*d_x from one register. One run on an AVX-512 host: ffn_up 1536x576 in 15 us on two threads (37 GB/s from
    cache; the int16 emulation across rows it replaced took 26 us), the Q8_0 LM head 49152x576 in 0.48 ms. In a
    decode the 97 MB of weights come from memory: about 6.3 ms a token, 15 GB/s, where that machine streamed 19
    in the same run. A group's rows stay in L1 while every activation row meets them, so the GEMV serves prompts
    too: on an AVX2 host it beat the GEMM it replaced (weights expanded to float, float FMAs) at every n from 3 to
    512, 1.3-6x (ffn_up at n = 128: 3.1 against 4.6 ms; the LM head at n = 512: 281 against 342 ms).
    Weights on the same x (q, k, v; gate and up) run as one kernel call (QWeightGroup): x quantized once, the
    threads started once for all their rows.
    Other types, n < 4, GEMV: prange over weight rows, one flat loop over a row's bytes with the block scale
    read as d[i, j >> 4]; every weight row is reused from L1 for the n activation rows.
    Nested 32-element block loops or exact int32 block sums measured 4-8x slower.
    n >= 4, GEMM: each task dequantizes 6 weight rows (w' only) into an L1 buffer and multiplies them with 4
    activation rows at a time in 24 register accumulators; the min term goes through the same tile. 240-400
    GFLOP/s at n = 128, above OpenBLAS sgemm here (~240) even though the weights are dequantized on the fly.
    BLAS is not used at all, F32 included: right after a numba parallel region the OpenMP workers keep
    spinning (GOMP_SPINCOUNT) and starve OpenBLAS's threads, so a 1 ms sgemm took ~8 ms.
    Crossover n = 4 was measured for every type (GEMV costs ~n times its n=1 time; GEMM is flat until ~8).

Modules
    activation  the activation quantizers (x rows -> the weight type's vec_dot type), one per format
    blocks      GGUF blocks -> the stream layout (repack), and rows of it back to floats (get_rows)
    stream      GEMV and GEMM kernels of the stream-layout kinds
    exact       Q4_1, Q5_1, Q8_0, Q4_0 (and Q5_0 as Q8_0): their grouped layout and the kernels that replay
                llama.cpp's dot products
    kquant      Q4_K (and Q2_K on AVX-512) in the order of llama.cpp's repacked 8x8 kernels, Q6_K, Q5_K, Q3_K,
                IQ4_XS, the IQ1, IQ2 and IQ3 types and unrepacked Q4_K and Q2_K in that of its vec_dot and tiled
                kernels, TQ1_0 and TQ2_0 in that of their vec_dot
    grid        the i-quants' grid codebooks (gguf's tables) and grid-coded blocks (IQ2_*, IQ3_*) unpacked to
                signed values, their scales and d
    lut4        MXFP4 and IQ4_NL (4-bit codes into a table): llama.cpp's repacked dot products on their codes,
                IQ4_NL's vec_dot where it does not repack
    weight      QWeight and the table of weight kinds its matmul and get_rows dispatch through

A kernel is compiled with the helpers it inlines or calls compiled in (the GEMMs of stream inline the row
dequantizers of blocks, the kernels of exact call q8_blocks of activation); numba's cache of it is stamped by
the whole backend's source (primitives.cache), so editing a helper recompiles its callers.
"""
