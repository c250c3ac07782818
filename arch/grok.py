"""Grok (grok): a pre-norm decoder over scaled token embeddings, whose attention output is RMS-normalised before
the residual, whose scores are scaled by an output multiplier and soft-capped (cap * tanh(scores * multiplier /
cap), unscaled by 1/sqrt(d)), and whose FFN is a softmax-routed mixture of GELU experts (renormalised), in Grok-2
averaged with a parallel dense GELU FFN (their sum times sqrt(2)/2), RMS-normalised again before the residual; the
logits are scaled, and soft-capped where the file says.

References: xAI 2024, "Grok-1"; llama.cpp src/models/grok.cpp.
"""

from __future__ import annotations

import math

from gguf import MODEL_TENSOR as T
from gguf import Keys

from graphir.errors import MetadataError, TensorError
from graphir.graph.floats import f32
from graphir.model import hf_config, presets
from graphir.model.architecture import Architecture
from graphir.model.builder import Act, GraphBuilder, yarn_attn_factor
from graphir.model.hf_config import TEXT, VOCAB, Family, hf
from graphir.model.hparams import HParams, Key
from graphir.model.moe import MOE_KEYS, check_routed
from graphir.model.presets import Preset
from graphir.model.qkv import check_head_sizes, qkv_tensors
from graphir.model.scales import layer_scales
from graphir.model.tensors import TensorSpec, spec, tensor_name

L, A, R = Keys.LLM, Keys.Attention, Keys.Rope

HALF_SQRT2 = f32(math.sqrt(2) / 2)  # the average of the experts and the dense FFN, as llama.cpp rounds it


