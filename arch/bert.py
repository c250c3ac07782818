"""Encoder-only transformers of llama.cpp's one BERT graph: BERT, nomic-bert, jina-bert-v2 and jina-bert-v3.

Attention is bidirectional within each sequence and there is no LM head: the output is one embedding per
token, reduced per sequence by the context's pooling. Token types are not an input: row 0 of the type table
("sentence A") is added to every token, as llama.cpp does. llama.cpp builds all four with one graph
(src/models/bert.cpp, the others ``using`` it); what tells them apart is data: where positions come from
(a trained table, rotations, or ALiBi's distance bias) and which FFN a layer has.
Reference: Devlin et al. 2019, "BERT"; Nussbaum et al. 2024, "Nomic Embed"; Günther et al. 2023, "Jina
Embeddings 2"; Sturua et al. 2024, "jina-embeddings-v3"; llama.cpp src/models/bert.cpp.
"""

from __future__ import annotations

from typing import ClassVar

from gguf import MODEL_TENSOR as T
from gguf import Keys, PoolingType

from graphir.model import hf_config, presets
from graphir.model.architecture import Architecture
from graphir.model.builder import Act, Gate, Gating, GraphBuilder, Node, Norm
from graphir.model.hf_config import TEXT, VOCAB, Config, Family, derived, fixed, hf, pooling_rule
from graphir.model.hparams import Alibi, HParams, Key
from graphir.model.moe import MOE_KEYS, check_experts
from graphir.model.presets import Preset
from graphir.model.scales import layer_scales
from graphir.model.tensors import TensorSpec, spec, tensor_name, with_bias


