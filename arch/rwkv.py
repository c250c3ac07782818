"""RWKV-6 ("Finch"): attention replaced by a linear recurrence with data-dependent decay (time mix) and a
squared-ReLU channel mix, both fed by "token shift" (each token also sees the previous token's activations).

Per sequence the recurrent memory keeps the last token's two normed activations (``r``: attention and FFN
shift) and one head_size x head_size WKV matrix per head (``s``). Tokens arrive as ``n_seqs`` sequences of
``n_seq_tokens`` each. Reference: Peng et al. 2024, "Eagle and Finch"; llama.cpp src/models/rwkv6*.cpp.
"""

from __future__ import annotations

from gguf import MODEL_TENSOR as T
from gguf import Keys

from graphir.model.architecture import Architecture
from graphir.model.builder import GraphBuilder, Norm
from graphir.errors import MetadataError
from graphir.model.hparams import HParams, Key
from graphir.graph.ir import Node
from graphir.memory.layers import LayerNeeds, Recurrent
from graphir.model import ssm
from graphir.model.tensors import TensorSpec, spec
from graphir.model import presets
from graphir.model.presets import Preset
from graphir.model import hf_config
from graphir.model.hf_config import BLOCKS, VOCAB, Family, Rule, derived, fixed, hf

_MIXES = 5  # w, k, v, r, g: the five token-shift interpolations of the time mix, in this order
# the same five as separate tensors, which llama.cpp's loader takes beside the fused one and its graph reads
# only without it: the fused one is required here, so they are accepted and left unread
_LERPS = (T.TIME_MIX_LERP_W, T.TIME_MIX_LERP_K, T.TIME_MIX_LERP_V, T.TIME_MIX_LERP_R, T.TIME_MIX_LERP_G)

# convert_hf_to_gguf squeezes the token-shift lerps to [n_embd] (llama.cpp reads them as [n_embd, 1, 1]); the
# fused lerp it stacks as [n_embd, 1, 1, 5]
SQUEEZED = r"blk\.\d+\.(time_mix_lerp_x|channel_mix_lerp_[kr])\.weight"

def mix_and_decay_tensors(hp: HParams, il: int) -> list[TensorSpec]:
    """Layer il's token-shift mixes (low-rank, fused) and data-dependent decay, as RWKV6 and QRWKV6 load them."""
    E, Dx, Dd = hp.n_embd, hp.time_mix_extra_dim, hp.time_decay_extra_dim
    return [spec(T.TIME_MIX_W1, (E, Dx * _MIXES), il),
            spec(T.TIME_MIX_W2, (Dx, E, _MIXES), il),
            spec(T.TIME_MIX_LERP_X, (E, 1, 1), il, kind="vector"),
            spec(T.TIME_MIX_LERP_FUSED, (E, 1, 1, _MIXES), il, kind="vector"),
            spec(T.TIME_MIX_DECAY, (E,), il, kind="vector"),
            spec(T.TIME_MIX_DECAY_W1, (E, Dd), il),
            spec(T.TIME_MIX_DECAY_W2, (Dd, E), il)]


def check_wkv(name: str, hp: HParams, token_shifts: int) -> None:
    """The token shifts llama.cpp's RWKV graphs assert, and heads that split n_embd."""
    if hp.token_shift_count != token_shifts:
        raise MetadataError(f"{name} needs {Keys.LLM.TOKEN_SHIFT_COUNT.format(arch=name)} = {token_shifts}, got "
                            f"{hp.token_shift_count}")
    if hp.n_embd % hp.wkv_head_size:
        raise MetadataError(f"{name} needs {Keys.WKV.HEAD_SIZE.format(arch=name)} to divide n_embd {hp.n_embd}, "
                            f"got {hp.wkv_head_size}")


def wkv_state(hp: HParams) -> Recurrent:
    """Per sequence and layer, the token shifts (the last token's normed inputs to the shifted blocks) and one
    head_size x head_size WKV matrix per head."""
    return Recurrent(hp.token_shift_count * hp.n_embd, hp.n_embd * hp.wkv_head_size)


