"""Kimi-Linear (kimi-linear): Kimi Delta Attention layers and multi-head latent attention layers in one decoder,
with DeepSeek-V3's mixture of experts.

A layer whose ``attention.head_count_kv`` entry is 0 mixes tokens by Kimi Delta Attention (KDA): q, k and v each
from their own projection, each through its own short causal convolution (the three keep their last columns side
by side in the layer's rolling state, q's first) and SiLU; q and k L2-normalised per head; the gated delta rule
with a decay per key channel, g = A * softplus(f_b(f_a(x)) + dt_bias) (a low-rank projection, one A per head),
and a step beta = sigmoid(b(x)) per head; the read-out RMS-normalised per head (``ssm_norm``) and gated by
sigmoid(g_b(g_a(x))), then W_o. The other layers attend with absorbed MLA (arch/deepseek2.py's form: one shared
head over rows [latent | key part], queries without positions absorbed through ``attn_k_b``, each head's output
decompressed through ``attn_v_b``), without RoPE: the key part goes into the row as projected. Scores are scaled
by 1/sqrt(key_length_mla). FFNs: the first ``leading_dense_block_count`` layers are dense SwiGLU, the others route
each token to its ``expert_used_count`` best experts (the file's gating, with the selection bias
``exp_probs_b``; renormalised, scaled by ``expert_weights_scale``) plus a shared expert.

The memory is the hybrid kind with a latent cache as its attention part: one latent row per token for the MLA
layers, conv columns (q, k and v) and one d x d delta state per head and sequence for the KDA layers.
llama.cpp sizes the KDA layers by layer 0's head count and ``kda.head_dim``, as here.
References: Kimi Team 2025, "Kimi Linear: An Expressive, Efficient Attention Architecture"; llama.cpp
src/models/kimi-linear.cpp, delta-net-base.cpp.
"""

from __future__ import annotations

from typing import Mapping

from gguf import MODEL_TENSOR as T
from gguf import Keys

from graphir.arch.deepseek2 import GATINGS, _mla
from graphir.errors import MetadataError
from graphir.graph.ir import Node
from graphir.memory.layers import LayerNeeds
from graphir.model import hf_config, kda, presets
from graphir.model.architecture import Architecture
from graphir.model.builder import Gating, GraphBuilder
from graphir.model.hf_config import BLOCKS, TEXT, VOCAB, Config, Family, derived, hf
from graphir.model.hparams import HParams, Key
from graphir.model.moe import MOE_KEYS, check_experts
from graphir.model.presets import Preset
from graphir.model.scales import layer_scales
from graphir.model.tensors import TensorDecl, TensorSpec, spec, swiglu_tensors

L, A, R, S = Keys.LLM, Keys.Attention, Keys.Rope, Keys.SSM

# the experts of both KDA families beside MOE_KEYS (Ling 3.0's adds its own keys)
EXPERT_KEYS = (
    Key("n_ff_exp", L.EXPERT_FEED_FORWARD_LENGTH, int, 0, minimum=0, first=True),
    Key("n_expert_shared", L.EXPERT_SHARED_COUNT, int, required=True, minimum=0),
    Key("n_layer_dense_lead", L.LEADING_DENSE_BLOCK_COUNT, int, 0, minimum=0),
    Key("expert_weights_scale", L.EXPERT_WEIGHTS_SCALE, float, 0.0),
    Key("expert_gating_func", L.EXPERT_GATING_FUNC, int, required=True, minimum=0),
)


def check_routing(hp: HParams, arch: str) -> Gating:
    """The experts agree with their count, the gating is one graphir builds and MoE layers have experts: the
    gating."""
    key = lambda t: f"'{t.format(arch=arch)}'"  # noqa: E731
    check_experts(hp, arch)
    if hp.expert_gating_func not in GATINGS:
        raise MetadataError(f"{key(L.EXPERT_GATING_FUNC)} = {hp.expert_gating_func}: not a gating graphir "
                            f"builds (1 softmax, 2 sigmoid, 3 softmax of the chosen)")
    if hp.n_layer_dense_lead < hp.n_layer and not hp.n_expert:
        raise MetadataError(f"layers {hp.n_layer_dense_lead}.. are mixtures of experts "
                            f"({key(L.LEADING_DENSE_BLOCK_COUNT)} = {hp.n_layer_dense_lead}) but "
                            f"{key(L.EXPERT_COUNT)} is 0")
    return GATINGS[hp.expert_gating_func]


