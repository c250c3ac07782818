"""AI21 Jamba: Mamba (v1) layers and attention layers in one decoder, each layer's FFN a SwiGLU or a mixture of
experts.

Each layer is ``x += mixer(RMSNorm(x))`` then ``x += ffn(RMSNorm(x))``. A layer whose ``attention.head_count_kv``
entry is 0 mixes with Mamba's selective scan (arch/mamba.py's block), its dt, B and C RMS-normalised with learned
weights; the others attend with grouped-query attention without positions, scores by 1/sqrt(head size), Q, K and V
with optional biases. A layer whose file holds a router (``ffn_gate_inp``) sends each token through its top
``expert_used_count`` SwiGLU experts, softmax weights not renormalised; the others have a dense SwiGLU. Mamba's inner
size is twice the width (llama.cpp asserts it). The memory keeps K/V rows for the attention layers and conv columns
and SSM states for the Mamba layers (the hybrid memory).
References: Lieber et al. 2024, "Jamba: A Hybrid Transformer-Mamba Language Model"; llama.cpp src/models/jamba.cpp,
mamba-base.cpp.
"""

from __future__ import annotations

from typing import Mapping

from gguf import MODEL_TENSOR as T
from gguf import Keys

from graphir.errors import MetadataError
from graphir.graph.ir import Node
from graphir.memory.layers import LayerNeeds
from graphir.model import hf_config, presets, ssm
from graphir.model.architecture import Architecture
from graphir.model.builder import GraphBuilder
from graphir.model.hf_config import Config, Family, derived, hf
from graphir.model.hparams import HParams
from graphir.model.moe import MOE_KEYS, check_experts
from graphir.model.presets import Preset
from graphir.model.qkv import fused_or_split_qkv_tensors
from graphir.model.scales import layer_scales
from graphir.model.tensors import TensorDecl, TensorSpec, spec, tensor_name

L, A, S = Keys.LLM, Keys.Attention, Keys.SSM


