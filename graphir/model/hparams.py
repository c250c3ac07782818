"""Model hyperparameters read from GGUF metadata, with llama.cpp's key names and defaults.

Keys come from the gguf package's templates (``gguf.Keys.LLM.CONTEXT_LENGTH`` = ``'{arch}.context_length'``),
so this module never spells a key by hand. Floats are rounded to float32 on the way in: GGUF stores them as
float32 and ggml op parameters are float32, so a preset saying ``1e-5`` and a file holding ``float32(1e-5)``
give the same graph.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any, Mapping, Tuple, Union

from gguf import Keys, PoolingType

from graphir.errors import MetadataError
from graphir.graph.floats import f32


@dataclass(frozen=True)
class Key:
    """A hyperparameter a family reads beyond the common ones: its field name, its GGUF key template, its
    type, and the value llama.cpp gives it when the file leaves the key out: ``default``, or the value of the
    common field ``default_from`` (e.g. Gemma 2's local RoPE base is the model's unless the file says).
    ``minimum``/``maximum``: the range of an int a file may give (a size of 0 or -1 would divide by zero or
    shape a negative tensor further on). Kind ``tuple``: ``count`` ints (or bools, as 0/1) from an array of
    that length or one value repeated, as llama.cpp's ``get_key_or_arr`` reads them; kind ``list``: a per-layer
    size read as the common ones (an int, or one per layer where the layers differ)."""

    field: str
    template: str
    kind: type
    default: Any = 0
    required: bool = False
    default_from: str = ""
    minimum: int | None = None
    maximum: int | None = None
    count: int = 0  # kind tuple: how many values (0: one per layer; -1: any number up to LLAMA_MAX_LAYERS, as
    # llama.cpp's get_arr fills its per-layer arrays); one value alone stands for them all
    item: type = int  # kind tuple: the values' type (int, or float: float32 values)
    first: bool = False  # kind int: the file may give one value per layer, of which the field is layer 0's (what
    #                      llama.cpp's graph context reads of a get_key_or_arr key)
    varying: bool = False  # kind list: the values only where the layers differ, else () (a uniform model's headers
    #                        stay as they are)


@dataclass(frozen=True)
class SlidingWindow:
    """How a family's layers slide, as llama.cpp's loader sets it up: the window type (a key of
    graphir.memory.layers.WINDOWS), the window when ``attention.sliding_window`` is absent (0: the key is
    required, unless ``off_when_zero``), and the ``attention.sliding_window_pattern`` period when that key is absent too. With period
    n, layer il slides when il % n < n - 1 (the last of every n is global; ``dense_first``: the first is);
    period 0 makes every layer slide. ``off_when_zero``: a window of 0 means the model does not slide at all
    (Gemma 3) instead of being an error. ``fixed``: the window whatever positive value the key gives (Llama 4's
    chunks of 8192, SmallThinker's 4096; 0: the key's). ``n_layer``: only models of that many layers slide (EXAONE
    4.0's 32B of 64; 0: every model)."""

    kind: str = "standard"
    window: int = 0
    period: int = 0
    dense_first: bool = False
    off_when_zero: bool = False
    fixed: int = 0
    n_layer: int = 0


@dataclass(frozen=True)
class Alibi:
    """How a family's attention takes ALiBi's linear position bias, as llama.cpp's loader sets
    ``f_max_alibi_bias``: ``bias`` (the largest head's slope exponent, 8 in every model that has it), or, with
    ``key``, the file's ``attention.max_alibi_bias`` (absent: 0, no bias); ``n_layer``: only models of that many
    layers take it (Baichuan 13B of 40, where the 7B of 32 ropes instead)."""

    bias: float = 8.0
    key: bool = False
    n_layer: int = 0


PerLayer = Union[int, Tuple[int, ...]]


@dataclass(frozen=True)
class HParams:
    arch: str
    n_vocab: int
    n_ctx_train: int
    n_embd: int
    n_layer: int
    n_ff: PerLayer  # an int when every layer agrees, else one value per layer (a GGUF array)
    n_head: PerLayer
    n_head_kv: PerLayer
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
    # Shared but rarely set: printed only when set (see as_dict).
    pooling: str = "none"  # none | mean | cls | last | rank: how embedding models reduce a sequence
    n_token_types: int = 0  # rows of the token-type embedding (BERT)
    n_swa: int = 0  # the sliding window of the layers that slide
    swa_type: str = "none"  # standard | chunked | symmetric (graphir.memory.layers.WINDOWS)
    swa_layers: tuple[int, ...] = ()  # 1 per sliding layer, 0 per global one
    max_alibi_bias: float = 0.0  # ALiBi: scores biased by slope(head) * -|key pos - query pos| (0: none)
    # The family's own keys (Architecture.keys), as (field, value) in the family's order; read as attributes.
    family: tuple[tuple[str, Any], ...] = ()

    def __getattr__(self, name: str) -> Any:
        for k, v in self.__dict__.get("family", ()):
            if k == name:
                return v
        raise AttributeError(f"'{self.__dict__.get('arch', '?')}' hparams have no field {name!r}")

    def is_swa(self, il: int) -> bool:
        return bool(self.swa_layers and self.swa_layers[il])

    def head_count(self, il: int) -> int:
        return _at(self.n_head, il)

    def head_count_kv(self, il: int) -> int:
        return _at(self.n_head_kv, il)

    def ff_length(self, il: int) -> int:
        return _at(self.n_ff, il)

    def n_embd_k_gqa_at(self, il: int) -> int:
        return self.n_embd_head_k * self.head_count_kv(il)

    def n_embd_v_gqa_at(self, il: int) -> int:
        return self.n_embd_head_v * self.head_count_kv(il)

    @property
    def n_embd_k_gqa(self) -> int:
        return self.n_embd_k_gqa_at(0)

    @property
    def n_embd_v_gqa(self) -> int:
        return self.n_embd_v_gqa_at(0)

    def as_dict(self) -> dict[str, Any]:
        """Every common field, then the rarely set and the family's fields that are set (non-zero), so graph
        headers stay family-sized."""
        d = {f.name: getattr(self, f.name) for f in fields(self)[:_N_COMMON]}
        d.update((f.name, getattr(self, f.name)) for f in fields(self)[_N_COMMON:-1]
                 if getattr(self, f.name) != f.default)
        d.update((k, v) for k, v in self.family if v)
        return d


_FIELDS = [f.name for f in fields(HParams)]
_N_COMMON = _FIELDS.index("pooling")


def _at(v: PerLayer, il: int) -> int:
    return v if isinstance(v, int) else v[il]


class KeyReader:
    """Typed access to ``<arch>.*`` keys that names the file and key in every error."""

    def __init__(self, label: str, metadata: Mapping[str, Any], arch: str):
        self.label, self.md, self.arch = label, metadata, arch

    def key(self, template: str) -> str:
        return template.format(arch=self.arch)

    def get(self, template: str, kind: type, default: Any = None, required: bool = False, minimum: int | None = None,
            maximum: int | None = None) -> Any:
        """The key's value (``default`` when absent), of ``kind``; an int given by the file must lie in
        [minimum, maximum]."""
        k = self.key(template)
        if k not in self.md:
            if required:
                raise MetadataError(f"{self.label}: missing key '{k}'")
            return default
        v = self.md[k]
        if isinstance(v, list):
            raise MetadataError(f"{self.label}: key '{k}' is an array; graphir reads one value for it (per-layer "
                                f"arrays: {', '.join(t.format(arch=self.arch) for t in PER_LAYER)})")
        return self._bounded(k, self._typed(k, v, kind), minimum, maximum)

    def values(self, template: str, n: int, default: Any, minimum: int | None = None,
               maximum: int | None = None, item: type = int) -> Any:
        """An array key of exactly ``n`` values of type ``item`` (n < 0: of any number up to LLAMA_MAX_LAYERS), or one
        value standing for all n (``get_key_or_arr``), as a tuple; each within [minimum, maximum]. ``default`` when
        absent."""
        k = self.key(template)
        if k not in self.md:
            return default
        v = self.md[k]
        if not isinstance(v, (list, tuple)):
            return (self._bounded(k, self._typed(k, v, item), minimum, maximum),) * max(n, 1)
        if len(v) != n and not (n < 0 and len(v) <= LAYER_COUNT["maximum"]):
            raise MetadataError(f"{self.label}: key '{k}' has {len(v)} values, "
                                f"{n if n >= 0 else 'at most ' + str(LAYER_COUNT['maximum'])} expected")
        return tuple(self._bounded(f"{k}[{i}]", int(x) if isinstance(x, bool) and item is int
                                   else self._typed(f"{k}[{i}]", x, item), minimum, maximum) for i, x in enumerate(v))

    def per_layer(self, template: str, n_layer: int, default: PerLayer) -> PerLayer:
        """A key llama.cpp reads as one value or one per layer (``get_key_or_arr``); an array whose layers all
        agree is that one value, so a uniform model reads and prints the same either way. Counts: never below 0."""
        k = self.key(template)
        v = self.md.get(k, default)
        if not isinstance(v, (list, tuple)):
            return self._bounded(k, self._typed(k, v, int), 0, None)
        if len(v) != n_layer:
            raise MetadataError(f"{self.label}: key '{k}' has {len(v)} values, one per layer needs {n_layer}")
        vals = tuple(self._bounded(f"{k}[{i}]", self._typed(f"{k}[{i}]", x, int), 0, None) for i, x in enumerate(v))
        return vals[0] if len(set(vals)) == 1 else vals

    def _typed(self, k: str, v: Any, kind: type) -> Any:
        if kind is float and isinstance(v, (int, float)) and not isinstance(v, bool):
            return f32(float(v))
        if kind is int and isinstance(v, int) and not isinstance(v, bool):
            return v
        if kind in (bool, str) and isinstance(v, kind):
            return v
        raise MetadataError(f"{self.label}: key '{k}' should be {kind.__name__}, got {type(v).__name__} {v!r}")

    def _bounded(self, k: str, v: Any, minimum: int | None, maximum: int | None) -> Any:
        if minimum is not None and v < minimum:
            raise MetadataError(f"{self.label}: key '{k}' is {v}: it must be at least {minimum}")
        if maximum is not None and v > maximum:
            raise MetadataError(f"{self.label}: key '{k}' is {v}: it must be at most {maximum}")
        return v


# A layer count's range: llama.cpp's LLAMA_MAX_LAYERS (its per-layer hparams are arrays of 512); every per-layer
# loop runs this many times, so a corrupt count would not end.
LAYER_COUNT = {"minimum": 1, "maximum": 512}
PER_LAYER = (Keys.LLM.FEED_FORWARD_LENGTH, Keys.Attention.HEAD_COUNT, Keys.Attention.HEAD_COUNT_KV)


def read_hparams(label: str, metadata: Mapping[str, Any], arch: str, required: tuple[str, ...] = (),
                 causal: bool = True, keys: tuple[Key, ...] = (), swa: SlidingWindow | None = None,
                 alibi: Alibi | None = None) -> HParams:
    """The hparams every architecture shares, and the family's ``keys``; ``required`` names extra key
    templates the arch cannot do without; ``swa``: how the family's layers slide, if they do; ``alibi``: how
    its attention is biased by distance, if it is."""
    r = KeyReader(label, metadata, arch)
    clash = [k.field for k in keys if k.field in _FIELDS]
    if clash:
        raise MetadataError(f"{arch}: family key '{clash[0]}' is a field every architecture has; give it another name")
    for template in required + tuple(k.template for k in keys if k.required):
        if r.key(template) not in metadata:
            raise MetadataError(f"{label}: missing key '{r.key(template)}'")
    L, A, R = Keys.LLM, Keys.Attention, Keys.Rope
    n_embd = r.get(L.EMBEDDING_LENGTH, int, required=True, minimum=1)
    n_layer = r.get(L.BLOCK_COUNT, int, required=True, **LAYER_COUNT)
    n_head = r.per_layer(A.HEAD_COUNT, n_layer, 0)
    n_head_kv = r.per_layer(A.HEAD_COUNT_KV, n_layer, n_head)
    n_head_0 = _at(n_head, 0)  # llama.cpp derives the head sizes from layer 0
    head_k = r.get(A.KEY_LENGTH, int, n_embd // n_head_0 if n_head_0 else 0, minimum=0)
    head_v = r.get(A.VALUE_LENGTH, int, n_embd // n_head_0 if n_head_0 else 0, minimum=0)
    n_vocab = r.get(L.VOCAB_SIZE, int, None, minimum=0)
    if n_vocab is None:
        tokens = metadata.get(Keys.Tokenizer.LIST)
        n_vocab = len(tokens) if isinstance(tokens, list) else 0
    scaling = r.get(R.SCALING_TYPE, str, "linear")
    factor = r.get(R.SCALING_FACTOR, float, 0.0) or r.get("{arch}.rope.scale_linear", float, 0.0)
    n_ctx_train = r.get(L.CONTEXT_LENGTH, int, required=True, minimum=0)
    if n_head_0 and n_embd % n_head_0 and A.KEY_LENGTH.format(arch=arch) not in metadata:
        raise MetadataError(f"{label}: n_embd {n_embd} is not divisible by n_head {n_head_0}")
    hp = HParams(
        arch=arch,
        n_vocab=n_vocab,
        n_ctx_train=n_ctx_train,
        n_embd=n_embd,
        n_layer=n_layer,
        n_ff=r.per_layer(L.FEED_FORWARD_LENGTH, n_layer, 0),
        n_head=n_head,
        n_head_kv=n_head_kv,
        n_embd_head_k=head_k,
        n_embd_head_v=head_v,
        # llama.cpp reads no rotary width when layer 0 has no heads: a model whose first layer is recurrent ropes none
        n_rot=r.get(R.DIMENSION_COUNT, int, head_k, minimum=0) if n_head_0 else 0,
        rope_freq_base=r.get(R.FREQ_BASE, float, f32(10000.0)),
        rope_freq_scale=f32(1.0 / factor) if factor and scaling != "none" else 1.0,
        rope_scaling=scaling,
        n_ctx_orig_yarn=r.get(R.SCALING_ORIG_CTX_LEN, int, n_ctx_train, minimum=0),
        rope_attn_factor=r.get(R.SCALING_ATTN_FACTOR, float, 1.0),
        norm_eps=r.get(A.LAYERNORM_EPS, float, 0.0),
        norm_rms_eps=r.get(A.LAYERNORM_RMS_EPS, float, 0.0),
        attn_scale=r.get(A.SCALE, float, 0.0),
        causal=r.get(A.CAUSAL, bool, causal),
        pooling=_pooling(r),
        n_token_types=r.get(Keys.Tokenizer.TOKEN_TYPE_COUNT, int, 0, minimum=0),  # a tokenizer key: no {arch}
        **_sliding(r, swa, n_layer),
        max_alibi_bias=_alibi(r, alibi, n_layer),
    )
    def family_value(k: Key) -> Any:
        default = getattr(hp, k.default_from) if k.default_from else k.default
        if k.kind is list:  # a per-layer size: one value, or an array (one value when its layers agree)
            v = r.per_layer(k.template, n_layer, default)
            return () if k.varying and isinstance(v, int) else v
        if k.first:
            v = r.per_layer(k.template, n_layer, default)
            return v if isinstance(v, int) else v[0]
        if k.kind is tuple:
            return r.values(k.template, k.count or n_layer, default, minimum=k.minimum, maximum=k.maximum,
                            item=k.item)
        return r.get(k.template, k.kind, default, minimum=k.minimum, maximum=k.maximum)

    return replace(hp, family=tuple((k.field, family_value(k)) for k in keys))


def _sliding(r: KeyReader, swa: SlidingWindow | None, n_layer: int) -> dict[str, Any]:
    """n_swa, swa_type and swa_layers as llama.cpp's load_swa_pattern reads them (nothing for families
    that do not slide, or whose window is 0 where that means off)."""
    # llama.cpp sizes the pattern and the window's model by its layers less the multi-token-prediction ones (read
    # for every architecture), which never slide
    trunk = n_layer - r.get(Keys.LLM.NEXTN_PREDICT_LAYERS, int, 0)
    if swa is None or swa.n_layer and trunk != swa.n_layer:
        return {}
    k = r.key(Keys.Attention.SLIDING_WINDOW)
    optional = bool(swa.window or swa.off_when_zero)
    n_swa = r.get(Keys.Attention.SLIDING_WINDOW, int, swa.window, required=not optional)
    if n_swa <= 0:
        if swa.off_when_zero:
            return {}
        raise MetadataError(f"{r.label}: key '{k}' is {n_swa}: a sliding window needs at least one position")
    kp = r.key(Keys.Attention.SLIDING_WINDOW_PATTERN)
    pattern = r.md.get(kp, swa.period)
    if isinstance(pattern, (list, tuple)):
        if len(pattern) not in (n_layer, trunk):  # converters write the trunk's (the prediction layers never slide)
            raise MetadataError(f"{r.label}: key '{kp}' has {len(pattern)} values, one per layer needs {n_layer}")
        # llama.cpp reads bool, int32 and uint32 arrays alike here, any nonzero value meaning a sliding layer
        layers = tuple(int(bool(v if isinstance(v, bool) else r._typed(f"{kp}[{i}]", v, int)))
                       for i, v in enumerate(pattern)) + (0,) * (n_layer - len(pattern))
    else:
        n = r._typed(kp, pattern, int)
        if n < 0:
            raise MetadataError(f"{r.label}: key '{kp}' is {n}: a period of layers cannot be negative")
        layers = tuple(int(il < trunk and (n == 0 or (il % n != 0 if swa.dense_first else il % n < n - 1)))
                       for il in range(n_layer))
    return {"n_swa": swa.fixed or n_swa, "swa_type": swa.kind, "swa_layers": layers}


def _alibi(r: KeyReader, alibi: Alibi | None, n_layer: int) -> float:
    if alibi is None or (alibi.n_layer and n_layer != alibi.n_layer):
        return 0.0
    bias = r.get(Keys.Attention.MAX_ALIBI_BIAS, float, 0.0) if alibi.key else f32(alibi.bias)
    if bias < 0:
        raise MetadataError(f"{r.label}: key '{r.key(Keys.Attention.MAX_ALIBI_BIAS)}' is {bias}: ALiBi's bias "
                            f"cannot be negative")
    return bias


POOLING_UNSPECIFIED = (-1, 2**32 - 1)  # LLAMA_POOLING_TYPE_UNSPECIFIED, as an int32 or as the uint32 llama.cpp writes


def _pooling(r: KeyReader) -> str:
    """llama.cpp's pooling type; unspecified (-1) is none, as a llama.cpp context without a pooling option makes it."""
    v = r.get(Keys.LLM.POOLING_TYPE, int, 0)
    if v in POOLING_UNSPECIFIED:
        return "none"
    try:
        return PoolingType(v).name.lower()
    except ValueError:
        raise MetadataError(f"{r.label}: key '{r.key(Keys.LLM.POOLING_TYPE)}' has unknown pooling type {v}") from None
