"""The reference backend (graphir.backends.reference): every op of the catalogue in numpy, and the numba backend
held to it model by model: on every family's tiny model (a scenario of the conformance table,
tests/test_conformance.py) and on SmolLM2 here.

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
from conftest import make_tiny_preset, write_model_gguf

from graphir.backends.numba.primitives.isa import APPROX
from graphir.backends.reference.ops import REFERENCES
from graphir.cli import main
from graphir.graph.ops import COMPUTING
from graphir.batch import Batch
from graphir.running.runtime import load

F32_CACHES = {"type_k": "f32", "type_v": "f32"}


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_model_gguf(tmp_path_factory.mktemp("reference") / "llama.gguf", make_tiny_preset("llama"))


def logits(path: Path, backend: str, **caches: str) -> list[np.ndarray]:
    """A tiny llama's logits of a prompt (every position), then of two steps, on one backend."""
    ctx = load(str(path), backend=backend).new_context(n_ctx=64, **caches)
    ctx.decode(Batch.from_tokens([3, 17, 4, 99, 5, 42, 6], 0, outputs="all"))
    got = [ctx.logits().copy()]
    for p, tok in enumerate((7, 8), 7):
        ctx.decode(Batch.one(tok, p))
        got.append(ctx.logits().copy())
    return got


def test_every_computing_op_has_exactly_one_reference() -> None:
    """An op added to the catalogue without its numpy definition fails here (REFERENCES is a dict: one each)."""
    assert set(REFERENCES) == COMPUTING


def test_with_f16_caches_the_backends_round_the_same_values(llama: Path) -> None:
    for a, b in zip(logits(llama, "numba"), logits(llama, "reference")):
        assert float(np.abs(a - b).max()) <= 1e-2


def test_the_reference_imports_no_numba() -> None:
    probe = ("import sys; from graphir.running.backend import get; get('reference').numerics(); "
             "import graphir.backends.reference.backend; assert 'numba' not in sys.modules, 'numba imported'")
    subprocess.run([sys.executable, "-c", probe], check=True)


def test_graphir_run_takes_the_reference_backend(llama: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``graphir run --backend reference`` generates with it: the text numba's run gives (greedy, tiny llama)."""
    texts = []
    for backend in ("numba", "reference"):
        assert main(["run", str(llama), "-p", "hello", "-n", "4", "--temp", "0", "--backend", backend,
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