class Jamba(Architecture):
    name = "jamba"
    required_keys = (L.FEED_FORWARD_LENGTH, A.HEAD_COUNT, A.LAYERNORM_RMS_EPS)
    per_layer = True  # head_count_kv per layer says which layers are Mamba layers
    keys = ssm.SSM_KEYS + MOE_KEYS

    def __init__(self, hp: HParams):
        check_experts(hp, self.name)
        if hp.ssm_d_inner != 2 * hp.n_embd:
            raise MetadataError(f"'{S.INNER_SIZE.format(arch=self.name)}' = {hp.ssm_d_inner}: Jamba's Mamba layers "
                                f"expand the width {hp.n_embd} twice")
        super().__init__(hp)

    def recurrent(self, il: int) -> bool:
        return self.hp.head_count_kv(il) == 0

    def layers(self) -> LayerNeeds:
        hp, attention = self.hp, super().layers()
        return tuple(ssm.recurrent_state(hp, hp.ssm_d_inner) if self.recurrent(il) else attention[il]
                     for il in range(hp.n_layer))

    # ---- tensors ------------------------------------------------------------------------------------------

    def tensors(self) -> list[TensorSpec]:
        hp = self.hp
        E, V, F, X = hp.n_embd, hp.n_vocab, hp.ff_length(0), hp.n_expert
        specs = [spec(T.TOKEN_EMBD, (E, V)), spec(T.OUTPUT_NORM, (E,), kind="vector"),
                 spec(T.OUTPUT, (E, V), tied_to=tensor_name(T.TOKEN_EMBD))]
        for il in range(hp.n_layer):
            if self.recurrent(il):
                mixer = ssm.mamba_tensors(hp, il, dt_b_c_norms=True)
            else:
                attention = [*fused_or_split_qkv_tensors(hp, il), spec(T.ATTN_OUT, (E, E), il)]
                mixer = [*attention, *layer_scales(attention, il)]
            # a router makes the layer's FFN a mixture of experts, else it is a dense SwiGLU: each form optional
            ffn = [spec(T.FFN_GATE_INP, (E, X), il), spec(T.FFN_GATE_EXP, (E, F, X), il),
                   spec(T.FFN_DOWN_EXP, (F, E, X), il), spec(T.FFN_UP_EXP, (E, F, X), il),
                   spec(T.FFN_GATE, (E, F), il), spec(T.FFN_DOWN, (F, E), il), spec(T.FFN_UP, (E, F), il)]
            specs += [spec(T.ATTN_NORM, (E,), il, kind="vector"), *mixer, spec(T.FFN_NORM, (E,), il, kind="vector"),
                      *(TensorSpec(s.name, s.shape, s.kind, optional=True) for s in ffn), *layer_scales(ffn, il, X)]
        return specs

    def check(self, tensors: Mapping[str, TensorDecl]) -> list[str]:
        """The table's checks, and each layer's FFN in one whole form: the experts where it has a router, else
        the dense SwiGLU."""
        problems = super().check(tensors)
        for il in range(self.hp.n_layer):
            routed = tensor_name(T.FFN_GATE_INP, il) in tensors
            need = (T.FFN_GATE_EXP, T.FFN_DOWN_EXP, T.FFN_UP_EXP) if routed else (T.FFN_GATE, T.FFN_DOWN, T.FFN_UP)
            problems += [f"missing tensor '{tensor_name(t, il)}'" + ("" if routed else " (a layer without a router "
                                                                     "is a dense FFN)")
                         for t in need if tensor_name(t, il) not in tensors]
        return problems

    # ---- graph --------------------------------------------------------------------------------------------

    def ffn(self, b: GraphBuilder, h: Node, il: int) -> Node:
        """The experts where the layer has a router, else the dense SwiGLU; llama.cpp's graph reads no scale."""
        w, router = b.w, b.w_opt(T.FFN_GATE_INP, il)
        if router is None:
            return b.build_ffn(h, up=w(T.FFN_UP, il), gate=w(T.FFN_GATE, il), down=w(T.FFN_DOWN, il))
        return b.build_moe_ffn(h, gate_inp=router, up_exps=w(T.FFN_UP_EXP, il), gate_exps=w(T.FFN_GATE_EXP, il),
                               down_exps=w(T.FFN_DOWN_EXP, il), n_expert=self.hp.n_expert,
                               n_expert_used=self.hp.n_expert_used)

    def build(self, b: GraphBuilder) -> None:
        x = b.build_inp_embd(b.w(T.TOKEN_EMBD))
        for il in b.layers():
            h = b.norm(x, T.ATTN_NORM, il, name="attn_norm")
            if self.recurrent(il):
                h = b.reshape(ssm.mamba_layer(b, h, il), (self.hp.n_embd, b.n_tokens), name="ssm_out.tokens")
            else:
                q, k, v = b.build_qkv(h, il)  # no positions
                h = b.build_attn(q, k, v, wo=b.w(T.ATTN_OUT, il), wo_s=b.scale(T.ATTN_OUT, il), kq_scale=b.kq_scale())
            h, x = b.last_layer_rows((h, "mix_out.rows"), (x, "inp.rows"))
            x = b.op("add", x, h, name="ffn_inp")
            f = self.ffn(b, b.norm(x, T.FFN_NORM, il, name="ffn_norm"), il)
            x = b.op("add", x, f, name="l_out")
        b.build_output(b.norm(x, T.OUTPUT_NORM, name="result_norm"), b.w(T.OUTPUT))


# ---- presets: released models of this family, as their converted GGUFs declare them ---------------------


def _every(n_layer: int, period: int, offset: int) -> list[int]:
    """The layers il >= offset with (il - offset) a multiple of period (the converter's attention and expert
    layers)."""
    return [il for il in range(offset, n_layer, period)]


