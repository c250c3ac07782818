"""Maincoder: the pre-norm decoder with RMSNorm, SwiGLU and GQA, RoPE over adjacent pairs, and each head of Q and
K RMS-normalised after RoPE.

References: llama.cpp src/models/maincoder.cpp.
"""

from __future__ import annotations

from graphir.model.prenorm import RMS_KEYS, PreNormDecoder, Traits


class Maincoder(PreNormDecoder):
    name = "maincoder"
    rope_mode = "norm"
    required_keys = RMS_KEYS
    traits = Traits(qk_norm_after_rope=True)
