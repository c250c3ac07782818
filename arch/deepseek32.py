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

import math
from typing import ClassVar

from gguf import MODEL_TENSOR as T
from gguf import Keys

from dataclasses import replace

from graphir.arch.deepseek import NEXTN_RULES
from graphir.arch.deepseek2 import DEFAULTS, RULES, DeepSeek2, _deepseek2, _optional_written
from graphir.errors import MetadataError
from graphir.graph.floats import f32
from graphir.graph.ir import Node
from graphir.memory.layers import IndexerKeys, LatentAttention, LayerNeeds
from graphir.model import hf_config, presets
from graphir.model.builder import GraphBuilder
from graphir.model.hf_config import Config, Family, hf
from graphir.model.moe import nextn_written
from graphir.model.hparams import HParams, Key
from graphir.model.mla import latent_qkv
from graphir.model.tensors import TensorSpec, spec

L, A, R = Keys.LLM, Keys.Attention, Keys.Rope
I = Keys.Attention.Indexer  # noqa: E741

INDEXER_NORM_EPS = 1e-6  # llama.cpp's f_norm_eps for this family, whatever the file says


class DeepSeek32(DeepSeek2):
    name = "deepseek32"
    mscale_is_all_dim = False
    ffn_scales = True
    required_keys = DeepSeek2.required_keys + (A.Q_LORA_RANK, L.EXPERT_GATING_FUNC, I.HEAD_COUNT, I.KEY_LENGTH,
                                               I.TOP_K)
    keys = DeepSeek2.keys + (
        Key("indexer_n_head", I.HEAD_COUNT, int, 0, minimum=1),
        Key("indexer_head_size", I.KEY_LENGTH, int, 0, minimum=1),
        Key("indexer_top_k", I.TOP_K, int, 0, minimum=1),
    )

    indexer_rope_mode: ClassVar[str] = "neox"
    indexer_optional: ClassVar[bool] = False  # the loader asks for the indexer's tensors as not required

    def __init__(self, hp: HParams):
        key = lambda t: t.format(arch=self.name)  # noqa: E731
        if not hp.n_embd_head_k_mla:
            raise MetadataError(f"'{key(A.KEY_LENGTH_MLA)}' is missing: {self.name} is built in the absorbed MLA "
                                f"form only")
        if hp.n_rot > hp.indexer_head_size:
            raise MetadataError(f"'{key(R.DIMENSION_COUNT)}' = {hp.n_rot} RoPE'd values do not fit an indexer head "
                                f"of {hp.indexer_head_size} ('{key(I.KEY_LENGTH)}')")
        super().__init__(hp)
        self.q_lora = hp.n_lora_q  # every size reads q_lora_rank (no Lite variant)

    def indexer_full(self, il: int) -> bool:
        """Whether layer il runs its own indexer (else it takes the selection of the last layer that did)."""
        return True

    def indexer_eps(self) -> float:
        return INDEXER_NORM_EPS

    def layers(self) -> LayerNeeds:
        """Each layer keeps its latent row, and its indexer key where it runs an indexer."""
        hp = self.hp
        latent, keys = LatentAttention(hp.n_lora_kv + hp.n_rot), IndexerKeys(hp.indexer_head_size, hp.indexer_top_k)
        return tuple((latent, keys) if self.indexer_full(il) else latent for il in range(self.n_trunk))

    def attn_tensors(self, il: int) -> list[TensorSpec]:
        hp = self.hp
        E, D, H, opt = hp.n_embd, hp.indexer_head_size, hp.indexer_n_head, self.indexer_optional
        return super().attn_tensors(il) + [
            spec(T.INDEXER_K_NORM, (D,), il, kind="vector", optional=opt),
            spec(T.INDEXER_K_NORM, (D,), il, "bias", kind="vector", optional=opt),
            spec(T.INDEXER_PROJ, (E, H), il, optional=opt), spec(T.INDEXER_ATTN_K, (E, D), il, optional=opt),
            spec(T.INDEXER_ATTN_Q_B, (hp.n_lora_q, H * D), il, optional=opt)]

    # ---- graph -----------------------------------------------------------------------------------------

    def indexer_rope(self, b: GraphBuilder, x: Node, pos: Node, name: str) -> Node:
        return b.rope(x, pos, name=name, attn_factor=self.rope_attn_factor(), mode=self.indexer_rope_mode)

    def selection(self, b: GraphBuilder, h: Node, qr: Node, pos: Node, il: int) -> Node:
        """The keys each token attends to [n_top_k, T]: the indexer's best-scored cached keys."""
        hp, w, T_ = self.hp, b.w, b.n_tokens
        D, H = hp.indexer_head_size, hp.indexer_n_head
        q = b.linear(qr, w(T.INDEXER_ATTN_Q_B, il), name="indexer_q")  # type: ignore[arg-type]
        q = self.indexer_rope(b, b.reshape(q, (D, H, T_), name="indexer_q.heads"), pos, "indexer_q.rope")
        k = b.linear(h, w(T.INDEXER_ATTN_K, il), name="indexer_k")  # type: ignore[arg-type]
        k = b.op("norm", k, eps=self.indexer_eps(), name="indexer_k.norm")
        k = b.op("mul", k, w(T.INDEXER_K_NORM, il), name="indexer_k.w")  # type: ignore[arg-type]
        k = b.op("add", k, w(T.INDEXER_K_NORM, il, "bias"), name="indexer_k.b")  # type: ignore[arg-type]
        k = self.indexer_rope(b, b.reshape(k, (D, 1, T_), name="indexer_k.heads"), pos, "indexer_k.rope")
        rot = b.build_indexer_rotation()
        q = b.op("mul_mat", rot, q, name="indexer_q.rot")
        k = b.op("mul_mat", rot, k, name="indexer_k.rot")
        keys, mask, n_top = b.build_indexer_keys(k)
        weights = b.linear(h, w(T.INDEXER_PROJ, il), name="indexer_weights")  # type: ignore[arg-type]
        weights = b.op("scale", weights, s=f32(1.0 / math.sqrt(float(D * H))), name="indexer_weights.scaled")
        score = b.op("lightning_indexer", q, keys, weights, mask, name="indexer_score")
        return b.op("cont", b.op("argsort_top_k", score, k=n_top, name="top_k.sel"), name="top_k")

    def attention(self, b: GraphBuilder, h: Node, pos: Node, temperature: Node | None, il: int) -> Node:
        hp, w = self.hp, b.w
        H, T_, R_kv, d_k, nope = hp.head_count(il), b.n_tokens, hp.n_lora_kv, self.d_k, self.d_nope
        qr = b.linear(h, w(T.ATTN_Q_A, il), name="qr")  # type: ignore[arg-type]
        qr = b.norm(qr, T.ATTN_Q_A_NORM, il, name="qr_norm")
        if self.indexer_full(il):
            top_k = self.selection(b, h, qr, pos, il)
        else:  # the selection of the last layer that ran an indexer
            last = max(j for j in range(il) if self.indexer_full(j))
            top_k = b.made(f"blk.{last}.top_k")  # type: ignore[assignment]
        q = b.reshape(b.linear(qr, w(T.ATTN_Q_B, il), name="q"), (d_k, H, T_), name="q.heads")  # type: ignore[arg-type]
        q_nope, q_pe, kv, k_pe = latent_qkv(b, h, q, pos, il, nope, self.rope)
        q_nope = b.op("permute", q_nope, axes=(0, 2, 1, 3), name="q_nope_perm")
        q_abs = b.op("mul_mat", w(T.ATTN_K_B, il), q_nope, name="q_nope_absorbed")  # type: ignore[arg-type]
        q_abs = b.op("permute", q_abs, axes=(0, 2, 1, 3), name="q_nope_absorbed_perm")
        q = b.op("concat", q_abs, q_pe, dim=0, name="Qcur")
        latent = b.reshape(kv, (R_kv, 1, T_), name="kv_cmpr.heads")
        k = b.op("concat", latent, k_pe, dim=0, name="Kcur")
        return b.build_attn_mla(q, k, latent, wo=w(T.ATTN_OUT, il), v_mla=w(T.ATTN_V_B, il),  # type: ignore[arg-type]
                                kq_scale=self.kq_scale(), wo_s=b.w_opt(T.ATTN_OUT, il, "scale"), selected=top_k)


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
