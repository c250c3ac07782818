"""Llama 4: llama's pre-norm decoder whose layers attend in chunks of 8192 positions, three of every four with
RoPE and an L2-like RMS norm of Q and K, the fourth without positions and with its queries scaled by a
temperature that grows with the log of the position's chunk; its mixture-of-experts layers (every
``interleave_moe_layer_step``-th) weight each token by its sigmoid router score before the expert's FFN, not
after, and add a shared expert.

References: Meta 2025, "The Llama 4 herd"; llama.cpp src/models/llama4.cpp.
"""

from __future__ import annotations

from gguf import MODEL_TENSOR as T
from gguf import Keys

from graphir.arch.llama import LLAMA_RULES
from graphir.model import hf_config, presets
from graphir.model.architecture import Architecture
from graphir.model.builder import Gating, GraphBuilder, Select
from graphir.model.hf_config import Family, hf
from graphir.model.hparams import HParams, Key, SlidingWindow
from graphir.model.moe import MOE_KEYS, routed_expert_tensors, experts, check_routed, shared_expert, shared_expert_tensors
from graphir.model.presets import Preset
from graphir.model.qkv import check_head_sizes, qkv_tensors
from graphir.model.scales import layer_scales
from graphir.model.temperature import Temperature
from graphir.model.tensors import TensorSpec, spec, swiglu_tensors, tensor_name

L, A, R = Keys.LLM, Keys.Attention, Keys.Rope

CHUNK = 8192  # llama.cpp's fixed chunk, whatever attention.sliding_window says (0 there is refused: llama.cpp then
# attends unchunked but still scales the last layer's queries by a temperature it cannot compute)
NOPE_EVERY = 4  # the last layer of every four attends without positions (llama.cpp's fixed step)
# the temperature of the layers without positions, as llama.cpp fixes it for the chunked form
TEMPERATURE = Temperature(floor_scale=CHUNK, scale=0.1, offset=1.0)
NO_QK_NORM_EXPERTS = 128  # llama.cpp's 17B-128E (Maverick) type has no QK norm; every other has


