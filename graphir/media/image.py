"""An image as llama.cpp's mtmd prepares it for a vision tower (tools/mtmd/mtmd-image.cpp), before the tower sees
it: decoded to RGB bytes, resized, letterboxed or cut into tiles as the tower's ``image_prep`` says, each byte
scaled to [0, 1] and normalised by the tower's mean and deviation, in float32 steps as mtmd computes them.

Resizing is mtmd's own resampler (a port of Pillow's, 22-bit fixed-point weights), written again here: Pillow itself
may run its two passes in the other order and differ by a level in some bytes. Decoding is Pillow's, where mtmd uses
stb_image: lossless formats (PNG, BMP, PPM) decode to the same bytes; a JPEG's may differ by a level or two where the
two decoders round their inverse DCT and chroma upsampling differently.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from graphir.errors import GraphirError

_F32 = np.float32


@dataclass(frozen=True)
class Tile:
    """One image the tower encodes, in the order mtmd places them in a prompt: the whole image fitted (``image``), a
    slice of the tiled image at (row, col), or the tiled image's ``overview``. ``pixels``: float32 planes [3, S, S]."""

    pixels: np.ndarray
    kind: str = "image"
    row: int = 0
    col: int = 0


def read_image(path: str | os.PathLike[str]) -> np.ndarray:
    """An image file's pixels as RGB bytes [H, W, 3] (any format Pillow reads; alpha dropped, palettes expanded)."""
    from PIL import Image, UnidentifiedImageError

    label = os.fsdecode(path)
    try:
        with Image.open(label) as im:
            im.load()
            return np.asarray(im.convert("RGB"), np.uint8)
    except FileNotFoundError:
        raise GraphirError(f"{label}: no such image file") from None
    except UnidentifiedImageError:
        raise GraphirError(f"{label}: not an image Pillow can read (PNG, JPEG, BMP, GIF, WebP, ...)") from None
    except (OSError, SyntaxError, ValueError) as e:  # truncated or corrupt data
        raise GraphirError(f"{label}: cannot decode the image ({e})") from None


def prepare(pixels: np.ndarray, tower: Any) -> list[Tile]:
    """The images a tower encodes for one picture (RGB bytes [H, W, 3]), by its ``image_prep``."""
    rgb = np.asarray(pixels)
    if rgb.dtype != np.uint8 or rgb.ndim != 3 or rgb.shape[2] != 3 or 0 in rgb.shape:
        raise GraphirError(f"an image is RGB bytes [height, width, 3], got {rgb.dtype} {list(rgb.shape)}")
    prep = tower.image_prep
    if prep.layout not in _LAYOUTS:
        raise GraphirError(f"{tower.name}: unknown image layout '{prep.layout}' (known: {', '.join(_LAYOUTS)})")
    return _LAYOUTS[prep.layout](rgb, tower)


def _fit(rgb: np.ndarray, tower: Any) -> list[Tile]:
    """The image letterboxed into the tower's square (mtmd's fixed-size preprocessing, PAD_CEIL)."""
    S, prep = tower.hp.image_size, tower.image_prep
    return [Tile(planes(letterbox(rgb, S, S, prep.resize, prep.pad), tower.hp))]


