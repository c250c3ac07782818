"""``tokenizer.ggml.model = "gpt2"`` (and ``"gemma4"``): BPE over merges (llama.cpp's llm_tokenizer_bpe).

The text is cut into words by the pre-tokenizer that ``tokenizer.ggml.pre`` names; each word's UTF-8 bytes
are spelled with GPT-2's byte-to-unicode characters and merged pair by pair, lowest merge rank (then leftmost
pair) first. Detokenizing maps the characters back to bytes. A few pre-tokenizers (Gemma 4's) work the
SentencePiece way instead: spaces are spelled U+2581, words stay UTF-8, and bytes no token spells are
``<0xXX>`` tokens.
"""

from __future__ import annotations

import gguf

from graphir.tokenizer.merge import merge
from graphir.tokenizer.metadata import KEY_LOWERCASE, Metadata
from graphir.tokenizer.model import ESCAPED_SPACE, WordModel
from graphir.tokenizer.pretokenize import PRE_TOKENIZERS, SUPPORTED_PRE_TOKENIZERS
from graphir.tokenizer.tokens import TokenTable, utf8
from graphir.tokenizer.unicode import LOWER, unicode_class

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


# pre-tokenizers whose files may lack merges: the words are then their single characters
_MERGES_OPTIONAL = ("kimi-k2",)


class Bpe(WordModel):
    """gpt2: byte-level BPE over the merges (``tokenizer.ggml.merges``), words cut by the pre-tokenizer."""

    special_ids = {"bos": 11, "eos": 11}
    forced_pre: str | None = None  # the pre-tokenizer the model implies, whatever tokenizer.ggml.pre says

    def __init__(self, md: Metadata, pre: str | None) -> None:
        pre = self.forced_pre or pre
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
        self.add_sep = pre_tokenizer.add_sep
        self.always_bos = pre_tokenizer.always_bos
        if pre_tokenizer.no_default_bos:
            self.special_ids = {**self.special_ids, "bos": None}
        super().__init__(md, pre)

    def load(self, md: Metadata, table: TokenTable) -> None:
        super().load(md, table)
        merges = md.array(_TK.MERGES, str, required=self.pre not in _MERGES_OPTIONAL) or []
        # "left right", cut at the first space after the first character; the first of equal pairs ranks
        pairs = [(m[:cut], m[cut + 1 :]) if (cut := m.find(" ", 1)) != -1 else ("", "") for m in merges]
        ranks = dict(zip(reversed(pairs), range(len(pairs) - 1, -1, -1)))

        def rank(left: str, right: str) -> int | None:
            return ranks.get((left, right))

        self._rank = rank

    def words(self, text: str) -> list[str]:
        if self.pre_tokenizer.spm_style:
            text = text.replace(" ", ESCAPED_SPACE)
        return self.pre_tokenizer.split(text)

    def word_ids(self, word: str) -> tuple[int, ...]:
        pre = self.pre_tokenizer
        if pre.byte_encode:
            word = utf8(word).decode("latin-1").translate(_LATIN1_TO_UNI)
        tid = self._ids
        whole = pre.ignore_merges or (pre.newline_runs_whole and not word.strip("\n"))
        if whole and word in tid:
            return (tid[word],)
        if " " in word and len(word) > 1:  # only where words are neither byte-spelled nor U+2581-spelled
            raise ValueError(f"{self.label}: the {self.pre!r} pre-tokenizer leaves a space inside the word {word!r}, "
                             "which llama.cpp's BPE cannot merge (it aborts)")
        ids: list[int] = []
        for s in merge(word, self._rank):
            t = tid.get(s)
            if t is not None:
                ids.append(t)
                continue
            for b in utf8(s):  # not a token: the tokens of its single bytes, where there are any
                if pre.byte_encode:
                    t = tid.get(chr(b)) if b < 0x80 else None
                else:
                    t = tid.get(f"<0x{b:02X}>")
                if t is not None:
                    ids.append(t)
        return tuple(ids)

    def piece(self, text: str) -> bytes:
        """llama_decode_text: a byte-level token's characters back to bytes; unmapped ones are flagged in-line.
        Spelled the SentencePiece way, the token's text with U+2581 as a space."""
        if self.pre_tokenizer.spm_style:
            return super().piece(text)
        out = bytearray()
        for ch in text:
            b = _UNI_TO_BYTE.get(ch)
            if b is not None:
                out.append(b)
            else:
                out += b"[UNK_BYTE_0x" + utf8(ch).hex().encode() + utf8(text) + b"]"
        return bytes(out)


