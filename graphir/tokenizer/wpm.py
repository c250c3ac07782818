"""``tokenizer.ggml.model = "bert"``: WordPiece (llama.cpp's llm_tokenizer_wpm).

The text is normalized code point by code point (see ``_WpmTable``) and cut into words at whitespace,
punctuation, ASCII symbols and CJK ideographs; each word, prefixed with U+2581, is split greedily into the
longest tokens from the left, and a word with any position no token starts becomes the unknown token.
convert_hf_to_gguf writes word-initial pieces with that U+2581 and ``##`` pieces bare. Every text is wrapped
in bos ([CLS]) and sep ([SEP]).
"""

from __future__ import annotations

import unicodedata
from collections.abc import Iterable, Mapping

import gguf

from graphir.tokenizer.metadata import KEY_LOWERCASE, KEY_STRIP_ACCENTS, Metadata
from graphir.tokenizer.model import ESCAPED_SPACE, WordModel
from graphir.tokenizer.tokens import ATTR_BYTE, TokenTable
from graphir.tokenizer.unicode import LOWER, unicode_class

_TK = gguf.Keys.Tokenizer

# Unicode 15.1's Cc, Cf, Cs and Co (\p{C} without the unassigned Cn): the controls WordPiece drops.
# Listed because unicodedata before Python 3.12 lacks 15.0's format controls U+13439-U+1343F.
_CONTROL = ((0x0, 0x1F), (0x7F, 0x9F), (0xAD, 0xAD), (0x600, 0x605), (0x61C, 0x61C), (0x6DD, 0x6DD),
            (0x70F, 0x70F), (0x890, 0x891), (0x8E2, 0x8E2), (0x180E, 0x180E), (0x200B, 0x200F),
            (0x202A, 0x202E), (0x2060, 0x2064), (0x2066, 0x206F), (0xD800, 0xF8FF), (0xFEFF, 0xFEFF),
            (0xFFF9, 0xFFFB), (0x110BD, 0x110BD), (0x110CD, 0x110CD), (0x13430, 0x1343F), (0x1BCA0, 0x1BCA3),
            (0x1D173, 0x1D17A), (0xE0001, 0xE0001), (0xE0020, 0xE007F), (0xF0000, 0xFFFFD), (0x100000, 0x10FFFD))

# The ideograph blocks BERT cuts into one-character words. One starts at U+2B920, not at U+2B820
# where CJK Extension E does, as in the HF tokenizers code llama.cpp follows.
_CJK = ((0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F), (0x2B740, 0x2B81F),
        (0x2B920, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F))


class _WpmTable(dict):
    """str.translate table of WordPiece normalization (memoized): each code point becomes " " (whitespace,
    ends a word), "" (dropped), " c " (a word of its own) or its normal form c, which joins the word.

    As llama.cpp: with ``strip_accents`` a code point is first replaced by the first code point of its
    NFD (one for one, so Hangul syllables keep only their leading jamo) and marks are dropped; then
    whitespace, controls and U+FFFD are handled; then ``lowercase`` maps it by the simple lowercase.
    Punctuation, ASCII symbols and CJK ideographs are one-character words; other symbols (emoji) are not.
    """

    def __init__(self, lowercase: bool, strip_accents: bool) -> None:
        super().__init__()
        self.lowercase = lowercase
        self.strip_accents = strip_accents

    def __missing__(self, key: int) -> str:
        cp, cls = key, unicode_class(key)
        # unicodedata's NFD is 15.1's for every code point 15.1 assigns: decompositions never change, and
        # none of the code points 14.0-15.1 added has one; "O" skips those a newer Unicode assigns
        if self.strip_accents and cls != "O":
            cp = ord(unicodedata.normalize("NFD", chr(cp))[0])
            cls = unicode_class(cp)
        if cls == "W":
            out = " "
        elif cp == 0xFFFD or any(a <= cp <= b for a, b in _CONTROL) or (self.strip_accents and cls == "M"):
            out = ""  # NUL, which llama.cpp tests for by name, is among the controls
        else:
            c = chr(LOWER.get(cp, cp) if self.lowercase else cp)
            alone = cls == "P" or (cls == "S" and cp < 0x7F) or any(a <= cp <= b for a, b in _CJK)
            out = f" {c} " if alone else c
        self[key] = out
        return out


class Wpm(WordModel):
    """bert: WordPiece, longest tokens first, over text normalized as BertNormalizer does."""

    special_ids = {"bos": 101, "unk": 100, "sep": 102, "pad": 0, "mask": 103}
    add_bos = True
    add_sep = True
    always_wraps = True

    def __init__(self, md: Metadata, pre: str | None) -> None:
        lowercase = md.get(KEY_LOWERCASE, bool, True)
        self._table = _WpmTable(lowercase, md.get(KEY_STRIP_ACCENTS, bool, lowercase))
        super().__init__(md, pre)

    def finish(self, table: TokenTable, special: Mapping[str, int | None], add_bos: bool, add_eos: bool) -> None:
        for key, name in ((_TK.BOS_ID, "bos"), (_TK.SEP_ID, "sep")):  # llama.cpp asserts both when it adds them
            if special[name] is None:
                raise self._err(f"a WordPiece vocabulary wraps texts in bos and sep, but {key} is not set")
        byte = next((i for i, a in enumerate(table.attrs) if a & ATTR_BYTE), None)
        if byte is not None:  # llama.cpp aborts rendering it
            raise self._err(f"token {byte} of a WordPiece vocabulary has the byte type ({_TK.TOKEN_TYPE})")
        self._max_token_len = max(map(len, table.tokens))
        self._unk = special["unk"]

    def words(self, text: str) -> Iterable[str]:
        return filter(None, text.translate(self._table).split(" "))

    def word_ids(self, word: str) -> tuple[int, ...]:
        word = ESCAPED_SPACE + word
        tid, n = self._ids, len(word)
        ids: list[int] = []
        i = 0
        while i < n:
            for j in range(min(n, i + self._max_token_len), i, -1):
                t = tid.get(word[i:j])
                if t is not None:
                    ids.append(t)
                    i = j
                    break
            else:  # no token starts here: the whole word is unknown
                if self._unk is None:
                    raise self._err(f"the text has a word no token covers, and {_TK.UNK_ID} is not set")
                return (self._unk,)
        return tuple(ids)
