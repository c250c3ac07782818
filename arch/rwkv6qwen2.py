"""QRWKV6 (``rwkv6qwen2``): a Qwen2.5 whose attention is replaced by RWKV6's time mix over gated linear attention,
with Qwen's RMSNorms and SwiGLU FFN kept.

Each layer is ``x += time_mix(RMSNorm(x))`` then ``x += SwiGLU(RMSNorm(x))``. The time mix is RWKV6's (arch/rwkv.py:
the same token-shift mixes and data-dependent decay w), with Qwen's optional Q/K/V biases on r, k and v, key/value
heads shared by groups of heads (``attention.head_count_kv``, grouped-query attention's layout), k scaled by
(1 - w), then ``gated_linear_attn`` (S = S w + k v^T, out = S^T r / sqrt(head_size)) gated by sigmoid(g); no
time_first bonus, no group norm, no channel mix. Per sequence the recurrent memory keeps the last token's normed
input (one token shift: ``token_shift_count`` is 1) and one head_size x head_size state per head.

llama.cpp's graph stores each sequence's token shift as the n_seqs * n_embd values that follow the first sequence's
last token (a 1-D view of a strided one, src/models/rwkv6qwen2.cpp): with several sequences of several tokens in
one ubatch the later sequences keep another token's row. graphir's graph is llama.cpp's, this included.
llama.cpp's builder takes the RWKV6 path (time_first, group norm over time_mix_ln) when a layer has
``time_mix_first``, but its loader never creates time_mix_ln for this architecture: such a file is refused.
References: Recursal, "QRWKV6-32B-Instruct-Preview"; llama.cpp src/models/rwkv6qwen2.cpp, rwkv6-base.cpp.
"""

from __future__ import annotations

from typing import Mapping

from gguf import MODEL_TENSOR as T
from gguf import Keys

from graphir.arch.rwkv import SQUEEZED, decay, mix_and_decay_tensors, shifted, token_shift_mixes
from graphir.errors import MetadataError
from graphir.graph.ir import Node
from graphir.memory.layers import LayerNeeds, Recurrent
from graphir.model import hf_config, presets, ssm
from graphir.model.architecture import Architecture
from graphir.model.builder import GraphBuilder
from graphir.model.hf_config import BLOCKS, VOCAB, Config, Family, Rule, derived, fixed, hf
from graphir.model.hparams import HParams, Key
from graphir.model.presets import Preset
from graphir.model.scales import layer_scales
from graphir.model.tensors import TensorDecl, TensorSpec, spec, swiglu_tensors, tensor_name

L, A = Keys.LLM, Keys.Attention

_BIASED = (T.TIME_MIX_RECEPTANCE, T.TIME_MIX_KEY, T.TIME_MIX_VALUE)  # Qwen's Q, K and V biases, where the file has them


