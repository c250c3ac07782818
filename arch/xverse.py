"""XVERSE (Shenzhen Yuanxiang): the pre-norm decoder with RMSNorm, SwiGLU and RoPE over adjacent pairs, an LM
head of its own.

References: XVERSE Technology 2023, "XVERSE-7B" model card; llama.cpp src/models/xverse.cpp.
"""

from __future__ import annotations

from graphir.model.prenorm import RMS_KEYS, PreNormDecoder, Traits


class Xverse(PreNormDecoder):
    name = "xverse"
    rope_mode = "norm"
    required_keys = RMS_KEYS
    traits = Traits(tied_head=False)
