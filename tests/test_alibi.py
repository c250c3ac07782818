"""ALiBi (Press et al. 2022, "Train Short, Test Long"): each head's scores biased by a slope times minus the
key's distance from the query, as llama.cpp builds it: the mask holds -|key pos - query pos| where a key is
seen, and ggml's soft_max multiplies it by the head's slope. Families with ALiBi are rows of the conformance
table (bloom, mpt, refact, jais, baichuan 13B); this file pins the pieces."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import Keys

from graphir.backends.numba.kernels.softmax import alibi_slopes
from graphir.errors import MetadataError
from graphir.memory.layers import Attention
from graphir.model.hparams import Alibi, read_hparams

F32 = np.float32
A = Keys.Attention


def test_the_slopes_are_ggmls_powers_of_m0_then_odd_powers_of_m1() -> None:
    # 12 heads: n = 8, m0 = 2^-1 for heads 0..7 (exact), m1 = 2^-0.5 to the powers 1, 3, 5, 7 for heads 8..11
    # as glibc's powf rounds them (numpy's float32 power gives 0.35355335 for the second)
    assert alibi_slopes(8.0, 12).tolist() == [F32(0.5) ** (h + 1) for h in range(8)] + \
        [F32(0.70710677), F32(0.35355338), F32(0.17677668), F32(0.08838834)]
    assert alibi_slopes(8.0, 2).tolist() == [2.0 ** -4, 2.0 ** -8]


def test_the_mask_holds_minus_the_distance_where_a_key_is_seen() -> None:
    q, k = np.array([[3], [4]]), np.array([[0, 1, 2, 3, 4]])
    seen = k <= q
    plain, alibi = Attention(64, 64), Attention(64, 64, alibi=True)
    assert plain.mask(seen, q, k).tolist() == [[0, 0, 0, 0, -np.inf], [0, 0, 0, 0, 0]]
    assert alibi.mask(seen, q, k).tolist() == [[-3, -2, -1, 0, -np.inf], [-4, -3, -2, -1, 0]]
    assert alibi.mask_facts() == {"causal": True, "alibi": True} and "alibi" not in plain.mask_facts()


def _hp(alibi: Alibi, n_layer: int = 2, **keys: float) -> float:
    md = {Keys.LLM.EMBEDDING_LENGTH.format(arch="x"): 64, Keys.LLM.BLOCK_COUNT.format(arch="x"): n_layer,
          A.HEAD_COUNT.format(arch="x"): 4, Keys.LLM.CONTEXT_LENGTH.format(arch="x"): 128,
          **{k.format(arch="x"): v for k, v in keys.items()}}
    return read_hparams("m.gguf", md, "x", alibi=alibi).max_alibi_bias


def test_a_family_takes_its_bias_as_llama_cpps_loader_sets_it() -> None:
    assert _hp(Alibi()) == 8.0                                         # BLOOM, Refact: always 8
    assert _hp(Alibi(key=True)) == 0.0                                 # MPT, JAIS: the file's key, else none
    assert _hp(Alibi(key=True), **{A.MAX_ALIBI_BIAS: 4.0}) == 4.0
    assert _hp(Alibi(n_layer=40), n_layer=40) == 8.0                   # Baichuan: the 13B of 40 layers
    assert _hp(Alibi(n_layer=40), n_layer=32) == 0.0                   # its 7B ropes instead
    with pytest.raises(MetadataError, match=r"m.gguf: key 'x.attention.max_alibi_bias' is -1.0"):
        _hp(Alibi(key=True), **{A.MAX_ALIBI_BIAS: -1.0})