def expert_tensors(hp: HParams, il: int, n_ff_shexp: int) -> list[TensorSpec]:
    """The experts, their selection bias and the shared expert of ``n_ff_shexp`` (loaded as optional, read always:
    required here)."""
    E, X, F = hp.n_embd, hp.n_expert, hp.n_ff_exp
    return [spec(T.FFN_GATE_INP, (E, X), il), spec(T.FFN_GATE_EXP, (E, F, X), il),
            spec(T.FFN_DOWN_EXP, (F, E, X), il), spec(T.FFN_UP_EXP, (E, F, X), il),
            spec(T.FFN_GATE_SHEXP, (E, n_ff_shexp), il), spec(T.FFN_DOWN_SHEXP, (n_ff_shexp, E), il),
            spec(T.FFN_UP_SHEXP, (E, n_ff_shexp), il), spec(T.FFN_EXP_PROBS_B, (X,), il, "bias", kind="vector")]


class KimiLinear(Architecture):
    name = "kimi-linear"
    required_keys = (A.LAYERNORM_RMS_EPS, A.HEAD_COUNT)
    per_layer = True  # head_count_kv per layer says which layers are KDA layers
    keys = MOE_KEYS + kda.KEYS + EXPERT_KEYS

    def __init__(self, hp: HParams):
        self.gating = check_routing(hp, self.name)
        self.kda = kda.Hybrid(hp, hp.n_layer)
        self.kda.check(self.name)
        super().__init__(hp)

    def layers(self) -> LayerNeeds:
        return self.kda.layers()

    def check_heads(self, label: str) -> None:
        """A latent layer attends as one shared head (its K/V head count says only that it attends)."""

    # ---- tensors ------------------------------------------------------------------------------------------

    def tensors(self) -> list[TensorSpec]:
        hp, m = self.hp, self.kda
        E, V, H, d, Di = hp.n_embd, hp.n_vocab, m.n_head, hp.kda_head_dim, m.d_inner
        specs = [spec(T.TOKEN_EMBD, (E, V)), spec(T.OUTPUT_NORM, (E,), kind="vector"), spec(T.OUTPUT, (E, V))]
        for il in range(hp.n_layer):
            if m.recurrent(il):  # q, k and v apart or in one attn_qkv (llama.cpp's create_tensor_qkv)
                qkv = [spec(T.ATTN_QKV, (E, 3 * Di), il, optional=True),
                       spec(T.ATTN_QKV, (3 * Di,), il, "bias", kind="vector", optional=True),
                       *m.split_qkv_tensors(il, optional=True)]
                gates = [spec(T.SSM_F_A, (E, d), il), spec(T.SSM_F_B, (d, Di), il),  # low rank: head_dim
                         spec(T.SSM_G_A, (E, d), il), spec(T.SSM_G_B, (d, Di), il)]
                mixer = m.kda_tensors(il, qkv, gates)
            else:  # queries projected directly (llama.cpp's graph reads attn_q alone)
                mixer = [spec(T.ATTN_Q, (E, H * hp.n_embd_head_k_mla), il), *m.latent_tensors(il),
                         spec(T.ATTN_OUT, (H * hp.n_embd_head_v_mla, E), il)]
            ffn = (swiglu_tensors(E, hp.ff_length(il), il) if il < hp.n_layer_dense_lead
                   else expert_tensors(hp, il, hp.n_ff_exp * max(hp.n_expert_shared, 1)))
            specs += [spec(T.ATTN_NORM, (E,), il, kind="vector"), *mixer, spec(T.FFN_NORM, (E,), il, kind="vector"),
                      *ffn, *layer_scales([*mixer, *ffn], il, hp.n_expert)]
        return specs

    def check(self, tensors: Mapping[str, TensorDecl]) -> list[str]:
        """The table's checks, and each KDA layer's q, k and v in one whole form: attn_qkv, else the three."""
        return super().check(tensors) + self.kda.missing_qkv(tensors)

    # ---- graph --------------------------------------------------------------------------------------------

    def kda_layer(self, b: GraphBuilder, h: Node, il: int) -> Node:
        """KDA over q, k and v, the decay A * softplus(f_b(f_a(x)) + dt_bias) and the gate g_b(g_a(x)), each of
        low rank."""
        m, d = self.kda, self.hp.kda_head_dim

        def qkv() -> list[Node]:
            """From attn_qkv where the file has it (as llama.cpp's graph prefers), else from the three apart."""
            qkv_w = b.w_opt(T.ATTN_QKV, il)
            if qkv_w is None:
                return [b.mm(b.w(t, il), h, name=f"{tag}_proj") for t, _, tag in kda.QKV]
            fused = b.mm(qkv_w, h, name="qkv")
            return [b.op("cont", b.op("view", fused, shape=(m.d_inner, b.n_tokens), strides=(1, 3 * m.d_inner),
                                      offset=i * m.d_inner, name=f"{tag}_in"), name=f"{tag}_proj")
                    for i, (_, _, tag) in enumerate(kda.QKV)]

        def decay() -> Node:
            g = b.mm(b.w(T.SSM_F_B, il), b.mm(b.w(T.SSM_F_A, il), h, name="f_a"), name="g1")
            g = b.op("softplus", b.op("add", g, b.w(T.SSM_DT, il, "bias"), name="g1_biased"), name="g1_softplus")
            return b.op("mul", b.reshape(g, (d, m.n_head, b.n_tokens), name="g1.heads"), m.per_head_a(b, il),
                        name="kda_g1")

        def gate() -> Node:
            g2 = b.mm(b.w(T.SSM_G_B, il), b.mm(b.w(T.SSM_G_A, il), h, name="g_a"), name="g2")
            return b.reshape(g2, (d, m.n_head, b.n_tokens), name="g2.heads")

        return m.kda(b, h, il, qkv, decay, gate)

    def ffn(self, b: GraphBuilder, h: Node, il: int) -> Node:
        hp, w = self.hp, b.w
        if il < hp.n_layer_dense_lead:
            return b.build_ffn(h, up=w(T.FFN_UP, il), gate=w(T.FFN_GATE, il), down=w(T.FFN_DOWN, il))
        moe = b.build_moe_ffn(h, gate_inp=w(T.FFN_GATE_INP, il), up_exps=w(T.FFN_UP_EXP, il),
                              gate_exps=w(T.FFN_GATE_EXP, il), down_exps=w(T.FFN_DOWN_EXP, il),
                              n_expert=hp.n_expert, n_expert_used=hp.n_expert_used,
                              gating=self.gating, norm_w=True, w_scale=hp.expert_weights_scale,
                              probs_b=w(T.FFN_EXP_PROBS_B, il, "bias"))
        shared = b.build_ffn(h, up=w(T.FFN_UP_SHEXP, il), gate=w(T.FFN_GATE_SHEXP, il), down=w(T.FFN_DOWN_SHEXP, il),
                             name="ffn_shexp")
        return b.op("add", moe, shared, name="ffn_out")

    def build(self, b: GraphBuilder) -> None:
        x = b.build_inp_embd(b.w(T.TOKEN_EMBD))
        for il in b.layers(self.hp.n_layer):
            h = b.norm(x, T.ATTN_NORM, il, name="attn_norm")
            if self.kda.recurrent(il):
                a = self.kda_layer(b, h, il)
            else:  # absorbed MLA without positions over directly projected queries, then W_o (times its scale)
                q = b.mm(b.w(T.ATTN_Q, il), h, name="q_proj")
                a = self.kda.latent_attention(b, h, q, None, il, None, wo=b.w(T.ATTN_OUT, il),
                                              wo_s=b.w_opt(T.ATTN_OUT, il, "scale"))
            a, x = b.last_layer_rows((a, "attn_out.rows"), (x, "inp.rows"))
            x = b.op("add", a, x, name="ffn_inp")
            f = self.ffn(b, b.norm(x, T.FFN_NORM, il, name="ffn_norm"), il)
            x = b.op("add", f, x, name="l_out")
        b.build_output(b.norm(x, T.OUTPUT_NORM, name="result_norm"), b.w(T.OUTPUT))


