"""Qwen3-Next (qwen3next): Qwen3.5-MoE's forerunner, the same decoder of gated DeltaNet layers and gated full
attention layers, each followed by softmax-routed experts and a shared expert behind a sigmoid gate.

It is Qwen3.5-MoE's build (:class:`graphir.arch.qwen35.Qwen35`) as data, differing in what the files carry and in
three steps of the graph:

- the attention layers rotate the first ``rope.dimension_count`` dims of each head NeoX-style (no M-RoPE sections);
- a DeltaNet layer's q, k, v and z come from ``attn_qkv`` and ``attn_gate`` as the converter now writes them, or,
  in older files, from one ``ssm_in`` laid out key head by key head ([q, k, v, z] of each key head in turn), which
  the graph splits and regroups into [q of every head, k..., v...]; beta and alpha come from one ``ssm_ba``,
  likewise key head by key head ([beta, alpha] of the value heads a key head serves);
- where value heads outnumber key heads, each key head's q and k are repeated for its value heads in place (key
  head 0 serves value heads 0..r-1), not taken in turn as Qwen3.5's delta rule takes them.

Its graph reads no per-tensor scale of the DeltaNet's projections (llama.cpp loads them and leaves them unread).
Multi-token-prediction layers after the trunk load and never run, as in Qwen3.5. The memory is the hybrid kind:
KV for the attention layers, conv columns and delta states for the DeltaNet ones.
Reference: Qwen Team 2025, "Qwen3-Next"; llama.cpp src/models/qwen3next.cpp, delta-net-base.cpp.
"""

from __future__ import annotations

from gguf import Keys

from graphir.arch.qwen35 import MOE_F32, MTP_NORM, Qwen35, Qwen35Moe, deltanet_keys
from graphir.model import hf_config, presets
from graphir.model.hf_config import Config, Family
from graphir.model.presets import Preset

SPLIT_QKV = r"blk\.\d+\.attn_(qkv|gate)\.weight"  # the converter's q, k, v and z of a DeltaNet layer
SPLIT_EXPERTS = r"blk\.\d+\.ffn_(gate|up)_exps\.weight"  # and the experts' gate and up stacks apart
WRITTEN = f"{SPLIT_QKV}|{SPLIT_EXPERTS}|{MTP_NORM}"


class Qwen3Next(Qwen35):
    name = "qwen3next"
    rope_mode = "neox"
    keys = tuple(k for k in Qwen35Moe.keys if k.field != "rope_sections")
    experts = True
    sections = False
    packed = True


# ---- presets: released models of this family, as their converted GGUFs declare them ---------------------

L, A, R, S = Keys.LLM, Keys.Attention, Keys.Rope, Keys.SSM


presets.register({
    # Gated DeltaNet in three layers of four (16 key heads and 32 value heads of 128, conv kernel 4), gated attention
    # in every fourth (16 query heads and 2 KV heads of 256, a quarter of each head RoPE'd); each FFN 512 experts
    # of 512, 10 per token, and a shared expert of 512; a multi-token-prediction layer after the 48 (loaded, never
    # run).
    "Qwen3-Next-80B-A3B": Preset("qwen3next", {
        L.CONTEXT_LENGTH: 262144, L.EMBEDDING_LENGTH: 2048, L.BLOCK_COUNT: 49, L.NEXTN_PREDICT_LAYERS: 1,
        L.FEED_FORWARD_LENGTH: 5120,
        A.HEAD_COUNT: 16, A.HEAD_COUNT_KV: 2, A.KEY_LENGTH: 256, A.VALUE_LENGTH: 256, R.FREQ_BASE: 10000000.0,
        R.DIMENSION_COUNT: 64, A.LAYERNORM_RMS_EPS: 1e-6, L.FULL_ATTENTION_INTERVAL: 4,
        S.CONV_KERNEL: 4, S.STATE_SIZE: 128, S.GROUP_COUNT: 16, S.TIME_STEP_RANK: 32, S.INNER_SIZE: 4096,
        L.VOCAB_SIZE: 151936, L.EXPERT_COUNT: 512, L.EXPERT_USED_COUNT: 10, L.EXPERT_FEED_FORWARD_LENGTH: 512,
        L.EXPERT_SHARED_FEED_FORWARD_LENGTH: 512,
    }, tied=False, include=WRITTEN,
        f32=MOE_F32,
        source="Qwen/Qwen3-Next-80B-A3B-Instruct config.json"),
})


# ---- Hugging Face: the keys convert_hf_to_gguf writes for Qwen3-Next ----------------------------------------------

def _mtp(c: Config) -> int:
    """The prediction layers: Qwen3-Next's configs leave the count out, and the converter counts the checkpoint's
    (one in every released one)."""
    return c.find("mtp_num_hidden_layers", kind="size", default=1)


hf_config.register(Family("qwen3next", deltanet_keys(_mtp), {"tie_word_embeddings": False},
                          lambda c: WRITTEN), "Qwen3NextForCausalLM")
