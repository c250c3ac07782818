"""Model hyperparameters read from GGUF metadata, with llama.cpp's key names and defaults.

Keys come from the gguf package's templates (``gguf.Keys.LLM.CONTEXT_LENGTH`` = ``'{arch}.context_length'``),
so this module never spells a key by hand. Floats are rounded to float32 on the way in: GGUF stores them as
float32 and ggml op parameters are float32, so a preset saying ``1e-5`` and a file holding ``float32(1e-5)``
give the same graph.
"""

from __future__ import annotations

import struct
from dataclasses import asdict, dataclass, fields
from typing import Any, Mapping

from gguf import Keys, PoolingType

from graphir.errors import MetadataError


def f32(x: float) -> float:
    """Round to the nearest float32, as GGUF and ggml store it."""
    return struct.unpack("<f", struct.pack("<f", x))[0]


@dataclass(frozen=True)
class HParams:
    arch: str
    n_vocab: int
    n_ctx_train: int
    n_embd: int
    n_layer: int
    n_ff: int
    n_head: int
    n_head_kv: int
    n_embd_head_k: int
    n_embd_head_v: int
    n_rot: int
    rope_freq_base: float
    rope_freq_scale: float
    rope_scaling: str  # none | linear | yarn | longrope
    n_ctx_orig_yarn: int
    rope_attn_factor: float
    norm_eps: float
    norm_rms_eps: float
    attn_scale: float  # 0: use 1/sqrt(n_embd_head_k)
    causal: bool
    # Family fields: defaults mean "not this family"; printed only when set (see as_dict).
    pooling: str = "none"  # none | mean | cls | last | rank: how embedding models reduce a sequence
    n_token_types: int = 0  # rows of the token-type embedding (BERT)
    ssm_d_conv: int = 0  # Mamba: conv kernel width, inner size, state size, time-step rank
    ssm_d_inner: int = 0
    ssm_d_state: int = 0
    ssm_dt_rank: int = 0
    ssm_dt_b_c_rms: bool = False
    wkv_head_size: int = 0  # RWKV: head size, low-rank mix sizes, residual halving period, shift count
    time_mix_extra_dim: int = 0
    time_decay_extra_dim: int = 0
    rescale_every_n_layers: int = 0
    token_shift_count: int = 0

    @property
    def n_embd_k_gqa(self) -> int:
        return self.n_embd_head_k * self.n_head_kv

    @property
    def n_embd_v_gqa(self) -> int:
        return self.n_embd_head_v * self.n_head_kv

    @property
    def n_embd_r(self) -> int:
        """Floats of rolling state per sequence and layer: RWKV's token shifts or Mamba's conv columns."""
        if self.wkv_head_size:
            return self.token_shift_count * self.n_embd
        return max(self.ssm_d_conv - 1, 0) * self.ssm_d_inner

    @property
    def n_embd_s(self) -> int:
        """Floats of recurrent state per sequence and layer: RWKV's WKV matrices or Mamba's SSM state."""
        if self.wkv_head_size:
            return self.n_embd * self.wkv_head_size
        return self.ssm_d_state * self.ssm_d_inner

    def as_dict(self) -> dict[str, Any]:
        """Every common field, and the family fields a model sets (so graph headers stay family-sized)."""
        d = asdict(self)
        for f in fields(self)[_N_COMMON:]:
            if d[f.name] == f.default:
                del d[f.name]
        return d


_N_COMMON = [f.name for f in fields(HParams)].index("pooling")


class KeyReader:
    """Typed access to ``<arch>.*`` keys that names the file and key in every error."""

    def __init__(self, label: str, metadata: Mapping[str, Any], arch: str):
        self.label, self.md, self.arch = label, metadata, arch

    def key(self, template: str) -> str:
        return template.format(arch=self.arch)

    def get(self, template: str, kind: type, default: Any = None, required: bool = False) -> Any:
        k = self.key(template)
        if k not in self.md:
            if required:
                raise MetadataError(f"{self.label}: missing key '{k}'")
            return default
        v = self.md[k]
        if isinstance(v, list):
            raise MetadataError(f"{self.label}: key '{k}' is a per-layer array; only one value for all layers "
                                f"is supported")
        if kind is float and isinstance(v, (int, float)) and not isinstance(v, bool):
            return f32(float(v))
        if kind is int and isinstance(v, int) and not isinstance(v, bool):
            return v
        if kind in (bool, str) and isinstance(v, kind):
            return v
        raise MetadataError(f"{self.label}: key '{k}' should be {kind.__name__}, got {type(v).__name__} {v!r}")


