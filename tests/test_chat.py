"""Chat and completions with llama-cpp-python's names and result shapes, and the sampler chain they share.

Sampling is specified on hand-made logits (exact outcomes); the chat template on SmolLM2-135M-Instruct's own,
rendered as llama-cpp-python renders it; the conversation on the real model, against llama.cpp's
``create_chat_completion`` (the same reply at temperature 0 where graphir reproduces this host's llama.cpp
path bit for bit), through the API and through ``graphir chat``.
"""

from __future__ import annotations

import io
import math
import os
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import make_tiny_preset, oracle_is_exact, write_model_gguf

from graphir.cli import main
from graphir.errors import GraphirError
from graphir.running.chat import ChatTemplate
from graphir.running.runtime import Model, load
from graphir.running.sampling import Sampling

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


def draws(s: Sampling, logits: list[float], history: list[int] = (), n: int = 400) -> set[int]:  # type: ignore[assignment]
    pick = s.sampler()
    z = np.log(np.array(logits, np.float32)) if min(logits) > 0 else np.array(logits, np.float32)
    return {pick(z, list(history)) for _ in range(n)}


# ---- the sampler chain --------------------------------------------------------------------------------------

def test_the_repeat_penalty_divides_a_positive_logit_and_multiplies_a_negative_one() -> None:
    s = Sampling(temperature=0, repeat_penalty=2.0)
    assert s.sampler()(np.array([3.0, -1.0, 2.5], np.float32), [0]) == 2  # 3 / 2 = 1.5 < 2.5
    assert s.sampler()(np.array([-1.0, -1.5, -3.5], np.float32), [0]) == 1  # -1 * 2 = -2 < -1.5
    assert Sampling(temperature=0, repeat_penalty=2.0, repeat_last_n=1).sampler()(
        np.array([3.0, -1.0, 2.5], np.float32), [0, 1]) == 0  # only the last token is penalised


@pytest.mark.parametrize("kw,kept", [
    ({"top_k": 1}, {0}), ({"top_k": 2}, {0, 1}),
    ({"top_p": 0.5}, {0}), ({"top_p": 0.6}, {0, 1}), ({"top_p": 1.0}, {0, 1, 2}),
    ({"min_p": 0.5}, {0, 1}), ({"min_p": 0.3}, {0, 1, 2}), ({"min_p": 1.0}, {0}),
])
def test_each_filter_keeps_exactly_its_tokens(kw: dict[str, Any], kept: set[int]) -> None:
    """Probabilities 0.5, 0.3, 0.2: top-p keeps the first prefix holding the mass, min-p the tokens at least that
    fraction as likely as the best (0.3 >= 0.25 at 0.5; 0.2 >= 0.15 at 0.3)."""
    base = {"top_k": 0, "top_p": 1.0, "min_p": 0.0, "temperature": 1.0, "seed": 7}
    assert draws(Sampling(**{**base, **kw}), [0.5, 0.3, 0.2]) == kept


def test_temperature_sharpens_the_draw_and_a_seed_repeats_it() -> None:
    base = {"top_k": 0, "top_p": 1.0, "min_p": 0.0}
    pick = Sampling(temperature=0.01, seed=1, **base).sampler()  # 0.35 / 0.4 becomes 0.875 ** 100 = 1.6e-6
    assert {pick(np.log(np.array([0.4, 0.35, 0.25], np.float32)), []) for _ in range(200)} == {0}
    a, b = (Sampling(temperature=1.0, seed=3, **base).sampler() for _ in range(2))
    z = np.zeros(50, np.float32)
    assert [a(z, []) for _ in range(20)] == [b(z, []) for _ in range(20)]


@pytest.mark.parametrize("kw,message", [
    ({"temperature": -1}, "temperature=-1 (0 is greedy)"), ({"top_p": 0}, "top_p=0 (a probability mass in (0, 1])"),
    ({"min_p": 1.5}, "min_p=1.5 (a ratio in [0, 1])"), ({"repeat_penalty": 0}, "repeat_penalty=0 (1 is none)"),
    ({"top_k": -2}, "top_k=-2 (0 keeps every token)"), ({"temperature": math.nan}, "temperature=nan"),
])
def test_a_bad_parameter_is_refused_naming_it(kw: dict[str, Any], message: str) -> None:
    with pytest.raises(GraphirError, match=f"^bad sampling parameter: {re.escape(message)}"):
        Sampling(**kw)


# ---- templates ----------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def model(smollm2_gguf: Path) -> Model:
    return load(str(smollm2_gguf))


