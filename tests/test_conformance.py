"""One table, every family: each row is a tiny model, and every row runs the same scenarios.

The tiny models come from llama.cpp itself where it can make them (tests/llama_made.py: its loader creates
every tensor the architecture may read, optional ones included, and its own quantizer makes the F16 and Q8_0
files), so the tensor set a row checks is llama.cpp's. Where llama.cpp cannot save a model of the family (its
saver has no T5; the BERT file it writes lacks token_embd), the row's model is graphir's own tiny GGUF
(tests/conftest.py). The scenarios:

- logits: a prompt's logits at every position, then a few greedy steps, within 1e-3 of llama.cpp's (F32
  weights and cache); an encoder's token embeddings instead;
- greedy: the tokens llama.cpp chooses for F16 and Q8_0 weights, token for token;
- batch and ubatch invariance: a prompt as one ubatch, in ubatches of 3 and token by token gives the same logits;
- sequences: several sequences interleaved in one batch equal llama.cpp's and each one alone;
- state: a context saved and loaded into another continues bit for bit as the first;
- failure: a ubatch whose computation fails leaves every byte of the memory as it was;
- snapshot: the family has golden graphs (tests/test_graphs.py).

Adding a family to CI is adding a row.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
from conftest import assert_llama_logits, make_tiny_preset, write_model_gguf
from test_families import (LlamaCpp, failing_second_ubatch_changes_nothing, graphir_greedy,
                           interleaved_against_llama_cpp, llama_cpp_greedy)

import llama_made
from graphir.model.presets import all_presets
from graphir.batch import Batch
from graphir.running.runtime import Model, load

Q = gguf.GGMLQuantizationType
SNAPSHOTS = Path(__file__).parent.parent / "snapshots" / "test_graphs"


@dataclass(frozen=True)
class Row:
    """One tiny model: its architecture, who makes it, and the keys it is made with."""

    arch: str
    variant: str = ""  # tells two rows of one architecture apart ("moe")
    made_by: str = "llama.cpp"  # or "graphir": a family llama.cpp cannot save
    moe: bool = False
    keys: dict[str, Any] = field(default_factory=dict)

    @property
    def id(self) -> str:
        return f"{self.arch}-{self.variant}" if self.variant else self.arch


ROWS = [
    Row("bert", made_by="graphir"),
    Row("nomic-bert", made_by="graphir"),
    Row("t5encoder"),
]

_rng = np.random.default_rng(7)
PROMPT = _rng.integers(0, 128, 10).tolist()
SEQS = [_rng.integers(0, 128, n).tolist() for n in (6, 3, 8)]


def _arch(row: Row) -> Any:
    """The row's architecture from its metadata alone (no model is made to collect the table)."""
    import graphir.arch

    md = make_tiny_preset(row.arch, **row.keys).metadata() if row.made_by == "graphir" else \
        llama_made.metadata(row.arch, row.moe, **row.keys)
    return graphir.arch.get(row.arch).from_metadata(row.id, md)


def rows(*, generates: bool | None = None, remembers: bool | None = None) -> Any:
    """The table as a parametrization, narrowed to the rows a scenario applies to, by what the row's
    architecture is: whether it generates (an LM head read causally), whether its memory keeps anything."""
    def fits(row: Row) -> bool:
        arch = _arch(row)
        has_head = arch.causal and arch.hp.pooling == "none" and arch.encoder_stack is None
        keeps = arch.contexts[0] != "none"
        return (generates is None or generates == has_head) and (remembers is None or remembers == keeps)
    return pytest.mark.parametrize("row", [pytest.param(r, id=r.id) for r in ROWS if fits(r)])


_PATHS: dict[tuple[str, Q], Path] = {}
_MODELS: dict[tuple[str, Q], Model] = {}


def _path(row: Row, dtype: Q) -> Path:
    """The row's model file of type ``dtype`` (made once per test session)."""
    if (row.id, dtype) not in _PATHS:
        import tempfile

        folder = Path(tempfile.mkdtemp(prefix=f"conformance-{row.id}-"))
        if row.made_by == "graphir":
            path = write_model_gguf(folder / f"{dtype.name}.gguf", make_tiny_preset(row.arch, **row.keys), dtype)
        elif dtype == Q.F32:
            path = llama_made.make(folder / "F32.gguf", row.arch, moe=row.moe, **row.keys)
        else:
            path = llama_made.quantize(_path(row, Q.F32), folder / f"{dtype.name}.gguf", dtype.name)
        _PATHS[row.id, dtype] = path
    return _PATHS[row.id, dtype]


