"""DeepSeek-V2 and -V3 (deepseek2): multi-head latent attention and mixtures of experts with shared experts.

Attention (MLA) compresses each token's keys and values into one latent of ``kv_lora_rank`` values plus a small
key part of ``n_rot`` values that carries the positions (RoPE'd, shared by all heads); queries come from a
low-rank projection (``q_lora_rank``; DeepSeek-V2-Lite projects directly) and split per head into a part without
positions (``qk_nope``) and a RoPE'd part. In the absorbed form the converter writes (``attn_k_b`` / ``attn_v_b``,
``key_length_mla`` and ``value_length_mla`` set), each head's no-position query is absorbed into the latent space
through its slice of ``attn_k_b``, attention runs as one shared head over rows [latent | key part] (the latent
itself is V), and each head's output is decompressed through its slice of ``attn_v_b``: the memory keeps only
those rows. Files of the legacy form (one ``attn_kv_b``) decompress K and V per head and attend as ordinary
multi-head attention over a KV cache. Scores are scaled by mscale^2 / sqrt(qk_nope + qk_rope), mscale being
YaRN's magnitude with DeepSeek's ``mscale_all_dim`` (``rope.scaling.yarn_log_multiplier``, which the converter
stores times 0.1).

FFNs: the first ``leading_dense_block_count`` layers are dense SwiGLU; the others route each token to its
``expert_used_count`` best experts (softmax, or sigmoid with a selection bias in V3; renormalised and scaled as the
file says; V3 first keeps the ``expert_group_used_count`` best of ``expert_group_count`` groups) and add
``expert_shared_count`` shared experts every token takes. Multi-token-prediction layers (``nextn_predict_layers``,
V3's) load and never run: llama.cpp's main graph leaves them to its draft graph, and asks for their tensors only
where the file has their projection (a file without it holds the trunk alone).

References: DeepSeek-AI 2024, "DeepSeek-V2" and "DeepSeek-V3 Technical Report"; llama.cpp src/models/deepseek2.cpp.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar, Mapping

from gguf import MODEL_TENSOR as T
from gguf import Keys

from graphir.model.dsa import Sparse, indexer_layers, indexer_tensors, select_keys
from graphir.model.mla import decompressed_attention, latent_qkv
from graphir.model.moe import (MOE_KEYS, check_experts, gate_up, gate_up_problems, gate_up_tensors, nextn_layer,
                               trunk_layers)
from graphir.errors import MetadataError
from graphir.graph.ir import Node
from graphir.memory.layers import IndexerKeys, LatentAttention, LayerNeeds
from graphir.model.architecture import Architecture
from graphir.model.builder import Gating, GraphBuilder
from graphir.model.hparams import HParams, Key
from graphir.graph.floats import f32
from graphir.model.scales import layer_scales
from graphir.model.temperature import Temperature
from graphir.model.tensors import TensorDecl, TensorSpec, spec, swiglu_tensors, tensor_name
from graphir.model import hf_config, presets
from graphir.model.hf_config import BLOCKS, TEXT, VOCAB, Config, Family, derived, fixed, hf
from graphir.model.presets import Preset

L, A, R = Keys.LLM, Keys.Attention, Keys.Rope

# expert_gating_func, as llama.cpp numbers it
GATINGS = {1: Gating.SOFTMAX, 2: Gating.SIGMOID, 3: Gating.SOFTMAX_WEIGHT}


def _lite(n_layer: int, n_vocab: int) -> bool:
    """The sizes llama.cpp takes for the variants without a query compression (DeepSeek-V2-Lite and kin): it does
    not read ``q_lora_rank`` for them."""
    return n_layer in (26, 27) or (n_layer == 48 and n_vocab == 128256)


def _gating(hp: HParams, n_trunk: int) -> Gating:
    """The file's expert gating; absent, what llama.cpp takes for the files written before the key: sigmoid for
    GLM-4.7-Lite's sizes (of ``n_trunk`` layers before any prediction layer), softmax for DeepSeek-V2 and V2.5."""
    if hp.expert_gating_func:
        return GATINGS[hp.expert_gating_func]
    return Gating.SIGMOID if n_trunk in (47, 48) and hp.n_vocab == 154880 else Gating.SOFTMAX


