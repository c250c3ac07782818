"""SmallThinker (smallthinker): a pre-norm decoder whose every FFN is a mixture of gated-ReLU experts (reglu), routed
from the layer's input before attention (the router reads the residual stream, not the FFN's norm) by the file's
gating function, weights renormalised. With ``attention.sliding_window`` set the layers slide over 4096 positions,
all but the first of every four (``sliding_window_pattern``), and that first one attends without positions;
without it every layer is global and RoPE'd.

No public configuration is at hand: the family's golden graphs come from llama.cpp's tiny header of it (the sizes
tests/test-llama-archs.cpp gives smallthinker).

Reference: PowerInfer 2025, "SmallThinker"; llama.cpp src/models/smallthinker.cpp.
"""

from __future__ import annotations

from gguf import MODEL_TENSOR as T
from gguf import Keys

from graphir.arch.deepseek2 import GATINGS
from graphir.errors import MetadataError
from graphir.model import hf_config, presets
from graphir.model.hf_config import TEXT, VOCAB, Config, Family, derived, hf
from graphir.model.architecture import Architecture
from graphir.model.builder import Act, GraphBuilder
from graphir.model.hparams import HParams, Key, SlidingWindow
from graphir.model.moe import MOE_KEYS, routed_expert_tensors, experts, check_routed
from graphir.model.presets import Preset
from graphir.model.qkv import check_head_sizes, qkv_tensors
from graphir.model.scales import layer_scales
from graphir.model.tensors import TensorSpec, spec, tensor_name

L, A, R = Keys.LLM, Keys.Attention, Keys.Rope

# with sliding layers, the first of every four attends without positions (llama.cpp's fixed step; a model of
# exactly four layers ropes them all, as there)
NOPE_EVERY = 4


class SmallThinker(Architecture):
    name = "smallthinker"
    rope_mode = "neox"
    required_keys = (A.HEAD_COUNT, A.LAYERNORM_RMS_EPS)
    swa = SlidingWindow("standard", period=4, dense_first=True, off_when_zero=True, fixed=4096)
    keys = MOE_KEYS + (
        Key("n_ff_exp", L.EXPERT_FEED_FORWARD_LENGTH, tuple, (), minimum=0),
        Key("expert_gating_func", L.EXPERT_GATING_FUNC, int, 0, minimum=0),
        Key("rope_freq_base_swa", R.FREQ_BASE_SWA, float, default_from="rope_freq_base"),
    )

    def __init__(self, hp: HParams):
        key = lambda t: t.format(arch=self.name)  # noqa: E731
        check_routed(hp, self.name)
        if hp.expert_gating_func not in GATINGS:
            raise MetadataError(f"'{key(L.EXPERT_GATING_FUNC)}' = {hp.expert_gating_func}: not a gating graphir "
                                f"builds (1 softmax, 2 sigmoid, 3 softmax of the chosen)")
        check_head_sizes(hp, self.name)
        super().__init__(hp)

    def tensors(self) -> list[TensorSpec]:
        hp = self.hp
        E, V, X, F = hp.n_embd, hp.n_vocab, hp.n_expert, hp.n_ff_exp[0] if hp.n_ff_exp else 0
        specs = [spec(T.TOKEN_EMBD, (E, V)), spec(T.OUTPUT_NORM, (E,), kind="vector"),
                 spec(T.OUTPUT, (E, V), tied_to=tensor_name(T.TOKEN_EMBD))]
        for il in range(hp.n_layer):
            layer = [spec(T.ATTN_NORM, (E,), il, kind="vector"), *qkv_tensors(hp, il),
                     spec(T.FFN_NORM, (E,), il, kind="vector"), *routed_expert_tensors(E, F, X, il)]
            specs += layer + layer_scales(layer, il, X)
        return specs

    def build(self, b: GraphBuilder) -> None:
        hp = self.hp
        x = b.build_inp_embd(b.w(T.TOKEN_EMBD))
        pos = b.build_inp_pos()
        for il in b.layers():
            logits = b.mm(b.w(T.FFN_GATE_INP, il), x, name="ffn_moe_logits")  # routed from the layer's input
            h = b.norm(x, T.ATTN_NORM, il, name="attn_norm")
            q, k, v = b.build_qkv(h, il)
            step = NOPE_EVERY if hp.swa_layers else hp.n_layer  # llama.cpp's n_no_rope_layer_step
            if step == hp.n_layer or il % step != 0:
                base = hp.rope_freq_base_swa if hp.is_swa(il) else None
                q = b.rope(q, pos, name="Qcur.rope", freq_base=base)
                k = b.rope(k, pos, name="Kcur.rope", freq_base=base)
            a = b.build_attn(q, k, v, wo=b.w(T.ATTN_OUT, il), wo_s=b.scale(T.ATTN_OUT, il), kq_scale=b.kq_scale())
            a, x, logits = b.last_layer_rows((a, "attn_out.rows"), (x, "inp.rows"), (logits, "ffn_moe_logits.rows"))
            x = b.op("add", a, x, name="ffn_inp")
            h = b.norm(x, T.FFN_NORM, il, name="ffn_norm")
            f = b.build_moe_ffn(h, **{**experts(b, il), "gate_inp": None}, logits=logits,
                                n_expert=hp.n_expert, n_expert_used=hp.n_expert_used,
                                gating=GATINGS[hp.expert_gating_func], norm_w=True, act=Act.RELU)
            x = b.op("add", f, x, name="l_out")
        x = b.norm(x, T.OUTPUT_NORM, name="result_norm")
        b.build_output(x, b.w(T.OUTPUT))


