"""CogVLM's text model (THUDM): a pre-norm Llama-like decoder whose every layer holds two sets of attention and
FFN matrices, the language ones and the vision expert's, chosen by what the ubatch carries: token ids take the
language set, embedding rows (an image's, from the vision encoder) the vision expert's.

Q, K and V are strided views of one fused projection, turned by NeoX RoPE at ggml_rope's defaults (base 10000,
no scaling), and every token's row goes on to the LM head: llama.cpp's graph selects no output rows, so the
graph keeps them all (the context takes the requested ones). The loader's optional RoPE frequency factors are
never read.

References: Wang et al. 2023, "CogVLM: Visual Expert for Pretrained Language Models" (arXiv:2311.03079);
llama.cpp src/models/cogvlm.cpp.
"""

from __future__ import annotations

from gguf import MODEL_TENSOR as T
from gguf import Keys

from graphir.errors import MetadataError
from graphir.graph.floats import inv_sqrt
from graphir.model import presets
from graphir.model.architecture import Architecture
from graphir.model.builder import GraphBuilder
from graphir.model.hparams import HParams
from graphir.model.prenorm import synthetic
from graphir.model.qkv import check_whole_heads
from graphir.model.scales import layer_scales
from graphir.model.tensors import TensorSpec, spec, tensor_name

# each layer's matrices: the language set's and the vision expert's
LANGUAGE = (T.ATTN_QKV, T.ATTN_OUT, T.FFN_GATE, T.FFN_DOWN, T.FFN_UP)
VISION = (T.VISEXP_ATTN_QKV, T.VISEXP_ATTN_OUT, T.VISEXP_GATE, T.VISEXP_DOWN, T.VISEXP_UP)


class CogVLM(Architecture):
    name = "cogvlm"
    rope_mode = "neox"
    required_keys = (Keys.LLM.FEED_FORWARD_LENGTH, Keys.Attention.HEAD_COUNT, Keys.Attention.LAYERNORM_RMS_EPS)

    def __init__(self, hp: HParams):
        check_whole_heads(hp, self.name)
        if hp.head_count_kv(0) != hp.head_count(0):  # the fused projection holds Q, K and V of one width each
            key = Keys.Attention.HEAD_COUNT_KV.format(arch=self.name)
            raise MetadataError(f"'{key}' = {hp.head_count_kv(0)}: '{self.name}' attends with one KV head per query "
                                f"head ({hp.head_count(0)})")
        super().__init__(hp)

    def tensors(self) -> list[TensorSpec]:
        hp = self.hp
        E, V, F, W = hp.n_embd, hp.n_vocab, hp.n_ff, hp.n_embd_head_k * hp.head_count(0)
        specs = [spec(T.TOKEN_EMBD, (E, V)), spec(T.OUTPUT_NORM, (E,), kind="vector"),
                 spec(T.OUTPUT, (E, V), tied_to=tensor_name(T.TOKEN_EMBD)),
                 spec(T.ROPE_FREQS, (hp.n_rot // 2,), kind="vector", optional=True)]
        for il in range(hp.n_layer):
            layer = [spec(T.ATTN_NORM, (E,), il, kind="vector"), spec(T.FFN_NORM, (E,), il, kind="vector")]
            for qkv, out, gate, down, up in (LANGUAGE, VISION):
                layer += [spec(qkv, (E, 3 * W), il), spec(out, (W, E), il), spec(gate, (E, F), il),
                          spec(down, (F, E), il), spec(up, (E, F), il)]
            specs += layer + layer_scales(layer, il, 0)
        return specs

    def build(self, b: GraphBuilder) -> None:
        hp = self.hp
        d, H, T_ = hp.n_embd_head_k, hp.head_count(0), b.n_tokens
        qkv_w, wo_w, gate_w, down_w, up_w = VISION if b.rows else LANGUAGE
        x = b.build_inp_embd(b.w(T.TOKEN_EMBD))
        pos = b.build_inp_pos()
        rope = dict(n_dims=d, n_ctx_orig=0, freq_base=10000.0, freq_scale=1.0, ext_factor=0.0, attn_factor=1.0,
                    beta_fast=0.0, beta_slow=0.0)  # ggml_rope's own parameters
        for il in range(hp.n_layer):
            with b.layer(il):
                h = b.norm(x, T.ATTN_NORM, il, name="attn_norm")
                qkv = b.mm(b.w(qkv_w, il), h, name="wqkv")
                q, k, v = (b.op("view", qkv, shape=(d, H, T_), strides=(1, d, 3 * d * H), offset=i * d * H, name=tag)
                           for i, tag in enumerate(("Qcur", "Kcur", "Vcur")))
                q = b.rope(q, pos, name="Qcur.rope", **rope)
                k = b.rope(k, pos, name="Kcur.rope", **rope)
                a = b.build_attn(q, k, v, wo=b.w(wo_w, il), wo_s=None if b.rows else b.scale(T.ATTN_OUT, il),
                                 kq_scale=inv_sqrt(d))
                x = b.op("add", a, x, name="ffn_inp")
                f = b.build_ffn(b.norm(x, T.FFN_NORM, il, name="ffn_norm"), up=b.w(up_w, il), gate=b.w(gate_w, il),
                                down=b.w(down_w, il))
                x = b.op("add", f, x, name="ffn_out")
        b.build_output(b.norm(x, T.OUTPUT_NORM, name="result_norm"), b.w(T.OUTPUT))


# CogVLM's public config (a Hugging Face remote-code model, which the converter reads as such) is not known here
# for certain: the golden graphs come from a tiny header
presets.register({"CogVLM-tiny": synthetic("cogvlm", "a synthetic header of tiny sizes")})