def _mscale(factor: float, m: float) -> float:
    """YaRN's magnitude 0.1 m ln(s) + 1 (1 for s <= 1), in float32 as llama.cpp's get_mscale."""
    return 1.0 if factor <= 1.0 else f32(f32(f32(f32(0.1) * m) * f32(math.log(factor))) + 1.0)


class DeepSeek2(Architecture):
    name = "deepseek2"
    rope_mode = "norm"
    # YaRN's mscale taken equal to mscale_all_dim (llama.cpp's special case for deepseek2); False: mscale 1
    mscale_is_all_dim: ClassVar[bool] = True
    # the FFNs' and experts' per-tensor scales multiplied in (llama.cpp's deepseek32 graph; deepseek2's reads none)
    ffn_scales: ClassVar[bool] = False
    # sparse attention: each layer's lightning indexer picks the keys it attends to (graphir.model.dsa)
    sparse: ClassVar[Sparse | None] = None
    required_keys = (L.FEED_FORWARD_LENGTH, A.HEAD_COUNT, A.LAYERNORM_RMS_EPS, A.KV_LORA_RANK,
                     L.EXPERT_FEED_FORWARD_LENGTH, L.EXPERT_SHARED_COUNT)
    keys = MOE_KEYS + (
        Key("n_group_used", L.EXPERT_GROUP_USED_COUNT, int, 0, minimum=0),
        Key("n_layer_dense_lead", L.LEADING_DENSE_BLOCK_COUNT, int, 0, minimum=0),
        Key("n_lora_q", A.Q_LORA_RANK, int, 0, minimum=0),
        Key("n_lora_kv", A.KV_LORA_RANK, int, 0, minimum=1),
        Key("n_embd_head_k_mla", A.KEY_LENGTH_MLA, int, 0, minimum=0),
        Key("n_embd_head_v_mla", A.VALUE_LENGTH_MLA, int, 0, minimum=0),
        Key("n_ff_exp", L.EXPERT_FEED_FORWARD_LENGTH, int, 0, minimum=1),
        Key("n_expert_shared", L.EXPERT_SHARED_COUNT, int, 0, minimum=0),
        Key("expert_weights_scale", L.EXPERT_WEIGHTS_SCALE, float, 0.0),
        Key("expert_weights_norm", L.EXPERT_WEIGHTS_NORM, bool, False),
        Key("expert_gating_func", L.EXPERT_GATING_FUNC, int, 0, minimum=0),
        Key("rope_yarn_log_mul", R.SCALING_YARN_LOG_MUL, float, 0.0),  # as stored: 0.1 * mscale_all_dim
        Key("attn_temp_scale", A.TEMPERATURE_SCALE, float, 0.0),  # 0: no attention temperature tuning
        Key("attn_temp_length", A.TEMPERATURE_LENGTH, int, 0, minimum=0),  # its positions per step of the log
        Key("n_layer_nextn", L.NEXTN_PREDICT_LAYERS, int, 0, minimum=0),
    )

    def __init__(self, hp: HParams):
        key = lambda t: t.format(arch=self.name)  # noqa: E731
        if hp.attn_temp_scale and not hp.attn_temp_length:
            raise MetadataError(f"'{key(A.TEMPERATURE_SCALE)}' is set but '{key(A.TEMPERATURE_LENGTH)}' is not: "
                                f"attention temperature tuning needs both")
        # the prediction layers after the trunk are loaded, never run; llama.cpp sizes the variants by the trunk
        self.n_trunk = trunk_layers(hp, self.name)
        check_experts(hp, self.name, groups=True)
        if hp.n_layer_dense_lead < self.n_trunk and not hp.n_expert:
            raise MetadataError(f"layers {hp.n_layer_dense_lead}.. are mixtures of experts "
                                f"('{key(L.LEADING_DENSE_BLOCK_COUNT)}' = {hp.n_layer_dense_lead}) but "
                                f"'{key(L.EXPERT_COUNT)}' is 0")
        if bool(hp.n_embd_head_k_mla) != bool(hp.n_embd_head_v_mla):
            raise MetadataError(f"'{key(A.KEY_LENGTH_MLA)}' and '{key(A.VALUE_LENGTH_MLA)}' must both be set (the "
                                f"absorbed form) or both be absent (the legacy form)")
        if hp.expert_gating_func not in (0, *GATINGS):
            raise MetadataError(f"'{key(L.EXPERT_GATING_FUNC)}' = {hp.expert_gating_func}: not a gating graphir "
                                f"builds (1 softmax, 2 sigmoid, 3 softmax of the chosen)")
        self.mla = bool(hp.n_embd_head_k_mla)
        # the per-head sizes of queries and keys (no-position part + RoPE'd part) and of values, as if MHA
        self.d_k = hp.n_embd_head_k_mla if self.mla else hp.n_embd_head_k
        self.d_v = hp.n_embd_head_v_mla if self.mla else hp.n_embd_head_v
        self.d_nope = self.d_k - hp.n_rot
        self.q_lora = 0 if _lite(self.n_trunk, hp.n_vocab) and not self.sparse else hp.n_lora_q
        self.indexers = indexer_layers(self.sparse, hp, self.n_trunk, self.name) if self.sparse else ()
        if self.sparse and not self.mla:
            raise MetadataError(f"'{key(A.KEY_LENGTH_MLA)}' is missing: {self.name} is built in the absorbed MLA "
                                f"form only")
        if self.sparse and hp.n_rot > hp.indexer_head_size:
            raise MetadataError(f"'{key(R.DIMENSION_COUNT)}' = {hp.n_rot} RoPE'd values do not fit an indexer head "
                                f"of {hp.indexer_head_size} ('{key(Keys.Attention.Indexer.KEY_LENGTH)}')")
        if self.d_nope < 1:
            raise MetadataError(f"heads of {self.d_k} values ('{key(A.KEY_LENGTH_MLA if self.mla else A.KEY_LENGTH)}') "
                                f"leave no part without positions beside the {hp.n_rot} RoPE'd ones "
                                f"('{key(R.DIMENSION_COUNT)}')")
        if not self.mla and hp.head_count_kv(0) != hp.head_count(0):
            raise MetadataError(f"the legacy form (no '{key(A.KEY_LENGTH_MLA)}') decompresses K and V for every head, "
                                f"but '{key(A.HEAD_COUNT_KV)}' = {hp.head_count_kv(0)} of {hp.head_count(0)} heads")
        if self.mla and hp.n_embd_head_k * hp.head_count_kv(0) != hp.n_lora_kv + hp.n_rot:
            raise MetadataError(f"a latent row of {hp.n_lora_kv} + {hp.n_rot} values is one KV head of "
                                f"'{key(A.KEY_LENGTH)}' values, but the file has {hp.head_count_kv(0)} of "
                                f"{hp.n_embd_head_k}")
        super().__init__(hp)

    @classmethod
    def from_metadata(cls, label: str, metadata: Mapping[str, Any]) -> Architecture:
        """llama.cpp requires ``q_lora_rank`` of every variant but the Lite sizes (0 is a valid value: no
        compression; absence is not)."""
        arch = super().from_metadata(label, metadata)
        k = A.Q_LORA_RANK.format(arch=cls.name)
        if not (_lite(arch.n_trunk, arch.hp.n_vocab) and not cls.sparse) and k not in metadata:  # type: ignore[attr-defined]
            raise MetadataError(f"{label}: missing key '{k}'")
        return arch

    def layers(self) -> LayerNeeds:
        """Absorbed: one latent row per token (kv_lora_rank + n_rot values); legacy: per-head K and V."""
        hp = self.hp
        if self.sparse:  # and the indexer's keys where a layer runs its own indexer
            latent, keys = LatentAttention(hp.n_lora_kv + hp.n_rot), IndexerKeys(hp.indexer_head_size, hp.indexer_top_k)
            return tuple((latent, keys) if full else latent for full in self.indexers)
        if self.mla:
            return tuple(LatentAttention(hp.n_lora_kv + hp.n_rot) for _ in range(self.n_trunk))
        return super().layers()[:self.n_trunk]

    def moe_layer(self, il: int) -> bool:
        return il >= self.hp.n_layer_dense_lead

    def gating(self) -> Gating:
        if not self.hp.expert_gating_func and self.sparse and self.sparse.gating:
            return self.sparse.gating
        return _gating(self.hp, self.n_trunk)

    def check(self, tensors: Mapping[str, TensorDecl]) -> list[str]:
        """The table's checks, and each expert layer's gate and up stacks in one whole form (the table declares
        both forms optional)."""
        return super().check(tensors) + [p for il in range(self.n_trunk) if self.moe_layer(il)
                                         for p in gate_up_problems(tensors, il)]

    # ---- tensors ---------------------------------------------------------------------------------------

    def tensors(self) -> list[TensorSpec]:
        hp = self.hp
        E, V = hp.n_embd, hp.n_vocab
        specs = [spec(T.TOKEN_EMBD, (E, V)), spec(T.OUTPUT_NORM, (E,), kind="vector"),
                 spec(T.OUTPUT, (E, V), tied_to=tensor_name(T.TOKEN_EMBD))]
        for il in range(hp.n_layer):
            layer = [spec(T.ATTN_NORM, (E,), il, kind="vector"), *self.attn_tensors(il),
                     spec(T.FFN_NORM, (E,), il, kind="vector"), *self.ffn_tensors(il)]
            layer += layer_scales(layer, il, hp.n_expert)  # read: attention's output scale alone
            specs += layer if il < self.n_trunk else nextn_layer(layer, hp, il)
        return specs

    def attn_tensors(self, il: int) -> list[TensorSpec]:
        hp = self.hp
        E, H, R_kv, R_q = hp.n_embd, hp.head_count(il), hp.n_lora_kv, self.q_lora
        q = ([spec(T.ATTN_Q_A_NORM, (R_q,), il, kind="vector"), spec(T.ATTN_Q_A, (E, R_q), il),
              spec(T.ATTN_Q_B, (R_q, H * self.d_k), il)] if R_q else [spec(T.ATTN_Q, (E, H * self.d_k), il)])
        kv = [spec(T.ATTN_KV_A_NORM, (R_kv,), il, kind="vector"), spec(T.ATTN_KV_A_MQA, (E, R_kv + hp.n_rot), il)]
        if self.mla:
            kv += [spec(T.ATTN_K_B, (self.d_nope, R_kv, H), il), spec(T.ATTN_V_B, (R_kv, self.d_v, H), il)]
        else:
            kv += [spec(T.ATTN_KV_B, (R_kv, H * (self.d_nope + self.d_v)), il)]
        indexer = indexer_tensors(hp, il, self.sparse.optional) if self.sparse else []
        return q + kv + [spec(T.ATTN_OUT, (H * self.d_v, E), il)] + indexer

    def ffn_tensors(self, il: int) -> list[TensorSpec]:
        hp = self.hp
        E = hp.n_embd
        if not self.moe_layer(il):
            F = hp.ff_length(il)
            return swiglu_tensors(E, F, il)
        X, F, S = hp.n_expert, hp.n_ff_exp, hp.n_ff_exp * hp.n_expert_shared
        return [spec(T.FFN_GATE_INP, (E, X), il), spec(T.FFN_EXP_PROBS_B, (X,), il, "bias", kind="vector", optional=True),
                spec(T.FFN_DOWN_EXP, (F, E, X), il), *gate_up_tensors(E, F, X, il),
                spec(T.FFN_GATE_SHEXP, (E, S), il), spec(T.FFN_DOWN_SHEXP, (S, E), il), spec(T.FFN_UP_SHEXP, (E, S), il)]

    # ---- the scale of scores -------------------------------------------------------------------------------

    def rope_attn_factor(self) -> float:
        """The rope magnitude factor llama.cpp's context gives a deepseek2 model (cparams.yarn_attn_factor): with
        YaRN, mscale / mscale_all_dim's (llama.cpp takes mscale equal to mscale_all_dim for deepseek2, so 1 when
        ``yarn_log_multiplier`` is set; mscale 1 where ``mscale_is_all_dim`` is False; YaRN's own mscale when it
        is not set) divided by the magnitude ggml's rope multiplies in itself; times rope.scaling.attn_factor. The
        magnitude left is what kq_scale adds back."""
        hp = self.hp
        yaf = 1.0
        if hp.rope_scaling == "yarn":
            factor = f32(1.0 / hp.rope_freq_scale)
            m = self.log_mul()
            if not m:
                yaf = _mscale(factor, 1.0)
            else:
                yaf = 1.0 if self.mscale_is_all_dim else f32(_mscale(factor, 1.0) / _mscale(factor, m))
            yaf = f32(yaf * f32(1.0 / f32(1.0 + f32(f32(0.1) * f32(math.log(factor))))))
        return f32(yaf * hp.rope_attn_factor)

    def log_mul(self) -> float:
        """``rope.scaling.yarn_log_multiplier`` as llama.cpp uses it: the stored value divided by 0.1."""
        return f32(self.hp.rope_yarn_log_mul / f32(0.1)) if self.hp.rope_yarn_log_mul else 0.0

    def kq_scale(self) -> float:
        """mscale^2 / sqrt(d_k), mscale the original YaRN attention factor times 0.1 mscale_all_dim ln(s) + 1,
        in llama.cpp's float32 steps (1 / sqrt(d_k) without YaRN and attn_factor)."""
        ln = f32(math.log(f32(1.0 / self.hp.rope_freq_scale)))
        org = f32(self.rope_attn_factor() * f32(1.0 + f32(f32(0.1) * ln)))
        mscale = f32(org * f32(1.0 + f32(f32(f32(0.1) * self.log_mul()) * ln)))
        return f32(f32(mscale * mscale) / f32(math.sqrt(float(self.d_k))))

    # ---- graph -----------------------------------------------------------------------------------------

    def rope(self, b: GraphBuilder, x: Node, pos: Node, name: str) -> Node:
        return b.rope(x, pos, name=name, attn_factor=self.rope_attn_factor())

    def attention(self, b: GraphBuilder, h: Node, pos: Node, temperature: Node | None, il: int) -> Node:
        """MLA; queries times each token's ``temperature`` where the file tunes it (Mistral Large 3)."""
        hp, w = self.hp, b.w
        H, T_, R_kv, d_k, nope = hp.head_count(il), b.n_tokens, hp.n_lora_kv, self.d_k, self.d_nope
        if self.q_lora:
            q = b.linear(h, w(T.ATTN_Q_A, il), name="q_a")  # type: ignore[arg-type]
            q = b.norm(q, T.ATTN_Q_A_NORM, il, name="q_a_norm")
            selected = self.selection(b, h, q, pos, il)
            q = b.linear(q, w(T.ATTN_Q_B, il), name="q_proj")  # type: ignore[arg-type]
        else:
            q, selected = b.linear(h, w(T.ATTN_Q, il), name="q_proj"), None  # type: ignore[arg-type]
        q = b.reshape(q, (d_k, H, T_), name="q.heads")
        q_nope, q_pe, kv, k_pe = latent_qkv(b, h, q, pos, il, nope, self.rope)
        if self.mla:
            # each head's no-position query in latent space: [nope, T, H] through its [nope, R_kv] slice of k_b
            q_nope = b.op("permute", q_nope, axes=(0, 2, 1, 3), name="q_nope_perm")
            q_abs = b.op("mul_mat", w(T.ATTN_K_B, il), q_nope, name="q_nope_absorbed")  # type: ignore[arg-type]
            q_abs = b.op("permute", q_abs, axes=(0, 2, 1, 3), name="q_nope_absorbed_perm")
            q = b.op("concat", q_abs, q_pe, dim=0, name="Qcur")
            if temperature is not None:
                q = b.op("mul", q, temperature, name="Qcur_attn_temp_scaled")
            latent = b.reshape(kv, (R_kv, 1, T_), name="kv_cmpr.heads")
            k = b.op("concat", latent, k_pe, dim=0, name="Kcur")
            return b.build_attn_mla(q, k, latent, wo=w(T.ATTN_OUT, il), v_mla=w(T.ATTN_V_B, il),  # type: ignore[arg-type]
                                    kq_scale=self.kq_scale(), wo_s=b.w_opt(T.ATTN_OUT, il, "scale"),
                                    selected=selected)
        # legacy: K and V decompressed per head, the key part repeated to every head
        return decompressed_attention(b, q_nope, q_pe, kv, k_pe, il, self.d_v, self.kq_scale(), temperature)

    def selection(self, b: GraphBuilder, h: Node, qr: Node, pos: Node, il: int) -> Node | None:
        """Sparse attention's cells per token: the layer's own indexer's, or those of the last layer that ran
        one; None without sparse attention."""
        if not self.sparse:
            return None
        if self.indexers[il]:
            return select_keys(b, self.sparse, h, qr, pos, il, self.rope_attn_factor())
        return b.made(f"blk.{max(j for j in range(il) if self.indexers[j])}.top_k")

    def ffn(self, b: GraphBuilder, h: Node, il: int) -> Node:
        hp, w = self.hp, b.w

        def s(t: T) -> Node | None:  # a matrix's per-tensor scale, where the family's graph multiplies it in
            return b.w_opt(t, il, "scale") if self.ffn_scales else None
        if not self.moe_layer(il):
            return b.build_ffn(h, up=w(T.FFN_UP, il), gate=w(T.FFN_GATE, il), down=w(T.FFN_DOWN, il),  # type: ignore[arg-type]
                               up_s=s(T.FFN_UP), gate_s=s(T.FFN_GATE), down_s=s(T.FFN_DOWN))
        moe = b.build_moe_ffn(h, gate_inp=w(T.FFN_GATE_INP, il), **gate_up(b, il),  # type: ignore[arg-type]
                              down_exps=w(T.FFN_DOWN_EXP, il),  # type: ignore[arg-type]
                              n_expert=hp.n_expert, n_expert_used=hp.n_expert_used,
                              gating=self.gating(),
                              norm_w=hp.expert_weights_norm, w_scale=hp.expert_weights_scale,
                              probs_b=b.w_opt(T.FFN_EXP_PROBS_B, il, "bias"), n_groups=hp.n_expert_groups,
                              n_group_used=hp.n_group_used, up_exps_s=s(T.FFN_UP_EXP), gate_exps_s=s(T.FFN_GATE_EXP),
                              down_exps_s=s(T.FFN_DOWN_EXP))
        shared = b.build_ffn(h, up=w(T.FFN_UP_SHEXP, il), gate=w(T.FFN_GATE_SHEXP, il),  # type: ignore[arg-type]
                             down=w(T.FFN_DOWN_SHEXP, il), name="ffn_shexp", up_s=s(T.FFN_UP_SHEXP),  # type: ignore[arg-type]
                             gate_s=s(T.FFN_GATE_SHEXP), down_s=s(T.FFN_DOWN_SHEXP))
        return b.op("add", moe, shared, name="ffn_out")

    def build(self, b: GraphBuilder) -> None:
        hp = self.hp
        x = b.build_inp_embd(b.w(T.TOKEN_EMBD))  # type: ignore[arg-type]
        temperature = (b.build_inp_attn_scale(Temperature(hp.attn_temp_length, hp.attn_temp_scale, 0.0))
                       if hp.attn_temp_scale else None)
        pos = b.build_inp_pos()
        for il in b.layers(self.n_trunk):
            a = self.attention(b, b.norm(x, T.ATTN_NORM, il, name="attn_norm"), pos, temperature, il)
            a, x = b.last_layer_rows((a, "attn_out.rows"), (x, "inp.rows"))
            x = b.op("add", a, x, name="ffn_inp")
            f = self.ffn(b, b.norm(x, T.FFN_NORM, il, name="ffn_norm"), il)
            x = b.op("add", f, x, name="l_out")
        b.build_output(b.norm(x, T.OUTPUT_NORM, name="result_norm"), b.w(T.OUTPUT))