class Rwkv6Qwen2(Architecture):
    name = "rwkv6qwen2"
    required_keys = (L.FEED_FORWARD_LENGTH,)
    keys = (Key("wkv_head_size", Keys.WKV.HEAD_SIZE, int, required=True, minimum=1),
            Key("time_mix_extra_dim", L.TIME_MIX_EXTRA_DIM, int, required=True, minimum=1),
            Key("time_decay_extra_dim", L.TIME_DECAY_EXTRA_DIM, int, required=True, minimum=1),
            Key("token_shift_count", L.TOKEN_SHIFT_COUNT, int, 2))  # llama_hparams::token_shift_count

    def __init__(self, hp: HParams):
        if hp.token_shift_count != 1:  # llama.cpp asserts n_embd == n_embd_r
            raise MetadataError(f"rwkv6qwen2 keeps one token shift: {L.TOKEN_SHIFT_COUNT.format(arch=self.name)} "
                                f"must be 1, got {hp.token_shift_count}")
        if hp.n_embd % hp.wkv_head_size:
            raise MetadataError(f"rwkv6qwen2 needs {Keys.WKV.HEAD_SIZE.format(arch=self.name)} to divide n_embd "
                                f"{hp.n_embd}, got {hp.wkv_head_size}")
        n_head = hp.n_embd // hp.wkv_head_size
        for il in range(hp.n_layer):
            if hp.head_count_kv(il) and n_head % hp.head_count_kv(il):
                raise MetadataError(f"rwkv6qwen2's {n_head} heads do not split into "
                                    f"{A.HEAD_COUNT_KV.format(arch=self.name)} = {hp.head_count_kv(il)} groups")
        super().__init__(hp)

    @property
    def n_embd_r(self) -> int:
        """Per sequence and layer, the token shift: the last token's normed input to the time mix."""
        return self.hp.n_embd

    @property
    def n_embd_s(self) -> int:
        """Per sequence and layer, one head_size x head_size state per head."""
        return self.hp.n_embd * self.hp.wkv_head_size

    def layers(self) -> LayerNeeds:
        return (Recurrent(self.n_embd_r, self.n_embd_s),) * self.hp.n_layer

    def kv_width(self, il: int) -> int:
        """The width of k and v: one head_size per key/value head, or n_embd (llama.cpp's attn_key_value_size)."""
        hp = self.hp
        n_kv = hp.head_count_kv(il)
        return hp.n_embd if n_kv in (0, hp.n_embd // hp.wkv_head_size) else n_kv * hp.wkv_head_size

    def tensors(self) -> list[TensorSpec]:
        hp = self.hp
        E, V, F, hs = hp.n_embd, hp.n_vocab, hp.n_ff, hp.wkv_head_size
        specs = [spec(T.TOKEN_EMBD, (E, V)),
                 spec(T.OUTPUT_NORM, (E,), kind="vector"),
                 spec(T.OUTPUT_NORM, (E,), suffix="bias", kind="vector", optional=True),
                 spec(T.OUTPUT, (E, V))]
        for il in range(hp.n_layer):
            kv = self.kv_width(il)
            layer = [spec(T.ATTN_NORM, (E,), il, kind="vector"),
                     *mix_and_decay_tensors(hp, il),
                     spec(T.TIME_MIX_FIRST, (hs, E // hs), il, optional=True),  # refused when present (module doc)
                     spec(T.TIME_MIX_KEY, (E, kv), il),
                     spec(T.TIME_MIX_VALUE, (E, kv), il),
                     spec(T.TIME_MIX_RECEPTANCE, (E, E), il),
                     spec(T.TIME_MIX_GATE, (E, E), il),
                     *(spec(t, (kv if t in (T.TIME_MIX_KEY, T.TIME_MIX_VALUE) else E,), il, "bias", kind="vector",
                            optional=True) for t in _BIASED),
                     spec(T.TIME_MIX_OUTPUT, (E, E), il),
                     spec(T.FFN_NORM, (E,), il, kind="vector"),
                     *swiglu_tensors(E, F, il)]
            specs += layer + layer_scales(layer, il)
        return specs

    def check(self, tensors: Mapping[str, TensorDecl]) -> list[str]:
        first = [n for il in range(self.hp.n_layer) if (n := tensor_name(T.TIME_MIX_FIRST, il)) in tensors]
        return super().check(tensors) + [
            f"tensor '{n}': rwkv6qwen2 with RWKV6's time_first reads time_mix_ln, which llama.cpp's loader never "
            f"creates for this architecture (its graph would read a missing tensor)" for n in first[:1]]

    def time_mix(self, b: GraphBuilder, x: Node, x_prev: Node, il: int) -> Node:
        """RWKV6's mixes and decay into gated linear attention (llama.cpp's build_rwkv6_time_mix, QRWKV's path)."""
        hp = self.hp
        E, hs, n_tok = hp.n_embd, hp.wkv_head_size, b.n_tokens
        H, n_kv = E // hs, hp.head_count_kv(il)
        xw, xk, xv, xr, xg = token_shift_mixes(b, x, x_prev, il)
        r, k, v = (b.linear(x_, b.w(t, il), b.w_opt(t, il, "bias"), name=tag)
                   for x_, t, tag in ((xr, T.TIME_MIX_RECEPTANCE, "tm_r"), (xk, T.TIME_MIX_KEY, "tm_k"),
                                      (xv, T.TIME_MIX_VALUE, "tm_v")))
        g = b.op("sigmoid", b.op("mul_mat", b.w(T.TIME_MIX_GATE, il), xg, name="tm_g"), name="tm_g.sigmoid")
        if n_kv not in (0, H):  # each key/value head repeated for its group of heads
            k, v = (b.op("repeat", b.reshape(t, (hs, 1, n_kv, n_tok), name=f"{tag}.kv_heads"),
                         shape=(hs, H // n_kv, n_kv, n_tok), name=f"{tag}.repeated")
                    for tag, t in (("tm_k", k), ("tm_v", v)))
        k, v, r = (b.reshape(t, (hs, H, n_tok), name=f"{tag}.heads")
                   for tag, t in (("tm_k", k), ("tm_v", v), ("tm_r", r)))
        w = decay(b, xw, il)
        k = b.op("sub", k, b.op("mul", k, w, name="tm_k.decayed"), name="tm_k.kept")  # k (1 - w)
        out = b.op("gated_linear_attn", k, v, r, w, b.build_rs("s"), scale=float(hs ** -0.5), name="gla")
        ssm.store_states(b, out, E * n_tok, self.n_embd_s, name="gla_state.new")
        o = b.op("view", out, shape=(E, n_tok), strides=(1, E), offset=0, name="gla_out")
        o = b.op("mul", o, g, name="tm_gated")
        return b.op("mul_mat", b.w(T.TIME_MIX_OUTPUT, il), o, name="tm_out")

    def build(self, b: GraphBuilder) -> None:
        hp = self.hp
        E, Ts, S, n_tok = hp.n_embd, b.n_seq_tokens, b.n_seqs, b.n_tokens
        assert Ts is not None
        x = b.build_inp_embd(b.w(T.TOKEN_EMBD))
        for il in b.layers():
            x = b.reshape(x, (E, Ts, S), name="inp.seqs")
            shift = b.reshape(b.build_rs("r"), (E, 1, S), name="shift")
            a = b.norm(x, T.ATTN_NORM, il, name="attn_norm")
            tm = b.reshape(self.time_mix(b, a, shifted(b, shift, a, "attn_prev"), il), (E, Ts, S), name="tm_out.seqs")
            # the n_seqs rows that follow the first sequence's last token (module doc)
            b.store_rs("r", b.op("view", a, shape=(E, S), strides=(1, E), offset=(Ts - 1) * E, name="shift.new"))
            ffn_inp = b.reshape(b.op("add", tm, x, name="ffn_inp"), (E, n_tok), name="ffn_inp.tokens")
            (ffn_inp,) = b.last_layer_rows((ffn_inp, "ffn_inp.rows"))
            f = b.norm(ffn_inp, T.FFN_NORM, il, name="ffn_norm")
            f = b.build_ffn(f, up=b.w(T.FFN_UP, il), gate=b.w(T.FFN_GATE, il), down=b.w(T.FFN_DOWN, il))
            x = b.op("add", f, ffn_inp, name="l_out")
        x = b.norm(x, T.OUTPUT_NORM, name="result_norm")
        b.build_output(x, b.w(T.OUTPUT))


# ---- presets: released models of this family, as their converted GGUFs declare them ---------------------

# the low-rank mixes and decays the converter keeps F32 (RWKV6's); Qwen's Q/K/V biases on r, k and v
QRWKV_F32 = r"blk\.\d+\.time_mix_(w1|w2|decay_w1|decay_w2)\.weight"
QRWKV_BIASES = r"blk\.\d+\.time_mix_(key|value|receptance)\.bias"

presets.register({
    "QRWKV6-32B": Preset("rwkv6qwen2", {
        L.CONTEXT_LENGTH: 1048576, L.EMBEDDING_LENGTH: 5120, L.BLOCK_COUNT: 64, L.FEED_FORWARD_LENGTH: 27648,
        A.HEAD_COUNT: 0, A.HEAD_COUNT_KV: 8, Keys.WKV.HEAD_SIZE: 128, L.TIME_MIX_EXTRA_DIM: 64,
        L.TIME_DECAY_EXTRA_DIM: 128, L.TOKEN_SHIFT_COUNT: 1, A.LAYERNORM_RMS_EPS: 1e-6, L.VOCAB_SIZE: 152064,
    }, tied=False, include=QRWKV_BIASES, f32=QRWKV_F32, squeezed=SQUEEZED,
        source="recursal/QRWKV6-32B-Instruct-Preview-v0.1 config.json (Qwen2.5-32B-Instruct's sizes)"),
})


# ---- Hugging Face: the keys convert_hf_to_gguf writes for RWKV6Qwen2ForCausalLM ---------------------------------

def _head_size(c: Config) -> int:
    return c.find("hidden_size") // c.find("num_attention_heads")


RWKV6QWEN2: tuple[Rule, ...] = (
    fixed(L.CONTEXT_LENGTH, 1 << 20),  # RWKV is not context-limited
    hf(L.EMBEDDING_LENGTH, "hidden_size"),
    hf(L.BLOCK_COUNT, *BLOCKS),
    derived(Keys.WKV.HEAD_SIZE, _head_size),
    derived(L.TIME_MIX_EXTRA_DIM, lambda c: c.find("lora_rank_tokenshift", default=None)
            or (64 if c.find("hidden_size") >= 4096 else 32)),
    derived(L.TIME_DECAY_EXTRA_DIM, lambda c: c.find("lora_rank_decay", default=None)
            or (128 if c.find("hidden_size") >= 4096 else 64)),
    hf(L.FEED_FORWARD_LENGTH, "intermediate_size"),
    hf(A.LAYERNORM_RMS_EPS, "rms_norm_eps", kind="number"),
    fixed(L.TOKEN_SHIFT_COUNT, 1),
    hf(A.HEAD_COUNT_KV, "num_key_value_heads"),
    fixed(A.HEAD_COUNT, 0),  # required by llama.cpp, unused
    VOCAB,
)

hf_config.register(Family("rwkv6qwen2", RWKV6QWEN2, {"tie_word_embeddings": False}, include=lambda c: QRWKV_BIASES,
                          squeezed=SQUEEZED), "RWKV6Qwen2ForCausalLM")
