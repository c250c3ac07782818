"""Tensor declarations: the GGUF names and the shapes and types a model's tensors may have.

Shared by the architectures (which declare what they expect), the builder (which turns declarations into
weight nodes) and ``graphir check``; it knows neither architectures nor graphs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from gguf import GGML_QUANT_SIZES, TENSOR_NAMES, GGMLQuantizationType, MODEL_TENSOR

_NOT_WEIGHTS = {"I8", "I16", "I32", "I64", "F64"}


def dtype_name(t: GGMLQuantizationType) -> str:
    return t.name.lower()


def tensor_name(t: MODEL_TENSOR, il: int | None = None, suffix: str | None = "weight") -> str:
    base = TENSOR_NAMES[t].format(bid=il) if il is not None else TENSOR_NAMES[t]
    return f"{base}.{suffix}" if suffix else base


@dataclass(frozen=True)
class TensorSpec:
    """A tensor an architecture expects: GGUF name, ggml-order shape, what types it may have."""

    name: str
    shape: tuple[int, ...]
    kind: str = "matrix"  # matrix: any float or block-quantized type; vector: f32 only
    optional: bool = False
    tied_to: str | None = None  # absent => this other tensor's data serves (tied LM head)
    also: tuple[int, ...] = ()  # another shape the loader takes, the graph following the file's (Laguna's gate)

    def problem(self, shape: tuple[int, ...], dtype: GGMLQuantizationType) -> str | None:
        """Why a declared tensor does not fit this spec, or None. Shapes compare as llama.cpp's loader compares
        them (``check_tensor_dims``): a missing trailing dimension is 1, so ``[n]`` fits ``[n, 1, 1]``."""
        if not (same_shape(shape, self.shape) or self.also and same_shape(shape, self.also)):
            return f"has shape {list(shape)}, expected {list(self.shape)}" + (f" or {list(self.also)}" if self.also
                                                                                else "")
        if self.kind == "vector" and dtype != GGMLQuantizationType.F32:
            return f"has type {dtype_name(dtype)}, expected f32"
        if dtype.name in _NOT_WEIGHTS:
            return f"has type {dtype_name(dtype)}, which is not a weight type"
        block = GGML_QUANT_SIZES[dtype][0]
        if shape[0] % block:
            return f"has type {dtype_name(dtype)} whose {block}-element blocks do not divide ne0={shape[0]}"
        return None


def same_shape(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    """Equal shapes, trailing dimensions of 1 aside (ggml pads every shape to four dimensions with 1s)."""
    def core(s: tuple[int, ...]) -> tuple[int, ...]:
        s = tuple(s)
        while s and s[-1] == 1:
            s = s[:-1]
        return s
    return core(a) == core(b)


def spec(t: MODEL_TENSOR, shape: tuple[int, ...], il: int | None = None, suffix: str = "weight",
         **kw: Any) -> TensorSpec:
    """A TensorSpec named from gguf's tensor table: ``spec(ATTN_Q, (E, E), il=3)`` -> ``blk.3.attn_q.weight``."""
    return TensorSpec(tensor_name(t, il, suffix), shape, **kw)


def swiglu_tensors(n_embd: int, n_ff: int, il: int) -> list[TensorSpec]:
    """Layer il's dense SwiGLU FFN: gate, down and up, all required."""
    return [spec(MODEL_TENSOR.FFN_GATE, (n_embd, n_ff), il), spec(MODEL_TENSOR.FFN_DOWN, (n_ff, n_embd), il),
            spec(MODEL_TENSOR.FFN_UP, (n_embd, n_ff), il)]


def with_bias(t: MODEL_TENSOR, shape: tuple[int, ...], il: int | None = None, *, optional: bool = False,
              bias_optional: bool = False) -> list[TensorSpec]:
    """A weight and its bias, which spans the weight's output dimension (``shape[-1]``); a 1-D weight (a
    LayerNorm's scale) is a vector like its bias."""
    return [spec(t, shape, il, kind="vector" if len(shape) == 1 else "matrix", optional=optional),
            spec(t, shape[-1:], il, "bias", kind="vector", optional=optional or bias_optional)]


def scales(t: MODEL_TENSOR, il: int | None = None, n: int = 1) -> list[TensorSpec]:
    """The per-tensor scales llama.cpp's loader takes, optional, beside any weight of its list (q/k/v/o, FFN,
    experts: one per expert, SSM projections): ``.scale`` [n], which the graph multiplies the product by, and
    ``.input_scale`` [n], which it loads and leaves unread."""
    return [spec(t, (n,), il, suffix, kind="vector", optional=True) for suffix in ("scale", "input_scale")]


class TensorDecl(Protocol):
    shape: tuple[int, ...]
    dtype: GGMLQuantizationType
