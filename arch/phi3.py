"""Phi-3 (Phi-3-mini, Phi-3.5-mini, Phi-4-mini): a pre-RMSNorm decoder with fused QKV, one fused gate+up
projection and LongRoPE.

Each block is ``x += attn(RMSNorm(x))`` then ``x += W_down (silu(g) * u)`` where ``[g; u] = W_up RMSNorm(x)``
(``ffn_up`` holds the gate rows first, then the up rows). Attention is grouped-query over NEOX-rotated Q and K,
with Q divided by sqrt(head size) before the scores (which are then not scaled again). RoPE may cover only the
first ``n_rot`` values of a head (Phi-4-mini: 3/4) and divides its frequencies by one of two learned
per-frequency factor vectors shared by all layers: the *short* ones for contexts up to the original training
context, the *long* ones beyond it (LongRoPE), so the graph depends on the context size. The checkpoints'
``sliding_window`` is read and ignored, as llama.cpp does: every layer attends to the whole context.
Reference: Abdin et al. 2024, "Phi-3 Technical Report"; Ding et al. 2024, "LongRoPE"; llama.cpp
src/models/phi3.cpp and llama_model::get_rope_factors.
"""

from __future__ import annotations

from typing import Mapping

from gguf import MODEL_TENSOR as T
from gguf import Keys

from graphir.arch.llama import Llama
from graphir.graph.ir import Node
from graphir.model.builder import GraphBuilder
from graphir.model.hparams import inv_sqrt
from graphir.model.tensors import TensorDecl, TensorSpec, spec, tensor_name
from graphir.model import presets
from graphir.model.presets import Preset


class Phi3(Llama):
    name = "phi3"
    rope_mode = "neox"  # HF rotate-half layout, kept by the converter

    def variant(self, n_ctx_seq: int) -> bool:
        """Whether a context of n_ctx_seq cells per sequence uses the long RoPE factors."""
        return n_ctx_seq > self.hp.n_ctx_orig_yarn

    # ---- tensors ---------------------------------------------------------------------------------------

    def head_tensors(self) -> list[TensorSpec]:
        return super().head_tensors()[:1]  # llama.cpp's phi3 reads no output.bias

    def rope_tensors(self) -> list[TensorSpec]:
        n = self.hp.n_rot // 2
        return [spec(T.ROPE_FACTORS_LONG, (n,), kind="vector", optional=True),
                spec(T.ROPE_FACTORS_SHORT, (n,), kind="vector", optional=True)]

    def mix_tensors(self, il: int) -> list[TensorSpec]:
        """One fused projection (what the converter writes), or three; each with an optional bias."""
        E, E_gqa = self.hp.n_embd, self.hp.n_embd_v_gqa
        return [
            spec(T.ATTN_QKV, (E, E + 2 * E_gqa), il, optional=True),
            spec(T.ATTN_QKV, (E + 2 * E_gqa,), il, "bias", kind="vector", optional=True),
            *(spec(t, (E, w), il, optional=True) for t, w in ((T.ATTN_Q, E), (T.ATTN_K, E_gqa), (T.ATTN_V, E_gqa))),
            *(spec(t, (w,), il, "bias", kind="vector", optional=True)
              for t, w in ((T.ATTN_Q, E), (T.ATTN_K, E_gqa), (T.ATTN_V, E_gqa))),
            spec(T.ATTN_OUT, (E, E), il),
        ]

    def ffn_tensors(self, il: int) -> list[TensorSpec]:
        E, F = self.hp.n_embd, self.hp.n_ff
        return [spec(T.FFN_NORM, (E,), il, kind="vector"), spec(T.FFN_UP, (E, 2 * F), il),  # [gate; up]
                spec(T.FFN_DOWN, (F, E), il)]

    def check(self, tensors: Mapping[str, TensorDecl]) -> list[str]:
        missing = [f"missing tensor '{tensor_name(T.ATTN_QKV, il)}'" for il in range(self.hp.n_layer)
                   if tensor_name(T.ATTN_QKV, il) not in tensors and tensor_name(T.ATTN_Q, il) not in tensors]
        return super().check(tensors) + missing

    # ---- what Phi-3 varies -------------------------------------------------------------------------------

    out_bias = False

    def rope_factors(self, b: GraphBuilder) -> Node | None:
        return b.w(T.ROPE_FACTORS_LONG if self.variant(b.n_ctx_seq) else T.ROPE_FACTORS_SHORT)

    def q_scale(self) -> float:
        return inv_sqrt(self.hp.n_embd_head_k)

    def lm_head(self, b: GraphBuilder) -> tuple[Node | None, Node | None]:
        return b.w(T.OUTPUT), None

    def ffn(self, b: GraphBuilder, h: Node, il: int) -> Node:
        """SwiGLU over the two halves of one projection: silu(gate rows) * up rows."""
        gu = b.linear(h, b.w(T.FFN_UP, il), name="ffn_up")  # type: ignore[arg-type]
        F, n = gu.shape[0] // 2, gu.shape[1]  # type: ignore[operator]
        gate, up = (b.op("view", gu, shape=(F, n), strides=(1, 2 * F), offset=off, name=tag)
                    for tag, off in (("ffn_gate", 0), ("ffn_up.half", F)))
        return b.linear(b.op("swiglu", gate, up, name="ffn_swiglu"), b.w(T.FFN_DOWN, il), name="ffn_out")  # type: ignore[arg-type]


# ---- presets: released models of this family, as their converted GGUFs declare them ---------------------

L, A, R = Keys.LLM, Keys.Attention, Keys.Rope


def _phi3(n_ctx: int, n_head: int, n_head_kv: int, vocab: int, tied: bool, source: str,
          sliding_window: int = 262144) -> Preset:
    # fused attn_qkv; the converter writes sliding_window, which llama.cpp ignores. Beyond a 4096 original context
    # (LongRoPE) it adds rope_factors_long/short and rope.scaling.attn_factor = sqrt(1 + ln(32) / ln(4096)).
    long = n_ctx > 4096
    return Preset("phi3", {
        L.CONTEXT_LENGTH: n_ctx, R.SCALING_ORIG_CTX_LEN: 4096, L.EMBEDDING_LENGTH: 3072, L.FEED_FORWARD_LENGTH: 8192,
        L.BLOCK_COUNT: 32, A.HEAD_COUNT: n_head, A.HEAD_COUNT_KV: n_head_kv, A.LAYERNORM_RMS_EPS: 1e-5,
        R.DIMENSION_COUNT: 96, R.FREQ_BASE: 10000.0, **({R.SCALING_ATTN_FACTOR: (1 + 5 / 12) ** 0.5} if long else {}),
        A.SLIDING_WINDOW: sliding_window, L.VOCAB_SIZE: vocab,
    }, tied=tied, include=r"blk\.\d+\.attn_qkv\.weight" + (r"|rope_factors_(long|short)\.weight" if long else ""),
        source=source)


presets.register({
    "Phi-3-mini-4k": _phi3(4096, 32, 32, 32064, False, "microsoft/Phi-3-mini-4k-instruct config.json",
                           sliding_window=2047),
    "Phi-3.5-mini": _phi3(131072, 32, 32, 32064, False, "microsoft/Phi-3.5-mini-instruct config.json"),
    "Phi-4-mini": _phi3(131072, 24, 8, 200064, True, "microsoft/Phi-4-mini-instruct config.json "
                        "(partial_rotary_factor 0.75: 96 of 128 dims rotate)"),
})
