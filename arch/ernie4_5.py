"""ERNIE 4.5 dense (Baidu): the pre-norm decoder with RMSNorm, SwiGLU and GQA, RoPE over adjacent pairs.

The loader takes an optional bias of the attention's output projection, which the graph does not read.

References: Baidu ERNIE Team 2025, "ERNIE 4.5 Technical Report"; llama.cpp src/models/ernie4-5.cpp.
"""

from __future__ import annotations

from graphir.model.prenorm import RMS_KEYS, UNREAD, PreNormDecoder, Traits


class Ernie45(PreNormDecoder):
    name = "ernie4_5"
    rope_mode = "norm"
    required_keys = RMS_KEYS
    traits = Traits(wo_bias=UNREAD)
