"""PLaMo 2 (plamo2, Preferred Networks): Mamba-like mixer layers and attention layers in one decoder, every mixer and
FFN wrapped in an RMSNorm before and another after (``x += post(mixer(pre(x)))``, likewise the FFN).

A layer whose ``attention.head_count_kv`` entry is 0 mixes tokens with PLaMo 2's own state-space block: one
projection gives z and x, laid out head by head ([z, x] of each head in turn); x goes through a causal conv
(no bias) and SiLU; one projection of it gives B, C and the step's input, each RMS-normalised with a scale of its
own (B and C are one group shared by every head), the step widened to a value per head; the heads scan as Mamba-2's
do, add x times D, and are gated by SiLU(z). Its state is the conv's last columns and d_state per inner channel.
Mixer layers with attention heads are grouped-query attention from one fused QKV projection, per-head QK-norm
scales and NeoX RoPE. The FFN is a SwiGLU over the two halves of one up projection.
The memory is the ``hybrid`` kind: a KV cache for the attention layers, state cells for the others.
PLaMo-2-1B is the released model's preset (from its public config.json, which the mapping below reads as
convert_hf_to_gguf does). Reference: Preferred Networks 2025, "PLaMo 2"; llama.cpp src/models/plamo2.cpp.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from gguf import MODEL_TENSOR as T
from gguf import Keys

from graphir.errors import MetadataError
from graphir.graph.ir import Node
from graphir.memory.layers import LayerNeeds
from graphir.model import hf_config, presets, ssm
from graphir.model.architecture import Architecture
from graphir.model.builder import GraphBuilder, Norm
from graphir.model.hf_config import BLOCKS, CONTEXT, VOCAB, WIDTH, Config, Family, derived, fixed, hf
from graphir.model.hparams import HParams, Key
from graphir.model.presets import Preset
from graphir.model.tensors import TensorSpec, scales, spec, tensor_name


F32 = r"blk\.\d+\.(ssm_conv1d|attn_[qk]_norm)\.weight"  # the converter keeps these matrices in f32


class Plamo2(Architecture):
    name = "plamo2"
    rope_mode = "neox"
    per_layer = True  # head_count_kv per layer says which layers are state-space ones
    required_keys = (Keys.Attention.LAYERNORM_RMS_EPS,)
    keys = ssm.SSM_KEYS + (Key("ssm_n_group", Keys.SSM.GROUP_COUNT, int, required=True, minimum=0),)

    def __init__(self, hp: HParams):
        if hp.ssm_n_group != 0:  # llama.cpp's graph asserts it: B and C are one group the conv does not see
            raise MetadataError(f"a 'plamo2' model's SSM has no groups: "
                                f"'{Keys.SSM.GROUP_COUNT.format(arch=hp.arch)}' is {hp.ssm_n_group}, not 0")
        if hp.ssm_d_inner % hp.ssm_dt_rank:
            raise MetadataError(f"{hp.ssm_dt_rank} SSM heads ('{Keys.SSM.TIME_STEP_RANK.format(arch=hp.arch)}') "
                                f"must split the inner size {hp.ssm_d_inner}")
        super().__init__(hp)

    def recurrent(self, il: int) -> bool:
        """A layer without K/V heads is a state-space layer (as llama.cpp marks them)."""
        return self.hp.head_count_kv(il) == 0

    @property
    def dt_dim(self) -> int:
        """The step's input width before its projection to the heads."""
        return max(64, self.hp.n_embd // 16)

    def layers(self) -> LayerNeeds:
        return ssm.state_or_attention(self.hp, self.hp.ssm_d_inner, self.recurrent, self.hp.n_layer)

    # ---- tensors -----------------------------------------------------------------------------------------

    def tensors(self) -> list[TensorSpec]:
        hp = self.hp
        E, F = hp.n_embd, hp.n_ff
        specs = [spec(T.TOKEN_EMBD, (E, hp.n_vocab)), spec(T.OUTPUT_NORM, (E,), kind="vector"),
                 spec(T.OUTPUT, (E, hp.n_vocab), tied_to=tensor_name(T.TOKEN_EMBD))]
        for il in range(hp.n_layer):
            specs += [spec(T.ATTN_NORM, (E,), il, kind="vector"),
                      *(self.ssm_tensors(il) if self.recurrent(il) else self.attn_tensors(il)),
                      spec(T.ATTN_POST_NORM, (E,), il, suffix=None, kind="vector"),
                      spec(T.FFN_NORM, (E,), il, kind="vector"),
                      spec(T.FFN_DOWN, (F, E), il), spec(T.FFN_UP, (E, 2 * F), il),
                      spec(T.FFN_POST_NORM, (E,), il, suffix=None, kind="vector"),
                      *scales(T.FFN_DOWN, il), *scales(T.FFN_UP, il)]  # loaded, never read
        return specs

    def attn_tensors(self, il: int) -> list[TensorSpec]:
        hp = self.hp
        E, dk, dv, H, Hkv = hp.n_embd, hp.n_embd_head_k, hp.n_embd_head_v, hp.head_count(il), hp.head_count_kv(il)
        return [spec(T.ATTN_QKV, (E, dk * H + dk * Hkv + dv * Hkv), il),
                spec(T.ATTN_Q_NORM, (dk, H), il), spec(T.ATTN_K_NORM, (dk, Hkv), il),
                spec(T.ATTN_OUT, (dv * H, E), il), *scales(T.ATTN_QKV, il), *scales(T.ATTN_OUT, il)]

    def ssm_tensors(self, il: int) -> list[TensorSpec]:
        hp = self.hp
        E, Di, Ds, H = hp.n_embd, hp.ssm_d_inner, hp.ssm_d_state, hp.ssm_dt_rank
        return [spec(T.SSM_IN, (E, 2 * Di), il), spec(T.SSM_CONV1D, (hp.ssm_d_conv, Di), il),
                spec(T.SSM_X, (Di, self.dt_dim + 2 * Ds), il), spec(T.SSM_DT, (self.dt_dim, H), il),
                spec(T.SSM_DT, (H,), il, "bias", kind="vector"),
                spec(T.SSM_A, (H,), il, suffix=None, kind="vector"), spec(T.SSM_D, (H,), il, suffix=None, kind="vector"),
                spec(T.SSM_OUT, (Di, E), il),
                spec(T.SSM_DT_NORM, (self.dt_dim,), il, suffix=None, kind="vector"),
                spec(T.SSM_B_NORM, (Ds,), il, suffix=None, kind="vector"),
                spec(T.SSM_C_NORM, (Ds,), il, suffix=None, kind="vector"),
                *scales(T.SSM_IN, il), *scales(T.SSM_OUT, il)]  # loaded, never read

    # ---- graph -------------------------------------------------------------------------------------------

    def bare_norm(self, b: GraphBuilder, x: Node, t: T, il: int, name: str) -> Node:
        """x RMS-normalised with a scale stored under a bare name (no ``.weight``)."""
        return b.build_norm(x, b.w(t, il, None), None, Norm.RMS, name=name)

    def attention(self, b: GraphBuilder, h: Node, pos: Node, il: int) -> Node:
        hp = self.hp
        dk, dv, H, Hkv, Tn = hp.n_embd_head_k, hp.n_embd_head_v, hp.head_count(il), hp.head_count_kv(il), b.n_tokens
        qkv = b.mm(b.w(T.ATTN_QKV, il), h, name="wqkv")
        row = dk * H + dk * Hkv + dv * Hkv
        q, k, v = (b.op("view", qkv, shape=(d, n, Tn), strides=(1, d, row), offset=off, name=tag)
                   for tag, d, n, off in (("Qcur", dk, H, 0), ("Kcur", dk, Hkv, dk * H),
                                          ("Vcur", dv, Hkv, dk * H + dk * Hkv)))
        q = b.rope(b.norm(q, T.ATTN_Q_NORM, il, name="Qcur_normed"), pos, name="Qcur.rope")
        k = b.rope(b.norm(k, T.ATTN_K_NORM, il, name="Kcur_normed"), pos, name="Kcur.rope")
        return b.build_attn(q, k, v, wo=b.w(T.ATTN_OUT, il), wo_s=b.scale(T.ATTN_OUT, il),
                            kq_scale=1.0 / math.sqrt(dv))

    def mixer(self, b: GraphBuilder, h: Node, il: int) -> Node:
        """PLaMo 2's state-space block over the ubatch's sequences ([E, n_tokens] in and out)."""
        hp = self.hp
        Di, Ds, H, Ts, S = hp.ssm_d_inner, hp.ssm_d_state, hp.ssm_dt_rank, b.n_seq_tokens, b.n_seqs
        assert Ts is not None
        P, R = Di // H, self.dt_dim
        zx = b.mm(b.w(T.SSM_IN, il), b.reshape(h, (hp.n_embd, Ts, S), name="attn_norm.seqs"), name="mamba_in_proj")
        # llama.cpp swaps the token and sequence axes here and reads the result back in the unswapped order: the
        # same rows when a ubatch has one sequence or one token of each, another sequence's rows otherwise (a
        # sequence would read its neighbours' tokens); each sequence's own rows are PLaMo 2's mixer
        zx = b.reshape(zx, (2 * P, H, Ts, S), name="mamba_in_proj_out")
        z, x = (b.op("view", zx, shape=(P, H, Ts, S), strides=(1, 2 * P, 2 * P * H, 2 * P * H * Ts), offset=off,
                     name=tag) for tag, off in (("mamba_z_split", 0), ("mamba_x_split.view", P)))
        x = b.reshape(b.op("cont", x, name="mamba_x_split.cont"), (Di, Ts, S), name="mamba_x_split")

        conv_x = ssm.conv_input(b, x, name="mamba_conv1d_input", transposed="mamba_x_split.t")
        x = b.op("silu", b.op("ssm_conv", conv_x, b.w(T.SSM_CONV1D, il), name="mamba_conv1d"),
                 name="mamba_conv1d_silu")

        bcdt = b.mm(b.w(T.SSM_X, il), x, name="mamba_bcdt_proj")  # [2 Ds + R, Ts, S]
        row = 2 * Ds + R
        B, C, dt = (b.op("view", bcdt, shape=(n, Ts, S), strides=(1, row, row * Ts), offset=off, name=tag)
                    for tag, n, off in (("mamba_B_raw", Ds, 0), ("mamba_C_raw", Ds, Ds), ("mamba_dt_raw", R, 2 * Ds)))
        B = self.bare_norm(b, B, T.SSM_B_NORM, il, "mamba_B_normed")
        C = self.bare_norm(b, C, T.SSM_C_NORM, il, "mamba_C_normed")
        dt = self.bare_norm(b, dt, T.SSM_DT_NORM, il, "mamba_dt_normed")
        dt = b.linear(dt, b.w(T.SSM_DT, il), b.w(T.SSM_DT, il, "bias"), name="mamba_dt_proj")  # [H, Ts, S]

        A = b.reshape(b.w(T.SSM_A, il, None), (1, H), name="mamba_A")
        xs = b.reshape(x, (P, H, Ts, S), name="mamba_x_heads")
        B, C = (b.reshape(t, (Ds, 1, Ts, S), name=f"{tag}.group") for t, tag in ((B, "mamba_B"), (C, "mamba_C")))
        state = b.reshape(b.build_rs("s"), (Ds, P, H, S), name="mamba_ssm_state")
        ys = b.op("ssm_scan_heads", state, xs, dt, A, B, C, name="mamba_ssm_scan")
        y = b.op("view", ys, shape=(P, H, Ts, S), strides=(1, P, Di, Di * Ts), offset=0, name="mamba_y_view")
        ssm.store_states(b, ys, Di * Ts * S, Ds * Di, name="mamba_ssm_states")

        D = b.reshape(b.w(T.SSM_D, il, None), (1, H), name="mamba_D")
        y = b.op("add", y, b.op("mul", xs, D, name="mamba_x_d"), name="mamba_y_add_d")
        y = b.op("swiglu", b.op("cont", z, name="mamba_z.cont"), y, name="mamba_y_swiglu_z")
        y = b.mm(b.w(T.SSM_OUT, il), b.reshape(y, (Di, Ts, S), name="mamba_y"), name="mamba_out_proj")
        return b.reshape(y, (hp.n_embd, b.n_tokens), name="mamba_out")

    def build(self, b: GraphBuilder) -> None:
        hp = self.hp
        x = b.build_inp_embd(b.w(T.TOKEN_EMBD))
        pos = b.build_inp_pos()
        for il in b.layers(hp.n_layer):
            residual = x
            h = b.norm(x, T.ATTN_NORM, il, name="attn_norm")
            h = self.mixer(b, h, il) if self.recurrent(il) else self.attention(b, h, pos, il)
            if il == hp.n_layer - 1:  # the last layer keeps the requested rows only
                out_ids = b.build_inp_out_ids()
                h = b.op("get_rows", h, out_ids, name="attn_out.rows")
                residual = b.op("get_rows", residual, out_ids, name="residual.rows")
            h = self.bare_norm(b, h, T.ATTN_POST_NORM, il, "attn_post_norm")
            x = b.op("add", h, residual, name="attn_residual")
            h = b.norm(x, T.FFN_NORM, il, name="ffn_pre_norm")
            h = b.build_ffn_fused_swiglu(h, il)
            h = self.bare_norm(b, h, T.FFN_POST_NORM, il, "ffn_post_norm")
            x = b.op("add", h, x, name="ffn_residual")
        b.build_output(b.norm(x, T.OUTPUT_NORM, name="result_norm"), b.w(T.OUTPUT))


# ---- presets --------------------------------------------------------------------------------------------

L, A, R, S = Keys.LLM, Keys.Attention, Keys.Rope, Keys.SSM

presets.register({
    # 16 layers of width 2048: the state-space block in the even ones (32 heads of 128, inner 4096, 64 states,
    # conv kernel 4), attention in the odd ones (16 query heads of 128 sharing one K/V head); a SwiGLU of 8192
    "PLaMo-2-1B": Preset("plamo2", {
        L.CONTEXT_LENGTH: 10485760, L.EMBEDDING_LENGTH: 2048, L.BLOCK_COUNT: 16, L.FEED_FORWARD_LENGTH: 8192,
        A.HEAD_COUNT: [0, 16] * 8, A.HEAD_COUNT_KV: [0, 1] * 8, A.KEY_LENGTH: 128, A.VALUE_LENGTH: 128,
        R.FREQ_BASE: 10000.0, A.LAYERNORM_RMS_EPS: 1e-6, S.CONV_KERNEL: 4, S.INNER_SIZE: 4096, S.STATE_SIZE: 64,
        S.TIME_STEP_RANK: 32, S.GROUP_COUNT: 0, L.VOCAB_SIZE: 100000,
    }, tied=True, f32=F32, source="pfnet/plamo-2-1b config.json"),
})


# ---- Hugging Face: the keys convert_hf_to_gguf writes for PLaMo 2 --------------------------------------------------

def _attention_layers(c: Config) -> set[int]:
    """The layers PLaMo 2's modelling code gives attention: every mamba_step-th from mamba_step // 2 (the last one
    alone when there are too few layers), none with mamba_enabled false."""
    n, step = c.find(*BLOCKS), c.find("mamba_step", default=2)
    if not c.find("mamba_enabled", kind="flag", default=True):
        return set(range(n))
    if n <= step // 2:
        return {n - 1}
    return {il for il in range(n) if il % step == step // 2}


def _per_layer(name: str, default: int) -> Callable[[Config], list[int]]:
    def heads(c: Config) -> list[int]:
        attention, count = _attention_layers(c), c.find(name, default=default)
        return [count if il in attention else 0 for il in range(c.find(*BLOCKS))]
    return heads


PLAMO2 = (
    hf(L.BLOCK_COUNT, *BLOCKS),
    hf(L.CONTEXT_LENGTH, *CONTEXT, default=2048),
    hf(L.EMBEDDING_LENGTH, *WIDTH),
    hf(A.KEY_LENGTH, "hidden_size_per_head", default=128),
    hf(A.VALUE_LENGTH, "hidden_size_per_head", default=128),
    derived(A.HEAD_COUNT, _per_layer("num_attention_heads", 32)),
    derived(A.HEAD_COUNT_KV, _per_layer("num_key_value_heads", 4)),
    hf(A.LAYERNORM_RMS_EPS, "rms_norm_eps", kind="number", default=1e-6),
    hf(R.FREQ_BASE, "rope_theta", kind="number", default=10000.0),
    hf(S.STATE_SIZE, "mamba_d_state", default=64),
    hf(S.CONV_KERNEL, "mamba_d_conv", default=4),
    hf(S.TIME_STEP_RANK, "mamba_num_heads", default=64),
    derived(S.INNER_SIZE, lambda c: c.find("mamba_num_heads", default=64) * c.find("hidden_size_per_head", default=128)),
    fixed(S.GROUP_COUNT, 0),
    hf(L.FEED_FORWARD_LENGTH, "intermediate_size", default=13312),
    VOCAB,
)

hf_config.register(Family("plamo2", PLAMO2, {"tie_word_embeddings": True}), "Plamo2ForCausalLM")
