"""Ling 3.0 (bailingmoe3): Kimi-Linear's composition (arch/kimi_linear.py, graphir/model/kda.py) of Kimi Delta
Attention layers and absorbed-MLA layers in the hybrid memory, with its own gates, RoPE'd and gated latent
attention, clamped SwiGLUs and draft layers.

Against Kimi-Linear: KDA's decay is the safe gate, lower_bound * sigmoid(A * (f_a(x) + dt_bias)) per key channel
(``kda.gate_lower_bound`` < 0; one full-width projection, no softplus), and the read-out's gate is sigmoid(g_a(x))
from one full-width projection; q, k and v come from three projections (llama.cpp's graph reads no attn_qkv). The
MLA layers may compress their queries (``q_lora_rank``), RoPE the key part and the queries' RoPE'd part (normal RoPE,
or M-RoPE in sections where the file gives two or more: the VL files), and gate each head's output by
sigmoid(attn_gate(x)) before W_o. Scores by 1/sqrt(key_length_mla). The leading dense FFNs and the shared experts
clamp their SwiGLU at ``swiglu_clamp_shexp`` of the layer, the routed experts at ``swiglu_clamp_exp`` (up clamped,
SiLU capped, as separate ops); routing by the file's gating with the selection bias, normalised as
``expert_weights_norm`` says. The head is tied to the embedding when the file has none. Multi-token-prediction
layers (``nextn_predict_layers``) load and never run; the final norm runs on every row, the requested ones are picked
after it. The golden graphs come from llama.cpp's tiny header of the family (no released
model's public figures are known here well enough for a preset).
References: inclusionAI 2026, "Ling 2.5 / Ring 2.5"; llama.cpp src/models/bailingmoe3.cpp, delta-net-base.cpp.
"""

from __future__ import annotations

from gguf import MODEL_TENSOR as T
from gguf import Keys

from graphir.arch.kimi_linear import EXPERT_KEYS, check_routing, expert_tensors
from graphir.errors import MetadataError
from graphir.graph.ir import Node
from graphir.memory.layers import LayerNeeds
from graphir.model import kda, presets
from graphir.model.architecture import Architecture
from graphir.model.builder import GraphBuilder
from graphir.model.hparams import HParams, Key
from graphir.model.moe import MOE_KEYS, NEXTN_KEY, nextn_layer, trunk_layers
from graphir.model.presets import Preset
from graphir.model.scales import layer_scales
from graphir.model.tensors import TensorSpec, spec, swiglu_tensors, tensor_name

L, A, R = Keys.LLM, Keys.Attention, Keys.Rope

KDA_SAFE_GATE, KDA_GATE_LOWER_BOUND = "{arch}.kda.safe_gate", "{arch}.kda.gate_lower_bound"  # gguf-py lacks them


