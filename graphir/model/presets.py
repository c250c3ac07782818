"""Built-in metadata of well-known models, usable anywhere a GGUF path is: a 405B graph needs no file.

Each preset is the ``<arch>.*`` metadata a converted GGUF would carry (figures from the public model
configs) plus a type policy for its tensors; each family module registers the presets of its models. The tensor table itself is derived from the architecture's
expected tensors, so presets can never drift from what the architecture declares.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from gguf import GGMLQuantizationType as Q
from gguf import Keys

from graphir.model.discovery import discover

L, A, R, S = Keys.LLM, Keys.Attention, Keys.Rope, Keys.SSM


@dataclass(frozen=True)
class Preset:
    arch: str
    keys: dict[str, object]  # key template ('{arch}.block_count') -> value
    tied: bool  # no output.weight: the LM head reuses token_embd
    matrix_type: Q = Q.F16  # convert_hf_to_gguf's default output type
    overrides: dict[str, Q] = field(default_factory=dict)
    include: str = ""  # regex: optional tensors the converter writes (Llama-3.1's rope_freqs, BERT's q/k/v)
    f32: str = ""  # regex: matrices the converter keeps in f32 (position tables, state-space parameters)
    source: str = ""
    squeezed: str = ""  # regex: tensors the converter writes without their trailing dimensions of 1 (RWKV6's lerps)
    other_shape: str = ""  # regex: tensors the converter writes in the family's other shape (TensorSpec.also)
    # a tower's tensors whose sizes no key gives, by name: their shapes (Ultravox's projector, Tower.widths)
    tensor_shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)

    def declares(self, name: str, optional: bool) -> bool:
        return not optional or bool(self.include and re.fullmatch(self.include, name))

    def dtype(self, name: str, vector: bool) -> Q:
        if vector or self.f32 and re.fullmatch(self.f32, name):
            return Q.F32
        return self.overrides.get(name, self.matrix_type)

    def shape(self, name: str, shape: tuple[int, ...], also: tuple[int, ...] = ()) -> tuple[int, ...]:
        """The tensor's shape in the converted file: the family's (its other one, ``also``, where the converter
        writes that), squeezed where the converter squeezes it."""
        if also and self.other_shape and re.fullmatch(self.other_shape, name):
            shape = also
        if not (self.squeezed and re.fullmatch(self.squeezed, name)):
            return shape
        while len(shape) > 1 and shape[-1] == 1:
            shape = shape[:-1]
        return shape

    def metadata(self) -> dict[str, object]:
        md: dict[str, object] = {Keys.General.ARCHITECTURE: self.arch}
        md.update({k.format(arch=self.arch): v for k, v in self.keys.items()})
        return md


# Tensors the converter writes in a form of its own, named by the presets of several families:
ROUTER_F32 = r"blk\.\d+\.ffn_gate_inp\.weight"  # MoE routers, kept in f32
SPLIT_QKV = r"blk\.\d+\.attn_[qkv]\.weight"  # Q, K and V apart, where llama.cpp's loader takes them fused or apart
EXPERT_GATES = r"blk\.\d+\.ffn_gate_exps\.weight"  # optional to llama.cpp's llama and granitehybrid, always written

PRESETS: dict[str, Preset] = {}  # name -> preset, filled by the family modules through :func:`register`


def register(presets: dict[str, Preset]) -> None:
    PRESETS.update(presets)


def all_presets() -> dict[str, Preset]:
    """Every preset by name (sorted, whichever module declares it), after importing every family module."""
    discover()
    return dict(sorted(PRESETS.items(), key=lambda kv: kv[0].lower()))


def canonical_name(name: str) -> str | None:
    """Case-insensitive lookup, so ``smollm2-135m`` works on the command line."""
    return next((k for k in all_presets() if k.lower() == name.lower()), None)
