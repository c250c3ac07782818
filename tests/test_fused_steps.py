"""Steps the executor runs as one give, bit for bit, the steps the graph spells apart: one query token's attention
in one kernel (kernels.attention) for mul_mat of K with q, soft_max, mul_mat of the permuted V with the
probabilities; rms_norm with its weight for rms_norm then mul. A decode takes them, and a run with taps (every
node's value) takes the steps apart."""

from __future__ import annotations

import gguf
import numpy as np
import pytest

from conftest import write_model_gguf
from graphir.backends.numba.primitives.isa import PATHS
from graphir.backends.numba.kernels.attention import attend
from graphir.backends.numba.kernels.mul_mat import mul_mat
from graphir.backends.numba.kernels.norm import rms_norm
from graphir.backends.numba.kernels.softmax import soft_max
from graphir.backends.numba.steps.attention import _finite
from graphir.batch import Batch
from graphir.running.runtime import load


def _caches(rng: np.random.Generator, n_kv: int, n_head_kv: int, head: int) -> tuple[np.ndarray, np.ndarray]:
    """k (kv heads, n_kv, head) and v seen transposed (kv heads, head, n_kv), views of f16 caches with spare
    cells, as a decode's graph views them."""
    k_cache = rng.standard_normal((n_kv + 7, n_head_kv * head)).astype(np.float16)
    v_cache = rng.standard_normal((n_kv + 7, n_head_kv * head)).astype(np.float16)
    k = k_cache[:n_kv].reshape(n_kv, n_head_kv, head).transpose(1, 0, 2)
    v = v_cache[:n_kv].reshape(n_kv, n_head_kv, head).transpose(1, 2, 0)
    return k, v