def _model(row: Row, dtype: Q) -> Model:
    if (row.id, dtype) not in _MODELS:
        _MODELS[row.id, dtype] = load(str(_path(row, dtype)))
    return _MODELS[row.id, dtype]


# ---- the scenarios ---------------------------------------------------------------------------------------


@pytest.mark.oracle
@rows(generates=True)
def test_logits_equal_llama_cpps_at_every_position_and_step(row: Row) -> None:
    m, path = _model(row, Q.F32), _path(row, Q.F32)
    ctx, o = m.new_context(n_ctx=64), LlamaCpp(path, n_ctx=64)
    try:
        ctx.decode(Batch.from_tokens(PROMPT, 0, outputs="all"))
        o.decode(PROMPT, range(len(PROMPT)), [0] * len(PROMPT))
        assert_llama_logits(ctx.logits(), np.stack([o.logits_ith(i) for i in range(len(PROMPT))]), "prompt logits")
        for p in range(len(PROMPT), len(PROMPT) + 4):
            token = int(np.argmax(o.logits_ith(-1)))
            ctx.decode(Batch.one(token, p))
            o.decode([token], [p], [0])
            assert_llama_logits(ctx.logits_ith(-1), o.logits_ith(0), f"step {p}")
    finally:
        o.close()


@pytest.mark.oracle
@rows(generates=False)
def test_token_embeddings_equal_llama_cpps(row: Row) -> None:
    m, path = _model(row, Q.F32), _path(row, Q.F32)
    ctx = m.new_context(n_ctx=64, pooling="none", embeddings=True)
    ctx.decode(Batch.from_tokens(PROMPT, 0, outputs="all"))
    o = LlamaCpp(path, n_ctx=64, pooling="none")
    try:
        o.encode(PROMPT, range(len(PROMPT)), [0] * len(PROMPT))
        ours = ctx.embeddings()
        theirs = np.stack([o.embeddings_ith(i) for i in range(len(PROMPT))])
        assert np.abs(ours - theirs).max() <= 1e-3
    finally:
        o.close()


@pytest.mark.oracle
@pytest.mark.parametrize("dtype", [Q.F16, Q.Q8_0], ids=["F16", "Q8_0"])
@rows(generates=True)
def test_greedy_tokens_are_llama_cpps(row: Row, dtype: Q) -> None:
    assert graphir_greedy(_model(row, dtype), PROMPT, 8) == llama_cpp_greedy(_path(row, dtype), PROMPT, 8)


@rows(generates=True)
def test_logits_do_not_depend_on_how_the_prompt_is_split(row: Row) -> None:
    m = _model(row, Q.F32)
    last = []
    for n_ubatch in (64, 3, 1):
        ctx = m.new_context(n_ctx=64, n_ubatch=n_ubatch)
        ctx.decode(Batch.from_tokens(PROMPT, 0))
        last.append(ctx.logits_ith(-1).copy())
    one_by_one = m.new_context(n_ctx=64)
    for p, t in enumerate(PROMPT):
        one_by_one.decode(Batch.one(t, p))
    last.append(one_by_one.logits_ith(-1))
    for other in last[1:]:
        assert np.abs(other - last[0]).max() <= 1e-5


@pytest.mark.oracle
@rows(generates=True)
def test_sequences_in_one_batch_equal_llama_cpps_and_each_alone(row: Row) -> None:
    interleaved_against_llama_cpp(_model(row, Q.F32), _path(row, Q.F32), SEQS, n_ubatch=5)


@rows(remembers=True)
def test_a_saved_state_loaded_elsewhere_continues_bit_for_bit(row: Row) -> None:
    m = _model(row, Q.F32)
    ctx = m.new_context(n_ctx=64)
    ctx.decode(Batch.from_tokens(PROMPT, 0))
    saved = ctx.state_save()
    other = m.new_context(n_ctx=64)
    other.state_load(saved)
    for c in (ctx, other):
        c.decode(Batch.one(PROMPT[0], len(PROMPT)))
    assert other.logits_ith(-1).tobytes() == ctx.logits_ith(-1).tobytes()


@rows(remembers=True)
def test_a_failing_ubatch_changes_nothing(row: Row, monkeypatch: pytest.MonkeyPatch) -> None:
    failing_second_ubatch_changes_nothing(_model(row, Q.F32), PROMPT, monkeypatch)


@pytest.mark.parametrize("row", [pytest.param(r, id=r.id) for r in ROWS])
def test_the_family_has_golden_graphs(row: Row) -> None:
    presets = [name for name, p in all_presets().items() if p.arch == row.arch]
    assert any(next(SNAPSHOTS.glob(f"test_graph[[]{name}-*"), None) for name in presets), row.arch
