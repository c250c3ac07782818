"""Hunyuan dense (Tencent): the pre-norm decoder with RMSNorm, SwiGLU and GQA, RoPE over split halves, and each
head of Q and K RMS-normalised after RoPE.

Its NTK-aware RoPE ("XDRoPE") raises the base to base * alpha^(d / (d - 2)) for heads of d values when the file
gives ``rope.scaling.alpha`` (the converter usually writes the raised base itself and no alpha). A file's M-RoPE
sections change nothing here: llama.cpp turns them with the family's split-halves RoPE, which reads no section.

References: Tencent Hunyuan Team 2025, "Hunyuan-7B" model card; llama.cpp src/models/hunyuan-vl.cpp (the graph
llama.cpp's hunyuan-dense reuses).
"""

from __future__ import annotations

import math
from dataclasses import replace

from gguf import Keys

from graphir.graph.floats import f32
from graphir.model.hparams import HParams, Key
from graphir.model.prenorm import RMS_KEYS, PreNormDecoder, Traits


class HunyuanDense(PreNormDecoder):
    name = "hunyuan-dense"
    rope_mode = "neox"
    required_keys = RMS_KEYS
    keys = (Key("rope_scaling_alpha", Keys.Rope.SCALING_ALPHA, float, 0.0),)  # 0: the base as the file says
    traits = Traits(qk_norm_after_rope=True)

    def __init__(self, hp: HParams):
        alpha = hp.rope_scaling_alpha
        if alpha > 0:  # float32 steps, as llama.cpp's loader raises the base
            d = hp.n_embd_head_k
            hp = replace(hp, rope_freq_base=f32(hp.rope_freq_base * f32(math.pow(alpha, f32(d / (d - 2))))))
        super().__init__(hp)
