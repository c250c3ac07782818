"""Vision and audio towers: the encoders an ``mmproj`` GGUF holds, as architectures of the one registry.

llama.cpp keeps them beside its text models (tools/mtmd): a file whose ``general.architecture`` is ``clip`` holds a
tower and the projector that turns its output into rows of the text model's width, named by
``clip.projector_type`` (``clip.vision.projector_type`` or ``clip.audio.projector_type`` in a file of both). A tower
registers under ``clip:<projector>``; its hparams are the file's ``clip.vision.*`` (or ``clip.audio.*``) keys, read
as llama.cpp's clip loader reads them; its one graph is phase ``encode``: an image of the tower's size (or audio of
its length) in, the rows the decoder takes in place of tokens out. It keeps nothing between calls (no memory).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, ClassVar, Mapping

import numpy as np
from gguf import Keys

from graphir.errors import MetadataError
from graphir.graph.floats import f32
from graphir.model.architecture import Architecture
from graphir.model.hparams import LAYER_COUNT, HParams, Key, KeyReader
from graphir.memory.layers import LayerNeeds

FILE_ARCH = "clip"  # the general.architecture of every mmproj file
PHASE = "encode"
V, CLIP = Keys.ClipVision, Keys.Clip
_MODALITY_KEYS = {"vision": Keys.ClipVision, "audio": Keys.ClipAudio}
HEAD_DIM = "{arch}.attention.head_dim"  # llama.cpp's head size of a tower (gguf has no name for it)
# The projector's key: the one every tower file has, else the modality's own (a file of both towers)
_PROJECTOR_KEYS = (CLIP.PROJECTOR_TYPE, V.PROJECTOR_TYPE, Keys.ClipAudio.PROJECTOR_TYPE)
# llama.cpp's clip loader: without clip.use_gelu or clip.use_silu a tower's FFN takes GELU's sigmoid approximation
FFN_ACTS = {V.USE_GELU: "gelu", V.USE_SILU: "silu"}
DEFAULT_FFN_ACT = "gelu_quick"


@dataclass(frozen=True)
class ImagePrep:
    """How llama.cpp's mtmd prepares an image for the tower (tools/mtmd/mtmd-image.cpp), as data: ``fit`` the image
    letterboxed into the tower's square (its sides scaled by the smaller ratio, rounded up, centred on black), or
    ``tiles``: resized so its longer side is the file's longest edge, then to whole tiles of the tower's size, each
    tile an image of its own, with the whole image shrunk to one tile (the overview) ``overview_first`` or last;
    or ``pinpoints`` (llava-uhd with the file's grid pinpoints, LLaVA-1.6's anyres): a picture within the tower's
    square stretched to it, one image; a larger one stretched to the square as the overview and, letterboxed into
    the pinpoint resolution that keeps most of it (on ``tile_pad``), cut into tiles of the square; a file without
    pinpoints ``fit``; or ``aspect`` (mtmd's dyn_size, Pixtral's): one image keeping its aspect, its sides rounded
    to whole patches (of n_merge x n_merge patches), scaled to hold ``min_tokens`` to ``max_tokens`` of them where
    it falls outside, letterboxed into that size; ``resize`` the filter of mtmd's resampler (bilinear, bicubic,
    lanczos: Pillow's filters);
    ``pad`` the colour a letterbox's border takes (RGB bytes)."""

    layout: str = "fit"
    resize: str = "bicubic"  # llama.cpp's default
    overview_first: bool = False
    pad: tuple[int, int, int] = (0, 0, 0)
    tile_pad: tuple[int, int, int] = (0, 0, 0)
    min_tokens: int = 0
    max_tokens: int = 0


@dataclass(frozen=True)
class AudioPrep:
    """How llama.cpp's mtmd prepares audio for the tower (tools/mtmd/mtmd-audio.cpp), as data: mono samples at
    ``sample_rate``, a log-mel spectrogram of ``n_fft``-point FFTs of periodic Hann windows ``window`` long every
    ``hop`` samples (Whisper's; llama.cpp sets them per projector, no key giving them), cut into chunks of ``chunk``
    frames, the tower's one input length."""

    sample_rate: int = 16000
    n_fft: int = 400
    window: int = 400
    hop: int = 160
    chunk: int = 3000


@dataclass(frozen=True)
class MediaText:
    """The text llama.cpp's mtmd puts around an image's rows in a prompt (tools/mtmd/mtmd.cpp, per projector), as
    data: ``begin`` and ``end`` around the whole picture (text, its special tokens parsed); for a tiled picture,
    ``slice_start`` before each slice (text, with the slice's row and column from 1), ``row_end`` after each row of
    slices but the last, ``overview_start`` and ``overview_end`` around the overview (tokens, each found by its
    text). ``both_ways``: the decoder takes the rows with causal attention off (mtmd_decode_use_non_causal)."""

    begin: str = ""
    end: str = ""
    slice_start: str = ""
    row_end: tuple[str, ...] = ()
    overview_start: tuple[str, ...] = ()
    overview_end: tuple[str, ...] = ()
    both_ways: bool = False