def shifted(b: GraphBuilder, prev: Node, x: Node, name: str) -> Node:
    """Each token's predecessor in x [E, Ts, S]: the saved last token of its sequence, then x without its last."""
    E, Ts, S = x.shape[0], b.n_seq_tokens, b.n_seqs
    assert Ts is not None
    head = b.op("view", x, shape=(E, Ts - 1, S), strides=(1, E, E * Ts), offset=0, name=f"{name}.head")
    return b.op("concat", prev, head, dim=1, name=name)


def token_shift_mixes(b: GraphBuilder, x: Node, x_prev: Node, il: int) -> tuple[Node, ...]:
    """The time mix's five inputs (w, k, v, r, g), each x moved toward its predecessor by a data-dependent
    amount: a low-rank tanh correction to the fused lerps (llama.cpp's build_rwkv6_time_mix)."""
    E, n_tok, Dx = b.hp.n_embd, b.n_tokens, b.hp.time_mix_extra_dim
    sx = b.reshape(b.op("sub", x_prev, x, name="tm_sx"), (E, n_tok), name="tm_sx.tokens")
    x = b.reshape(x, (E, n_tok), name="tm_x.tokens")
    xxx = b.op("add", b.op("mul", sx, b.w(T.TIME_MIX_LERP_X, il), name="tm_lerp_x"), x, name="tm_xxx")
    xxx = b.op("tanh", b.op("mul_mat", b.w(T.TIME_MIX_W1, il), xxx, name="tm_w1"), name="tm_w1.tanh")
    xxx = b.reshape(xxx, (Dx, 1, _MIXES, n_tok), name="tm_w1.mixes")
    xxx = b.op("cont", b.op("permute", xxx, axes=(0, 1, 3, 2), name="tm_w1.perm"), name="tm_w1.cont")
    w2 = b.reshape(b.w(T.TIME_MIX_W2, il), (Dx, E, 1, _MIXES), name="tm_w2.4d")
    xxx = b.op("mul_mat", w2, xxx, name="tm_w2")  # [E, 1, n_tok, 5]
    sx3 = b.reshape(sx, (E, 1, n_tok), name="tm_sx.3d")
    x3 = b.reshape(x, (E, 1, n_tok), name="tm_x.3d")
    xxx = b.op("add", xxx, b.w(T.TIME_MIX_LERP_FUSED, il), name="tm_lerp")
    xxx = b.op("add", b.op("mul", xxx, sx3, name="tm_lerp.sx"), x3, name="tm_mixed")
    return tuple(b.op("view", xxx, shape=(E, n_tok), strides=(1, E), offset=j * E * n_tok, name=f"tm_x{tag}")
                 for j, tag in enumerate("wkvrg"))


