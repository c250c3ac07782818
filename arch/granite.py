"""IBM Granite 3 (granite), MiniCPM (minicpm: the same graph), Granite's sliding-window form (granite_swa) and
the Granite 4.0 hybrids (granitehybrid): Mamba-2 layers and attention layers in one decoder.

Granite 3 is a pre-RMSNorm decoder, each layer ``x += r * attn(norm(x))`` then ``x += r * ffn(norm(x))``: its four
multipliers scale the token embeddings (``embedding_scale``), both residual branches (``residual_scale``, r), the
attention scores (``attention.scale`` replaces 1/sqrt(head size)) and, as a divisor, the logits (``logit_scale``,
required). Attention is RoPE'd unless ``rope.scaling.finetuned`` is false; the FFN is a SwiGLU, or with
``expert_count`` > 0 a mixture of experts (each token through its top ``expert_used_count``, softmax weights
renormalised) plus, when ``expert_shared_feed_forward_length`` > 0, a shared SwiGLU expert every token takes,
ungated. Q, K and V come as one fused projection or three, as llama.cpp's loader takes them. MiniCPM builds the
same graph from llama.cpp's defaults where a file lacks the keys (embeddings times 12, residuals times
1.4 / sqrt(n_layer), logits divided by 256 / n_embd), always RoPE'd, scores by 1/sqrt(head size).

The sliding-window form (granite_swa) attends over a window on the layers ``attention.sliding_window_pattern`` (an
array) marks and globally on the others, each head's softmax with a learned sink logit; a layer ropes where
``attention.rope_pattern`` says (every layer when the file lacks it); its experts' gate and up stacks may be one
fused stack, and its shared expert's gate and up are one matrix ``ffn_up_shexp`` split in halves.

In a hybrid, a layer whose ``attention.head_count_kv`` entry is 0 is a Mamba-2 block (arch/mamba.py), the others
Granite's attention (Granite 4.0-H has no positions at all); every layer then has Granite's FFN, dense
(Granite-4.0-H-Micro) or with experts (Granite-4.0-H-Tiny and -Small). The memory holds a KV cache for the
attention layers and state cells for the others (the ``hybrid`` kind).
References: IBM 2024, "Granite 3.0 Language Models"; Hu et al. 2024, "MiniCPM"; IBM 2025, "Granite 4.0"; llama.cpp
src/models/granite.cpp, minicpm.cpp, granite-swa.cpp, granite-hybrid.cpp.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, ClassVar

from gguf import MODEL_TENSOR as T
from gguf import Keys

from graphir.errors import MetadataError
from graphir.graph.ir import Node
from graphir.memory.layers import LayerNeeds
from graphir.model import ssm
from graphir.model.architecture import Architecture
from graphir.model.builder import GraphBuilder
from graphir.model.hparams import HParams, Key, SlidingWindow
from graphir.graph.floats import f32
from graphir.model.moe import MOE_KEYS, check_experts, gate_up, gate_up_tensors
from graphir.model.qkv import fused_or_split_qkv_tensors
from graphir.model.rope_factors import long_context, longrope, rope_factor_tensors, rope_factors
from graphir.model.tensors import TensorSpec, scales, spec, tensor_name
from graphir.model import presets
from graphir.model.presets import Preset
from graphir.model import hf_config
from graphir.model.hf_config import BLOCKS, TEXT, TEXT_BASE, VOCAB, WIDTH, Config, Family, heads, derived, hf

# Granite's multipliers, as llama.cpp's granite loaders read them
MULTIPLIERS = (
    Key("logit_scale", Keys.LLM.LOGIT_SCALE, float, 0.0),  # 0: none (a hybrid's; required of Granite 3)
    Key("residual_scale", Keys.LLM.RESIDUAL_SCALE, float, 0.0),
    Key("embedding_scale", Keys.LLM.EMBEDDING_SCALE, float, 0.0),
)
SHARED_EXPERT = Key("n_ff_shexp", Keys.LLM.EXPERT_SHARED_FEED_FORWARD_LENGTH, int, 0, minimum=0)  # 0: none
# Granite 3's switch for RoPE (rope.scaling.finetuned), its experts and shared expert
GRANITE_KEYS = (*MULTIPLIERS, Key("rope_finetuned", Keys.Rope.SCALING_FINETUNED, bool, True), *MOE_KEYS, SHARED_EXPERT)
DEEPSTACK = "{arch}.deepstack_mapping"  # Granite Vision's projector streams (llama.cpp's LLM_KV_DEEPSTACK_MAPPING)
ROPE_PATTERN = "{arch}.attention.rope_pattern"  # granite_swa's layers that rope (LLM_KV_ATTENTION_ROPE_PATTERN)


@dataclass(frozen=True)
class Traits:
    """What MiniCPM's and the hybrids' reading of Granite's graph changes."""

    # Mamba-2 layers where head_count_kv is 0 (granitehybrid): then a logit_scale of 0 leaves the logits as they
    # are, the positions input is there even where no layer ropes, and rope_freqs is the only factor vector
    hybrid: bool = False
    # MiniCPM: the multipliers a file leaves out take llama.cpp's defaults (embeddings times 12, residuals times
    # 1.4 / sqrt(n_layer), logits divided by 256 / n_embd), attention.scale is not read, and every layer ropes
    minicpm_defaults: bool = False
    # Granite 3 (and the hybrids) read rope.scaling.finetuned as a switch for RoPE; MiniCPM and Granite's
    # mixtures of experts rope every layer whatever a file says
    rope_switch: bool = True
    # granite_swa: attention sinks in every layer, RoPE per layer as attention.rope_pattern says (absent: every
    # layer), the experts' gate and up in either of llama.cpp's forms and the shared expert's fused into ffn_up_shexp
    windowed: bool = False


