"""RWKV-7 ("Goose") and ARWKV-7: a time mix whose state matrix is updated by a generalised delta rule
(``rwkv_wkv7``: S = S diag(w) + (S a) b^T + v k^T per head, a = -kk, b = kk * iclr, kk the L2-normed key), with
low-rank decay, in-context learning rate, gate and value-residual projections. The value residual crosses layers:
layer 0's value ``v_first`` is mixed into every later layer's value, a node of the ubatch's graph flowing down the
stack (nothing of it is kept between ubatches).

``rwkv7``: LayerNorms, a squared-ReLU channel mix fed by its own token shift (two shifts per layer, as RWKV6).
``arwkv7``: the time mix inside a Qwen2.5-style stack: RMS norms, a SwiGLU FFN, one token shift per layer, the
gate and the per-head norm optional. Per sequence the recurrent memory keeps the last token's normed activations
(``r``) and one head_size x head_size state per head (``s``). Reference: Peng et al. 2025, "RWKV-7 Goose";
llama.cpp src/models/rwkv7-base.cpp, rwkv7.cpp, arwkv7.cpp.
"""

from __future__ import annotations

from dataclasses import dataclass

from gguf import MODEL_TENSOR as T
from gguf import Keys

from graphir.arch.rwkv import check_wkv, shifted, wkv_state
from graphir.graph.ir import Node
from graphir.memory.layers import LayerNeeds
from graphir.model import hf_config, presets, ssm
from graphir.model.architecture import Architecture
from graphir.model.builder import GraphBuilder, Norm
from graphir.model.hf_config import BLOCKS, VOCAB, Config, Family, Rule, derived, fixed, hf
from graphir.model.hparams import HParams, Key
from graphir.model.prenorm import synthetic
from graphir.model.presets import Preset
from graphir.model.tensors import TensorSpec, scales, spec, swiglu_tensors, with_bias

L, A = Keys.LLM, Keys.Attention

# the checkpoints' channel-mix lerp is 1-D, and so the converter writes it (llama.cpp reads it as [n_embd, 1, 1])
SQUEEZED = r"blk\.\d+\.channel_mix_lerp_k\.weight"
DECAY_SCALE = -0.606531  # w = exp(-e^-0.5 sigmoid(.)): each step keeps between e^-0.61 and 1 of the state
KK_EPS = 1e-12  # the L2 norm of the removal key
GROUP_NORM_EPS = 64e-5  # the per-head norm of the WKV output


@dataclass(frozen=True)
class Form:
    """What ARWKV-7's file changes of RWKV-7's graph, each a few lines of llama.cpp's arwkv7.cpp."""

    hybrid: bool = False  # the time mix in a Qwen2.5 stack: RMS norms, a SwiGLU FFN, no norm of the embeddings
    token_shifts: int = 2  # shifts a layer keeps (the required token_shift_count): time and channel mix, or time mix


RWKV7_FORM, ARWKV7_FORM = Form(), Form(hybrid=True, token_shifts=1)


