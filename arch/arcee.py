"""Arcee (AFM): the pre-norm decoder whose FFN is ungated, relu(up x) squared, then down.

RoPE rotates adjacent pairs, with Llama-3.1's per-dimension divisors where the file has them; the LM head is the
token embedding when the file has none of its own.

References: Arcee AI 2025, "AFM-4.5B" model card; llama.cpp src/models/arcee.cpp.
"""

from __future__ import annotations

from gguf import Keys
from gguf import MODEL_TENSOR as T

from graphir.model import hf_config, presets
from graphir.model.builder import Act
from graphir.model.hf_config import TEXT, VOCAB, Family, derived
from graphir.model.prenorm import READ, RMS_KEYS, PreNormDecoder, Traits, synthetic
from graphir.model.tensors import tensor_name


class Arcee(PreNormDecoder):
    name = "arcee"
    rope_mode = "norm"
    required_keys = RMS_KEYS
    traits = Traits(rope_freqs=READ, ffn_act=Act.RELU_SQR)


# ---- Hugging Face: convert_hf_to_gguf's ArceeModel (a LlamaModel) -----------------------------------------


def _llama3_factors(c: hf_config.Config) -> str:
    """The converter computes Llama-3.1's RoPE divisors into rope_freqs for a llama3 rope_scaling."""
    llama3 = str(c.full_rope.get("rope_type", "")).lower() == "llama3"
    return tensor_name(T.ROPE_FREQS).replace(".", r"\.") if llama3 else ""


hf_config.register(Family("arcee", TEXT + (hf_config.pooling_rule, VOCAB,
                                           derived(Keys.Rope.DIMENSION_COUNT, hf_config.head_dim)),
                          {"tie_word_embeddings": False}, _llama3_factors), "ArceeForCausalLM")



# ---- presets -----------------------------------------------------------------------------------------------

# AFM-4.5B's public config is not known here for certain: the golden graphs come from a tiny header
presets.register({"Arcee-tiny": synthetic("arcee", "a synthetic header of tiny sizes")})
