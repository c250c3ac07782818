"""The per-tensor scales llama.cpp's loader looks for beside a layer's matrices, whatever the family.

After a family's own tensors, llama.cpp's loader (its generic pass in ``llama_model::load_tensors``) creates as
optional a ``.scale`` (one value; one per expert for a stack of experts) and an ``.input_scale`` beside each
matrix of the layer roles it knows: the attention projections, the FFN's, the shared and routed experts', the
state-space projections. They are named ``blk.<il>.<role>`` whatever name the family gives the matrix itself.
A file may hold them (a model llama.cpp makes itself holds every one): a family declares them, multiplies in the
weight scales its llama.cpp graph passes on (through the builder's ``linear``), and reads no input scale.
"""

from __future__ import annotations

from typing import Iterable

from gguf import MODEL_TENSOR as T

from graphir.model.tensors import TensorSpec, spec, tensor_name

SCALED = (T.ATTN_Q, T.ATTN_K, T.ATTN_V, T.ATTN_OUT, T.ATTN_QKV, T.ATTN_GATE, T.FFN_GATE, T.FFN_DOWN, T.FFN_UP,
          T.FFN_GATE_SHEXP, T.FFN_DOWN_SHEXP, T.FFN_UP_SHEXP, T.FFN_GATE_EXP, T.FFN_DOWN_EXP, T.FFN_UP_EXP,
          T.SSM_IN, T.SSM_OUT, T.SSM_ALPHA, T.SSM_BETA)
PER_EXPERT = (T.FFN_GATE_EXP, T.FFN_DOWN_EXP, T.FFN_UP_EXP)


def scale_specs(il: int, roles: Iterable[T], n_expert: int = 0) -> list[TensorSpec]:
    """The optional scale and input scale of layer ``il``'s matrix of each role (one of :data:`SCALED`)."""
    return [spec(t, (n_expert if t in PER_EXPERT else 1,), il, suffix, kind="vector", optional=True)
            for t in roles for suffix in ("scale", "input_scale")]


def layer_scales(layer: Iterable[TensorSpec], il: int, n_expert: int = 0) -> list[TensorSpec]:
    """The scales of the matrices a layer's tensors name as llama.cpp names its roles (``blk.<il>.attn_q``, ...)."""
    names = {s.name for s in layer}
    return scale_specs(il, (t for t in SCALED if tensor_name(t, il) in names), n_expert)
