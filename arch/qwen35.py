"""Qwen3.5, dense (qwen35): gated DeltaNet layers and gated full-attention layers in one decoder.

Three layers of every four (``full_attention_interval``, or the flags of ``attention.recurrent_layers``) mix
tokens by gated DeltaNet: one projection gives q, k and v, which go through a short causal convolution and
SiLU; q and k are L2-normalised, and each value head keeps a matrix state that decays by exp(g) per token and is
corrected toward v along k by a step beta (the gated delta rule); the read-out is RMS-normalised per head and
gated by SiLU(z). The other layers are grouped-query attention with QK-norm and interleaved multi-section RoPE
(M-RoPE; a text token gives every section its position), whose Q projection also yields a sigmoid gate on the
heads' output. Each layer then adds a SwiGLU FFN behind a post-attention norm. The memory holds a KV cache for
the attention layers and conv columns plus delta states per sequence for the others (the ``hybrid`` kind).
Multi-token-prediction layers (``nextn_predict_layers``) are not built yet: such a file is refused.
Reference: Qwen Team 2026, "Qwen3.5"; Yang, Kautz & Hatamizadeh 2025, "Gated Delta Networks"; llama.cpp
src/models/qwen35.cpp, delta-net-base.cpp.
"""

from __future__ import annotations

from gguf import MODEL_TENSOR as T
from gguf import Keys

from graphir.errors import MetadataError
from graphir.graph.ir import Node
from graphir.memory.layers import Attention, LayerNeeds, Recurrent
from graphir.model.architecture import Architecture
from graphir.model.builder import GraphBuilder
from graphir.model.hparams import HParams, Key, f32, inv_sqrt
from graphir.model.tensors import TensorSpec, spec, tensor_name
from graphir.model import presets
from graphir.model.presets import Preset

RECURRENT_LAYERS = "{arch}.attention.recurrent_layers"  # llama.cpp's key; gguf-py has no constant for it yet


