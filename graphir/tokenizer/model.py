"""The interface of a tokenizer model: what each ``tokenizer.ggml.model`` value decides for its vocabulary.

A vocabulary does the same around every model: it reads the token list, resolves special tokens and cuts them
out of the text, renders pieces and joins them. For the rest it asks its model (one subclass of
:class:`TokenizerModel` per value, graphir.tokenizer.vocab.MODELS): llama.cpp's defaults for that model, the
keys only it reads, how text between special tokens becomes ids and how a normal token's text becomes bytes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import gguf

from graphir.errors import MetadataError
from graphir.tokenizer.metadata import Metadata
from graphir.tokenizer.tokens import (ATTR_BYTE, ATTR_CONTROL, ATTR_NORMAL, ATTR_UNKNOWN, ATTR_USER_DEFINED,
                                      TokenTable, utf8)

_TK = gguf.Keys.Tokenizer

ESCAPED_SPACE = "\u2581"  # how SentencePiece and WordPiece vocabularies spell a space
_WORD_CACHE_MAX = 1 << 16  # words whose ids a WordModel keeps; when full it starts over


class TokenizerModel:
    """One tokenizer model. It is made from the metadata before the token list is read (it reads its own keys
    and says llama.cpp's defaults), :meth:`load` and :meth:`finish` hand it the token list and then the special
    ids, and from then on the vocabulary asks it to :meth:`tokenize` and to render normal tokens (:meth:`piece`).
    """

    special_ids: Mapping[str, int | None] = {}  # ids llama.cpp assumes where the metadata names none
    add_space_prefix = False
    add_bos = False
    add_eos = False
    add_sep = False  # llama.cpp's default for tokenizer.ggml.add_sep_token (read by embedding callers)
    always_bos = False  # add_bos is true whatever tokenizer.ggml.add_bos_token says
    clean_spaces = True  # detokenizing applies clean_up_tokenization_spaces
    always_wraps = False  # tokenizing with add_special adds bos and sep whatever add_bos and add_eos say
    adds_specials = True  # tokenizing with add_special adds bos/eos as add_bos/add_eos say
    pre: str | None = None  # the tokenizer.ggml.pre in effect: llama.cpp reads it for gpt2 vocabularies only

    def __init__(self, md: Metadata, pre: str | None) -> None:
        """Subclasses read their own keys first, then call this: llama.cpp's order, and so its errors'."""
        self.label = md.label
        self.add_space_prefix = md.get(_TK.ADD_PREFIX, bool, self.add_space_prefix)

    def load(self, md: Metadata, table: TokenTable) -> None:
        """The token list is read: keep what tokenizing looks up, read what the model adds to it."""
        self._ids = table.token_to_id

    def finish(self, table: TokenTable, special: Mapping[str, int | None], add_bos: bool, add_eos: bool) -> None:
        """The special ids are known: refuse a vocabulary llama.cpp fails on, keep what tokenizing needs."""
        if add_bos and special["bos"] is None:
            raise self._err(f"{_TK.ADD_BOS} is true, but {_TK.BOS_ID} is not set")
        if add_eos and special["eos"] is None:
            raise self._err(f"{_TK.ADD_EOS} is true, but {_TK.EOS_ID} is not set")

    def tokenize(self, text: str, frags: list[int | tuple[int, int]], out: list[int]) -> None:
        """Append the ids of ``text`` cut into ``frags``: special token ids, and (start, end) spans to tokenize."""
        raise NotImplementedError

    def render(self, attr: int, text: str) -> bytes:
        """The bytes of a token with attributes ``attr``: special and user-defined tokens are their text, normal
        ones :meth:`piece`, byte tokens their byte, the rest (unused, undefined) nothing."""
        if attr & (ATTR_UNKNOWN | ATTR_CONTROL | ATTR_USER_DEFINED):
            return utf8(text)
        if attr & ATTR_NORMAL:
            return self.piece(text)
        if attr & ATTR_BYTE:
            return bytes([int(text[3:5], 16)])
        return b""

    def piece(self, text: str) -> bytes:
        """The bytes of a normal token: its text, with U+2581 as a space."""
        return utf8(text.replace(ESCAPED_SPACE, " "))

    def _err(self, msg: str) -> MetadataError:
        return MetadataError(f"{self.label}: {msg}")


class WordModel(TokenizerModel):
    """A model that cuts text into words and tokenizes each word on its own, so it keeps each word's ids."""

    def load(self, md: Metadata, table: TokenTable) -> None:
        super().load(md, table)
        self._words: dict[str, tuple[int, ...]] = {}

    def words(self, text: str) -> Iterable[str]:
        """The words of a span of text (none empty)."""
        raise NotImplementedError

    def word_ids(self, word: str) -> tuple[int, ...]:
        """The ids of one word."""
        raise NotImplementedError

    def tokenize(self, text: str, frags: list[int | tuple[int, int]], out: list[int]) -> None:
        words, word_ids = self._words, self.word_ids
        for f in frags:
            if isinstance(f, int):
                out.append(f)
                continue
            for w in self.words(text[f[0] : f[1]]):
                ids = words.get(w)
                if ids is None:
                    ids = word_ids(w)
                    if len(words) >= _WORD_CACHE_MAX:
                        words.clear()
                    words[w] = ids
                out.extend(ids)


class SpanModel(TokenizerModel):
    """A model that tokenizes each span between special tokens whole (no words, no cache), adding no BOS or EOS
    and cleaning no spaces: llama.cpp's plamo2, rwkv and test tokenizers."""

    clean_spaces = False
    adds_specials = False

    def encode(self, text: str, out: list[int]) -> None:
        """Append the ids of one span of text."""
        raise NotImplementedError

    def tokenize(self, text: str, frags: list[int | tuple[int, int]], out: list[int]) -> None:
        for f in frags:
            if isinstance(f, int):
                out.append(f)
            else:
                self.encode(text[f[0] : f[1]], out)
