"""Baichuan and Baichuan 2: the pre-norm decoder with RMSNorm and SwiGLU, an LM head of its own; how it places
tokens depends on its size, as llama.cpp reads it from the layer count: the 7B (32 layers) rotates Q and K
(RoPE over adjacent pairs), the 13B (40 layers) biases each head's scores by distance (ALiBi), and a model of
any other depth does neither.

References: Yang et al. 2023, "Baichuan 2: Open Large-scale Language Models"; llama.cpp src/models/baichuan.cpp.
"""

from __future__ import annotations

from graphir.model.hparams import Alibi
from graphir.model.prenorm import RMS_KEYS, PreNormDecoder, Traits

ROPE_N_LAYER, ALIBI_N_LAYER = 32, 40  # the 7B and the 13B


class Baichuan(PreNormDecoder):
    name = "baichuan"
    rope_mode = "norm"
    required_keys = RMS_KEYS
    alibi = Alibi(n_layer=ALIBI_N_LAYER)
    traits = Traits(tied_head=False, rope_at_n_layer=ROPE_N_LAYER)