class Rwkv7(Architecture):
    """RWKV-7 as llama.cpp's src/models/rwkv7.cpp builds it, over the time mix of its rwkv7-base.cpp; ARWKV-7 below
    is data over the same build."""

    name = "rwkv7"
    form = RWKV7_FORM
    required_keys = (L.FEED_FORWARD_LENGTH,)
    keys = (Key("wkv_head_size", Keys.WKV.HEAD_SIZE, int, required=True, minimum=1),
            Key("decay_lora_rank", A.DECAY_LORA_RANK, int, required=True, minimum=1),
            Key("iclr_lora_rank", A.ICLR_LORA_RANK, int, required=True, minimum=1),
            Key("value_residual_mix_lora_rank", A.VALUE_RESIDUAL_MIX_LORA_RANK, int, required=True, minimum=1),
            Key("gate_lora_rank", A.GATE_LORA_RANK, int, 0, minimum=0),
            Key("token_shift_count", L.TOKEN_SHIFT_COUNT, int, 2))  # llama_hparams::token_shift_count

    def __init__(self, hp: HParams):
        check_wkv(self.name, hp, self.form.token_shifts)  # llama.cpp's graphs assert the shifts
        super().__init__(hp)

    def layers(self) -> LayerNeeds:
        return (wkv_state(self.hp),) * self.hp.n_layer

    def time_mix_tensors(self, il: int) -> list[TensorSpec]:
        """Layer il's time mix; ARWKV-7's gate projections and per-head norm may be missing, its fused lerp then
        of 5 mixes instead of 6 (its loader)."""
        hp, gate_optional = self.hp, self.form.hybrid
        E, Rw, Ra, Rg = hp.n_embd, hp.decay_lora_rank, hp.iclr_lora_rank, hp.gate_lora_rank
        Rv = Ra if il == 0 else hp.value_residual_mix_lora_rank  # layer 0's are loaded, never read
        vector = dict(kind="vector")
        return [
            spec(T.TIME_MIX_W0, (E,), il, **vector),
            spec(T.TIME_MIX_W1, (E, Rw), il),
            spec(T.TIME_MIX_W2, (Rw, E), il),
            spec(T.TIME_MIX_A0, (E,), il, **vector),
            spec(T.TIME_MIX_A1, (E, Ra), il),
            spec(T.TIME_MIX_A2, (Ra, E), il),
            spec(T.TIME_MIX_V0, (E,), il, **vector),
            spec(T.TIME_MIX_V1, (E, Rv), il),
            spec(T.TIME_MIX_V2, (Rv, E), il),
            spec(T.TIME_MIX_G1, (E, Rg), il, optional=gate_optional),
            spec(T.TIME_MIX_G2, (Rg, E), il, optional=gate_optional),
            spec(T.TIME_MIX_LERP_FUSED, (E, 1, 1, 6), il, kind="vector",
                 also=(E, 1, 1, 5) if gate_optional else None),
            spec(T.TIME_MIX_K_K, (E,), il, **vector),
            spec(T.TIME_MIX_K_A, (E,), il, **vector),
            spec(T.TIME_MIX_R_K, (E,), il, **vector),
            spec(T.TIME_MIX_KEY, (E, E), il),
            spec(T.TIME_MIX_VALUE, (E, E), il),
            spec(T.TIME_MIX_RECEPTANCE, (E, E), il),
            spec(T.TIME_MIX_LN, (E,), il, kind="vector", optional=gate_optional),
            spec(T.TIME_MIX_LN, (E,), il, "bias", kind="vector", optional=gate_optional),
            spec(T.TIME_MIX_OUTPUT, (E, E), il),
        ]

    def last_token(self, b: GraphBuilder, x: Node, name: str) -> Node:
        """Each sequence's last token of x [E, Ts, S]: what the next ubatch's shift reads."""
        E, Ts, S = self.hp.n_embd, b.n_seq_tokens, b.n_seqs
        assert Ts is not None
        return b.op("view", x, shape=(E, 1, S), strides=(1, E, E * Ts), offset=(Ts - 1) * E, name=name)

    def lora(self, b: GraphBuilder, x: Node, down: T, up: T, il: int, tag: str, act: str | None = None) -> Node:
        """up @ act(down @ x): one of the time mix's low-rank projections."""
        h = b.op("mul_mat", b.w(down, il), x, name=f"{tag}1")
        if act is not None:
            h = b.op(act, h, name=f"{tag}1.{act}")
        return b.op("mul_mat", b.w(up, il), h, name=f"{tag}2")

    def time_mix(self, b: GraphBuilder, cur: Node, x_prev: Node, v_first: Node | None,
                 il: int) -> tuple[Node, Node]:
        """The time mix of cur [E, Ts, S] and its shifted x_prev: its output [E, Ts, S], and the value
        residual (layer 0's value, which the later layers mix into theirs)."""
        hp = self.hp
        E, hs, n_tok, Ts, S = hp.n_embd, hp.wkv_head_size, b.n_tokens, b.n_seq_tokens, b.n_seqs
        assert Ts is not None
        H = E // hs
        g1, g2 = b.w_opt(T.TIME_MIX_G1, il), b.w_opt(T.TIME_MIX_G2, il)
        gated = g1 is not None and g2 is not None
        mixes = 6 if gated else 5
        sx = b.op("sub", x_prev, cur, name="tm_sx")
        sx = b.op("repeat", sx, shape=(E, Ts, S, mixes), name="tm_sx.mixes")
        xxx = b.op("add", b.op("mul", sx, b.w(T.TIME_MIX_LERP_FUSED, il), name="tm_lerp"), cur, name="tm_mixed")
        xr, xw, xk, xv, xa, *xg = (b.op("view", xxx, shape=(E, n_tok), strides=(1, E), offset=j * E * n_tok,
                                        name=f"tm_x{tag}") for j, tag in enumerate("rwkvag"[:mixes]))
        r = b.op("mul_mat", b.w(T.TIME_MIX_RECEPTANCE, il), xr, name="tm_r")
        w = b.op("add", self.lora(b, xw, T.TIME_MIX_W1, T.TIME_MIX_W2, il, "tm_w", "tanh"), b.w(T.TIME_MIX_W0, il),
                 name="tm_w")
        w = b.op("exp", b.op("scale", b.op("sigmoid", w, name="tm_w.sigmoid"), s=DECAY_SCALE, name="tm_w.scaled"),
                 name="tm_decay")
        k = b.op("mul_mat", b.w(T.TIME_MIX_KEY, il), xk, name="tm_k")
        v = b.op("mul_mat", b.w(T.TIME_MIX_VALUE, il), xv, name="tm_v")
        if v_first is None:
            v_first = v
        else:  # the value residual: v + (v_first - v) * sigmoid(v0 + v2 @ v1 @ xv)
            mix = b.op("sigmoid", b.op("add", self.lora(b, xv, T.TIME_MIX_V1, T.TIME_MIX_V2, il, "tm_v"),
                                       b.w(T.TIME_MIX_V0, il), name="tm_v.mix"), name="tm_v.mix.sigmoid")
            v = b.op("add", v, b.op("mul", b.op("sub", v_first, v, name="tm_v.first"), mix, name="tm_v.residual"),
                     name="tm_v.mixed")
        g = self.lora(b, xg[0], T.TIME_MIX_G1, T.TIME_MIX_G2, il, "tm_g", "sigmoid") if gated else None
        a = b.op("sigmoid", b.op("add", self.lora(b, xa, T.TIME_MIX_A1, T.TIME_MIX_A2, il, "tm_a"),
                                 b.w(T.TIME_MIX_A0, il), name="tm_a"), name="tm_a.sigmoid")
        kk = b.reshape(b.op("mul", k, b.w(T.TIME_MIX_K_K, il), name="tm_kk"), (hs, H, n_tok), name="tm_kk.heads")
        kk = b.op("l2_norm", kk, eps=KK_EPS, name="tm_kk.normed")
        ka = b.op("mul", k, b.w(T.TIME_MIX_K_A, il), name="tm_ka")
        k = b.op("add", k, b.op("sub", b.op("mul", a, ka, name="tm_ka.a"), ka, name="tm_ka.delta"), name="tm_k.mixed")
        r, w, k, v, a = (b.reshape(t, (hs, H, n_tok), name=f"{tag}.heads")
                         for tag, t in (("tm_r", r), ("tm_decay", w), ("tm_k", k), ("tm_v", v), ("tm_a", a)))
        state = b.build_rs("s")
        out = b.op("rwkv_wkv7", r, w, k, v, b.op("neg", kk, name="tm_kk.neg"),
                   b.op("mul", kk, a, name="tm_kk.a"), state, name="wkv")
        o = b.op("view", out, shape=(E * n_tok,), strides=(1,), offset=0, name="wkv_out")
        n_embd_s = wkv_state(hp).n_embd_s
        flat = b.op("view", out, shape=(n_embd_s * S,), strides=(1,), offset=E * n_tok, name="wkv_state")
        b.store_rs("s", b.reshape(flat, (n_embd_s, S), name="wkv_state.rows"))
        ln = b.w_opt(T.TIME_MIX_LN, il)
        ln_b = b.w_opt(T.TIME_MIX_LN, il, "bias")
        if ln is not None and ln_b is not None:  # a norm per head
            o = b.op("norm", b.reshape(o, (hs, H, n_tok), name="wkv_out.heads"), eps=GROUP_NORM_EPS,
                     name="wkv_out.norm")
            o = b.reshape(o, (E, n_tok), name="wkv_out.tokens")
            o = b.op("add", b.op("mul", o, ln, name="tm_ln.w"), ln_b, name="tm_ln")
        else:
            o = b.reshape(o, (E, n_tok), name="wkv_out.tokens")
        r_k = b.reshape(b.w(T.TIME_MIX_R_K, il), (hs, H), name="tm_r_k.heads")
        rk = b.op("sum_rows", b.op("mul", b.op("mul", k, r, name="tm_kr"), r_k, name="tm_kr.r_k"), name="tm_rk")
        o = b.op("add", o, b.reshape(b.op("mul", v, rk, name="tm_v.rk"), (E, n_tok), name="tm_v.rk.tokens"),
                 name="tm_bonus")
        if g is not None:
            o = b.op("mul", o, g, name="tm_gated")
        o = b.op("mul_mat", b.w(T.TIME_MIX_OUTPUT, il), o, name="tm_out")
        return b.reshape(o, (E, Ts, S), name="tm_out.seqs"), v_first


    def tensors(self) -> list[TensorSpec]:
        hp, hybrid = self.hp, self.form.hybrid
        E, V, F = hp.n_embd, hp.n_vocab, hp.n_ff
        # RWKV-7's LayerNorms have biases and it norms the embeddings; ARWKV-7's RMS norms do neither
        specs = [spec(T.TOKEN_EMBD, (E, V)), *(() if hybrid else with_bias(T.TOKEN_EMBD_NORM, (E,))),
                 *([spec(T.OUTPUT_NORM, (E,), kind="vector")] if hybrid else with_bias(T.OUTPUT_NORM, (E,))),
                 spec(T.OUTPUT, (E, V))]
        for il in range(hp.n_layer):
            if hybrid:
                specs += [
                    spec(T.ATTN_NORM, (E,), il, kind="vector"),
                    *self.time_mix_tensors(il),
                    spec(T.FFN_NORM, (E,), il, kind="vector"),
                    *swiglu_tensors(E, F, il),
                    # the loader takes the FFN's per-tensor scales; the graph reads none (llama.cpp's passes none)
                    *(s for t in (T.FFN_GATE, T.FFN_DOWN, T.FFN_UP) for s in scales(t, il)),
                ]
            else:
                specs += [
                    *with_bias(T.ATTN_NORM, (E,), il),
                    *with_bias(T.ATTN_NORM_2, (E,), il),
                    *self.time_mix_tensors(il),
                    spec(T.CHANNEL_MIX_LERP_K, (E, 1, 1), il, kind="vector"),
                    spec(T.CHANNEL_MIX_KEY, (E, F), il),
                    spec(T.CHANNEL_MIX_VALUE, (F, E), il),
                ]
        return specs

    def channel_mix(self, b: GraphBuilder, x: Node, x_prev: Node, il: int) -> Node:
        sx = b.op("sub", x_prev, x, name="cm_sx")
        xk = b.op("add", b.op("mul", sx, b.w(T.CHANNEL_MIX_LERP_K, il), name="cm_lerp_k"), x, name="cm_xk")
        k = b.op("sqr", b.op("relu", b.op("mul_mat", b.w(T.CHANNEL_MIX_KEY, il), xk, name="cm_k"), name="cm_k.relu"),
                 name="cm_k.sqr")
        return b.op("mul_mat", b.w(T.CHANNEL_MIX_VALUE, il), k, name="cm_out")

    def rwkv_layer(self, b: GraphBuilder, x: Node, shift: Node, v_first: Node | None,
                   il: int) -> tuple[Node, Node]:
        """RWKV-7's layer over x [E, Ts, S] and its two saved shifts [E, 2, S]: the time mix, then the channel
        mix, each fed its normed input's predecessors. Returns the layer's output and the value residual."""
        E, S, n_tok = self.hp.n_embd, b.n_seqs, b.n_tokens
        att_shift = b.op("view", shift, shape=(E, 1, S), strides=(1, E, 2 * E), offset=0, name="shift.att")
        ffn_shift = b.op("view", shift, shape=(E, 1, S), strides=(1, E, 2 * E), offset=E, name="shift.ffn")
        a = b.norm(x, T.ATTN_NORM, il, Norm.LAYER, name="attn_norm")
        tm, v_first = self.time_mix(b, a, shifted(b, att_shift, a, "attn_prev"), v_first, il)
        ffn_inp = b.op("add", tm, x, name="ffn_inp")
        f = b.norm(ffn_inp, T.ATTN_NORM_2, il, Norm.LAYER, name="ffn_norm")
        f_prev = shifted(b, ffn_shift, f, "ffn_prev")
        new_shift = b.op("concat", self.last_token(b, a, "attn_norm.last"), self.last_token(b, f, "ffn_norm.last"),
                         dim=1, name="shift.new")
        b.store_rs("r", b.reshape(new_shift, (wkv_state(self.hp).n_embd_r, S), name="shift.rows"))
        tags = ("ffn_inp", "ffn_norm", "ffn_prev")
        ffn_inp, f, f_prev = b.last_layer_rows(*((b.reshape(t, (E, n_tok), name=f"{tag}.tokens"), f"{tag}.rows")
                                                 for tag, t in zip(tags, (ffn_inp, f, f_prev))))
        return b.op("add", self.channel_mix(b, f, f_prev, il), ffn_inp, name="l_out"), v_first

    def hybrid_layer(self, b: GraphBuilder, x: Node, shift: Node, v_first: Node | None,
                     il: int) -> tuple[Node, Node]:
        """ARWKV-7's layer over x [E, Ts, S] and its one saved shift [E, 1, S]: the time mix, then a SwiGLU FFN
        (llama.cpp's arwkv7.cpp). Returns the layer's output and the value residual."""
        E, S, n_tok = self.hp.n_embd, b.n_seqs, b.n_tokens
        a = b.norm(x, T.ATTN_NORM, il, Norm.RMS, name="attn_norm")
        tm, v_first = self.time_mix(b, a, shifted(b, shift, a, "attn_prev"), v_first, il)
        b.store_rs("r", b.reshape(self.last_token(b, a, "attn_norm.last"), (wkv_state(self.hp).n_embd_r, S),
                                  name="shift.rows"))
        ffn_inp = b.reshape(b.op("add", tm, x, name="ffn_inp"), (E, n_tok), name="ffn_inp.tokens")
        ffn_inp, = b.last_layer_rows((ffn_inp, "ffn_inp.rows"))
        f = b.norm(ffn_inp, T.FFN_NORM, il, Norm.RMS, name="ffn_norm")
        f = b.build_ffn(f, up=b.w(T.FFN_UP, il), gate=b.w(T.FFN_GATE, il), down=b.w(T.FFN_DOWN, il))
        return b.op("add", f, ffn_inp, name="l_out"), v_first

    def build(self, b: GraphBuilder) -> None:
        E, Ts, S, shifts = self.hp.n_embd, b.n_seq_tokens, b.n_seqs, self.form.token_shifts
        assert Ts is not None
        norm = Norm.RMS if self.form.hybrid else Norm.LAYER
        layer = self.hybrid_layer if self.form.hybrid else self.rwkv_layer
        x = b.build_inp_embd(b.w(T.TOKEN_EMBD))
        if not self.form.hybrid:
            x = b.norm(x, T.TOKEN_EMBD_NORM, None, norm, name="inp_norm")
        v_first: Node | None = None  # layer 0's value, mixed into every later layer's
        for il in b.layers():
            x = b.reshape(x, (E, Ts, S), name="inp.seqs")
            shift = b.reshape(b.build_rs("r"), (E, shifts, S), name="shift")
            x, v_first = layer(b, x, shift, v_first, il)
        x = b.norm(x, T.OUTPUT_NORM, None, norm, name="result_norm")
        b.build_output(x, b.w(T.OUTPUT))