def _window(c: Config) -> int | None:
    """sliding_window_size, where sliding_window_layout has a sliding layer."""
    if any(c.find("sliding_window_layout", kind="list", default=[])):
        return c.find("sliding_window_size", kind="size", default=None) or None
    return None


hf_config.register(Family("smallthinker", TEXT + (
    VOCAB,
    hf(L.EXPERT_COUNT, "moe_num_primary_experts", kind="size", default=None),
    hf(L.EXPERT_USED_COUNT, "moe_num_active_primary_experts", kind="size", default=None),
    hf(L.EXPERT_FEED_FORWARD_LENGTH, "moe_ffn_hidden_size", default=None),
    hf(L.FEED_FORWARD_LENGTH, "moe_ffn_hidden_size", default=None),
    derived(L.EXPERT_GATING_FUNC, lambda c: 1 if c.find("moe_primary_router_apply_softmax", kind="flag",
                                                        default=False) else 2),
    derived(A.SLIDING_WINDOW, _window),
), {"tie_word_embeddings": False}), "SmallThinkerForCausalLM")


presets.register({
    # llama.cpp's tiny smallthinker, over five layers (so that alike ones fold) alternating as its first two: width 256,
    # two heads of 128; layer 0 global and without positions, layer 1 sliding (pattern 2); each FFN 2 experts of 384,
    # both used, sigmoid-routed
    "smallthinker-tiny-header": Preset("smallthinker", {
        L.CONTEXT_LENGTH: 256, L.EMBEDDING_LENGTH: 256, L.BLOCK_COUNT: 5, L.FEED_FORWARD_LENGTH: 384,
        A.HEAD_COUNT: 2, A.HEAD_COUNT_KV: 2, A.LAYERNORM_RMS_EPS: 1e-5, A.SLIDING_WINDOW: 32,
        A.SLIDING_WINDOW_PATTERN: 2, L.VOCAB_SIZE: 128, L.EXPERT_COUNT: 2, L.EXPERT_USED_COUNT: 2,
        L.EXPERT_FEED_FORWARD_LENGTH: 384, L.EXPERT_GATING_FUNC: 2,
    }, tied=False, f32=presets.ROUTER_F32, source="llama.cpp tests/test-llama-archs.cpp, its tiny smallthinker header"),
})
