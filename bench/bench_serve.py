"""Benchmark: `graphir serve` against llama.cpp's `llama-server` on SmolLM2-135M Q4_1, in the same run.

Both serve the same file with the same context (-c 4096), 8 slots (-np 8) and 2 threads; llama-server is built
once from the llama.cpp llama-cpp-python vendors (tests/oracle_build.py, target llama-server, into the same cache
as the oracles). For 1, 4 and 8 concurrent clients, each client sends ROUNDS streamed completions of a
128-token prompt generating 64 tokens (ignore_eos, so both generate every token). Reported per server: the
aggregate generation rate (tokens / wall time of the whole load) and the mean time to first token; then the
ratio graphir / llama-server (>= 1 means graphir is faster).

Run: python bench/bench_serve.py [MODEL.gguf]
On a CPU with AMX the server is built for AVX-512 without AMX, as the oracles are (llama.cpp issue #20824).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import re
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Iterator

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))

from bench_run import model_path, prompt_tokens  # noqa: E402
from oracle_build import build  # noqa: E402

N_PROMPT, N_GEN, ROUNDS, CLIENTS, SLOTS, THREADS = 128, 64, 3, (1, 4, 8), 8, 2


@contextlib.contextmanager
def graphir_server(model: str) -> Iterator[str]:
    proc = subprocess.Popen([sys.executable, "-m", "graphir", "serve", model, "--port", "0", "-c", "4096",
                             "-np", str(SLOTS), "-t", str(THREADS), "-q"], stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    try:
        for line in proc.stderr:
            found = re.search(r"on (http://\S+) ", line)
            if found:
                threading.Thread(target=proc.stderr.read, daemon=True).start()
                yield found.group(1)
                return
        raise SystemExit(f"graphir serve did not start (exit {proc.wait()})")
    finally:
        proc.terminate()
        proc.wait()


@contextlib.contextmanager
def llama_server(model: str) -> Iterator[str]:
    from graphir.backends.numba.primitives.isa import host_path

    folder = build(host_path(), target="llama-server")
    port = 18000 + os.getpid() % 1000
    proc = subprocess.Popen([str(folder / "llama-server"), "-m", model, "--host", "127.0.0.1", "--port", str(port),
                             "-c", "4096", "-np", str(SLOTS), "-t", str(THREADS), "--no-webui"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, "LD_LIBRARY_PATH": str(folder)})
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            with contextlib.suppress(OSError, http.client.HTTPException):
                c = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
                c.request("GET", "/health")
                if c.getresponse().status == 200:
                    break
            time.sleep(0.1)
        else:
            raise SystemExit("llama-server did not start")
        yield url
    finally:
        proc.terminate()
        proc.wait()


def one_request(url: str, prompt: list[int]) -> tuple[float, int]:
    """A streamed completion: its time to first token and how many tokens it generated."""
    body = {"prompt": prompt, "max_tokens": N_GEN, "temperature": 0, "stream": True, "ignore_eos": True}
    host, port = url.removeprefix("http://").split(":")
    t0, first, n = time.perf_counter(), None, 0
    c = http.client.HTTPConnection(host, int(port), timeout=600)
    try:
        c.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
        r = c.getresponse()
        if r.status != 200:
            raise SystemExit(f"{url}: {r.status} {r.read()[:200]!r}")
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("choices") and chunk["choices"][0].get("text"):
                first = first if first is not None else time.perf_counter() - t0
                n += 1
    finally:
        c.close()
    return first or 0.0, n


def load(url: str, clients: int, prompts: list[list[int]]) -> tuple[float, float]:
    """Aggregate generated tokens per second and mean time to first token of `clients` concurrent clients."""
    def client(c: int) -> list[tuple[float, int]]:
        return [one_request(url, prompts[(c * ROUNDS + r) % len(prompts)]) for r in range(ROUNDS)]

    t0 = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        results = [x for per in pool.map(client, range(clients)) for x in per]
    wall = time.perf_counter() - t0
    return N_GEN * len(results) / wall, float(np.mean([ttft for ttft, _ in results]))


def main() -> None:
    from graphir.running.runtime import load as load_model

    model = model_path(sys.argv[1] if len(sys.argv) > 1 else None)
    n_vocab = load_model(model).hparams.n_vocab
    prompts = [prompt_tokens(n_vocab, N_PROMPT + i)[i:] for i in range(24)]  # distinct prompts, no shared prefix
    figures: dict[str, dict[int, tuple[float, float]]] = {}
    for name, server in (("graphir", graphir_server), ("llama-server", llama_server)):
        with server(model) as url:
            one_request(url, prompts[0])  # warm up
            figures[name] = {c: load(url, c, prompts) for c in CLIENTS}
    print(f"{Path(model).name}: {N_PROMPT}-token prompts, {N_GEN} tokens each, {ROUNDS} per client, "
          f"{SLOTS} slots, {THREADS} threads")
    print(f"{'clients':>8} {'graphir tok/s':>14} {'llama-server tok/s':>19} {'ratio':>6} "
          f"{'graphir TTFT':>13} {'llama-server TTFT':>18}")
    for c in CLIENTS:
        (g, gt), (lc, lt) = figures["graphir"][c], figures["llama-server"][c]
        print(f"{c:>8} {g:>14.1f} {lc:>19.1f} {g / lc:>5.2f}x {gt * 1000:>10.0f} ms {lt * 1000:>15.0f} ms")


if __name__ == "__main__":
    main()