class Bert(Architecture):
    name = "bert"
    rope_mode = "neox"  # declared by llama.cpp for the family; BERT itself rotates nothing
    causal = False  # bidirectional attention: its layers need no cache, so the context keeps none
    required_keys = (Keys.LLM.FEED_FORWARD_LENGTH, Keys.Attention.HEAD_COUNT, Keys.Attention.LAYERNORM_EPS)
    # table: a trained position table added to the input; rope: Q and K rotated; alibi: scores biased by distance
    positions: ClassVar[str] = "table"
    # gelu: a GELU MLP with its biases where the file has them; swiglu: SwiGLU without biases; jina: GELU gated by
    # ffn_gate where the file has one, else GEGLU over an up projection that holds the gate rows first
    ffn: ClassVar[str] = "gelu"
    # the optional classifier head llama.cpp loads: head (cls, cls.output: RoBERTa's), projection (cls to one
    # score: jina-reranker-v1's), or none
    classifier: ClassVar[str] = "head"

    def __init__(self, hp: HParams):
        # llama.cpp gives these models no memory, so its llama_decode runs them as llama_encode, which attends both
        # ways whatever attention.causal says (Architecture, for a family that is not causal)
        if "n_expert" in dict(hp.family):  # nomic-bert-moe's experts, checked as llama.cpp's loader checks them
            check_experts(hp, self.name)
        super().__init__(hp)

    def tensors(self) -> list[TensorSpec]:
        hp = self.hp
        E, F, E_gqa = hp.n_embd, hp.n_ff, hp.n_embd_k_gqa
        jina = self.ffn == "jina"
        specs = [
            spec(T.TOKEN_EMBD, (E, hp.n_vocab)),
            spec(T.TOKEN_TYPES, (E, max(hp.n_token_types, 1)), optional=not jina),
            *with_bias(T.TOKEN_EMBD_NORM, (E,)),
        ]
        if self.positions == "table":
            specs.append(spec(T.POS_EMBD, (E, hp.n_ctx_train)))
        if self.classifier == "head":
            specs += [*with_bias(T.CLS, (E, E), optional=True), *with_bias(T.CLS_OUT, (E, self.n_cls_out), optional=True)]
        elif self.classifier == "projection":
            specs += with_bias(T.CLS, (E, 1), optional=True)
        for il in range(hp.n_layer):
            layer = [
                *with_bias(T.ATTN_QKV, (E, E + 2 * E_gqa), il, optional=True),
                spec(T.ATTN_Q, (E, E), il, optional=True),
                spec(T.ATTN_K, (E, E_gqa), il, optional=True),
                spec(T.ATTN_V, (E, E_gqa), il, optional=True),
                spec(T.ATTN_Q, (E,), il, "bias", kind="vector", optional=True),
                spec(T.ATTN_K, (E_gqa,), il, "bias", kind="vector", optional=True),
                spec(T.ATTN_V, (E_gqa,), il, "bias", kind="vector", optional=True),
                *with_bias(T.ATTN_OUT, (E, E), il, bias_optional=not jina),
                *with_bias(T.ATTN_OUT_NORM, (E,), il),
                *with_bias(T.LAYER_OUT_NORM, (E,), il),
            ]
            if jina:  # LayerNorms of Q and K, a second one after attention, the FFN's gate: where the file has them
                layer += [*with_bias(T.ATTN_Q_NORM, (E,), il, optional=True),
                          *with_bias(T.ATTN_K_NORM, (E,), il, optional=True),
                          *with_bias(T.ATTN_NORM_2, (E,), il, optional=True),
                          spec(T.FFN_GATE, (E, F), il, optional=True),
                          spec(T.FFN_UP, (E, F), il, also=(E, 2 * F)),
                          spec(T.FFN_UP, (F,), il, "bias", kind="vector", optional=True, also=(2 * F,)),
                          *with_bias(T.FFN_DOWN, (F, E), il)]
            elif self.moe_layer(il):  # GELU experts, ungated and without biases
                X = self.hp.n_expert
                layer += [spec(T.FFN_UP_EXP, (E, F, X), il), spec(T.FFN_DOWN_EXP, (F, E, X), il),
                          spec(T.FFN_GATE_INP, (E, X), il)]
            else:
                layer += [*with_bias(T.FFN_UP, (E, F), il, bias_optional=True),  # nomic-bert's: loaded, never read
                          *with_bias(T.FFN_DOWN, (F, E), il, bias_optional=True)]
            if self.ffn == "swiglu":
                layer.append(spec(T.FFN_GATE, (E, F), il))
            specs += layer + layer_scales(layer, il)  # read: those of the attention projections
        return specs

    def build(self, b: GraphBuilder) -> None:
        pos = b.build_inp_pos() if self.positions != "alibi" else None
        x = b.build_inp_embd(b.w(T.TOKEN_EMBD))
        types = b.w_opt(T.TOKEN_TYPES)
        if types is not None:
            row0 = b.op("view", types, shape=(self.hp.n_embd,), strides=(1,), offset=0, name="token_types.row0")
            x = b.op("add", x, row0, name="inp_embd.types")
        if self.positions == "table":
            x = b.op("add", b.op("get_rows", b.w(T.POS_EMBD), pos, name="inp_pos_embd"), x, name="inp_embd.pos")
        x = b.norm(x, T.TOKEN_EMBD_NORM, kind=Norm.LAYER, name="inp_norm")
        for il in b.layers():
            q, k, v = b.build_qkv(x, il)
            q, k = self._qk_norm(b, q, T.ATTN_Q_NORM, il, "Qcur"), self._qk_norm(b, k, T.ATTN_K_NORM, il, "Kcur")
            if self.positions == "rope":
                q, k = b.rope(q, pos, name="Qcur.rope"), b.rope(k, pos, name="Kcur.rope")
            a = b.build_attn(q, k, v, wo=b.w(T.ATTN_OUT, il), wo_b=b.w_opt(T.ATTN_OUT, il, "bias"),
                             wo_s=b.w_opt(T.ATTN_OUT, il, "scale"), kq_scale=b.kq_scale())
            a, x = b.last_layer_rows((a, "attn_out.rows"), (x, "inp.rows"))
            h = b.norm(b.op("add", a, x, name="attn_res"), T.ATTN_OUT_NORM, il, Norm.LAYER, name="ffn_inp")
            if self._has(b, T.ATTN_NORM_2, il):  # jina-bert-v2's second norm: the layer input re-added
                h = b.norm(b.op("add", h, x, name="attn_res_2"), T.ATTN_NORM_2, il, Norm.LAYER, name="ffn_inp_2")
            f = self._ffn(b, h, il)
            x = b.norm(b.op("add", f, h, name="ffn_res"), T.LAYER_OUT_NORM, il, Norm.LAYER, name="l_out")
        b.build_output(x)

    def _has(self, b: GraphBuilder, t: T, il: int) -> bool:
        """Whether the family declares layer il's tensor t and the file has it."""
        return tensor_name(t, il) in self.specs and b.w_opt(t, il) is not None

    def _qk_norm(self, b: GraphBuilder, x: Node, t: T, il: int, tag: str) -> Node:
        """A LayerNorm across all heads of Q or K, where the file has one (jina-bert-v2)."""
        if not self._has(b, t, il):
            return x
        d, heads, n = x.shape
        flat = b.reshape(x, (d * heads, n), name=f"{tag}.flat")
        return b.reshape(b.norm(flat, t, il, Norm.LAYER, name=f"{tag}_normed"), (d, heads, n), name=f"{tag}.heads_normed")

    def moe_layer(self, il: int) -> bool:
        """Whether layer il's FFN is a mixture of experts (nomic-bert-moe: the second of every n layers)."""
        n = dict(self.hp.family).get("moe_every_n_layers", 0)
        return n > 0 and il % n == 1

    def _ffn(self, b: GraphBuilder, x: Node, il: int) -> Node:
        hp = self.hp
        if self.moe_layer(il):
            return b.build_moe_ffn(x, gate_inp=b.w(T.FFN_GATE_INP, il), up_exps=b.w(T.FFN_UP_EXP, il), gate_exps=None,
                                   down_exps=b.w(T.FFN_DOWN_EXP, il), n_expert=hp.n_expert,
                                   n_expert_used=hp.n_expert_used, gating=Gating.SOFTMAX, act=Act.GELU)
        if self.ffn == "swiglu":
            return b.build_ffn(x, up=b.w(T.FFN_UP, il), gate=b.w(T.FFN_GATE, il), down=b.w(T.FFN_DOWN, il),
                               act=Act.SILU, gate_mode=Gate.PAR)
        up, up_b = b.w(T.FFN_UP, il), b.w_opt(T.FFN_UP, il, "bias")
        gate = b.w(T.FFN_GATE, il) if self._has(b, T.FFN_GATE, il) else None
        if self.ffn == "jina" and gate is None and up.shape[-1] != self.hp.n_ff:  # up = [gate; up]: GEGLU
            return b.build_ffn_fused_swiglu(x, il, act=Act.GELU, up_b=up_b, down_b=b.w_opt(T.FFN_DOWN, il, "bias"))
        down = b.w(T.FFN_DOWN, il)
        return b.build_ffn(x, up=up, up_b=up_b, gate=gate, down=down, down_b=b.w_opt(T.FFN_DOWN, il, "bias"),
                           act=Act.GELU, gate_mode=Gate.PAR)