class Grok(Architecture):
    name = "grok"
    rope_mode = "neox"
    required_keys = (A.HEAD_COUNT, A.LAYERNORM_RMS_EPS)
    # llama.cpp's defaults are Grok-1's, for files written before the keys
    keys = MOE_KEYS + (
        Key("n_ff_exp", L.EXPERT_FEED_FORWARD_LENGTH, tuple, (), minimum=0),
        Key("logit_scale", L.LOGIT_SCALE, float, 0.5773502691896257),
        Key("embedding_scale", L.EMBEDDING_SCALE, float, 78.38367176906169),
        Key("attn_out_scale", A.OUTPUT_SCALE, float, 0.08838834764831845),
        Key("attn_softcap", L.ATTN_LOGIT_SOFTCAPPING, float, 30.0),
        Key("router_softcap", L.ROUTER_LOGIT_SOFTCAPPING, float, 30.0),  # read, not used by the graph
        Key("final_softcap", L.FINAL_LOGIT_SOFTCAPPING, float, 0.0),  # 0: the logits are not capped
        Key("attn_temp_length", A.TEMPERATURE_LENGTH, int, 0, minimum=0),  # read, not used by the graph
        Key("yarn_ext_factor", R.SCALING_YARN_EXT_FACTOR, float, -1.0),  # negative: 1 with YaRN, else 0
        Key("yarn_attn_factor", R.SCALING_YARN_ATTN_FACTOR, float, 1.0),
        Key("yarn_beta_fast", R.SCALING_YARN_BETA_FAST, float, 8.0),
        Key("yarn_beta_slow", R.SCALING_YARN_BETA_SLOW, float, 1.0),
    )

    def __init__(self, hp: HParams):
        key = lambda t: t.format(arch=self.name)  # noqa: E731
        check_routed(hp, self.name)
        check_head_sizes(hp, self.name)
        if hp.attn_softcap <= 0:
            raise MetadataError(f"'{key(L.ATTN_LOGIT_SOFTCAPPING)}' = {hp.attn_softcap}: the scores' cap must be "
                                f"positive")
        super().__init__(hp)

    @property
    def n_ff_exp(self) -> int:
        """One expert's width: layer 0's ``expert_feed_forward_length``, else the FFN length (Grok-1's)."""
        hp = self.hp
        return (hp.n_ff_exp[0] if hp.n_ff_exp else 0) or hp.ff_length(0)

    def tensors(self) -> list[TensorSpec]:
        """Per layer the attention with its output norm, the optional dense FFN, the router and the experts (their
        gates optional), and the FFN's output norm: ``layer_output_norm`` or else ``post_ffw_norm``."""
        hp = self.hp
        E, V, X, Fx = hp.n_embd, hp.n_vocab, hp.n_expert, self.n_ff_exp
        specs = [spec(T.TOKEN_EMBD, (E, V)), spec(T.OUTPUT_NORM, (E,), kind="vector"),
                 spec(T.OUTPUT, (E, V), tied_to=tensor_name(T.TOKEN_EMBD))]
        for il in range(hp.n_layer):
            F = hp.ff_length(il)
            layer = [spec(T.ATTN_NORM, (E,), il, kind="vector"), *qkv_tensors(hp, il),
                     spec(T.ATTN_OUT_NORM, (E,), il, kind="vector"), spec(T.FFN_NORM, (E,), il, kind="vector"),
                     spec(T.FFN_GATE, (E, F), il, optional=True), spec(T.FFN_DOWN, (F, E), il, optional=True),
                     spec(T.FFN_UP, (E, F), il, optional=True), spec(T.FFN_GATE_INP, (E, X), il),
                     spec(T.FFN_GATE_EXP, (E, Fx, X), il, optional=True), spec(T.FFN_DOWN_EXP, (Fx, E, X), il),
                     spec(T.FFN_UP_EXP, (E, Fx, X), il),
                     spec(T.LAYER_OUT_NORM, (E,), il, kind="vector", optional=True),
                     spec(T.FFN_POST_NORM, (E,), il, kind="vector", optional=True)]
            specs += layer + layer_scales(layer, il, X)
        return specs

    def rope_params(self) -> dict[str, float]:
        """YaRN's extrapolation factor, magnitude and betas as llama.cpp's context takes them from the file."""
        hp = self.hp
        ext = hp.yarn_ext_factor if hp.yarn_ext_factor >= 0 else float(hp.rope_scaling == "yarn")
        attn = yarn_attn_factor(hp.rope_freq_scale, hp.rope_attn_factor) if ext else \
            f32(hp.yarn_attn_factor * hp.rope_attn_factor)
        return dict(ext_factor=ext, attn_factor=attn, beta_fast=hp.yarn_beta_fast, beta_slow=hp.yarn_beta_slow)

    def build(self, b: GraphBuilder) -> None:
        hp = self.hp
        rope = self.rope_params()
        x = b.build_inp_embd(b.w(T.TOKEN_EMBD))
        if hp.embedding_scale:
            x = b.op("scale", x, s=hp.embedding_scale, name="inp_scaled")
        pos = b.build_inp_pos()
        for il in b.layers():
            h = b.norm(x, T.ATTN_NORM, il, name="attn_norm")
            # self-attention: scores times the output multiplier, soft-capped, and not scaled by 1/sqrt(d)
            q, k, v = b.build_qkv(h, il)
            q = b.rope(q, pos, name="Qcur.rope", **rope)
            k = b.rope(k, pos, name="Kcur.rope", **rope)
            a = b.build_attn(q, k, v, wo=b.w(T.ATTN_OUT, il), wo_s=b.scale(T.ATTN_OUT, il), kq_scale=1.0,
                             softcap=hp.attn_softcap, softcap_in=hp.attn_out_scale)
            a, x = b.last_layer_rows((a, "attn_out.rows"), (x, "inp.rows"))
            a = b.norm(a, T.ATTN_OUT_NORM, il, name="attn_out_norm")
            x = b.op("add", a, x, name="ffn_inp")
            # GELU experts (softmax, renormalised), averaged with the dense GELU FFN where the file has one
            h = b.norm(x, T.FFN_NORM, il, name="ffn_norm")
            f = b.build_moe_ffn(h, gate_inp=b.w(T.FFN_GATE_INP, il), up_exps=b.w(T.FFN_UP_EXP, il),
                                gate_exps=b.w_opt(T.FFN_GATE_EXP, il), down_exps=b.w(T.FFN_DOWN_EXP, il),
                                n_expert=hp.n_expert, n_expert_used=hp.n_expert_used, norm_w=True, act=Act.GELU)
            up = b.w_opt(T.FFN_UP, il)
            if up is not None:
                dense = b.build_ffn(h, up=up, gate=b.w_opt(T.FFN_GATE, il), down=b.w(T.FFN_DOWN, il), act=Act.GELU)
                f = b.op("scale", b.op("add", dense, f, name="ffn_both"), s=HALF_SQRT2, name="ffn_out")
            post = b.w_opt(T.LAYER_OUT_NORM, il)
            post = b.w_opt(T.FFN_POST_NORM, il) if post is None else post
            if post is None:
                raise TensorError(f"{b.label}: missing tensor '{tensor_name(T.FFN_POST_NORM, il)}' (or "
                                  f"'{tensor_name(T.LAYER_OUT_NORM, il)}')")
            f = b.build_norm(f, post, name="ffn_post_norm")
            x = b.op("add", f, x, name="l_out")
        x = b.norm(x, T.OUTPUT_NORM, name="result_norm")
        b.build_output(x, b.w(T.OUTPUT))
        logits = b.op("scale", b.outputs["logits"], s=hp.logit_scale, name="result_scaled")
        b.outputs["logits"] = b.softcap(logits, hp.final_softcap, name="result_capped") if hp.final_softcap \
            else logits