class Arwkv7(Rwkv7):
    """ARWKV-7: RWKV-7's time mix in a Qwen2.5 stack (llama.cpp's arwkv7.cpp), as data."""

    name = "arwkv7"
    form = ARWKV7_FORM


# ---- presets: released models, as their converted GGUFs declare them ------------------------------------


def _rwkv7(n_layer: int, n_embd: int, ranks: tuple[int, int, int, int], source: str) -> Preset:
    """A released RWKV-7 World model: head size 64, channel mix 4x wide, its four LoRA ranks (decay, in-context
    learning rate, value residual, gate), the converter's context of 2^20 and head count 0."""
    decay, iclr, value, gate = ranks
    return Preset("rwkv7", {
        L.CONTEXT_LENGTH: 1048576, L.EMBEDDING_LENGTH: n_embd, L.BLOCK_COUNT: n_layer,
        L.FEED_FORWARD_LENGTH: 4 * n_embd, A.HEAD_COUNT: 0, Keys.WKV.HEAD_SIZE: 64, A.LAYERNORM_EPS: 1e-5,
        A.DECAY_LORA_RANK: decay, A.ICLR_LORA_RANK: iclr, A.VALUE_RESIDUAL_MIX_LORA_RANK: value,
        A.GATE_LORA_RANK: gate, L.VOCAB_SIZE: 65536,
    }, tied=False, f32=r"blk\.\d+\.time_mix_w[12]\.weight", squeezed=SQUEEZED, source=source)


