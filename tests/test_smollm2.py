"""The real SmolLM2-135M-Instruct Q4_1 model against llama.cpp, from text to text: same tokens, same greedy
32-token continuations, same logits (llama.cpp's arithmetic is reproduced bit for bit; test_llama_exact.py
checks every intermediate). On a host whose llama.cpp path graphir does not emulate, the continuations may
part ways: each step is then compared with isa.APPROX, both engines fed llama.cpp's tokens."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import assert_llama_logits, oracle_is_exact

from graphir.batch import Batch
from graphir.running.runtime import Model, load

pytestmark = pytest.mark.oracle

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n",
    "<|im_start|>user\nWhat is 12 * 7?<|im_end|>\n<|im_start|>assistant\n",
    "Once upon a time, in a small village by the sea,",
    "Les étoiles brillent la nuit, et",
]
N_GEN = 32


@pytest.fixture(scope="module")
def model(smollm2_gguf: Path) -> Model:
    return load(str(smollm2_gguf))


@pytest.fixture(scope="module")
def llm(smollm2_gguf: Path) -> Any:
    os.environ.setdefault("GGML_NO_BACKTRACE", "1")
    import llama_cpp

    return llama_cpp.Llama(model_path=str(smollm2_gguf), n_ctx=256, n_batch=256, n_threads=2, logits_all=True,
                           verbose=False)


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_continuations_and_logits_are_llama_cpps(model: Model, llm: Any, prompt: str) -> None:
    ids = model.tokenize(prompt, parse_special=True)
    assert ids == llm.tokenize(prompt.encode(), add_bos=True, special=True)
    llm.reset()
    llm.eval(ids)
    ref_logits = np.array(llm.scores[: len(ids)])
    ref = []
    for _ in range(N_GEN):
        ref.append(int(np.argmax(llm.scores[llm.n_tokens - 1])))
        llm.eval([ref[-1]])
    ctx = model.new_context(n_ctx=256)
    ctx.decode(Batch.from_tokens(ids, 0, outputs="all"))
    assert_llama_logits(ctx.logits(), ref_logits, "prompt")  # metric: max |delta logit| over the prompt = 0
    if not oracle_is_exact():
        for i, tok in enumerate(ref):
            ctx.decode(Batch.one(tok, len(ids) + i))
            assert_llama_logits(ctx.logits_ith(-1), np.array(llm.scores[len(ids) + i]), f"step {i}")
        return
    ours = []
    for i in range(N_GEN):
        ours.append(int(np.argmax(ctx.logits_ith(-1))))
        ctx.decode(Batch.one(ours[-1], len(ids) + i))
    assert model.detokenize(ours) == model.detokenize(ref)
    assert ours == ref


def test_generate_streams_the_greedy_text(model: Model, llm: Any) -> None:
    text = "".join(model.generate(PROMPTS[0], max_tokens=20))
    out = llm.create_completion(PROMPTS[0], max_tokens=20, temperature=0.0, top_k=1, repeat_penalty=1.0)
    assert text == out["choices"][0]["text"]