class Llama4(Architecture):
    name = "llama4"
    rope_mode = "norm"
    required_keys = (A.HEAD_COUNT, A.LAYERNORM_RMS_EPS, L.EXPERT_FEED_FORWARD_LENGTH, L.INTERLEAVE_MOE_LAYER_STEP)
    swa = SlidingWindow("chunked", window=CHUNK, period=4, fixed=CHUNK)  # 3 chunked layers, then a full one
    keys = MOE_KEYS + (
        Key("n_ff_exp", L.EXPERT_FEED_FORWARD_LENGTH, tuple, (), minimum=0),
        Key("n_moe_layer_step", L.INTERLEAVE_MOE_LAYER_STEP, int, 0, minimum=0),
        Key("rope_freq_base_swa", R.FREQ_BASE_SWA, float, default_from="rope_freq_base"),
    )

    def __init__(self, hp: HParams):
        check_routed(hp, self.name)
        check_head_sizes(hp, self.name)
        super().__init__(hp)

    def is_moe(self, il: int) -> bool:
        step = self.hp.n_moe_layer_step
        return step > 0 and (il + 1) % step == 0

    def tensors(self) -> list[TensorSpec]:
        hp = self.hp
        E, V, X, Fx = hp.n_embd, hp.n_vocab, hp.n_expert, hp.n_ff_exp[0]
        specs = [spec(T.TOKEN_EMBD, (E, V)), spec(T.OUTPUT_NORM, (E,), kind="vector"),
                 spec(T.OUTPUT, (E, V), tied_to=tensor_name(T.TOKEN_EMBD)),
                 spec(T.ROPE_FREQS, (hp.n_rot // 2,), kind="vector", optional=True)]  # llama3-style divisors
        for il in range(hp.n_layer):
            layer = [spec(T.ATTN_NORM, (E,), il, kind="vector"), *qkv_tensors(hp, il),
                     spec(T.FFN_NORM, (E,), il, kind="vector")]
            if self.is_moe(il):
                layer += routed_expert_tensors(E, Fx, X, il) + shared_expert_tensors(E, Fx, il)
            else:
                F = hp.ff_length(il)
                layer += swiglu_tensors(E, F, il)
            specs += layer + layer_scales(layer, il, X)
        return specs

    def build(self, b: GraphBuilder) -> None:
        hp = self.hp
        qk_norm = hp.n_expert != NO_QK_NORM_EXPERTS
        x = b.build_inp_embd(b.w(T.TOKEN_EMBD))
        pos = b.build_inp_pos()
        temperature = b.build_inp_attn_scale(TEMPERATURE)
        for il in b.layers():
            h = b.norm(x, T.ATTN_NORM, il, name="attn_norm")
            # self-attention: RoPE'd (chunked layers with rope.freq_base_swa) and RMS-normalised Q and K, or, in
            # the last layer of every four, no positions and queries scaled by the temperature
            q, k, v = b.build_qkv(h, il)
            use_rope = (il + 1) % NOPE_EVERY != 0
            if use_rope:
                base = hp.rope_freq_base_swa if hp.is_swa(il) else None
                rope_factors = b.w_opt(T.ROPE_FREQS)
                q = b.rope(q, pos, rope_factors, name="Qcur.rope", freq_base=base)
                k = b.rope(k, pos, rope_factors, name="Kcur.rope", freq_base=base)
                if qk_norm:
                    q = b.build_norm(q, None, name="Qcur_normed")
                    k = b.build_norm(k, None, name="Kcur_normed")
            else:
                q = b.op("mul", q, temperature, name="Qcur.tempered")
            a = b.build_attn(q, k, v, wo=b.w(T.ATTN_OUT, il), wo_s=b.scale(T.ATTN_OUT, il), kq_scale=b.kq_scale())
            a, x = b.last_layer_rows((a, "attn_out.rows"), (x, "inp.rows"))
            x = b.op("add", a, x, name="ffn_inp")
            # feed-forward network: dense SwiGLU, or a sigmoid-routed mixture weighted before the experts' FFNs
            # plus the shared expert
            h = b.norm(x, T.FFN_NORM, il, name="ffn_norm")
            if self.is_moe(il):
                moe = b.build_moe_ffn(h, **experts(b, il), n_expert=hp.n_expert, n_expert_used=hp.n_expert_used,
                                      gating=Gating.SIGMOID, weight_before=True, select=Select.LOGITS)
                shared = shared_expert(b, h, il, name="ffn_moe_shexp")
                f = b.op("add", moe, shared, name="ffn_moe_out_merged")
            else:
                f = b.build_ffn(h, up=b.w(T.FFN_UP, il), gate=b.w(T.FFN_GATE, il), down=b.w(T.FFN_DOWN, il))
            x = b.op("add", f, x, name="l_out")
        x = b.norm(x, T.OUTPUT_NORM, name="result_norm")
        b.build_output(x, b.w(T.OUTPUT))


# ---- Hugging Face: what convert_hf_to_gguf writes for these configs -----------------------------------------

# Llama4Model: LlamaModel's keys, with the dense FFN's width from intermediate_size_mlp and the experts' from
# intermediate_size; the llama3 RoPE divisors as rope_freqs
hf_config.register(Family("llama4", LLAMA_RULES + (
    hf(L.FEED_FORWARD_LENGTH, "intermediate_size_mlp"),
    hf(L.EXPERT_FEED_FORWARD_LENGTH, "intermediate_size"),
    hf(L.INTERLEAVE_MOE_LAYER_STEP, "interleave_moe_layer_step"),
), {"tie_word_embeddings": False}, lambda c: r"rope_freqs\.weight"), "Llama4ForConditionalGeneration",
    "Llama4ForCausalLM")


# ---- presets: released models of this family, as their converted GGUFs declare them ---------------------

presets.register({
    # 48 layers of width 5120, 40 query and 8 KV heads of 128; every layer a mixture of 16 experts of 8192, one
    # per token, beside a shared one; dense width 16384 unused; llama3 RoPE (factor 16 from 8192)
    "Llama-4-Scout": Preset("llama4", {
        L.CONTEXT_LENGTH: 10485760, L.EMBEDDING_LENGTH: 5120, L.BLOCK_COUNT: 48, L.FEED_FORWARD_LENGTH: 16384,
        A.HEAD_COUNT: 40, A.HEAD_COUNT_KV: 8, A.KEY_LENGTH: 128, A.VALUE_LENGTH: 128, R.DIMENSION_COUNT: 128,
        R.FREQ_BASE: 500000.0, A.LAYERNORM_RMS_EPS: 1e-5, L.VOCAB_SIZE: 202048, L.EXPERT_COUNT: 16,
        L.EXPERT_USED_COUNT: 1, L.EXPERT_FEED_FORWARD_LENGTH: 8192, L.INTERLEAVE_MOE_LAYER_STEP: 1,
    }, tied=False, include=r"rope_freqs\.weight", f32=presets.ROUTER_F32,
        source="meta-llama/Llama-4-Scout-17B-16E-Instruct config.json (text_config)"),
})