presets.register({
    "RWKV7-World-0.1B": _rwkv7(12, 768, (64, 64, 32, 128), "fla-hub/rwkv7-0.1B-world config.json"),
    "RWKV7-World-1.5B": _rwkv7(24, 2048, (96, 96, 64, 256), "fla-hub/rwkv7-1.5B-world config.json"),
    # ARWKV-7B's public config is not known here for certain: arwkv7's golden graphs come from a tiny header (6
    # layers, so that the dump folds the middle ones; heads of 64, RWKV7-World-0.1B's ranks, the gate and the per-head
    # norm present)
    "ARWKV7-tiny": synthetic("arwkv7", "a synthetic header of tiny sizes",
                             include=r"blk\.\d+\.time_mix_(g1|g2|ln)\.(weight|bias)",
                             keys={L.BLOCK_COUNT: 6, Keys.WKV.HEAD_SIZE: 64, L.TOKEN_SHIFT_COUNT: 1,
                                   A.DECAY_LORA_RANK: 64, A.ICLR_LORA_RANK: 64, A.VALUE_RESIDUAL_MIX_LORA_RANK: 32,
                                   A.GATE_LORA_RANK: 128}),
})


# ---- Hugging Face: the keys convert_hf_to_gguf writes for RWKV7ForCausalLM ------------------------------------