@pytest.mark.oracle
@pytest.mark.parametrize("messages", [
    QUESTION,
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
     {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Où est Paris ?"}],
])
def test_the_template_renders_as_llama_cpp_python_renders_it(model: Model, messages: list[dict[str, str]]) -> None:
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    source = model.meta.metadata["tokenizer.chat_template"]
    ref = Jinja2ChatFormatter(source, eos_token="<|im_end|>", bos_token="<|im_start|>")(messages=messages).prompt
    assert model.chat_template().render(messages) == ref
    assert ref.endswith("<|im_start|>assistant\n") and ("You are a helpful AI assistant" in ref) == (len(messages) == 1)


def test_a_template_can_raise_and_a_message_must_have_a_role() -> None:
    t = ChatTemplate("{% if messages[0]['role'] != 'user' %}{{ raise_exception('user first') }}{% endif %}ok",
                     label="test template")
    assert t.render(QUESTION) == "ok"
    with pytest.raises(GraphirError, match="^test template: user first$"):
        t.render([{"role": "assistant", "content": "x"}])
    with pytest.raises(GraphirError, match="^message 0 must be a mapping with 'role' and 'content'"):
        t.render([{"content": "x"}])
    with pytest.raises(GraphirError, match="^the t: not a jinja2 template"):
        ChatTemplate("{% for %}", label="the t")


def test_a_model_without_a_template_needs_one_given(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_model_gguf(tmp_path / "tiny.gguf", make_tiny_preset("llama"))
    m = load(str(path))
    with pytest.raises(GraphirError, match=r"has no chat template \(tokenizer.chat_template\): give one"):
        m.chat(QUESTION)
    given = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    assert len(list(m.chat(QUESTION, max_tokens=3, chat_template=given, temperature=0))) <= 3
    monkeypatch.setattr("sys.stdin", io.StringIO("hello\n"))
    assert main(["chat", str(path)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and "has no chat template" in err


# ---- the real model -----------------------------------------------------------------------------------------

@pytest.mark.oracle
def test_a_greedy_chat_is_llama_cpps_reply_in_llama_cpp_pythons_shape(model: Model, smollm2_gguf: Path) -> None:
    os.environ.setdefault("GGML_NO_BACKTRACE", "1")
    import llama_cpp

    llm = llama_cpp.Llama(model_path=str(smollm2_gguf), n_ctx=512, n_threads=2, verbose=False)
    ref = llm.create_chat_completion(QUESTION, temperature=0, max_tokens=24)
    got = model.create_chat_completion(QUESTION, temperature=0, max_tokens=24)
    assert isinstance(got, dict)
    assert (set(got), set(got["choices"][0]), set(got["choices"][0]["message"])) == \
        (set(ref), set(ref["choices"][0]), set(ref["choices"][0]["message"]))
    assert got["object"] == "chat.completion" and got["usage"] == ref["usage"]
    assert got["choices"][0]["finish_reason"] == ref["choices"][0]["finish_reason"] == "length"
    if oracle_is_exact():  # the same logits bit for bit, so the same greedy reply
        assert got["choices"][0]["message"]["content"] == ref["choices"][0]["message"]["content"]
    done = model.create_completion("The capital of France is", max_tokens=8, temperature=0)
    ref_done = llm.create_completion("The capital of France is", max_tokens=8, temperature=0)
    assert isinstance(done, dict) and (set(done), set(done["choices"][0])) == (set(ref_done), set(ref_done["choices"][0]))
    assert done["object"] == "text_completion" and done["usage"] == ref_done["usage"]


def test_streamed_chunks_add_up_to_the_whole_reply(model: Model) -> None:
    whole = model.create_chat_completion(QUESTION, max_tokens=12, seed=5)
    chunks = list(model.create_chat_completion(QUESTION, max_tokens=12, seed=5, stream=True))
    assert isinstance(whole, dict)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant"}
    assert chunks[-1]["choices"][0] == {"index": 0, "delta": {}, "logprobs": None,
                                        "finish_reason": whole["choices"][0]["finish_reason"]}
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == \
        whole["choices"][0]["message"]["content"]


def test_the_same_seed_gives_the_same_text_and_others_differ(model: Model) -> None:
    kw = dict(max_tokens=16, temperature=1.0)
    texts = {seed: "".join(model.chat(QUESTION, seed=seed, **kw)) for seed in (1, 2, 3)}
    assert "".join(model.chat(QUESTION, seed=1, **kw)) == texts[1]
    assert len(set(texts.values())) > 1, texts


def test_graphir_chat_answers_each_line_within_the_conversation(model: Model, smollm2_gguf: Path,
                                                                capsys: pytest.CaptureFixture[str],
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO("What is the capital of France?\n\nAnd of Italy?\n"))
    assert main(["chat", str(smollm2_gguf), "--temp", "0", "-n", "12", "-sys", "Answer in one word."]) == 0
    out = capsys.readouterr().out
    conversation = [{"role": "system", "content": "Answer in one word."}, *QUESTION]
    first = "".join(model.chat(conversation, max_tokens=12, temperature=0))
    conversation += [{"role": "assistant", "content": first}, {"role": "user", "content": "And of Italy?"}]
    second = "".join(model.chat(conversation, max_tokens=12, temperature=0))
    assert out == f"{first}\n\n{second}\n\n"
