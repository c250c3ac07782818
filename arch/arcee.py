"""Arcee (AFM): the pre-norm decoder whose FFN is ungated, relu(up x) squared, then down.

RoPE rotates adjacent pairs, with Llama-3.1's per-dimension divisors where the file has them; the LM head is the
token embedding when the file has none of its own.

References: Arcee AI 2025, "AFM-4.5B" model card; llama.cpp src/models/arcee.cpp.
"""

from __future__ import annotations

from graphir.model.builder import Act
from graphir.model.prenorm import READ, RMS_KEYS, PreNormDecoder, Traits


class Arcee(PreNormDecoder):
    name = "arcee"
    rope_mode = "norm"
    required_keys = RMS_KEYS
    traits = Traits(rope_freqs=READ, ffn_act=Act.RELU_SQR)
