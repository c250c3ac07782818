"""PLaMo (Preferred Networks, the first release): a decoder whose attention and SwiGLU FFN read the same RMSNorm
in parallel and join the residual stream together, with RoPE over split halves of whole heads and grouped-query
attention; the LM head is a matrix of its own.

References: Preferred Networks 2023, PLaMo-13B model card; llama.cpp src/models/plamo.cpp.
"""

from __future__ import annotations

from gguf import Keys

from graphir.model import hf_config, presets
from graphir.model.hf_config import BLOCKS, VOCAB, Family, fixed, hf
from graphir.model.prenorm import READ, RMS_KEYS, PreNormDecoder, Traits, synthetic

L, A = Keys.LLM, Keys.Attention


class Plamo(PreNormDecoder):
    name = "plamo"
    rope_mode = "neox"
    required_keys = RMS_KEYS
    traits = Traits(whole_heads=True, parallel=True, tied_head=False, fused_qkv=READ)


# ---- Hugging Face: convert_hf_to_gguf's PlamoModel, which writes its keys itself: a context of 4096 and 5 K/V heads
# whatever the config says (it reorders Q's and the output's heads for that grouping) ------------------------------


hf_config.register(Family("plamo", (
    fixed(L.CONTEXT_LENGTH, 4096),
    hf(L.EMBEDDING_LENGTH, "hidden_size"),
    hf(L.FEED_FORWARD_LENGTH, "intermediate_size"),
    hf(L.BLOCK_COUNT, *BLOCKS),
    hf(A.HEAD_COUNT, "num_attention_heads"),
    fixed(A.HEAD_COUNT_KV, 5),
    hf(A.LAYERNORM_RMS_EPS, "rms_norm_eps", kind="number"),
    VOCAB,
), {"tie_word_embeddings": False}, lambda c: presets.SPLIT_QKV), "PlamoForCausalLM")

presets.register({"PLaMo-tiny": synthetic("plamo", "a synthetic header of tiny sizes", include=presets.SPLIT_QKV)})
