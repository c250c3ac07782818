"""GroveMoE (grovemoe): a pre-norm decoder with per-head RMS QK-norm whose every FFN is a mixture of experts
followed by a second, "adjugate" mixture.

The router's logits choose each token's ``expert_used_count`` experts by their sigmoid and weigh them by their
softmax over all experts, renormalised. The experts form groups of ``experts_per_group``; each group shares one
small adjugate expert (``expert_chunk_feed_forward_length`` wide, the head size when the file leaves it out). The
adjugate mixture reuses the same logits: the chosen experts' ids, divided by the group size, pick the adjugate
experts, weighted by the softmax probability of the group's first expert, renormalised. As llama.cpp builds it, the
adjugate mixture reads the first mixture's output, and its output joins that output scaled by
``expert_group_scale``.

Reference: Wu et al. 2025, "GroveMoE: Towards Efficient and Superior MoE LLMs with Adjugate Experts"; llama.cpp
src/models/grovemoe.cpp. No public configuration is at hand: the golden graphs come from a tiny header.
"""

from __future__ import annotations

from gguf import MODEL_TENSOR as T
from gguf import Keys

from graphir.errors import MetadataError
from graphir.graph.floats import inv_sqrt
from graphir.model import hf_config, presets
from graphir.model.architecture import Architecture
from graphir.model.builder import GraphBuilder, Select
from graphir.model.hf_config import TEXT, VOCAB, Family, fixed, hf
from graphir.model.hparams import HParams, Key
from graphir.model.moe import MOE_KEYS, check_routed
from graphir.model.presets import Preset
from graphir.model.qkv import check_whole_heads, fused_or_split_qkv_tensors, qk_norm_tensors
from graphir.model.scales import layer_scales
from graphir.model.tensors import TensorSpec, spec, tensor_name

L, A = Keys.LLM, Keys.Attention


class GroveMoE(Architecture):
    name = "grovemoe"
    rope_mode = "neox"
    required_keys = (A.LAYERNORM_RMS_EPS, L.EXPERT_FEED_FORWARD_LENGTH, L.EXPERT_GROUP_SCALE, L.EXPERTS_PER_GROUP)
    keys = MOE_KEYS + (
        Key("n_ff_exp", L.EXPERT_FEED_FORWARD_LENGTH, tuple, (), minimum=0),  # 0: feed_forward_length / used
        Key("n_ff_chexp", L.EXPERT_CHUNK_FEED_FORWARD_LENGTH, int, 0, minimum=0),  # 0: the head size
        Key("expert_group_scale", L.EXPERT_GROUP_SCALE, float, 0.05),
        Key("n_group_experts", L.EXPERTS_PER_GROUP, int, 0, minimum=1),
    )

    def __init__(self, hp: HParams):
        check_routed(hp, self.name)
        check_whole_heads(hp, self.name)
        key = lambda t: t.format(arch=self.name)  # noqa: E731
        if hp.n_expert % hp.n_group_experts:
            raise MetadataError(f"'{key(L.EXPERTS_PER_GROUP)}' = {hp.n_group_experts} does not divide the "
                                f"{hp.n_expert} experts into groups")
        if hp.n_expert_used > hp.n_expert // hp.n_group_experts:  # llama.cpp's sum reads past the chosen groups
            raise MetadataError(f"'{key(L.EXPERT_USED_COUNT)}' = {hp.n_expert_used} exceeds the "
                                f"{hp.n_expert // hp.n_group_experts} adjugate experts ('{key(L.EXPERT_COUNT)}' / "
                                f"'{key(L.EXPERTS_PER_GROUP)}'): llama.cpp sums that many of their outputs")
        super().__init__(hp)

    @property
    def widths(self) -> tuple[int, int, int]:
        """The experts' width, the adjugate experts' and how many of those there are (one per group)."""
        hp = self.hp
        n_ff_exp = hp.n_ff_exp[0] or hp.ff_length(0) // hp.n_expert_used
        return n_ff_exp, hp.n_ff_chexp or hp.n_embd_head_k, hp.n_expert // hp.n_group_experts

    def tensors(self) -> list[TensorSpec]:
        hp = self.hp
        E, V, X = hp.n_embd, hp.n_vocab, hp.n_expert
        F, Fc, C = self.widths
        specs = [spec(T.TOKEN_EMBD, (E, V)), spec(T.OUTPUT_NORM, (E,), kind="vector"),
                 spec(T.OUTPUT, (E, V), tied_to=tensor_name(T.TOKEN_EMBD))]
        for il in range(hp.n_layer):
            layer = [spec(T.ATTN_NORM, (E,), il, kind="vector"), *fused_or_split_qkv_tensors(hp, il),
                     spec(T.ATTN_OUT, (hp.head_count(il) * hp.n_embd_head_v, E), il), *qk_norm_tensors(hp, il),
                     spec(T.FFN_NORM, (E,), il, kind="vector"), spec(T.FFN_GATE_INP, (E, X), il),
                     spec(T.FFN_GATE_EXP, (E, F, X), il), spec(T.FFN_DOWN_EXP, (F, E, X), il),
                     spec(T.FFN_UP_EXP, (E, F, X), il), spec(T.FFN_GATE_CHEXP, (E, Fc, C), il),
                     spec(T.FFN_DOWN_CHEXP, (Fc, E, C), il), spec(T.FFN_UP_CHEXP, (E, Fc, C), il)]
            specs += layer + layer_scales(layer, il, X)
        return specs

    def build(self, b: GraphBuilder) -> None:
        hp, w = self.hp, b.w
        n_used, (_, _, n_chunk) = hp.n_expert_used, self.widths
        x = b.build_inp_embd(w(T.TOKEN_EMBD))
        pos = b.build_inp_pos()
        for il in b.layers():
            h = b.norm(x, T.ATTN_NORM, il, name="attn_norm")
            q, k, v = b.build_qkv(h, il)
            q = b.rope(b.norm(q, T.ATTN_Q_NORM, il, name="Qcur_normed"), pos, name="Qcur.rope")
            k = b.rope(b.norm(k, T.ATTN_K_NORM, il, name="Kcur_normed"), pos, name="Kcur.rope")
            a = b.build_attn(q, k, v, wo=w(T.ATTN_OUT, il), wo_s=b.scale(T.ATTN_OUT, il),
                             kq_scale=inv_sqrt(hp.n_embd_head_k))
            a, x = b.last_layer_rows((a, "attn_out.rows"), (x, "inp.rows"))
            x = b.op("add", a, x, name="ffn_inp")
            h = b.norm(x, T.FFN_NORM, il, name="ffn_norm")
            logits = b.mm(w(T.FFN_GATE_INP, il), h, name="ffn_moe_logits")
            moe = b.build_moe_ffn(h, gate_inp=None, logits=logits, up_exps=w(T.FFN_UP_EXP, il),
                                  gate_exps=w(T.FFN_GATE_EXP, il), down_exps=w(T.FFN_DOWN_EXP, il),
                                  n_expert=hp.n_expert, n_expert_used=n_used, norm_w=True, select=Select.SIGMOID)
            # the adjugate experts, over the first mixture's output: ids divided by the group size where groups
            # hold more than one expert
            adj = b.build_moe_ffn(moe, gate_inp=None, logits=logits, up_exps=w(T.FFN_UP_CHEXP, il),
                                  gate_exps=w(T.FFN_GATE_CHEXP, il), down_exps=w(T.FFN_DOWN_CHEXP, il),
                                  n_expert=n_chunk, n_expert_used=min(n_used, n_chunk), norm_w=True,
                                  select=Select.SIGMOID, group_experts=hp.n_group_experts if n_chunk != hp.n_expert
                                  else 0, name="ffn_adj_moe_out")
            f = b.op("add", moe, b.op("scale", adj, s=hp.expert_group_scale, name="ffn_adj_moe_scaled"),
                     name="ffn_final_moe_out")
            x = b.op("add", f, x, name="l_out")
        b.build_output(b.norm(x, T.OUTPUT_NORM, name="result_norm"), w(T.OUTPUT))


