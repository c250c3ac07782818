"""graphir serve, a real server on a free loopback port, spoken to with the official openai client and raw HTTP:
concurrent requests get the text each gets alone, streams and cancellations behave as OpenAI's, bad requests
get 4xx with OpenAI's error body and change nothing, and the server goes on serving."""

from __future__ import annotations

import contextlib
import http.client
import json
import random
import re
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest

openai = pytest.importorskip("openai", reason="the server is tested through the openai client (the test extra has it)")

from graphir.running.runtime import load  # noqa: E402

PROMPTS = ["The capital of France is", "Once upon a time, in a land far away, there lived a king who",
           "def fibonacci(n):", "List three colors:", "Water boils at",
           "The quick brown fox jumps over the lazy dog. " * 12, "In 1492, Columbus", "1, 2, 3, 4,"]
QUESTIONS = ["What is the capital of France?", "Tell me a story about a brave knight.", "What is 2 + 2?",
             "Name a fruit.", "Why is the sky blue?", "Write a haiku about the sea. " * 6, "Who wrote Hamlet?",
             "Say hello."]
N = 24  # tokens each reply may have


@contextlib.contextmanager
def serving(model: Path, *options: str) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """`graphir serve MODEL --port 0 OPTIONS` until the block ends; the base URL it announced and the process."""
    proc = subprocess.Popen([sys.executable, "-m", "graphir", "serve", str(model), "--port", "0", "-q", *options],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    drain = threading.Thread(target=proc.stderr.read, daemon=True)  # keeps its pipe from filling
    try:
        url = None
        for line in proc.stderr:
            found = re.search(r"on (http://\S+) ", line)
            if found:
                url = found.group(1)
                break
        assert url, f"the server did not start (exit {proc.wait()})"
        drain.start()
        yield url, proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if drain.is_alive():
            drain.join(10)
        proc.stderr.close()


@pytest.fixture(scope="module")
def smol(smollm2_gguf: Path) -> Path:
    return smollm2_gguf


@pytest.fixture(scope="module")
def server(smol: Path) -> Iterator[str]:
    with serving(smol, "-np", "8", "-c", "4096", "-t", "2") as (url, _):
        yield url


@pytest.fixture(scope="module")
def client(server: str) -> Any:
    return openai.OpenAI(base_url=server + "/v1", api_key="none", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def alone(smol: Path) -> Any:
    return load(str(smol))


def post(url: str, path: str, body: bytes | str, timeout: float = 120) -> tuple[int, Any]:
    host, port = url.removeprefix("http://").split(":")
    c = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        c.request("POST", path, body, {"Content-Type": "application/json"})
        r = c.getresponse()
        return r.status, json.loads(r.read() or b"null")
    finally:
        c.close()


def get(url: str, path: str) -> tuple[int, str]:
    host, port = url.removeprefix("http://").split(":")
    c = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        c.request("GET", path)
        r = c.getresponse()
        return r.status, r.read().decode()
    finally:
        c.close()


def metric(url: str, name: str) -> float:
    text = get(url, "/metrics")[1]
    return float(re.search(rf"^graphir_{name} (\S+)$", text, re.M).group(1))  # type: ignore[union-attr]


def settled(url: str) -> None:
    """Wait until no request holds a slot or waits for one."""
    for _ in range(200):
        if metric(url, "requests_processing") == 0 and metric(url, "requests_waiting") == 0:
            return
        time.sleep(0.05)
    raise AssertionError("requests still running")


# ---- the same text as alone -----------------------------------------------------------------------------

def test_eight_concurrent_completions_get_the_text_graphir_gives_each_alone(client: Any, alone: Any,
                                                                            smol: Path) -> None:
    def complete(prompt: str) -> str:
        r = client.completions.create(model="m", prompt=prompt, max_tokens=N, temperature=0)
        return r.choices[0].text

    with ThreadPoolExecutor(8) as pool:
        together = list(pool.map(complete, PROMPTS))
    for prompt, text in zip(PROMPTS, together):
        assert text == "".join(alone.generate(prompt, max_tokens=N, temperature=0)), prompt
    run = subprocess.run([sys.executable, "-m", "graphir", "run", str(smol), "-p", PROMPTS[1], "-n", str(N),
                          "--temp", "0", "--no-display-prompt", "-q"], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and run.stdout == together[1] + "\n"


def test_eight_concurrent_chats_get_the_reply_each_gets_alone(client: Any, alone: Any) -> None:
    def chat(q: str) -> tuple[str, str]:
        r = client.chat.completions.create(model="m", messages=[{"role": "user", "content": q}], max_tokens=N,
                                           temperature=0)
        return r.choices[0].message.content, r.choices[0].finish_reason

    with ThreadPoolExecutor(8) as pool:
        together = list(pool.map(chat, QUESTIONS))
    for q, (text, finish) in zip(QUESTIONS, together):
        stats: dict[str, Any] = {}
        assert text == "".join(alone.chat([{"role": "user", "content": q}], max_tokens=N, temperature=0,
                                          stats=stats)), q
        assert finish == stats["finish_reason"]


def test_a_shared_prefix_is_copied_not_decoded_and_changes_no_bit(client: Any, server: str, alone: Any) -> None:
    """A second request whose prompt starts as a running one's takes those cells from it (seq_cp)."""
    long = "Here is a long preamble that both requests share. " * 20
    before = metric(server, "prompt_tokens_cached_total")
    stream = client.completions.create(model="m", prompt=long + "First:", max_tokens=60, temperature=0,
                                       stream=True)
    first = next(iter(stream))  # the first request is running: its prompt is in its sequence
    second = client.completions.create(model="m", prompt=long + "Second:", max_tokens=N, temperature=0)
    rest = "".join(c.choices[0].text for c in stream)
    assert metric(server, "prompt_tokens_cached_total") - before >= len(alone.tokenize(long)) - 1
    assert second.usage.prompt_tokens_details.cached_tokens > 0
    assert second.choices[0].text == "".join(alone.generate(long + "Second:", max_tokens=N, temperature=0))
    assert first.choices[0].text + rest == "".join(alone.generate(long + "First:", max_tokens=60, temperature=0))


# ---- streams and their end -------------------------------------------------------------------------------

def test_a_stream_is_the_reply_in_pieces_then_its_finish_and_usage(client: Any) -> None:
    kwargs: dict[str, Any] = dict(model="m", messages=[{"role": "user", "content": QUESTIONS[0]}], max_tokens=N,
                                  temperature=0)
    whole = client.chat.completions.create(**kwargs)
    chunks = list(client.chat.completions.create(**kwargs, stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == whole.choices[0].finish_reason
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_stop_strings_end_the_text_before_them(client: Any, alone: Any) -> None:
    full = "".join(alone.generate(PROMPTS[7], max_tokens=N, temperature=0))
    stop = full[6:9]
    r = client.completions.create(model="m", prompt=PROMPTS[7], max_tokens=N, temperature=0, stop=[stop])
    assert r.choices[0].text == full[:full.index(stop)] and r.choices[0].finish_reason == "stop"


def test_logprobs_are_the_log_softmax_of_llama_cpps_logits(client: Any, alone: Any) -> None:
    r = client.completions.create(model="m", prompt=PROMPTS[0], max_tokens=3, temperature=0, logprobs=2)
    lp = r.choices[0].logprobs
    ids = alone.tokenize(PROMPTS[0])
    ctx = alone.new_context(n_ctx=256)
    from graphir.batch import Batch

    ctx.decode(Batch.from_tokens(ids, 0))
    z = ctx.logits_ith(-1).astype(np.float64)
    want = z - (z.max() + np.log(np.exp(z - z.max()).sum()))
    best = int(np.argmax(z))
    assert lp.tokens[0] == alone.vocab.token_to_piece(best).decode()
    assert lp.token_logprobs[0] == pytest.approx(want[best], abs=1e-9)
    assert list(lp.top_logprobs[0].values()) == pytest.approx(sorted(want, reverse=True)[:2], abs=1e-9)


def test_a_cancelled_stream_frees_its_cells_and_leaves_the_others_alone(client: Any, server: str,
                                                                        alone: Any) -> None:
    other: list[str] = []
    worker = threading.Thread(target=lambda: other.append(client.completions.create(
        model="m", prompt=PROMPTS[1], max_tokens=N, temperature=0).choices[0].text))
    stream = client.completions.create(model="m", prompt=PROMPTS[0], max_tokens=2000, temperature=0, stream=True)
    worker.start()
    pieces = iter(stream)
    next(pieces), next(pieces)
    stream.close()  # the client goes away mid-reply
    worker.join()
    assert other == ["".join(alone.generate(PROMPTS[1], max_tokens=N, temperature=0))]
    settled(server)
    assert metric(server, "kv_cells_used") == 0


def test_a_client_that_hangs_up_frees_its_sequence(server: str) -> None:
    host, port = server.removeprefix("http://").split(":")
    c = http.client.HTTPConnection(host, int(port), timeout=30)
    c.request("POST", "/v1/completions", json.dumps({"prompt": PROMPTS[2], "max_tokens": 3000}),
              {"Content-Type": "application/json"})
    time.sleep(0.5)
    c.close()  # before the reply: not a stream, so the server notices on its own
    settled(server)
    assert metric(server, "kv_cells_used") == 0


# ---- bad requests ----------------------------------------------------------------------------------------

BAD = [
    ("/v1/completions", b"{not json", 400, "the body is not JSON"),
    ("/v1/completions", b"[1, 2]", 400, "must be a JSON object"),
    ("/v1/completions", json.dumps({"max_tokens": 4}), 400, "'prompt' is required"),
    ("/v1/completions", json.dumps({"prompt": "x", "max_tokens": -3}), 400, "'max_tokens' must be an integer >= 1"),
    ("/v1/completions", json.dumps({"prompt": "x", "max_tokens": 10**12}), 400, "max_tokens=1000000000000 is more than the 8192"),
    ("/v1/completions", json.dumps({"prompt": "x", "temperature": "hot"}), 400, "'temperature' must be a number"),
    ("/v1/completions", json.dumps({"prompt": "x", "colour": 3}), 400, "unknown field 'colour'"),
    ("/v1/completions", json.dumps({"prompt": "x", "n": 2}), 400, "n=2 is not supported"),
    ("/v1/completions", json.dumps({"prompt": [99999999]}), 400, "token id 99999999 is not in the vocabulary"),
    ("/v1/completions", json.dumps({"prompt": "word " * 600}), 400, "a request's context holds 512"),
    ("/v1/chat/completions", json.dumps({"messages": []}), 400, "'messages' must hold at least one message"),
    ("/v1/chat/completions", json.dumps({"messages": [{"role": "robot", "content": "hi"}]}), 400,
     "messages[0]: role 'robot'"),
    ("/v1/chat/completions", json.dumps({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}), 400,
     "only text parts are supported"),
    ("/v1/embeddings", json.dumps({"input": "hello"}), 400, "generates text: /v1/embeddings needs an embedding model"),
    ("/v1/nothing", b"{}", 404, "no endpoint POST /v1/nothing"),
]


@pytest.mark.parametrize("path,body,status,message", BAD, ids=[m for *_, m in BAD])
def test_a_bad_request_is_a_4xx_with_openais_error_body(server: str, path: str, body: bytes | str, status: int,
                                                        message: str) -> None:
    got, doc = post(server, path, body)
    assert got == status
    assert doc["error"]["message"].startswith(message) or message in doc["error"]["message"], doc
    assert doc["error"]["type"] == "invalid_request_error"


def test_the_openai_client_raises_on_a_bad_request_and_the_server_goes_on(client: Any, alone: Any) -> None:
    with pytest.raises(openai.BadRequestError, match="max_tokens"):
        client.completions.create(model="m", prompt="x", max_tokens=-1)
    r = client.completions.create(model="m", prompt=PROMPTS[0], max_tokens=N, temperature=0)
    assert r.choices[0].text == "".join(alone.generate(PROMPTS[0], max_tokens=N, temperature=0))


def _mutate(rng: random.Random, body: dict[str, Any]) -> bytes:
    """A request body a few random edits away from a good one."""
    junk = [None, -1, 0, 2**70, 1e308, float("nan"), "", "x" * 50, [], {}, [1, "a"], True, {"a": [None]}, -0.5]
    doc = json.loads(json.dumps(body))
    for _ in range(rng.randint(1, 3)):
        what = rng.random()
        keys = [k for k in doc if k != "max_tokens"]  # a valid request stays one token long
        if what < 0.3 and keys:
            doc[rng.choice(keys)] = rng.choice(junk)
        elif what < 0.45 and keys:
            del doc[rng.choice(keys)]
        elif what < 0.6:
            doc[rng.choice(["stop", "seed", "top_k", "logprobs", "echo", "stream_options", "zzz", "n"])] = \
                rng.choice(junk)
        elif what < 0.8 and "messages" in doc:
            doc["messages"] = rng.choice([[{"role": "user"}], [{"content": "x"}], [{"role": "user", "content": 5}],
                                          [None], "hello", [{"role": "user", "content": [{"type": "text"}]}]])
        else:
            raw = json.dumps(doc).encode()
            i = rng.randrange(len(raw))
            return raw[:i] + bytes([rng.randrange(256)]) + raw[i + 1:]
    return json.dumps(doc, allow_nan=True).encode()


def test_thousands_of_mutated_requests_get_4xx_or_an_answer_and_the_server_goes_on(server: str, client: Any,
                                                                                   alone: Any) -> None:
    rng = random.Random(7)
    bases = [("/v1/completions", {"prompt": "Hi", "max_tokens": 1, "temperature": 0}),
             ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}),
             ("/v1/embeddings", {"input": "Hi"})]
    seen: dict[int, int] = {}
    for i in range(2000):
        path, body = bases[i % len(bases)]
        status, doc = post(server, path, _mutate(rng, body))
        seen[status] = seen.get(status, 0) + 1
        assert status == 200 or (400 <= status < 500 and doc["error"]["message"]), (status, doc)
    assert seen.get(400, 0) > 1000 and seen.get(200, 0) > 10, seen
    settled(server)
    assert metric(server, "kv_cells_used") == 0
    r = client.completions.create(model="m", prompt=PROMPTS[0], max_tokens=N, temperature=0)
    assert r.choices[0].text == "".join(alone.generate(PROMPTS[0], max_tokens=N, temperature=0))


# ---- the queue, the other endpoints, the process -----------------------------------------------------------

def test_requests_beyond_the_queue_get_503(smol: Path) -> None:
    with serving(smol, "-np", "1", "--queue-size", "1", "-c", "1024") as (url, _):
        c = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=120)
        running = c.completions.create(model="m", prompt=PROMPTS[0], max_tokens=900, temperature=0, stream=True)
        next(iter(running))  # it holds the only slot
        waiting = threading.Thread(target=lambda: c.completions.create(model="m", prompt="x", max_tokens=1))
        waiting.start()
        for _ in range(100):
            if metric(url, "requests_waiting") == 1:
                break
            time.sleep(0.05)
        status, doc = post(url, "/v1/completions", json.dumps({"prompt": "y", "max_tokens": 1}))
        assert status == 503 and doc["error"]["message"].startswith("the server is busy: 1 requests are waiting")
        running.close()
        waiting.join()
        settled(url)


def test_embeddings_are_the_models_pooled_vectors_at_unit_length(minilm_dir: Path, tmp_path: Path) -> None:
    gguf_path = tmp_path / "minilm.gguf"
    assert subprocess.run([sys.executable, "-m", "graphir", "convert", str(minilm_dir), "-o", str(gguf_path), "-q"],
                          capture_output=True).returncode == 0
    texts = ["A cat sits on the mat.", "Stock markets fell today."]
    with serving(gguf_path, "-np", "2", "-c", "512") as (url, _):
        c = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=120)
        got = c.embeddings.create(model="m", input=texts)
        status, doc = post(url, "/v1/chat/completions", json.dumps({"messages": [{"role": "user", "content": "x"}]}))
    assert status == 400 and "is an embedding model" in doc["error"]["message"]
    model = load(str(gguf_path))  # what graphir embed computes: each text a sequence of its own, pooled
    from graphir.batch import Batch

    ctx = model.new_context(embeddings=True)
    for d, text in zip(got.data, texts):
        ids = model.tokenize(text)
        ctx.decode(Batch.from_tokens(ids, 0, outputs="all"))
        v = ctx.embeddings_seq(0).astype(np.float64)
        assert np.array_equal(np.float32(d.embedding), np.float32(v / np.linalg.norm(v))), text
    assert got.usage.prompt_tokens > 0


def test_models_health_and_metrics(server: str, client: Any) -> None:
    assert [m.id for m in client.models.list().data] == ["SmolLM2-135M-Instruct.Q4_1"]
    assert get(server, "/health") == (200, '{"status":"ok"}')
    status, text = get(server, "/metrics")
    assert status == 200
    for name in ("requests_total", "prompt_tokens_total", "generated_tokens_total", "requests_processing",
                 "requests_waiting", "kv_cells_used", "kv_cells"):
        assert re.search(rf"^# TYPE graphir_{name} (counter|gauge)$", text, re.M), name
    assert metric(server, "kv_cells") == 4096 and metric(server, "slots") == 8


def test_ctrl_c_stops_the_server_cleanly(smol: Path) -> None:
    with serving(smol, "-np", "2", "-c", "512") as (url, proc):
        assert get(url, "/health")[0] == 200
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 0
