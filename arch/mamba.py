"""Mamba (v1) and Mamba-2: selective state-space models, no attention. Each layer mixes tokens through a short
causal convolution and a recurrent scan whose step size, input and output maps depend on the token; Mamba-2
scans per head with a scalar decay, shares B and C within groups of heads, and gates a grouped RMS norm.

The conv columns and the SSM state of each sequence live in the context's recurrent memory; the graph
reads them (``build_rs``) and writes the new ones (``store_rs``). Tokens arrive as ``n_seqs`` sequences of
``n_seq_tokens`` each. Reference: Gu & Dao 2023, "Mamba"; Dao & Gu 2024, "Transformers are SSMs" (Mamba-2);
llama.cpp src/models/mamba.cpp, mamba2.cpp, mamba-base.cpp.
"""

from __future__ import annotations

from gguf import MODEL_TENSOR as T
from gguf import Keys

from graphir.model.architecture import Architecture
from graphir.model.builder import GraphBuilder
from graphir.errors import MetadataError
from graphir.model.hparams import HParams, Key
from graphir.graph.ir import Node
from graphir.memory.layers import LayerNeeds, Recurrent
from graphir.model.tensors import TensorSpec, spec, tensor_name
from graphir.model import presets
from graphir.model.presets import Preset


class Mamba(Architecture):
    name = "mamba"
    required_keys = (Keys.Attention.LAYERNORM_RMS_EPS,)
    keys = (Key("ssm_d_conv", Keys.SSM.CONV_KERNEL, int, required=True, minimum=1),  # conv kernel width
            Key("ssm_d_inner", Keys.SSM.INNER_SIZE, int, required=True, minimum=1),
            Key("ssm_d_state", Keys.SSM.STATE_SIZE, int, required=True, minimum=1),
            Key("ssm_dt_rank", Keys.SSM.TIME_STEP_RANK, int, required=True, minimum=1),
            Key("ssm_dt_b_c_rms", Keys.SSM.DT_B_C_RMS, bool, False))

    @property
    def n_embd_r(self) -> int:
        """Per sequence and layer, the last d_conv - 1 conv input columns."""
        return (self.hp.ssm_d_conv - 1) * self.hp.ssm_d_inner

    @property
    def n_embd_s(self) -> int:
        """Per sequence and layer, the SSM state: d_state per inner channel."""
        return self.hp.ssm_d_state * self.hp.ssm_d_inner

    def layers(self) -> LayerNeeds:
        return (Recurrent(self.n_embd_r, self.n_embd_s),) * self.hp.n_layer

    def tensors(self) -> list[TensorSpec]:
        hp = self.hp
        E = hp.n_embd
        specs = [
            spec(T.TOKEN_EMBD, (E, hp.n_vocab)),
            spec(T.OUTPUT_NORM, (E,), kind="vector"),
            spec(T.OUTPUT, (E, hp.n_vocab), tied_to=tensor_name(T.TOKEN_EMBD)),
        ]
        for il in range(hp.n_layer):
            specs += [spec(T.ATTN_NORM, (E,), il, kind="vector"), *self.mixer_tensors(il)]
        return specs

    def mixer_tensors(self, il: int) -> list[TensorSpec]:
        """Layer il's selective SSM block."""
        hp = self.hp
        E, Di, Ds, R, K = hp.n_embd, hp.ssm_d_inner, hp.ssm_d_state, hp.ssm_dt_rank, hp.ssm_d_conv
        return [
            spec(T.SSM_IN, (E, 2 * Di), il),
            spec(T.SSM_CONV1D, (K, Di), il),
            spec(T.SSM_CONV1D, (Di,), il, "bias", kind="vector"),
            spec(T.SSM_X, (Di, R + 2 * Ds), il),
            spec(T.SSM_DT, (R, Di), il),
            spec(T.SSM_DT, (Di,), il, "bias", kind="vector"),
            spec(T.SSM_A, (Ds, Di), il, suffix=None),  # already -exp(A_log), stored under a bare name
            spec(T.SSM_D, (Di,), il, suffix=None, kind="vector"),
            spec(T.SSM_OUT, (Di, E), il),
        ]

    def mixer(self, b: GraphBuilder, x: Node, il: int) -> Node:
        """The selective SSM block: [E, n_seq_tokens, n_seqs] in, same out."""
        hp = self.hp
        Di, Ds, R, K = hp.ssm_d_inner, hp.ssm_d_state, hp.ssm_dt_rank, hp.ssm_d_conv
        Ts, S = b.n_seq_tokens, b.n_seqs
        assert Ts is not None
        xz = b.op("mul_mat", b.w(T.SSM_IN, il), x, name="ssm_in")  # [2*Di, Ts, S]
        xs = b.op("view", xz, shape=(Di, Ts, S), strides=(1, 2 * Di, 2 * Di * Ts), offset=0, name="ssm_x_in")
        z = b.op("view", xz, shape=(Di, Ts, S), strides=(1, 2 * Di, 2 * Di * Ts), offset=Di, name="ssm_z")

        conv = b.reshape(b.build_rs("r"), (K - 1, Di, S), name="conv_state")
        conv_x = b.op("concat", conv, b.op("transpose", xs, name="ssm_x_in.t"), dim=0, name="conv_x")
        last = b.op("view", conv_x, shape=(K - 1, Di, S), strides=(1, K - 1 + Ts, (K - 1 + Ts) * Di), offset=Ts,
                    name="conv_state.new")
        b.store_rs("r", b.reshape(b.op("cont", last, name="conv_state.cont"), (self.n_embd_r, S), name="conv_rows"))
        xs = b.op("ssm_conv", conv_x, b.w(T.SSM_CONV1D, il), name="ssm_conv")
        xs = b.op("silu", b.op("add", xs, b.w(T.SSM_CONV1D, il, "bias"), name="ssm_conv.b"), name="ssm_conv.act")

        dbc = b.op("mul_mat", b.w(T.SSM_X, il), xs, name="ssm_dbc")  # [R + 2*Ds, Ts, S]
        row = R + 2 * Ds
        dt, B, C = (b.op("view", dbc, shape=(n, Ts, S), strides=(1, row, row * Ts), offset=off, name=tag)
                    for tag, n, off in (("ssm_dt_in", R, 0), ("ssm_B", Ds, R), ("ssm_C", Ds, R + Ds)))
        dt = b.linear(dt, b.w(T.SSM_DT, il), b.w(T.SSM_DT, il, "bias"), name="ssm_dt")

        state = b.reshape(b.build_rs("s"), (Ds, Di, S), name="ssm_state")
        ys = b.op("ssm_scan", state, xs, dt, b.w(T.SSM_A, il, None), B, C, name="ssm_scan")
        n_y = Di * Ts * S
        y = b.op("view", ys, shape=(Di, Ts, S), strides=(1, Di, Di * Ts), offset=0, name="ssm_y")
        b.store_rs("s", b.op("view", ys, shape=(self.n_embd_s, S), strides=(1, self.n_embd_s), offset=n_y,
                             name="ssm_state.new"))

        y = b.op("add", y, b.op("mul", xs, b.w(T.SSM_D, il, None), name="ssm_skip"), name="ssm_y.skip")
        y = b.op("swiglu", b.op("cont", z, name="ssm_z.cont"), y, name="ssm_gated")
        return b.op("mul_mat", b.w(T.SSM_OUT, il), y, name="ssm_out")

    def build(self, b: GraphBuilder) -> None:
        hp = self.hp
        Ts, S = b.n_seq_tokens, b.n_seqs
        assert Ts is not None
        x = b.build_inp_embd(b.w(T.TOKEN_EMBD))
        out_ids = b.build_inp_out_ids()
        for il in range(hp.n_layer):
            with b.layer(il):
                h = b.build_norm(x, b.w(T.ATTN_NORM, il), name="attn_norm")
                h = self.mixer(b, b.reshape(h, (hp.n_embd, Ts, S), name="attn_norm.seqs"), il)
                h = b.reshape(h, (hp.n_embd, b.n_tokens), name="ssm_out.tokens")
                if il == hp.n_layer - 1:  # only requested rows go on
                    h = b.op("get_rows", h, out_ids, name="ssm_out.rows")
                    x = b.op("get_rows", x, out_ids, name="inp.rows")
                x = b.op("add", h, x, name="l_out")
        x = b.build_norm(x, b.w(T.OUTPUT_NORM), name="result_norm")
        b.build_output(x, b.w(T.OUTPUT))


