"""ERNIE 4.5's mixtures of experts (ernie4_5-moe): llama's attention, dense FFNs first, then a mixture of experts
every ``interleave_moe_layer_step`` layers.

Every layer from ``leading_dense_block_count`` on holds experts (llama.cpp's loader), and its graph routes through
them when the layer is also the last of a step (il + 1 divisible by the step; a file whose expert layers and step
disagree has layers without weights for their graph and is refused). Routing: softmax, plus the optional selection
bias ``exp_probs_b``, weights renormalised; the experts' gates are optional (without them an expert is up, SiLU,
down). A shared expert of ``expert_shared_feed_forward_length`` joins when that length is set. The optional
output bias ``attn_output.bias`` is loaded and, as in llama.cpp's graph, not added.

References: Baidu 2025, "ERNIE 4.5 Technical Report"; llama.cpp src/models/ernie4-5-moe.cpp, ernie4-5.cpp.
"""

from __future__ import annotations

from gguf import MODEL_TENSOR as T
from gguf import Keys

from graphir.errors import MetadataError
from graphir.graph.ir import Node
from graphir.model import hf_config, presets
from graphir.model.architecture import Architecture
from graphir.model.builder import GraphBuilder
from graphir.model.hf_config import TEXT, VOCAB, Config, Family, derived, hf
from graphir.model.hparams import HParams, Key
from graphir.model.moe import MOE_KEYS, check_experts, expert_width, shared_expert, shared_expert_tensors
from graphir.model.presets import Preset
from graphir.model.qkv import check_whole_heads, qkv_tensors, roped_attention
from graphir.model.scales import layer_scales
from graphir.model.tensors import TensorSpec, spec, swiglu_tensors, tensor_name

L, A, R = Keys.LLM, Keys.Attention, Keys.Rope


class Ernie45Moe(Architecture):
    name = "ernie4_5-moe"
    rope_mode = "norm"
    required_keys = (A.HEAD_COUNT, A.LAYERNORM_RMS_EPS, L.EXPERT_FEED_FORWARD_LENGTH, L.INTERLEAVE_MOE_LAYER_STEP)
    keys = MOE_KEYS + (
        Key("n_ff_exp", L.EXPERT_FEED_FORWARD_LENGTH, list, 0),
        Key("n_ff_shexp", L.EXPERT_SHARED_FEED_FORWARD_LENGTH, int, 0, minimum=0),  # 0: no shared expert
        Key("n_moe_layer_step", L.INTERLEAVE_MOE_LAYER_STEP, int, 0, minimum=1),
        Key("n_layer_dense_lead", L.LEADING_DENSE_BLOCK_COUNT, int, 0, minimum=0),
    )

    def __init__(self, hp: HParams):
        key = lambda t: t.format(arch=self.name)  # noqa: E731
        check_experts(hp, self.name)
        lead, step = hp.n_layer_dense_lead, hp.n_moe_layer_step
        stray = [il for il in range(lead, hp.n_layer) if (il + 1) % step]
        if stray:
            raise MetadataError(f"layer {stray[0]} holds experts ('{key(L.LEADING_DENSE_BLOCK_COUNT)}' = {lead}) but "
                                f"is not the last of a step of {step} ('{key(L.INTERLEAVE_MOE_LAYER_STEP)}'), so "
                                f"llama.cpp's graph reads a dense FFN it has not loaded")
        if lead < hp.n_layer and not (hp.n_expert and hp.n_expert_used):
            raise MetadataError(f"layers {lead}.. are mixtures of experts but '{key(L.EXPERT_COUNT)}' or "
                                f"'{key(L.EXPERT_USED_COUNT)}' is 0")
        check_whole_heads(hp, self.name)
        super().__init__(hp)

    def moe_layer(self, il: int) -> bool:
        return il >= self.hp.n_layer_dense_lead

    def tensors(self) -> list[TensorSpec]:
        hp = self.hp
        E, V = hp.n_embd, hp.n_vocab
        specs = [spec(T.TOKEN_EMBD, (E, V)), spec(T.OUTPUT_NORM, (E,), kind="vector"),
                 spec(T.OUTPUT, (E, V), tied_to=tensor_name(T.TOKEN_EMBD))]
        for il in range(hp.n_layer):
            layer = [spec(T.ATTN_NORM, (E,), il, kind="vector"), *qkv_tensors(hp, il),
                     spec(T.ATTN_OUT, (E,), il, "bias", kind="vector", optional=True),
                     spec(T.FFN_NORM, (E,), il, kind="vector")]
            if self.moe_layer(il):
                X, F = hp.n_expert, expert_width(hp)
                layer += [spec(T.FFN_GATE_INP, (E, X), il),
                          spec(T.FFN_EXP_PROBS_B, (X,), il, "bias", kind="vector", optional=True),
                          spec(T.FFN_GATE_EXP, (E, F, X), il, optional=True), spec(T.FFN_DOWN_EXP, (F, E, X), il),
                          spec(T.FFN_UP_EXP, (E, F, X), il)]
                if hp.n_ff_shexp:
                    layer += shared_expert_tensors(E, hp.n_ff_shexp, il)
            else:
                F = hp.ff_length(0)
                layer += swiglu_tensors(E, F, il)
            specs += layer + layer_scales(layer, il, hp.n_expert)
        return specs

    def ffn(self, b: GraphBuilder, h: Node, il: int) -> Node:
        hp, w = self.hp, b.w
        if not self.moe_layer(il):
            return b.build_ffn(h, up=w(T.FFN_UP, il), gate=w(T.FFN_GATE, il), down=w(T.FFN_DOWN, il))
        moe = b.build_moe_ffn(h, gate_inp=w(T.FFN_GATE_INP, il), up_exps=w(T.FFN_UP_EXP, il),
                              gate_exps=b.w_opt(T.FFN_GATE_EXP, il), down_exps=w(T.FFN_DOWN_EXP, il),
                              n_expert=hp.n_expert, n_expert_used=hp.n_expert_used, norm_w=True,
                              probs_b=b.w_opt(T.FFN_EXP_PROBS_B, il, "bias"))
        return b.op("add", moe, shared_expert(b, h, il), name="ffn_out") if hp.n_ff_shexp else moe

    def build(self, b: GraphBuilder) -> None:
        w = b.w
        x = b.build_inp_embd(w(T.TOKEN_EMBD))
        pos = b.build_inp_pos()
        for il in b.layers():
            h = b.norm(x, T.ATTN_NORM, il, name="attn_norm")
            a = roped_attention(b, h, pos, il)
            a, x = b.last_layer_rows((a, "attn_out.rows"), (x, "inp.rows"))
            x = b.op("add", a, x, name="ffn_inp")
            f = self.ffn(b, b.norm(x, T.FFN_NORM, il, name="ffn_norm"), il)
            x = b.op("add", f, x, name="l_out")
        b.build_output(b.norm(x, T.OUTPUT_NORM, name="result_norm"), w(T.OUTPUT))


