"""DeciLM and NVIDIA's Llama-3.1-Nemotron (deci): Llama's decoder, each layer sized on its own.

Every layer has its own head count, KV head count and FFN length (per-layer arrays): a layer of query heads
and KV heads attends as Llama does (grouped-query, RoPE'd, scores by 1/sqrt(head size)); one of query heads but
no KV heads replaces attention by its output projection alone (the "linear attention" of Nemotron-51B:
``x + W_o norm(x)``); one of no heads has no attention at all (its FFN reads the layer's input unnormalised by
attention, ``x + ffn(norm(x))``). A layer whose FFN length is 0 (Nemotron-Ultra) leaves the stream as it found
it, as llama.cpp's graph does (it goes on to the next layer with that layer's input). Only attending layers keep
K and V. (llama.cpp's transposed V cache is as wide as the widest layer's when KV head counts differ between
attending layers; graphir's holds each layer's own width: the same values, another cache shape in the graph.)
References: Deci 2023, "DeciLM-7B"; Bercovich et al. 2024, "Puzzle: Distillation-Based NAS" (Nemotron-51B);
llama.cpp src/models/deci.cpp.
"""

from __future__ import annotations

from gguf import MODEL_TENSOR as T
from gguf import Keys

from graphir.errors import MetadataError
from graphir.graph.floats import inv_sqrt
from graphir.memory.layers import Attention, LayerNeeds
from graphir.model import hf_config, presets
from graphir.model.architecture import Architecture
from graphir.model.builder import GraphBuilder
from graphir.model.hf_config import TEXT_BASE, VOCAB, Config, Family, derived, head_dim
from graphir.model.hparams import HParams
from graphir.model.presets import Preset
from graphir.model.qkv import qkv_tensors
from graphir.model.rope_factors import long_context, longrope, rope_factor_tensors, rope_factors
from graphir.model.scales import layer_scales
from graphir.model.tensors import TensorSpec, spec, tensor_name

L, A, R = Keys.LLM, Keys.Attention, Keys.Rope


class Deci(Architecture):
    name = "deci"
    rope_mode = "norm"
    required_keys = (A.LAYERNORM_RMS_EPS,)
    per_layer = True

    def __init__(self, hp: HParams):
        if hp.n_rot != hp.n_embd_head_k:
            raise MetadataError(f"invalid n_rot: {hp.n_rot}, expected {hp.n_embd_head_k} (key "
                                f"'{R.DIMENSION_COUNT.format(arch=self.name)}')")
        super().__init__(hp)

    def attends(self, il: int) -> bool:
        return self.hp.head_count(il) > 0 and self.hp.head_count_kv(il) > 0

    def linear(self, il: int) -> bool:
        """Nemotron-51B's "linear attention": query heads but no KV heads, the output projection alone."""
        return self.hp.head_count(il) > 0 and self.hp.head_count_kv(il) == 0

    def layers(self) -> LayerNeeds:
        hp = self.hp
        return tuple(Attention(hp.n_embd_k_gqa_at(il), hp.n_embd_v_gqa_at(il)) if self.attends(il) else None
                     for il in range(hp.n_layer))

    def variant(self, n_ctx_seq: int) -> bool:
        return longrope(self.hp) and long_context(self.hp, n_ctx_seq)

    def tensors(self) -> list[TensorSpec]:
        hp = self.hp
        E, V = hp.n_embd, hp.n_vocab
        specs = [spec(T.TOKEN_EMBD, (E, V)), spec(T.OUTPUT_NORM, (E,), kind="vector"),
                 spec(T.OUTPUT, (E, V), tied_to=tensor_name(T.TOKEN_EMBD)), *rope_factor_tensors(hp)]
        for il in range(hp.n_layer):
            F = hp.ff_length(il)
            layer = []
            if self.linear(il):
                layer += [spec(T.ATTN_NORM, (E,), il, kind="vector"), spec(T.ATTN_OUT, (E, E), il)]
            elif self.attends(il):
                layer += [spec(T.ATTN_NORM, (E,), il, kind="vector"), *qkv_tensors(hp, il)]
            layer.append(spec(T.ATTN_OUT, (E,), il, "bias", kind="vector", optional=True))
            if F:
                layer += [spec(T.FFN_NORM, (E,), il, kind="vector"), spec(T.FFN_GATE, (E, F), il),
                          spec(T.FFN_DOWN, (F, E), il), spec(T.FFN_UP, (E, F), il)]
            layer += [spec(t, (n,), il, "bias", kind="vector", optional=True)
                      for t, n in ((T.FFN_GATE, F), (T.FFN_DOWN, E), (T.FFN_UP, F))]
            specs += layer + layer_scales(layer, il)  # read: attention's output scale alone
        return specs

    def build(self, b: GraphBuilder) -> None:
        hp = self.hp
        x = b.build_inp_embd(b.w(T.TOKEN_EMBD))
        pos = b.build_inp_pos()
        for il in b.layers():
            a = x if hp.head_count(il) == 0 else b.norm(x, T.ATTN_NORM, il, name="attn_norm")
            if self.linear(il):
                a = b.linear(a, b.w(T.ATTN_OUT, il), name="wo")
            elif self.attends(il):
                q, k, v = b.build_qkv(a, il)
                q = b.rope(q, pos, rope_factors(b), name="Qcur.rope")
                k = b.rope(k, pos, rope_factors(b), name="Kcur.rope")
                a = b.build_attn(q, k, v, wo=b.w(T.ATTN_OUT, il), wo_b=b.w_opt(T.ATTN_OUT, il, "bias"),
                                 wo_s=b.scale(T.ATTN_OUT, il), kq_scale=inv_sqrt(hp.n_embd_head_k))
            a, inp = b.last_layer_rows((a, "attn_out.rows"), (x, "inp.rows"))
            if hp.ff_length(il) == 0:  # the layer leaves the stream as it was (llama.cpp's graph goes on)
                continue
            # the FFN reads the attention's output plus the layer's input, or (no attention) the input alone
            h = b.op("add", a, inp, name="ffn_inp") if hp.head_count(il) else a
            f = b.build_ffn(b.norm(h, T.FFN_NORM, il, name="ffn_norm"), up=b.w(T.FFN_UP, il),
                            up_b=b.w_opt(T.FFN_UP, il, "bias"), gate=b.w(T.FFN_GATE, il),
                            gate_b=b.w_opt(T.FFN_GATE, il, "bias"), down=b.w(T.FFN_DOWN, il),
                            down_b=b.w_opt(T.FFN_DOWN, il, "bias"))
            x = b.op("add", f, h, name="l_out")
        x = b.norm(x, T.OUTPUT_NORM, name="result_norm")
        b.build_output(x, b.w(T.OUTPUT))


