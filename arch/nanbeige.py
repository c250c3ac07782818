"""Nanbeige (nanbeige): Llama's decoder whose stack of layers runs ``num_loops`` times over.

The file holds ``block_count`` physical layers; the model runs them in order ``num_loops`` times, every pass
through a layer a logical layer of its own (its own KV cache, its own per-tensor scales, as llama.cpp's loader
creates them for every logical layer) reading the physical layer's weights. Between passes the stream goes
through the final RMSNorm (``output_norm``) unless ``skip_loop_final_norm``. Each layer is Llama's: grouped-query
attention over RoPE'd Q and K (rope_freqs divisors where the file has them), a SwiGLU FFN.
References: Nanbeige LLM Lab 2025, "Nanbeige4"; llama.cpp src/models/nanbeige.cpp.
"""

from __future__ import annotations

from dataclasses import replace

from gguf import MODEL_TENSOR as T
from gguf import Keys

from graphir.errors import MetadataError
from graphir.graph.floats import inv_sqrt
from graphir.model import hf_config, presets
from graphir.model.architecture import Architecture
from graphir.model.builder import GraphBuilder
from graphir.model.hf_config import VOCAB, Family, derived, hf
from graphir.model.hparams import LAYER_COUNT, HParams, Key
from graphir.model.presets import Preset
from graphir.model.qkv import qkv_tensors
from graphir.model.rope_factors import rope_factor_tensors, rope_factors
from graphir.model.scales import scale_specs
from graphir.model.tensors import TensorSpec, spec, tensor_name

L, A, R = Keys.LLM, Keys.Attention, Keys.Rope
NUM_LOOPS, SKIP_LOOP_FINAL_NORM = "{arch}.num_loops", "{arch}.skip_loop_final_norm"  # llama.cpp's LLM_KV_NUM_LOOPS, ...
SCALED = (T.ATTN_Q, T.ATTN_K, T.ATTN_V, T.ATTN_OUT, T.FFN_GATE, T.FFN_DOWN, T.FFN_UP)