class NomicBert(Bert):
    """BERT's graph with rotary positions (NEOX) instead of a position table, and a SwiGLU MLP without biases."""

    name = "nomic-bert"
    positions = "rope"
    required_keys = Bert.required_keys + (Keys.LLM.POOLING_TYPE,)
    ffn = "swiglu"
    classifier = ""


class NomicBertMoe(Bert):
    """nomic-bert's rotary positions with BERT's GELU MLP, and on the second of every ``moe_every_n_layers`` a
    mixture of GELU experts routed by softmax (nomic-embed-text-v2-moe)."""

    name = "nomic-bert-moe"
    positions = "rope"
    classifier = ""
    keys = MOE_KEYS + (Key("moe_every_n_layers", Keys.LLM.MOE_EVERY_N_LAYERS, int, 0, minimum=0),)


class JinaBertV2(Bert):
    """BERT's graph with ALiBi (slopes of max bias 8, both directions) in place of positions, optional LayerNorms
    of Q and K and a second one after attention, and a GELU-gated FFN (jina-embeddings-v2, jina-reranker-v1)."""

    name = "jina-bert-v2"
    rope_mode = "none"
    alibi = Alibi(bias=8.0)
    positions = "alibi"
    ffn = "jina"
    classifier = "projection"


class JinaBertV3(Bert):
    """XLM-RoBERTa with rotary positions (NEOX): BERT's graph and GELU MLP, no position table, no classifier
    (jina-embeddings-v3; its task LoRA adapters merged or left out by the converter)."""

    name = "jina-bert-v3"
    positions = "rope"
    classifier = ""