# ---- presets: released models of this family, as their converted GGUFs declare them ---------------------

F32 = presets.ROUTER_F32 + r"|blk\.\d+\.ssm_a"  # routers and A (a bare name) kept f32; the q/k/v conv kernels not


def _kv_heads(n_layer: int, mla_layers: list[int]) -> list[int]:
    """One shared (latent) head in the MLA layers, none in the KDA layers: the per-layer count that tells them apart
    and sizes the latent row (key_length)."""
    return [1 if il in mla_layers else 0 for il in range(n_layer)]


presets.register({
    # 27 layers of width 2304: MLA (32 heads of 128 + 64, values of 128, a latent of 512 + 64, no query compression)
    # in every fourth layer and the last, KDA (32 heads of 128, conv kernel 4) in the others; the first layer's FFN
    # dense (9216), the others 256 experts of 1024 with 8 per token by sigmoid with a selection bias, renormalised
    # and scaled by 2.446, plus one shared expert
    "Kimi-Linear-48B-A3B": Preset("kimi-linear", {
        L.CONTEXT_LENGTH: 1048576, L.EMBEDDING_LENGTH: 2304, L.BLOCK_COUNT: 27, L.FEED_FORWARD_LENGTH: 9216,
        A.HEAD_COUNT: 32, A.HEAD_COUNT_KV: _kv_heads(27, [3, 7, 11, 15, 19, 23, 26]), A.KEY_LENGTH: 576,
        A.VALUE_LENGTH: 512, A.KEY_LENGTH_MLA: 192, A.VALUE_LENGTH_MLA: 128, A.KV_LORA_RANK: 512,
        R.DIMENSION_COUNT: 64, R.FREQ_BASE: 10000.0, A.LAYERNORM_RMS_EPS: 1e-5, S.CONV_KERNEL: 4,
        Keys.KDA.HEAD_DIM: 128, L.LEADING_DENSE_BLOCK_COUNT: 1, L.EXPERT_COUNT: 256, L.EXPERT_USED_COUNT: 8,
        L.EXPERT_FEED_FORWARD_LENGTH: 1024, L.EXPERT_SHARED_COUNT: 1, L.EXPERT_WEIGHTS_SCALE: 2.446,
        L.EXPERT_GATING_FUNC: 2, L.VOCAB_SIZE: 163840,
    }, tied=False, include=presets.SPLIT_QKV, f32=F32, source="moonshotai/Kimi-Linear-48B-A3B-Instruct config.json"),
})