class BailingMoe3(Architecture):
    name = "bailingmoe3"
    required_keys = (A.LAYERNORM_RMS_EPS, A.HEAD_COUNT)
    per_layer = True  # head_count_kv per layer says which layers are KDA layers
    rope_mode = "norm"  # text files; a file with M-RoPE sections rotates by sections (instance's rope_mode)
    keys = MOE_KEYS + kda.KEYS + EXPERT_KEYS + (
        Key("n_lora_q", A.Q_LORA_RANK, int, 0, minimum=0),
        Key("kda_safe_gate", KDA_SAFE_GATE, bool, True),
        Key("kda_gate_lower_bound", KDA_GATE_LOWER_BOUND, float, required=True),
        Key("rope_sections", R.DIMENSION_SECTIONS, tuple, (0, 0, 0, 0), minimum=0, count=4),
        Key("n_ff_shexp", L.EXPERT_SHARED_FEED_FORWARD_LENGTH, int, 0, minimum=0),
        Key("expert_weights_norm", L.EXPERT_WEIGHTS_NORM, bool, False),
        Key("swiglu_clamp_exp", L.SWIGLU_CLAMP_EXP, tuple, (), item=float),
        Key("swiglu_clamp_shexp", L.SWIGLU_CLAMP_SHEXP, tuple, (), item=float),
        NEXTN_KEY)

    def __init__(self, hp: HParams):
        key = lambda t: f"'{t.format(arch=self.name)}'"  # noqa: E731
        if not hp.kda_safe_gate or not hp.kda_gate_lower_bound < 0.0:
            raise MetadataError(f"{key(KDA_SAFE_GATE)} = {hp.kda_safe_gate} and {key(KDA_GATE_LOWER_BOUND)} = "
                                f"{hp.kda_gate_lower_bound}: Ling 3.0's decay is the safe gate, bounded below by a "
                                f"negative number")
        # M-RoPE where the file gives its first two sections (llama.cpp's use_mrope), else normal RoPE
        self.sections = tuple(hp.rope_sections) if hp.rope_sections[0] > 0 and hp.rope_sections[1] > 0 else None
        if self.sections:
            self.rope_mode = "mrope"
        self.gating = check_routing(hp, self.name)
        self.kda = kda.Hybrid(hp, trunk_layers(hp, self.name))  # prediction layers after the trunk load, never run
        self.kda.check(self.name)
        # the shared expert: expert_shared_feed_forward_length, else an expert's width times the shared count
        self.n_ff_shexp = hp.n_ff_shexp or hp.n_ff_exp * max(hp.n_expert_shared, 1)
        super().__init__(hp)

    def layers(self) -> LayerNeeds:
        return self.kda.layers()

    def check_heads(self, label: str) -> None:
        """A latent layer attends as one shared head (its K/V head count says only that it attends)."""

    # ---- tensors ------------------------------------------------------------------------------------------

    def tensors(self) -> list[TensorSpec]:
        hp, m = self.hp, self.kda
        E, V, H, Di, Rq, dk = hp.n_embd, hp.n_vocab, m.n_head, m.d_inner, hp.n_lora_q, hp.n_embd_head_k_mla
        specs = [spec(T.TOKEN_EMBD, (E, V)), spec(T.OUTPUT_NORM, (E,), kind="vector"),
                 spec(T.OUTPUT, (E, V), tied_to=tensor_name(T.TOKEN_EMBD))]
        for il in range(hp.n_layer):
            if m.recurrent(il):  # q, k and v apart (llama.cpp loads attn_qkv too, but its graph reads the three)
                mixer = m.kda_tensors(il, m.split_qkv_tensors(il),
                                      [spec(T.SSM_F_A, (E, Di), il), spec(T.SSM_G_A, (E, Di), il)])
            else:  # queries compressed (q_lora_rank > 0) or direct, and a sigmoid gate per head
                q = ([spec(T.ATTN_Q_A, (E, Rq), il), spec(T.ATTN_Q_A_NORM, (Rq,), il, kind="vector"),
                      spec(T.ATTN_Q_B, (Rq, H * dk), il)] if Rq else [spec(T.ATTN_Q, (E, H * dk), il)])
                mixer = [*q, *m.latent_tensors(il), spec(T.ATTN_GATE, (E, H), il),
                         spec(T.ATTN_OUT, (H * hp.n_embd_head_v_mla, E), il)]
            ffn = (swiglu_tensors(E, hp.ff_length(il), il) if il < hp.n_layer_dense_lead
                   else expert_tensors(hp, il, self.n_ff_shexp))
            layer = [spec(T.ATTN_NORM, (E,), il, kind="vector"), *mixer, spec(T.FFN_NORM, (E,), il, kind="vector"),
                     *ffn, *layer_scales([*mixer, *ffn], il, hp.n_expert)]
            # a prediction layer: its own projection and norms and its final norm, all optional as llama.cpp loads
            specs += layer if il < m.n_trunk else nextn_layer(
                layer + [spec(T.LAYER_OUT_NORM, (E,), il, kind="vector")], hp, il)
        return specs

    # ---- graph --------------------------------------------------------------------------------------------

    def kda_layer(self, b: GraphBuilder, h: Node, il: int) -> Node:
        """KDA over q, k and v apart, with the safe gate, lower_bound * sigmoid(A * (f_a(x) + dt_bias)), and the
        read-out gate g_a(x)."""
        m, d = self.kda, self.hp.kda_head_dim

        def decay() -> Node:
            g = b.op("add", b.mm(b.w(T.SSM_F_A, il), h, name="f_a"), b.w(T.SSM_DT, il, "bias"),
                     name="kda_gate_biased")
            g = b.op("mul", b.reshape(g, (d, m.n_head, b.n_tokens), name="kda_gate.heads"), m.per_head_a(b, il),
                     name="kda_gate_a")
            return b.op("scale", b.op("sigmoid", g, name="kda_gate_sigmoid"), s=self.hp.kda_gate_lower_bound,
                        name="kda_gate")

        return m.kda(b, h, il, lambda: [b.mm(b.w(t, il), h, name=f"{tag}_proj") for t, _, tag in kda.QKV], decay,
                     lambda: b.reshape(b.mm(b.w(T.SSM_G_A, il), h, name="g_a"), (d, m.n_head, b.n_tokens),
                                       name="g_a.heads"))

    def rotate(self, b: GraphBuilder, x: Node, pos: Node, name: str) -> Node:
        """RoPE: in M-RoPE sections where the file has them, else normal."""
        return b.rope(x, pos, name=name, sections=self.sections)

    def gated_mla(self, b: GraphBuilder, h: Node, pos: Node, il: int) -> Node:
        """Absorbed MLA, RoPE'd, over compressed or direct queries; each head's output times
        sigmoid(attn_gate(x)), then W_o."""
        hp = self.hp
        H, Tn, dv = self.kda.n_head, b.n_tokens, hp.n_embd_head_v_mla
        if hp.n_lora_q:
            q = b.norm(b.mm(b.w(T.ATTN_Q_A, il), h, name="q_a"), T.ATTN_Q_A_NORM, il, name="q_a_norm")
            q = b.mm(b.w(T.ATTN_Q_B, il), q, name="q_b")
        else:
            q = b.mm(b.w(T.ATTN_Q, il), h, name="q_proj")
        out = self.kda.latent_attention(b, h, q, pos, il, self.rotate, wo=None)
        gate = b.reshape(b.mm(b.w(T.ATTN_GATE, il), h, name="attn_gate"), (1, H, Tn), name="attn_gate.heads")
        out = b.op("mul", b.reshape(out, (dv, H, Tn), name="attn_out.heads"),
                   b.op("sigmoid", gate, name="attn_gate_sigmoid"), name="attn_gated")
        out = b.reshape(b.op("cont", out, name="attn_gated.cont"), (dv * H, Tn), name="attn_gated.tokens")
        return b.mm(b.w(T.ATTN_OUT, il), out, name="mla_out")

    def ffn(self, b: GraphBuilder, h: Node, il: int) -> Node:
        hp, w = self.hp, b.w
        shexp = hp.swiglu_clamp_shexp[il] if il < len(hp.swiglu_clamp_shexp) else 0.0
        if il < hp.n_layer_dense_lead:
            return b.build_ffn(h, up=w(T.FFN_UP, il), gate=w(T.FFN_GATE, il), down=w(T.FFN_DOWN, il),
                               swiglu_limit=shexp, clamp_apart=True)
        moe = b.build_moe_ffn(h, gate_inp=w(T.FFN_GATE_INP, il), up_exps=w(T.FFN_UP_EXP, il),
                              gate_exps=w(T.FFN_GATE_EXP, il), down_exps=w(T.FFN_DOWN_EXP, il),
                              n_expert=hp.n_expert, n_expert_used=hp.n_expert_used, gating=self.gating,
                              norm_w=hp.expert_weights_norm, w_scale=hp.expert_weights_scale,
                              probs_b=w(T.FFN_EXP_PROBS_B, il, "bias"),
                              swiglu_limit=hp.swiglu_clamp_exp[il] if il < len(hp.swiglu_clamp_exp) else 0.0,
                              clamp_apart=True)
        shared = b.build_ffn(h, up=w(T.FFN_UP_SHEXP, il), gate=w(T.FFN_GATE_SHEXP, il), down=w(T.FFN_DOWN_SHEXP, il),
                             swiglu_limit=shexp, clamp_apart=True, name="ffn_shexp")
        return b.op("add", moe, shared, name="ffn_out")

    def build(self, b: GraphBuilder) -> None:
        x = b.build_inp_embd(b.w(T.TOKEN_EMBD))
        pos = b.build_inp_pos()
        for il in b.layers(self.kda.n_trunk):
            h = b.norm(x, T.ATTN_NORM, il, name="attn_norm")
            a = self.kda_layer(b, h, il) if self.kda.recurrent(il) else self.gated_mla(b, h, pos, il)
            x = b.op("add", a, x, name="ffn_inp")
            f = self.ffn(b, b.norm(x, T.FFN_NORM, il, name="ffn_norm"), il)
            x = b.op("add", f, x, name="l_out")
        x = b.norm(x, T.OUTPUT_NORM, name="result_norm.all")
        # llama.cpp keeps every row through the last layer and picks the requested ones after the final norm
        b.build_output(b.op("get_rows", x, b.build_inp_out_ids(), name="result_norm"), b.w(T.OUTPUT))


