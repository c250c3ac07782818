"""The architecture interface and registry: hparams in, expected tensors and a graph out.

An architecture subclass registers itself under its GGUF ``general.architecture`` name when its module is
imported; ``graphir.arch`` maps names to modules so that only the family asked for is imported. Tensor
names come from the gguf package's tables (``gguf.TENSOR_NAMES``, see :mod:`graphir.tensors`), never from
string literals.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, Mapping

from graphir.hparams import HParams, read_hparams
from graphir.tensors import TensorDecl, TensorSpec

if TYPE_CHECKING:
    from graphir.builder import GraphBuilder

REGISTRY: dict[str, type[Architecture]] = {}


class Architecture:
    """Subclass per model family; set ``name`` to the GGUF architecture string to register it."""

    name: ClassVar[str]
    rope_mode: ClassVar[str] = "none"  # norm (adjacent pairs) | neox (split halves) | none
    required_keys: ClassVar[tuple[str, ...]] = ()  # gguf.Keys templates beyond the common required ones
    # Optional keys whose default is this family's own in llama.cpp (llama_hparams / load_hparams), by template:
    # a GGUF that leaves them out means these values, and gives the same graph as one that spells them.
    key_defaults: ClassVar[Mapping[str, Any]] = {}
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
        defaults = {k.format(arch=cls.name): v for k, v in cls.key_defaults.items()}
        return cls(read_hparams(label, {**defaults, **metadata}, cls.name, cls.required_keys, cls.causal))

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