def _tiles(rgb: np.ndarray, tower: Any) -> list[Tile]:
    """Idefics3's slicing: the longer side resized to the file's longest edge (the other side by the aspect ratio,
    truncated, rounded up to even), then both up to whole tiles of the tower's size, cut row by row; the overview is
    the tiled image resized to one tile."""
    hp, algo = tower.hp, tower.image_prep.resize
    S, edge = hp.image_size, hp.longest_edge
    if edge <= 0:
        raise GraphirError(f"{tower.name}: the file gives no longest edge to tile images by (key "
                           f"'clip.vision.preproc_image_size')")
    h, w = rgb.shape[:2]
    aspect = w / h
    if w >= h:
        rw, rh = edge, int(edge / aspect)
        rh += rh % 2
    else:
        rw, rh = int(edge * aspect), edge
        rw += rw % 2
    nx, ny = -(-rw // S), -(-rh // S)
    tiled = resize(resize(rgb, rw, rh, algo), nx * S, ny * S, algo)
    slices = [Tile(planes(tiled[y * S:(y + 1) * S, x * S:(x + 1) * S], hp), "slice", y, x)
              for y in range(ny) for x in range(nx)]
    overview = Tile(planes(resize(tiled, S, S, algo), hp), "overview", -1, -1)
    return [overview, *slices] if tower.image_prep.overview_first else [*slices, overview]


def _pinpoints(rgb: np.ndarray, tower: Any) -> list[Tile]:
    """LLaVA-1.6's anyres as mtmd's llava-uhd preprocessing does it with the file's grid pinpoints: a picture no
    larger than the tower's square on either side is stretched to it, one image; a larger one is stretched to the
    square as the overview, and letterboxed into the best pinpoint resolution, which is cut into tiles of the square,
    row by row; the tiles first, the overview last (or first, as ``overview_first``). A file without pinpoints:
    ``fit``."""
    hp, prep = tower.hp, tower.image_prep
    S, pinpoints = hp.image_size, hp.grid_pinpoints
    if not pinpoints:
        return _fit(rgb, tower)
    h, w = rgb.shape[:2]
    overview = Tile(planes(resize(rgb, S, S, prep.resize), hp), "overview", -1, -1)
    if w <= S and h <= S:
        return [overview]
    rw, rh = best_resolution(w, h, list(zip(pinpoints[::2], pinpoints[1::2])))
    refined = letterbox(rgb, rw, rh, prep.resize, prep.tile_pad)
    slices = [Tile(planes(refined[y * S:(y + 1) * S, x * S:(x + 1) * S], hp), "slice", y, x)
              for y in range(rh // S) for x in range(rw // S)]
    return [overview, *slices] if prep.overview_first else [*slices, overview]


def best_resolution(width: int, height: int, candidates: list[tuple[int, int]]) -> tuple[int, int]:
    """The candidate (width, height) into which the picture, scaled to fit (float32, truncated), keeps the most of
    its pixels, the least area wasted among equals, the first among those (mtmd's select_best_resolution)."""
    best, kept_most, wasted_least = (0, 0), 0, None
    for cw, ch in candidates:
        scale = min(_F32(cw) / _F32(width), _F32(ch) / _F32(height))
        kept = min(int(_F32(width) * scale) * int(_F32(height) * scale), width * height)
        wasted = cw * ch - kept
        if kept > kept_most or kept == kept_most and (wasted_least is None or wasted < wasted_least):
            best, kept_most, wasted_least = (cw, ch), kept, wasted
    return best


def _aspect(rgb: np.ndarray, tower: Any) -> list[Tile]:
    """The image at its own aspect (mtmd's dyn_size preprocessing): letterboxed into the size aspect_size gives, one
    image of that size."""
    hp, prep = tower.hp, tower.image_prep
    h, w = rgb.shape[:2]
    align = hp.patch_size * hp.n_merge
    width, height = aspect_size(w, h, align, prep.min_tokens * align * align, prep.max_tokens * align * align)
    return [Tile(planes(letterbox(rgb, width, height, prep.resize, prep.pad), hp))]


def aspect_size(width: int, height: int, align: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """mtmd's calc_size_preserved_ratio in float32: each side rounded (half away from zero) to a multiple of
    ``align`` (at least one); where that holds more than ``max_pixels``, both sides scaled down by
    sqrt(pixels / max_pixels) and floored to multiples; fewer than ``min_pixels``, scaled up and rounded up."""
    a = _F32(align)

    def by(x: Any, how: Callable[[Any], Any]) -> int:
        return int(how(_F32(x) / a)) * align

    half_up = lambda x: np.floor(np.float64(x) + 0.5)  # noqa: E731  (positive: C's round)
    w_bar, h_bar = max(align, by(width, half_up)), max(align, by(height, half_up))
    if max_pixels > 0 and w_bar * h_bar > max_pixels:
        beta = np.sqrt(_F32(height) * _F32(width) / _F32(max_pixels))
        return max(align, by(_F32(width) / beta, np.floor)), max(align, by(_F32(height) / beta, np.floor))
    if min_pixels > 0 and w_bar * h_bar < min_pixels:
        beta = np.sqrt(_F32(min_pixels) / (_F32(height) * _F32(width)))
        return by(_F32(width) * beta, np.ceil), by(_F32(height) * beta, np.ceil)
    return w_bar, h_bar


_LAYOUTS = {"fit": _fit, "tiles": _tiles, "pinpoints": _pinpoints, "aspect": _aspect}


# mtmd's resampling filters (a port of Pillow's Resample.c): each one's support and weight at distance x
_FILTERS: dict[str, tuple[float, Callable[[np.ndarray], np.ndarray]]] = {
    "bilinear": (1.0, lambda x: np.where(np.abs(x) < 1.0, 1.0 - np.abs(x), 0.0)),
    "bicubic": (2.0, lambda x: _cubic(np.abs(x))),
    "lanczos": (3.0, lambda x: np.where((-3.0 <= x) & (x < 3.0), np.sinc(x) * np.sinc(x / 3.0), 0.0)),
}
_PRECISION = 22  # fixed-point bits of the weights: 32 - 8 (a byte) - 2 (headroom)


def _cubic(x: np.ndarray) -> np.ndarray:
    """Pillow's (and mtmd's) cubic filter, a = -0.5."""
    a = -0.5
    return np.where(x < 1.0, ((a + 2.0) * x - (a + 3.0)) * x * x + 1,
                    np.where(x < 2.0, (((x - 5) * x + 8) * x - 4) * a, 0.0))


def _weights(n_in: int, n_out: int, algo: str) -> tuple[np.ndarray, np.ndarray]:
    """For each output position along one axis, the input positions it reads (clipped into the axis) and their
    fixed-point weights [n_out, k] (0 past the window): mtmd's precompute_weights, a window widened by the scale when
    shrinking, the weights normalised to sum to 1, then rounded half away from zero to 2^-22."""
    support, fn = _FILTERS[algo]
    scale = n_in / n_out
    widen = max(scale, 1.0)
    k = int(np.ceil(support * widen)) * 2 + 1
    center = (np.arange(n_out) + 0.5) * scale
    lo = np.maximum((center - support * widen + 0.5).astype(np.int64), 0)
    hi = np.minimum((center + support * widen + 0.5).astype(np.int64), n_in)
    taps = np.arange(k)
    inside = taps[None, :] < (hi - lo)[:, None]
    w = np.where(inside, fn((taps[None, :] + lo[:, None] - center[:, None] + 0.5) / widen), 0.0)
    total = w.sum(axis=1, keepdims=True)
    w = np.divide(w, total, out=w, where=total != 0)
    fixed = (w * (1 << _PRECISION) + np.where(w < 0, -0.5, 0.5)).astype(np.int64)  # C's truncating cast
    return np.minimum(lo[:, None] + taps[None, :], n_in - 1), fixed


def _pass(rgb: np.ndarray, n_out: int, axis: int, algo: str) -> np.ndarray:
    """One separable pass along ``axis`` (1: columns, 0: rows): each output byte the rounded, clipped fixed-point sum
    of its window."""
    at, w = _weights(rgb.shape[axis], n_out, algo)
    acc = np.full(rgb.shape[:axis] + (n_out,) + rgb.shape[axis + 1:], 1 << (_PRECISION - 1), np.int64)
    shape = (-1, 1) if axis == 1 else (-1, 1, 1)
    for j in range(at.shape[1]):
        acc += np.take(rgb, at[:, j], axis=axis).astype(np.int64) * w[:, j].reshape(shape)
    return np.clip(acc >> _PRECISION, 0, 255).astype(np.uint8)


def resize(rgb: np.ndarray, width: int, height: int, algo: str) -> np.ndarray:
    """RGB bytes resized as mtmd's resize_pillow resizes them (bilinear, bicubic or lanczos): columns first, then
    rows, each pass only where that side changes."""
    if width <= 0 or height <= 0 or width > 65536 or height > 65536:
        raise GraphirError(f"cannot resize an image to {width} x {height} (each side 1 to 65536)")
    out = rgb if rgb.shape[1] == width else _pass(rgb, width, 1, algo)
    out = out if out.shape[0] == height else _pass(out, height, 0, algo)
    return out if out is not rgb else rgb.copy()


def letterbox(rgb: np.ndarray, width: int, height: int, algo: str,
              pad: tuple[int, int, int] = (0, 0, 0)) -> np.ndarray:
    """The image scaled by the smaller of the two ratios (float32, as mtmd), its sides rounded up, and centred on a
    canvas of the target's size filled with ``pad`` (mtmd's img_tool::resize with PAD_CEIL)."""
    h, w = rgb.shape[:2]
    if (h, w) == (height, width):
        return rgb.copy()
    scale = min(_F32(width) / _F32(w), _F32(height) / _F32(h))
    nw, nh = (min(int(np.ceil(_F32(n) * scale)), m) for n, m in ((w, width), (h, height)))
    out = np.full((height, width, 3), pad, np.uint8)
    x0, y0 = (width - nw) // 2, (height - nh) // 2
    out[y0:y0 + nh, x0:x0 + nw] = resize(rgb, nw, nh, algo)
    return out


def planes(rgb: np.ndarray, hp: Any) -> np.ndarray:
    """RGB bytes [H, W, 3] as the tower's input: float32 channel planes [3, H, W] of (byte / 255 - mean) / std, each
    step rounded to float32 as mtmd's clip_image_f32 computes it."""
    x = rgb.astype(_F32) / _F32(255.0)
    x = (x - np.asarray(hp.image_mean, _F32)) / np.asarray(hp.image_std, _F32)
    return np.ascontiguousarray(x.transpose(2, 0, 1), _F32)