# ---- Hugging Face: what convert_hf_to_gguf writes for DeepSeek-V2 and -V3 configs ------------------------

EXPERT_STACKS = r"blk\.\d+\.ffn_(gate|up)_exps\.weight"  # the converter writes the two, not the fused stack


def _dense_lead(c: Config) -> int:
    """first_k_dense_replace; absent: every layer dense without experts, none with them."""
    moe = c.find("n_routed_experts", kind="size", default=None) is not None
    return c.find("first_k_dense_replace", kind="size", default=0 if moe else c.find(*BLOCKS))


def _mla(c: Config) -> dict[str, Any]:
    """MLA absorbed as the converter writes it: one KV head of kv_lora_rank + RoPE values, the per-head sizes as the
    *_length_mla keys."""
    kv_lora, rope = c.find("kv_lora_rank", default=512), c.find("qk_rope_head_dim")
    return {A.KV_LORA_RANK: kv_lora, A.KEY_LENGTH: kv_lora + rope, A.VALUE_LENGTH: kv_lora,
            A.KEY_LENGTH_MLA: c.find("qk_nope_head_dim") + rope, A.VALUE_LENGTH_MLA: c.find("v_head_dim")}


def _yarn_log_mul(c: Config) -> float | None:
    """mscale_all_dim, stored times 0.1 (the converter's legacy scale for DeepSeek-V2)."""
    m = c.rope_value(c.rope, "mscale_all_dim", default=None)
    return None if m is None else 0.1 * m


