"""T5: an encoder-decoder transformer with relative position buckets (t5, and its encoder alone, t5encoder).

The encoder is bidirectional; the decoder attends causally to itself and, in every layer, to the encoder's
output. Positions enter only as a learned bias per head and per bucket of key-query distance, from the
first layer's table unless a layer has its own. Norms are RMS norms without mean and bias; attention scores
are not scaled; the FFN is ReLU (T5) or a GELU-gated pair (T5 v1.1, FLAN-T5), whichever the file holds. The
head is the untied ``output`` or the embedding, applied without the d_model^-0.5 rescale (as llama.cpp does).
Reference: Raffel et al. 2020, "Exploring the Limits of Transfer Learning ..."; llama.cpp src/models/t5.cpp.
"""

from __future__ import annotations

from gguf import MODEL_TENSOR as T
from gguf import Keys

from graphir.graph.ir import Node
from graphir.memory.layers import Attention, CrossAttention, LayerNeeds
from graphir.model.architecture import Architecture
from graphir.model.builder import Act, Gate, GraphBuilder
from graphir.model.hparams import LAYER_COUNT, Key
from graphir.model.tensors import TensorSpec, spec, tensor_name
from graphir.model import presets
from graphir.model.presets import Preset

# Half the buckets (of a direction) are exact distances, the rest log-spaced up to 128 positions: fewer than 4
# leave no exact bucket to divide by, 256 or more put the exact ones beyond 128.
BUCKETS = Key("n_rel_buckets", Keys.Attention.REL_BUCKETS_COUNT, int, required=True, minimum=4, maximum=255)

# One stack's tensor names: (attn_norm, q, k, v, out, rel_b, ffn_norm, gate, up, down), output norm.
ENCODER = (T.ENC_ATTN_NORM, T.ENC_ATTN_Q, T.ENC_ATTN_K, T.ENC_ATTN_V, T.ENC_ATTN_OUT, T.ENC_ATTN_REL_B,
           T.ENC_FFN_NORM, T.ENC_FFN_GATE, T.ENC_FFN_UP, T.ENC_FFN_DOWN), T.ENC_OUTPUT_NORM
DECODER = (T.DEC_ATTN_NORM, T.DEC_ATTN_Q, T.DEC_ATTN_K, T.DEC_ATTN_V, T.DEC_ATTN_OUT, T.DEC_ATTN_REL_B,
           T.DEC_FFN_NORM, T.DEC_FFN_GATE, T.DEC_FFN_UP, T.DEC_FFN_DOWN), T.DEC_OUTPUT_NORM
CROSS = (T.DEC_CROSS_ATTN_NORM, T.DEC_CROSS_ATTN_Q, T.DEC_CROSS_ATTN_K, T.DEC_CROSS_ATTN_V, T.DEC_CROSS_ATTN_OUT)


