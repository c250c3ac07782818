"""T5: an encoder-decoder transformer with relative position buckets (t5, and its encoder alone, t5encoder).

The encoder is bidirectional; the decoder attends causally to itself and, in every layer, to the encoder's
output. Positions enter only as a learned bias per head and per bucket of key-query distance, from the
first layer's table unless a layer has its own. Norms are RMS norms without mean and bias; attention scores
are not scaled; the FFN is ReLU (T5) or a GELU-gated pair (T5 v1.1, FLAN-T5), whichever the file holds. The
head is the untied ``output`` or the embedding, applied without the d_model^-0.5 rescale (as llama.cpp does).
The two stacks share their blocks (self-attention, FFN), each stack naming its own tensors.
Reference: Raffel et al. 2020, "Exploring the Limits of Transfer Learning ..."; llama.cpp src/models/t5.cpp
(its encoder graph serves t5encoder as well).
"""

from __future__ import annotations

from dataclasses import dataclass

from gguf import MODEL_TENSOR as T
from gguf import Keys

from graphir.graph.ir import Node
from graphir.memory.layers import Attention, CrossAttention, LayerNeeds
from graphir.model import hf_config, presets
from graphir.model.architecture import Architecture
from graphir.model.builder import Act, Gate, GraphBuilder
from graphir.model.hf_config import BLOCKS, VOCAB, Config, Family, Rule, derived, hf
from graphir.model.hparams import LAYER_COUNT, HParams, Key
from graphir.model.presets import Preset
from graphir.model.scales import scale_specs
from graphir.model.tensors import TensorSpec, spec, tensor_name

L, A = Keys.LLM, Keys.Attention

# Half the buckets (of a direction) are exact distances, the rest log-spaced up to 128 positions: fewer than 4
# leave no exact bucket to divide by, 256 or more put the exact ones beyond 128.
BUCKETS = Key("n_rel_buckets", A.REL_BUCKETS_COUNT, int, required=True, minimum=4, maximum=255)
REQUIRED = (L.FEED_FORWARD_LENGTH, A.HEAD_COUNT, A.LAYERNORM_RMS_EPS)


@dataclass(frozen=True)
class Stack:
    """The tensors of one stack (encoder or decoder), by the role each plays in a block."""

    attn_norm: T
    q: T
    k: T
    v: T
    out: T
    rel_b: T
    ffn_norm: T
    gate: T
    up: T
    down: T
    output_norm: T


ENCODER = Stack(T.ENC_ATTN_NORM, T.ENC_ATTN_Q, T.ENC_ATTN_K, T.ENC_ATTN_V, T.ENC_ATTN_OUT, T.ENC_ATTN_REL_B,
                T.ENC_FFN_NORM, T.ENC_FFN_GATE, T.ENC_FFN_UP, T.ENC_FFN_DOWN, T.ENC_OUTPUT_NORM)
DECODER = Stack(T.DEC_ATTN_NORM, T.DEC_ATTN_Q, T.DEC_ATTN_K, T.DEC_ATTN_V, T.DEC_ATTN_OUT, T.DEC_ATTN_REL_B,
                T.DEC_FFN_NORM, T.DEC_FFN_GATE, T.DEC_FFN_UP, T.DEC_FFN_DOWN, T.DEC_OUTPUT_NORM)
# The decoder's matrices llama.cpp's loader takes scales beside, named by their roles (blk.<il>.attn_q.scale, ...)
# and for its first block_count layers only; the decoder's graph reads those of Q, K, V and the output
DECODER_SCALED = (T.ATTN_Q, T.ATTN_K, T.ATTN_V, T.ATTN_OUT, T.FFN_GATE, T.FFN_DOWN, T.FFN_UP)


# ---- blocks: both stacks are made of the first two, the decoder adds cross-attention ---------------------


def kept_attention(hp: HParams, causal: bool) -> Attention:
    """What a block's self-attention keeps: K/V of every head, relative-bucketed positions."""
    return Attention(hp.n_embd_k_gqa, hp.n_embd_v_gqa, causal=causal, rel_buckets=hp.n_rel_buckets)


