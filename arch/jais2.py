"""Jais 2 (Inception): the pre-norm decoder with LayerNorms and biases everywhere, RoPE over split halves of whole
heads, and an ungated MLP of squared ReLUs; the LM head is the token embedding unless the file has its own.

References: Inception 2025, Jais 2 model card; llama.cpp src/models/jais2.cpp.
"""

from __future__ import annotations

from gguf import Keys

from graphir.model import hf_config, presets
from graphir.model.builder import Act, Norm
from graphir.model.hf_config import TEXT, VOCAB, Config, Family, derived, head_dim
from graphir.model.prenorm import LAYER_NORM_KEYS, READ, REQUIRED, PreNormDecoder, Traits, synthetic

R = Keys.Rope


class Jais2(PreNormDecoder):
    name = "jais2"
    rope_mode = "neox"
    required_keys = LAYER_NORM_KEYS
    traits = Traits(whole_heads=True, norm=Norm.LAYER, fused_qkv=READ, wo_bias=REQUIRED, ffn_act=Act.RELU_SQR,
                    ffn_bias=REQUIRED)


# ---- Hugging Face: convert_hf_to_gguf's Jais2Model, the text model's keys and RoPE over whole heads -------------

QKV_BIASES = r"blk\.\d+\.attn_[qkv]\.(weight|bias)"


def _qkv(c: Config) -> str:
    """Q, K and V apart, with their biases unless attention_bias says otherwise (the output projection's bias, which
    llama.cpp requires, is always written)."""
    return QKV_BIASES if c.find("attention_bias", kind="flag", default=True) else presets.SPLIT_QKV


hf_config.register(Family("jais2", TEXT + (derived(R.DIMENSION_COUNT, head_dim), VOCAB),
                          {"tie_word_embeddings": False}, _qkv), "Jais2ForCausalLM")

presets.register({"Jais2-tiny": synthetic("jais2", "a synthetic header of tiny sizes", Keys.Attention.LAYERNORM_EPS,
                                         QKV_BIASES)})
