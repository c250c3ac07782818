"""mul_mat reads a permuted f16 V cache in place (the kqv of one token) and gives, bit for bit, what it gives for
the same values made contiguous first (the cont the graph spells, whose copy the executor skips)."""

from __future__ import annotations

import numpy as np
import pytest

from graphir.backends.isa import PATHS
from graphir.backends.kernels.mul_mat import mul_mat
from graphir.backends.kernels.softmax import soft_max


@pytest.mark.parametrize("path", sorted(PATHS))
@pytest.mark.parametrize("n_kv, pad", [(37, 256), (256, 256), (300, 256), (300, 1), (70, 1), (5, 1)])
def test_a_permuted_v_cache_read_in_place_equals_it_made_contiguous(path, n_kv, pad):
    p = PATHS[path]
    rng = np.random.default_rng(n_kv + pad)
    n_head_kv, head, n_head = 3, 64, 9
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
