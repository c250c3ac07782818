"""RoPE's learned frequency divisors, as llama.cpp's loaders declare them and ``llama_model::get_rope_factors``
picks them: one ``rope_freqs`` vector (Llama 3.1's), or under LongRoPE a long and a short one, the long for
contexts of more cells per sequence than the original training context. Each is optional and shared by every
layer (llama.cpp loads it once and duplicates it)."""

from __future__ import annotations

from gguf import MODEL_TENSOR as T

from graphir.graph.ir import Node
from graphir.model.builder import GraphBuilder
from graphir.model.hparams import HParams
from graphir.model.tensors import TensorSpec, spec, tensor_name


def longrope(hp: HParams) -> bool:
    return hp.rope_scaling == "longrope"


def rope_factor_tensors(hp: HParams, long_short: bool | None = None, n_rot: int | None = None) -> list[TensorSpec]:
    """The optional factor vectors of ``n_rot`` rotated dims (the model's): long and short ones where
    ``long_short`` (None: under LongRoPE), else ``rope_freqs``."""
    n = (hp.n_rot if n_rot is None else n_rot) // 2
    if longrope(hp) if long_short is None else long_short:
        return [spec(T.ROPE_FACTORS_LONG, (n,), kind="vector", optional=True),
                spec(T.ROPE_FACTORS_SHORT, (n,), kind="vector", optional=True)]
    return [spec(T.ROPE_FREQS, (n,), kind="vector", optional=True)]


def long_context(hp: HParams, n_ctx_seq: int) -> bool:
    """Whether a context of ``n_ctx_seq`` cells per sequence takes the long factors (0: unspecified, short)."""
    return n_ctx_seq > hp.n_ctx_orig_yarn


def rope_factors(b: GraphBuilder) -> Node | None:
    """The factors the graph divides by: ``rope_freqs`` where the family declares it, else the long or short ones
    for the builder's context (None: the file has none)."""
    if tensor_name(T.ROPE_FREQS) in b.arch.specs:
        return b.w_opt(T.ROPE_FREQS)
    return b.w_opt(T.ROPE_FACTORS_LONG if long_context(b.hp, b.n_ctx_seq) else T.ROPE_FACTORS_SHORT)
