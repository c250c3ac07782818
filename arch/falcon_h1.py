"""Falcon-H1 (TII): attention and a Mamba-2 mixer side by side in every layer, read from the same norm.

Each layer is ``x += attn(n) + mamba2(n)`` with n = RMSNorm(x), then ``x += ffn(RMSNorm(x))``, a SwiGLU whose
matrices may carry biases. Attention is grouped-query with NeoX RoPE, its scores by 1/sqrt(head size); an output
bias or a ``rope_freqs`` vector in a file is loaded and left out, as llama.cpp's graph leaves them. The Mamba-2
block is the one Mamba-2 and Granite 4.0-H use (graphir/model/ssm.py), its grouped norm optional. The model's muP
multipliers are folded into the weights by the converter, so the graph has none. Every layer keeps both a K/V
row per token and a recurrent state per sequence: the hybrid memory serves the two needs of one layer from its two
parts, as llama.cpp's hybrid memory does with both of its layer filters true for every layer. The FFN norm's
tensor has no ``.weight`` suffix (``blk.<il>.ffn_norm``), the name llama.cpp's loader asks for.
References: TII 2025, "Falcon-H1: A Family of Hybrid-Head Language Models"; llama.cpp src/models/falcon-h1.cpp.
"""

from __future__ import annotations

from gguf import MODEL_TENSOR as T
from gguf import Keys

from graphir.memory.layers import LayerNeeds
from graphir.model import hf_config, presets, ssm
from graphir.model.architecture import Architecture
from graphir.model.builder import GraphBuilder, Norm
from graphir.model.hf_config import TEXT, VOCAB, Config, Family, derived, hf
from graphir.model.hparams import HParams
from graphir.model.presets import Preset
from graphir.model.qkv import fused_or_split_qkv_tensors, roped_attention
from graphir.model.rope_factors import rope_factor_tensors
from graphir.model.scales import layer_scales
from graphir.model.tensors import TensorSpec, spec, tensor_name

L, A, R, S = Keys.LLM, Keys.Attention, Keys.Rope, Keys.SSM


class FalconH1(Architecture):
    name = "falcon-h1"
    rope_mode = "neox"
    required_keys = (L.FEED_FORWARD_LENGTH, A.HEAD_COUNT, A.LAYERNORM_RMS_EPS)
    keys = ssm.MAMBA2_KEYS

    def __init__(self, hp: HParams):
        ssm.check_mamba2(hp)
        super().__init__(hp)

    def layers(self) -> LayerNeeds:
        """Every layer: its attention's K/V rows and its Mamba-2 state."""
        state = ssm.recurrent_state(self.hp, ssm.mamba2_conv_dim(self.hp))
        return tuple((attention, state) for attention in super().layers())

    def tensors(self) -> list[TensorSpec]:
        hp = self.hp
        E, F, V = hp.n_embd, hp.n_ff, hp.n_vocab
        specs = [spec(T.TOKEN_EMBD, (E, V)), spec(T.OUTPUT_NORM, (E,), kind="vector"),
                 spec(T.OUTPUT, (E, V), tied_to=tensor_name(T.TOKEN_EMBD)), *rope_factor_tensors(hp)]
        for il in range(hp.n_layer):
            layer = [*fused_or_split_qkv_tensors(hp, il), spec(T.ATTN_OUT, (hp.head_count(il) * hp.n_embd_head_v, E), il),
                     spec(T.FFN_GATE, (E, F), il), spec(T.FFN_UP, (E, F), il), spec(T.FFN_DOWN, (F, E), il)]
            specs += [spec(T.ATTN_NORM, (E,), il, kind="vector"), *layer, *layer_scales(layer, il),
                      spec(T.ATTN_OUT, (E,), il, "bias", kind="vector", optional=True),
                      *ssm.mamba2_tensors(hp, il, norm_optional=True),
                      spec(T.FFN_NORM, (E,), il, None, kind="vector"),
                      *(spec(t, (n,), il, "bias", kind="vector", optional=True)
                        for t, n in ((T.FFN_GATE, F), (T.FFN_UP, F), (T.FFN_DOWN, E)))]
        return specs

    def build(self, b: GraphBuilder) -> None:
        w, w_opt = b.w, b.w_opt
        x = b.build_inp_embd(w(T.TOKEN_EMBD))
        pos = b.build_inp_pos()
        for il in b.layers():
            h = b.norm(x, T.ATTN_NORM, il, name="attn_norm")
            # attention and the Mamba-2 mixer, both from the same norm
            mixed = b.op("add", roped_attention(b, h, pos, il), ssm.mamba2_layer(b, h, il), name="layer_out")
            x = b.op("add", mixed, x, name="ffn_inp")
            (x,) = b.last_layer_rows((x, "ffn_inp.rows"))
            # the FFN (llama.cpp's graph passes none of its matrices' scales)
            f = b.build_ffn(b.build_norm(x, w(T.FFN_NORM, il, None), None, Norm.RMS, name="ffn_norm"),
                            up=w(T.FFN_UP, il), up_b=w_opt(T.FFN_UP, il, "bias"), gate=w(T.FFN_GATE, il),
                            gate_b=w_opt(T.FFN_GATE, il, "bias"), down=w(T.FFN_DOWN, il),
                            down_b=w_opt(T.FFN_DOWN, il, "bias"))
            x = b.op("add", f, x, name="l_out")
        b.build_output(b.norm(x, T.OUTPUT_NORM, name="result_norm"), w(T.OUTPUT))