def _optional_written(c: Config) -> str:
    """The experts' gate and up stacks (one each), and the selection bias of sigmoid routing
    (e_score_correction_bias)."""
    bias = c.find("topk_method", kind="text", default="") == "noaux_tc"
    return EXPERT_STACKS + (r"|blk\.\d+\.exp_probs_b\.bias" if bias else "")


RULES = TEXT + (
    fixed(A.HEAD_COUNT_KV, 1),  # MLA is written as multi-query attention
    derived(L.LEADING_DENSE_BLOCK_COUNT, _dense_lead),
    VOCAB,
    hf(A.Q_LORA_RANK, "q_lora_rank", default=None),
    _mla,
    hf(L.EXPERT_FEED_FORWARD_LENGTH, "moe_intermediate_size", "intermediate_size"),
    hf(L.EXPERT_SHARED_COUNT, "n_shared_experts", kind="size", default=0),
    hf(L.EXPERT_WEIGHTS_SCALE, "routed_scaling_factor", kind="number", default=None),
    derived(L.EXPERT_WEIGHTS_NORM, lambda c: c.find("norm_topk_prob", kind="flag", default=False) or None),
    hf(R.DIMENSION_COUNT, "qk_rope_head_dim"),
    derived(R.SCALING_YARN_LOG_MUL, _yarn_log_mul),
)
DEFAULTS = {"tie_word_embeddings": False, "rms_norm_eps": 1e-6}
hf_config.register(Family("deepseek2", RULES, DEFAULTS, _optional_written, tie_drops_head=True),
                   "DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM")


# ---- presets: released models of this family, as their converted GGUFs declare them ---------------------



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
    }, tied=False, include=EXPERT_STACKS + (r"|blk\.\d+\.exp_probs_b\.bias" if selection_bias else ""),
        f32=presets.ROUTER_F32, source=source)


presets.register({
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
})
