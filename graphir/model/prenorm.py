"""The pre-norm decoder many families share, its variants as data: each layer ``x += attn(norm(x))`` then
``x += ffn(norm(x))``, a final norm and an LM head.

llama.cpp writes each of these families as a file of its own (src/models/<family>.cpp), and the files differ by
a norm, a bias, where a QK-norm sits, which tensors the loader creates and which of them the graph reads: the
family states those as a :class:`Traits` record on a subclass of :class:`PreNormDecoder` and names nothing else.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import partial
from typing import ClassVar, Mapping

from gguf import MODEL_TENSOR as T
from gguf import Keys

from graphir.errors import MetadataError
from graphir.graph.floats import f32, inv_sqrt
from graphir.graph.ir import Node
from graphir.model.architecture import Architecture
from graphir.model.builder import Act, GraphBuilder, Norm, yarn_attn_factor
from graphir.model.hparams import HParams, Key
from graphir.memory.layers import LayerNeeds
from graphir.model.moe import check_experts, nextn_layer, trunk_layers
from graphir.model.presets import Preset
from graphir.model.qkv import check_whole_heads, fused_or_split_qkv_tensors, qk_norm_tensors, qkv_tensors
from graphir.model.rope_factors import long_context, longrope, rope_factor_tensors, rope_factors
from graphir.model.scales import layer_scales
from graphir.model.temperature import Temperature
from graphir.model.tensors import TensorSpec, spec, tensor_name

# What a family's loader does with an optional tensor, and whether its graph reads it.
ABSENT, UNREAD, READ, REQUIRED = "absent", "unread", "read", "required"


@dataclass(frozen=True)
class Traits:
    """What one family changes in the pre-norm decoder, each a line or two of its llama.cpp file."""

    norm: Norm = Norm.RMS  # LAYER: LayerNorms, each with its bias (Orion)
    norm_weights: bool = True  # False: the norms have no parameters at all (OLMo's LayerNorms)
    tied_head: bool = True  # output.weight may be absent, the token embedding serving (else it is required)
    embd_from_head: bool = False  # the other way round: token_embd may be absent, output.weight serving (CodeShell)
    rope_freqs: str = ABSENT  # Llama-3.1's per-dimension RoPE divisors: optional, read by the graph or not
    longrope: bool = False  # a LongRoPE file's divisors are its long and short sets instead (the long past
    #                         the trained context per sequence)
    wo_bias: str = ABSENT  # the output projection's bias: absent, optional (read or not), or required
    qk_norm_after_rope: bool = False  # each head of Q and K RMS-normalised after RoPE, with a learned scale
    ffn_bias: str = ABSENT  # the FFN's biases: absent, optional and unread (Refact), optional and read (Mistral 3,
    #                         Nemotron), or required and read (StarCoder 2)
    ffn_scales: bool = False  # the FFN's matrices times their per-tensor scales, where the file has them (Mistral 3)
    ffn_act: Act = Act.SILU  # RELU_SQR: an ungated FFN, relu(up x) squared
    ffn_norm: T = T.FFN_NORM  # the FFN's norm as the file names it (Seed-OSS: attn_post_norm)
    parallel: bool = False  # the FFN reads the attention's norm too, and x += ffn + attn at once (PLaMo)
    post_norms: bool = False  # the attention's and the FFN's outputs normalised before each residual add (GLM-4)
    mrope: bool = False  # a file with time and height RoPE sections rotates by M-RoPE (GLM-4.1V's text model; the
    #                      family's keys hold ROPE_SECTIONS)
    nextn: bool = False  # the file's last nextn_predict_layers layers are multi-token prediction, required as the
    #                      loader asks for them, never run (GLM-OCR; the family's keys hold NEXTN_KEY)
    fused_qkv: str = ABSENT  # REQUIRED: one attn_qkv and its bias (Jais); READ: that or Q, K, V apart, as llama.cpp's
    #                          create_tensor_qkv takes either (ChatGLM)
    qkv_model_widths: bool = False  # the required attn_qkv is three model widths whatever the heads (Qwen 1's loader)
    ffn_fused: bool = False  # SwiGLU over the two halves of one ffn_up of twice the width (ChatGLM)
    ffn_halved: bool = False  # the gated FFN's width is half of feed_forward_length (Qwen 1)
    clamp_kqv: bool = False  # Q, K and V clamped to [-c, c] where the file's CLAMP_KQV key sets c > 0 (OLMo)
    whole_heads: bool = False  # a file whose RoPE turns less than a whole head is refused (llama.cpp's graph asserts
    #                            n_rot == head size: CodeShell, OLMo, PLaMo, Jais 2)
    kq_scale_d: bool = False  # scores scaled by 1/d, not 1/sqrt(d), for heads of d (Jais: muP)
    rope: bool = True  # False: Q and K are never rotated (positions enter through ALiBi only: Refact)
    rope_at_n_layer: int = 0  # only a model of this many layers rotates Q and K (Baichuan 7B); 0: every model
    ntk_alpha: bool = False  # the RoPE base raised by the file's NTK_ALPHA key (Hunyuan's XDRoPE)
    attn_temperature: bool = False  # queries scaled by Llama 4's temperature when the file's ATTN_TEMP key is set
    yarn_keys: bool = False  # YaRN's ramp and magnitude from the file's YARN_KEYS (else llama.cpp's defaults)
    experts: bool = False  # with expert_count > 0, every FFN a mixture of experts of feed_forward_length, their gates
    #                        optional, softmax-routed and renormalised (Mistral 3's MoE form; the keys hold MOE_KEYS)


# Hunyuan's NTK-aware RoPE: with alpha > 0 the base becomes base * alpha^(d / (d - 2)) for heads of d values
NTK_ALPHA = Key("rope_scaling_alpha", Keys.Rope.SCALING_ALPHA, float, 0.0)
# Llama 4's attention temperature (Ministral 3): 0, none; else each token's queries are scaled by
# log(floor(pos / n_ctx_orig) + 1) * scale + 1
ATTN_TEMP = Key("attn_temp_scale", Keys.Attention.TEMPERATURE_SCALE, float, 0.0)
# M-RoPE's sections of the rotated pairs (time, height, width, extra), where a family's file may give them
ROPE_SECTIONS = Key("rope_sections", Keys.Rope.DIMENSION_SECTIONS, tuple, (), count=4)
# YaRN's ramp (llama.cpp's defaults 32 and 1) and the magnitude of all dimensions (0: none), as Mistral 3 reads them
YARN_KEYS = (Key("yarn_beta_fast", Keys.Rope.SCALING_YARN_BETA_FAST, float, 32.0),
             Key("yarn_beta_slow", Keys.Rope.SCALING_YARN_BETA_SLOW, float, 1.0),
             Key("rope_yarn_log_mul", Keys.Rope.SCALING_YARN_LOG_MUL, float, 0.0))


class PreNormDecoder(Architecture):
    """A family of the pre-norm decoder: set ``name``, ``rope_mode``, ``required_keys`` and ``traits`` (and
    ``keys``, which hold NTK_ALPHA, ATTN_TEMP and YARN_KEYS where the traits read them)."""

    traits: ClassVar[Traits] = Traits()

    def __init__(self, hp: HParams):
        t = self.traits
        if t.whole_heads:
            check_whole_heads(hp, self.name)
        if t.attn_temperature and hp.attn_temp_scale and not hp.n_ctx_orig_yarn:
            raise MetadataError(f"an attention temperature needs the original context length (key "
                                f"'{Keys.Rope.SCALING_ORIG_CTX_LEN.format(arch=self.name)}' is 0)")
        if t.ntk_alpha and hp.rope_scaling_alpha > 0:  # float32 steps, as llama.cpp's loader raises the base
            d = hp.n_embd_head_k
            scale = f32(math.pow(hp.rope_scaling_alpha, f32(d / (d - 2))))
            hp = replace(hp, rope_freq_base=f32(hp.rope_freq_base * scale))
        if t.experts:
            check_experts(hp, self.name)
        super().__init__(hp)
        self.n_trunk = trunk_layers(hp, self.name) if t.nextn else hp.n_layer  # the layers the graph runs
        sections = dict(hp.family).get("rope_sections") if t.mrope else None
        self.sections = tuple(sections) if sections and sections[0] and sections[1] else None
        if self.sections:
            self.rope_mode = "mrope"  # type: ignore[misc]  # the file decides, as llama.cpp's rope type
        elif t.mrope and self.rope_mode == "mrope":  # a family that always turns by M-RoPE (PaddleOCR-VL's)
            raise MetadataError(f"a '{self.name}' model turns by M-RoPE: key "
                                f"'{Keys.Rope.DIMENSION_SECTIONS.format(arch=self.name)}' must give time and height "
                                f"sections")

    def layers(self) -> LayerNeeds:
        return super().layers()[:self.n_trunk]

    @property
    def n_expert(self) -> int:
        """The experts of every FFN (0: dense FFNs)."""
        return self.hp.n_expert if self.traits.experts else 0

    @property
    def n_ff(self) -> int:
        return self.hp.n_ff // 2 if self.traits.ffn_halved else self.hp.n_ff

    @property
    def ropes(self) -> bool:
        at = self.traits.rope_at_n_layer
        return self.traits.rope and (not at or self.hp.n_layer == at)

    def tensors(self) -> list[TensorSpec]:
        hp, t = self.hp, self.traits
        E, F, V = hp.n_embd, self.n_ff, hp.n_vocab
        norm = partial(_norm_tensors, E=E, bias=t.norm is Norm.LAYER) if t.norm_weights else lambda *_: []
        specs = [spec(T.TOKEN_EMBD, (E, V), tied_to=tensor_name(T.OUTPUT) if t.embd_from_head else None),
                 *norm(T.OUTPUT_NORM, None),
                 spec(T.OUTPUT, (E, V), tied_to=tensor_name(T.TOKEN_EMBD) if t.tied_head else None)]
        if t.rope_freqs != ABSENT:
            specs += rope_factor_tensors(hp, long_short=t.longrope and longrope(hp))
        for il in range(hp.n_layer):
            layer = [*norm(T.ATTN_NORM, il), *self._attention_tensors(il),
                     *(norm(t.ffn_norm, il) if not t.parallel else ()),
                     *(norm(T.ATTN_POST_NORM, il) + norm(T.FFN_POST_NORM, il) if t.post_norms else ())]
            if self.n_expert:
                X = self.n_expert
                layer += [spec(T.FFN_GATE_INP, (E, X), il), spec(T.FFN_GATE_EXP, (E, F, X), il, optional=True),
                          spec(T.FFN_DOWN_EXP, (F, E, X), il), spec(T.FFN_UP_EXP, (E, F, X), il)]
            else:
                layer += [spec(T.FFN_UP, (E, 2 * F if t.ffn_fused else F), il), spec(T.FFN_DOWN, (F, E), il)]
                if T.FFN_GATE in self.ffn_roles and not t.ffn_fused:
                    layer.append(spec(T.FFN_GATE, (E, F), il))
                if t.ffn_bias != ABSENT:
                    layer += [spec(m, (E if m is T.FFN_DOWN else F,), il, "bias", kind="vector",
                                   optional=t.ffn_bias != REQUIRED) for m in self.ffn_roles]
            layer += layer_scales(layer, il, self.n_expert)
            specs += layer if il < self.n_trunk else nextn_layer(layer, hp, il, required=True)
        return specs

    def variant(self, n_ctx_seq: int) -> bool | None:
        """A LongRoPE model read by the graph: whether a context of n_ctx_seq cells per sequence takes the long
        factors (llama.cpp's get_rope_factors); None for the others, whose graph no context changes."""
        if self.traits.rope_freqs == READ and self.traits.longrope and longrope(self.hp):
            return long_context(self.hp, n_ctx_seq)
        return None

    def _rope_factors(self, b: GraphBuilder) -> Node | None:
        return rope_factors(b) if self.traits.rope_freqs == READ else None

    def _yarn(self) -> dict[str, float]:
        """The rope's YaRN parameters where the family reads them from the file (llama.cpp's context uses them)."""
        hp = self.hp
        if not self.traits.yarn_keys:
            return {}
        factor = yarn_attn_factor(hp.rope_freq_scale, hp.rope_attn_factor, hp.rope_yarn_log_mul) \
            if hp.rope_scaling == "yarn" else hp.rope_attn_factor
        return dict(beta_fast=hp.yarn_beta_fast, beta_slow=hp.yarn_beta_slow, attn_factor=factor)

    def _attention_tensors(self, il: int) -> list[TensorSpec]:
        hp, t = self.hp, self.traits
        E = hp.n_embd
        if t.fused_qkv == REQUIRED:
            W = 3 * E if t.qkv_model_widths else E + hp.n_embd_k_gqa_at(il) + hp.n_embd_v_gqa_at(il)
            out = [spec(T.ATTN_QKV, (E, W), il), spec(T.ATTN_QKV, (W,), il, "bias", kind="vector"),
                   spec(T.ATTN_OUT, (E, E), il)]
        elif t.fused_qkv == READ:
            out = [*fused_or_split_qkv_tensors(hp, il), spec(T.ATTN_OUT, (hp.head_count(il) * hp.n_embd_head_v, E), il)]
        else:
            out = qkv_tensors(hp, il)
        if t.wo_bias != ABSENT:
            out.append(spec(T.ATTN_OUT, (E,), il, "bias", kind="vector", optional=t.wo_bias != REQUIRED))
        if t.qk_norm_after_rope:
            out += qk_norm_tensors(hp, il)
        return out

    def build(self, b: GraphBuilder) -> None:
        hp, t = self.hp, self.traits
        x = b.build_inp_embd(b.w(T.TOKEN_EMBD))
        pos = b.build_inp_pos() if self.ropes else None
        temp = b.build_inp_attn_scale(Temperature(hp.n_ctx_orig_yarn, hp.attn_temp_scale, 0.0)) \
            if t.attn_temperature and hp.attn_temp_scale else None
        # none of these families reads attention.scale
        kq_scale = f32(1.0 / hp.n_embd_head_k) if t.kq_scale_d else inv_sqrt(hp.n_embd_head_k)
        for il in b.layers(self.n_trunk):
            h = self._norm(b, x, T.ATTN_NORM, il, name="attn_norm")
            # self-attention
            q, k, v = b.build_qkv(h, il, clamp=hp.clamp_kqv if t.clamp_kqv else 0.0)
            if pos is not None:
                factors, yarn = self._rope_factors(b), self._yarn()
                q = b.rope(q, pos, factors, name="Qcur.rope", sections=self.sections, **yarn)
                k = b.rope(k, pos, factors, name="Kcur.rope", sections=self.sections, **yarn)
            if temp is not None:
                q = b.op("mul", q, temp, name="Qcur_attn_temp_scaled")
            if t.qk_norm_after_rope:
                q = b.norm(q, T.ATTN_Q_NORM, il, name="Qcur_normed")
                k = b.norm(k, T.ATTN_K_NORM, il, name="Kcur_normed")
            wo_b = b.w_opt(T.ATTN_OUT, il, "bias") if t.wo_bias in (READ, REQUIRED) else None
            a = b.build_attn(q, k, v, wo=b.w(T.ATTN_OUT, il), wo_b=wo_b, wo_s=b.scale(T.ATTN_OUT, il),
                             kq_scale=kq_scale)
            if t.parallel:  # the FFN of the same norm, both branches joining the stream together
                a, x, h = b.last_layer_rows((a, "attn_out.rows"), (x, "inp.rows"), (h, "ffn_inp.rows"))
                x = b.op("add", b.op("add", self._ffn(b, h, il), a, name="ffn_attn"), x, name="l_out")
                continue
            a, x = b.last_layer_rows((a, "attn_out.rows"), (x, "inp.rows"))
            if t.post_norms:
                a = self._norm(b, a, T.ATTN_POST_NORM, il, name="attn_post_norm")
            x = b.op("add", a, x, name="ffn_inp")
            # feed-forward network
            h = self._norm(b, x, t.ffn_norm, il, name="ffn_norm")
            f = self._ffn(b, h, il)
            if t.post_norms:
                f = self._norm(b, f, T.FFN_POST_NORM, il, name="ffn_post_norm")
            x = b.op("add", f, x, name="l_out")
        x = self._norm(b, x, T.OUTPUT_NORM, None, name="result_norm")
        b.build_output(x, b.w(T.OUTPUT))

    def _norm(self, b: GraphBuilder, x: Node, tensor: T, il: int | None, *, name: str) -> Node:
        if self.traits.norm_weights:
            return b.norm(x, tensor, il, self.traits.norm, name=name)
        return b.build_norm(x, None, None, self.traits.norm, name=name)

    def _ffn(self, b: GraphBuilder, h: Node, il: int) -> Node:
        t, s = self.traits, b.scale
        if self.n_expert:
            return b.build_moe_ffn(h, gate_inp=b.w(T.FFN_GATE_INP, il), up_exps=b.w(T.FFN_UP_EXP, il),
                                   gate_exps=b.w_opt(T.FFN_GATE_EXP, il), down_exps=b.w(T.FFN_DOWN_EXP, il),
                                   n_expert=self.n_expert, n_expert_used=self.hp.n_expert_used, norm_w=True,
                                   up_exps_s=s(T.FFN_UP_EXP, il), gate_exps_s=s(T.FFN_GATE_EXP, il),
                                   down_exps_s=s(T.FFN_DOWN_EXP, il))
        if t.ffn_fused:
            return b.build_ffn_fused_swiglu(h, il)
        gate = b.w(T.FFN_GATE, il) if T.FFN_GATE in self.ffn_roles else None
        roles = (T.FFN_UP, T.FFN_GATE, T.FFN_DOWN)
        up_b, gate_b, down_b = (b.w_opt(m, il, "bias") if m in self.ffn_roles and t.ffn_bias in (READ, REQUIRED)
                                else None for m in roles)
        up_s, gate_s, down_s = (b.scale(m, il) if m in self.ffn_roles and t.ffn_scales else None for m in roles)
        return b.build_ffn(h, up=b.w(T.FFN_UP, il), gate=gate, down=b.w(T.FFN_DOWN, il), up_b=up_b, gate_b=gate_b,
                           down_b=down_b, up_s=up_s, gate_s=gate_s, down_s=down_s, act=t.ffn_act)

    @property
    def ffn_roles(self) -> tuple[T, ...]:
        """The FFN's matrices: up and down, and a gate for a gated (SiLU) one."""
        return (T.FFN_GATE, T.FFN_UP, T.FFN_DOWN) if self.traits.ffn_act is Act.SILU else (T.FFN_UP, T.FFN_DOWN)


def _norm_tensors(t: T, il: int | None, E: int, bias: bool) -> list[TensorSpec]:
    out = [spec(t, (E,), il, kind="vector")]
    return out + [spec(t, (E,), il, "bias", kind="vector")] if bias else out


RMS_KEYS = (Keys.LLM.FEED_FORWARD_LENGTH, Keys.Attention.HEAD_COUNT, Keys.Attention.LAYERNORM_RMS_EPS)
LAYER_NORM_KEYS = (Keys.LLM.FEED_FORWARD_LENGTH, Keys.Attention.HEAD_COUNT, Keys.Attention.LAYERNORM_EPS)


def synthetic(arch: str, source: str, eps: str = Keys.Attention.LAYERNORM_RMS_EPS, include: str = "",
              keys: Mapping[str, object] | None = None) -> Preset:
    """A tiny header (four layers of 256, two heads, a vocabulary of 128), the golden graphs of a family for which no
    released model's config is known here for certain; ``source`` says so. ``eps``: the key of its norms' epsilon
    (LAYERNORM_EPS for a family of LayerNorms); ``include``: the optional tensors it holds; ``keys``: its own."""
    L, A = Keys.LLM, Keys.Attention
    return Preset(arch, {L.CONTEXT_LENGTH: 256, L.EMBEDDING_LENGTH: 256, L.BLOCK_COUNT: 4, L.FEED_FORWARD_LENGTH: 384,
                         A.HEAD_COUNT: 2, A.HEAD_COUNT_KV: 2, eps: 1e-5, L.VOCAB_SIZE: 128, **(keys or {})},
                  tied=False, include=include, source=source)
