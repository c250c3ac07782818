"""Orion (OrionStar): the pre-norm decoder whose norms are LayerNorms with biases, SwiGLU, RoPE over split
halves, an LM head of its own.

References: OrionStar 2024, "Orion-14B: Open-source Multilingual Large Language Models"; llama.cpp
src/models/orion.cpp.
"""

from __future__ import annotations

from gguf import Keys

from graphir.model.builder import Norm
from graphir.model.prenorm import PreNormDecoder, Traits


class Orion(PreNormDecoder):
    name = "orion"
    rope_mode = "neox"
    required_keys = (Keys.LLM.FEED_FORWARD_LENGTH, Keys.Attention.HEAD_COUNT, Keys.Attention.LAYERNORM_EPS)
    traits = Traits(norm=Norm.LAYER, tied_head=False)