# ---- Hugging Face: convert_hf_to_gguf's FalconH1Model (a Mamba2Model whose keys may carry a "mamba_" prefix) --


def _mamba(c: Config, *names: str) -> int:
    return c.find(*names, *(f"mamba_{n}" for n in names))


def _norm(c: Config) -> str:
    """The Mamba-2 blocks' grouped norm, which a checkpoint has where mamba_rms_norm is set."""
    return r"|blk\.\d+\.ssm_norm\.weight" if c.find("mamba_rms_norm", kind="flag", default=False) else ""


hf_config.register(Family("falcon-h1", TEXT + (
    VOCAB,
    hf(A.LAYERNORM_RMS_EPS, "rms_norm_eps", "layer_norm_epsilon", kind="number"),
    derived(S.CONV_KERNEL, lambda c: _mamba(c, "d_conv")),
    derived(S.INNER_SIZE, lambda c: _mamba(c, "d_ssm")),
    derived(S.STATE_SIZE, lambda c: _mamba(c, "d_state")),
    derived(S.TIME_STEP_RANK, lambda c: _mamba(c, "d_ssm") // _mamba(c, "d_head")),
    derived(S.GROUP_COUNT, lambda c: _mamba(c, "n_groups")),
), {"tie_word_embeddings": False}, lambda c: presets.SPLIT_QKV + _norm(c)), "FalconH1ForCausalLM")


# ---- presets -----------------------------------------------------------------------------------------------

presets.register({
    # 1.5B: 24 layers of width 2048; attention of 8 heads of 128 sharing 2 K/V heads beside Mamba-2 of 48 heads of
    # 64 (inner 3072) in one group with 256 states; a SwiGLU of 8192; RoPE base 1e11 over 128k positions
    "Falcon-H1-1.5B": Preset("falcon-h1", {
        L.CONTEXT_LENGTH: 131072, L.EMBEDDING_LENGTH: 2048, L.BLOCK_COUNT: 24, L.FEED_FORWARD_LENGTH: 8192,
        A.HEAD_COUNT: 8, A.HEAD_COUNT_KV: 2, A.KEY_LENGTH: 128, A.VALUE_LENGTH: 128, R.FREQ_BASE: 1e11,
        A.LAYERNORM_RMS_EPS: 1e-5, S.CONV_KERNEL: 4, S.INNER_SIZE: 3072, S.STATE_SIZE: 256, S.TIME_STEP_RANK: 48,
        S.GROUP_COUNT: 1, L.VOCAB_SIZE: 65537,
    }, tied=False, include=presets.SPLIT_QKV, f32=r"blk\.\d+\.ssm_(conv1d\.weight|a|d)",
        source="tiiuae/Falcon-H1-1.5B-Base config.json (mamba_rms_norm false: no grouped norm)"),
})
