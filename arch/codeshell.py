"""CodeShell (Peking University KCL): GPT-2's block (LayerNorms and biases everywhere, a GELU MLP) with
grouped-query attention and RoPE over split halves of whole heads instead of a position table. The LM head is a
matrix of its own, and the token embedding may be left out of a file, the head's matrix serving.

References: Xie et al. 2024, "CodeShell Technical Report" (arXiv:2403.15747); llama.cpp src/models/codeshell.cpp.
"""

from __future__ import annotations

from gguf import Keys

from graphir.model import hf_config, presets
from graphir.model.builder import Act, Norm
from graphir.model.hf_config import BLOCKS, VOCAB, Family, derived, fixed, hf
from graphir.model.prenorm import LAYER_NORM_KEYS, READ, REQUIRED, PreNormDecoder, Traits, synthetic

L, A, R = Keys.LLM, Keys.Attention, Keys.Rope
QKV_FUSED = r"blk\.\d+\.attn_qkv\.(weight|bias)"


class CodeShell(PreNormDecoder):
    name = "codeshell"
    rope_mode = "neox"
    required_keys = LAYER_NORM_KEYS
    traits = Traits(whole_heads=True, norm=Norm.LAYER, tied_head=False, embd_from_head=True, fused_qkv=READ,
                    wo_bias=REQUIRED, ffn_act=Act.GELU, ffn_bias=REQUIRED)


# ---- Hugging Face: convert_hf_to_gguf's CodeShellModel (GPT-2's names; RoPE's base fixed at 10000) -------------

hf_config.register(Family("codeshell", (
    hf(L.BLOCK_COUNT, *BLOCKS),
    hf(L.CONTEXT_LENGTH, "n_positions"),
    hf(L.EMBEDDING_LENGTH, "n_embd"),
    derived(L.FEED_FORWARD_LENGTH, lambda c: 4 * c.find("n_embd")),
    hf(A.HEAD_COUNT, "n_head"),
    hf(A.HEAD_COUNT_KV, "num_query_groups"),
    hf(A.LAYERNORM_EPS, "layer_norm_epsilon", kind="number"),
    fixed(R.FREQ_BASE, 10000.0),
    fixed(R.SCALING_TYPE, "linear"),
    fixed(R.SCALING_FACTOR, 1.0),
    VOCAB,
), {"tie_word_embeddings": False}, include=lambda c: QKV_FUSED), "CodeShellForCausalLM")

# its checkpoints fuse Q, K and V with their bias (c_attn), as GPT-2's do
presets.register({"CodeShell-tiny": synthetic("codeshell", "a synthetic header of tiny sizes", A.LAYERNORM_EPS,
                                             QKV_FUSED)})
