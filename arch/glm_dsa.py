"""GLM-5 (glm-dsa): DeepSeek-V3.2's sparse attention (:mod:`graphir.arch.deepseek32`) in GLM's form.

Three differences from deepseek32, all data (a :class:`~graphir.model.dsa.Sparse` record): the indexer turns its queries and keys in RoPE's adjacent-pair
layout (as the rest of the model); only some layers run an indexer (``attention.indexer.types``, 1 for a layer
that does), the others attend over the keys the last such layer selected, so only the former keep indexer keys
(the indexer cache serves them alone); and what the file leaves out takes GLM's values: the gating sigmoid, every
layer an indexer for the files written before GLM-5.2 (a trained context under 2^20 positions), GLM-5.2's
pattern (the first two layers, then every fourth) for the others. Its indexer's LayerNorm uses llama.cpp's
``f_norm_eps``, which this family never reads (0), and its indexer tensors are asked for as not required.

No public configuration is at hand: the family's golden graphs come from llama.cpp's tiny header of it (the sizes
tests/test-llama-archs.cpp gives glm-dsa), and no Hugging Face mapping is registered.

Reference: llama.cpp src/models/glm-dsa.cpp.
"""

from __future__ import annotations

from dataclasses import replace

from gguf import Keys

import graphir.arch.mistral4  # noqa: F401  (registers the tiny header this one extends)

from graphir.arch.deepseek2 import DeepSeek2
from graphir.model import dsa, presets
from graphir.model.builder import Gating
from graphir.model.dsa import INDEXER_TYPES, Sparse
from graphir.model.hparams import HParams, Key

L, A, R = Keys.LLM, Keys.Attention, Keys.Rope
I = Keys.Attention.Indexer  # noqa: E741
GLM_5_2_CONTEXT = 1 << 20  # files of a trained context this long or longer are GLM-5.2's (llama.cpp's test)


def glm_indexers(hp: HParams, n_trunk: int) -> tuple[int, ...]:
    """Every layer for the files before GLM-5.2; GLM-5.2's pattern for the others: the first two layers, then one
    in four, over its 78 (none past them)."""
    if hp.n_ctx_train < GLM_5_2_CONTEXT:
        return (1,) * n_trunk
    return tuple(int(il < 2 or il < 78 and (il - 2) % 4 == 0) for il in range(n_trunk))


class GlmDsa(DeepSeek2):
    name = "glm-dsa"
    mscale_is_all_dim = False
    ffn_scales = True
    sparse = Sparse(rope_mode="norm", norm_eps=0.0, optional=True, gating=Gating.SIGMOID, default_types=glm_indexers)
    required_keys = DeepSeek2.required_keys + (A.Q_LORA_RANK,) + dsa.REQUIRED
    keys = DeepSeek2.keys + dsa.KEYS + (Key("indexer_types", INDEXER_TYPES, tuple, None, minimum=0, maximum=1),)


# llama.cpp's tiny glm-dsa: its tiny mistral4 header (test-llama-archs.cpp gives the MLA families one) and an
# indexer of 64 heads of 128 keeping every key, over four layers (so that alike ones fold)
_TINY = presets.PRESETS["mistral4-tiny-header"]
presets.register({
    "glm-dsa-tiny-header": replace(_TINY, arch="glm-dsa", keys={
        **_TINY.keys, I.HEAD_COUNT: 64, I.KEY_LENGTH: 128, I.TOP_K: 131072,
    }, include=_TINY.include + r"|blk\.\d+\.indexer\..*",
        source="llama.cpp tests/test-llama-archs.cpp, its tiny glm-dsa header"),
})
