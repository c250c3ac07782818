"""An encoder context over a vision tower (llama.cpp's clip context, mtmd's encode step): an image's pixels in,
the rows the text decoder takes in place of tokens out. It keeps nothing from one image to the next, so one
context encodes any number of images, one at a time."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from graphir.errors import GraphirError
from graphir.media.image import Tile, prepare, read_image
from graphir.model.tower import PHASE
from graphir.model.vit import CHANNELS


class TowerContext:
    """``model.new_context()`` of an mmproj file: ``encode_image`` prepares a picture and encodes each image of it;
    ``encode`` takes one image as the preparation makes it; ``rows`` holds the last image's output."""

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
        """The pixels encode takes, in numpy order: channel planes of the tower's square image [3, S, S]."""
        S = self.model.hparams.image_size
        return (CHANNELS, S, S)

    @property
    def n_embd(self) -> int:
        """The width of the rows out: the text model's (the projector's ``projection_dim``)."""
        return int(self.graph.outputs["embd"].shape[0])

    def encode_image(self, image: str | os.PathLike[str] | np.ndarray) -> list[tuple[Tile, np.ndarray]]:
        """Each image the tower encodes for one picture (a file, or RGB bytes [H, W, 3]), prepared as llama.cpp's
        mtmd prepares it (graphir.media.image), with its rows, in the order mtmd places them in a prompt."""
        rgb = image if isinstance(image, np.ndarray) else read_image(image)
        return [(tile, self.encode(tile.pixels)) for tile in prepare(rgb, self.model.arch)]

    def encode(self, pixels: np.ndarray) -> np.ndarray:
        """The rows [n_rows, n_embd] of one image, given as float32 channel planes [3, S, S] of the tower's size,
        normalised by its mean and deviation (graphir.media.image.preprocess makes them)."""
        pixels = np.asarray(pixels)
        if pixels.shape != self.input_shape or pixels.dtype != np.float32:
            raise GraphirError(f"{self.model.meta.label}: a tower of {self.input_shape[1]}-pixel images encodes "
                               f"float32 planes {list(self.input_shape)}, got {pixels.dtype} {list(pixels.shape)}")
        if not np.isfinite(pixels).all():
            raise GraphirError(f"{self.model.meta.label}: the pixels hold NaN or infinite values")
        out = self.program.run({}, {"inp_raw": np.ascontiguousarray(pixels)})
        self.rows = np.array(out["embd"], np.float32)
        return self.rows
