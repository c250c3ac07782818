"""The architecture interface and registry: hparams in, expected tensors and a graph out.

An architecture subclass registers itself under its GGUF ``general.architecture`` name when its module is
imported, and so do the family's Hugging Face mapping and presets; :func:`graphir.model.discovery.discover` imports
every module of the ``graphir.arch`` plugin package, so a family is one module that nothing else names. Tensor
names come from the gguf package's tables (``gguf.TENSOR_NAMES``, see :mod:`graphir.model.tensors`), never from
string literals.
"""

from __future__ import annotations

from dataclasses import replace
from functools import cached_property
from typing import TYPE_CHECKING, Any, ClassVar, Mapping

from gguf import MODEL_TENSOR, Keys

from graphir.errors import MetadataError
from graphir.model.hparams import PER_LAYER, Alibi, HParams, Key, SlidingWindow, read_hparams
from graphir.memory.kinds import fitting
from graphir.memory.layers import Attention, LayerNeeds, kinds_of, needs_of
from graphir.model.tensors import TensorDecl, TensorSpec, tensor_name

if TYPE_CHECKING:
    from graphir.model.builder import GraphBuilder

REGISTRY: dict[str, type[Architecture]] = {}
# How many positions a token takes, by RoPE mode (llama.cpp's n_pos_per_embd): M-RoPE turns its sections by a
# time, a height, a width and an extra position; every other mode by one.
POSITIONS_PER_TOKEN = {"mrope": 4, "imrope": 4}


