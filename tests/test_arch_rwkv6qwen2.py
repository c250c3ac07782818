"""QRWKV6 (rwkv6qwen2) where the conformance table does not reach: llama.cpp's token-shift store when several
sequences of several tokens share a ubatch, and the file llama.cpp's own saver writes, which its graph cannot run."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import make_tiny_preset, write_model_gguf
from test_families import LlamaCpp, last_index, multi

import llama_made
from graphir.batch import Batch
from graphir.errors import GraphirError
from graphir.running.runtime import load


@pytest.mark.oracle
def test_two_sequences_of_two_tokens_in_a_ubatch_keep_llama_cpps_token_shifts(tmp_path: Path) -> None:
    """Sequences 0 and 1 interleaved, cut into ubatches of two tokens of each: llama.cpp keeps as the second
    sequence's token shift the row after the first one's last token (arch/rwkv6qwen2.py), so the second sequence's
    logits are not those it has alone. graphir's are llama.cpp's, bit for bit, both sequences."""
    path = write_model_gguf(tmp_path / "q.gguf", make_tiny_preset("rwkv6qwen2"))
    seqs = [[5, 17, 3, 99], [42, 8, 61, 7]]
    tokens, pos, ids = multi(seqs, "interleaved")
    ctx = load(str(path)).new_context(n_ctx=64, n_seq_max=2, n_ubatch=4)
    ctx.decode(Batch(np.array(tokens), np.array(pos), [(s,) for s in ids], np.ones(len(tokens), bool)))
    o = LlamaCpp(path, n_ctx=64, n_seq_max=2, n_ubatch=4)
    alone = LlamaCpp(path, n_ctx=64)
    try:
        o.decode(tokens, pos, ids)
        for j in (0, 1):
            assert ctx.logits_ith(last_index(ids, j)).tobytes() == o.logits_ith(last_index(ids, j)).tobytes(), j
        alone.decode(seqs[1], range(4), [0] * 4)
        assert np.abs(o.logits_ith(last_index(ids, 1)) - alone.logits_ith(3)).max() > 0.01
    finally:
        o.close()
        alone.close()


def test_the_file_llama_cpps_saver_writes_is_refused_naming_time_first(tmp_path: Path) -> None:
    """llama.cpp's saver writes every optional tensor, time_mix_first too, which sends its builder down RWKV6's path
    to time_mix_ln, a tensor its loader never creates for this architecture (llama.cpp crashes on it)."""
    path = llama_made.make(tmp_path / "q.gguf", "rwkv6qwen2", **{"rwkv6qwen2.token_shift_count": 1})
    with pytest.raises(GraphirError, match=r"tensor 'blk\.0\.time_mix_first\.weight': .*time_mix_ln"):
        load(str(path))