class T5Encoder(Architecture):
    """The encoder stack: what ``encode`` runs for a t5 model, and all a t5encoder file holds."""

    name = "t5encoder"
    causal = False
    required_keys = (Keys.LLM.FEED_FORWARD_LENGTH, Keys.Attention.HEAD_COUNT, Keys.Attention.LAYERNORM_RMS_EPS)
    keys = (BUCKETS,)
    n_stack = "n_layer"  # the hparam counting this stack's layers
    names = ENCODER

    @property
    def n_blocks(self) -> int:
        return int(getattr(self.hp, self.n_stack))

    def attention(self) -> Attention:
        hp = self.hp
        return Attention(hp.n_embd_k_gqa, hp.n_embd_v_gqa, causal=self.causal, rel_buckets=hp.n_rel_buckets)

    def layers(self) -> LayerNeeds:
        return (self.attention(),) * self.n_blocks

    def head_tensors(self) -> list[TensorSpec]:
        E = self.hp.n_embd
        return [spec(T.TOKEN_EMBD, (E, self.hp.n_vocab)),
                spec(T.OUTPUT, (E, self.hp.n_vocab), tied_to=tensor_name(T.TOKEN_EMBD)),  # only a decoder reads it
                spec(self.names[1], (E,), kind="vector")]

    def block_tensors(self, il: int) -> list[TensorSpec]:
        hp = self.hp
        E, F, Eq, Ek, Ev = hp.n_embd, hp.n_ff, hp.n_embd_head_k * hp.n_head, hp.n_embd_k_gqa, hp.n_embd_v_gqa
        attn_norm, q, k, v, out, rel_b, ffn_norm, gate, up, down = self.names[0]
        # llama.cpp loads every rel_b as optional, but builds no graph without layer 0's (the others fall back to it)
        return [spec(attn_norm, (E,), il, kind="vector"), spec(rel_b, (hp.n_head, hp.n_rel_buckets), il, optional=il > 0),
                spec(q, (E, Eq), il), spec(k, (E, Ek), il), spec(v, (E, Ev), il), spec(out, (Ev * hp.n_head // hp.n_head_kv, E), il),
                spec(ffn_norm, (E,), il, kind="vector"), spec(gate, (E, F), il, optional=True),
                spec(up, (E, F), il), spec(down, (F, E), il)]

    def tensors(self) -> list[TensorSpec]:
        return self.head_tensors() + [t for il in range(self.n_blocks) for t in self.block_tensors(il)]

    def self_attention(self, b: GraphBuilder, x: Node, il: int) -> Node:
        """Pre-norm self-attention with the relative position bias and no score scaling, plus the residual."""
        attn_norm, q, k, v, out, rel_b, *_ = self.names[0]
        hp, T_ = self.hp, b.n_tokens
        h = b.build_norm(x, b.w(attn_norm, il), name="attn_norm")
        d, H, Hkv = hp.n_embd_head_k, hp.n_head, hp.n_head_kv
        qc = b.reshape(b.linear(h, b.w(q, il), name="Qcur"), (d, H, T_), name="Qcur.heads")
        kc = b.reshape(b.linear(h, b.w(k, il), name="Kcur"), (d, Hkv, T_), name="Kcur.heads")
        vc = b.reshape(b.linear(h, b.w(v, il), name="Vcur"), (hp.n_embd_head_v, Hkv, T_), name="Vcur.heads")
        table = b.w(rel_b, il) if tensor_name(rel_b, il) in b.tensors else b.w(rel_b, 0)
        a = b.build_attn(qc, kc, vc, wo=b.w(out, il), kq_scale=1.0, kq_b=b.build_pos_bias(table))
        return b.op("add", a, x, name="attn_res")

    def ffn(self, b: GraphBuilder, x: Node, il: int) -> Node:
        """Pre-norm FFN, GELU-gated when the layer has a gate (v1.1, FLAN) and ReLU otherwise, plus the residual."""
        ffn_norm, gate, up, down = self.names[0][6:]
        h = b.build_norm(x, b.w(ffn_norm, il), name="ffn_norm")
        g = b.w(gate, il)
        f = b.build_ffn(h, up=b.w(up, il), gate=g, down=b.w(down, il), act=Act.GELU if g is not None else Act.RELU,
                        gate_mode=Gate.PAR)
        return b.op("add", f, x, name="l_out")

    def attend(self, b: GraphBuilder, x: Node, il: int) -> Node:
        """What a block does before its FFN: self-attention (the decoder adds cross-attention)."""
        return self.self_attention(b, x, il)

    def head(self, b: GraphBuilder) -> Node | None:
        return None  # the encoder's output is its embeddings

    def build(self, b: GraphBuilder) -> None:
        x = b.build_inp_embd(b.w(T.TOKEN_EMBD))
        out_ids = b.build_inp_out_ids()
        for il in range(self.n_blocks):
            with b.layer(il):
                x = self.attend(b, x, il)
                if il == self.n_blocks - 1:  # llama.cpp gathers the two addends; their sum's rows are the same
                    x = b.op("get_rows", x, out_ids, name="out_rows")
                x = self.ffn(b, x, il)
        b.build_output(b.build_norm(x, b.w(self.names[1]), name="result_norm"), self.head(b))


class T5(T5Encoder):
    """The decoder stack (this class's layers and graphs), with :class:`T5Encoder` as the encoder."""

    name = "t5"
    causal = True
    encoder = T5Encoder
    keys = (BUCKETS, Key("n_dec_layer", Keys.LLM.DECODER_BLOCK_COUNT, int, default_from="n_layer", **LAYER_COUNT),
            Key("decoder_start", Keys.LLM.DECODER_START_TOKEN_ID, int, -1))  # -1: none (generation starts at BOS)
    n_stack = "n_dec_layer"
    names = DECODER

    def layers(self) -> LayerNeeds:
        return ((self.attention(), CrossAttention(self.hp.n_embd)),) * self.n_blocks

    def decoder_start(self) -> int | None:
        return self.hp.decoder_start if self.hp.decoder_start >= 0 else None

    def block_tensors(self, il: int) -> list[TensorSpec]:
        hp = self.hp
        E, Eq, Ek, Ev = hp.n_embd, hp.n_embd_head_k * hp.n_head, hp.n_embd_k_gqa, hp.n_embd_v_gqa
        norm, q, k, v, out = CROSS
        return super().block_tensors(il) + [
            spec(norm, (E,), il, kind="vector"), spec(q, (E, Eq), il), spec(k, (E, Ek), il), spec(v, (E, Ev), il),
            spec(out, (Ev * hp.n_head // hp.n_head_kv, E), il),
            spec(T.DEC_CROSS_ATTN_REL_B, (hp.n_head, hp.n_rel_buckets), il, optional=True)]  # loaded, never read

    def tensors(self) -> list[TensorSpec]:
        enc = T5Encoder(self.hp).tensors()
        shared = {t.name for t in enc}
        return enc + [t for t in super().tensors() if t.name not in shared]

    def cross_attention(self, b: GraphBuilder, x: Node, il: int) -> Node:
        """Pre-norm attention of the decoder tokens over their sequences' encoder output (attend adds the residual)."""
        norm, q, k, v, out = CROSS
        hp = self.hp
        enc = b.build_inp_cross()
        d, H, Hkv, n_enc = hp.n_embd_head_k, hp.n_head, hp.n_head_kv, enc.shape[1]
        h = b.build_norm(x, b.w(norm, il), name="attn_norm_cross")
        qc = b.reshape(b.linear(h, b.w(q, il), name="Qcross"), (d, H, b.n_tokens), name="Qcross.heads")
        kc = b.reshape(b.linear(enc, b.w(k, il), name="Kcross"), (d, Hkv, n_enc), name="Kcross.heads")
        vc = b.reshape(b.linear(enc, b.w(v, il), name="Vcross"), (hp.n_embd_head_v, Hkv, n_enc), name="Vcross.heads")
        return b.build_cross_attn(qc, kc, vc, wo=b.w(out, il), kq_scale=1.0)

    def attend(self, b: GraphBuilder, x: Node, il: int) -> Node:
        x = self.self_attention(b, x, il)
        return b.op("add", self.cross_attention(b, x, il), x, name="cross_res")

    def head(self, b: GraphBuilder) -> Node | None:
        return b.w(T.OUTPUT)


# ---- presets: released models of this family, as their converted GGUFs declare them ---------------------

L, A = Keys.LLM, Keys.Attention


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