def decay(b: GraphBuilder, xw: Node, il: int) -> Node:
    """Each token's decay per head and key channel, exp(-exp(w)) of a low-rank tanh correction to the layer's
    decay: [head_size, n_head, n_tokens]."""
    hs = b.hp.wkv_head_size
    w = b.op("mul_mat", b.w(T.TIME_MIX_DECAY_W2, il),
             b.op("tanh", b.op("mul_mat", b.w(T.TIME_MIX_DECAY_W1, il), xw, name="tm_decay_w1"),
                  name="tm_decay_w1.tanh"), name="tm_decay_w2")
    w = b.op("add", w, b.w(T.TIME_MIX_DECAY, il), name="tm_decay")
    w = b.op("exp", b.op("neg", b.op("exp", w, name="tm_decay.exp"), name="tm_decay.neg"), name="tm_decay.w")
    return b.reshape(w, (hs, b.hp.n_embd // hs, b.n_tokens), name="tm_decay.heads")


class Rwkv6(Architecture):
    name = "rwkv6"
    required_keys = (Keys.Attention.LAYERNORM_EPS, Keys.LLM.FEED_FORWARD_LENGTH)
    keys = (Key("wkv_head_size", Keys.WKV.HEAD_SIZE, int, required=True, minimum=1),
            Key("time_mix_extra_dim", Keys.LLM.TIME_MIX_EXTRA_DIM, int, required=True, minimum=1),  # low-rank mixes
            Key("time_decay_extra_dim", Keys.LLM.TIME_DECAY_EXTRA_DIM, int, required=True, minimum=1),
            Key("rescale_every_n_layers", Keys.LLM.RESCALE_EVERY_N_LAYERS, int, 0, minimum=0),  # residual halving
            Key("token_shift_count", Keys.LLM.TOKEN_SHIFT_COUNT, int, 2))  # llama_hparams::token_shift_count

    def __init__(self, hp: HParams):
        check_wkv(self.name, hp, token_shifts=2)
        super().__init__(hp)

    @property
    def n_embd_r(self) -> int:
        return wkv_state(self.hp).n_embd_r

    @property
    def n_embd_s(self) -> int:
        return wkv_state(self.hp).n_embd_s

    def layers(self) -> LayerNeeds:
        return (wkv_state(self.hp),) * self.hp.n_layer

    def tensors(self) -> list[TensorSpec]:
        hp = self.hp
        E, V, F, hs = hp.n_embd, hp.n_vocab, hp.n_ff, hp.wkv_head_size
        specs = [
            spec(T.TOKEN_EMBD, (E, V)),
            spec(T.TOKEN_EMBD_NORM, (E,), kind="vector"),
            spec(T.TOKEN_EMBD_NORM, (E,), suffix="bias", kind="vector"),
            spec(T.OUTPUT_NORM, (E,), kind="vector"),
            spec(T.OUTPUT_NORM, (E,), suffix="bias", kind="vector"),
            spec(T.OUTPUT, (E, V)),
        ]
        for il in range(hp.n_layer):
            specs += [
                spec(T.ATTN_NORM, (E,), il, kind="vector"),
                spec(T.ATTN_NORM, (E,), il, "bias", kind="vector"),
                spec(T.ATTN_NORM_2, (E,), il, kind="vector"),
                spec(T.ATTN_NORM_2, (E,), il, "bias", kind="vector"),
                *mix_and_decay_tensors(hp, il),
                *(spec(t, (E, 1, 1), il, kind="vector", optional=True) for t in _LERPS),
                spec(T.TIME_MIX_FIRST, (hs, E // hs), il),
                spec(T.TIME_MIX_KEY, (E, E), il),
                spec(T.TIME_MIX_VALUE, (E, E), il),
                spec(T.TIME_MIX_RECEPTANCE, (E, E), il),
                spec(T.TIME_MIX_GATE, (E, E), il),
                spec(T.TIME_MIX_LN, (E,), il, kind="vector"),
                spec(T.TIME_MIX_LN, (E,), il, "bias", kind="vector"),
                spec(T.TIME_MIX_OUTPUT, (E, E), il),
                spec(T.CHANNEL_MIX_LERP_K, (E, 1, 1), il, kind="vector"),
                spec(T.CHANNEL_MIX_LERP_R, (E, 1, 1), il, kind="vector"),
                spec(T.CHANNEL_MIX_KEY, (E, F), il),
                spec(T.CHANNEL_MIX_VALUE, (F, E), il),
                spec(T.CHANNEL_MIX_RECEPTANCE, (E, E), il),
            ]
        return specs

    def time_mix(self, b: GraphBuilder, x: Node, x_prev: Node, il: int) -> Node:
        hp = self.hp
        E, hs, n_tok = hp.n_embd, hp.wkv_head_size, b.n_tokens
        H = E // hs
        xw, xk, xv, xr, xg = token_shift_mixes(b, x, x_prev, il)
        r = b.op("mul_mat", b.w(T.TIME_MIX_RECEPTANCE, il), xr, name="tm_r")
        k = b.op("mul_mat", b.w(T.TIME_MIX_KEY, il), xk, name="tm_k")
        v = b.op("mul_mat", b.w(T.TIME_MIX_VALUE, il), xv, name="tm_v")
        g = b.op("silu", b.op("mul_mat", b.w(T.TIME_MIX_GATE, il), xg, name="tm_g"), name="tm_g.silu")
        k, v, r = (b.reshape(t, (hs, H, n_tok), name=f"{tag}.heads") for tag, t in (("tm_k", k), ("tm_v", v), ("tm_r", r)))
        w = decay(b, xw, il)

        state = b.build_rs("s")
        out = b.op("rwkv_wkv6", k, v, r, b.w(T.TIME_MIX_FIRST, il), w, state, name="wkv")
        ssm.store_states(b, out, E * n_tok, self.n_embd_s, name="wkv_state.new")
        o = b.op("view", out, shape=(hs, H, n_tok), strides=(1, hs, E), offset=0, name="wkv_out")
        o = b.op("norm", b.op("cont", o, name="wkv_out.cont"), eps=64e-5, name="wkv_out.norm")  # per head
        o = b.reshape(o, (E, n_tok), name="wkv_out.tokens")
        o = b.op("add", b.op("mul", o, b.w(T.TIME_MIX_LN, il), name="tm_ln.w"), b.w(T.TIME_MIX_LN, il, "bias"),
                 name="tm_ln")
        o = b.op("mul", o, g, name="tm_gated")
        return b.op("mul_mat", b.w(T.TIME_MIX_OUTPUT, il), o, name="tm_out")

    def channel_mix(self, b: GraphBuilder, x: Node, x_prev: Node, il: int) -> Node:
        sx = b.op("sub", x_prev, x, name="cm_sx")
        xk = b.op("add", b.op("mul", sx, b.w(T.CHANNEL_MIX_LERP_K, il), name="cm_lerp_k"), x, name="cm_xk")
        xr = b.op("add", b.op("mul", sx, b.w(T.CHANNEL_MIX_LERP_R, il), name="cm_lerp_r"), x, name="cm_xr")
        r = b.op("sigmoid", b.op("mul_mat", b.w(T.CHANNEL_MIX_RECEPTANCE, il), xr, name="cm_r"), name="cm_r.sigmoid")
        k = b.op("sqr", b.op("relu", b.op("mul_mat", b.w(T.CHANNEL_MIX_KEY, il), xk, name="cm_k"), name="cm_k.relu"),
                 name="cm_k.sqr")
        return b.op("mul", r, b.op("mul_mat", b.w(T.CHANNEL_MIX_VALUE, il), k, name="cm_v"), name="cm_out")

    def build(self, b: GraphBuilder) -> None:
        hp = self.hp
        E, Ts, S, n_tok = hp.n_embd, b.n_seq_tokens, b.n_seqs, b.n_tokens
        assert Ts is not None
        x = b.build_inp_embd(b.w(T.TOKEN_EMBD))
        x = b.norm(x, T.TOKEN_EMBD_NORM, None, Norm.LAYER, name="inp_norm")
        last = (Ts - 1) * E  # offset of each sequence's last token
        for il in b.layers():
            x = b.reshape(x, (E, Ts, S), name="inp.seqs")
            shift = b.reshape(b.build_rs("r"), (E, 2, S), name="shift")
            att_shift = b.op("view", shift, shape=(E, 1, S), strides=(1, E, 2 * E), offset=0, name="shift.att")
            ffn_shift = b.op("view", shift, shape=(E, 1, S), strides=(1, E, 2 * E), offset=E, name="shift.ffn")
            a = b.norm(x, T.ATTN_NORM, il, Norm.LAYER, name="attn_norm")
            tm = self.time_mix(b, a, shifted(b, att_shift, a, "attn_prev"), il)
            ffn_inp = b.op("add", b.reshape(tm, (E, Ts, S), name="tm_out.seqs"), x, name="ffn_inp")
            f = b.norm(ffn_inp, T.ATTN_NORM_2, il, Norm.LAYER, name="ffn_norm")
            f_prev = shifted(b, ffn_shift, f, "ffn_prev")
            new_shift = b.op("concat", *(b.op("view", t, shape=(E, 1, S), strides=(1, E, E * Ts), offset=last,
                                              name=f"{tag}.last") for tag, t in (("attn_norm", a), ("ffn_norm", f))),
                             dim=1, name="shift.new")
            b.store_rs("r", b.reshape(new_shift, (self.n_embd_r, S), name="shift.rows"))
            tags = ("ffn_inp", "ffn_norm", "ffn_prev")
            ffn_inp, f, f_prev = b.last_layer_rows(*((b.reshape(t, (E, n_tok), name=f"{tag}.tokens"), f"{tag}.rows")
                                                     for tag, t in zip(tags, (ffn_inp, f, f_prev))))
            x = b.op("add", self.channel_mix(b, f, f_prev, il), ffn_inp, name="l_out")
            if hp.rescale_every_n_layers and (il + 1) % hp.rescale_every_n_layers == 0:
                x = b.op("scale", x, s=0.5, name="l_out.rescaled")
        x = b.norm(x, T.OUTPUT_NORM, None, Norm.LAYER, name="result_norm")
        b.build_output(x, b.w(T.OUTPUT))


# ---- presets: released models of this family, as their converted GGUFs declare them ---------------------

L, A = Keys.LLM, Keys.Attention


presets.register({
    "RWKV6-1.6B": Preset("rwkv6", {
        L.CONTEXT_LENGTH: 1048576, L.EMBEDDING_LENGTH: 2048, L.BLOCK_COUNT: 24, L.FEED_FORWARD_LENGTH: 7168,
        A.HEAD_COUNT: 0, Keys.WKV.HEAD_SIZE: 64, L.TIME_MIX_EXTRA_DIM: 32, L.TIME_DECAY_EXTRA_DIM: 64,
        L.RESCALE_EVERY_N_LAYERS: 6, L.TOKEN_SHIFT_COUNT: 2, A.LAYERNORM_EPS: 1e-5, L.VOCAB_SIZE: 65536,
    }, tied=False, f32=r"blk\.\d+\.time_mix_(first|w1|w2|decay_w1|decay_w2)\.weight", squeezed=SQUEEZED,
        source="RWKV/v6-Finch-1B6-HF config.json"),
})


# ---- Hugging Face: the keys convert_hf_to_gguf writes for Rwkv6ForCausalLM ----------------------------------------

RWKV6: tuple[Rule, ...] = (
    fixed(L.CONTEXT_LENGTH, 1 << 20),  # RWKV is not context-limited
    hf(L.EMBEDDING_LENGTH, "hidden_size"),
    hf(L.BLOCK_COUNT, *BLOCKS),
    hf(A.LAYERNORM_EPS, "layer_norm_epsilon", kind="number"),
    hf(L.RESCALE_EVERY_N_LAYERS, "rescale_every", kind="size"),
    hf(Keys.WKV.HEAD_SIZE, "head_size"),
    derived(L.TIME_MIX_EXTRA_DIM, lambda c: 64 if c.find("hidden_size") == 4096 else 32),
    derived(L.TIME_DECAY_EXTRA_DIM, lambda c: 128 if c.find("hidden_size") == 4096 else 64),
    derived(L.FEED_FORWARD_LENGTH, lambda c: c.find("intermediate_size", default=None)
            or int(c.find("hidden_size") * 3.5) // 32 * 32),
    fixed(A.HEAD_COUNT, 0),
    VOCAB,
)


hf_config.register(Family("rwkv6", RWKV6, {"tie_word_embeddings": False}, squeezed=SQUEEZED), "Rwkv6ForCausalLM")