# ---- Hugging Face: what convert_hf_to_gguf writes for BERT, nomic-bert, JinaBERT and XLM-RoBERTa configs ----

L, A, R = Keys.LLM, Keys.Attention, Keys.Rope


def _classifier_labels(c: Config) -> list[str] | None:
    """A sequence classifier's labels (id2label in id order), as the converter writes them: none for the two
    placeholders transformers gives a config without labels of its own."""
    labels = c.find("id2label", kind="map", default=None)
    if not labels:
        return None
    ordered = [labels[k] for k in sorted(labels, key=int)]
    return None if len(ordered) == 2 and ordered[0] == "LABEL_0" else ordered


BERT_RULES = TEXT + (
    fixed(A.CAUSAL, False),
    pooling_rule,
    hf(Keys.Tokenizer.TOKEN_TYPE_COUNT, "type_vocab_size"),
    derived(Keys.Classifier.OUTPUT_LABELS, _classifier_labels),
    VOCAB,
)
BERT_TENSORS = r"token_types\.weight|blk\.\d+\.attn_[qkv]\.(weight|bias)|blk\.\d+\.(attn_output|ffn_up|ffn_down)\.bias"
# fused QKV and every bias (jina-embeddings-v3, nomic-embed-text-v2-moe)
FUSED_TENSORS = r"token_types\.weight|blk\.\d+\.attn_qkv\.(weight|bias)|blk\.\d+\.(attn_output|ffn_up|ffn_down)\.bias"
CLASSIFIER = r"cls(\.output)?\.(weight|bias)"  # a sequence classifier's dense layer and projection (rerankers)


def _nomic_context(c: Config) -> int:
    """nomic-embed-text v1 and v1.5 say 8192 positions but are trained for 2048, v2-moe says 2048 and is trained
    for 512, as the converter writes."""
    npos, trained = c.find("n_positions"), c.find("max_trained_positions", default=2048)
    if (npos, trained) in ((8192, 2048), (2048, 2048)):
        return 2048 if npos == 8192 else 512
    raise c.error(f"n_positions {npos} with max_trained_positions {trained} is neither a nomic-embed-text v1 model "
                  f"(8192 and 2048) nor v2-moe (2048 and 2048)")


def _nomic_arch(c: Config) -> str:
    """Mixture-of-experts layers (moe_every_n_layers) make the converter write nomic-bert-moe."""
    return "nomic-bert-moe" if c.find("moe_every_n_layers", kind="size", default=0) else "nomic-bert"


def _nomic_tensors(c: Config) -> str:
    """v1's fused QKV has no bias; v2-moe's projections and dense MLPs all have theirs."""
    if _nomic_arch(c) == "nomic-bert":
        return r"token_types\.weight|blk\.\d+\.attn_qkv\.weight"
    return FUSED_TENSORS


def _xlmr_context(c: Config) -> int:
    """XLM-RoBERTa's positions start after the padding token's: the converter drops the first pad_token_id + 1."""
    return c.find("max_position_embeddings") - (c.find("pad_token_id", kind="size") + 1)


def _xlmr_arch(c: Config) -> str:
    """An XLM-RoBERTa with task LoRA adaptations is jina-embeddings-v3 (rotary, fused QKV): jina-bert-v3."""
    return "jina-bert-v3" if c.find("lora_adaptations", kind="list", default=None) else "bert"


XLMR = {"layer_norm_eps": 1e-12, "type_vocab_size": 2, "pad_token_id": 1}  # XLMRobertaConfig's defaults
XLMR_RULES = BERT_RULES + (derived(L.CONTEXT_LENGTH, _xlmr_context),)

# BertModel's converter writes separate q/k/v and every bias
hf_config.register(Family("bert", BERT_RULES, {"layer_norm_eps": 1e-12, "type_vocab_size": 2},
                          lambda c: BERT_TENSORS), "BertModel", "BertForMaskedLM")