def _rank(template: str, names: tuple[str, ...], exponent: float, multiplier: float) -> Rule:
    """A LoRA rank from the first of ``names`` the config gives, else the converter's own: hidden_size^exponent *
    multiplier, rounded to a multiple of 32."""
    def rank(c: Config) -> int:
        given = c.find(*names, default=None)
        return given or max(1, round(c.find("hidden_size") ** exponent * multiplier / 32)) * 32
    return derived(template, rank)


RWKV7 = (
    fixed(L.CONTEXT_LENGTH, 1 << 20),  # RWKV is not context-limited
    hf(L.EMBEDDING_LENGTH, "hidden_size"),
    hf(L.BLOCK_COUNT, *BLOCKS),
    hf(A.LAYERNORM_EPS, "layer_norm_epsilon", "norm_eps", kind="number"),
    hf(Keys.WKV.HEAD_SIZE, "head_size", "head_dim"),
    _rank(A.DECAY_LORA_RANK, ("lora_rank_decay", "decay_low_rank_dim"), 0.5, 1.8),
    _rank(A.ICLR_LORA_RANK, ("lora_rank_iclr", "a_low_rank_dim"), 0.5, 1.8),
    _rank(A.VALUE_RESIDUAL_MIX_LORA_RANK, ("lora_rank_value_residual_mix", "v_low_rank_dim"), 0.5, 1.3),
    _rank(A.GATE_LORA_RANK, ("lora_rank_gate", "gate_low_rank_dim"), 0.8, 0.6),
    derived(L.FEED_FORWARD_LENGTH, lambda c: c.find("intermediate_size", default=None) or 4 * c.find("hidden_size")),
    fixed(A.HEAD_COUNT, 0),
    VOCAB,
)

hf_config.register(Family("rwkv7", RWKV7, {"tie_word_embeddings": False}, squeezed=SQUEEZED), "RWKV7ForCausalLM")
