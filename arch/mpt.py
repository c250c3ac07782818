"""MPT (MosaicML): GPT-2's block (LayerNorms, fused QKV, a GELU MLP) with positions by ALiBi, every bias
optional (MPT-7B has none), Q, K and V clamped where the file sets clamp_kqv, a learned position table where the
file has one, and the GELU's output divided by AWQ's activation scales where a quantized file carries them. The
LM head is the token embedding unless the file has its own.

llama.cpp also loads MPT's optional QK LayerNorm, but its graph cannot apply it: it reshapes a strided view of the
fused QKV, which ggml refuses (llama.cpp's own tests leave the tensor out for that reason). graphir refuses such
a file by name instead of building a graph llama.cpp never runs.

References: MosaicML 2023, "Introducing MPT-7B"; Press et al. 2022, "Train Short, Test Long" (ALiBi,
arXiv:2108.12409); llama.cpp src/models/mpt.cpp.
"""

from __future__ import annotations

from typing import Any, Mapping

from gguf import MODEL_TENSOR as T
from gguf import Keys

from graphir.graph.floats import inv_sqrt
from graphir.model import hf_config, presets
from graphir.model.architecture import Architecture
from graphir.model.builder import Act, GraphBuilder, Norm
from graphir.model.hf_config import BLOCKS, VOCAB, Config, Family, derived, fixed, hf
from graphir.model.hparams import Alibi
from graphir.model.presets import Preset
from graphir.model.qkv import CLAMP_KQV
from graphir.model.scales import layer_scales
from graphir.model.tensors import TensorDecl, TensorSpec, spec, tensor_name, with_bias

L, A = Keys.LLM, Keys.Attention
ACT_SCALES = "act.scales"  # AWQ's activation scales: blk.<il>.ffn.act.scales, as the converter renames them


class Mpt(Architecture):
    name = "mpt"
    required_keys = (L.FEED_FORWARD_LENGTH, A.HEAD_COUNT, A.LAYERNORM_EPS)
    keys = (CLAMP_KQV,)
    alibi = Alibi(key=True)  # the file's max_alibi_bias (absent: 0, positions by the table alone)

    def tensors(self) -> list[TensorSpec]:
        hp = self.hp
        E, F, V = hp.n_embd, hp.n_ff, hp.n_vocab
        specs = [spec(T.TOKEN_EMBD, (E, V)), spec(T.POS_EMBD, (E, hp.n_ctx_train), optional=True),
                 *with_bias(T.OUTPUT_NORM, (E,), bias_optional=True),
                 spec(T.OUTPUT, (E, V), tied_to=tensor_name(T.TOKEN_EMBD))]
        for il in range(hp.n_layer):
            layer = [*with_bias(T.ATTN_NORM, (E,), il, bias_optional=True),
                     *with_bias(T.ATTN_QKV, (E, E + 2 * hp.n_embd_v_gqa), il, bias_optional=True),
                     *with_bias(T.ATTN_OUT, (E, E), il, bias_optional=True),
                     *with_bias(T.FFN_NORM, (E,), il, bias_optional=True),
                     *with_bias(T.FFN_UP, (E, F), il, bias_optional=True),
                     *with_bias(T.FFN_DOWN, (F, E), il, bias_optional=True),
                     *with_bias(T.ATTN_Q_NORM, (E,), il, optional=True),  # refused where present (check)
                     *with_bias(T.ATTN_K_NORM, (E,), il, optional=True),  # loaded and unread, as llama.cpp
                     spec(T.FFN_ACT, (F,), il, ACT_SCALES, kind="vector", optional=True)]
            specs += layer + layer_scales(layer, il)
        return specs

    def check(self, tensors: Mapping[str, TensorDecl]) -> list[str]:
        qk_norm = [n for il in range(self.hp.n_layer) if (n := tensor_name(T.ATTN_Q_NORM, il)) in tensors]
        return super().check(tensors) + [
            f"tensor '{n}': MPT's QK LayerNorm is not run (llama.cpp's graph cannot apply it: ggml refuses to reshape "
            f"the strided view of the fused QKV it normalises)" for n in qk_norm[:1]]

    def build(self, b: GraphBuilder) -> None:
        hp = self.hp
        x = b.build_inp_embd(b.w(T.TOKEN_EMBD))
        table = b.w_opt(T.POS_EMBD)
        if table is not None:  # a learned position table (with ALiBi or instead of it)
            x = b.op("add", x, b.op("get_rows", table, b.build_inp_pos(), name="pos_embd"), name="inpL")
        for il in b.layers():
            h = b.norm(x, T.ATTN_NORM, il, Norm.LAYER, name="attn_norm")
            q, k, v = b.build_qkv(h, il, clamp=hp.clamp_kqv)
            a = b.build_attn(q, k, v, wo=b.w(T.ATTN_OUT, il), wo_b=b.w_opt(T.ATTN_OUT, il, "bias"),
                             wo_s=b.scale(T.ATTN_OUT, il), kq_scale=inv_sqrt(hp.n_embd_head_k))
            a, x = b.last_layer_rows((a, "attn_out.rows"), (x, "inp.rows"))
            x = b.op("add", a, x, name="ffn_inp")
            h = b.norm(x, T.FFN_NORM, il, Norm.LAYER, name="ffn_norm")
            f = b.build_ffn(h, up=b.w(T.FFN_UP, il), up_b=b.w_opt(T.FFN_UP, il, "bias"), gate=None,
                            down=b.w(T.FFN_DOWN, il), down_b=b.w_opt(T.FFN_DOWN, il, "bias"), act=Act.GELU,
                            act_scales=b.w_opt(T.FFN_ACT, il, ACT_SCALES))
            x = b.op("add", f, x, name="l_out")
        b.build_output(b.norm(x, T.OUTPUT_NORM, kind=Norm.LAYER, name="result_norm"), b.w(T.OUTPUT))


