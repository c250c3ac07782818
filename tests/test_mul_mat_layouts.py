"""mul_mat's layouts and groupings change no bits: a permuted f16 V cache read in place (the kqv of one token) gives
what the same values made contiguous first give (the cont the graph spells, whose copy the executor skips); short
f32 rows add each product in order; tinyBLAS's tiles give each output the chain it has alone."""

from __future__ import annotations

import numpy as np
import pytest

from graphir.backends.numba.primitives.isa import PATHS
from graphir.backends.numba.kernels.mul_mat import mul_mat
from graphir.backends.numba.kernels.softmax import soft_max


@pytest.mark.parametrize("path", sorted(PATHS))
@pytest.mark.parametrize("n_kv, pad", [(37, 256), (256, 256), (300, 256), (300, 1), (70, 1), (5, 1)])
@pytest.mark.parametrize("head", [64, 80, 40, 8])   # whole groups of four registers of dims, and one to three left
def test_a_permuted_v_cache_read_in_place_equals_it_made_contiguous(path, n_kv, pad, head):
    p = PATHS[path]
    rng = np.random.default_rng(n_kv + pad + head)
    n_head_kv, n_head = 3, 9
    cache = rng.standard_normal((n_kv + 11, n_head_kv * head)).astype(np.float16)      # cells x (heads * dims)
    v = cache[:n_kv].reshape(n_kv, n_head_kv, head).transpose(1, 2, 0)                   # (kv heads, dims, n_kv)
    kq = rng.standard_normal((n_head, 1, n_kv)).astype(np.float32)
    mask = np.zeros((n_head, 1, n_kv), np.float32)
    mask[:, :, n_kv // 2] = -np.inf
    probs = soft_max(kq, mask, 0.125, 0.0, p, pad, None)
    assert not v.flags.c_contiguous
    in_place, copied = mul_mat(v, probs, p), mul_mat(np.ascontiguousarray(v), probs, p)
    assert in_place.shape == (n_head, 1, head)
    assert np.array_equal(in_place, copied)


@pytest.mark.parametrize("path", sorted(PATHS))
@pytest.mark.parametrize("eighths, tokens", [(4, 70), (6, 5), (2.5, 130), (1, 3)])
def test_f32_rows_shorter_than_vec_dots_first_step_add_each_product_in_order(path, eighths, tokens):
    """ggml_vec_dot_f32 on rows of fewer than four registers (BERT's 32-wide heads with AVX-512, q and k f32 and
    permuted): all scalar tail, each product rounded then added in order, the last ones under half a register
    fused; many outputs' chains side by side must give each output's own chain. Rows of eighths of four
    registers."""
    p = PATHS[path]
    head = int(eighths * p.lanes // 2)
    rng = np.random.default_rng(head * tokens)
    k = rng.standard_normal((tokens, 3, head)).astype(np.float32).transpose(1, 0, 2)    # (heads, tokens, head)
    q = rng.standard_normal((tokens, 3, head)).astype(np.float32).transpose(1, 0, 2)
    out = mul_mat(k, q, p)
    half = p.lanes // 2
    cut = head // half * half
    want = np.zeros((3, tokens, tokens), np.float32)         # [h, n (q row), m (k row)]
    for c in range(cut):
        want += np.multiply(q[:, :, None, c], k[:, None, :, c], dtype=np.float32)
    for c in range(cut, head):                               # fma: the exact product and sum, rounded once
        exact = q[:, :, None, c].astype(np.float64) * k[:, None, :, c] + want
        want = exact.astype(np.float32)
    assert np.array_equal(out, want)


@pytest.mark.parametrize("path", sorted(PATHS))
@pytest.mark.parametrize("rows", [2, 3, 4, 5, 7, 8, 9, 13])
def test_tinyblas_tiles_give_every_output_its_own_chain(path, rows):
    """tinyBLAS (n >= 2 rows of x against f16 rows of w, a multiple of 4 of them) runs tiles of 4 rows of w by 3
    or 4 rows of x, the last x rows repeated to fill a tile: where an output falls must not change its bits. Each
    output equals the one its row pair gives alone beside another row, and w's rows taken from an offset (other
    tiles) give the same outputs."""
    p = PATHS[path]
    rng = np.random.default_rng(rows)
    w = rng.standard_normal((12, 64)).astype(np.float16)
    x = rng.standard_normal((rows, 64)).astype(np.float32)
    out = mul_mat(w, x, p)
    for i in range(rows):
        pair = mul_mat(w, x[[i, (i + 1) % rows]], p)
        assert np.array_equal(out[i], pair[0])
    for skip in (4, 8):
        assert np.array_equal(mul_mat(w[skip:], x, p), out[:, skip:])


@pytest.mark.parametrize("rows,path", [(258, "tinyBLAS declines"), (256, "tinyBLAS"), (2, "tinyBLAS declines"),
                                       (4, "tinyBLAS")])
def test_tinyblas_takes_only_weights_whose_rows_are_a_multiple_of_four(rows, path):
    """llamafile_sgemm's matmul tiles w's rows by 4 and returns false for other counts (Mamba's 258-row x_proj,
    a 2-expert router), so ggml multiplies those with vec_dot: graphir chooses the same path."""
    from graphir.backends.numba.kernels.mul_mat import TINYBLAS, VEC_F16, VEC_F32, product_mode

    for f16, vec in ((False, VEC_F32), (True, VEC_F16)):
        assert product_mode(f16, 8, 512, 16, True, False, rows) == (TINYBLAS if path == "tinyBLAS" else vec)
        assert product_mode(f16, 8, 512, 16, True, False) == TINYBLAS  # attention's rows: padded by llama.cpp
