"""MiniCPM3 (minicpm3): MiniCPM's scaled pre-norm decoder with DeepSeek-V2's latent attention, decompressed.

Queries come through a low-rank projection (``q_lora_rank``, normalised), keys and values from one latent of
``kv_lora_rank`` values plus a RoPE'd key part shared by the heads (graphir.model.mla); K and V are decompressed
per head (``attn_kv_b``) and attend over an ordinary KV cache, scores by 1/sqrt(head size); a head may be all
RoPE'd (no part without positions). MiniCPM's constants
are fixed in llama.cpp's graph: embeddings times 12, both residual branches times 1.4 / sqrt(n_layer), the final
norm's output times 256 / n_embd before the LM head. RoPE divides by LongRoPE's long or short factors (the long
ones for contexts beyond the original one) where the file has them.
References: MiniCPM Team 2024, "MiniCPM3"; DeepSeek-AI 2024, "DeepSeek-V2"; llama.cpp src/models/minicpm3.cpp.
"""

from __future__ import annotations

import math

from gguf import MODEL_TENSOR as T
from gguf import Keys

from graphir.graph.floats import f32, inv_sqrt
from graphir.graph.ir import Node
from graphir.model import hf_config, presets
from graphir.model.architecture import Architecture
from graphir.model.builder import GraphBuilder
from graphir.model.hf_config import BLOCKS, VOCAB, Family, derived, hf
from graphir.model.hparams import HParams, Key
from graphir.model.mla import check_decompressed, decompressed_attention, latent_qkv
from graphir.model.presets import Preset
from graphir.model.rope_factors import long_context, rope_factor_tensors, rope_factors
from graphir.model.scales import layer_scales
from graphir.model.tensors import TensorSpec, spec, tensor_name

L, A, R = Keys.LLM, Keys.Attention, Keys.Rope
EMBD_SCALE, DEPTH_SCALE, EMBD_BASE = 12.0, f32(1.4), 256  # llama.cpp's constants of MiniCPM3's graph


class MiniCPM3(Architecture):
    name = "minicpm3"
    rope_mode = "neox"
    required_keys = (L.FEED_FORWARD_LENGTH, A.HEAD_COUNT, A.LAYERNORM_RMS_EPS, A.Q_LORA_RANK, A.KV_LORA_RANK)
    keys = (Key("n_lora_q", A.Q_LORA_RANK, int, 0, minimum=1), Key("n_lora_kv", A.KV_LORA_RANK, int, 0, minimum=1))

    def __init__(self, hp: HParams):
        check_decompressed(hp, self.name)
        super().__init__(hp)

    def variant(self, n_ctx_seq: int) -> bool:
        """Whether a context of n_ctx_seq cells per sequence takes the long RoPE factors."""
        return long_context(self.hp, n_ctx_seq)

    def tensors(self) -> list[TensorSpec]:
        hp = self.hp
        E, V, H = hp.n_embd, hp.n_vocab, hp.n_head
        d_nope, d_v, R_q, R_kv = hp.n_embd_head_k - hp.n_rot, hp.n_embd_head_v, hp.n_lora_q, hp.n_lora_kv
        specs = [spec(T.TOKEN_EMBD, (E, V)), spec(T.OUTPUT_NORM, (E,), kind="vector"),
                 spec(T.OUTPUT, (E, V), tied_to=tensor_name(T.TOKEN_EMBD)), *rope_factor_tensors(hp, True)]
        for il in range(hp.n_layer):
            F = hp.ff_length(il)
            layer = [spec(T.ATTN_NORM, (E,), il, kind="vector"), spec(T.ATTN_Q_A_NORM, (R_q,), il, kind="vector"),
                     spec(T.ATTN_KV_A_NORM, (R_kv,), il, kind="vector"), spec(T.ATTN_Q_A, (E, R_q), il),
                     spec(T.ATTN_Q_B, (R_q, H * hp.n_embd_head_k), il),
                     spec(T.ATTN_KV_A_MQA, (E, R_kv + hp.n_rot), il), spec(T.ATTN_KV_B, (R_kv, H * (d_nope + d_v)), il),
                     spec(T.ATTN_OUT, (H * d_v, E), il), spec(T.FFN_NORM, (E,), il, kind="vector"),
                     spec(T.FFN_GATE, (E, F), il), spec(T.FFN_DOWN, (F, E), il), spec(T.FFN_UP, (E, F), il)]
            specs += layer + layer_scales(layer, il)  # read: attention's output scale alone
        return specs

    def rope(self, b: GraphBuilder, x: Node, pos: Node, name: str) -> Node:
        return b.rope(x, pos, rope_factors(b), name=name)

    def build(self, b: GraphBuilder) -> None:
        hp = self.hp
        x = b.op("scale", b.build_inp_embd(b.w(T.TOKEN_EMBD)), s=EMBD_SCALE, name="inp_scaled")
        pos = b.build_inp_pos()
        scale_res = f32(DEPTH_SCALE / f32(math.sqrt(hp.n_layer)))
        for il in b.layers():
            h = b.norm(x, T.ATTN_NORM, il, name="attn_norm")
            # self-attention: a compressed query, K and V decompressed from the latent
            q = b.linear(h, b.w(T.ATTN_Q_A, il), name="q_a")
            q = b.linear(b.norm(q, T.ATTN_Q_A_NORM, il, name="q_a_norm"), b.w(T.ATTN_Q_B, il), name="q_proj")
            q = b.reshape(q, (hp.n_embd_head_k, hp.n_head, b.n_tokens), name="q.heads")
            q_nope, q_pe, kv, k_pe = latent_qkv(b, h, q, pos, il, hp.n_embd_head_k - hp.n_rot, self.rope)
            a = decompressed_attention(b, q_nope, q_pe, kv, k_pe, il, hp.n_embd_head_v, inv_sqrt(hp.n_embd_head_k))
            a, x = b.last_layer_rows((a, "attn_out.rows"), (x, "inp.rows"))
            x = b.op("add", b.op("scale", a, s=scale_res, name="hidden_scaled"), x, name="ffn_inp")
            f = b.build_ffn(b.norm(x, T.FFN_NORM, il, name="ffn_norm"), up=b.w(T.FFN_UP, il),
                            gate=b.w(T.FFN_GATE, il), down=b.w(T.FFN_DOWN, il))
            x = b.op("add", b.op("scale", f, s=scale_res, name="hidden_scaled_ffn"), x, name="l_out")
        x = b.norm(x, T.OUTPUT_NORM, name="result_norm")
        b.outputs["embd"] = x
        head = b.op("scale", x, s=f32(EMBD_BASE / hp.n_embd), name="lmhead_scaling")
        b.outputs["logits"] = b.linear(head, b.w(T.OUTPUT), name="result_output")


