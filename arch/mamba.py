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
from graphir.model.hparams import HParams
from graphir.memory.layers import LayerNeeds
from graphir.model.tensors import TensorSpec, spec, tensor_name
from graphir.model import presets
from graphir.model.presets import Preset
from graphir.model import hf_config
from graphir.model.hf_config import BLOCKS, WIDTH, Config, Family, Rule, derived, fixed, hf


class Mamba(Architecture):
    """Mamba (``version`` 1); Mamba-2 is the same decoder with the other mixer, as in llama.cpp's mamba.cpp."""

    name = "mamba"
    version: ClassVar[int] = 1
    required_keys = (Keys.Attention.LAYERNORM_RMS_EPS,)
    keys = ssm.MAMBA_KEYS

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


# ---- Hugging Face: the keys convert_hf_to_gguf writes for MambaForCausalLM and Mamba2ForCausalLM ------------------

def _mamba_inner(c: Config) -> int:
    d_model, d_inner = c.find("hidden_size", "d_model"), c.find("intermediate_size", "d_inner", default=None)
    if d_inner is not None and d_inner != 2 * d_model:
        raise c.error(f"intermediate_size {d_inner} is not twice hidden_size {d_model} (Mamba's expansion of 2)")
    return 2 * d_model


def _mamba_dt_rank(c: Config) -> int:
    """time_step_rank, or ("auto", absent) a sixteenth of the width, rounded up."""
    if c.find("time_step_rank", "dt_rank", kind="any", default="auto") == "auto":
        return -(c.find("hidden_size", "d_model") // -16)
    return c.find("time_step_rank", "dt_rank")


# what the converter's Mamba and Mamba-2 models both write
_SSM_BASE: tuple[Rule, ...] = (
    fixed(L.CONTEXT_LENGTH, 1 << 20),  # the converter's stand-in: Mamba is not context-limited
    fixed(L.FEED_FORWARD_LENGTH, 0),
    fixed(A.HEAD_COUNT, 0),
    hf(L.BLOCK_COUNT, *BLOCKS),
    hf(S.CONV_KERNEL, "conv_kernel", "d_conv", default=4),
    hf(A.LAYERNORM_RMS_EPS, "layer_norm_epsilon", "rms_norm_eps", kind="number", default=1e-5),
)
MAMBA = _SSM_BASE + (
    hf(L.EMBEDDING_LENGTH, "hidden_size", "d_model"),
    derived(S.INNER_SIZE, _mamba_inner),
    hf(S.STATE_SIZE, "state_size", "d_state", default=16),
    derived(S.TIME_STEP_RANK, _mamba_dt_rank),
    derived(S.DT_B_C_RMS, lambda c: c.doc.get("model_type") == "falcon_mamba"),
)


def _mamba2_inner(c: Config) -> int:
    expand = c.find("mamba_expand", "expand", default=2)
    return c.find("mamba_d_ssm", "intermediate_size", "d_inner", default=None) or expand * c.find(*WIDTH, "d_model")


def _mamba2_heads(c: Config) -> int:
    head = c.find("mamba_d_head", "head_dim", default=64)
    inner = _mamba2_inner(c)
    if inner % head:
        raise c.error(f"the inner size {inner} is not a multiple of the head size {head} (mamba_d_head)")
    return inner // head


MAMBA2 = _SSM_BASE + (
    hf(L.EMBEDDING_LENGTH, *WIDTH, "d_model"),
    derived(S.INNER_SIZE, _mamba2_inner),
    hf(S.STATE_SIZE, "state_size", "d_state", default=128),
    derived(S.TIME_STEP_RANK, _mamba2_heads),
    hf(S.GROUP_COUNT, "n_groups", default=1),
)



_PAD = "pad_vocab_size_multiple"
hf_config.register(Family("mamba", MAMBA, {"tie_word_embeddings": True}, pad_vocab=8, pad_vocab_key=_PAD,
                          tie_drops_head=True), "MambaForCausalLM")
hf_config.register(Family("mamba2", MAMBA2, {"tie_word_embeddings": False}, pad_vocab=16, pad_vocab_key=_PAD),
                   "Mamba2ForCausalLM")