# ---- Hugging Face: convert_hf_to_gguf's KimiLinearModel -----------------------------------------------------


def _linear(c: Config, name: str) -> int:
    """A figure of the KDA layers (``linear_attn_config``)."""
    return c.check(f"linear_attn_config.{name}", c.find("linear_attn_config", kind="map").get(name), "count")


def _mla_layers(c: Config) -> list[int]:
    """The MLA layers, from linear_attn_config.full_attn_layers (numbered from 1)."""
    full = c.check("linear_attn_config.full_attn_layers",
                   c.find("linear_attn_config", kind="map").get("full_attn_layers"), "list")
    return [c.check("linear_attn_config.full_attn_layers", il, "count") - 1 for il in full]


KIMI_LINEAR = TEXT + (
    derived(A.HEAD_COUNT_KV, lambda c: _kv_heads(c.find(*BLOCKS), _mla_layers(c))),
    _mla,
    hf(A.Q_LORA_RANK, "q_lora_rank", default=None),
    hf(R.DIMENSION_COUNT, "qk_rope_head_dim"),
    derived(S.CONV_KERNEL, lambda c: _linear(c, "short_conv_kernel_size")),
    derived(Keys.KDA.HEAD_DIM, lambda c: _linear(c, "head_dim")),
    hf(L.LEADING_DENSE_BLOCK_COUNT, "first_k_dense_replace", kind="size", default=None),
    hf(L.EXPERT_FEED_FORWARD_LENGTH, "moe_intermediate_size"),
    hf(L.EXPERT_SHARED_COUNT, "num_shared_experts", kind="size"),
    hf(L.EXPERT_WEIGHTS_SCALE, "routed_scaling_factor", kind="number", default=None),
    VOCAB,
)
hf_config.register(Family("kimi-linear", KIMI_LINEAR, {"tie_word_embeddings": False}, lambda c: presets.SPLIT_QKV),
                   "KimiLinearForCausalLM")