class Qwen35(Architecture):
    name = "qwen35"
    rope_mode = "imrope"
    required_keys = (Keys.Attention.LAYERNORM_RMS_EPS,)
    keys = (Key("ssm_d_conv", Keys.SSM.CONV_KERNEL, int, required=True, minimum=1),  # conv kernel width
            Key("ssm_d_inner", Keys.SSM.INNER_SIZE, int, required=True, minimum=1),  # value heads x head size
            Key("ssm_d_state", Keys.SSM.STATE_SIZE, int, required=True, minimum=1),  # head size of k (and v)
            Key("ssm_dt_rank", Keys.SSM.TIME_STEP_RANK, int, required=True, minimum=1),  # value heads
            Key("ssm_n_group", Keys.SSM.GROUP_COUNT, int, required=True, minimum=1),  # key heads
            Key("rope_sections", Keys.Rope.DIMENSION_SECTIONS, tuple, required=True, minimum=0, count=4),
            Key("recurrent_layers", RECURRENT_LAYERS, tuple, (), minimum=0, maximum=1),  # (): by the interval
            Key("full_attention_interval", Keys.LLM.FULL_ATTENTION_INTERVAL, int, 4, minimum=1),
            Key("n_nextn", Keys.LLM.NEXTN_PREDICT_LAYERS, int, 0, minimum=0))

    def __init__(self, hp: HParams):
        def key(template: str) -> str:
            return f"'{template.format(arch=hp.arch)}'"

        if hp.n_nextn:
            raise MetadataError(f"a '{self.name}' model with {hp.n_nextn} multi-token-prediction layers "
                                f"({key(Keys.LLM.NEXTN_PREDICT_LAYERS)}) needs them built, which graphir does not "
                                f"do yet")
        heads, k_heads, d = hp.ssm_dt_rank, hp.ssm_n_group, hp.ssm_d_state
        if hp.ssm_d_inner != heads * d or heads % k_heads:  # k and v heads are equally wide; k heads are shared
            raise MetadataError(f"DeltaNet inner size {hp.ssm_d_inner} ({key(Keys.SSM.INNER_SIZE)}) must be {heads} "
                                f"value heads ({key(Keys.SSM.TIME_STEP_RANK)}) of {d} ({key(Keys.SSM.STATE_SIZE)}), "
                                f"sharing {k_heads} key heads ({key(Keys.SSM.GROUP_COUNT)}) evenly")
        s = hp.rope_sections
        if not any(s[:3]) or sum(s) > hp.n_embd_head_k:
            raise MetadataError(f"RoPE sections {list(s)} ({key(Keys.Rope.DIMENSION_SECTIONS)}) need a positive "
                                f"one among the first three and at most {hp.n_embd_head_k} pairs in all")
        super().__init__(hp)
        if any(isinstance(n, Attention) for n in self.needs) and hp.n_embd_head_k != hp.n_embd_head_v:
            raise MetadataError(f"attention heads of {hp.n_embd_head_k} keys ({key(Keys.Attention.KEY_LENGTH)}) and "
                                f"{hp.n_embd_head_v} values ({key(Keys.Attention.VALUE_LENGTH)}) must be equal")

    # ---- sizes -------------------------------------------------------------------------------------------

    def recurrent(self, il: int) -> bool:
        hp = self.hp
        if hp.recurrent_layers:
            return bool(hp.recurrent_layers[il])
        return (il + 1) % hp.full_attention_interval != 0

    @property
    def key_dim(self) -> int:
        return self.hp.ssm_d_state * self.hp.ssm_n_group

    @property
    def conv_dim(self) -> int:
        """Channels through the conv: q and k of every key head, v of every value head."""
        return 2 * self.key_dim + self.hp.ssm_d_inner

    @property
    def n_embd_r(self) -> int:
        """Per sequence and layer, the last d_conv - 1 conv input columns."""
        return (self.hp.ssm_d_conv - 1) * self.conv_dim

    @property
    def n_embd_s(self) -> int:
        """Per sequence and layer, a head size x head size state per value head."""
        return self.hp.ssm_d_state * self.hp.ssm_d_inner

    def layers(self) -> LayerNeeds:
        hp = self.hp
        return tuple(Recurrent(self.n_embd_r, self.n_embd_s) if self.recurrent(il)
                     else Attention(hp.n_embd_k_gqa_at(il), hp.n_embd_v_gqa_at(il)) for il in range(hp.n_layer))

    # ---- tensors -----------------------------------------------------------------------------------------

    def tensors(self) -> list[TensorSpec]:
        hp = self.hp
        E, F = hp.n_embd, hp.n_ff
        specs = [spec(T.TOKEN_EMBD, (E, hp.n_vocab)), spec(T.OUTPUT_NORM, (E,), kind="vector"),
                 spec(T.OUTPUT, (E, hp.n_vocab), tied_to=tensor_name(T.TOKEN_EMBD))]
        for il in range(hp.n_layer):
            specs += [spec(T.ATTN_NORM, (E,), il, kind="vector"), spec(T.ATTN_POST_NORM, (E,), il, kind="vector"),
                      *(self.delta_tensors(il) if self.recurrent(il) else self.attn_tensors(il)),
                      spec(T.FFN_GATE, (E, F), il), spec(T.FFN_UP, (E, F), il), spec(T.FFN_DOWN, (F, E), il)]
        return specs

    def attn_tensors(self, il: int) -> list[TensorSpec]:
        """Q (and its gate, head by head), K, V with optional biases; the output; the QK-norm scales."""
        hp = self.hp
        E, d, H, Hkv = hp.n_embd, hp.n_embd_head_k, hp.head_count(il), hp.head_count_kv(il)
        return [spec(T.ATTN_Q, (E, 2 * d * H), il), spec(T.ATTN_K, (E, d * Hkv), il), spec(T.ATTN_V, (E, d * Hkv), il),
                spec(T.ATTN_Q, (2 * d * H,), il, "bias", kind="vector", optional=True),
                spec(T.ATTN_K, (d * Hkv,), il, "bias", kind="vector", optional=True),
                spec(T.ATTN_V, (d * Hkv,), il, "bias", kind="vector", optional=True),
                spec(T.ATTN_OUT, (d * H, E), il),
                spec(T.ATTN_Q_NORM, (d,), il, kind="vector"), spec(T.ATTN_K_NORM, (d,), il, kind="vector")]

    def delta_tensors(self, il: int) -> list[TensorSpec]:
        """Layer il's gated DeltaNet. llama.cpp loads attn_qkv and attn_gate as optional but its graph uses them
        unconditionally (a file without them crashes there): here they are required."""
        hp = self.hp
        E, H, d, V = hp.n_embd, hp.ssm_dt_rank, hp.ssm_d_state, hp.ssm_d_inner
        return [spec(T.ATTN_QKV, (E, self.conv_dim), il), spec(T.ATTN_GATE, (E, V), il),
                spec(T.SSM_CONV1D, (hp.ssm_d_conv, self.conv_dim), il),
                spec(T.SSM_DT, (H,), il, "bias", kind="vector"),
                spec(T.SSM_A, (H,), il, suffix=None, kind="vector"),  # -exp(A_log), stored under a bare name
                spec(T.SSM_BETA, (E, H), il), spec(T.SSM_ALPHA, (E, H), il),
                spec(T.SSM_NORM, (d,), il, kind="vector"), spec(T.SSM_OUT, (V, E), il)]

    # ---- graph -------------------------------------------------------------------------------------------

    def attention(self, b: GraphBuilder, h: Node, pos: Node, il: int) -> Node:
        """Gated attention: Q and its gate interleaved head by head in one projection; QK-norm, M-RoPE,
        attention through the layer's memory, the output times sigmoid(gate), then W_o."""
        hp = self.hp
        d, H, Hkv, Tn = hp.n_embd_head_k, hp.head_count(il), hp.head_count_kv(il), b.n_tokens
        qg = b.linear(h, b.w(T.ATTN_Q, il), b.w(T.ATTN_Q, il, "bias"), name="Qcur_full")
        q, gate = (b.op("view", qg, shape=(d, H, Tn), strides=(1, 2 * d, 2 * d * H), offset=off, name=tag)
                   for tag, off in (("Qcur", 0), ("gate", d)))
        gate = b.reshape(b.op("cont", gate, name="gate.cont"), (d * H, Tn), name="gate_reshaped")
        k, v = (b.reshape(b.linear(h, b.w(t, il), b.w(t, il, "bias"), name=tag), (d, Hkv, Tn),
                          name=f"{tag}.heads") for t, tag in ((T.ATTN_K, "Kcur"), (T.ATTN_V, "Vcur")))
        q = b.build_norm(q, b.w(T.ATTN_Q_NORM, il), name="Qcur_normed")
        k = b.build_norm(k, b.w(T.ATTN_K_NORM, il), name="Kcur_normed")
        q = b.rope(q, pos, name="Qcur.rope", sections=hp.rope_sections)
        k = b.rope(k, pos, name="Kcur.rope", sections=hp.rope_sections)
        out = b.build_attn(q, k, v, wo=None, kq_scale=b.kq_scale())
        out = b.op("mul", out, b.op("sigmoid", gate, name="gate_sigmoid"), name="attn_gated")
        return b.op("mul_mat", b.w(T.ATTN_OUT, il), out, name="attn_output")

    def l2_norm(self, b: GraphBuilder, x: Node, name: str) -> Node:
        """x / |x| per head (eps under the root), as llama.cpp writes it: RMS norm with eps / n, times 1 / sqrt(n)."""
        n = x.shape[0]
        y = b.op("rms_norm", x, eps=f32(self.hp.norm_rms_eps / n), name=f"{name}.rms")
        return b.op("scale", y, s=inv_sqrt(n), name=name)

    def delta_net(self, b: GraphBuilder, h: Node, il: int) -> Node:
        """Gated DeltaNet over the ubatch's sequences ([E, n_tokens] in and out)."""
        hp = self.hp
        Dk, Hk, Hv, K, cd = hp.ssm_d_state, hp.ssm_n_group, hp.ssm_dt_rank, hp.ssm_d_conv, self.conv_dim
        Ts, S = b.n_seq_tokens, b.n_seqs
        assert Ts is not None
        qkv = b.reshape(b.op("mul_mat", b.w(T.ATTN_QKV, il), h, name="qkv_mixed"), (cd, Ts, S),
                        name="qkv_mixed.seqs")
        z = b.op("mul_mat", b.w(T.ATTN_GATE, il), h, name="z")
        beta = b.reshape(b.op("mul_mat", b.w(T.SSM_BETA, il), h, name="beta"), (1, Hv, Ts, S),
                         name="beta.seqs")
        beta = b.op("sigmoid", beta, name="beta_sigmoid")
        alpha = b.reshape(b.op("mul_mat", b.w(T.SSM_ALPHA, il), h, name="alpha"), (Hv, Ts, S),
                          name="alpha.seqs")
        alpha = b.op("softplus", b.op("add", alpha, b.w(T.SSM_DT, il, "bias"), name="alpha_biased"),
                     name="a_softplus")
        g = b.reshape(b.op("mul", alpha, b.w(T.SSM_A, il, None), name="gate"), (1, Hv, Ts, S),
                      name="gate.seqs")

        conv = b.reshape(b.build_rs("r"), (K - 1, cd, S), name="conv_state")
        conv_x = b.op("concat", conv, b.op("transpose", qkv, name="qkv_mixed.t"), dim=0, name="conv_input")
        last = b.op("view", conv_x, shape=(K - 1, cd, S), strides=(1, K - 1 + Ts, (K - 1 + Ts) * cd), offset=Ts,
                    name="conv_state.new")
        b.store_rs("r", b.reshape(b.op("cont", last, name="conv_state.cont"), (self.n_embd_r, S), name="conv_rows"))
        x = b.op("silu", b.op("ssm_conv", conv_x, b.w(T.SSM_CONV1D, il), name="conv_output_raw"),
                 name="conv_output_silu")
        q, k = (b.op("view", x, shape=(Dk, Hk, Ts, S), strides=(1, Dk, cd, cd * Ts), offset=off, name=tag)
                for tag, off in (("q_conv", 0), ("k_conv", Dk * Hk)))
        v = b.op("view", x, shape=(Dk, Hv, Ts, S), strides=(1, Dk, cd, cd * Ts), offset=2 * Dk * Hk, name="v_conv")
        q, k = self.l2_norm(b, q, "q_normed"), self.l2_norm(b, k, "k_normed")

        state = b.reshape(b.build_rs("s"), (Dk, Dk, Hv, S), name="state")
        ys = b.op("gated_delta_net", q, k, v, g, beta, state, name="delta_net")
        n_y = Dk * Hv * Ts * S
        y = b.op("view", ys, shape=(Dk, Hv, Ts, S), strides=(1, Dk, Dk * Hv, Dk * Hv * Ts), offset=0,
                 name="attn_output")
        b.store_rs("s", b.op("view", ys, shape=(self.n_embd_s, S), strides=(1, self.n_embd_s), offset=n_y,
                             name="new_state"))
        y = b.build_norm(y, b.w(T.SSM_NORM, il), name="attn_output_normed")
        y = b.op("mul", y, b.op("silu", b.reshape(z, (Dk, Hv, Ts, S), name="z.heads"), name="z_silu"), name="gated")
        y = b.reshape(y, (hp.ssm_d_inner, Ts, S), name="final_output")
        y = b.op("mul_mat", b.w(T.SSM_OUT, il), y, name="linear_attn_out")
        return b.reshape(y, (hp.n_embd, b.n_tokens), name="linear_attn_out.tokens")

    def build(self, b: GraphBuilder) -> None:
        hp = self.hp
        x = b.build_inp_embd(b.w(T.TOKEN_EMBD))
        pos = b.build_inp_pos()
        out_ids = b.build_inp_out_ids()
        for il in range(hp.n_layer):
            with b.layer(il):
                h = b.build_norm(x, b.w(T.ATTN_NORM, il), name="attn_norm")
                a = self.delta_net(b, h, il) if self.recurrent(il) else self.attention(b, h, pos, il)
                x = b.op("add", a, x, name="attn_residual")
                f = b.build_ffn(b.build_norm(x, b.w(T.ATTN_POST_NORM, il), name="attn_post_norm"),
                                up=b.w(T.FFN_UP, il), gate=b.w(T.FFN_GATE, il), down=b.w(T.FFN_DOWN, il))  # type: ignore[arg-type]
                x = b.op("add", f, x, name="l_out")
        x = b.build_norm(x, b.w(T.OUTPUT_NORM), name="result_norm.all")
        # llama.cpp keeps every row through the last layer and picks the requested ones after the final norm
        b.build_output(b.op("get_rows", x, out_ids, name="result_norm"), b.w(T.OUTPUT))