class Gemma4Bpe(Bpe):
    """gemma4: BPE the SentencePiece way, always with the 'gemma4' pre-tokenizer; no special id is assumed."""

    special_ids = {"bos": None, "eos": None}
    forced_pre = "gemma4"


class WhitespaceBpe(Bpe):
    """whitespace: BPE over each run of non-whitespace, the whitespace dropped, lowercased as the normalizer says."""

    def load(self, md: Metadata, table: TokenTable) -> None:
        super().load(md, table)
        self._lowercase = md.get(KEY_LOWERCASE, bool, self.pre_tokenizer.lowercase)

    def words(self, text: str) -> list[str]:
        out: list[str] = []
        start = 0
        for i, c in enumerate(text + " "):
            if unicode_class(ord(c)) == "W":
                if i > start:
                    run = text[start:i]
                    out += super().words(run.translate(LOWER) if self._lowercase else run)
                start = i + 1
        return out


_DNA_MARKER = "\ue000"  # ends a DNA k-mer's token text, keeping it apart from a BPE token of the same letters
_DNA_K = 6


class HybridDnaBpe(Bpe):
    """hybriddna: BPE, but text between <dna> and </dna> is upper-cased DNA cut into 6-letter k-mers (the last
    padded with A), each its k-mer token or <oov>; k-mer tokens render without their marker."""

    def load(self, md: Metadata, table: TokenTable) -> None:
        super().load(md, table)
        tid = table.token_to_id
        oov = tid.get("<oov>")
        if oov is not None:  # llama.cpp erases the marker from the texts of the tokens after <oov>
            for i in range(oov + 1, table.n_vocab):
                text = table.tokens[i]
                if len(text) > len(_DNA_MARKER) and text.endswith(_DNA_MARKER):
                    table.tokens[i] = text[: -len(_DNA_MARKER)]
        self._dna = (tid.get("<dna>"), tid.get("</dna>"), oov)

    def tokenize(self, text: str, frags: list[int | tuple[int, int]], out: list[int]) -> None:
        begin, end, oov = self._dna
        if begin is None or end is None or oov is None:
            super().tokenize(text, frags, out)
            return
        for f in frags:
            if isinstance(f, int):
                out.append(f)
                continue
            pos, stop = f
            while pos < stop:
                start = text.find("<dna>", pos, stop)
                if start == -1:
                    super().tokenize(text, [(pos, stop)], out)
                    break
                if start > pos:
                    super().tokenize(text, [(pos, start)], out)
                out.append(begin)
                close = text.find("</dna>", start + 5, stop)
                self._kmers(text[start + 5 : stop if close == -1 else close], oov, out)
                if close == -1:
                    break
                out.append(end)
                pos = close + 6

    def _kmers(self, dna: str, oov: int, out: list[int]) -> None:
        seq = bytes(b - 32 if 0x61 <= b <= 0x7A else b for b in utf8(dna))
        for i in range(0, len(seq), _DNA_K):
            try:
                t = self._ids.get(seq[i : i + _DNA_K].ljust(_DNA_K, b"A").decode() + _DNA_MARKER)
            except UnicodeDecodeError:  # a k-mer that cuts a character is no token
                t = None
            out.append(oov if t is None else t)