presets.register({
    # llama.cpp's tiny grovemoe over four layers (so that alike ones fold): width 256, two heads of 128; 4 experts of
    # 384 in groups of 2 (so 2 adjugate experts of 128, the head size), 2 used
    "grovemoe-tiny-header": Preset("grovemoe", {
        L.CONTEXT_LENGTH: 256, L.EMBEDDING_LENGTH: 256, L.BLOCK_COUNT: 4, L.FEED_FORWARD_LENGTH: 384,
        A.HEAD_COUNT: 2, A.HEAD_COUNT_KV: 2, A.LAYERNORM_RMS_EPS: 1e-5, L.VOCAB_SIZE: 128, L.EXPERT_COUNT: 4,
        L.EXPERT_USED_COUNT: 2, L.EXPERT_FEED_FORWARD_LENGTH: 384, L.EXPERT_GROUP_SCALE: 1.0, L.EXPERTS_PER_GROUP: 2,
    }, tied=False, include=presets.SPLIT_QKV, f32=presets.ROUTER_F32,
        source="llama.cpp tests/test-llama-archs.cpp's tiny grovemoe, with 4 experts in groups of 2"),
})


# GroveMoeModel: the text keys; the converter fixes the groups at 2 experts, their scale at 0.05 and the adjugate
# experts' width at the head size (128 where the config has none)
hf_config.register(Family("grovemoe", TEXT + (
    VOCAB, hf(L.EXPERT_FEED_FORWARD_LENGTH, "moe_intermediate_size", default=None),
    hf(L.EXPERT_CHUNK_FEED_FORWARD_LENGTH, "head_dim", default=128), fixed(L.EXPERTS_PER_GROUP, 2),
    fixed(L.EXPERT_GROUP_SCALE, 0.05),
), {"tie_word_embeddings": False}, lambda c: presets.SPLIT_QKV), "GroveMoeForCausalLM")
