"""``tokenizer.ggml.model = "test"``: llama.cpp's dummy tokenizer, which the tiny models it makes for its
architecture tests carry.

Each run of text between special tokens is cut into chunks of 5 bytes; a chunk's id is its polynomial hash (base
31, over the bytes, modulo 2**64) modulo the vocabulary size. A token renders as its id in hexadecimal. No BOS or
EOS is added.
"""

from __future__ import annotations

from graphir.tokenizer.metadata import Metadata
from graphir.tokenizer.model import SpanModel
from graphir.tokenizer.tokens import TokenTable, utf8

_CHUNK = 5


class Chunks(SpanModel):
    """test: ids hashed from 5-byte chunks, pieces the ids in hex."""

    special_ids = {"bos": None, "eos": None, "unk": None}

    def load(self, md: Metadata, table: TokenTable) -> None:
        super().load(md, table)
        self._n_vocab = table.n_vocab

    def encode(self, text: str, out: list[int]) -> None:
        data = utf8(text)
        for i in range(0, len(data), _CHUNK):
            h = 0
            for b in data[i : i + _CHUNK]:
                h = (h * 31 + b) & 0xFFFF_FFFF_FFFF_FFFF
            out.append(h % self._n_vocab)

    def render(self, attr: int, text: str) -> bytes:
        return b"%x" % self._ids[text]