hf_config.register(Family("bert", XLMR_RULES, XLMR,
                          lambda c: FUSED_TENSORS if _xlmr_arch(c) == "jina-bert-v3" else BERT_TENSORS,
                          arch_of=_xlmr_arch, other_archs=("jina-bert-v3",)), "XLMRobertaModel")
hf_config.register(Family("bert", XLMR_RULES, XLMR, lambda c: f"{BERT_TENSORS}|{CLASSIFIER}"),
                   "XLMRobertaForSequenceClassification")
# JinaBERT: q/k/v apart with biases; its GLU's gated_layers written whole as ffn_up, [gate; up] (GEGLU)
hf_config.register(Family("jina-bert-v2", BERT_RULES, {"layer_norm_eps": 1e-12, "type_vocab_size": 2},
                          lambda c: r"blk\.\d+\.attn_[qkv]\.(weight|bias)", other_shape=r"blk\.\d+\.ffn_up\.weight"),
                   "JinaBertModel", "JinaBertForMaskedLM")
hf_config.register(Family("nomic-bert", BERT_RULES + (
    derived(L.CONTEXT_LENGTH, _nomic_context), hf(L.MOE_EVERY_N_LAYERS, "moe_every_n_layers", kind="size", default=None),
    hf(L.EXPERT_USED_COUNT, "moe_top_k", kind="size", default=None)), {}, _nomic_tensors, arch_of=_nomic_arch,
    other_archs=("nomic-bert-moe",)), "NomicBertModel")


# ---- presets: released models of this family, as their converted GGUFs declare them ---------------------


def _bert(E: int, n_layer: int, n_head: int, pooling: PoolingType | None, source: str) -> Preset:
    keys: dict[str, object] = {
        L.CONTEXT_LENGTH: 512, L.EMBEDDING_LENGTH: E, L.BLOCK_COUNT: n_layer, L.FEED_FORWARD_LENGTH: 4 * E,
        A.HEAD_COUNT: n_head, A.LAYERNORM_EPS: 1e-12, A.CAUSAL: False, L.VOCAB_SIZE: 30522,
        Keys.Tokenizer.TOKEN_TYPE_COUNT: 2,
    }
    if pooling is not None:
        keys[L.POOLING_TYPE] = int(pooling)
    # convert_hf_to_gguf writes separate q/k/v with biases, and keeps the position and type tables in f32
    return Preset("bert", keys, tied=False, include=r"token_types\.weight|blk\.\d+\.attn_[qkv]\.(weight|bias)|"
                  r"blk\.\d+\.(attn_output|ffn_up|ffn_down)\.bias", f32=r"position_embd\.weight|token_types\.weight",
                  source=source)


