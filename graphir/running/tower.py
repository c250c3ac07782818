"""An encoder context over a vision or audio tower (llama.cpp's clip context, mtmd's encode step): an image's pixels
(or a chunk of audio's log-mel frames) in, the rows the text decoder takes in place of tokens out. It keeps nothing
from one input to the next, so one context encodes any number of them, one at a time."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from graphir.errors import GraphirError, MetadataError
from graphir.media.audio import log_mel, read_audio
from graphir.media.image import Tile, prepare, read_image
from graphir.model.tower import PHASE


class TowerContext:
    """``model.new_context()`` of an mmproj file: ``encode_image`` prepares a picture and encodes each image of it,
    ``encode_audio`` an audio file's chunks; ``encode`` takes one image (or chunk) as the preparation makes it;
    ``rows`` holds the last one's output."""

    kind = "tower"

    def __init__(self, model: Any, **kw: Any):  # a graphir.running.runtime.Model (which imports this module)
        if kw:
            raise GraphirError(f"a tower's context takes no parameters (got {', '.join(sorted(kw))}): it keeps nothing "
                               f"between images")
        self.model = model
        self.program, self.graph = model.program("none", phase=PHASE)
        self.rows: np.ndarray | None = None

    @property
    def input_shape(self) -> tuple[int, ...]:
        """What encode takes, in numpy order: channel planes of the tower's square image [3, S, S], or an audio
        tower's chunk of log-mel frames [n_mel, frames]."""
        raw = next(n for n in self.graph.nodes if n.op == "input" and n.name == "inp_raw")
        return tuple(int(d) for d in reversed(raw.shape))

    @property
    def n_embd(self) -> int:
        """The width of the rows out: the text model's (the tower's ``n_embd_out``)."""
        return int(self.graph.outputs["embd"].shape[0])

    def encode_image(self, image: str | os.PathLike[str] | np.ndarray) -> list[tuple[Tile, np.ndarray]]:
        """Each image the tower encodes for one picture (a file, or RGB bytes [H, W, 3]), prepared as llama.cpp's
        mtmd prepares it (graphir.media.image), with its rows, in the order mtmd places them in a prompt."""
        rgb = image if isinstance(image, np.ndarray) else read_image(image)
        return [(tile, self.encode(tile.pixels)) for tile in prepare(rgb, self.model.arch)]

    def encode_audio(self, audio: str | os.PathLike[str] | np.ndarray) -> list[np.ndarray]:
        """The rows of each chunk the tower encodes for an audio file (WAV PCM at the tower's rate) or float32 mono
        samples, the log-mel spectrogram made as llama.cpp's mtmd makes it (graphir.media.audio), in order."""
        arch = self.model.arch
        if arch.modality != "audio":
            raise GraphirError(f"{self.model.meta.label}: a {arch.modality} tower ('{arch.name}') takes no audio")
        samples = audio if isinstance(audio, np.ndarray) else read_audio(audio, arch.audio_prep.sample_rate)
        return [self.encode(mel) for mel in log_mel(samples, self.model.hparams.n_mel_bins, arch.audio_prep)]

    def encode(self, pixels: np.ndarray) -> np.ndarray:
        """The rows [n_rows, n_embd] of one image, given as float32 channel planes [3, S, S] of the tower's size
        (a tower of ``any_size``: [3, H, W] of whole patches, its graph built for that size once), normalised by
        its mean and deviation (graphir.media.image.preprocess makes them); or of an audio tower's chunk of log-mel
        frames [n_mel, frames] (graphir.media.audio.log_mel)."""
        pixels = np.asarray(pixels)
        arch = self.model.arch
        what = "pixels" if arch.modality == "vision" else "mel frames"
        sized = arch.any_size and pixels.ndim == 3 and pixels.shape[0] == self.input_shape[0]
        if pixels.dtype != np.float32 or not sized and pixels.shape != self.input_shape:
            expected = f"[3, height, width] of whole {arch.hp.patch_size}-pixel patches" if arch.any_size else \
                str(list(self.input_shape))
            raise GraphirError(f"{self.model.meta.label}: the tower encodes float32 {what} {expected}, got "
                               f"{pixels.dtype} {list(pixels.shape)}")
        if not np.isfinite(pixels).all():
            raise GraphirError(f"{self.model.meta.label}: the {what} hold NaN or infinite values")
        program, inputs = self.program, arch.image_inputs()
        if sized and pixels.shape != self.input_shape:  # a graph of the image's own size, compiled once per size
            size = (pixels.shape[2], pixels.shape[1])
            try:
                inputs = arch.at_size(*size).image_inputs()
            except MetadataError as e:
                raise GraphirError(f"{self.model.meta.label}: {e}") from None
            program, _ = self.model.program("none", phase=PHASE, image=size)
        out = program.run({}, {"inp_raw": np.ascontiguousarray(pixels), **inputs})
        self.rows = np.array(out["embd"], np.float32)
        return self.rows
