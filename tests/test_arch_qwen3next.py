"""Qwen3-Next (qwen3next) in its older file form, which the conformance table's rows cannot reach: llama.cpp's
tiny model has both forms of a DeltaNet layer's input projection and its graph takes attn_qkv/attn_gate, so here
the tests' writer makes a file with ssm_in alone (q, k, v and z of each key head in turn) and ssm_ba (beta and
alpha of each key head's value heads), 4 value heads sharing 2 key heads (conftest TINY_FAMILY["qwen3next"]).
llama.cpp is the oracle: the prompt's logits and greedy steps bit for bit on its AVX-512 path, and its own graph.
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from conftest import TinyModels, make_tiny_preset, oracle_is_exact, oracle_path, write_model_gguf
from test_families import greedy_against_llama_cpp

from graphir.batch import Batch
from graphir.errors import GraphirError
from graphir.llamacpp.compare import agreement
from graphir.model.meta import open_model

oracle = pytest.mark.oracle
PROMPT = np.random.default_rng(80).integers(0, 256, 12).tolist()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> TinyModels:
    return TinyModels(tmp_path_factory.mktemp("qwen3next"), {"ssm_in": make_tiny_preset("qwen3next", tied=False)})


def test_the_file_holds_the_older_form_only(tiny: TinyModels) -> None:
    names = set(tiny.model("ssm_in").meta.tensors)
    assert "blk.0.ssm_in.weight" in names and "blk.0.ssm_ba.weight" in names
    assert not any(n.startswith(("blk.0.attn_qkv.", "blk.0.attn_gate.")) for n in names)


@oracle
def test_prompt_logits_and_greedy_continuation_are_llama_cpps(tiny: TinyModels) -> None:
    def check(ours: np.ndarray, ref: np.ndarray, what: str) -> None:
        worst = float(np.abs(ours - ref).max())
        exact = oracle_is_exact() and oracle_path() == "avx512"
        assert worst == 0.0 if exact else worst <= 1e-3, f"{what}: max |d| {worst:.3g}"

    ours, theirs = greedy_against_llama_cpp(tiny.model("ssm_in"), tiny.path("ssm_in"), PROMPT, 8, check)
    assert ours == theirs


@oracle
def test_the_graph_is_llama_cpps_own(tiny: TinyModels) -> None:
    phases = agreement(open_model(str(tiny.path("ssm_in"))))
    assert phases and all(first is None for first in phases.values()), phases


def test_logits_do_not_depend_on_ubatches_of_several_tokens(tiny: TinyModels) -> None:
    """Ubatches of 64 and of 3 agree; single-token ubatches differ by float rounding alone (1e-4 here, as in
    llama.cpp: ggml multiplies one column by ssm_in with vec_dot, several with tinyBLAS)."""
    last = []
    for n_ubatch in (64, 3):
        ctx = tiny.model("ssm_in").new_context(n_ctx=64, n_ubatch=n_ubatch)
        ctx.decode(Batch.from_tokens(PROMPT, 0))
        last.append(ctx.logits_ith(-1).copy())
    assert np.abs(last[1] - last[0]).max() <= 1e-5


SPLIT = r"blk\.\d+\.(attn_qkv|attn_gate|ffn_(gate|up)_exps)\.weight"  # the converter's form


@pytest.mark.parametrize("include, drop, missing", [
    ("", "blk.0.ssm_in.weight", "'blk.0.attn_qkv.weight' (or 'blk.0.ssm_in.weight' of q, k, v and z in one)"),
    (SPLIT, "blk.0.attn_gate.weight", "'blk.0.attn_gate.weight' beside 'blk.0.attn_qkv.weight'")])
def test_a_deltanet_layer_without_its_projections_is_one_line_naming_them(tmp_path: Path, include: str, drop: str,
                                                                          missing: str) -> None:
    """A layer llama.cpp's graph would read a tensor it does not have of: the file is refused, naming it."""
    preset = make_tiny_preset("qwen3next", tied=False)
    path = write_model_gguf(tmp_path / "cut.gguf", replace(preset, include=include or preset.include), drop=(drop,))
    with pytest.raises(GraphirError, match=re.escape(f"missing tensor {missing}")):
        open_model(str(path)).build_graph("hybrid", "decode")
