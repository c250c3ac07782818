"""openPangu-Embedded (Huawei): the pre-norm decoder with RMSNorm, SwiGLU and GQA, RoPE over split halves, and a
bias on the attention's output projection. The loader takes optional RoPE divisors (Llama-3.1's, or a LongRoPE
file's long and short sets), which the graph does not read.

References: Huawei 2025, "openPangu-Embedded-1B/7B" model cards; llama.cpp src/models/pangu-embed.cpp.
"""

from __future__ import annotations

from graphir.model.prenorm import REQUIRED, RMS_KEYS, UNREAD, PreNormDecoder, Traits


class PanguEmbedded(PreNormDecoder):
    name = "pangu-embedded"
    rope_mode = "neox"
    required_keys = RMS_KEYS
    traits = Traits(rope_freqs=UNREAD, longrope=True, wo_bias=REQUIRED)
