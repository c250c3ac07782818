"""PLaMo 2's state-space mixer with several sequences in one ubatch: where llama.cpp's graph is not the oracle.

llama.cpp's mixer (src/models/plamo2.cpp) swaps the token and sequence axes of the in-projection
({2 d_inner, n_seq_tokens, n_seqs} -> {2 d_inner, n_seqs, n_seq_tokens}), copies it contiguous and reads the copy
back as {head_dim * 2, n_heads, n_seq_tokens, n_seqs}. Row s + n_seqs * t of the copy (token t of sequence s)
is read as token t' of sequence s' with t' + n_seq_tokens * s' = s + n_seqs * t: the same row when the ubatch has
one sequence or one token of each, another sequence's token otherwise, so a sequence's convolution and scan state
take in its neighbours' tokens. graphir's mixer reads each sequence's own rows; the conformance row compares the
two engines in ubatches where llama.cpp's reading is the same (``seq_ubatch``), and this file shows the rest.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import process_folder
from test_families import LlamaCpp, last_index, multi

import llama_made
from graphir.batch import Batch
from graphir.running.runtime import Model, load

# two sequences of two tokens: one ubatch of four holds two tokens of each (llama.cpp's split_equal)
SEQS = [[5, 17], [40, 3]]
_made: dict[str, Path] = {}


def _path() -> Path:
    if "F32" not in _made:
        _made["F32"] = llama_made.make(process_folder("plamo2-") / "F32.gguf", "plamo2")
    return _made["F32"]


def _alone(model: Model, seq: list[int]) -> np.ndarray:
    ctx = model.new_context(n_ctx=64)
    ctx.decode(Batch.from_tokens(seq, 0, outputs="all"))
    return ctx.logits_ith(-1).copy()


def _theirs(n_ubatch: int, seqs: list[list[int]]) -> list[np.ndarray]:
    """llama.cpp's last logits of each sequence of ``seqs`` decoded interleaved in one batch."""
    tokens, pos, ids = multi(seqs, "interleaved")
    o = LlamaCpp(_path(), n_ctx=64, n_seq_max=len(seqs), n_ubatch=n_ubatch)
    try:
        o.decode(tokens, pos, ids)
        return [o.logits_ith(last_index(ids, j)).copy() for j in range(len(seqs))]
    finally:
        o.close()


@pytest.mark.oracle
def test_llama_cpp_mixes_the_sequences_of_a_ubatch_of_several_tokens_of_several_sequences() -> None:
    """In ubatches of four (two tokens of each sequence) llama.cpp gives each sequence other logits than it gives
    the sequence alone; in ubatches of two (one token of each) it gives the same. graphir gives each sequence
    its own logits in both."""
    model = load(str(_path()))
    alone = [_theirs(4, [seq])[0] for seq in SEQS]
    for j, (mixed, sound) in enumerate(zip(_theirs(4, SEQS), _theirs(2, SEQS))):
        assert np.abs(mixed - alone[j]).max() > 1e-3, j
        assert np.abs(sound - alone[j]).max() <= 1e-5, j
        assert np.abs(_alone(model, SEQS[j]) - alone[j]).max() <= 1e-3, j
    tokens, pos, ids = multi(SEQS, "interleaved")
    for n_ubatch in (4, 2):
        ctx = model.new_context(n_ctx=64, n_seq_max=len(SEQS), n_ubatch=n_ubatch)
        ctx.decode(Batch(np.array(tokens), np.array(pos), [(s,) for s in ids], np.ones(len(tokens), bool)))
        for j, seq in enumerate(SEQS):
            assert np.abs(ctx.logits_ith(last_index(ids, j)) - _alone(model, seq)).max() <= 1e-5, (n_ubatch, j)
