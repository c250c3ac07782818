"""Sparse attention's memory (``kv_dsa``) and indexer facts the conformance table does not reach.

The table's deepseek32 and glm-dsa rows run every scenario against llama.cpp; here: the rotation the indexer
cache hands its layers, which layers keep indexer keys, position edits against llama.cpp (both caches re-roped),
and GLM-5.2's indexer layers where the file leaves them out.
"""

from __future__ import annotations

from functools import lru_cache

import gguf
import numpy as np
import pytest
from conftest import make_tiny_preset, oracle_is_exact, process_folder, write_model_gguf

from graphir.arch import get
from graphir.arch.glm_dsa import glm_indexers
from graphir.batch import Batch
from graphir.errors import MetadataError
from graphir.memory.dsa import hadamard, rotation_width
from graphir.memory.layers import IndexerKeys, LatentAttention
from graphir.running.runtime import Model, load

K = gguf.Keys
TOP_K = "deepseek32.attention.indexer.top_k"


@lru_cache(maxsize=None)
def tiny(**keys: object) -> Model:
    d = process_folder("graphir-dsa-")
    return load(str(write_model_gguf(d / "deepseek32.gguf", make_tiny_preset("deepseek32", tied=False, **keys))))


def test_the_rotation_is_the_normalised_sylvester_hadamard_matrix_of_the_key_width():
    for n in (64, 128):
        h = hadamard(n)
        assert h.dtype == np.float32 and h.shape == (n, n)
        assert np.array_equal(np.abs(h), np.full((n, n), np.float32(1) / np.sqrt(np.float32(n))))
        assert np.allclose(h @ h, np.eye(n), atol=1e-6) and np.array_equal(h, h.T)
        assert h[0, 1] > 0 and h[1, 1] < 0  # [[H, H], [H, -H]]
    assert [rotation_width(w) for w in (64, 128, 192, 256, 320)] == [64, 128, 64, 256, 64]


def test_each_layer_keeps_a_latent_row_and_its_indexer_key_only_where_it_runs_an_indexer():
    md = {**make_tiny_preset("glm-dsa", tied=False).metadata(), "glm-dsa.attention.indexer.types": [1, 0, 1]}
    needs = get("glm-dsa").from_metadata("glm", md).layers()
    assert [tuple(type(n) for n in (e if isinstance(e, tuple) else (e,))) for e in needs] == [
        (LatentAttention, IndexerKeys), (LatentAttention,), (LatentAttention, IndexerKeys)]


def test_a_first_layer_without_an_indexer_is_refused_naming_the_key():
    md = {**make_tiny_preset("glm-dsa", tied=False).metadata(), "glm-dsa.attention.indexer.types": [0, 1, 1]}
    with pytest.raises(MetadataError, match=r"'glm-dsa\.attention\.indexer\.types': layer 0 runs no indexer"):
        get("glm-dsa").from_metadata("glm", md)


def test_glm_5_2s_indexer_layers_are_the_first_two_then_one_in_four():
    from types import SimpleNamespace
    full = glm_indexers(SimpleNamespace(n_ctx_train=1 << 20), 78)  # type: ignore[arg-type]
    assert full[:10] == (1, 1, 1, 0, 0, 0, 1, 0, 0, 0) and sum(full) == 2 + 19
    assert glm_indexers(SimpleNamespace(n_ctx_train=202752), 78) == (1,) * 78  # type: ignore[arg-type]


# The edits after a 16-token prompt, graphir's and llama.cpp's: drop the first 5 positions and slide the rest back
# (a context shift), or halve positions 12-15. llama.cpp's own seq_div records each cell's pending shift as
# old - new, turning K the wrong way (graphir.memory.kv: trap 9), so its side halves them by one seq_add per cell.
SLIDE = (("seq_rm", 0, 0, 5), ("seq_add", 0, 5, -1, -5))
EDITS = {"seq_add": (SLIDE, SLIDE),
         "seq_div": ((("seq_div", 0, 12, -1, 2),), tuple(("seq_add", 0, p, p + 1, p // 2 - p) for p in range(12, 16)))}


@pytest.mark.oracle
@pytest.mark.parametrize("edit", sorted(EDITS))
@pytest.mark.parametrize("arch", ["deepseek32", "glm-dsa"])
def test_position_edits_shift_both_caches_as_llama_cpp_does(arch: str, edit: str):
    """After seq_rm + seq_add or seq_div the next tokens' logits are llama.cpp's (bit for bit on its own CPU
    path): both caches re-rope their rows (the latent rows' key part, the indexer keys' tail), with an indexer
    that keeps 4 of the cached keys, so the shifted indexer keys decide which rows are attended."""
    import llama_made
    from test_families import LlamaCpp

    path = llama_made.make(process_folder(f"graphir-dsa-{arch}-") / "F32.gguf", arch, moe=True,
                           **{f"{arch}.attention.indexer.top_k": 4})
    prompt, then = [(7 * i + 3) % 128 for i in range(16)], [11, 29, 53, 71]
    ctx, o = load(str(path)).new_context(n_ctx=64), LlamaCpp(path, n_ctx=64)
    try:
        ctx.decode(Batch.from_tokens(prompt, 0))
        o.decode(prompt, range(len(prompt)), [0] * len(prompt))
        assert ctx.memory.can_shift()
        keys = {k: b.copy() for k, b in ctx.memory.buffers().items() if k.endswith("cache_k_lid")}
        mem = o.lib.llama_get_memory(o.ctx.ctx)
        graphirs, llama_cpps = EDITS[edit]
        for name, *args in graphirs:
            getattr(ctx.memory, name)(*args)
        for name, *args in llama_cpps:
            getattr(o.lib, f"llama_memory_{name}")(mem, *args)
        start = ctx.memory.seq_pos_max(0) + 1
        assert start == o.lib.llama_memory_seq_pos_max(mem, 0) + 1
        assert ctx.memory.update() and all((ctx.memory.buffers()[k] != b).any() for k, b in keys.items())
        ctx.decode(Batch(then, np.arange(start, start + len(then)), [(0,)] * len(then), [True] * len(then)))
        o.decode(then, range(start, start + len(then)), [0] * len(then))
        theirs = np.array([o.logits_ith(i) for i in range(len(then))])
    finally:
        o.close()
    apart = float(np.abs(ctx.logits() - theirs).max())
    assert theirs.std() > 0.05 and apart <= (0.0 if oracle_is_exact() else 1e-3), apart


def test_a_sequence_copied_then_cut_continues_as_the_original_in_both_caches():
    """seq_cp and seq_rm act on the latent and the indexer cache alike: a copy of sequence 0 decodes the same
    next logits as the original, with an indexer that keeps fewer keys than the prompt has."""
    m = tiny(**{TOP_K: 3})
    ctx = m.new_context(n_ctx=64, n_seq_max=2)
    prompt = list(range(4, 14))
    ctx.decode(Batch(prompt, None, [(0,)] * 10, [False] * 10))
    ctx.memory.seq_cp(0, 1, -1, -1)
    assert ctx.memory.seq_rm(1, 8, -1)
    ctx.decode(Batch(prompt[8:], None, [(1,)] * 2, [False, True]))
    copied = np.array(ctx.logits()[-1])
    alone = m.new_context(n_ctx=64)
    alone.decode(Batch(prompt, None, [(0,)] * 10, [False] * 9 + [True]))
    assert np.array_equal(copied, np.array(alone.logits()[-1]))