class Architecture:
    """Subclass per model family; set ``name`` to the GGUF architecture string to register it."""

    name: ClassVar[str]
    rope_mode: ClassVar[str] = "none"  # norm (adjacent pairs) | neox (split halves) | none
    required_keys: ClassVar[tuple[str, ...]] = ()  # gguf.Keys templates of common keys the family cannot do without
    # The family's own hyperparameters, read as attributes of hp; an absent optional key takes the default
    # llama.cpp gives it (llama_hparams / load_hparams), so leaving it out gives the same graph as spelling it.
    keys: ClassVar[tuple[Key, ...]] = ()
    causal: ClassVar[bool] = True
    # Whether the family sizes each layer by its own entry of the per-layer arrays (head counts, FFN length);
    # a family that does not (llama.cpp reads layer 0 for it) refuses a file whose layers differ.
    per_layer: ClassVar[bool] = False
    swa: ClassVar[SlidingWindow | None] = None  # how its layers slide (hparams n_swa, swa_type, swa_layers)
    alibi: ClassVar[Alibi | None] = None  # how its attention is biased by distance (hparams max_alibi_bias)
    # An encoder-decoder's encoder: the architecture of the stack ``encode`` runs (phase "encode"), made from
    # the same hparams and reading the same file; this class's own layers are then the decoder's.
    encoder: ClassVar[type[Architecture] | None] = None
    # An mmproj file's vision or audio tower (graphir.model.tower): one graph, phase "encode", no memory
    tower: ClassVar[bool] = False
    rank_softmax: ClassVar[bool] = False  # rank pooling: a softmax over the classifier's scores (Qwen3's rerankers)
    rank_pooling: str = "cls"  # rank pooling reads the cls row, or the mean of the sequence (ModernBERT's default)
    classifier_act: ClassVar[str] = "tanh"  # the activation after the classifier's dense layer (ModernBERT: gelu)
    n_cls_out: int = 1  # the classifier's outputs: one per label the file names (classifier.output_labels)

    def __init_subclass__(cls, **kw: Any) -> None:
        super().__init_subclass__(**kw)
        if "name" in cls.__dict__:
            REGISTRY[cls.name] = cls

    def __init__(self, hp: HParams):
        # a family llama.cpp runs without a cache attends both ways whatever attention.causal says (its files, and
        # those llama.cpp writes itself, may say true)
        self.hp = hp if self.causal else replace(hp, causal=False)

    @cached_property
    def specs(self) -> dict[str, TensorSpec]:
        """The expected tensors by name (sized by hparams that from_metadata has checked)."""
        return {s.name: s for s in self.tensors()}

    @classmethod
    def from_metadata(cls, label: str, metadata: Mapping[str, Any]) -> Architecture:
        hp = read_hparams(label, metadata, cls.name, cls.required_keys, cls.causal, cls.keys, cls.swa, cls.alibi)
        varying = [t for t, v in zip(PER_LAYER, (hp.n_ff, hp.n_head, hp.n_head_kv)) if isinstance(v, tuple)]
        if varying and not cls.per_layer:
            raise MetadataError(f"{label}: key '{varying[0].format(arch=cls.name)}' differs between layers; the "
                                f"'{cls.name}' family gives every layer the same size")
        try:
            arch = cls(hp)  # a family's own checks of its hparams
        except MetadataError as e:
            raise MetadataError(f"{label}: {e}") from None
        labels = metadata.get(Keys.Classifier.OUTPUT_LABELS.format(arch=cls.name))
        if isinstance(labels, list) and labels:  # llama.cpp reads them for every family
            arch.n_cls_out = len(labels)
        arch.check_heads(label)
        return arch

    def check_heads(self, label: str) -> None:
        """Attention splits its width into heads of a positive size, and its query heads into equal groups, one
        per KV head: a file whose counts do not would divide by zero on the way to a graph (llama.cpp
        aborts on it), so it is refused here, naming the layer."""
        hp = self.hp
        for il, entry in enumerate(self.needs):
            if not any(isinstance(n, Attention) for n in needs_of(entry)):
                continue
            n_head, n_head_kv = hp.head_count(il), hp.head_count_kv(il)
            if min(n_head, n_head_kv, hp.n_embd_head_k, hp.n_embd_head_v) <= 0 or n_head % n_head_kv:
                raise MetadataError(
                    f"{label}: layer {il} attends with {n_head} query heads, {n_head_kv} KV heads and heads of "
                    f"{hp.n_embd_head_k} (K) and {hp.n_embd_head_v} (V) values: attention needs at least one head "
                    f"of each, a positive head size and a whole number of query heads per KV head (keys "
                    f"'{Keys.Attention.HEAD_COUNT.format(arch=self.name)}', "
                    f"'{Keys.Attention.HEAD_COUNT_KV.format(arch=self.name)}')")

    def layers(self) -> LayerNeeds:
        """What each layer keeps between ubatches, from hparams alone (default: self-attention at the layer's
        K/V widths, through the family's sliding window on the layers that slide). The memory a context gets
        is assembled from these."""
        hp = self.hp
        return tuple(Attention(hp.n_embd_k_gqa_at(il), hp.n_embd_v_gqa_at(il), hp.n_swa if hp.is_swa(il) else 0,
                               hp.causal, hp.swa_type if hp.is_swa(il) else "standard",
                               alibi=hp.max_alibi_bias > 0)
                     for il in range(hp.n_layer))

    @cached_property
    def needs(self) -> LayerNeeds:
        return self.layers()

    @cached_property
    def encoder_stack(self) -> Architecture | None:
        """The encoder of an encoder-decoder model, over the same hparams (None: the model is one stack)."""
        return None if self.encoder is None else self.encoder(replace(self.hp, causal=self.encoder.causal))

    @cached_property
    def contexts(self) -> tuple[str, ...]:
        """The memory kinds this model runs with, its default first (graphir.memory.kinds)."""
        kinds = fitting(self.needs)
        if not kinds:
            raise MetadataError(f"no memory kind holds a '{self.name}' model's layers (of kind "
                                f"{', '.join(sorted(kinds_of(self.needs)))})")
        return kinds

    @property
    def n_embd_inp(self) -> int:
        """The width of the embedding rows a batch may carry in place of tokens (llama.cpp's n_embd_inp)."""
        return self.hp.n_embd

    @property
    def positions_per_token(self) -> int:
        return POSITIONS_PER_TOKEN.get(self.rope_mode, 1)

    def decoder_start(self) -> int | None:
        """The token an encoder-decoder's decoder starts from (None: the file names none; BOS is used)."""
        return None

    def variant(self, n_ctx_seq: int) -> Any:
        """What a context of ``n_ctx_seq`` cells per sequence changes in the graph (contexts whose variants are
        equal share one compiled graph): nothing, for most families."""
        return None

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
        return out + self._missing_qkv(tensors)

    def _missing_qkv(self, tensors: Mapping[str, TensorDecl]) -> list[str]:
        """A layer the graph runs whose Q, K and V the family takes fused or apart (llama.cpp's create_tensor_qkv:
        both forms optional) needs one of the two; one line per layer that has neither."""
        out = []
        for il in range(len(self.layers())):
            fused, apart = (self.specs.get(tensor_name(t, il)) for t in (MODEL_TENSOR.ATTN_QKV, MODEL_TENSOR.ATTN_Q))
            if fused and apart and fused.optional and apart.optional and fused.name not in tensors \
                    and apart.name not in tensors:
                out.append(f"missing tensor '{fused.name}'")
        return out