class Nanbeige(Architecture):
    name = "nanbeige"
    rope_mode = "norm"
    required_keys = (L.FEED_FORWARD_LENGTH, A.HEAD_COUNT, A.LAYERNORM_RMS_EPS)
    keys = (Key("n_loops", NUM_LOOPS, int, 1, minimum=1),
            Key("skip_loop_final_norm", SKIP_LOOP_FINAL_NORM, bool, False))

    def __init__(self, hp: HParams):
        """hparams with llama.cpp's logical layer count (physical layers times loops), the physical one kept."""
        if "n_layer_phys" not in dict(hp.family):
            if hp.n_layer * hp.n_loops > LAYER_COUNT["maximum"]:
                raise MetadataError(f"{hp.n_layer} layers run {hp.n_loops} times (key "
                                    f"'{NUM_LOOPS.format(arch=self.name)}') exceed {LAYER_COUNT['maximum']} layers")
            hp = replace(hp, n_layer=hp.n_layer * hp.n_loops, family=hp.family + (("n_layer_phys", hp.n_layer),))
        super().__init__(hp)

    def tensors(self) -> list[TensorSpec]:
        hp = self.hp
        E, V = hp.n_embd, hp.n_vocab
        specs = [spec(T.TOKEN_EMBD, (E, V)), spec(T.OUTPUT_NORM, (E,), kind="vector"),
                 spec(T.OUTPUT, (E, V), tied_to=tensor_name(T.TOKEN_EMBD)), *rope_factor_tensors(hp, False)]
        for p in range(hp.n_layer_phys):
            F = hp.ff_length(p)
            specs += [spec(T.ATTN_NORM, (E,), p, kind="vector"), *qkv_tensors(hp, p),
                      spec(T.FFN_NORM, (E,), p, kind="vector"), spec(T.FFN_GATE, (E, F), p),
                      spec(T.FFN_DOWN, (F, E), p), spec(T.FFN_UP, (E, F), p)]
        return specs + [s for il in range(hp.n_layer) for s in scale_specs(il, SCALED)]

    def build(self, b: GraphBuilder) -> None:
        hp = self.hp
        n_phys, T_ = hp.n_layer_phys, b.n_tokens
        x = b.build_inp_embd(b.w(T.TOKEN_EMBD))
        pos = b.build_inp_pos()
        for il in b.layers():
            p = il % n_phys  # the physical layer whose weights this pass reads; the scales are the pass's own
            h = b.norm(x, T.ATTN_NORM, p, name="attn_norm")
            q, k, v = (b.linear(h, b.w(t, p), b.w_opt(t, p, "bias"), name=tag, s=b.scale(t, il))
                       for t, tag in ((T.ATTN_Q, "Qcur"), (T.ATTN_K, "Kcur"), (T.ATTN_V, "Vcur")))
            d, H, H_kv = hp.n_embd_head_k, hp.head_count(p), hp.head_count_kv(p)
            q = b.rope(b.reshape(q, (d, H, T_), name="Qcur.heads"), pos, rope_factors(b), name="Qcur.rope")
            k = b.rope(b.reshape(k, (d, H_kv, T_), name="Kcur.heads"), pos, rope_factors(b), name="Kcur.rope")
            v = b.reshape(v, (hp.n_embd_head_v, H_kv, T_), name="Vcur.heads")
            a = b.build_attn(q, k, v, wo=b.w(T.ATTN_OUT, p), wo_s=b.scale(T.ATTN_OUT, il), kq_scale=inv_sqrt(d))
            a, x = b.last_layer_rows((a, "attn_out.rows"), (x, "inp.rows"))
            x = b.op("add", a, x, name="ffn_inp")
            f = b.build_ffn(b.norm(x, T.FFN_NORM, p, name="ffn_norm"), up=b.w(T.FFN_UP, p), gate=b.w(T.FFN_GATE, p),
                            down=b.w(T.FFN_DOWN, p), up_s=b.scale(T.FFN_UP, il), gate_s=b.scale(T.FFN_GATE, il),
                            down_s=b.scale(T.FFN_DOWN, il))
            x = b.op("add", f, x, name="l_out")
            if (il + 1) % n_phys == 0 and il + 1 < hp.n_layer and not hp.skip_loop_final_norm:
                x = b.norm(x, T.OUTPUT_NORM, name="loop_norm")  # between passes through the stack
        x = b.norm(x, T.OUTPUT_NORM, name="result_norm")
        b.build_output(x, b.w(T.OUTPUT))


# ---- Hugging Face: convert_hf_to_gguf's NanbeigeModel (a LlamaModel) -----------------------------------------

hf_config.register(Family("nanbeige", hf_config.TEXT + (
    VOCAB,
    derived(R.DIMENSION_COUNT, hf_config.head_dim),
    hf(NUM_LOOPS, "num_loops", kind="size", default=1),
    derived(SKIP_LOOP_FINAL_NORM, lambda c: bool(c.find("skip_loop_final_norm", kind="flag", default=False))),
), {"tie_word_embeddings": False}), "NanbeigeForCausalLM")

# ---- presets -----------------------------------------------------------------------------------------------

presets.register({
    # a synthetic header of a looped stack (not a released model): 4 physical layers run twice, the stream
    # normalised between the passes
    "Nanbeige-tiny": Preset("nanbeige", {
        L.CONTEXT_LENGTH: 4096, L.EMBEDDING_LENGTH: 512, L.BLOCK_COUNT: 4, L.FEED_FORWARD_LENGTH: 1536,
        A.HEAD_COUNT: 8, A.HEAD_COUNT_KV: 2, A.LAYERNORM_RMS_EPS: 1e-5, R.FREQ_BASE: 1000000.0, R.DIMENSION_COUNT: 64,
        L.VOCAB_SIZE: 1024, NUM_LOOPS: 2, SKIP_LOOP_FINAL_NORM: False,
    }, tied=False, source="a synthetic header of nanbeige's looped layers"),
})
