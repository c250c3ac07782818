"""EXAONE 3 and 3.5 (LG AI Research): the pre-norm decoder with RMSNorm, SwiGLU and GQA, RoPE over split
halves with Llama-3.1's per-dimension divisors where the file has them.

References: LG AI Research 2024, "EXAONE 3.5: Series of Large Language Models for Real-world Use Cases";
llama.cpp src/models/exaone.cpp.
"""

from __future__ import annotations

from graphir.model.prenorm import READ, RMS_KEYS, PreNormDecoder, Traits


class Exaone(PreNormDecoder):
    name = "exaone"
    rope_mode = "neox"
    required_keys = RMS_KEYS
    traits = Traits(rope_freqs=READ)
