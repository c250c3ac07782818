"""NeoBERT and EuroBERT: pre-RMSNorm encoders with rotary positions and a SwiGLU FFN, attending both ways.

One graph (llama.cpp's src/models/neo-bert.cpp and eurobert.cpp): each layer ``x += attn(rms(x))`` then
``x += ffn(rms(x))`` over the ubatch's own tokens (no cache, no window), Q and K rotated, scores scaled by
1/sqrt(head size); the final RMSNorm's output is the embedding, pooled by the context. What differs is data
(:class:`Layout`):
NeoBERT fuses Q, K and V into one attn_qkv, its FFN's up projection holds the gate rows first ([gate; up],
2 x n_ff: the converter writes two thirds of intermediate_size as n_ff), it rotates adjacent pairs (llama.cpp's
norm RoPE), its final norm is enc.output_norm and it may carry a classifier head (cls, cls.output: rank pooling).
EuroBERT (Llama's layers made an encoder) takes Q, K, V fused or apart with optional biases (llama.cpp's
create_tensor_qkv), a gate and an up projection apart, rotates halves (neox) and names its final norm output_norm.
References: Le Breton et al. 2025, "NeoBERT: A Next-Generation BERT"; Boizard et al. 2025, "EuroBERT: Scaling
Multilingual Encoders for European Languages".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from gguf import MODEL_TENSOR as T
from gguf import Keys, PoolingType

from graphir.graph.floats import inv_sqrt
from graphir.model import hf_config, presets
from graphir.model.architecture import Architecture
from graphir.model.builder import GraphBuilder
from graphir.model.hf_config import TEXT, VOCAB, Config, Family, derived, fixed, pooling_rule
from graphir.model.hparams import HParams
from graphir.model.presets import Preset
from graphir.model.qkv import check_head_sizes, fused_or_split_qkv_tensors
from graphir.model.tensors import TensorSpec, spec, with_bias

L, A, R = Keys.LLM, Keys.Attention, Keys.Rope


@dataclass(frozen=True)
class Layout:
    fused_qkv: bool  # one attn_qkv without bias (NeoBERT); else create_tensor_qkv's fused-or-apart forms
    fused_ffn: bool  # the up projection holds [gate; up] (NeoBERT); else ffn_gate and ffn_up apart
    output_norm: T  # the final norm's tensor
    classifier: bool  # the optional cls / cls.output head llama.cpp's loader takes


class NeoBert(Architecture):
    name = "neo-bert"
    rope_mode = "norm"
    causal = False  # llama.cpp gives it no memory: llama_decode runs it as llama_encode, both ways
    required_keys = (L.FEED_FORWARD_LENGTH, A.HEAD_COUNT, A.LAYERNORM_RMS_EPS)
    layout: ClassVar[Layout] = Layout(fused_qkv=True, fused_ffn=True, output_norm=T.ENC_OUTPUT_NORM, classifier=True)

    def __init__(self, hp: HParams):
        check_head_sizes(hp, self.name, rotated=False)  # the graph asserts keys and values equally wide
        super().__init__(hp)

    def tensors(self) -> list[TensorSpec]:
        hp, lay = self.hp, self.layout
        E, F = hp.n_embd, hp.n_ff
        specs = [spec(T.TOKEN_EMBD, (E, hp.n_vocab)), spec(lay.output_norm, (E,), kind="vector")]
        if lay.classifier:
            specs += [*with_bias(T.CLS, (E, E), optional=True), *with_bias(T.CLS_OUT, (E, self.n_cls_out), optional=True)]
        for il in range(hp.n_layer):
            qkv = ([spec(T.ATTN_QKV, (E, E + 2 * hp.n_embd_k_gqa), il)] if lay.fused_qkv
                   else fused_or_split_qkv_tensors(hp, il))
            ffn = ([spec(T.FFN_UP, (E, 2 * F), il)] if lay.fused_ffn
                   else [spec(T.FFN_GATE, (E, F), il), spec(T.FFN_UP, (E, F), il)])
            specs += [spec(T.ATTN_NORM, (E,), il, kind="vector"), *qkv, spec(T.ATTN_OUT, (E, E), il),
                      spec(T.FFN_NORM, (E,), il, kind="vector"), *ffn, spec(T.FFN_DOWN, (F, E), il)]
        return specs

    def build(self, b: GraphBuilder) -> None:
        lay = self.layout
        pos = b.build_inp_pos()
        x = b.build_inp_embd(b.w(T.TOKEN_EMBD))
        for il in b.layers():
            q, k, v = b.build_qkv(b.norm(x, T.ATTN_NORM, il, name="attn_norm"), il)
            q, k = b.rope(q, pos, name="Qcur.rope"), b.rope(k, pos, name="Kcur.rope")
            a = b.build_attn(q, k, v, wo=b.w(T.ATTN_OUT, il), wo_s=b.scale(T.ATTN_OUT, il), kq_scale=inv_sqrt(self.hp.n_embd_head_k))
            a, x = b.last_layer_rows((a, "attn_out.rows"), (x, "inp.rows"))
            x = b.op("add", a, x, name="ffn_inp")
            h = b.norm(x, T.FFN_NORM, il, name="ffn_norm")
            f = (b.build_ffn_fused_swiglu(h, il) if lay.fused_ffn else
                 b.build_ffn(h, up=b.w(T.FFN_UP, il), gate=b.w(T.FFN_GATE, il), down=b.w(T.FFN_DOWN, il)))
            x = b.op("add", f, x, name="l_out")
        b.build_output(b.norm(x, lay.output_norm, name="result_embd"))


class EuroBert(NeoBert):
    name = "eurobert"
    rope_mode = "neox"
    layout = Layout(fused_qkv=False, fused_ffn=False, output_norm=T.OUTPUT_NORM, classifier=False)


def _ffn_length(c: Config) -> int:
    """NeoBERT's SwiGLU width: two thirds of intermediate_size, as its converter writes it."""
    return int(2 * c.find("intermediate_size") / 3)