class Granite(Architecture):
    """Granite 3's decoder as llama.cpp's src/models/granite.cpp builds it; minicpm and granitehybrid are data."""

    name = "granite"
    rope_mode = "norm"  # the converter (a LlamaModel) permuted Q/K rows so that adjacent pairs rotate
    required_keys = (Keys.LLM.FEED_FORWARD_LENGTH, Keys.Attention.HEAD_COUNT, Keys.Attention.LAYERNORM_RMS_EPS,
                     Keys.LLM.LOGIT_SCALE)
    keys = GRANITE_KEYS + (Key("deepstack", DEEPSTACK, tuple, (), minimum=-1, count=-1),)
    traits: ClassVar[Traits] = Traits()

    def __init__(self, hp: HParams):
        t = self.traits
        check_experts(hp, self.name)
        if t.hybrid:
            ssm.check_mamba2(hp)
        given = dict(hp.family)
        if any(i >= 0 for i in given.pop("deepstack", ())):  # llama.cpp's saver writes 512 entries of -1: none
            raise MetadataError(f"key '{DEEPSTACK.format(arch=self.name)}' feeds projector embeddings into layers: "
                                f"graphir takes token input only")
        if t.minicpm_defaults:
            defaults = {"logit_scale": f32(256.0 / hp.n_embd), "embedding_scale": 12.0,
                        "residual_scale": f32(f32(1.4) / f32(math.sqrt(hp.n_layer)))}
            given = {**{k: defaults[k] if given.get(k) is None else v for k, v in given.items()}, "n_ff_shexp": 0}
        hp = replace(hp, family=tuple(given.items()), attn_scale=0.0 if t.minicpm_defaults else hp.attn_scale)
        if not (t.hybrid or hp.logit_scale):
            raise MetadataError(f"key '{Keys.LLM.LOGIT_SCALE.format(arch=self.name)}' is 0: the logits are divided "
                                f"by it")
        super().__init__(hp)

    def variant(self, n_ctx_seq: int) -> bool:
        """Under LongRoPE, whether a context of n_ctx_seq cells per sequence takes the long factors."""
        return not self.traits.hybrid and longrope(self.hp) and long_context(self.hp, n_ctx_seq)

    def recurrent(self, il: int) -> bool:
        """Whether layer il is a Mamba-2 block: a hybrid's layer without KV heads."""
        return self.traits.hybrid and self.hp.head_count_kv(il) == 0

    @property
    def roped(self) -> bool:
        """Whether any layer ropes (the positions input is built)."""
        return any(self.ropes(il) for il in range(self.hp.n_layer))

    def ropes(self, il: int) -> bool:
        if self.traits.windowed:  # llama.cpp's has_rope: an entry of 0 turns layer il's RoPE off
            pattern = self.hp.rope_pattern
            return il >= len(pattern) or pattern[il] != 0
        return not self.traits.rope_switch or self.hp.rope_finetuned

    def layers(self) -> LayerNeeds:
        hp, attention = self.hp, super().layers()
        return tuple(ssm.recurrent_state(hp, ssm.mamba2_conv_dim(hp)) if self.recurrent(il) else attention[il]
                     for il in range(hp.n_layer))

    # ---- tensors -----------------------------------------------------------------------------------------

    def tensors(self) -> list[TensorSpec]:
        hp = self.hp
        E, V = hp.n_embd, hp.n_vocab
        specs = [spec(T.TOKEN_EMBD, (E, V)), spec(T.OUTPUT_NORM, (E,), kind="vector"),
                 spec(T.OUTPUT, (E, V), tied_to=tensor_name(T.TOKEN_EMBD)),
                 *rope_factor_tensors(hp, False if self.traits.hybrid else None)]
        for il in range(hp.n_layer):
            specs += [spec(T.ATTN_NORM, (E,), il, kind="vector"),
                      *(ssm.mamba2_tensors(hp, il) if self.recurrent(il) else self.attn_tensors(il)),
                      spec(T.FFN_NORM, (E,), il, kind="vector"),
                      *(self.moe_tensors(il) if hp.n_expert else self.ffn_tensors(il))]
        return specs

    def attn_tensors(self, il: int) -> list[TensorSpec]:
        """Grouped-query attention's projections (Q, K and V fused or apart), each with an optional bias and scale;
        the sliding-window form's sinks."""
        hp = self.hp
        E = hp.n_embd
        sinks = [spec(T.ATTN_SINKS, (hp.head_count(il),), il, kind="vector")] if self.traits.windowed else []
        return [*fused_or_split_qkv_tensors(hp, il), spec(T.ATTN_OUT, (hp.head_count(il) * hp.n_embd_head_v, E), il),
                spec(T.ATTN_OUT, (E,), il, "bias", kind="vector", optional=True), *sinks,
                *(s for t in (T.ATTN_QKV, T.ATTN_Q, T.ATTN_K, T.ATTN_V, T.ATTN_OUT) for s in scales(t, il))]

    def ffn_tensors(self, il: int) -> list[TensorSpec]:
        """The dense SwiGLU FFN, each matrix with an optional bias and scale."""
        E, F = self.hp.n_embd, self.hp.ff_length(il)
        return [spec(T.FFN_GATE, (E, F), il), spec(T.FFN_UP, (E, F), il), spec(T.FFN_DOWN, (F, E), il),
                *(spec(t, (n,), il, "bias", kind="vector", optional=True)
                  for t, n in ((T.FFN_GATE, F), (T.FFN_UP, F), (T.FFN_DOWN, E))),
                *(s for t in (T.FFN_GATE, T.FFN_UP, T.FFN_DOWN) for s in scales(t, il))]

    def moe_tensors(self, il: int) -> list[TensorSpec]:
        """The router, the experts (their gates optional, as llama.cpp loads them) and the shared expert, each
        matrix with an optional scale (one per expert)."""
        hp = self.hp
        E, F, X, S = hp.n_embd, hp.ff_length(il), hp.n_expert, hp.n_ff_shexp
        fused = self.traits.windowed
        shexp = (T.FFN_GATE_SHEXP, T.FFN_UP_SHEXP, T.FFN_DOWN_SHEXP)
        shared = [spec(T.FFN_UP_SHEXP, (E, 2 * S), il), spec(T.FFN_DOWN_SHEXP, (S, E), il)] if fused else \
            [spec(T.FFN_GATE_SHEXP, (E, S), il), spec(T.FFN_UP_SHEXP, (E, S), il), spec(T.FFN_DOWN_SHEXP, (S, E), il)]
        gate_up = gate_up_tensors(E, F, X, il) if fused else \
            [spec(T.FFN_GATE_EXP, (E, F, X), il, optional=True), spec(T.FFN_UP_EXP, (E, F, X), il)]
        return [spec(T.FFN_GATE_INP, (E, X), il), *gate_up, spec(T.FFN_DOWN_EXP, (F, E, X), il),
                *(s for t in (T.FFN_GATE_EXP, T.FFN_UP_EXP, T.FFN_DOWN_EXP) for s in scales(t, il, X)),
                *((*shared, *(s for t in shexp for s in scales(t, il))) if S else ())]

    # ---- graph -------------------------------------------------------------------------------------------

    def attention(self, b: GraphBuilder, h: Node, pos: Node, freq_factors: Node | None, il: int) -> Node:
        """Grouped-query attention, RoPE'd unless ``rope.scaling.finetuned`` (or the rope pattern) turns it off."""
        q, k, v = b.build_qkv(h, il)
        if self.ropes(il):
            q = b.rope(q, pos, freq_factors, name="Qcur.rope")
            k = b.rope(k, pos, freq_factors, name="Kcur.rope")
        return b.build_attn(q, k, v, wo=b.w(T.ATTN_OUT, il), wo_b=b.w_opt(T.ATTN_OUT, il, "bias"),
                            wo_s=b.scale(T.ATTN_OUT, il), kq_scale=b.kq_scale(),
                            sinks=b.w(T.ATTN_SINKS, il) if self.traits.windowed else None)

    def ffn(self, b: GraphBuilder, h: Node, il: int) -> Node:
        """The dense FFN, or the experts plus the shared expert. llama.cpp's graph leaves their scales unread."""
        hp, w = self.hp, b.w
        if not hp.n_expert:
            return b.build_ffn(h, up=w(T.FFN_UP, il), up_b=b.w_opt(T.FFN_UP, il, "bias"), gate=w(T.FFN_GATE, il),
                               gate_b=b.w_opt(T.FFN_GATE, il, "bias"), down=w(T.FFN_DOWN, il),
                               down_b=b.w_opt(T.FFN_DOWN, il, "bias"))
        fused, router = self.traits.windowed, w(T.FFN_GATE_INP, il)
        stacks = gate_up(b, il) if fused else {"up_exps": w(T.FFN_UP_EXP, il), "gate_exps": b.w_opt(T.FFN_GATE_EXP, il)}
        out = b.build_moe_ffn(h, gate_inp=router, **stacks, down_exps=w(T.FFN_DOWN_EXP, il),
                              n_expert=hp.n_expert, n_expert_used=hp.n_expert_used, norm_w=True)
        if not hp.n_ff_shexp:
            return out
        if fused:
            shared = b.build_ffn_fused_swiglu(h, il, T.FFN_UP_SHEXP, T.FFN_DOWN_SHEXP, name="ffn_shexp")
        else:
            shared = b.build_ffn(h, up=w(T.FFN_UP_SHEXP, il), gate=w(T.FFN_GATE_SHEXP, il),
                                 down=w(T.FFN_DOWN_SHEXP, il), name="ffn_shexp")
        return b.op("add", out, shared, name="ffn_out")

    def build(self, b: GraphBuilder) -> None:
        hp = self.hp
        x = _scaled(b, b.build_inp_embd(b.w(T.TOKEN_EMBD)), hp.embedding_scale, "inp_scaled")
        pos = b.build_inp_pos() if self.roped or self.traits.hybrid else None
        for il in b.layers():
            h = b.norm(x, T.ATTN_NORM, il, name="attn_norm")
            if self.recurrent(il):
                a = ssm.mamba2_layer(b, h, il)
            else:
                a = self.attention(b, h, pos, rope_factors(b) if self.ropes(il) else None, il)
            a, x = b.last_layer_rows((a, "mix_out.rows"), (x, "inp.rows"))
            x = b.op("add", _scaled(b, a, hp.residual_scale, "mix_out.scaled"), x, name="ffn_inp")
            f = self.ffn(b, b.norm(x, T.FFN_NORM, il, name="ffn_norm"), il)
            x = b.op("add", _scaled(b, f, hp.residual_scale, "ffn_out.scaled"), x, name="l_out")
        x = b.norm(x, T.OUTPUT_NORM, name="result_norm")
        b.build_output(x, b.w(T.OUTPUT))
        if hp.logit_scale:  # a hybrid's 0: the logits as they are
            b.outputs["logits"] = b.op("scale", b.outputs["logits"], s=f32(1.0 / hp.logit_scale), name="result_scaled")


