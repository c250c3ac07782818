"""Nemotron (NVIDIA, Nemotron-3 and Minitron): the pre-norm decoder with LayerNorms (layernorm1p: the converter
adds the 1 to each weight), RoPE over split halves of part of each head, an ungated MLP of squared ReLUs, the
attention output's and the MLP's biases where a file has them, and an LM head of its own.

References: NVIDIA 2024, "Nemotron-4 15B Technical Report" (arXiv:2402.16819); Muralidharan et al. 2024,
"Compact Language Models via Pruning and Knowledge Distillation" (arXiv:2407.14679); llama.cpp
src/models/nemotron.cpp.
"""

from __future__ import annotations

from typing import Any, Mapping

from gguf import Keys

from graphir.model import hf_config, presets
from graphir.model.builder import Act, Norm
from graphir.model.hf_config import TEXT, VOCAB, WIDTH, Config, Family, derived, heads, hf
from graphir.model.prenorm import LAYER_NORM_KEYS, READ, PreNormDecoder, Traits, synthetic

A, R = Keys.Attention, Keys.Rope


class Nemotron(PreNormDecoder):
    name = "nemotron"
    rope_mode = "neox"
    required_keys = LAYER_NORM_KEYS
    traits = Traits(norm=Norm.LAYER, tied_head=False, fused_qkv=READ, wo_bias=READ, ffn_act=Act.RELU_SQR,
                    ffn_bias=READ)


# ---- Hugging Face: convert_hf_to_gguf's NemotronModel -------------------------------------------------------

def _rotated(c: Config) -> int:
    """partial_rotary_factor of the whole width, shared by the heads (the converter's own rounding)."""
    return int(c.rope_value(c.rope, "partial_rotary_factor") * c.find(*WIDTH)) // heads(c)


def _scaling(c: Config) -> Mapping[str, Any]:
    """A factor (at the top level or in the RoPE parameters) is linear scaling; without one, none is written."""
    factor = c.find("factor", kind="number", default=None) or c.rope_value(c.rope, "factor", default=None)
    return {R.SCALING_TYPE: "none"} if factor is None else {R.SCALING_TYPE: "linear", R.SCALING_FACTOR: factor}




def _biases(c: Config) -> str:
    """Q, K and V apart; the attention's biases with attention_bias, the MLP's with mlp_bias."""
    out = [presets.SPLIT_QKV]
    if c.find("attention_bias", kind="flag", default=False):
        out.append(r"blk\.\d+\.attn_(q|k|v|output)\.bias")
    if c.find("mlp_bias", kind="flag", default=False):
        out.append(r"blk\.\d+\.ffn_(up|down)\.bias")
    return "|".join(out)


hf_config.register(Family("nemotron", TEXT + (
    hf(A.LAYERNORM_EPS, "layer_norm_eps", "layer_norm_epsilon", "norm_epsilon", "norm_eps", kind="number"),
    derived(R.DIMENSION_COUNT, _rotated), _scaling, VOCAB),
                          {"tie_word_embeddings": False}, _biases), "NemotronForCausalLM")

presets.register({"Nemotron-tiny": synthetic("nemotron", "a synthetic header of tiny sizes", A.LAYERNORM_EPS,
                                             presets.SPLIT_QKV)})
