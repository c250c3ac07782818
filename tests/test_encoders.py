"""Encoder facts the conformance table's rows do not reach."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from test_families import LlamaCpp

from graphir.batch import Batch
from graphir.running.runtime import load

PROMPT = [5, 9, 3, 77, 12, 40, 101, 7]


@pytest.mark.oracle
def test_llama_embed_as_converted_attends_causally_as_llama_decode_does(tmp_path: Path) -> None:
    """A llama-embed file without attention.causal = false (the converter writes none) attends causally: llama.cpp
    gives the model a cache it never reads, so llama_decode runs it with the file's causal mask (llama_encode would
    not). Each token's embedding is llama_decode's, and the first token's is its own embedding alone."""
    import llama_made

    path = llama_made.make(tmp_path / "llama-embed.gguf", "llama-embed", **{"llama-embed.pooling_type": 1})
    model = load(str(path))
    assert model.hparams.causal and model.arch.contexts == ("none",)

    def ours(tokens: list[int]) -> np.ndarray:
        ctx = model.new_context(n_ctx=64, pooling="none", embeddings=True)
        ctx.decode(Batch.from_tokens(tokens, 0, outputs="all"))
        return ctx.embeddings()

    ref = LlamaCpp(path, n_ctx=64, pooling="none")
    try:
        ref.decode(PROMPT, range(len(PROMPT)), [0] * len(PROMPT))
        want = np.stack([ref.embeddings_ith(i) for i in range(len(PROMPT))])
    finally:
        ref.close()
    got = ours(PROMPT)
    assert np.abs(got - want).max() <= 1e-3
    assert np.abs(got[0] - ours(PROMPT[:1])[0]).max() <= 1e-6
    pooled = model.new_context(n_ctx=64, pooling="mean")
    pooled.decode(Batch.from_tokens(PROMPT, 0))
    assert np.abs(pooled.embeddings_seq(0) - want.mean(axis=0)).max() <= 1e-3
