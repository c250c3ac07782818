"""PLM (plm, PLM-1.8B): a pre-RMSNorm decoder with DeepSeek-V2's latent keys and values and a squared-ReLU FFN.

Queries are projected directly (no low-rank step) and split per head into a part without positions and a RoPE'd
part; keys and values come from one latent of ``kv_lora_rank`` values plus a RoPE'd key part shared by the heads,
decompressed per head (``attn_kv_b``) and attended over an ordinary KV cache (graphir.model.mla), scores by
1/sqrt(head size). The FFN is ``W_down relu(W_up x)^2``, without a gate; the LM head is the token embedding.
The family's golden graphs come from a synthetic header (the preset PLM-tiny below): no released PLM config is
known here well enough for a preset.
References: Deng et al. 2025, "PLM: Efficient Peripheral Language Models"; llama.cpp src/models/plm.cpp.
"""

from __future__ import annotations

from gguf import MODEL_TENSOR as T
from gguf import Keys

from graphir.graph.floats import inv_sqrt
from graphir.graph.ir import Node
from graphir.model import hf_config, presets
from graphir.model.architecture import Architecture
from graphir.model.builder import GraphBuilder
from graphir.model.hf_config import TEXT_BASE, VOCAB, Family, derived, hf
from graphir.model.hparams import HParams, Key
from graphir.model.mla import check_decompressed, decompressed_attention, latent_qkv
from graphir.model.presets import Preset
from graphir.model.scales import layer_scales
from graphir.model.tensors import TensorSpec, spec

L, A, R = Keys.LLM, Keys.Attention, Keys.Rope


class PLM(Architecture):
    name = "plm"
    rope_mode = "norm"
    required_keys = (L.FEED_FORWARD_LENGTH, A.HEAD_COUNT, A.LAYERNORM_RMS_EPS, A.KV_LORA_RANK)
    keys = (Key("n_lora_kv", A.KV_LORA_RANK, int, 0, minimum=1),)

    def __init__(self, hp: HParams):
        check_decompressed(hp, self.name)
        super().__init__(hp)

    def tensors(self) -> list[TensorSpec]:
        hp = self.hp
        E, V, H, R_kv = hp.n_embd, hp.n_vocab, hp.n_head, hp.n_lora_kv
        d_nope, d_v = hp.n_embd_head_k - hp.n_rot, hp.n_embd_head_v
        specs = [spec(T.TOKEN_EMBD, (E, V)), spec(T.OUTPUT_NORM, (E,), kind="vector")]
        for il in range(hp.n_layer):
            F = hp.ff_length(il)
            layer = [spec(T.ATTN_NORM, (E,), il, kind="vector"), spec(T.ATTN_Q, (E, H * hp.n_embd_head_k), il),
                     spec(T.ATTN_KV_A_MQA, (E, R_kv + hp.n_rot), il),
                     spec(T.ATTN_KV_A_NORM, (R_kv,), il, kind="vector"),
                     spec(T.ATTN_KV_B, (R_kv, H * (d_nope + d_v)), il), spec(T.ATTN_OUT, (H * d_v, E), il),
                     spec(T.FFN_NORM, (E,), il, kind="vector"), spec(T.FFN_DOWN, (F, E), il),
                     spec(T.FFN_UP, (E, F), il)]
            specs += layer + layer_scales(layer, il)  # read: attention's output scale alone
        return specs

    @staticmethod
    def rope(b: GraphBuilder, x: Node, pos: Node, name: str) -> Node:
        return b.rope(x, pos, name=name)

    def build(self, b: GraphBuilder) -> None:
        hp = self.hp
        x = b.build_inp_embd(b.w(T.TOKEN_EMBD))
        pos = b.build_inp_pos()
        for il in b.layers():
            h = b.norm(x, T.ATTN_NORM, il, name="attn_norm")
            q = b.reshape(b.linear(h, b.w(T.ATTN_Q, il), name="q_proj"), (hp.n_embd_head_k, hp.n_head, b.n_tokens),
                          name="q.heads")
            q_nope, q_pe, kv, k_pe = latent_qkv(b, h, q, pos, il, hp.n_embd_head_k - hp.n_rot, self.rope)
            a = decompressed_attention(b, q_nope, q_pe, kv, k_pe, il, hp.n_embd_head_v, inv_sqrt(hp.n_embd_head_k))
            a, x = b.last_layer_rows((a, "attn_out.rows"), (x, "inp.rows"))
            x = b.op("add", a, x, name="ffn_inp")
            # feed-forward network: the squared ReLU of the up projection, down again
            up = b.linear(b.norm(x, T.FFN_NORM, il, name="ffn_norm"), b.w(T.FFN_UP, il), name="ffn_up")
            sq = b.op("sqr", b.op("relu", up, name="ffn_relu"), name="ffn_sqr")
            x = b.op("add", b.linear(sq, b.w(T.FFN_DOWN, il), name="ffn_out"), x, name="l_out")
        x = b.norm(x, T.OUTPUT_NORM, name="result_norm")
        b.build_output(x, b.w(T.TOKEN_EMBD))


# ---- Hugging Face: convert_hf_to_gguf's PLMModel ----------------------------------------------------------

hf_config.register(Family("plm", TEXT_BASE + (
    VOCAB,
    hf(A.KV_LORA_RANK, "kv_lora_rank"),
    derived(A.KEY_LENGTH, lambda c: c.find("qk_nope_head_dim") + c.find("qk_rope_head_dim")),
    hf(A.VALUE_LENGTH, "v_head_dim"),
    hf(R.DIMENSION_COUNT, "qk_rope_head_dim"),
), {"tie_word_embeddings": True}), "PLMForCausalLM")

# ---- presets -----------------------------------------------------------------------------------------------

presets.register({
    # a synthetic header of PLM's layout (4 layers; heads of 64 values without positions and 32 RoPE'd, values of
    # 64; a latent of 128): not a released model
    "PLM-tiny": Preset("plm", {
        L.CONTEXT_LENGTH: 4096, L.EMBEDDING_LENGTH: 512, L.BLOCK_COUNT: 4, L.FEED_FORWARD_LENGTH: 1024,
        A.HEAD_COUNT: 8, A.HEAD_COUNT_KV: 8, A.LAYERNORM_RMS_EPS: 1e-6, A.KV_LORA_RANK: 128, A.KEY_LENGTH: 96,
        A.VALUE_LENGTH: 64, R.DIMENSION_COUNT: 32, R.FREQ_BASE: 100000.0, L.VOCAB_SIZE: 1024,
    }, tied=True, source="a synthetic header of PLM's layout"),
})
