"""Pooling inputs: which rows of a ubatch make each sequence's embedding (llama.cpp's pooling types).

The graph side is :meth:`graphir.model.builder.GraphBuilder.build_pooling`; here the context computes, per ubatch,
the sequences it holds (ascending ids, one pooled row each) and what the graph reads to reduce them.
Semantics follow llama.cpp: mean divides by the sequence's token count *in this ubatch*; cls takes the token
with the smallest position, last the largest (not the first/last index); a token shared by several
sequences counts for each of them.
"""

from __future__ import annotations

import numpy as np

from graphir.batch import UBatch
from graphir.graph.ir import Graph


def pooling_rule(graph: Graph, pooling: str) -> str:
    """How a graph pooling by ``pooling`` reads its rows: the token its ``inp_cls`` input picks (cls or last), the
    mean where it has ``inp_mean`` (rank pooling reads its rows as one of these), else as ``pooling`` says."""
    if "inp_cls" in graph:
        return str(graph["inp_cls"].attrs["pick"])
    return "mean" if "inp_mean" in graph else pooling


def pooling_inputs(ub: UBatch, pooling: str) -> tuple[list[int], dict[str, np.ndarray]]:
    """(sequence ids in pooled-row order, graph inputs) for one ubatch; ``pooling``: mean, cls or last
    (:func:`pooling_rule`)."""
    seqs = sorted({s for ids in ub.seq_ids for s in ids})
    if pooling == "mean" and len(seqs) == 1:   # one sentence: every token, 1/n each (the division below, in double)
        return seqs, {"inp_mean": np.full((1, len(ub)), 1.0 / len(ub), np.float32)}
    row = {s: r for r, s in enumerate(seqs)}
    member = np.zeros((len(seqs), len(ub)), dtype=bool)
    at = [(row[s], i) for i, ids in enumerate(ub.seq_ids) for s in ids]
    member[tuple(np.array(at).T)] = True
    if pooling == "mean":
        mean = member / member.sum(axis=1, keepdims=True)
        return seqs, {"inp_mean": mean.astype(np.float32)}
    pos = np.where(member, ub.pos[None, :].astype(np.int64), np.iinfo(np.int64).max if pooling == "cls" else -1)
    pick = pos.argmin(axis=1) if pooling == "cls" else pos.argmax(axis=1)
    return seqs, {"inp_cls": pick.astype(np.int32)}