class MiniCPM(Granite):
    """MiniCPM 1 and 2 (MiniCPM-2B, -1B): Granite's graph, its multipliers llama.cpp's defaults where a file (an
    older conversion) leaves them out; no shared expert, no attention.scale, RoPE in every layer."""

    name = "minicpm"
    required_keys = Granite.required_keys[:-1]
    keys = (Key("logit_scale", Keys.LLM.LOGIT_SCALE, float, None),  # None: llama.cpp's default (Traits)
            Key("residual_scale", Keys.LLM.RESIDUAL_SCALE, float, None),
            Key("embedding_scale", Keys.LLM.EMBEDDING_SCALE, float, None), *MOE_KEYS)
    traits = Traits(minicpm_defaults=True, rope_switch=False)


class GraniteMoe(Granite):
    """Granite 3's mixtures of experts (Granite-3.1-3B-A800M, -1B-A400M, and with a shared expert): Granite's graph,
    read by llama.cpp's granitemoe loader, which has no RoPE switch and no projector streams."""

    name = "granitemoe"
    keys = GRANITE_KEYS
    traits = Traits(rope_switch=False)


class GraniteSWA(Granite):
    """Granite's sliding-window form (llama.cpp's granite_swa): Granite's graph and multipliers over a window with
    attention sinks, RoPE per layer, fused expert stacks; the file gives the sliding layers as an array."""

    name = "granite_swa"
    required_keys = Granite.required_keys + (Keys.Attention.SLIDING_WINDOW, Keys.Attention.SLIDING_WINDOW_PATTERN)
    swa = SlidingWindow("standard")
    keys = (*MULTIPLIERS, *MOE_KEYS, SHARED_EXPERT, Key("deepstack", DEEPSTACK, tuple, (), minimum=-1, count=-1),
            Key("rope_pattern", ROPE_PATTERN, tuple, (), minimum=0, count=-1))
    traits = Traits(rope_switch=False, windowed=True)


