"""Mistral 4 (mistral4): DeepSeek-V2's graph (multi-head latent attention, shared and routed experts, optional
attention temperature tuning), which llama.cpp loads and builds as deepseek2's; the one difference is YaRN's
magnitude, whose mscale llama.cpp leaves at 1 here. So it is data over :class:`graphir.arch.deepseek2.DeepSeek2`.

No public configuration is at hand: the family's golden graphs come from llama.cpp's tiny header of it (the
sizes tests/test-llama-archs.cpp gives mistral4), and no Hugging Face mapping is registered.

Reference: llama.cpp src/models/mistral4.cpp, deepseek2.cpp.
"""

from __future__ import annotations

from gguf import Keys

from graphir.arch.deepseek2 import DeepSeek2
from graphir.model import presets
from graphir.model.presets import Preset

L, A, R = Keys.LLM, Keys.Attention, Keys.Rope


class Mistral4(DeepSeek2):
    name = "mistral4"
    mscale_is_all_dim = False


presets.register({
    # llama.cpp's tiny mistral4, over four layers (so that alike ones fold): width 128, one head of 192 (64 RoPE'd) over
    # a latent of 512, values of 128; the first layer dense (192), the second 2 experts of 192, both used, sigmoid-
    # routed, beside a shared one
    "mistral4-tiny-header": Preset("mistral4", {
        L.CONTEXT_LENGTH: 256, L.EMBEDDING_LENGTH: 128, L.BLOCK_COUNT: 4, L.FEED_FORWARD_LENGTH: 192,
        A.HEAD_COUNT: 1, A.HEAD_COUNT_KV: 1, A.KEY_LENGTH: 576, A.VALUE_LENGTH: 512, A.KEY_LENGTH_MLA: 192,
        A.VALUE_LENGTH_MLA: 128, A.Q_LORA_RANK: 512, A.KV_LORA_RANK: 512, R.DIMENSION_COUNT: 64,
        A.LAYERNORM_RMS_EPS: 1e-5, L.LEADING_DENSE_BLOCK_COUNT: 1, L.EXPERT_COUNT: 2, L.EXPERT_USED_COUNT: 2,
        L.EXPERT_FEED_FORWARD_LENGTH: 192, L.EXPERT_SHARED_COUNT: 1, L.EXPERT_GATING_FUNC: 2, L.VOCAB_SIZE: 128,
    }, tied=False, include=r"blk\.\d+\.ffn_(gate|up)_exps\.weight", f32=presets.ROUTER_F32,
        source="llama.cpp tests/test-llama-archs.cpp, its tiny mistral4 header"),
})