def tower_name(label: str, metadata: Mapping[str, Any]) -> str:
    """The registry name of an mmproj file's tower: ``clip:`` and its projector type (the vision tower's where the
    file holds two)."""
    for key in _PROJECTOR_KEYS:
        v = metadata.get(key)
        if isinstance(v, str) and v:
            return f"{FILE_ARCH}:{v}"
    raise MetadataError(f"{label}: missing key '{CLIP.PROJECTOR_TYPE}' (an mmproj file names its projector type)")


def projector_of(name: str) -> str:
    return name.split(":", 1)[1]


class Tower(Architecture):
    """An mmproj file's encoder and projector. Subclasses set ``name`` to ``clip:<projector>``, ``modality``, the
    family's own keys (with llama.cpp's defaults for that projector), how its images are prepared and what text
    wraps them in a prompt."""

    tower = True
    causal = False
    modality: ClassVar[str] = "vision"
    # the FFN's activation where the projector fixes it whatever the file's keys say (llama.cpp's loader: GELU by
    # erf for Whisper's encoders); "" for the file's
    fixed_ffn_act: ClassVar[str] = ""
    # hparams llama.cpp's clip takes off a tensor's shape, no key giving them: (field, tensor, axis in ggml order)
    widths: ClassVar[tuple[tuple[str, str, int], ...]] = ()
    image_prep: ClassVar[ImagePrep] = ImagePrep()
    audio_prep: ClassVar[AudioPrep] = AudioPrep()
    media_text: ClassVar[MediaText] = MediaText()
    # the tower encodes an image of any size in whole patches (its graph built per size), not only its square
    any_size: ClassVar[bool] = False
    sized_to: tuple[int, int] | None = None  # the (width, height) a sized copy's graph takes (at_size)

    @property
    def frame(self) -> tuple[int, int]:
        """The (width, height) in pixels of the image the graph takes: the file's square unless sized."""
        return self.sized_to or (self.hp.image_size, self.hp.image_size)

    def at_size(self, width: int, height: int) -> Tower:
        """A copy of the tower whose graph takes an image of width x height pixels (whole patches)."""
        P = self.hp.patch_size
        if not self.any_size:
            raise MetadataError(f"a '{self.name}' tower takes images of its own {self.hp.image_size} pixels square, "
                                f"not {width} x {height}")
        if width % P or height % P or width <= 0 or height <= 0:
            raise MetadataError(f"a '{self.name}' tower takes images of whole {P}-pixel patches, not {width} x "
                                f"{height}")
        sized = copy.copy(self)
        sized.sized_to = (width, height)
        return sized

    def image_inputs(self) -> dict[str, np.ndarray]:
        """What the graph takes beside the pixels for an image of its frame (by input name): nothing, for most
        towers."""
        return {}

    def row_grid(self, n_rows: int) -> tuple[int, int]:
        """The (columns, lines) the ``n_rows`` rows of an image of its frame lie in, where a decoder's M-RoPE places
        them in two dimensions (mtmd's nx and ny): one line of them, for most towers."""
        return n_rows, 1

    @classmethod
    def from_metadata(cls, label: str, metadata: Mapping[str, Any],  # type: ignore[override]
                      shapes: Mapping[str, tuple[int, ...]] | None = None) -> Architecture:
        """The tower of a file's keys and, for its ``widths``, the ``shapes`` of its tensors by name."""
        try:
            hp = read_tower_hparams(label, metadata, cls.name, cls.modality, cls.keys, cls.fixed_ffn_act)
            arch = cls(HParams(**{**hp.__dict__, "family": hp.family + _widths(cls.widths, shapes or {})}))
        except MetadataError as e:
            raise MetadataError(e.args[0] if e.args[0].startswith(f"{label}: ") else f"{label}: {e}") from None
        arch.check_heads(label)
        return arch

    def check_heads(self, label: str) -> None:
        hp = self.hp
        if hp.n_embd_head_k <= 0 or hp.n_head % hp.n_head_kv:
            raise MetadataError(f"{label}: a tower of width {hp.n_embd} attends with {hp.n_head} query heads and "
                                f"{hp.n_head_kv} KV heads: its width needs whole heads, and its query heads a whole "
                                f"number per KV head (keys 'clip.{self.modality}.attention.head_count', "
                                f"'clip.{self.modality}.attention.head_count_kv')")

    @property
    def n_embd_out(self) -> int:
        """The width of the rows the projector makes, the text model's: the file's ``projection_dim`` unless the
        family reads it off a tensor (LLaVA)."""
        return self.hp.projection_dim

    def layers(self) -> LayerNeeds:
        return ()  # nothing is kept between images

    @property
    def contexts(self) -> tuple[str, ...]:  # type: ignore[override]
        return ("none",)


