"""ModernBERT: a pre-norm encoder with rotary positions, alternating global and local attention, and a GLU FFN.

Every third layer (the first of each three) attends globally; the others see a symmetric window of n/2 positions
either side and rotate with their own base (rope.freq_base_swa). LayerNorms have no biases; layer 0 reads the
embedding norm's output unnormalised when the file has no attn_norm for it. The FFN's up projection holds the
gate rows first ([gate; up], 2 x n_ff), activated as hidden_activation says (GELU: GEGLU; SiLU: SwiGLU, IBM's
Granite Embedding R2; ReLU: ReGLU). The final norm's output is the embedding, pooled by the context.
Reference: Warner et al. 2024, "Smarter, Better, Faster, Longer: A Modern Bidirectional Encoder"; llama.cpp
src/models/modern-bert.cpp.
"""

from __future__ import annotations

from gguf import MODEL_TENSOR as T
from gguf import Keys

from graphir.errors import MetadataError
from graphir.model import hf_config, presets
from graphir.model.architecture import Architecture
from graphir.model.builder import Act, GraphBuilder, Norm
from graphir.model.hf_config import TEXT, Config, Family, derived, fixed, hf, pooling_rule
from graphir.model.hparams import HParams, Key, SlidingWindow
from graphir.model.presets import Preset
from graphir.model.tensors import TensorSpec, spec

L, A, R = Keys.LLM, Keys.Attention, Keys.Rope
HIDDEN_ACT = "{arch}.hidden_activation"
CLASSIFIER_POOLING = "{arch}.classifier.pooling_type"  # the pooling before a classifier head (llama.cpp's rank)
ACTS = {"gelu": Act.GELU, "geglu": Act.GELU, "silu": Act.SILU, "swish": Act.SILU, "swiglu": Act.SILU,
        "reglu": Act.RELU}  # llama.cpp's names of the GLU its FFN applies (an unknown name: GEGLU)


class ModernBert(Architecture):
    name = "modern-bert"
    rope_mode = "neox"
    causal = False
    required_keys = (L.FEED_FORWARD_LENGTH, A.HEAD_COUNT, A.LAYERNORM_EPS)
    # the first of every three layers global (absent or 0 window: none slides)
    swa = SlidingWindow("symmetric", window=0, period=3, dense_first=True, off_when_zero=True)
    keys = (Key("rope_freq_base_swa", R.FREQ_BASE_SWA, float, 10000.0),
            Key("hidden_act", HIDDEN_ACT, str, "gelu"),
            Key("classifier_pooling", CLASSIFIER_POOLING, int, 0))  # 2: cls; else (unspecified too) mean
    classifier_act = "gelu"  # rank pooling: the head's dense layer, GELU, its norm, then cls.output

    def __init__(self, hp: HParams):
        if hp.hidden_act == "relu":  # type: ignore[attr-defined]
            raise MetadataError(f"key '{HIDDEN_ACT.format(arch=self.name)}' is relu: llama.cpp applies a plain ReLU "
                                f"to the up projection's 2 x n_ff rows, which its down projection cannot read")
        if hp.n_head != hp.n_head_kv:
            raise MetadataError(f"{hp.n_head} query heads and {hp.n_head_kv} KV heads: ModernBERT's fused QKV of 3 x "
                                f"n_embd rows holds as many K and V heads as query heads")
        super().__init__(hp)  # llama.cpp gives it no memory: it attends both ways (Architecture, not causal)
        self.rank_pooling = "cls" if hp.classifier_pooling == 2 else "mean"  # type: ignore[attr-defined]

    def tensors(self) -> list[TensorSpec]:
        hp = self.hp
        E, F = hp.n_embd, hp.n_ff
        specs = [spec(T.TOKEN_EMBD, (E, hp.n_vocab)), spec(T.TOKEN_EMBD_NORM, (E,), kind="vector"),
                 spec(T.OUTPUT_NORM, (E,), kind="vector"),
                 spec(T.CLS_OUT, (E, 1), optional=True), spec(T.CLS_OUT, (1,), suffix="bias", kind="vector",
                                                                optional=True),
                 spec(T.CLS, (E, E), optional=True), spec(T.CLS_NORM, (E,), kind="vector", optional=True)]
        for il in range(hp.n_layer):
            specs += [spec(T.ATTN_NORM, (E,), il, kind="vector", optional=il == 0),
                      spec(T.ATTN_QKV, (E, 3 * E), il), spec(T.ATTN_OUT, (E, E), il),
                      spec(T.FFN_UP, (E, 2 * F), il), spec(T.FFN_DOWN, (F, E), il),
                      spec(T.FFN_NORM, (E,), il, kind="vector")]
        return specs

    def build(self, b: GraphBuilder) -> None:
        hp = self.hp
        pos = b.build_inp_pos()
        x = b.norm(b.build_inp_embd(b.w(T.TOKEN_EMBD)), T.TOKEN_EMBD_NORM, kind=Norm.LAYER, name="inp_norm")
        act = ACTS.get(hp.hidden_act, Act.GELU)  # type: ignore[attr-defined]
        for il in b.layers():
            h = x if b.w_opt(T.ATTN_NORM, il) is None else b.norm(x, T.ATTN_NORM, il, Norm.LAYER, name="attn_norm")
            q, k, v = b.build_qkv(h, il)
            base = hp.rope_freq_base_swa if hp.is_swa(il) else None  # type: ignore[attr-defined]
            scale = 1.0 if hp.is_swa(il) else None
            q = b.rope(q, pos, name="Qcur.rope", freq_base=base, freq_scale=scale)
            k = b.rope(k, pos, name="Kcur.rope", freq_base=base, freq_scale=scale)
            a = b.build_attn(q, k, v, wo=b.w(T.ATTN_OUT, il), wo_s=b.scale(T.ATTN_OUT, il), kq_scale=b.kq_scale())
            a, x = b.last_layer_rows((a, "attn_out.rows"), (x, "inp.rows"))
            x = b.op("add", a, x, name="ffn_inp")
            f = b.build_ffn_fused_swiglu(b.norm(x, T.FFN_NORM, il, Norm.LAYER, name="ffn_norm"), il, act=act)
            x = b.op("add", f, x, name="l_out")
        b.build_output(b.norm(x, T.OUTPUT_NORM, kind=Norm.LAYER, name="final_norm_out"))



