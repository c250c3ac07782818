"""Qwen 1 (Alibaba): the pre-norm decoder whose Q, K and V are one matrix with its bias, RoPE over split halves,
a SwiGLU FFN half as wide as feed_forward_length says (the checkpoint's intermediate_size counts both halves).

References: Bai et al. 2023, "Qwen Technical Report"; llama.cpp src/models/qwen.cpp.
"""

from __future__ import annotations

from graphir.model.prenorm import RMS_KEYS, PreNormDecoder, Traits


class Qwen(PreNormDecoder):
    name = "qwen"
    rope_mode = "neox"
    required_keys = RMS_KEYS
    traits = Traits(tied_head=False, fused_qkv=True, ffn_halved=True)
