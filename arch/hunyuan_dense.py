"""Hunyuan dense (Tencent): the pre-norm decoder with RMSNorm, SwiGLU and GQA, RoPE over split halves, and each
head of Q and K RMS-normalised after RoPE.

Its NTK-aware RoPE ("XDRoPE") raises the base to base * alpha^(d / (d - 2)) for heads of d values when the file
gives ``rope.scaling.alpha`` (the converter usually writes the raised base itself and no alpha). A file's M-RoPE
sections change nothing here: llama.cpp turns them with the family's split-halves RoPE, which reads no section.

HunyuanOCR's text model (``hunyuan_vl``) is the same graph turning by M-RoPE where its file gives time and height
sections (split halves otherwise); llama.cpp passes it RoPE frequency factors that its loader never creates, so
none are read.

References: Tencent Hunyuan Team 2025, "Hunyuan-7B" model card; llama.cpp src/models/hunyuan-vl.cpp (the graph
llama.cpp's hunyuan-dense reuses).
"""

from __future__ import annotations

from gguf import Keys

from graphir.model import hf_config, presets
from graphir.model.hf_config import TEXT, VOCAB, Family
from graphir.model.prenorm import NTK_ALPHA, RMS_KEYS, ROPE_SECTIONS, PreNormDecoder, Traits, synthetic


class HunyuanDense(PreNormDecoder):
    name = "hunyuan-dense"
    rope_mode = "neox"
    required_keys = RMS_KEYS
    keys = (NTK_ALPHA,)  # 0: the base as the file says
    traits = Traits(qk_norm_after_rope=True, ntk_alpha=True)


class HunyuanVL(PreNormDecoder):
    name = "hunyuan_vl"
    rope_mode = "neox"  # M-RoPE where the file's sections say so
    required_keys = RMS_KEYS
    keys = (NTK_ALPHA, ROPE_SECTIONS)
    traits = Traits(qk_norm_after_rope=True, ntk_alpha=True, mrope=True)


# ---- Hugging Face: convert_hf_to_gguf's HunYuanModel ------------------------------------------------------

R = Keys.Rope
XDROPE_CONTEXT = 256 * 1024  # what the converter writes for a "dynamic" alpha (the config says 32K)


def _ntk_alpha(c: hf_config.Config) -> dict[str, object]:
    """The converter raises the RoPE base by the config's alpha itself (and writes no alpha)."""
    p = c.rope
    if p.get("rope_type") not in ("dynamic", "xdrope"):
        return {}
    d = c.find("head_dim")
    base = c.rope_value(p, "rope_theta", default=10000.0) * c.rope_value(p, "alpha", default=50.0) ** (d / (d - 2))
    out: dict[str, object] = {R.FREQ_BASE: base, R.SCALING_TYPE: "none", R.SCALING_FACTOR: 1.0}
    if p.get("rope_type") == "dynamic":
        out.update({R.SCALING_ORIG_CTX_LEN: XDROPE_CONTEXT, Keys.LLM.CONTEXT_LENGTH: XDROPE_CONTEXT})
    return out


hf_config.register(Family("hunyuan-dense", TEXT + (VOCAB, _ntk_alpha), {"tie_word_embeddings": False}),
                   "HunYuanDenseV1ForCausalLM")



# ---- presets -----------------------------------------------------------------------------------------------

# Hunyuan-7B's public config is not known here for certain: the golden graphs come from a tiny header
presets.register({"Hunyuan-dense-tiny": synthetic("hunyuan-dense", "a synthetic header of tiny sizes"),
                  # HunyuanOCR's public config is not known here for certain either
                  "Hunyuan-VL-tiny": synthetic("hunyuan_vl", "a synthetic header of tiny sizes, M-RoPE sections",
                                               keys={R.DIMENSION_SECTIONS: [16, 16, 16, 16]})})
