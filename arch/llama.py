"""The llama family: Llama 1-3 (GQA, RMSNorm, SwiGLU, RoPE), Qwen2 (q/k/v biases, NEOX RoPE), Qwen3
(per-head RMS norm of Q and K before RoPE) and SmolLM3 (no RoPE in every fourth layer).

References: Touvron et al. 2023, "LLaMA"; Qwen Team 2025, "Qwen3 Technical Report"; Hugging Face 2025,
"SmolLM3"; llama.cpp src/models/llama.cpp, qwen2.cpp, qwen3.cpp, smollm3.cpp.
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
        q, k, v = b.build_qkv(h, il)
        q, k = self.qk_norm(b, q, k, il)
        if self.roped(il):
            q = b.rope(q, pos, freq_factors, name="Qcur.rope")
            k = b.rope(k, pos, freq_factors, name="Kcur.rope")
        return b.build_attn(q, k, v, wo=b.w(T.ATTN_OUT, il), wo_b=b.w(T.ATTN_OUT, il, "bias"), kq_scale=b.kq_scale())

    def qk_norm(self, b: GraphBuilder, q: Node, k: Node, il: int) -> tuple[Node, Node]:
        """What happens to Q and K heads before RoPE: nothing in Llama."""
        return q, k

    def roped(self, il: int) -> bool:
        """Whether layer il rotates Q and K (every layer in Llama)."""
        return True

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


class Qwen3(Llama):
    name = "qwen3"
    rope_mode = "neox"

    def mix_tensors(self, il: int) -> list[TensorSpec]:
        d = self.hp.n_embd_head_k
        return [*super().mix_tensors(il), spec(T.ATTN_Q_NORM, (d,), il, kind="vector"),
                spec(T.ATTN_K_NORM, (d,), il, kind="vector")]

    def qk_norm(self, b: GraphBuilder, q: Node, k: Node, il: int) -> tuple[Node, Node]:
        """QK-norm: each head of Q and K RMS-normalised over its own d values, with a learned scale."""
        return (b.build_norm(q, b.w(T.ATTN_Q_NORM, il), name="Qcur_normed"),
                b.build_norm(k, b.w(T.ATTN_K_NORM, il), name="Kcur_normed"))


class SmolLM3(Llama):
    name = "smollm3"
    no_rope_every = 4  # NoPE: the last of every four layers attends without positions (llama.cpp's fixed step)

    def roped(self, il: int) -> bool:
        return (il + 1) % self.no_rope_every != 0