class GraniteHybrid(Granite):
    name = "granitehybrid"
    required_keys = Granite.required_keys[:-1]
    per_layer = True  # head_count_kv per layer says which layers are recurrent
    keys = ssm.MAMBA2_KEYS + GRANITE_KEYS
    traits = Traits(hybrid=True)


def _scaled(b: GraphBuilder, x: Node, s: float, name: str) -> Node:
    """x times one of Granite's multipliers (0: not set, x as it is)."""
    return b.op("scale", x, s=s, name=name) if s else x


# ---- presets: released models of this family, as their converted GGUFs declare them ---------------------

L, A, R, S = Keys.LLM, Keys.Attention, Keys.Rope, Keys.SSM
GATES_AND_QKV = f"{presets.EXPERT_GATES}|{presets.SPLIT_QKV}"  # optional tensors the converter writes


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
    }, tied=True, include=GATES_AND_QKV,
        f32=presets.ROUTER_F32 + r"|blk\.\d+\.ssm_(conv1d\.weight|a|d|norm\.weight)", source=source)


presets.register({
    # Granite 3.1 2B: 40 layers of 32 heads (8 KV heads) of 64, RoPE base 5e6 over 128k positions; its multipliers
    "Granite-3.1-2B": Preset("granite", {
        L.CONTEXT_LENGTH: 131072, L.EMBEDDING_LENGTH: 2048, L.BLOCK_COUNT: 40, L.FEED_FORWARD_LENGTH: 8192,
        A.HEAD_COUNT: 32, A.HEAD_COUNT_KV: 8, R.FREQ_BASE: 5000000.0, A.LAYERNORM_RMS_EPS: 1e-5, R.DIMENSION_COUNT: 64,
        A.SCALE: 0.015625, L.EMBEDDING_SCALE: 12.0, L.RESIDUAL_SCALE: 0.22, L.LOGIT_SCALE: 8.0, L.VOCAB_SIZE: 49155,
    }, tied=True, include=presets.SPLIT_QKV, source="ibm-granite/granite-3.1-2b-instruct config.json"),
    # MiniCPM 2B: 40 layers of 36 heads of 64 (no grouping); the converter writes the three multipliers
    # (scale_emb, scale_depth / sqrt(n_layer), hidden_size / dim_model_base)
    # Granite 3.1 3B-A800M: 32 layers of 24 heads (8 KV heads) of 64; 40 experts of 512, 8 per token; its multipliers
    "Granite-3.1-3B-A800M": Preset("granitemoe", {
        L.CONTEXT_LENGTH: 131072, L.EMBEDDING_LENGTH: 1536, L.BLOCK_COUNT: 32, L.FEED_FORWARD_LENGTH: 512,
        A.HEAD_COUNT: 24, A.HEAD_COUNT_KV: 8, R.FREQ_BASE: 10000000.0, A.LAYERNORM_RMS_EPS: 1e-6, L.EXPERT_COUNT: 40,
        L.EXPERT_USED_COUNT: 8, A.SCALE: 0.015625, L.EMBEDDING_SCALE: 12.0, L.RESIDUAL_SCALE: 0.22,
        L.LOGIT_SCALE: 6.0, L.VOCAB_SIZE: 49155,
    }, tied=True, include=GATES_AND_QKV, f32=presets.ROUTER_F32,
        source="ibm-granite/granite-3.1-3b-a800m-instruct config.json"),
    "MiniCPM-2B": Preset("minicpm", {
        L.CONTEXT_LENGTH: 4096, L.EMBEDDING_LENGTH: 2304, L.BLOCK_COUNT: 40, L.FEED_FORWARD_LENGTH: 5760,
        A.HEAD_COUNT: 36, A.HEAD_COUNT_KV: 36, A.LAYERNORM_RMS_EPS: 1e-5, L.EMBEDDING_SCALE: 12.0,
        L.RESIDUAL_SCALE: 1.4 / 40 ** 0.5, L.LOGIT_SCALE: 9.0, L.VOCAB_SIZE: 122753,
    }, tied=True, include=presets.SPLIT_QKV, source="openbmb/MiniCPM-2B-sft-bf16 config.json"),
    # llama.cpp's tiny granite_swa over five layers (so that alike ones fold), the odd ones sliding over 32 positions
    # as its tiny model's pattern: width 256, two heads of 128, 2 experts of 384 (both used, their gate and up one
    # stack) and a shared expert of 192, the multipliers llama.cpp's tiny model has
    "granite_swa-tiny-header": Preset("granite_swa", {
        L.CONTEXT_LENGTH: 256, L.EMBEDDING_LENGTH: 256, L.BLOCK_COUNT: 5, L.FEED_FORWARD_LENGTH: 384,
        A.HEAD_COUNT: 2, A.HEAD_COUNT_KV: 2, A.LAYERNORM_RMS_EPS: 1e-5, A.SLIDING_WINDOW: 32,
        A.SLIDING_WINDOW_PATTERN: [il % 2 for il in range(5)], L.VOCAB_SIZE: 128, L.EXPERT_COUNT: 2,
        L.EXPERT_USED_COUNT: 2, L.EXPERT_SHARED_FEED_FORWARD_LENGTH: 192, L.LOGIT_SCALE: 1.0,
        L.RESIDUAL_SCALE: 3.5565588,
    }, tied=False, include=r"blk\.\d+\.(attn_[qkv]|ffn_gate_up_exps)\.weight", f32=presets.ROUTER_F32,
        source="llama.cpp tests/test-llama-archs.cpp, its tiny granite_swa header"),
    "Granite-4.0-H-Tiny": _granite4h(1536, 12, 4, 512, 1024, 64, 6, 48, "ibm-granite/granite-4.0-h-tiny model card "
                                     "and config excerpts (sizes; not the multipliers)"),
    "Granite-4.0-H-Small": _granite4h(4096, 32, 8, 768, 1536, 72, 10, 128, "ibm-granite/granite-4.0-h-small model "
                                      "card and config excerpts (sizes; not the multipliers)"),
})