# ---- Hugging Face: what convert_hf_to_gguf writes for these configs -----------------------------------------

def _attn_out_scale(c: hf_config.Config) -> float:
    return c.find("attn_output_multiplier", kind="number", default=None) or hf_config.head_dim(c) ** -0.5


hf_config.register(Family("grok", TEXT + (
    VOCAB,
    hf(L.EXPERT_FEED_FORWARD_LENGTH, "moe_intermediate_size", default=None),
    hf(L.ATTN_LOGIT_SOFTCAPPING, "attn_logit_softcapping", kind="number", default=30.0),
    hf(L.ROUTER_LOGIT_SOFTCAPPING, "router_logit_softcapping", kind="number", default=30.0),
    hf(L.FINAL_LOGIT_SOFTCAPPING, "final_logit_softcapping", kind="number", default=None),
    hf_config.derived(A.OUTPUT_SCALE, _attn_out_scale),
    hf(L.EMBEDDING_SCALE, "embedding_multiplier_scale", kind="number"),
    hf(L.LOGIT_SCALE, "output_multiplier_scale", kind="number"),
), {"tie_word_embeddings": True}, lambda c: presets.EXPERT_GATES + r"|blk\.\d+\.layer_output_norm\.weight"),
    "GrokForCausalLM", "Grok1ForCausalLM")


# ---- presets: released models of this family, as their converted GGUFs declare them ---------------------

presets.register({
    # 64 layers of width 6144, 48 query and 8 KV heads of 128; every FFN 8 GELU experts of 32768, 2 per token
    # (no dense FFN); the LM head is the embedding
    "Grok-1": Preset("grok", {
        L.CONTEXT_LENGTH: 8192, L.EMBEDDING_LENGTH: 6144, L.BLOCK_COUNT: 64, L.FEED_FORWARD_LENGTH: 32768,
        A.HEAD_COUNT: 48, A.HEAD_COUNT_KV: 8, R.FREQ_BASE: 10000.0, A.LAYERNORM_RMS_EPS: 1e-5, L.VOCAB_SIZE: 131072,
        L.EXPERT_COUNT: 8, L.EXPERT_USED_COUNT: 2, L.ATTN_LOGIT_SOFTCAPPING: 30.0, L.ROUTER_LOGIT_SOFTCAPPING: 30.0,
        A.OUTPUT_SCALE: 0.08838834764831845, L.EMBEDDING_SCALE: 78.38367176906169,
        L.LOGIT_SCALE: 0.5773502691896257,
    }, tied=True, include=presets.EXPERT_GATES + r"|blk\.\d+\.layer_output_norm\.weight", f32=presets.ROUTER_F32,
        source="xai-org/grok-1 (the hpcai-tech/grok-1 config.json of its weights)"),
})
