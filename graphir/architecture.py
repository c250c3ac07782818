"""The architecture interface and registry: hparams in, expected tensors and a graph out.

An architecture subclass registers itself under its GGUF ``general.architecture`` name when its module is
imported; ``graphir.arch`` maps names to modules so that only the family asked for is imported. Tensor
names come from the gguf package's tables (``gguf.TENSOR_NAMES``), never from string literals.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Mapping, Protocol

from gguf import GGML_QUANT_SIZES, TENSOR_NAMES, GGMLQuantizationType, MODEL_TENSOR

from graphir.hparams import HParams, read_hparams

if TYPE_CHECKING:
    from graphir.builder import GraphBuilder

REGISTRY: dict[str, type[Architecture]] = {}

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

    def problem(self, shape: tuple[int, ...], dtype: GGMLQuantizationType) -> str | None:
        """Why a declared tensor does not fit this spec, or None."""
        if tuple(shape) != self.shape:
            return f"has shape {list(shape)}, expected {list(self.shape)}"
        if self.kind == "vector" and dtype != GGMLQuantizationType.F32:
            return f"has type {dtype_name(dtype)}, expected f32"
        if dtype.name in _NOT_WEIGHTS:
            return f"has type {dtype_name(dtype)}, which is not a weight type"
        block = GGML_QUANT_SIZES[dtype][0]
        if shape[0] % block:
            return f"has type {dtype_name(dtype)} whose {block}-element blocks do not divide ne0={shape[0]}"
        return None


def spec(t: MODEL_TENSOR, shape: tuple[int, ...], il: int | None = None, suffix: str = "weight",
         **kw: Any) -> TensorSpec:
    """A TensorSpec named from gguf's tensor table: ``spec(ATTN_Q, (E, E), il=3)`` -> ``blk.3.attn_q.weight``."""
    return TensorSpec(tensor_name(t, il, suffix), shape, **kw)


class TensorDecl(Protocol):
    shape: tuple[int, ...]
    dtype: GGMLQuantizationType


class Architecture:
    """Subclass per model family; set ``name`` to the GGUF architecture string to register it."""

    name: ClassVar[str]
    rope_mode: ClassVar[str] = "none"  # norm (adjacent pairs) | neox (split halves) | none
    required_keys: ClassVar[tuple[str, ...]] = ()  # gguf.Keys templates beyond the common required ones
    causal: ClassVar[bool] = True
    # Context kinds this family runs with, the default first (llama.cpp's create_memory, as data).
    contexts: ClassVar[tuple[str, ...]] = ("kv", "none")
    learned_positions: ClassVar[bool] = False  # positions index a trained table: none beyond n_ctx_train

    def __init_subclass__(cls, **kw: Any) -> None:
        super().__init_subclass__(**kw)
        if "name" in cls.__dict__:
            REGISTRY[cls.name] = cls

    def __init__(self, hp: HParams):
        self.hp = hp
        self.specs = {s.name: s for s in self.tensors()}

    @classmethod
    def from_metadata(cls, label: str, metadata: Mapping[str, Any]) -> Architecture:
        return cls(read_hparams(label, metadata, cls.name, cls.required_keys, cls.causal))

    def tensors(self) -> list[TensorSpec]:
        raise NotImplementedError

    def build(self, b: GraphBuilder) -> None:
        raise NotImplementedError

    def check(self, tensors: Mapping[str, TensorDecl]) -> list[str]:
        """Every way the declared tensors differ from the expected ones, one line each (empty: all fit)."""
        out = []
        for name, spec in self.specs.items():
            t = tensors.get(name)
            if t is None:
                if not (spec.optional or spec.tied_to):
                    out.append(f"missing tensor '{name}'")
                continue
            why = spec.problem(tuple(t.shape), t.dtype)
            if why:
                out.append(f"tensor '{name}' {why}")
        out += [f"unexpected tensor '{n}'" for n in tensors if n not in self.specs]
        return out