# ---- Hugging Face: the keys convert_hf_to_gguf writes for GraniteMoeHybridForCausalLM -----------------------------

def _prefixed(*names: str) -> tuple[str, ...]:
    """GraniteHybrid's find_hparam: the names, then each with a ``mamba_`` prefix."""
    return names + tuple(f"mamba_{n}" for n in names)


def _granite_attention_layers(c: Config) -> list[int]:
    types = c.find("layer_types", kind="list", default=None)
    if types is not None:
        return [i for i, t in enumerate(types) if t == "attention"]
    indices = c.find("attn_layer_indices", kind="list", default=None)
    if indices:
        return indices
    period, offset = c.find("attn_layer_period"), c.find("attn_layer_offset", kind="size")
    return [i for i in range(c.find(*BLOCKS)) if i % period == offset]


def _granite_kv(c: Config) -> list[int]:
    attn, n_kv = _granite_attention_layers(c), c.find(*_prefixed("num_key_value_heads", "n_head_kv"))
    return [n_kv if il in attn else 0 for il in range(c.find(*BLOCKS))]


def _granite_rope(c: Config) -> dict[str, Any]:
    """Granite 4.0-H's attention layers rotate nothing (unlike Bamba's), and then the context is unlimited."""
    roped = "BambaForCausalLM" in c.doc.get("architectures", ()) or len(_granite_attention_layers(c)) == c.find(*BLOCKS)
    return {R.SCALING_FINETUNED: roped, **({} if roped else {L.CONTEXT_LENGTH: 1 << 20})}