presets.register({
    "BERT-base": _bert(768, 12, 12, None, "google-bert/bert-base-uncased config.json"),
    "all-MiniLM-L6-v2": _bert(384, 6, 12, PoolingType.MEAN,
                              "sentence-transformers/all-MiniLM-L6-v2 config.json and 1_Pooling (mean)"),
    # NomicBERT: fused QKV without biases, SwiGLU, RoPE (base 1000); 8192 positions said, 2048 trained
    "nomic-embed-text-v1.5": Preset("nomic-bert", {
        L.CONTEXT_LENGTH: 2048, L.EMBEDDING_LENGTH: 768, L.BLOCK_COUNT: 12, L.FEED_FORWARD_LENGTH: 3072,
        A.HEAD_COUNT: 12, A.LAYERNORM_EPS: 1e-12, A.CAUSAL: False, R.FREQ_BASE: 1000.0, L.VOCAB_SIZE: 30528,
        L.POOLING_TYPE: int(PoolingType.MEAN), Keys.Tokenizer.TOKEN_TYPE_COUNT: 2,
    }, tied=False, include=r"token_types\.weight|blk\.\d+\.attn_qkv\.weight", f32=r"token_types\.weight",
        source="nomic-ai/nomic-embed-text-v1.5 config.json and 1_Pooling (mean)"),
    # JinaBERT v2: ALiBi, GEGLU over one up projection of 2 x 3072 rows; the sentence-transformers mean pooling
    "jina-embeddings-v2-base": Preset("jina-bert-v2", {
        L.CONTEXT_LENGTH: 8192, L.EMBEDDING_LENGTH: 768, L.BLOCK_COUNT: 12, L.FEED_FORWARD_LENGTH: 3072,
        A.HEAD_COUNT: 12, A.LAYERNORM_EPS: 1e-12, A.CAUSAL: False, L.VOCAB_SIZE: 30528,
        L.POOLING_TYPE: int(PoolingType.MEAN), Keys.Tokenizer.TOKEN_TYPE_COUNT: 2,
    }, tied=False, include=r"blk\.\d+\.attn_[qkv]\.(weight|bias)", f32=r"token_types\.weight",
        other_shape=r"blk\.\d+\.ffn_up\.weight", source="jinaai/jina-embeddings-v2-base-en config.json and 1_Pooling (mean)"),
    # XLM-RoBERTa with RoPE (base 20000), fused QKV with biases; its task LoRAs go to files of their own
    "jina-embeddings-v3": Preset("jina-bert-v3", {
        L.CONTEXT_LENGTH: 8192, L.EMBEDDING_LENGTH: 1024, L.BLOCK_COUNT: 24, L.FEED_FORWARD_LENGTH: 4096,
        A.HEAD_COUNT: 16, A.LAYERNORM_EPS: 1e-5, A.CAUSAL: False, R.FREQ_BASE: 20000.0, L.VOCAB_SIZE: 250002,
        L.POOLING_TYPE: int(PoolingType.MEAN), Keys.Tokenizer.TOKEN_TYPE_COUNT: 1,
    }, tied=False, include=FUSED_TENSORS, f32=r"token_types\.weight",
        source="jinaai/jina-embeddings-v3 config.json and 1_Pooling (mean)"),
    # XLM-RoBERTa reranker: BERT's graph and RoBERTa's classifier head, one score (rank pooling, as llama.cpp's
    # --pooling rank; the file names no pooling)
    "bge-reranker-v2-m3": Preset("bert", {
        L.CONTEXT_LENGTH: 8192, L.EMBEDDING_LENGTH: 1024, L.BLOCK_COUNT: 24, L.FEED_FORWARD_LENGTH: 4096,
        A.HEAD_COUNT: 16, A.LAYERNORM_EPS: 1e-5, A.CAUSAL: False, L.VOCAB_SIZE: 250002,
        Keys.Tokenizer.TOKEN_TYPE_COUNT: 1, Keys.Classifier.OUTPUT_LABELS: ["LABEL_0"],
    }, tied=False, include=f"{BERT_TENSORS}|{CLASSIFIER}", f32=r"position_embd\.weight|token_types\.weight",
        source="BAAI/bge-reranker-v2-m3 config.json (XLMRobertaForSequenceClassification)"),
    # nomic-embed-text v2: XLM-R's vocabulary, RoPE (base 10000), every second layer 8 GELU experts of which 2
    # are used; projections and dense MLPs with biases; trained for 512 positions
    "nomic-embed-text-v2-moe": Preset("nomic-bert-moe", {
        L.CONTEXT_LENGTH: 512, L.EMBEDDING_LENGTH: 768, L.BLOCK_COUNT: 12, L.FEED_FORWARD_LENGTH: 3072,
        A.HEAD_COUNT: 12, A.LAYERNORM_EPS: 1e-5, A.CAUSAL: False, R.FREQ_BASE: 10000.0, L.VOCAB_SIZE: 250048,
        L.EXPERT_COUNT: 8, L.EXPERT_USED_COUNT: 2, L.MOE_EVERY_N_LAYERS: 2,
        L.POOLING_TYPE: int(PoolingType.MEAN), Keys.Tokenizer.TOKEN_TYPE_COUNT: 1,
    }, tied=False, include=FUSED_TENSORS, f32=rf"token_types\.weight|{presets.ROUTER_F32}",
        source="nomic-ai/nomic-embed-text-v2-moe config.json and 1_Pooling (mean)"),
})