HEAD = r"cls\.weight|cls\.norm\.weight"  # a masked-LM checkpoint's head.dense and head.norm (its decoder: no)


def _classifier_pooling(c: Config) -> int | None:
    """classifier_pooling, as the converter writes it (mean 1, cls 2)."""
    v = c.find("classifier_pooling", kind="text", default=None)
    if v not in (None, "mean", "cls"):
        raise c.error(f"classifier_pooling {v!r}: the converter takes mean or cls")
    return None if v is None else {"mean": 1, "cls": 2}[v]


hf_config.register(Family("modern-bert", TEXT + (
    fixed(A.CAUSAL, False), pooling_rule, hf(A.SLIDING_WINDOW, "local_attention"),
    hf(A.SLIDING_WINDOW_PATTERN, "global_attn_every_n_layers", default=None),
    hf(R.FREQ_BASE, "global_rope_theta", kind="number", default=None),
    hf(R.FREQ_BASE_SWA, "local_rope_theta", kind="number", default=None),
    fixed(R.SCALING_TYPE, "none"), hf(HIDDEN_ACT, "hidden_activation", kind="text", default=None),
    derived(CLASSIFIER_POOLING, _classifier_pooling), hf(L.VOCAB_SIZE, "vocab_size")), {"norm_eps": 1e-5},
    lambda c: HEAD if c.find("architectures", kind="list")[0] == "ModernBertForMaskedLM" else ""),
    "ModernBertModel", "ModernBertForMaskedLM")

presets.register({
    # 22 layers of 768 (12 heads), GEGLU of 1152, a window of 128 (64 either side) on two of every three layers,
    # RoPE bases 160000 (global) and 10000 (local)
    "ModernBERT-base": Preset("modern-bert", {
        L.CONTEXT_LENGTH: 8192, L.EMBEDDING_LENGTH: 768, L.BLOCK_COUNT: 22, L.FEED_FORWARD_LENGTH: 1152,
        A.HEAD_COUNT: 12, A.LAYERNORM_EPS: 1e-5, A.LAYERNORM_RMS_EPS: 1e-5, A.CAUSAL: False, A.SLIDING_WINDOW: 128,
        A.SLIDING_WINDOW_PATTERN: 3,
        R.FREQ_BASE: 160000.0, R.FREQ_BASE_SWA: 10000.0, R.SCALING_TYPE: "none", HIDDEN_ACT: "gelu",
        CLASSIFIER_POOLING: 1, L.VOCAB_SIZE: 50368,
    }, tied=False, include=HEAD, source="answerdotai/ModernBERT-base config.json (ModernBertForMaskedLM)"),
})