# ---- Hugging Face: what convert_hf_to_gguf writes for Ernie4_5_MoeForCausalLM -------------------------------

SELECTION_BIAS = r"blk\.\d+\.exp_probs_b\.bias"  # e_score_correction_bias, which aux-free routing trains
GATES = presets.EXPERT_GATES  # optional to llama.cpp, always written


def _shared_width(c: Config) -> int | None:
    n = c.find("moe_num_shared_experts", kind="size", default=0)
    return c.find("moe_intermediate_size") * n if n else None


def _written(c: Config) -> str:
    return GATES + (f"|{SELECTION_BIAS}" if c.find("moe_use_aux_free", kind="flag", default=False) else "")


hf_config.register(Family("ernie4_5-moe", TEXT + (
    hf(L.EXPERT_COUNT, "moe_num_experts", kind="size"),
    hf(L.EXPERT_USED_COUNT, "moe_k", kind="size"),
    hf(L.INTERLEAVE_MOE_LAYER_STEP, "moe_layer_interval", kind="size"),
    hf(L.LEADING_DENSE_BLOCK_COUNT, "moe_layer_start_index", kind="size"),
    hf(L.EXPERT_FEED_FORWARD_LENGTH, "moe_intermediate_size"),
    derived(L.EXPERT_SHARED_FEED_FORWARD_LENGTH, _shared_width),
    VOCAB,
), {"tie_word_embeddings": True}, _written, tie_drops_head=True), "Ernie4_5_MoeForCausalLM")


# ---- presets: released models of this family, as their converted GGUFs declare them ---------------------

presets.register({
    # 28 layers (the first dense), 20 query and 4 KV heads of 128, 64 experts of 1536 with 6 per token and two
    # shared ones (one of 3072), aux-free routing (a selection bias); the LM head tied to the embedding
    "ERNIE-4.5-21B-A3B": Preset("ernie4_5-moe", {
        L.CONTEXT_LENGTH: 131072, L.EMBEDDING_LENGTH: 2560, L.BLOCK_COUNT: 28, L.FEED_FORWARD_LENGTH: 12288,
        A.HEAD_COUNT: 20, A.HEAD_COUNT_KV: 4, R.FREQ_BASE: 500000.0, A.LAYERNORM_RMS_EPS: 1e-5,
        L.EXPERT_COUNT: 64, L.EXPERT_USED_COUNT: 6, L.INTERLEAVE_MOE_LAYER_STEP: 1, L.LEADING_DENSE_BLOCK_COUNT: 1,
        L.EXPERT_FEED_FORWARD_LENGTH: 1536, L.EXPERT_SHARED_FEED_FORWARD_LENGTH: 3072, L.VOCAB_SIZE: 103424,
    }, tied=True, include=f"{GATES}|{SELECTION_BIAS}", f32=presets.ROUTER_F32,
        source="baidu/ERNIE-4.5-21B-A3B-PT config.json"),
})
