"""DeepSeek-V3.2 (deepseek32): DeepSeek-V3 with DeepSeek Sparse Attention (DSA).

Everything but attention's key selection is DeepSeek-V3's (:mod:`graphir.arch.deepseek2`, absorbed MLA only:
llama.cpp refuses the legacy form). Each layer adds a lightning indexer: from the compressed query ``qr`` it makes
``indexer.head_count`` query heads of ``indexer.key_length`` values (``indexer.attn_q_b``), from the layer's input
one key head (``indexer.attn_k``, LayerNorm with a bias at eps 1e-6, as llama.cpp fixes it) and a weight per
head (``indexer.proj``); queries and keys are RoPE'd over their first ``n_rot`` values in NeoX's layout and
turned by a Hadamard rotation, the keys kept in an indexer cache beside the latent rows (memory ``kv_dsa``). Each
token scores every cached key (``lightning_indexer``: the heads' ReLU'd dot products times their weights, scaled
by 1 / sqrt(key length x heads)), keeps its ``indexer.top_k`` best (all when fewer are cached), and attends over
those alone: its mask is -inf everywhere but at the kept keys, plus the causal mask. YaRN's mscale is 1 here
(llama.cpp sets mscale equal to mscale_all_dim for deepseek2 alone).

The multi-token-prediction layer loads and never runs, as in DeepSeek-V3.

References: DeepSeek-AI 2025, "DeepSeek-V3.2-Exp: Boosting Long-Context Efficiency with DeepSeek Sparse
Attention"; llama.cpp src/models/deepseek32.cpp, src/llama-kv-cache-dsa.cpp.
"""

from __future__ import annotations

from dataclasses import replace

from gguf import Keys

from graphir.arch.deepseek import NEXTN_RULES
from graphir.arch.deepseek2 import DEFAULTS, RULES, DeepSeek2, _deepseek2, _optional_written
from graphir.model import dsa, hf_config, presets
from graphir.model.dsa import Sparse
from graphir.model.hf_config import Config, Family, hf
from graphir.model.moe import nextn_written

L, A, R = Keys.LLM, Keys.Attention, Keys.Rope
I = Keys.Attention.Indexer  # noqa: E741


class DeepSeek32(DeepSeek2):
    name = "deepseek32"
    mscale_is_all_dim = False
    ffn_scales = True
    # NeoX's halves in the indexer; its LayerNorm at llama.cpp's fixed f_norm_eps for this family
    sparse = Sparse(rope_mode="neox", norm_eps=1e-6)
    required_keys = DeepSeek2.required_keys + (A.Q_LORA_RANK, L.EXPERT_GATING_FUNC) + dsa.REQUIRED
    keys = DeepSeek2.keys + dsa.KEYS


# ---- Hugging Face: what convert_hf_to_gguf writes for DeepSeek-V3.2 configs ----------------------------------

# the trunk tensors of the multi-token-prediction layer the converter appends (blk.<num_hidden_layers>)
MTP_TRUNK = (r"attn_norm|attn_q_a|attn_q_a_norm|attn_q_b|attn_kv_a_mqa|attn_kv_a_norm|attn_k_b|attn_v_b|attn_output|"
             r"ffn_norm|indexer\.(k_norm|proj|attn_k|attn_q_b)")


def _written(c: Config) -> str:
    """DeepSeek-V3's optional tensors, and the multi-token-prediction layer (with its indexer) appended."""
    n_layer, n_nextn = c.find("num_hidden_layers"), c.find("num_nextn_predict_layers", kind="size", default=0)
    if not n_nextn:
        return _optional_written(c)
    last = "|".join(str(il) for il in range(n_layer, n_layer + n_nextn))
    return (f"{_optional_written(c)}|{nextn_written(n_layer, n_nextn, MTP_TRUNK)}"
            rf"|blk\.({last})\.indexer\.k_norm\.bias")


hf_config.register(Family("deepseek32", RULES + NEXTN_RULES + (
    hf(I.HEAD_COUNT, "index_n_heads"),
    hf(I.KEY_LENGTH, "index_head_dim"),
    hf(I.TOP_K, "index_topk"),
), DEFAULTS, _written, tie_drops_head=True), "DeepseekV32ForCausalLM")


# ---- presets ------------------------------------------------------------------------------------------

# DeepSeek-V3's figures (61 layers, the first 3 dense, 256 experts of 2048 with 8 per token and 1 shared, sigmoid
# routing with a selection bias among the 4 best of 8 groups, scaled by 2.5; YaRN x40, mscale_all_dim 1.0) with
# the multi-token-prediction layer the converter appends (blk.61) and the indexer: 64 heads of 128, 2048 keys kept
_V3 = _deepseek2(7168, 61, 18432, 128, 1536, 3, 256, 8, 2048, 1, 129280, {
    L.EXPERT_WEIGHTS_SCALE: 2.5, L.EXPERT_WEIGHTS_NORM: True, L.EXPERT_GATING_FUNC: 2, L.EXPERT_GROUP_COUNT: 8,
    L.EXPERT_GROUP_USED_COUNT: 4,
}, 0.1, True, "deepseek-ai/DeepSeek-V3.2-Exp config.json")

presets.register({
    "DeepSeek-V3.2-Exp": replace(_V3, arch="deepseek32", keys={
        **_V3.keys, L.BLOCK_COUNT: 62, L.NEXTN_PREDICT_LAYERS: 1, I.HEAD_COUNT: 64, I.KEY_LENGTH: 128, I.TOP_K: 2048,
    }, include=f"{_V3.include}|{nextn_written(61, 1, MTP_TRUNK)}" + r"|blk\.61\.indexer\.k_norm\.bias"),
})