# ---- Hugging Face: convert_hf_to_gguf's MiniCPM3Model ------------------------------------------------------

# its own keys alone: no RoPE base or scaling type (llama.cpp takes the long and short factors as they are)
MINICPM3 = (
    hf(L.CONTEXT_LENGTH, "max_position_embeddings"),
    hf(L.EMBEDDING_LENGTH, "hidden_size"),
    hf(L.BLOCK_COUNT, *BLOCKS),
    hf(L.FEED_FORWARD_LENGTH, "intermediate_size"),
    hf(A.HEAD_COUNT, "num_attention_heads"),
    hf(A.HEAD_COUNT_KV, "num_key_value_heads"),
    hf(A.LAYERNORM_RMS_EPS, "rms_norm_eps", kind="number"),
    VOCAB,
    hf(A.Q_LORA_RANK, "q_lora_rank", default=None),
    hf(A.KV_LORA_RANK, "kv_lora_rank"),
    derived(A.KEY_LENGTH, lambda c: c.find("qk_nope_head_dim") + c.find("qk_rope_head_dim")),
    hf(R.DIMENSION_COUNT, "qk_rope_head_dim"),
)


def _minicpm3_include(c: hf_config.Config) -> str:
    return r"rope_factors_(long|short)\.weight" if c.rope.get("long_factor") else ""


hf_config.register(Family("minicpm3", MINICPM3, {"tie_word_embeddings": False}, _minicpm3_include),
                   "MiniCPM3ForCausalLM")

# ---- presets -----------------------------------------------------------------------------------------------

presets.register({
    # 4B: 62 layers of 40 heads; queries through a rank of 768, keys and values through a latent of 256; heads of
    # 64 + 32 (RoPE'd) query/key values and 64 values; LongRoPE's factor vectors
    "MiniCPM3-4B": Preset("minicpm3", {
        L.CONTEXT_LENGTH: 32768, L.EMBEDDING_LENGTH: 2560, L.BLOCK_COUNT: 62, L.FEED_FORWARD_LENGTH: 6400,
        A.HEAD_COUNT: 40, A.HEAD_COUNT_KV: 40, A.LAYERNORM_RMS_EPS: 1e-5, A.Q_LORA_RANK: 768, A.KV_LORA_RANK: 256,
        A.KEY_LENGTH: 96, R.DIMENSION_COUNT: 32, L.VOCAB_SIZE: 73448,
    }, tied=False, include=r"rope_factors_(long|short)\.weight",
        source="openbmb/MiniCPM3-4B config.json (its LongRoPE factors, tensor data, are not copied: only there)"),
})