# NeoBERT's converter (a BERT one): the whole width as the ffn length's base, RoPE base 10000 unscaled, the RMS
# epsilon from norm_eps (absent: 1e-6), CLS pooling; the masked-LM decoder is dropped
hf_config.register(Family("neo-bert", TEXT + (
    derived(L.FEED_FORWARD_LENGTH, _ffn_length), fixed(R.FREQ_BASE, 10000.0), fixed(R.SCALING_TYPE, "none"),
    derived(A.LAYERNORM_RMS_EPS, lambda c: c.find("norm_eps", kind="number", default=1e-6)),
    fixed(A.CAUSAL, False), fixed(L.POOLING_TYPE, int(PoolingType.CLS)), VOCAB)),
    "NeoBERT", "NeoBERTLMHead", "NeoBERTForSequenceClassification")
# EuroBERT's converter takes the checkpoint's architecture as EuroBertModel (the released config names its masked-LM
# class, which the converter does not know), writes it bidirectional, unscaled, pooled as sentence-transformers says
QKV_APART = r"blk\.\d+\.attn_[qkv]\.weight"  # EuroBERT's q_proj, k_proj, v_proj (no biases)
hf_config.register(Family("eurobert", TEXT + (fixed(A.CAUSAL, False), fixed(R.SCALING_TYPE, "none"), pooling_rule,
                                              VOCAB), {"tie_word_embeddings": False}, lambda c: QKV_APART),
                   "EuroBertModel")

presets.register({
    # 28 layers of 768 (12 heads of 64), SwiGLU of 2048 (intermediate_size 3072), context 4096, CLS pooling
    "NeoBERT": Preset("neo-bert", {
        L.CONTEXT_LENGTH: 4096, L.EMBEDDING_LENGTH: 768, L.BLOCK_COUNT: 28, L.FEED_FORWARD_LENGTH: 2048,
        A.HEAD_COUNT: 12, A.LAYERNORM_RMS_EPS: 1e-5, A.CAUSAL: False, R.FREQ_BASE: 10000.0, R.SCALING_TYPE: "none",
        L.POOLING_TYPE: int(PoolingType.CLS), L.VOCAB_SIZE: 30522,
    }, tied=False, source="chandar-lab/NeoBERT config.json (NeoBERTLMHead)"),
    # 12 layers of 768 (12 heads of 64, as many KV heads), SwiGLU of 3072, RoPE base 250000, context 8192
    "EuroBERT-210m": Preset("eurobert", {
        L.CONTEXT_LENGTH: 8192, L.EMBEDDING_LENGTH: 768, L.BLOCK_COUNT: 12, L.FEED_FORWARD_LENGTH: 3072,
        A.HEAD_COUNT: 12, A.HEAD_COUNT_KV: 12, A.LAYERNORM_RMS_EPS: 1e-5, A.CAUSAL: False, R.FREQ_BASE: 250000.0,
        R.SCALING_TYPE: "none", L.VOCAB_SIZE: 128256,
    }, tied=False, include=QKV_APART, source="EuroBERT/EuroBERT-210m config.json (architecture named EuroBertModel for the converter)"),
})
