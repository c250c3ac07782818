"""The real Gemma-3-270M (Q4_K_M) against llama.cpp: tokens, tensors, graph, and the numbers past its window.

Its matrices are Q5_0, Q4_K (rows in eights: the layout llama.cpp repacks for its x86 kernels), Q6_K (the tied LM
head) and Q8_0, each of which graphir multiplies in llama.cpp's order on both x86 paths (README, Numerics): with
both engines fed llama.cpp's greedy tokens, every step's logits are llama.cpp's bit for bit (where graphir runs the
oracle's own path; elsewhere within isa.APPROX), and so is every greedy token. An 832-token prompt decoded in
ubatches of 256 passes through a 768-cell sliding-window cache, so cells really are recycled while the
512-position window slides.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import assert_llama_logits

from graphir.cli import main
from graphir.files.gguf_file import strip
from graphir.graph.forms import to_text
from graphir.model.meta import open_model
from graphir.batch import Batch
from graphir.running.runtime import Model, load

oracle = pytest.mark.oracle

PROMPTS = [
    "The capital of France is",
    "Once upon a time, in a small village by the sea,",
    "def fibonacci(n):\n",
    "<start_of_turn>user\nWhat is 12 * 7?<end_of_turn>\n<start_of_turn>model\n",
    " ".join(f"The quick brown fox jumps over the lazy dog number {i}." for i in range(60)) + " The",
]
N_GEN, N_CTX, N_UBATCH = 24, 1024, 256


@pytest.fixture(scope="module")
def model(gemma3_gguf: Path) -> Model:
    return load(str(gemma3_gguf))


@pytest.fixture(scope="module")
def llm(gemma3_gguf: Path) -> Any:
    os.environ.setdefault("GGML_NO_BACKTRACE", "1")
    import llama_cpp

    # its sliding layers' cache as graphir's (window + a ubatch, cells reused): llama.cpp's default keeps every
    # position there (swa_full), which sums attention over the cells in another order once the window slides
    return llama_cpp.Llama(model_path=str(gemma3_gguf), n_ctx=N_CTX, n_batch=N_CTX, n_ubatch=N_UBATCH, n_threads=2,
                           logits_all=True, verbose=False, swa_full=False)


def test_the_file_has_the_tensors_and_the_graph_of_the_preset(gemma3_gguf: Path, tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    meta = open_model(str(gemma3_gguf))
    assert meta.arch.check(meta.tensors) == []
    assert meta.arch.contexts[0] == "iswa" and meta.arch.hp.n_swa == 512
    header = strip(gemma3_gguf, tmp_path / "gemma.header.gguf")
    for context, phase in (("iswa", "prefill"), ("iswa", "decode"), ("none", "prefill")):
        want = to_text(open_model("Gemma-3-270M").build_graph(context, phase), fold=False)
        assert to_text(open_model(str(header.path)).build_graph(context, phase), fold=False) == want
    assert main(["check", str(gemma3_gguf)]) == 0 and main(["diff", str(header.path), "Gemma-3-270M"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "ok: 236 tensors match gemma3" and out[-1].startswith("graphs are identical (hash ")


@oracle
@pytest.mark.parametrize("text", ["Hello world", "Héllo wörld! 你好，世界。 🤖\n\n  spaces   and\ttabs", "   leading",
                                  "trailing   ", "", *PROMPTS[:4]])
def test_tokens_are_llama_cpps(model: Model, llm: Any, text: str) -> None:
    for special in (False, True):
        assert model.tokenize(text, parse_special=special) == llm.tokenize(text.encode(), add_bos=True, special=special)


@oracle
@pytest.mark.parametrize("prompt", PROMPTS, ids=["france", "story", "code", "chat", "past-the-window"])
def test_greedy_steps_are_llama_cpps(model: Model, llm: Any, prompt: str) -> None:
    ids = model.tokenize(prompt, parse_special=True)
    llm.reset()
    llm.eval(ids)
    ref = []
    for _ in range(N_GEN):
        ref.append(int(np.argmax(llm.scores[llm.n_tokens - 1])))
        llm.eval([ref[-1]])
    want = np.array(llm.scores[len(ids) - 1:len(ids) + N_GEN - 1])
    ctx = model.new_context(n_ctx=N_CTX, n_batch=N_CTX, n_ubatch=N_UBATCH)
    ctx.decode(Batch.from_tokens(ids, 0))
    got = [ctx.logits_ith(-1).copy()]
    swa = ctx.memory.parts["swa"]
    for i, tok in enumerate(ref[:-1]):  # teacher-forced: both engines see llama.cpp's tokens
        ctx.decode(Batch.one(tok, len(ids) + i))
        got.append(ctx.logits_ith(-1).copy())
        assert (swa.pos >= 0).sum() <= swa.n_ctx == 768  # 512-position window + a ubatch, padded
    ours = np.array(got)
    assert_llama_logits(ours, want, "greedy steps' logits")
    assert ours.argmax(1).tolist() == want.argmax(1).tolist()
    if len(ids) > 512:
        assert swa.seq_pos_min(0) > 0  # the window slid: the oldest positions' cells were reused
