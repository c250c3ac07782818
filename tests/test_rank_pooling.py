"""Rank pooling: a reranker's classifier head over each sequence's cls row, as llama.cpp's build_pooling has it
(``cls`` then tanh, then ``cls.output``, each where the file has it), and its refusal on a model without a head."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import gguf
import numpy as np
import pytest
from conftest import make_tiny_preset, write_model_gguf
from test_families import SEQS, encode, llama_cpp_encode

from graphir.batch import Batch
from graphir.cli import main
from graphir.errors import GraphirError
from graphir.running.runtime import load

LABELS = {gguf.Keys.Classifier.OUTPUT_LABELS: ["no", "maybe", "yes"]}
# (family, the head its reranker files carry, keys): BERT's two layers (bge-reranker's RoBERTa head, three labels),
# jina-bert-v2's single projection (jina-reranker-v1), ModernBERT's (gte-reranker-modernbert), ModernBERT's (gte-reranker-modernbert)
HEADS = [("bert", r"cls(\.output)?\.(weight|bias)", LABELS), ("jina-bert-v2", r"cls\.(weight|bias)", {}),
         # ModernBERT's: the mean of each sequence through dense, GELU, its norm and the projection
         ("modern-bert", r"cls(\.output)?\.weight|cls\.norm\.weight|cls\.output\.bias", {}),
         # NeoBERT's sequence-classification head: dense, tanh, the projection to three labels
         ("neo-bert", r"cls(\.output)?\.(weight|bias)", LABELS)]


def _reranker(tmp_path: Path, arch: str, head: str, keys: dict[str, object]) -> Path:
    tiny = make_tiny_preset(arch, **keys)
    return write_model_gguf(tmp_path / f"{arch}-rank.gguf", replace(tiny, include=f"{tiny.include}|{head}"))


@pytest.mark.oracle
@pytest.mark.parametrize("arch,head,keys", HEADS, ids=[h[0] for h in HEADS])
def test_rank_scores_of_a_multi_sequence_batch_are_llama_cpps(tmp_path: Path, arch: str, head: str,
                                                               keys: dict[str, object]) -> None:
    path = _reranker(tmp_path, arch, head, keys)
    n_out = len(keys.get(gguf.Keys.Classifier.OUTPUT_LABELS, [])) or 1
    ref = llama_cpp_encode(path, SEQS, "rank")
    try:
        want = [ref.embeddings_seq(j, n_out) for j in range(len(SEQS))]
    finally:
        ref.close()
    model = load(str(path))
    ctx = encode(model, SEQS, "rank")
    cls = encode(model, SEQS, "cls")
    for j in range(len(SEQS)):
        got = ctx.embeddings_seq(j)
        assert got.shape == (n_out,)
        assert np.abs(got - want[j]).max() <= 1e-4
        assert not np.allclose(got, cls.embeddings_seq(j)[:n_out])  # the head ran


def test_rank_pooling_on_a_model_without_a_classifier_head_is_one_line_and_changes_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_model_gguf(tmp_path / "nomic.gguf", make_tiny_preset("nomic-bert"))
    model = load(str(path))
    ctx = model.new_context(pooling="mean")
    ctx.decode(Batch.from_tokens(SEQS[0], 0))
    before = ctx.embeddings_seq(0).copy()
    with pytest.raises(GraphirError, match=r"^pooling 'rank' needs a classifier head \(tensor cls\.weight or "
                                           r"cls\.output\.weight\), which this nomic-bert model does not have$"):
        model.new_context(pooling="rank")
    assert np.array_equal(ctx.embeddings_seq(0), before)
    assert main(["embed", str(path), "-p", "hello", "--pooling", "rank"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "pooling 'rank' needs a classifier head" in err[0]


def test_bge_reranker_v2_m3_scores_each_sequence_through_robertas_head() -> None:
    """The preset's rank graph: the cls row through cls (1024 x 1024, bias), tanh, then cls.output to one score."""
    from graphir.model.meta import open_model

    graph = open_model("bge-reranker-v2-m3").build_graph("none", "prefill", pooling="rank")
    score = graph.outputs["pooled"]
    assert score.name == "result_cls_out.b" and score.shape[0] == 1
    assert [n.op for n in graph.nodes if n.name.startswith("result_")] == [
        "get_rows", "mul_mat", "add", "tanh", "mul_mat", "add"]
    assert graph["inp_cls"].attrs["pick"] == "cls"


@pytest.mark.oracle
@pytest.mark.parametrize("pooling", ["last", "rank"])
def test_a_causal_model_pools_each_sequences_last_token_as_llama_cpp(tmp_path: Path, pooling: str) -> None:
    """Qwen3 (Qwen3-Embedding's last-token pooling; Qwen3-Reranker's rank: the last token, not the first, through
    cls.output and a softmax), on llama.cpp's own tiny qwen3, which carries the optional cls.output."""
    import llama_made

    path = llama_made.make(tmp_path / "qwen3.gguf", "qwen3")
    n = 1 if pooling == "rank" else 0
    seqs = [[t % 128 for t in s] for s in SEQS]  # llama.cpp's tiny vocabulary has 128 tokens
    ref = llama_cpp_encode(path, seqs, pooling)
    try:
        want = [ref.embeddings_seq(j, n) for j in range(len(seqs))]
    finally:
        ref.close()
    model = load(str(path))
    assert "cls.output.weight" in model.meta.tensors
    ctx = encode(model, seqs, pooling)
    for j in range(len(seqs)):
        assert np.abs(ctx.embeddings_seq(j) - want[j]).max() <= 1e-4
    graph = model.meta.build_graph("kv", "prefill", pooling=pooling)
    assert graph["inp_cls"].attrs["pick"] == "last"
    if pooling == "rank":
        assert graph.outputs["pooled"].op == "soft_max"