def _written(n_layer: int, routed: list[int]) -> str:
    """The optional tensors the converter writes: Q, K and V apart; the experts in the ``routed`` layers, a dense
    FFN in the others."""
    ffn = (rf"blk\.{il}\.(ffn_gate_inp|ffn_(gate|down|up)_exps)\.weight" if il in routed
           else rf"blk\.{il}\.ffn_(gate|down|up)\.weight" for il in range(n_layer))
    return "|".join((presets.SPLIT_QKV, *ffn))


presets.register({
    # 32 layers of width 4096: attention (32 heads sharing 8 K/V heads) at layers 4, 12, 20 and 28, Mamba (16
    # states, dt rank 256) elsewhere; 16 experts of 14336, 2 per token, in every odd layer, a dense SwiGLU in the others
    "Jamba-Mini-1.6": Preset("jamba", {
        L.CONTEXT_LENGTH: 262144, L.EMBEDDING_LENGTH: 4096, L.BLOCK_COUNT: 32, L.FEED_FORWARD_LENGTH: 14336,
        A.HEAD_COUNT: 32, A.HEAD_COUNT_KV: [8 if il in _every(32, 8, 4) else 0 for il in range(32)],
        S.CONV_KERNEL: 4, S.INNER_SIZE: 8192, S.STATE_SIZE: 16, S.TIME_STEP_RANK: 256, A.LAYERNORM_RMS_EPS: 1e-6,
        L.EXPERT_COUNT: 16, L.EXPERT_USED_COUNT: 2, L.VOCAB_SIZE: 65536,
    }, tied=False, include=_written(32, _every(32, 2, 1)),
        f32=presets.ROUTER_F32 + r"|blk\.\d+\.ssm_(conv1d\.weight|a)",
        source="ai21labs/AI21-Jamba-Mini-1.6 config.json"),
})


# ---- Hugging Face: convert_hf_to_gguf's JambaModel --------------------------------------------------------------


def _jamba_kv(c: Config) -> list[int]:
    n_layer = c.find("num_hidden_layers")
    attention = _every(n_layer, c.find("attn_layer_period"), c.find("attn_layer_offset", kind="size"))
    return [c.find("num_key_value_heads") if il in attention else 0 for il in range(n_layer)]


def _jamba_include(c: Config) -> str:
    n_layer = c.find("num_hidden_layers")
    return _written(n_layer, _every(n_layer, c.find("expert_layer_period"), c.find("expert_layer_offset", kind="size")))


JAMBA = (
    hf(L.BLOCK_COUNT, "num_hidden_layers"),
    hf(L.CONTEXT_LENGTH, "max_position_embeddings", "n_ctx"),
    hf(L.EMBEDDING_LENGTH, "hidden_size", "mamba_d_model"),
    hf(L.FEED_FORWARD_LENGTH, "intermediate_size"),
    hf(A.HEAD_COUNT, "num_attention_heads"),
    derived(A.HEAD_COUNT_KV, _jamba_kv),
    hf(S.CONV_KERNEL, "mamba_d_conv", default=4),
    derived(S.INNER_SIZE, lambda c: c.find("mamba_expand") * c.find("hidden_size", "mamba_d_model")),
    hf(S.STATE_SIZE, "mamba_d_state", default=16),
    derived(S.TIME_STEP_RANK, lambda c: c.find("mamba_dt_rank", default=None)
            or -(c.find("hidden_size", "mamba_d_model") // -16)),
    hf(A.LAYERNORM_RMS_EPS, "layer_norm_epsilon", "rms_norm_eps", kind="number", default=1e-6),
    hf(L.EXPERT_COUNT, "num_local_experts", "num_experts", kind="size"),
    hf(L.EXPERT_USED_COUNT, "num_experts_per_tok", "num_experts_per_token", kind="size"),
    hf_config.VOCAB,
)
hf_config.register(Family("jamba", JAMBA, {"tie_word_embeddings": False}, _jamba_include), "JambaForCausalLM")