def read_hparams(label: str, metadata: Mapping[str, Any], arch: str, required: tuple[str, ...] = (),
                 causal: bool = True) -> HParams:
    """The hparams every architecture shares; ``required`` names extra key templates the arch cannot do without."""
    r = KeyReader(label, metadata, arch)
    for template in required:
        if r.key(template) not in metadata:
            raise MetadataError(f"{label}: missing key '{r.key(template)}'")
    L, A, R, S = Keys.LLM, Keys.Attention, Keys.Rope, Keys.SSM
    n_embd = r.get(L.EMBEDDING_LENGTH, int, required=True)
    n_head = r.get(A.HEAD_COUNT, int, 0)
    n_head_kv = r.get(A.HEAD_COUNT_KV, int, n_head)
    head_k = r.get(A.KEY_LENGTH, int, n_embd // n_head if n_head else 0)
    head_v = r.get(A.VALUE_LENGTH, int, n_embd // n_head if n_head else 0)
    n_vocab = r.get(L.VOCAB_SIZE, int, None)
    if n_vocab is None:
        tokens = metadata.get(Keys.Tokenizer.LIST)
        n_vocab = len(tokens) if isinstance(tokens, list) else 0
    scaling = r.get(R.SCALING_TYPE, str, "linear")
    factor = r.get(R.SCALING_FACTOR, float, 0.0) or r.get("{arch}.rope.scale_linear", float, 0.0)
    n_ctx_train = r.get(L.CONTEXT_LENGTH, int, required=True)
    if n_head and n_embd % n_head and A.KEY_LENGTH.format(arch=arch) not in metadata:
        raise MetadataError(f"{label}: n_embd {n_embd} is not divisible by n_head {n_head}")
    return HParams(
        arch=arch,
        n_vocab=n_vocab,
        n_ctx_train=n_ctx_train,
        n_embd=n_embd,
        n_layer=r.get(L.BLOCK_COUNT, int, required=True),
        n_ff=r.get(L.FEED_FORWARD_LENGTH, int, 0),
        n_head=n_head,
        n_head_kv=n_head_kv,
        n_embd_head_k=head_k,
        n_embd_head_v=head_v,
        n_rot=r.get(R.DIMENSION_COUNT, int, head_k),
        rope_freq_base=r.get(R.FREQ_BASE, float, f32(10000.0)),
        rope_freq_scale=f32(1.0 / factor) if factor and scaling != "none" else 1.0,
        rope_scaling=scaling,
        n_ctx_orig_yarn=r.get(R.SCALING_ORIG_CTX_LEN, int, n_ctx_train),
        rope_attn_factor=r.get(R.SCALING_ATTN_FACTOR, float, 1.0),
        norm_eps=r.get(A.LAYERNORM_EPS, float, 0.0),
        norm_rms_eps=r.get(A.LAYERNORM_RMS_EPS, float, 0.0),
        attn_scale=r.get(A.SCALE, float, 0.0),
        causal=r.get(A.CAUSAL, bool, causal),
        pooling=_pooling(r),
        n_token_types=_int_key(label, metadata, Keys.Tokenizer.TOKEN_TYPE_COUNT),
        ssm_d_conv=r.get(S.CONV_KERNEL, int, 0),
        ssm_d_inner=r.get(S.INNER_SIZE, int, 0),
        ssm_d_state=r.get(S.STATE_SIZE, int, 0),
        ssm_dt_rank=r.get(S.TIME_STEP_RANK, int, 0),
        ssm_dt_b_c_rms=r.get(S.DT_B_C_RMS, bool, False),
        wkv_head_size=r.get(Keys.WKV.HEAD_SIZE, int, 0),
        time_mix_extra_dim=r.get(L.TIME_MIX_EXTRA_DIM, int, 0),
        time_decay_extra_dim=r.get(L.TIME_DECAY_EXTRA_DIM, int, 0),
        rescale_every_n_layers=r.get(L.RESCALE_EVERY_N_LAYERS, int, 0),
        token_shift_count=r.get(L.TOKEN_SHIFT_COUNT, int, 0),
    )


def _pooling(r: KeyReader) -> str:
    v = r.get(Keys.LLM.POOLING_TYPE, int, 0)
    try:
        return PoolingType(v).name.lower()
    except ValueError:
        raise MetadataError(f"{r.label}: key '{r.key(Keys.LLM.POOLING_TYPE)}' has unknown pooling type {v}") from None


def _int_key(label: str, metadata: Mapping[str, Any], key: str) -> int:
    v = metadata.get(key, 0)
    if not isinstance(v, int) or isinstance(v, bool):
        raise MetadataError(f"{label}: key '{key}' should be int, got {type(v).__name__} {v!r}")
    return v
