"""Attention temperature tuning: the queries of layers that attend without positions are scaled by a factor that
grows with the log of the position's chunk (Llama 4), so that attention stays sharp over long contexts. llama.cpp
feeds the factor of each token as an input (``inp_attn_scale``); the graph states the rule that fills it, one entry
of :mod:`graphir.model.ubatch_inputs`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from graphir.batch import UBatch
from graphir.graph.floats import f32
from graphir.model import ubatch_inputs

ROLE = "attn_scale"


@dataclass(frozen=True)
class Temperature:
    """log(floor((pos + offset) / floor_scale) + 1) * scale + 1 per token."""

    floor_scale: int
    scale: float
    offset: float

    def facts(self) -> dict[str, float]:
        return {"floor_scale": self.floor_scale, "scale": self.scale, "offset": self.offset}

    def factors(self, pos: np.ndarray) -> np.ndarray:
        """The factors [1, 1, n_tokens] (numpy order: n_tokens first), as llama.cpp computes them: the chunk in
        float32, its log in double."""
        chunk = np.floor((pos.astype(np.float32) + np.float32(self.offset)) / np.float32(self.floor_scale))
        out = np.log(chunk.astype(np.float64) + 1.0) * float(f32(self.scale)) + 1.0
        return out.astype(np.float32).reshape(-1, 1, 1)


def _factors(facts: Mapping[str, Any], ub: UBatch) -> np.ndarray:
    """The temperature input of a ubatch, by the rule its facts state."""
    return Temperature(int(facts["floor_scale"]), facts["scale"], facts["offset"]).factors(ub.pos)


ubatch_inputs.register(ROLE, _factors)
