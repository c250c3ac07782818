"""Choosing the next token from logits: the sampler chain llama-cpp-python builds over llama.cpp's samplers.

Repetition penalty over the last ``repeat_last_n`` tokens (a positive logit divided by the penalty, a negative
one multiplied: both made less likely); then, at temperature 0, the most likely token; else top-k, top-p (the
smallest set of the most likely tokens holding that mass), min-p (tokens at least ``min_p`` times as likely as
the best), temperature, and a draw. Each filter keeps at least one token. The draw uses numpy's generator seeded
with ``seed``: a seed reproduces the same tokens here, not llama.cpp's (whose generator is another).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from graphir.errors import GraphirError


@dataclass(frozen=True)
class Sampling:
    """The chain's parameters; the defaults are llama-cpp-python's ``create_completion``'s."""

    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    seed: int | None = None

    def __post_init__(self) -> None:
        bad = [f"{name}={v!r} ({why})" for name, v, ok, why in (
            ("temperature", self.temperature, self.temperature >= 0, "0 is greedy"),
            ("top_k", self.top_k, self.top_k >= 0, "0 keeps every token"),
            ("top_p", self.top_p, 0 < self.top_p <= 1, "a probability mass in (0, 1]"),
            ("min_p", self.min_p, 0 <= self.min_p <= 1, "a ratio in [0, 1]"),
            ("repeat_penalty", self.repeat_penalty, self.repeat_penalty > 0, "1 is none"),
            ("repeat_last_n", self.repeat_last_n, self.repeat_last_n >= 0, "how many past tokens"),
        ) if not ok or (isinstance(v, float) and math.isnan(v))]
        if bad:
            raise GraphirError(f"bad sampling parameter: {'; '.join(bad)}")

    def sampler(self) -> Callable[[np.ndarray, Sequence[int]], int]:
        """A function (logits, tokens so far) -> next token, with a generator of its own (seeded)."""
        rng = np.random.default_rng(self.seed)
        return lambda logits, history: self.pick(logits, history, rng)

    def pick(self, logits: np.ndarray, history: Sequence[int], rng: np.random.Generator) -> int:
        z = np.asarray(logits, dtype=np.float32)
        recent = np.unique(np.asarray(history[len(history) - self.repeat_last_n:] if self.repeat_last_n else [],
                                      dtype=np.int64))
        if self.repeat_penalty != 1.0 and len(recent):
            z = z.copy()
            seen = z[recent]
            z[recent] = np.where(seen <= 0, seen * np.float32(self.repeat_penalty),
                                 seen / np.float32(self.repeat_penalty))
        if self.temperature == 0:
            return int(np.argmax(z))
        idx = np.argsort(-z, kind="stable")
        if self.top_k:
            idx = idx[:self.top_k]
        kept = z[idx].astype(np.float64)
        if self.top_p < 1:
            p = np.exp(kept - kept[0])
            mass = np.cumsum(p / p.sum())
            n = int(np.searchsorted(mass, self.top_p)) + 1  # the first prefix holding top_p
            idx, kept = idx[:n], kept[:n]
        if self.min_p > 0:
            n = max(1, int(np.count_nonzero(kept >= kept[0] + math.log(self.min_p))))
            idx, kept = idx[:n], kept[:n]
        p = np.exp((kept - kept[0]) / self.temperature)
        return int(rng.choice(idx, p=p / p.sum()))
