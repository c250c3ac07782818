"""A model as graphir sees it before any weight is read: metadata plus tensor declarations.

It comes from a GGUF (full or header-only), a Hugging Face config or a preset, and builds graphs for any
context kind and phase. Nothing here reads tensor data.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from graphir.model import presets
from graphir.model.architecture import Architecture
from graphir.model.builder import PHASES, GraphBuilder
from graphir.errors import GraphirError, MetadataError
from graphir.files.gguf_file import GGUFHeader, TensorInfo, read_header
from graphir.graph.ir import Graph
from graphir.memory.kinds import KINDS, assemble
from graphir.memory.layers import ContextParams
from graphir.model.tower import FILE_ARCH as TOWER_FILE
from graphir.model.tower import PHASE as TOWER_PHASE
from graphir.model.tower import tower_name


# A memory that only shapes graphs: no buffers, whatever the hparams say (a recurrent state 2^38 wide is a
# MetadataError or TensorError of the file, not an allocation).
_GRAPH_ONLY = ContextParams(buffers=False)


@dataclass
class ModelMeta:
    label: str  # the path as the user gave it, or the preset name: what error messages point at
    metadata: dict[str, Any]
    tensors: dict[str, TensorInfo]
    header: GGUFHeader | None = None  # None for presets

    @property
    def arch_name(self) -> str:
        arch = self.metadata.get("general.architecture")
        if not isinstance(arch, str):
            raise MetadataError(f"{self.label}: missing key 'general.architecture'")
        return tower_name(self.label, self.metadata) if arch == TOWER_FILE else arch

    @cached_property
    def arch(self) -> Architecture:
        from graphir.arch import get  # the core never imports architectures at import time

        try:
            cls = get(self.arch_name)
        except MetadataError as e:
            raise MetadataError(f"{self.label}: {e}") from None
        if cls.tower:  # a tower may take a size off a tensor's shape
            return cls.from_metadata(self.label, self.metadata, {n: tuple(t.shape) for n, t in self.tensors.items()})
        return cls.from_metadata(self.label, self.metadata)

    @property
    def default_phase(self) -> str:
        """The phase a graph of this model is built for when none is asked: a tower's one, else prefill."""
        return TOWER_PHASE if self.arch.tower else "prefill"

    def build_graph(self, context: str | None = None, phase: str | None = None, pooling: str | None = None,
                    n_ctx_seq: int = 0, rows: bool = False, image: tuple[int, int] | None = None) -> Graph:
        """The graph of one ubatch: ``context`` picks the memory kind (default: the architecture's first),
        ``phase`` prefill or decode (default: :attr:`default_phase`), ``pooling`` how embeddings are reduced per
        sequence (default: the model's), ``n_ctx_seq`` the cells a sequence may use, for the few families whose
        graph depends on it (Phi-3's LongRoPE factors; 0: not beyond the trained context); ``rows``: the ubatch
        carries embedding rows in place of token ids; ``image``: a tower's graph for an image of (width, height)
        pixels other than its square (Tower.at_size)."""
        arch = model = self.arch
        phase = phase or self.default_phase
        if arch.tower:
            if phase != TOWER_PHASE:
                raise GraphirError(f"{self.label}: a '{arch.name}' tower has one graph, phase '{TOWER_PHASE}' (an "
                                   f"image or audio in, rows out), not '{phase}'")
            arch = arch.at_size(*image) if image else arch
        elif phase == "encode":  # the encoder stack of an encoder-decoder: no cache, one whole batch
            if arch.encoder_stack is None:
                raise GraphirError(f"{self.label}: a '{arch.name}' model has no encoder; phase 'encode' is an "
                                   f"encoder-decoder's or a tower's (use prefill or decode)")
            arch = arch.encoder_stack
        context = context or arch.contexts[0]
        if context not in KINDS:
            raise GraphirError(f"unknown context '{context}' (known: {', '.join(KINDS)})")
        if context not in arch.contexts:
            raise GraphirError(f"{self.label}: a '{arch.name}' model runs with context {' or '.join(arch.contexts)}, "
                               f"not '{context}'")
        if phase not in PHASES:
            raise GraphirError(f"unknown phase '{phase}' (known: {', '.join(PHASES)})")
        if ("prefill" if phase == "encode" else phase) not in KINDS[context].phases:  # an encoder runs as one prefill
            raise GraphirError(f"context '{context}' has no {phase} phase (it has: {', '.join(KINDS[context].phases)})")
        memory = assemble(context, arch.needs, _GRAPH_ONLY)  # sizes its graph, allocates nothing
        b = GraphBuilder(arch, self.label, self.tensors, memory, phase, n_ctx_seq, rows)
        arch.build(b)
        b.build_pooling(pooling or arch.hp.pooling)
        return b.graph({"arch": model.name, "context": context, "phase": phase, "hparams": arch.hp.as_dict()})


    def graph_kinds(self) -> list[tuple[str, str]]:
        """Every (context, phase) this model has a graph for: its encoder's, if any, then each memory kind's."""
        arch = self.arch
        if arch.tower:
            return [("none", TOWER_PHASE)]
        out = [("none", "encode")] if arch.encoder_stack is not None else []
        return out + [(c, ph) for c in arch.contexts for ph in KINDS[c].phases]


def from_preset(name: str, p: presets.Preset) -> ModelMeta:
    from graphir.arch import get

    md = p.metadata()
    cls = get(p.arch)
    arch = cls.from_metadata(name, md, p.tensor_shapes) if cls.tower else cls.from_metadata(name, md)
    tensors = {}
    for s in arch.tensors():
        if s.tied_to and p.tied or not p.declares(s.name, s.optional):
            continue
        tensors[s.name] = TensorInfo(s.name, p.shape(s.name, s.shape, s.also), p.dtype(s.name, s.kind == "vector"), 0)
    return ModelMeta(name, md, tensors)


def open_model(src: str) -> ModelMeta:
    """A GGUF path (full or header-only), a Hugging Face model directory or config.json (the model its
    conversion would give; graphir.model.hf_config), or a preset name."""
    from graphir.model import hf_config

    if hf_config.is_hf_source(src):
        preset, mxfp4 = hf_config.preset_of(src)
        meta = from_preset(src, preset)
        for name, t in meta.tensors.items():
            dtype = hf_config.converted_type(name, t.shape, t.dtype, mxfp4)
            if dtype != t.dtype:
                meta.tensors[name] = TensorInfo(t.name, t.shape, dtype, t.offset)
        return meta
    if os.path.exists(src) or os.sep in src or src.endswith(".gguf"):
        h = read_header(src)
        return ModelMeta(src, h.metadata, h.tensors, h)
    name = presets.canonical_name(src)
    if name is None:
        raise GraphirError(f"{src}: no such file or preset (presets: {', '.join(presets.all_presets())})")
    return from_preset(name, presets.all_presets()[name])