def head_tensors(hp: HParams, s: Stack) -> list[TensorSpec]:
    E = hp.n_embd
    return [spec(T.TOKEN_EMBD, (E, hp.n_vocab)),
            spec(T.OUTPUT, (E, hp.n_vocab), tied_to=tensor_name(T.TOKEN_EMBD)),  # only the decoder reads it
            spec(s.output_norm, (E,), kind="vector")]


def block_tensors(hp: HParams, s: Stack, il: int) -> list[TensorSpec]:
    E, F, Eq, Ek, Ev = hp.n_embd, hp.n_ff, hp.n_embd_head_k * hp.n_head, hp.n_embd_k_gqa, hp.n_embd_v_gqa
    # llama.cpp loads every rel_b as optional, but builds no graph without layer 0's (the others fall back to it)
    return [spec(s.attn_norm, (E,), il, kind="vector"), spec(s.rel_b, (hp.n_head, hp.n_rel_buckets), il, optional=il > 0),
            spec(s.q, (E, Eq), il), spec(s.k, (E, Ek), il), spec(s.v, (E, Ev), il),
            spec(s.out, (Ev * hp.n_head // hp.n_head_kv, E), il),
            spec(s.ffn_norm, (E,), il, kind="vector"), spec(s.gate, (E, F), il, optional=True),
            spec(s.up, (E, F), il), spec(s.down, (F, E), il)]


def attention_block(b: GraphBuilder, s: Stack, x: Node, il: int) -> Node:
    """Pre-norm self-attention with the relative position bias and no score scaling, plus the residual; each
    projection times its scale where the model declares one (the decoder's)."""
    hp, T_ = b.hp, b.n_tokens
    h = b.norm(x, s.attn_norm, il, name="attn_norm")
    d, H, Hkv = hp.n_embd_head_k, hp.n_head, hp.n_head_kv
    qc = b.reshape(b.linear(h, b.w(s.q, il), name="Qcur", s=b.scale(T.ATTN_Q, il)), (d, H, T_),
                   name="Qcur.heads")
    kc = b.reshape(b.linear(h, b.w(s.k, il), name="Kcur", s=b.scale(T.ATTN_K, il)), (d, Hkv, T_),
                   name="Kcur.heads")
    vc = b.reshape(b.linear(h, b.w(s.v, il), name="Vcur", s=b.scale(T.ATTN_V, il)),
                   (hp.n_embd_head_v, Hkv, T_), name="Vcur.heads")
    table = b.w(s.rel_b, il) if tensor_name(s.rel_b, il) in b.tensors else b.w(s.rel_b, 0)
    a = b.build_attn(qc, kc, vc, wo=b.w(s.out, il), wo_s=b.scale(T.ATTN_OUT, il), kq_scale=1.0,
                     kq_b=b.build_pos_bias(table))
    return b.op("add", a, x, name="attn_res")


def ffn_block(b: GraphBuilder, s: Stack, x: Node, il: int) -> Node:
    """Pre-norm FFN, GELU-gated when the layer has a gate (v1.1, FLAN) and ReLU otherwise, plus the residual."""
    h = b.norm(x, s.ffn_norm, il, name="ffn_norm")
    g = b.w_opt(s.gate, il)
    f = b.build_ffn(h, up=b.w(s.up, il), gate=g, down=b.w(s.down, il), act=Act.GELU if g is not None else Act.RELU,
                    gate_mode=Gate.PAR)
    return b.op("add", f, x, name="l_out")


def cross_attention(b: GraphBuilder, x: Node, il: int) -> Node:
    """Pre-norm attention of the decoder tokens over their sequences' encoder output (the caller adds the residual)."""
    hp = b.hp
    enc = b.build_inp_cross()
    d, H, Hkv, n_enc = hp.n_embd_head_k, hp.n_head, hp.n_head_kv, enc.shape[1]
    h = b.norm(x, T.DEC_CROSS_ATTN_NORM, il, name="attn_norm_cross")
    qc = b.reshape(b.linear(h, b.w(T.DEC_CROSS_ATTN_Q, il), name="Qcross"), (d, H, b.n_tokens), name="Qcross.heads")
    kc = b.reshape(b.linear(enc, b.w(T.DEC_CROSS_ATTN_K, il), name="Kcross"), (d, Hkv, n_enc), name="Kcross.heads")
    vc = b.reshape(b.linear(enc, b.w(T.DEC_CROSS_ATTN_V, il), name="Vcross"), (hp.n_embd_head_v, Hkv, n_enc),
                   name="Vcross.heads")
    return b.build_cross_attn(qc, kc, vc, wo=b.w(T.DEC_CROSS_ATTN_OUT, il), kq_scale=1.0)


# ---- the two stacks ------------------------------------------------------------------------------------------


class T5Encoder(Architecture):
    """The encoder stack: what ``encode`` runs for a t5 model, and all a t5encoder file holds."""

    name = "t5encoder"
    causal = False
    required_keys = REQUIRED
    keys = (BUCKETS,)

    def layers(self) -> LayerNeeds:
        return (kept_attention(self.hp, self.causal),) * self.hp.n_layer

    def tensors(self) -> list[TensorSpec]:
        return head_tensors(self.hp, ENCODER) + [t for il in range(self.hp.n_layer)
                                                 for t in block_tensors(self.hp, ENCODER, il)]

    def build(self, b: GraphBuilder) -> None:
        x = b.build_inp_embd(b.w(T.TOKEN_EMBD))
        for il in b.layers():
            x = attention_block(b, ENCODER, x, il)
            x, = b.last_layer_rows((x, "out_rows"))  # llama.cpp gathers the two addends; their sum's rows are the same
            x = ffn_block(b, ENCODER, x, il)
        b.build_output(b.norm(x, ENCODER.output_norm, name="result_norm"))


class T5(Architecture):
    """The decoder stack (this class's layers and graphs), with :class:`T5Encoder` as the encoder."""

    name = "t5"
    encoder = T5Encoder
    required_keys = REQUIRED
    keys = (BUCKETS, Key("n_dec_layer", L.DECODER_BLOCK_COUNT, int, default_from="n_layer", **LAYER_COUNT),
            Key("decoder_start", L.DECODER_START_TOKEN_ID, int, -1))  # -1: none (generation starts at BOS)

    def layers(self) -> LayerNeeds:
        return ((kept_attention(self.hp, self.causal), CrossAttention(self.hp.n_embd)),) * self.hp.n_dec_layer

    def decoder_start(self) -> int | None:
        return self.hp.decoder_start if self.hp.decoder_start >= 0 else None

    def tensors(self) -> list[TensorSpec]:
        hp = self.hp
        E, Eq, Ek, Ev = hp.n_embd, hp.n_embd_head_k * hp.n_head, hp.n_embd_k_gqa, hp.n_embd_v_gqa
        enc = T5Encoder(hp).tensors()
        shared = {t.name for t in enc}
        dec = head_tensors(hp, DECODER)
        for il in range(hp.n_dec_layer):
            dec += block_tensors(hp, DECODER, il) + [
                spec(T.DEC_CROSS_ATTN_NORM, (E,), il, kind="vector"), spec(T.DEC_CROSS_ATTN_Q, (E, Eq), il),
                spec(T.DEC_CROSS_ATTN_K, (E, Ek), il), spec(T.DEC_CROSS_ATTN_V, (E, Ev), il),
                spec(T.DEC_CROSS_ATTN_OUT, (Ev * hp.n_head // hp.n_head_kv, E), il),
                spec(T.DEC_CROSS_ATTN_REL_B, (hp.n_head, hp.n_rel_buckets), il, optional=True)]  # loaded, never read
            dec += scale_specs(il, DECODER_SCALED) if il < hp.n_layer else []
        return enc + [t for t in dec if t.name not in shared]

    def build(self, b: GraphBuilder) -> None:
        x = b.build_inp_embd(b.w(T.TOKEN_EMBD))
        for il in b.layers(self.hp.n_dec_layer):
            x = attention_block(b, DECODER, x, il)
            x = b.op("add", cross_attention(b, x, il), x, name="cross_res")
            x, = b.last_layer_rows((x, "out_rows"))
            x = ffn_block(b, DECODER, x, il)
        b.build_output(b.norm(x, DECODER.output_norm, name="result_norm"), b.w(T.OUTPUT))


# ---- Hugging Face: what convert_hf_to_gguf writes for T5 configs -----------------------------------------------

ENCODER_RULES: tuple[Rule, ...] = (
    hf(L.CONTEXT_LENGTH, "n_positions", default=512),
    hf(L.EMBEDDING_LENGTH, "d_model"),
    hf(L.FEED_FORWARD_LENGTH, "d_ff"),
    hf(L.BLOCK_COUNT, *BLOCKS),
    hf(A.HEAD_COUNT, "num_heads"),
    lambda c: {A.KEY_LENGTH: (d := c.find("d_kv")), A.VALUE_LENGTH: d},
    hf(A.LAYERNORM_EPS, "layer_norm_epsilon", kind="number"),
    hf(A.REL_BUCKETS_COUNT, "relative_attention_num_buckets"),
    hf(A.LAYERNORM_RMS_EPS, "layer_norm_epsilon", kind="number"),
    VOCAB,
)
# T5Config's defaults the converter sees
CONFIG_DEFAULTS = {"tie_word_embeddings": True, "layer_norm_epsilon": 1e-6, "relative_attention_num_buckets": 32}


def _gates(c: Config) -> str:
    gated = c.find("feed_forward_proj", kind="text", default="relu").startswith("gated-")
    return r"(enc|dec)\.blk\.\d+\.ffn_gate\.weight" if gated else ""


hf_config.register(Family("t5", ENCODER_RULES + (
    derived(L.DECODER_BLOCK_COUNT, lambda c: c.find("num_decoder_layers", default=None) or c.find(*BLOCKS)),
    hf(L.DECODER_START_TOKEN_ID, "decoder_start_token_id", kind="size"),
), CONFIG_DEFAULTS, _gates), "T5ForConditionalGeneration")
hf_config.register(Family("t5encoder", ENCODER_RULES, CONFIG_DEFAULTS, _gates), "T5EncoderModel")


# ---- presets: released models of this family, as their converted GGUFs declare them ---------------------


def _t5(E: int, n_layer: int, n_ff: int, n_head: int, gated: bool, tied: bool, source: str) -> Preset:
    """Only the first layer of each stack has a relative-bias table (the others share it); T5 v1.1 and FLAN-T5
    gate their FFN with GELU, and do not tie the head."""
    return Preset("t5", {
        L.CONTEXT_LENGTH: 512, L.EMBEDDING_LENGTH: E, L.BLOCK_COUNT: n_layer, L.DECODER_BLOCK_COUNT: n_layer,
        L.FEED_FORWARD_LENGTH: n_ff, A.HEAD_COUNT: n_head, A.KEY_LENGTH: 64, A.VALUE_LENGTH: 64,
        A.LAYERNORM_EPS: 1e-6, A.LAYERNORM_RMS_EPS: 1e-6, A.REL_BUCKETS_COUNT: 32, L.DECODER_START_TOKEN_ID: 0,
        L.VOCAB_SIZE: 32128,
    }, tied=tied, include=r"(enc|dec)\.blk\.\d+\.ffn_gate\.weight" if gated else "", source=source)


presets.register({
    "T5-small": _t5(512, 6, 2048, 8, False, True, "google-t5/t5-small config.json"),
    "T5-large": _t5(1024, 24, 4096, 16, False, True, "google-t5/t5-large config.json"),
    "flan-t5-xl": _t5(2048, 24, 5120, 32, True, False, "google/flan-t5-xl config.json"),
    # the encoder alone (T5EncoderModel), as text-to-image models use it: gated GELU, heads of 64
    "T5-v1.1-XXL-encoder": Preset("t5encoder", {
        L.CONTEXT_LENGTH: 512, L.EMBEDDING_LENGTH: 4096, L.BLOCK_COUNT: 24, L.FEED_FORWARD_LENGTH: 10240,
        A.HEAD_COUNT: 64, A.KEY_LENGTH: 64, A.VALUE_LENGTH: 64, A.LAYERNORM_EPS: 1e-6, A.LAYERNORM_RMS_EPS: 1e-6,
        A.REL_BUCKETS_COUNT: 32, L.VOCAB_SIZE: 32128,
    }, tied=False, include=r"enc\.blk\.\d+\.ffn_gate\.weight", source="google/t5-v1_1-xxl config.json (encoder)"),
})
