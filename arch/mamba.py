"""Mamba (v1) and Mamba-2: selective state-space models, no attention. Each layer mixes tokens through a short
causal convolution and a recurrent scan whose step size, input and output maps depend on the token; Mamba-2
scans per head with a scalar decay, shares B and C within groups of heads, and gates a grouped RMS norm.

The conv columns and the SSM state of each sequence live in the context's recurrent memory; the graph
reads them (``build_rs``) and writes the new ones (``store_rs``). Tokens arrive as ``n_seqs`` sequences of
``n_seq_tokens`` each. Reference: Gu & Dao 2023, "Mamba"; Dao & Gu 2024, "Transformers are SSMs" (Mamba-2);
llama.cpp src/models/mamba.cpp, mamba2.cpp, mamba-base.cpp.
"""

from __future__ import annotations

from typing import ClassVar

from gguf import MODEL_TENSOR as T
from gguf import Keys

from graphir.model import ssm
from graphir.model.architecture import Architecture
from graphir.model.builder import GraphBuilder
from graphir.model.hparams import HParams, Key
from graphir.memory.layers import LayerNeeds
from graphir.model.tensors import TensorSpec, spec, tensor_name
from graphir.model import presets
from graphir.model.presets import Preset


class Mamba(Architecture):
    """Mamba (``version`` 1); Mamba-2 is the same decoder with the other mixer, as in llama.cpp's mamba.cpp."""

    name = "mamba"
    version: ClassVar[int] = 1
    required_keys = (Keys.Attention.LAYERNORM_RMS_EPS,)
    keys = ssm.SSM_KEYS + (Key("ssm_dt_b_c_rms", Keys.SSM.DT_B_C_RMS, bool, False),)

    def __init__(self, hp: HParams):
        if self.version == 2:
            ssm.check_mamba2(hp)
        super().__init__(hp)

    def layers(self) -> LayerNeeds:
        hp = self.hp
        return (ssm.recurrent_state(hp, ssm.mamba2_conv_dim(hp) if self.version == 2 else hp.ssm_d_inner),) * hp.n_layer

    def tensors(self) -> list[TensorSpec]:
        hp = self.hp
        E = hp.n_embd
        mixer = ssm.mamba2_tensors if self.version == 2 else ssm.mamba_tensors
        specs = [
            spec(T.TOKEN_EMBD, (E, hp.n_vocab)),
            spec(T.OUTPUT_NORM, (E,), kind="vector"),
            spec(T.OUTPUT, (E, hp.n_vocab), tied_to=tensor_name(T.TOKEN_EMBD)),
        ]
        for il in range(hp.n_layer):
            specs += [spec(T.ATTN_NORM, (E,), il, kind="vector"), *mixer(hp, il)]
        return specs

    def build(self, b: GraphBuilder) -> None:
        x = b.build_inp_embd(b.w(T.TOKEN_EMBD))
        for il in b.layers():
            h = b.norm(x, T.ATTN_NORM, il, name="attn_norm")
            h = ssm.mamba2_layer(b, h, il) if self.version == 2 else ssm.mamba_layer(b, h, il)
            h = b.reshape(h, (self.hp.n_embd, b.n_tokens), name="ssm_out.tokens")
            h, x = b.last_layer_rows((h, "ssm_out.rows"), (x, "inp.rows"))
            x = b.op("add", h, x, name="l_out")
        x = b.norm(x, T.OUTPUT_NORM, name="result_norm")
        b.build_output(x, b.w(T.OUTPUT))


class Mamba2(Mamba):
    """Mamba-2: per-head scalar decay, B and C shared within groups of heads, a gated grouped RMS norm."""

    name = "mamba2"
    version = 2
    keys = ssm.MAMBA2_KEYS


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
