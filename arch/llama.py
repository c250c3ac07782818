"""The llama family: Llama 1-3 (GQA, RMSNorm, SwiGLU, RoPE) and Qwen2 (q/k/v biases, NEOX RoPE).

Reference: Touvron et al. 2023, "LLaMA"; llama.cpp src/models/llama.cpp and qwen2.cpp.
"""

from __future__ import annotations

from gguf import MODEL_TENSOR as T
from gguf import Keys

from graphir.model.architecture import Architecture
from graphir.model.builder import GraphBuilder
from graphir.graph.ir import Node
from graphir.model.tensors import TensorSpec, spec, tensor_name


class Llama(Architecture):
    name = "llama"
    rope_mode = "norm"  # the converter permuted Q/K rows so that adjacent pairs rotate
    required_keys = (Keys.LLM.FEED_FORWARD_LENGTH, Keys.Attention.HEAD_COUNT, Keys.Attention.LAYERNORM_RMS_EPS)
    qkv_bias = False  # q/k/v biases are optional extras

    def tensors(self) -> list[TensorSpec]:
        hp = self.hp
        E, V = hp.n_embd, hp.n_vocab
        specs = [
            spec(T.TOKEN_EMBD, (E, V)),
            spec(T.OUTPUT_NORM, (E,), kind="vector"),
            spec(T.OUTPUT, (E, V), tied_to=tensor_name(T.TOKEN_EMBD)),
            spec(T.OUTPUT, (V,), suffix="bias", kind="vector", optional=True),
            spec(T.ROPE_FREQS, (hp.n_rot // 2,), kind="vector", optional=True),
        ]
        for il in range(hp.n_layer):
            specs += [spec(T.ATTN_NORM, (E,), il, kind="vector"), *self.mix_tensors(il), *self.ffn_tensors(il)]
        return specs

    def mix_tensors(self, il: int) -> list[TensorSpec]:
        """Layer il's token mixing: self-attention's projections."""
        hp = self.hp
        E, q_out, kv_out, v_out = hp.n_embd, hp.head_count(il) * hp.n_embd_head_k, hp.n_embd_k_gqa_at(il), \
            hp.n_embd_v_gqa_at(il)
        return [
            spec(T.ATTN_Q, (E, q_out), il),
            spec(T.ATTN_K, (E, kv_out), il),
            spec(T.ATTN_V, (E, v_out), il),
            spec(T.ATTN_OUT, (hp.head_count(il) * hp.n_embd_head_v, E), il),
            spec(T.ATTN_Q, (q_out,), il, "bias", kind="vector", optional=not self.qkv_bias),
            spec(T.ATTN_K, (kv_out,), il, "bias", kind="vector", optional=not self.qkv_bias),
            spec(T.ATTN_V, (v_out,), il, "bias", kind="vector", optional=not self.qkv_bias),
            spec(T.ATTN_OUT, (E,), il, "bias", kind="vector", optional=True),
        ]

    def ffn_tensors(self, il: int) -> list[TensorSpec]:
        E, F = self.hp.n_embd, self.hp.ff_length(il)
        return [
            spec(T.FFN_NORM, (E,), il, kind="vector"),
            spec(T.FFN_GATE, (E, F), il),
            spec(T.FFN_UP, (E, F), il),
            spec(T.FFN_DOWN, (F, E), il),
        ]

    def mix(self, b: GraphBuilder, h: Node, pos: Node, freq_factors: Node | None, il: int) -> Node:
        """Layer il's token mixing: RoPE'd grouped-query self-attention, through whatever memory the layer has."""
        hp = self.hp
        d, H, Hkv, T_ = hp.n_embd_head_k, hp.head_count(il), hp.head_count_kv(il), b.n_tokens
        q = b.linear(h, b.w(T.ATTN_Q, il), b.w(T.ATTN_Q, il, "bias"), name="Qcur")
        k = b.linear(h, b.w(T.ATTN_K, il), b.w(T.ATTN_K, il, "bias"), name="Kcur")
        v = b.linear(h, b.w(T.ATTN_V, il), b.w(T.ATTN_V, il, "bias"), name="Vcur")
        q = b.rope(b.reshape(q, (d, H, T_), name="Qcur.heads"), pos, freq_factors, name="Qcur.rope")
        k = b.rope(b.reshape(k, (d, Hkv, T_), name="Kcur.heads"), pos, freq_factors, name="Kcur.rope")
        v = b.reshape(v, (hp.n_embd_head_v, Hkv, T_), name="Vcur.heads")
        return b.build_attn(q, k, v, wo=b.w(T.ATTN_OUT, il), wo_b=b.w(T.ATTN_OUT, il, "bias"), kq_scale=b.kq_scale())

    def build(self, b: GraphBuilder) -> None:
        hp = self.hp
        x = b.build_inp_embd(b.w(T.TOKEN_EMBD))
        pos = b.build_inp_pos()
        out_ids = b.build_inp_out_ids()
        freq_factors = b.w(T.ROPE_FREQS)  # Llama-3.1 style per-frequency divisors, when present
        for il in range(hp.n_layer):
            with b.layer(il):
                h = b.build_norm(x, b.w(T.ATTN_NORM, il), name="attn_norm")
                a = self.mix(b, h, pos, freq_factors, il)
                if il == hp.n_layer - 1:  # only requested rows go through the last FFN and the head
                    a = b.op("get_rows", a, out_ids, name="attn_out.rows")
                    x = b.op("get_rows", x, out_ids, name="inp.rows")
                x = b.op("add", a, x, name="ffn_inp")
                h = b.build_norm(x, b.w(T.FFN_NORM, il), name="ffn_norm")
                f = b.build_ffn(h, up=b.w(T.FFN_UP, il), gate=b.w(T.FFN_GATE, il), down=b.w(T.FFN_DOWN, il))
                x = b.op("add", f, x, name="l_out")
        x = b.build_norm(x, b.w(T.OUTPUT_NORM), name="result_norm")
        b.build_output(x, b.w(T.OUTPUT), b.w(T.OUTPUT, suffix="bias"))


class Qwen2(Llama):
    name = "qwen2"
    rope_mode = "neox"  # HF rotate-half layout, kept by the converter
    qkv_bias = True