def read_tower_hparams(label: str, metadata: Mapping[str, Any], name: str, modality: str,
                       keys: tuple[Key, ...], fixed_ffn_act: str = "") -> HParams:
    """The ``clip.<modality>.*`` keys llama.cpp's clip loader requires (width, heads, FFN, layers, projection, norm
    epsilon; an image's size and patch for a vision tower, the mel bins of an audio tower's input), its optional
    ones with its defaults (KV heads: the query heads; head size: the width over the heads), the FFN's activation
    (``fixed_ffn_act`` where the projector fixes it), and the family's own ``keys`` (an array's: kind tuple)."""
    K = _MODALITY_KEYS[modality]
    r = KeyReader(label, metadata, f"{FILE_ARCH}.{modality}")
    n_embd = r.get(K.EMBEDDING_LENGTH, int, required=True, minimum=1)
    n_head = r.get(K.Attention.HEAD_COUNT, int, required=True, minimum=1)
    if r.key(HEAD_DIM) not in metadata and n_embd % n_head:
        raise MetadataError(f"{label}: a tower {n_embd} wide cannot split into {n_head} heads (key "
                            f"'{K.Attention.HEAD_COUNT}'; or give '{r.key(HEAD_DIM)}')")
    head = r.get(HEAD_DIM, int, n_embd // n_head, minimum=1)
    acts = [act for key, act in FFN_ACTS.items() if metadata.get(key) is True]
    if len(acts) > 1:
        raise MetadataError(f"{label}: keys '{V.USE_GELU}' and '{V.USE_SILU}' are both true; a tower's FFN has one "
                            f"activation")
    eps = r.get(K.Attention.LAYERNORM_EPS, float, required=True)
    hp = HParams(
        arch=name, n_vocab=0, n_ctx_train=0, n_embd=n_embd,
        n_layer=r.get(K.BLOCK_COUNT, int, required=True, **LAYER_COUNT),
        n_ff=r.get(K.FEED_FORWARD_LENGTH, int, required=True, minimum=0),
        n_head=n_head, n_head_kv=r.get(Keys.Attention.HEAD_COUNT_KV, int, n_head, minimum=1),
        n_embd_head_k=head, n_embd_head_v=head, n_rot=0, rope_freq_base=f32(10000.0), rope_freq_scale=1.0,
        rope_scaling="none", n_ctx_orig_yarn=0, rope_attn_factor=1.0, norm_eps=eps, norm_rms_eps=eps,
        attn_scale=0.0, causal=False,
    )
    common: tuple[tuple[str, Any], ...] = (
        ("projection_dim", r.get(K.PROJECTION_DIM, int, required=True, minimum=1)),
        ("ffn_act", fixed_ffn_act or (acts[0] if acts else DEFAULT_FFN_ACT)))
    if modality == "vision":
        common += (("image_size", r.get(V.IMAGE_SIZE, int, required=True, minimum=1)),
                   ("patch_size", r.get(V.PATCH_SIZE, int, required=True, minimum=1)),
                   ("image_mean", _three(r, V.IMAGE_MEAN)), ("image_std", _three(r, V.IMAGE_STD)))
    elif modality == "audio":  # llama.cpp's loader refuses more than 256 bins
        common += (("n_mel_bins", r.get(Keys.ClipAudio.NUM_MEL_BINS, int, required=True, minimum=1, maximum=256)),)
    own = tuple((k.field, r.values(k.template, k.count, k.default, k.minimum, k.maximum, k.item) if k.kind is tuple
                 else r.get(k.template, k.kind, k.default, k.required, k.minimum, k.maximum)) for k in keys)
    return HParams(**{**hp.__dict__, "family": common + own})


def _widths(widths: tuple[tuple[str, str, int], ...], shapes: Mapping[str, tuple[int, ...]]
            ) -> tuple[tuple[str, int], ...]:
    """Each width's field and the size of its tensor along its axis (llama.cpp's clip loader reads them so)."""
    out = []
    for field, tensor, axis in widths:
        if tensor not in shapes:
            raise MetadataError(f"missing tensor '{tensor}' (its shape gives the tower's {field})")
        out.append((field, int((tuple(shapes[tensor]) + (1,) * 4)[axis])))
    return tuple(out)


def _three(r: KeyReader, key: str) -> tuple[float, float, float]:
    """An image's per-channel mean or deviation: llama.cpp's loader refuses a file without three."""
    v = r.md.get(key)
    if not isinstance(v, (list, tuple)) or len(v) < 3:
        raise MetadataError(f"{r.label}: key '{key}' must hold at least 3 values (red, green, blue), got {v!r}")
    return tuple(r._typed(f"{key}[{i}]", x, float) for i, x in enumerate(v[:3]))  # type: ignore[return-value]