# ---- presets: released models of this family, as their converted GGUFs declare them ---------------------

L, A, R, S = Keys.LLM, Keys.Attention, Keys.Rope, Keys.SSM


presets.register({
    # Gated DeltaNet in three layers of four (16 key and 16 value heads of 128, conv kernel 4), gated attention
    # in every fourth (8 query heads and 2 KV heads of 256, a quarter of each head RoPE'd in M-RoPE sections);
    # converted without its multi-token-prediction layer (convert_hf_to_gguf --no-mtp), which graphir does not build.
    "Qwen3.5-0.8B": Preset("qwen35", {
        L.CONTEXT_LENGTH: 262144, L.EMBEDDING_LENGTH: 1024, L.BLOCK_COUNT: 24, L.FEED_FORWARD_LENGTH: 3584,
        A.HEAD_COUNT: 8, A.HEAD_COUNT_KV: 2, A.KEY_LENGTH: 256, A.VALUE_LENGTH: 256, R.FREQ_BASE: 10000000.0,
        R.DIMENSION_COUNT: 64, R.DIMENSION_SECTIONS: [11, 11, 10, 0], A.LAYERNORM_RMS_EPS: 1e-6,
        L.FULL_ATTENTION_INTERVAL: 4, S.CONV_KERNEL: 4, S.STATE_SIZE: 128, S.GROUP_COUNT: 16, S.TIME_STEP_RANK: 16,
        S.INNER_SIZE: 2048, L.VOCAB_SIZE: 248320,
    }, tied=True, f32=r"blk\.\d+\.ssm_conv1d\.weight", source="Qwen/Qwen3.5-0.8B config.json (text_config)"),
})
