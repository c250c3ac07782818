"""A text model's context with a tower beside it, as llama.cpp's mtmd composes them: a prompt's media markers are
replaced by the pictures' (or audio files') rows, wrapped in the text the projector asks for, and the whole decoded
in order, text as tokens and each image's rows as a batch of embedding rows at the next positions (mtmd_tokenize, then
mtmd_helper_eval_chunks)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from graphir.batch import Batch
from graphir.errors import BatchError, GraphirError
from graphir.media.audio import read_audio
from graphir.media.image import Tile, read_image

MARKER = "<__media__>"  # mtmd's default media marker
# an image file, or RGB bytes [H, W, 3]; for an audio tower, an audio file or float32 mono samples [n]
Picture = str | os.PathLike[str] | np.ndarray


@dataclass(frozen=True)
class Chunk:
    """A piece of a multimodal prompt, in order: text tokens, or one image's rows [n, n_embd] (``both_ways``: the
    decoder takes them with causal attention off; ``grid``: the (columns, lines) they lie in, for a decoder with
    M-RoPE)."""

    tokens: tuple[int, ...] = ()
    rows: np.ndarray | None = None
    both_ways: bool = False
    grid: tuple[int, int] | None = None

    def __len__(self) -> int:
        return len(self.tokens) if self.rows is None else len(self.rows)


class MultimodalContext:
    """``model.new_context(mmproj=...)``: ``text`` is the model's own context (any of its parameters), ``tower``
    the mmproj file's (graphir.running.tower). ``tokenize`` splits a prompt and its pictures as mtmd does,
    ``eval`` decodes them; then ``text`` generates as any context."""

    kind = "multimodal"

    def __init__(self, model: Any, mmproj: Any, **kw: Any):
        if not mmproj.arch.tower:  # before any context is made: nothing compiled for a wrong file
            raise GraphirError(f"{mmproj.meta.label}: is a '{mmproj.arch.name}' model, not an mmproj file's tower")
        self.model = model
        self.tower = mmproj.new_context()
        if self.tower.n_embd != model.arch.n_embd_inp:
            raise GraphirError(f"{mmproj.meta.label}: its projector makes rows of {self.tower.n_embd}, but "
                               f"{model.meta.label} takes rows of {model.arch.n_embd_inp}: not this model's mmproj")
        self.text = model.new_context(**kw)
        self._found: dict[str, int] = {}

    def tokenize(self, prompt: str, pictures: Sequence[Picture] = (), add_special: bool = True,
                 parse_special: bool = True) -> list[Chunk]:
        """The prompt's chunks: the text between markers as tokens, each marker its picture's images wrapped in
        the tower's text (MediaText), BOS first where the vocabulary adds one. One picture per marker."""
        parts = prompt.split(MARKER)
        if len(parts) - 1 != len(pictures):
            raise GraphirError(f"the prompt has {len(parts) - 1} media markers ({MARKER}) for {len(pictures)} "
                               f"pictures: one picture per marker")
        images = [self._read(p) if not isinstance(p, np.ndarray) else p for p in pictures]  # every file read first
        vocab = self.model.vocab
        chunks: list[Chunk] = []
        for i, part in enumerate(parts):
            self._text(chunks, vocab.tokenize(part, add_special=False, parse_special=parse_special))
            if i < len(images):
                self._picture(chunks, images[i])
        if add_special and vocab.add_bos:
            first = chunks[0] if chunks else None
            if first is not None and first.rows is None:
                chunks[0] = Chunk((vocab.bos, *first.tokens))
            else:
                chunks.insert(0, Chunk((vocab.bos,)))
        if add_special and vocab.add_eos:
            self._text(chunks, [vocab.eos])
        return chunks

    def eval(self, chunks: Sequence[Chunk], n_past: int = 0, seq_id: int = 0) -> int:
        """Decode the chunks at positions from ``n_past`` in batches of the context's n_batch, the last token's
        logits kept (mtmd_helper_eval_chunks); returns the next position. A decoder with M-RoPE takes an image's
        rows at one time, each at its line and column from there, and the text after it that many positions on as
        the grid's longer side (mtmd_image_tokens_get_decoder_pos, mtmd_image_tokens_get_n_pos)."""
        ctx = self.text
        for i, chunk in enumerate(chunks):
            last = i == len(chunks) - 1
            grid = chunk.grid if self.model.arch.positions_per_token > 1 else None
            for start in range(0, len(chunk), ctx.n_batch):
                n = min(ctx.n_batch, len(chunk) - start)
                outputs = "last" if last and start + n == len(chunk) else "none"
                pos = _planar(n_past, grid, start, n) if grid else np.arange(n_past + start, n_past + start + n)
                if chunk.rows is None:
                    batch = Batch.from_tokens(chunk.tokens[start:start + n], n_past + start, seq_id, outputs)
                else:
                    batch = Batch.from_embd(chunk.rows[start:start + n], pos, seq_id, outputs)
                ctx.set_causal_attn(not chunk.both_ways)
                try:
                    ctx.decode(batch)
                finally:
                    ctx.set_causal_attn(True)
            n_past += max(grid) if grid else len(chunk)
        return n_past

    def _text(self, chunks: list[Chunk], tokens: Sequence[int]) -> None:
        """Tokens after the last chunk: joined to it where it is text (mtmd's add_text)."""
        if not tokens:
            return
        if chunks and chunks[-1].rows is None:
            chunks[-1] = Chunk(chunks[-1].tokens + tuple(tokens))
        else:
            chunks.append(Chunk(tuple(tokens)))

    def _read(self, path: str | os.PathLike[str]) -> np.ndarray:
        """A media file as the tower takes it: an image's RGB bytes, an audio file's samples at the tower's rate."""
        arch = self.tower.model.arch
        return read_audio(path, arch.audio_prep.sample_rate) if arch.modality == "audio" else read_image(path)

    def _picture(self, chunks: list[Chunk], media: np.ndarray) -> None:
        """A picture's images (an audio's chunks) and the text around them, as mtmd's add_media places them."""
        wrap, vocab = self.tower.model.arch.media_text, self.model.vocab
        parsed = lambda text: vocab.tokenize(text, add_special=False, parse_special=True)  # noqa: E731
        self._text(chunks, parsed(wrap.begin) if wrap.begin else [])
        if self.tower.model.arch.modality == "audio":  # each chunk's rows, no text between them
            chunks += [Chunk(rows=rows, both_ways=wrap.both_ways) for rows in self.tower.encode_audio(media)]
        else:
            encoded = self.tower.encode_image(media)
            n_cols = max((t.col for t, _ in encoded if t.kind == "slice"), default=-1) + 1
            n_rows = max((t.row for t, _ in encoded if t.kind == "slice"), default=-1) + 1
            for tile, rows in encoded:
                self._image(chunks, tile, rows, wrap, parsed, n_rows, n_cols)
        self._text(chunks, parsed(wrap.end) if wrap.end else [])

    def _image(self, chunks: list[Chunk], tile: Tile, rows: np.ndarray, wrap: Any, parsed: Any, n_rows: int,
               n_cols: int) -> None:
        if tile.kind == "overview":
            self._text(chunks, [self._token(t) for t in wrap.overview_start])
        elif tile.kind == "slice" and wrap.slice_start:
            self._text(chunks, parsed(wrap.slice_start.format(row=tile.row + 1, col=tile.col + 1)))
        arch, (height, width) = self.tower.model.arch, tile.pixels.shape[1:]
        sized = arch.at_size(width, height) if arch.any_size else arch
        chunks.append(Chunk(rows=rows, both_ways=wrap.both_ways, grid=sized.row_grid(len(rows))))
        if tile.kind == "overview":
            self._text(chunks, [self._token(t) for t in wrap.overview_end])
        elif tile.kind == "slice" and tile.col == n_cols - 1 and tile.row != n_rows - 1:
            self._text(chunks, [self._token(t) for t in wrap.row_end])

    def _token(self, text: str) -> int:
        """The first token whose piece is ``text`` (mtmd's lookup_token)."""
        if text not in self._found:
            vocab, want = self.model.vocab, text.encode()
            found = next((i for i in range(vocab.n_vocab) if vocab.token_to_piece(i, special=True) == want), None)
            if found is None:
                raise BatchError(f"{self.model.meta.label}: the vocabulary has no token {text!r}, which "
                                 f"{self.tower.model.arch.name} wraps its images in")
            self._found[text] = found
        return self._found[text]


def _planar(n_past: int, grid: tuple[int, int], start: int, n: int) -> np.ndarray:
    """Rows start .. start + n of an image at time n_past in a grid of (columns, lines), section-major: the time,
    n_past plus each row's line, n_past plus its column, 0 (mtmd's M-RoPE positions of an image)."""
    at = np.arange(start, start + n)
    return np.concatenate([np.full(n, n_past), n_past + at // grid[0], n_past + at % grid[0], np.zeros(n, np.int64)])
