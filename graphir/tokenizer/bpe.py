"""``tokenizer.ggml.model = "gpt2"``: byte-level BPE (llama.cpp's llm_tokenizer_bpe).

The text is cut into words by the pre-tokenizer that ``tokenizer.ggml.pre`` names; each word's UTF-8 bytes
are spelled with GPT-2's byte-to-unicode characters and merged pair by pair, lowest merge rank (then leftmost
pair) first. Detokenizing maps the characters back to bytes.
"""

from __future__ import annotations

import gguf

from graphir.tokenizer.merge import merge
from graphir.tokenizer.metadata import Metadata
from graphir.tokenizer.model import WordModel
from graphir.tokenizer.pretokenize import PRE_TOKENIZERS, SUPPORTED_PRE_TOKENIZERS
from graphir.tokenizer.tokens import TokenTable, utf8

_TK = gguf.Keys.Tokenizer


def _bytes_to_unicode() -> list[str]:
    keep = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table = [""] * 256
    for b in keep:
        table[b] = chr(b)
    n = 0
    for b in range(256):
        if not table[b]:
            table[b] = chr(256 + n)
            n += 1
    return table


_BYTE_TO_UNI = _bytes_to_unicode()
_LATIN1_TO_UNI = {b: _BYTE_TO_UNI[b] for b in range(256)}  # str.translate over bytes.decode("latin-1")
_UNI_TO_BYTE = {c: b for b, c in enumerate(_BYTE_TO_UNI)}


class Bpe(WordModel):
    """gpt2: byte-level BPE over the merges (``tokenizer.ggml.merges``), words cut by the pre-tokenizer."""

    special_ids = {"bos": 11, "eos": 11}

    def __init__(self, md: Metadata, pre: str | None) -> None:
        name = pre if pre else "default"  # llama.cpp: missing pre -> 'default' (with a warning)
        pre_tokenizer = PRE_TOKENIZERS.get(name)
        if pre_tokenizer is None:
            raise md.err(
                f"unknown pre-tokenizer {name!r} ({_TK.PRE}); supported: {', '.join(SUPPORTED_PRE_TOKENIZERS)}"
            )
        self.pre = name
        self.pre_tokenizer = pre_tokenizer
        self.clean_spaces = pre_tokenizer.clean_spaces
        self.add_bos = pre_tokenizer.add_bos
        if pre_tokenizer.no_default_bos:
            self.special_ids = {**self.special_ids, "bos": None}
        super().__init__(md, pre)

    def load(self, md: Metadata, table: TokenTable) -> None:
        super().load(md, table)
        merges = md.array(_TK.MERGES, str, required=True)
        assert merges is not None
        ranks: dict[tuple[str, str], int] = {}
        for i, m in enumerate(merges):
            cut = m.find(" ", 1)
            pair = (m[:cut], m[cut + 1 :]) if cut != -1 else ("", "")
            ranks.setdefault(pair, i)

        def rank(left: str, right: str) -> int | None:
            return ranks.get((left, right))

        self._rank = rank

    def words(self, text: str) -> list[str]:
        return self.pre_tokenizer.split(text)

    def word_ids(self, word: str) -> tuple[int, ...]:
        word = utf8(word).decode("latin-1").translate(_LATIN1_TO_UNI)
        tid = self._ids
        if self.pre_tokenizer.ignore_merges and word in tid:
            return (tid[word],)
        ids: list[int] = []
        for s in merge(word, self._rank):
            t = tid.get(s)
            if t is not None:
                ids.append(t)
                continue
            for b in utf8(s):  # not a token: its single-byte pieces that are (ASCII only)
                t = tid.get(chr(b)) if b < 0x80 else None
                if t is not None:
                    ids.append(t)
        return tuple(ids)

    def piece(self, text: str) -> bytes:
        """llama_decode_text: a byte-level token's characters back to bytes; unmapped ones are flagged in-line."""
        out = bytearray()
        for ch in text:
            b = _UNI_TO_BYTE.get(ch)
            if b is not None:
                out.append(b)
            else:
                out += b"[UNK_BYTE_0x" + utf8(ch).hex().encode() + utf8(text) + b"]"
        return bytes(out)