# ---- Hugging Face: convert_hf_to_gguf's MPTModel ------------------------------------------------------------

def _attn(c: Config) -> dict[str, Any]:
    return c.check("attn_config", c.find("attn_config", kind="map", default={}), "map")


def _tensors(c: Config) -> str:
    """The optional tensors a checkpoint has: biases unless no_bias, the position table unless ALiBi replaces it,
    QK LayerNorms with qk_ln (which graphir then refuses, naming them)."""
    out = []
    if not c.find("no_bias", kind="flag", default=False):
        out.append(r"(output_norm|blk\.\d+\.(attn_norm|attn_qkv|attn_output|ffn_norm|ffn_up|ffn_down))\.bias")
    if c.find("learned_pos_emb", kind="flag", default=True) and not _attn(c).get("alibi", False):
        out.append(r"position_embd\.weight")
    if _attn(c).get("qk_ln", False):
        out.append(r"blk\.\d+\.attn_[qk]_norm\.(weight|bias)")
    return "|".join(out)


hf_config.register(Family("mpt", (
    hf(L.CONTEXT_LENGTH, "max_seq_len"),
    hf(L.EMBEDDING_LENGTH, "d_model"),
    hf(L.BLOCK_COUNT, *BLOCKS),
    derived(L.FEED_FORWARD_LENGTH, lambda c: 4 * c.find("d_model")),
    hf(A.HEAD_COUNT, "n_heads"),
    derived(A.HEAD_COUNT_KV, lambda c: _attn(c).get("kv_n_heads") or None),
    fixed(A.LAYERNORM_EPS, 1e-5),
    derived(A.CLAMP_KQV, lambda c: _attn(c).get("clip_qkv")),
    derived(A.MAX_ALIBI_BIAS, lambda c: float(_attn(c)["alibi_bias_max"]) if _attn(c).get("alibi") else 0.0),
    VOCAB,
), {"tie_word_embeddings": True}, _tensors), "MPTForCausalLM")

presets.register({
    # 32 layers of 32 heads of 128, ALiBi with a largest slope exponent of 8, no biases, the head tied
    "MPT-7B": Preset("mpt", {
        L.CONTEXT_LENGTH: 2048, L.EMBEDDING_LENGTH: 4096, L.BLOCK_COUNT: 32, L.FEED_FORWARD_LENGTH: 16384,
        A.HEAD_COUNT: 32, A.LAYERNORM_EPS: 1e-5, A.MAX_ALIBI_BIAS: 8.0, L.VOCAB_SIZE: 50432,
    }, tied=True, source="mosaicml/mpt-7b config.json"),
})