# GraniteModel: LlamaModel's keys without head_dim, and the four multipliers
GRANITE = TEXT_BASE + (
    VOCAB,
    derived(R.DIMENSION_COUNT, lambda c: c.find(*WIDTH) // heads(c)),
    hf(A.SCALE, "attention_multiplier", kind="number", default=None),
    hf(L.EMBEDDING_SCALE, "embedding_multiplier", kind="number", default=None),
    hf(L.RESIDUAL_SCALE, "residual_multiplier", kind="number", default=None),
    hf(L.LOGIT_SCALE, "logits_scaling", kind="number", default=None),
)
GRANITE_HYBRID = GRANITE + (
    hf(L.EXPERT_SHARED_FEED_FORWARD_LENGTH, "shared_intermediate_size", default=None),
    hf(S.CONV_KERNEL, *_prefixed("conv_kernel", "d_conv")),
    hf(S.STATE_SIZE, *_prefixed("state_size", "d_state", "state_dim", "ssm_state_size")),
    hf(S.GROUP_COUNT, *_prefixed("n_groups", "num_groups")),
    derived(S.INNER_SIZE, lambda c: c.find(*_prefixed("expand", "num_heads")) * c.find(
        *_prefixed("mamba_head_dim", "hidden_size", "d_model"))),
    hf(S.TIME_STEP_RANK, *_prefixed("n_heads", "num_heads")),
    derived(A.HEAD_COUNT_KV, _granite_kv),
    _granite_rope,
)


def _granite_include(c: Config) -> str:
    return GATES_AND_QKV if c.find("num_local_experts", kind="size", default=0) else presets.SPLIT_QKV




hf_config.register(Family("granitehybrid", GRANITE_HYBRID, {"tie_word_embeddings": False}, _granite_include,
                          pad_vocab=8), "GraniteMoeHybridForCausalLM")
hf_config.register(Family("granite", GRANITE, {"tie_word_embeddings": False}, lambda c: presets.SPLIT_QKV),
                   "GraniteForCausalLM")
hf_config.register(Family("granitemoe", GRANITE + (hf(L.EXPERT_SHARED_FEED_FORWARD_LENGTH, "shared_intermediate_size",
                                                     default=None),),
                          {"tie_word_embeddings": False}, _granite_include),
                   "GraniteMoeForCausalLM", "GraniteMoeSharedForCausalLM")


def _sliding_layers(c: Config) -> list[bool]:
    """layer_types' sliding layers, or the transformers default: all but every fourth from the first."""
    types = c.find("layer_types", kind="list", default=None)
    return [t == "sliding_attention" for t in types] if types else [il % 4 != 0 for il in range(c.find(*BLOCKS))]


def _roped_layers(c: Config) -> list[bool] | None:
    """no_rope_layers as the converter writes it (1: the layer ropes); None when the config lacks it."""
    flags = c.find("no_rope_layers", kind="list", default=None)
    return [bool(x) for x in flags] if flags else None


# GraniteSWAModel and GraniteMoeSWAModel: Granite's keys, the window (128 unless the config says), the sliding layers,
# the layers that rope; the experts' gate and up written as one stack, the shared expert's as ffn_up_shexp
GRANITE_SWA = GRANITE + (
    hf(A.SLIDING_WINDOW, "sliding_window", default=128), derived(A.SLIDING_WINDOW_PATTERN, _sliding_layers),
    derived(ROPE_PATTERN, _roped_layers),
)
hf_config.register(Family("granite_swa", GRANITE_SWA, {"tie_word_embeddings": False}, lambda c: presets.SPLIT_QKV),
                   "GraniteSWAForCausalLM")
hf_config.register(Family("granite_swa", GRANITE_SWA + (hf(L.EXPERT_SHARED_FEED_FORWARD_LENGTH,
                                                          "shared_intermediate_size", default=None),),
                          {"tie_word_embeddings": False},
                          lambda c: rf"{presets.SPLIT_QKV}|blk\.\d+\.ffn_gate_up_exps\.weight"),
                   "GraniteMoeSWAForCausalLM")


# MiniCPMModel: the text keys and the multipliers from scale_emb, scale_depth and dim_model_base
MINICPM = TEXT + (
    VOCAB,
    hf(L.EMBEDDING_SCALE, "scale_emb", kind="number"),
    derived(L.RESIDUAL_SCALE, lambda c: c.find("scale_depth", kind="number") / math.sqrt(c.find(*BLOCKS))),
    derived(L.LOGIT_SCALE, lambda c: c.find(*WIDTH) / c.find("dim_model_base")),
)
hf_config.register(Family("minicpm", MINICPM, {"tie_word_embeddings": True}, lambda c: presets.SPLIT_QKV),
                   "MiniCPMForCausalLM")
