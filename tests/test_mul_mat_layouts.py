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
