"""The reference backend (graphir.backends.reference): every op of the catalogue in numpy, and the numba backend
held to it model by model, on every family's tiny model and on SmolLM2.

Bounds: with float32 caches the two backends compute the same real numbers in two float orders, so logits agree
within 1e-3 (measured <= 1e-6 but for gemma2/3, whose GELU the numba backend reads from ggml's f16 table as
llama.cpp does: <= 1e-3). With the default f16 caches both round the same cached values to f16 (and the
attention's operands with them, as ggml does), but values a float rounding apart may land on neighbouring halves:
within 1e-2. On SmolLM2 (Q4_1 and Q8_0 matrices) the numba backend quantizes each activation to the weight's
dot-product format as llama.cpp does and the reference multiplies floats: the logits are only close
(graphir.backends.numba.primitives.isa.APPROX, llama.cpp's own distance from a float engine), and the greedy
token is the same.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import TinyModels, make_tiny_preset
from test_arch_gpt2_phi3 import MODELS as GPT2_PHI3
from test_arch_t5 import PRESETS as T5

from graphir import arch
from graphir.backends.numba.primitives.isa import APPROX
from graphir.backends.reference.ops import REFERENCES
from graphir.cli import main
from graphir.graph.ops import COMPUTING
from graphir.batch import Batch
from graphir.running.runtime import load

PROMPT = [3, 17, 4, 99, 5, 42, 6]
STEPS = [7, 8]
ENCODERS = ("bert", "nomic-bert", "t5encoder")
ENCODER_DECODERS = ("t5",)
PRESETS = {**{name: make_tiny_preset(name) for name in arch.names()
              if name not in ("gpt2", "phi3", "t5", "t5encoder")},
           "gpt2": GPT2_PHI3["gpt2"], "phi3": GPT2_PHI3["phi3"],
           "t5": T5["t5-gated"], "t5encoder": T5["t5encoder-relu"]}
F32_CACHES = {"type_k": "f32", "type_v": "f32"}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> TinyModels:
    return TinyModels(tmp_path_factory.mktemp("reference"), PRESETS)


def outputs(path: Path, backend: str, family: str, **caches: str) -> list[np.ndarray]:
    """What a model computes on one backend: a decoder's logits of a prompt (every position) and of two steps;
    an encoder's token embeddings; an encoder-decoder's encoder output, then its decoder's logits."""
    model = load(str(path), backend=backend)
    if family in ENCODERS:
        ctx = model.new_context(n_ctx=64, embeddings=True)
        ctx.decode(Batch.from_tokens(PROMPT, 0))
        return [ctx.embeddings().copy()]
    got = []
    ctx = model.new_context(n_ctx=64, **caches)
    if family in ENCODER_DECODERS:
        ctx.encode(Batch.from_tokens(PROMPT, 0))
        got.append(ctx.encoder_embeddings().copy())
        ctx.decode(Batch.from_tokens([3], 0))
        n_past = 1
    else:
        ctx.decode(Batch(np.asarray(PROMPT), np.arange(len(PROMPT)), [(0,)] * len(PROMPT), np.ones(len(PROMPT), bool)))
        n_past = len(PROMPT)
    got.append(ctx.logits().copy())
    for i, tok in enumerate(STEPS):
        ctx.decode(Batch.one(tok, n_past + i))
        got.append(ctx.logits().copy())
    return got


def test_every_family_has_a_tiny_model_here() -> None:
    assert set(PRESETS) == set(arch.names())


def test_every_computing_op_has_exactly_one_reference() -> None:
    """An op added to the catalogue without its numpy definition fails here (REFERENCES is a dict: one each)."""
    assert set(REFERENCES) == COMPUTING


@pytest.mark.parametrize("family", sorted(PRESETS))
def test_numba_equals_the_reference_on_every_familys_tiny_model(tiny: TinyModels, family: str) -> None:
    caches = {} if family in ENCODERS else F32_CACHES
    ours = outputs(tiny.path(family), "numba", family, **caches)
    ref = outputs(tiny.path(family), "reference", family, **caches)
    assert len(ours) == len(ref) >= 1
    for a, b in zip(ours, ref):
        assert a.shape == b.shape and np.isfinite(b).all()
        assert float(np.abs(a - b).max()) <= 1e-3


def test_with_f16_caches_the_backends_round_the_same_values(tiny: TinyModels) -> None:
    for a, b in zip(outputs(tiny.path("llama"), "numba", "llama"), outputs(tiny.path("llama"), "reference", "llama")):
        assert float(np.abs(a - b).max()) <= 1e-2


def test_the_reference_imports_no_numba() -> None:
    probe = ("import sys; from graphir.running.backend import get; get('reference').numerics(); "
             "import graphir.backends.reference.backend; assert 'numba' not in sys.modules, 'numba imported'")
    subprocess.run([sys.executable, "-c", probe], check=True)


def test_graphir_run_takes_the_reference_backend(tiny: TinyModels, capsys: pytest.CaptureFixture[str]) -> None:
    """``graphir run --backend reference`` generates with it: the text numba's run gives (greedy, tiny llama)."""
    texts = []
    for backend in ("numba", "reference"):
        assert main(["run", str(tiny.path("llama")), "-p", "hello", "-n", "4", "--temp", "0", "--backend", backend,
                     "-q"]) == 0
        out, err = capsys.readouterr()
        assert "generation: 4 tokens" in err
        texts.append(out)
    assert texts[0] == texts[1] and texts[0].strip()


def _greedy_logits(path: Path, backend: str) -> list[np.ndarray]:
    model = load(str(path), backend=backend)
    ctx = model.new_context(n_ctx=32)
    ids = model.tokenize("The capital of France is")
    ctx.decode(Batch.from_tokens(ids, 0))
    got = [ctx.logits_ith(-1).copy()]
    ctx.decode(Batch.one(int(np.argmax(got[0])), len(ids)))
    got.append(ctx.logits_ith(-1).copy())
    return got


def test_numba_is_close_to_the_reference_on_smollm2(smollm2_gguf: Path) -> None:
    for a, b in zip(_greedy_logits(smollm2_gguf, "numba"), _greedy_logits(smollm2_gguf, "reference")):
        cos = float(a.astype(np.float64) @ b / (np.linalg.norm(a) * np.linalg.norm(b)))
        assert float(np.abs(a - b).max()) <= APPROX.logit_abs and cos >= APPROX.logit_cos
        assert int(np.argmax(a)) == int(np.argmax(b))