# ---- Hugging Face: convert_hf_to_gguf's DeciModel -----------------------------------------------------------


def _ffn_length(ffn_mult: float, n_embd: int) -> int:
    """A block's FFN length from its ``ffn_mult``: 2/3 of mult * n_embd, rounded up to a multiple of 256."""
    n = int(2 * ffn_mult * n_embd / 3)
    return -(n // -256) * 256


def _sizes(c: Config) -> dict[str, object]:
    """Per-layer sizes: Nemotron's ``block_configs`` (an attention without ``n_heads_in_group`` is a linear layer
    where ``replace_with_linear``, else absent; an FFN without ``ffn_mult`` is absent) with heads of
    n_embd / n_head; or DeciLM's ``num_key_value_heads_per_layer`` beside the text keys."""
    blocks = c.find("block_configs", kind="list", default=None)
    if blocks is None:
        return {A.HEAD_COUNT_KV: c.find("num_key_value_heads_per_layer", kind="list")}
    n_head, E = c.find("num_attention_heads"), c.find("hidden_size")
    heads, kv, ff = [], [], []
    for i, block in enumerate(blocks):
        attn = c.check(f"block_configs[{i}].attention", block.get("attention"), "map")
        ffn = c.check(f"block_configs[{i}].ffn", block.get("ffn"), "map")
        group = attn.get("n_heads_in_group")
        heads.append(n_head if group is not None or attn.get("replace_with_linear") is True else 0)
        kv.append(0 if group is None else n_head // c.check(f"block_configs[{i}].attention.n_heads_in_group",
                                                            group, "count"))
        mult = ffn.get("ffn_mult")
        ff.append(0 if mult is None else _ffn_length(c.check(f"block_configs[{i}].ffn.ffn_mult", mult, "number"), E))
    return {A.HEAD_COUNT: heads, A.HEAD_COUNT_KV: kv, L.FEED_FORWARD_LENGTH: ff, A.KEY_LENGTH: E // n_head,
            A.VALUE_LENGTH: E // n_head}


def _deci_include(c: Config) -> str:
    return r"rope_freqs\.weight" if str(c.full_rope.get("rope_type", "")).lower() == "llama3" else ""


DECI = TEXT_BASE + (VOCAB, derived(R.DIMENSION_COUNT, head_dim), _sizes)  # the sizes per layer replace TEXT's
hf_config.register(Family("deci", DECI, {"tie_word_embeddings": False}, _deci_include), "DeciLMForCausalLM")

# ---- presets -----------------------------------------------------------------------------------------------

presets.register({
    # a synthetic header of every kind of layer (not a released model): attending layers with 8 and 2 KV heads,
    # Nemotron-51B's linear attention, an attention-free layer, and an FFN-free one (Nemotron-Ultra's)
    "Deci-tiny": Preset("deci", {
        L.CONTEXT_LENGTH: 4096, L.EMBEDDING_LENGTH: 512, L.BLOCK_COUNT: 8, A.HEAD_COUNT: [8, 8, 8, 0, 8, 8, 8, 8],
        A.HEAD_COUNT_KV: [8, 2, 0, 0, 2, 2, 2, 2], L.FEED_FORWARD_LENGTH: [1536, 1536, 1024, 1024, 0, 1536, 1536, 1536],
        A.LAYERNORM_RMS_EPS: 1e-5, R.FREQ_BASE: 500000.0, R.DIMENSION_COUNT: 64, A.KEY_LENGTH: 64, A.VALUE_LENGTH: 64,
        L.VOCAB_SIZE: 1024,
    }, tied=False, source="a synthetic header of deci's kinds of layer"),
})