@pytest.mark.parametrize("path", sorted(PATHS))
@pytest.mark.parametrize("n_kv, pad", [(2, 256), (37, 256), (256, 256), (300, 256), (70, 1)])
@pytest.mark.parametrize("n_head, n_head_kv, head", [(9, 3, 64), (4, 4, 18), (2, 1, 80)])
@pytest.mark.parametrize("used", [1.0, 0.6])   # the share of the cells in use: the others masked, as padding is
def test_one_kernel_equals_the_three_it_replaces(path, n_kv, pad, n_head, n_head_kv, head, used):
    p = PATHS[path]
    rng = np.random.default_rng(n_kv * 7 + head)
    k, v = _caches(rng, n_kv, n_head_kv, head)
    q = rng.standard_normal((1, n_head, head)).astype(np.float32).transpose(1, 0, 2)   # (heads, 1, head)
    mask = np.zeros((n_head, 1, n_kv), np.float32)
    mask[:, :, n_kv // 2] = -np.inf
    mask[:, :, max(int(n_kv * used), 1):] = -np.inf
    scale = 1.0 / np.sqrt(head)
    three = mul_mat(v, soft_max(mul_mat(k, q, p), mask, scale, 0.0, p, pad, None), p)
    one = attend(k, q, mask, v, scale, pad, p)
    assert one is not None and one.shape == three.shape == (n_head, 1, head)
    assert np.array_equal(one, three)


def test_more_than_one_token_or_one_cell_is_not_its_case():
    p = PATHS[sorted(PATHS)[0]]
    rng = np.random.default_rng(0)
    k, v = _caches(rng, 40, 2, 16)
    q = rng.standard_normal((4, 3, 16)).astype(np.float32)
    assert attend(k, q, np.zeros((4, 3, 40), np.float32), v, 0.25, 256, p) is None
    k, v = _caches(rng, 1, 2, 16)          # a V of one cell is contiguous: mul_mat takes it as rows
    assert attend(k, q[:, :1], np.zeros((4, 1, 1), np.float32), v, 0.25, 256, p) is None


def _masks(t: int, n_kv: int) -> dict[str, np.ndarray]:
    """Prompt masks (t tokens over n_kv cells, the prompt's the last t): causal, a sliding window of 5, two
    sequences side by side, and one whose third token sees no cell (its row all -inf)."""
    pos, cell = np.arange(n_kv - t, n_kv)[:, None], np.arange(n_kv)[None, :]
    causal = np.where(cell <= pos, 0.0, -np.inf).astype(np.float32)
    window = np.where((cell <= pos) & (cell > pos - 5), 0.0, -np.inf).astype(np.float32)
    two = causal.copy()
    two[t // 2:, n_kv - t:n_kv - t + t // 2] = -np.inf
    none = causal.copy()
    none[2] = -np.inf
    return {"causal": causal, "window": window, "two sequences": two, "a row sees nothing": none}


@pytest.mark.parametrize("path", sorted(PATHS))
@pytest.mark.parametrize("mask_kind", ["causal", "window", "two sequences", "a row sees nothing"])
@pytest.mark.parametrize("t, n_kv", [(37, 37), (100, 256), (9, 300)])
def test_a_prompts_products_past_each_tokens_reach_left_out_give_the_same_bits(path, mask_kind, t, n_kv):
    """kernels.mul_mat's reach (each token's cells up to its last open one) on KQ and KQV: the same bits as every
    product computed, soft_max between them as the attention step runs them."""
    p = PATHS[path]
    rng = np.random.default_rng(t + n_kv)
    k, v = _caches(rng, n_kv, 2, 64)
    q = rng.standard_normal((t, 6, 64)).astype(np.float32).transpose(1, 0, 2) * 4     # (heads, t, head)
    mask = _masks(t, n_kv)[mask_kind]
    reach = (n_kv - np.argmax((mask != -np.inf)[:, ::-1], axis=1)).astype(np.int64)
    assert (reach < n_kv).any() or t == n_kv == 37 and mask_kind == "causal"
    apart = soft_max(mul_mat(k, q, p), mask, 0.125, 0.0, p, 256, None)
    left_out = soft_max(mul_mat(k, q, p, reach=reach), mask, 0.125, 0.0, p, 256, None)
    assert np.array_equal(apart, left_out, equal_nan=True)
    assert np.array_equal(mul_mat(v, apart, p), mul_mat(v, left_out, p, reach=reach), equal_nan=True)


@pytest.mark.parametrize("q_value, k_value, v_value, finite", [
    (65519.0, 1.0, 1.0, True), (65520.0, 1.0, 1.0, False), (-65520.0, 1.0, 1.0, False), (np.nan, 1.0, 1.0, False),
    (1.0, np.inf, 1.0, False), (1.0, 1.0, np.nan, False)])
def test_a_reach_is_taken_only_where_every_product_it_leaves_out_is_finite(q_value, k_value, v_value, finite):
    """q overflows f16 from 65520 (it rounds to infinity); an infinite or NaN product with a masked cell would
    make its row NaN, which the products left out would not."""
    rng = np.random.default_rng(1)
    k, v = _caches(rng, 16, 1, 8)
    q = rng.standard_normal((2, 4, 8)).astype(np.float32)
    q[1, 2, 3], k[0, 5, 1], v[0, 2, 9] = q_value, k_value, v_value
    assert _finite(q, k, v) is finite


@pytest.mark.parametrize("rows", [3, 700])              # the serial and the parallel variant
def test_rms_norm_with_its_weight_equals_rms_norm_then_mul(rows):
    rng = np.random.default_rng(rows)
    x = rng.standard_normal((rows, 64)).astype(np.float32) * 3
    w = rng.standard_normal(64).astype(np.float32)
    assert np.array_equal(rms_norm(x, 1e-5, w), np.multiply(rms_norm(x, 1e-5), w, dtype=np.float32))


def test_a_decode_takes_fused_steps_and_taps_take_them_apart(tmp_path, tiny_preset):
    path = write_model_gguf(tmp_path / "llama.gguf", tiny_preset("llama", **{gguf.Keys.LLM.CONTEXT_LENGTH: 512}))
    model = load(str(path))
    fused, plain = model.new_context(n_ctx=300), model.new_context(n_ctx=300)
    prompt = [1 + i % 200 for i in range(259)]         # past 256 cells: the KV length pads to 300, the whole cache
    for part in (slice(0, 100), slice(100, 259)):     # 100 tokens over n_kv 256: the fused attention stops at 128
        fused.decode(Batch.from_tokens(prompt[part], part.start, outputs="all"))
        plain.decode(Batch.from_tokens(prompt[part], part.start, outputs="all"), taps={})
        assert np.array_equal(fused.logits(), plain.logits())
    spent: dict[str, list[float]] = {}
    for i in range(3):
        taps: dict[str, np.ndarray] = {}
        fused.program.profile = spent           # the two contexts share their program: profile one's runs only
        fused.decode(Batch.one(5 + i, len(prompt) + i))
        fused.program.profile = None
        plain.decode(Batch.one(5 + i, len(prompt) + i), taps=taps)
        assert "blk.0.kq_soft_max" in taps             # the taps run made every node's value
        assert np.array_equal(fused.logits(), plain.logits())
    n_layer = model.hparams.n_layer
    assert spent["attention"][1] == 3 * n_layer and "soft_max" not in spent
    assert spent["rms_norm*weight"][1] == 3 * (2 * n_layer + 1) and "rms_norm" not in spent   # + the output norm