class Mamba2(Mamba):
    name = "mamba2"
    keys = Mamba.keys[:4] + (Key("ssm_n_group", Keys.SSM.GROUP_COUNT, int, required=True, minimum=1),)

    def __init__(self, hp: HParams):
        heads, inner, groups = hp.ssm_dt_rank, hp.ssm_d_inner, hp.ssm_n_group
        if inner % heads or heads % groups:  # heads of inner // heads channels, in groups sharing B and C
            raise MetadataError(f"{heads} SSM heads ('{Keys.SSM.TIME_STEP_RANK.format(arch=hp.arch)}') must split the "
                                f"inner size {inner} and fall into {groups} equal groups "
                                f"('{Keys.SSM.GROUP_COUNT.format(arch=hp.arch)}')")
        super().__init__(hp)

    @property
    def conv_dim(self) -> int:
        """Channels through the conv: x, then B and C of every group."""
        hp = self.hp
        return hp.ssm_d_inner + 2 * hp.ssm_n_group * hp.ssm_d_state

    @property
    def n_embd_r(self) -> int:
        return (self.hp.ssm_d_conv - 1) * self.conv_dim

    def mixer_tensors(self, il: int) -> list[TensorSpec]:
        hp = self.hp
        E, Di, H, G, K = hp.n_embd, hp.ssm_d_inner, hp.ssm_dt_rank, hp.ssm_n_group, hp.ssm_d_conv
        return [
            spec(T.SSM_IN, (E, Di + self.conv_dim + H), il),  # z, x B C, dt
            spec(T.SSM_CONV1D, (K, self.conv_dim), il),
            spec(T.SSM_CONV1D, (self.conv_dim,), il, "bias", kind="vector"),
            spec(T.SSM_DT, (H,), il, "bias", kind="vector"),
            spec(T.SSM_A, (1, H), il, suffix=None),  # -exp(A_log), one per head
            spec(T.SSM_D, (1, H), il, suffix=None),
            spec(T.SSM_NORM, (Di // G, G), il),
            spec(T.SSM_OUT, (Di, E), il),
        ]

    def mixer(self, b: GraphBuilder, x: Node, il: int) -> Node:
        """The Mamba-2 block: [E, n_seq_tokens, n_seqs] in, [E, n_tokens] out (the tokens of all sequences)."""
        hp = self.hp
        Di, Ds, H, G, K = hp.ssm_d_inner, hp.ssm_d_state, hp.ssm_dt_rank, hp.ssm_n_group, hp.ssm_d_conv
        cd = self.conv_dim
        P, Ts, S = Di // H, b.n_seq_tokens, b.n_seqs
        assert Ts is not None
        zxbcdt = b.op("mul_mat", b.w(T.SSM_IN, il), x, name="ssm_in")  # [Di + cd + H, Ts, S]
        row = Di + cd + H
        z = b.op("view", zxbcdt, shape=(P, H, Ts, S), strides=(1, P, row, row * Ts), offset=0, name="ssm_z")
        xbc = b.op("view", zxbcdt, shape=(cd, Ts, S), strides=(1, row, row * Ts), offset=Di, name="ssm_xbc")
        dt = b.op("view", zxbcdt, shape=(H, Ts, S), strides=(1, row, row * Ts), offset=Di + cd, name="ssm_dt_in")

        conv = b.reshape(b.build_rs("r"), (K - 1, cd, S), name="conv_state")
        conv_x = b.op("concat", conv, b.op("transpose", xbc, name="ssm_xbc.t"), dim=0, name="conv_x")
        last = b.op("view", conv_x, shape=(K - 1, cd, S), strides=(1, K - 1 + Ts, (K - 1 + Ts) * cd), offset=Ts,
                    name="conv_state.new")
        b.store_rs("r", b.reshape(b.op("cont", last, name="conv_state.cont"), (self.n_embd_r, S), name="conv_rows"))
        xbc = b.op("ssm_conv", conv_x, b.w(T.SSM_CONV1D, il), name="ssm_conv")
        xbc = b.op("silu", b.op("add", xbc, b.w(T.SSM_CONV1D, il, "bias"), name="ssm_conv.b"), name="ssm_conv.act")

        xs = b.op("view", xbc, shape=(P, H, Ts, S), strides=(1, P, cd, cd * Ts), offset=0, name="ssm_x")
        B, C = (b.op("view", xbc, shape=(Ds, G, Ts, S), strides=(1, Ds, cd, cd * Ts), offset=off, name=tag)
                for tag, off in (("ssm_B", Di), ("ssm_C", Di + G * Ds)))
        dt = b.op("add", b.op("cont", dt, name="ssm_dt.cont"), b.w(T.SSM_DT, il, "bias"), name="ssm_dt")

        state = b.reshape(b.build_rs("s"), (Ds, P, H, S), name="ssm_state")
        ys = b.op("ssm_scan_heads", state, xs, dt, b.w(T.SSM_A, il, None), B, C, name="ssm_scan")
        n_y = Di * Ts * S
        y = b.op("view", ys, shape=(P, H, Ts, S), strides=(1, P, Di, Di * Ts), offset=0, name="ssm_y")
        b.store_rs("s", b.op("view", ys, shape=(self.n_embd_s, S), strides=(1, self.n_embd_s), offset=n_y,
                             name="ssm_state.new"))

        y = b.op("add", y, b.op("mul", xs, b.w(T.SSM_D, il, None), name="ssm_skip"), name="ssm_y.skip")
        y = b.op("swiglu", b.op("cont", z, name="ssm_z.cont"), y, name="ssm_gated")
        y = b.build_norm(b.reshape(y, (Di // G, G, Ts, S), name="ssm_gated.groups"), b.w(T.SSM_NORM, il),
                         name="ssm_norm")
        return b.op("mul_mat", b.w(T.SSM_OUT, il), b.reshape(y, (Di, b.n_tokens), name="ssm_norm.tokens"),
                    name="ssm_out")


# ---- presets: released models of this family, as their converted GGUFs declare them ---------------------

L, A, S = Keys.LLM, Keys.Attention, Keys.SSM


def _mamba(E: int, n_layer: int, source: str) -> Preset:
    return Preset("mamba", {
        L.CONTEXT_LENGTH: 1048576, L.EMBEDDING_LENGTH: E, L.BLOCK_COUNT: n_layer, L.FEED_FORWARD_LENGTH: 0,
        A.HEAD_COUNT: 0, S.CONV_KERNEL: 4, S.INNER_SIZE: 2 * E, S.STATE_SIZE: 16, S.TIME_STEP_RANK: -(-E // 16),
        A.LAYERNORM_RMS_EPS: 1e-5, L.VOCAB_SIZE: 50280,
    }, tied=True, f32=r"blk\.\d+\.ssm_(conv1d\.weight|a)", source=source)


presets.register({
    "Mamba-130M": _mamba(768, 24, "state-spaces/mamba-130m-hf config.json"),
    "Mamba-2.8B": _mamba(2560, 64, "state-spaces/mamba-2.8b-hf config.json"),
    # 80 heads of 64 (d_inner 5120), one group, 128 states; the vocabulary padded to a multiple of 16.
    "Mamba-2-2.7B": Preset("mamba2", {
        L.CONTEXT_LENGTH: 1048576, L.EMBEDDING_LENGTH: 2560, L.BLOCK_COUNT: 64, L.FEED_FORWARD_LENGTH: 0,
        A.HEAD_COUNT: 0, S.CONV_KERNEL: 4, S.INNER_SIZE: 5120, S.STATE_SIZE: 128, S.TIME_STEP_RANK: 80,
        S.GROUP_COUNT: 1, A.LAYERNORM_RMS_EPS: 1e-5, L.VOCAB_SIZE: 50288,
    }, tied=True, f32=r"blk\.\d+\.ssm_(conv1d\.weight|a|d|norm\.weight)",
        source="state-spaces/mamba2-2.7b config.json"),
})