# ---- presets ---------------------------------------------------------------------------------------------------

S = Keys.SSM

presets.register({
    # llama.cpp's tiny bailingmoe3 with experts over four layers (so that alike ones fold): MLA with a compressed
    # query and a dense FFN, two KDA layers and an MLA layer with two experts of 192 (their SwiGLUs clamped at 4, the
    # shared expert's of 96 at 5), M-RoPE in sections as its VL files; no released model's public figures are known
    # here well enough for a preset
    "bailingmoe3-tiny-header": Preset("bailingmoe3", {
        L.CONTEXT_LENGTH: 256, L.EMBEDDING_LENGTH: 128, L.BLOCK_COUNT: 4, L.FEED_FORWARD_LENGTH: 192,
        A.HEAD_COUNT: 1, A.HEAD_COUNT_KV: [1, 0, 0, 1], A.KEY_LENGTH: 576, A.VALUE_LENGTH: 512,
        A.KEY_LENGTH_MLA: 192, A.VALUE_LENGTH_MLA: 128, A.Q_LORA_RANK: 512, A.KV_LORA_RANK: 512,
        A.LAYERNORM_RMS_EPS: 1e-5, R.DIMENSION_COUNT: 64, R.DIMENSION_SECTIONS: [8, 12, 12, 0], S.CONV_KERNEL: 4,
        Keys.KDA.HEAD_DIM: 128, KDA_GATE_LOWER_BOUND: -5.0, L.LEADING_DENSE_BLOCK_COUNT: 1, L.EXPERT_COUNT: 2,
        L.EXPERT_USED_COUNT: 2, L.EXPERT_SHARED_COUNT: 1, L.EXPERT_FEED_FORWARD_LENGTH: 192,
        L.EXPERT_SHARED_FEED_FORWARD_LENGTH: 96, L.EXPERT_GATING_FUNC: 2, L.SWIGLU_CLAMP_EXP: [0.0, 4.0, 4.0, 4.0],
        L.SWIGLU_CLAMP_SHEXP: [0.0, 5.0, 5.0, 5.0], L.VOCAB_SIZE: 128,
    }, tied=False, f32=presets.ROUTER_F32 + r"|blk\.\d+\.ssm_a",
        source="llama.cpp tests/test-llama-archs.cpp, its tiny bailingmoe3 header, with experts"),
})
