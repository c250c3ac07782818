"""Diffusion language models: decoders that attend both ways and keep no cache, refining a masked sequence over
steps (llama.cpp's diffusion example calls llama_decode on the whole sequence at each step, every position's
logits out).

llama.cpp's graphs of them are literally those of causal families with the attention over the ubatch's own tokens
(its no-cache attention input) and no mask: Dream is Qwen2's layers (src/models/dream.cpp), LLaDA Llama's
(src/models/llada.cpp), LLaDA-MoE Qwen3-MoE's with its experts' weights as the softmax gave them
(src/models/llada-moe.cpp), RND1 Qwen3-MoE's (src/models/rnd1.cpp); each is a variant of arch/llama.py with
the causal family's constants, made non-causal (``causal = False``: llama.cpp's loader sets causal_attn false
whatever the file says, and gives the family no memory).
"""

from __future__ import annotations

from dataclasses import replace

from gguf import Keys

from graphir.model import hf_config, presets
from graphir.model.hf_config import TEXT, VOCAB, Family, hf
from graphir.model.presets import Preset
from graphir.arch.llama import Llama, Qwen2, Qwen3Moe

L, A, R = Keys.LLM, Keys.Attention, Keys.Rope


class Dream(Llama):
    """Dream: Qwen2's graph and tensors, bidirectional; its loader creates the optional output.bias, which its
    graph does not add."""

    name = "dream"
    causal = False
    rope_mode, keys = Qwen2.rope_mode, Qwen2.keys
    traits = replace(Qwen2.traits, head_bias=False)


class LLaDA(Llama):
    """LLaDA: Llama's graph, bidirectional, dense; its loader creates the optional attention-output and FFN biases
    and rope_freqs, which its graph does not read, and no output.bias."""

    name = "llada"
    causal = False
    keys = ()
    traits = replace(Llama.traits, extras_read=False, ffn_scales=False, head_bias=False)


class LLaDAMoe(Llama):
    """LLaDA-MoE: Qwen3-MoE's graph (Q and K RMS-normalised per head, every FFN a mixture of experts), bidirectional,
    its experts' weights not renormalised, no weight scales read; its loader creates no optional tensor."""

    name = "llada-moe"
    causal = False
    rope_mode, keys = Qwen3Moe.rope_mode, Qwen3Moe.keys
    traits = replace(Qwen3Moe.traits, extras_read=False, ffn_scales=False, head_bias=False, moe_norm_w=False)


class RND1(Llama):
    """RND1: Qwen3-MoE's graph, bidirectional; its experts' weight scales not read, the optional extras of
    Llama's loader not created."""

    name = "rnd1"
    causal = False
    rope_mode, keys = Qwen3Moe.rope_mode, Qwen3Moe.keys
    traits = replace(Qwen3Moe.traits, extras_read=False, ffn_scales=False, head_bias=False)


hf_config.register(Family("dream", TEXT + (VOCAB,), {"tie_word_embeddings": False}), "DreamModel")
# LLaDA's config speaks OLMo's names (d_model, n_layers, mlp_hidden_size, weight_tying)
hf_config.register(Family("llada", (
    hf(L.BLOCK_COUNT, "n_layers"), hf(L.CONTEXT_LENGTH, "max_sequence_length"), hf(L.EMBEDDING_LENGTH, "d_model"),
    hf(L.FEED_FORWARD_LENGTH, "mlp_hidden_size"), hf(A.HEAD_COUNT, "n_heads"), hf(A.HEAD_COUNT_KV, "n_kv_heads"),
    hf(R.FREQ_BASE, "rope_theta", kind="number"), hf(A.LAYERNORM_RMS_EPS, "rms_norm_eps", kind="number"), VOCAB)),
    "LLaDAModelLM")

presets.register({
    # Dream-org/Dream-v0-Instruct-7B: Qwen2.5-7B's shape (its config.json)
    "Dream-v0-Instruct-7B": Preset("dream", {
        L.CONTEXT_LENGTH: 131072, L.EMBEDDING_LENGTH: 3584, L.BLOCK_COUNT: 28, L.FEED_FORWARD_LENGTH: 18944,
        A.HEAD_COUNT: 28, A.HEAD_COUNT_KV: 4, R.FREQ_BASE: 1000000.0, A.LAYERNORM_RMS_EPS: 1e-6,
        L.VOCAB_SIZE: 152064,
    }, tied=False, source="Dream-org/Dream-v0-Instruct-7B config.json"),
    # GSAI-ML/LLaDA-8B-Instruct: 32 layers of 4096, 32 heads without grouping
    "LLaDA-8B-Instruct": Preset("llada", {
        L.CONTEXT_LENGTH: 4096, L.EMBEDDING_LENGTH: 4096, L.BLOCK_COUNT: 32, L.FEED_FORWARD_LENGTH: 12288,
        A.HEAD_COUNT: 32, A.HEAD_COUNT_KV: 32, R.FREQ_BASE: 500000.0, A.LAYERNORM_RMS_EPS: 1e-5,
        L.VOCAB_SIZE: 126464,
    }, tied=False, source="GSAI-ML/LLaDA-8B-Instruct config.json"),
    # llama.cpp's tiny LLaDA-MoE over four layers (so that alike ones fold; 256 wide, 2 heads, 4 experts of 384
    # with 2 per token): the released LLaDA-MoE-7B-A1B's config is not known here for certain
    "llada-moe-tiny-header": Preset("llada-moe", {
        L.CONTEXT_LENGTH: 256, L.EMBEDDING_LENGTH: 256, L.BLOCK_COUNT: 4, L.FEED_FORWARD_LENGTH: 384,
        A.HEAD_COUNT: 2, A.HEAD_COUNT_KV: 2, A.LAYERNORM_RMS_EPS: 1e-5, L.EXPERT_COUNT: 4, L.EXPERT_USED_COUNT: 2,
        L.EXPERT_FEED_FORWARD_LENGTH: 384, L.VOCAB_SIZE: 128,
    }, tied=False, source="llama.cpp tests/test-llama-archs.cpp, its tiny llada-moe header, 4 experts"),
    # llama.cpp's tiny RND1 over four layers, as LLaDA-MoE's: RND1-Base's released config is not known here for
    # certain
    "rnd1-tiny-header": Preset("rnd1", {
        L.CONTEXT_LENGTH: 256, L.EMBEDDING_LENGTH: 256, L.BLOCK_COUNT: 4, L.FEED_FORWARD_LENGTH: 384,
        A.HEAD_COUNT: 2, A.HEAD_COUNT_KV: 2, A.LAYERNORM_RMS_EPS: 1e-5, L.EXPERT_COUNT: 4, L.EXPERT_USED_COUNT: 2,
        L.EXPERT_FEED_FORWARD_LENGTH: 384, L.VOCAB_SIZE: 128,
    }, tied=False, source="llama.cpp tests/test-llama-archs.cpp, its tiny rnd1 header, 4 experts"),
})
