"""Encoder-only transformers: BERT (learned positions, post-LN, GELU MLP) and nomic-bert (RoPE, SwiGLU).

Attention is bidirectional within each sequence and there is no LM head: the output is one embedding per
token, reduced per sequence by the context's pooling. Token types are not an input: row 0 of the type table
("sentence A") is added to every token, as llama.cpp does.
Reference: Devlin et al. 2019, "BERT"; Nussbaum et al. 2024, "Nomic Embed"; llama.cpp src/models/bert.cpp.
"""

from __future__ import annotations

from gguf import MODEL_TENSOR as T
from gguf import Keys

from graphir.model.architecture import Architecture
from graphir.model.builder import Act, Gate, GraphBuilder, Norm
from graphir.graph.ir import Node
from graphir.model.tensors import TensorSpec, spec, with_bias
from gguf import PoolingType
from graphir.model import presets
from graphir.model.presets import Preset


class Bert(Architecture):
    name = "bert"
    rope_mode = "neox"  # declared by llama.cpp for the family; BERT itself rotates nothing
    causal = False  # bidirectional attention: its layers need no cache, so the context keeps none
    learned_positions = True
    required_keys = (Keys.LLM.FEED_FORWARD_LENGTH, Keys.Attention.HEAD_COUNT, Keys.Attention.LAYERNORM_EPS)

    def tensors(self) -> list[TensorSpec]:
        hp = self.hp
        E, F, E_gqa = hp.n_embd, hp.n_ff, hp.n_embd_k_gqa
        specs = [
            spec(T.TOKEN_EMBD, (E, hp.n_vocab)),
            spec(T.TOKEN_TYPES, (E, max(hp.n_token_types, 1)), optional=True),
            *with_bias(T.TOKEN_EMBD_NORM, (E,)),
        ]
        if self.learned_positions:
            specs.append(spec(T.POS_EMBD, (E, hp.n_ctx_train)))
        for il in range(hp.n_layer):
            specs += [
                *with_bias(T.ATTN_QKV, (E, E + 2 * E_gqa), il, optional=True),
                spec(T.ATTN_Q, (E, E), il, optional=True),
                spec(T.ATTN_K, (E, E_gqa), il, optional=True),
                spec(T.ATTN_V, (E, E_gqa), il, optional=True),
                spec(T.ATTN_Q, (E,), il, "bias", kind="vector", optional=True),
                spec(T.ATTN_K, (E_gqa,), il, "bias", kind="vector", optional=True),
                spec(T.ATTN_V, (E_gqa,), il, "bias", kind="vector", optional=True),
                *with_bias(T.ATTN_OUT, (E, E), il, bias_optional=True),
                *with_bias(T.ATTN_OUT_NORM, (E,), il),
                spec(T.FFN_UP, (E, F), il),
                spec(T.FFN_DOWN, (F, E), il),
                *with_bias(T.LAYER_OUT_NORM, (E,), il),
            ] + self.ffn_tensors(il)
        return specs

    def ffn_tensors(self, il: int) -> list[TensorSpec]:
        E, F = self.hp.n_embd, self.hp.n_ff
        return [spec(T.FFN_UP, (F,), il, "bias", kind="vector"), spec(T.FFN_DOWN, (E,), il, "bias", kind="vector")]

    def embed(self, b: GraphBuilder, pos: Node) -> Node:
        x = b.build_inp_embd(b.w(T.TOKEN_EMBD))
        types = b.w(T.TOKEN_TYPES)
        if types is not None:
            row0 = b.op("view", types, shape=(self.hp.n_embd,), strides=(1,), offset=0, name="token_types.row0")
            x = b.op("add", x, row0, name="inp_embd.types")
        if self.learned_positions:
            x = b.op("add", b.op("get_rows", b.w(T.POS_EMBD), pos, name="inp_pos_embd"), x, name="inp_embd.pos")
        return x

    def rope_qk(self, b: GraphBuilder, q: Node, k: Node, pos: Node) -> tuple[Node, Node]:
        return q, k  # BERT's positions are the learned table added to the input

    def ffn(self, b: GraphBuilder, x: Node, il: int) -> Node:
        return b.build_ffn(x, up=b.w(T.FFN_UP, il), up_b=b.w(T.FFN_UP, il, "bias"), gate=None,
                           down=b.w(T.FFN_DOWN, il), down_b=b.w(T.FFN_DOWN, il, "bias"), act=Act.GELU)

    def build(self, b: GraphBuilder) -> None:
        hp = self.hp
        pos = b.build_inp_pos()
        x = self.embed(b, pos)
        x = b.build_norm(x, b.w(T.TOKEN_EMBD_NORM), b.w(T.TOKEN_EMBD_NORM, suffix="bias"), Norm.LAYER, name="inp_norm")
        out_ids = b.build_inp_out_ids()
        for il in range(hp.n_layer):
            with b.layer(il):
                q, k, v = b.build_qkv(x, il)
                q, k = self.rope_qk(b, q, k, pos)
                a = b.build_attn(q, k, v, wo=b.w(T.ATTN_OUT, il), wo_b=b.w(T.ATTN_OUT, il, "bias"),
                                 kq_scale=b.kq_scale())
                if il == hp.n_layer - 1:  # only requested rows go on
                    a = b.op("get_rows", a, out_ids, name="attn_out.rows")
                    x = b.op("get_rows", x, out_ids, name="inp.rows")
                x = b.build_norm(b.op("add", a, x, name="attn_res"), b.w(T.ATTN_OUT_NORM, il),
                                 b.w(T.ATTN_OUT_NORM, il, "bias"), Norm.LAYER, name="ffn_inp")
                f = self.ffn(b, x, il)
                x = b.build_norm(b.op("add", f, x, name="ffn_res"), b.w(T.LAYER_OUT_NORM, il),
                                 b.w(T.LAYER_OUT_NORM, il, "bias"), Norm.LAYER, name="l_out")
        b.build_output(x)


class NomicBert(Bert):
    """BERT with rotary positions (NEOX) instead of a position table, and a SwiGLU MLP without biases."""

    name = "nomic-bert"
    learned_positions = False
    required_keys = Bert.required_keys + (Keys.LLM.POOLING_TYPE,)

    def ffn_tensors(self, il: int) -> list[TensorSpec]:
        return [spec(T.FFN_GATE, (self.hp.n_embd, self.hp.n_ff), il)]

    def rope_qk(self, b: GraphBuilder, q: Node, k: Node, pos: Node) -> tuple[Node, Node]:
        return b.rope(q, pos, name="Qcur.rope"), b.rope(k, pos, name="Kcur.rope")

    def ffn(self, b: GraphBuilder, x: Node, il: int) -> Node:
        return b.build_ffn(x, up=b.w(T.FFN_UP, il), gate=b.w(T.FFN_GATE, il), down=b.w(T.FFN_DOWN, il),
                           act=Act.SILU, gate_mode=Gate.PAR)


# ---- presets: released models of this family, as their converted GGUFs declare them ---------------------

L, A, R = Keys.LLM, Keys.Attention, Keys.Rope


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
                  r"blk\.\d+\.attn_output\.bias", f32=r"position_embd\.weight|token_types\.weight", source=source)


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
})
