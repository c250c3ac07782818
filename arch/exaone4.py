"""EXAONE 4.0 (LG AI Research): a decoder that normalises each sublayer's output instead of its input (RMSNorm
after attention and after the FFN, before each residual add), with per-head RMS QK-norm before RoPE over split
halves of whole heads and a SwiGLU FFN. The 32B model (64 layers) slides three layers of every four over a window
(4096 unless the file says) and rotates only those, its global layers attending without positions; the 1.2B model
attends globally everywhere and rotates every layer. The LM head is the token embedding unless the file has its own.
Multi-token-prediction layers (EXAONE 4.5's) are loaded as llama.cpp asks for them and never run.

References: LG AI Research 2025, "EXAONE 4.0: Unified Large Language Models Integrating Non-reasoning and Reasoning
Modes" (arXiv:2507.11407); llama.cpp src/models/exaone4.cpp.
"""

from __future__ import annotations

from gguf import MODEL_TENSOR as T
from gguf import Keys

from graphir.graph.floats import inv_sqrt
from graphir.model import hf_config, presets
from graphir.model.architecture import Architecture
from graphir.model.builder import GraphBuilder
from graphir.model.hf_config import BLOCKS, TEXT, VOCAB, Config, Family
from graphir.model.hparams import HParams, SlidingWindow
from graphir.memory.layers import LayerNeeds
from graphir.model.moe import NEXTN_KEY, nextn_layer, trunk_layers
from graphir.model.prenorm import RMS_KEYS, synthetic
from graphir.model.qkv import check_whole_heads, fused_or_split_qkv_tensors, qk_norm_tensors, qkv
from graphir.model.scales import layer_scales
from graphir.model.tensors import TensorSpec, spec, tensor_name

L, A = Keys.LLM, Keys.Attention


class Exaone4(Architecture):
    name = "exaone4"
    rope_mode = "neox"
    required_keys = RMS_KEYS
    keys = (NEXTN_KEY,)
    swa = SlidingWindow("standard", window=4096, period=4, n_layer=64)

    def __init__(self, hp: HParams):
        check_whole_heads(hp, self.name)
        super().__init__(hp)
        self.n_trunk = trunk_layers(hp, self.name)  # the prediction layers after it are loaded, never run

    def layers(self) -> LayerNeeds:
        return super().layers()[:self.n_trunk]

    def tensors(self) -> list[TensorSpec]:
        hp = self.hp
        E, F, V = hp.n_embd, hp.n_ff, hp.n_vocab
        specs = [spec(T.TOKEN_EMBD, (E, V)), spec(T.OUTPUT_NORM, (E,), kind="vector"),
                 spec(T.OUTPUT, (E, V), tied_to=tensor_name(T.TOKEN_EMBD)),
                 spec(T.ROPE_FREQS, (hp.n_rot // 2,), kind="vector", optional=True)]
        for il in range(hp.n_layer):
            layer = [*fused_or_split_qkv_tensors(hp, il), spec(T.ATTN_OUT, (E, E), il), *qk_norm_tensors(hp, il),
                     spec(T.ATTN_POST_NORM, (E,), il, kind="vector"), spec(T.FFN_GATE, (E, F), il),
                     spec(T.FFN_DOWN, (F, E), il), spec(T.FFN_UP, (E, F), il),
                     spec(T.FFN_POST_NORM, (E,), il, kind="vector")]
            layer += layer_scales(layer, il)
            specs += layer if il < self.n_trunk else nextn_layer(layer, hp, il, required=True)
        return specs


    def build(self, b: GraphBuilder) -> None:
        hp = self.hp
        x = b.build_inp_embd(b.w(T.TOKEN_EMBD))
        pos = b.build_inp_pos()
        for il in b.layers(self.n_trunk):
            # self-attention on the stream itself, Q and K normalised per head, then RoPE'd (sliding layers only,
            # where the model slides)
            q, k, v = qkv(b, x, il, True)
            if hp.is_swa(il) or not hp.swa_layers:
                factors = b.w_opt(T.ROPE_FREQS)
                q, k = b.rope(q, pos, factors, name="Qcur.rope"), b.rope(k, pos, factors, name="Kcur.rope")
            a = b.build_attn(q, k, v, wo=b.w(T.ATTN_OUT, il), wo_s=b.scale(T.ATTN_OUT, il), kq_scale=inv_sqrt(hp.n_embd_head_k))
            a, x = b.last_layer_rows((a, "attn_out.rows"), (x, "inp.rows"))
            x = b.op("add", b.norm(a, T.ATTN_POST_NORM, il, name="attn_post_norm"), x, name="ffn_inp")
            # feed-forward network on the stream itself
            f = b.build_ffn(x, up=b.w(T.FFN_UP, il), gate=b.w(T.FFN_GATE, il), down=b.w(T.FFN_DOWN, il))
            x = b.op("add", b.norm(f, T.FFN_POST_NORM, il, name="ffn_post_norm"), x, name="l_out")
        b.build_output(b.norm(x, T.OUTPUT_NORM, name="result_norm"), b.w(T.OUTPUT))


# ---- Hugging Face: convert_hf_to_gguf's Exaone4Model: the text keys, the window and which layers slide -----------

def sliding(c: Config) -> dict[str, object]:
    """The window, and which layers slide: layer_types, or a sliding_window_pattern such as "LLLG" or 4."""
    window = c.find("sliding_window", kind="size", default=None)
    if window is None:
        return {}
    n, types = c.find(*BLOCKS), c.find("layer_types", kind="list", default=None)
    pattern = c.doc.get("sliding_window_pattern")
    if types is not None:
        layers = [t == "sliding_attention" for t in types]
    elif isinstance(pattern, str):
        layers = [pattern[il % len(pattern)] == "L" for il in range(n)]
    elif isinstance(pattern, int):
        layers = [(il + 1) % pattern != 0 for il in range(n)]
    else:
        return {A.SLIDING_WINDOW: window}
    return {A.SLIDING_WINDOW: window, A.SLIDING_WINDOW_PATTERN: layers}


hf_config.register(Family("exaone4", TEXT + (VOCAB, sliding), {"tie_word_embeddings": False},
                          lambda c: presets.SPLIT_QKV), "Exaone4ForCausalLM")

presets.register({
    "EXAONE-4-tiny": synthetic("exaone4", "a synthetic header of tiny sizes", include=presets.SPLIT_QKV),
    # the 32B's layer count, so that three of every four layers slide over the default window of 4096
    "EXAONE-4-32B-tiny": synthetic("exaone4", "a synthetic header of tiny widths and the 32B's 64 layers",
                                   include=presets.SPLIT_QKV, keys={L.BLOCK_COUNT: 64, L.CONTEXT_LENGTH: 8192}),
})
