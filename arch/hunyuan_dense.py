"""Hunyuan dense (Tencent): the pre-norm decoder with RMSNorm, SwiGLU and GQA, RoPE over split halves, and each
head of Q and K RMS-normalised after RoPE.

Its NTK-aware RoPE ("XDRoPE") raises the base to base * alpha^(d / (d - 2)) for heads of d values when the file
gives ``rope.scaling.alpha`` (the converter usually writes the raised base itself and no alpha). A file's M-RoPE
sections change nothing here: llama.cpp turns them with the family's split-halves RoPE, which reads no section.

References: Tencent Hunyuan Team 2025, "Hunyuan-7B" model card; llama.cpp src/models/hunyuan-vl.cpp (the graph
llama.cpp's hunyuan-dense reuses).
"""

from __future__ import annotations

from graphir.model.prenorm import NTK_ALPHA, RMS_KEYS, PreNormDecoder, Traits


class HunyuanDense(PreNormDecoder):
    name = "hunyuan-dense"
    rope_mode = "neox"
    required_keys = RMS_KEYS
    keys = (NTK_ALPHA,)  # 0: the base as the file says
    traits = Traits(qk_norm_after_rope=True, ntk_alpha=True)

