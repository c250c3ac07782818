"""InternLM2 (Shanghai AI Laboratory): the pre-norm decoder with RMSNorm, SwiGLU and GQA, RoPE over adjacent
pairs, an LM head of its own (the converter splits the checkpoint's fused wqkv into Q, K and V).

References: Cai et al. 2024, "InternLM2 Technical Report"; llama.cpp src/models/internlm2.cpp.
"""

from __future__ import annotations

from graphir.model.prenorm import RMS_KEYS, PreNormDecoder, Traits


class InternLM2(PreNormDecoder):
    name = "internlm2"
    rope_mode = "norm"
    required_keys = RMS_KEYS
    traits = Traits(tied_head=False)
