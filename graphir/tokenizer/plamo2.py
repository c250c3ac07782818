"""``tokenizer.ggml.model = "plamo2"``: PLaMo 2's (and PLaMo 3's) tokenizer (llama.cpp's llm_tokenizer_plamo2).

The cheapest cut of the text into pieces, found from the end: a piece is a token (any token but a byte token)
that starts at the position and costs minus its score (scaled by 1e4 and rounded to an integer), or a single
code point no token covers, which costs 1e7 and becomes the byte tokens of its UTF-8. Among equal costs the
longer piece wins. llama.cpp finds the tokens at a position through the longest string that starts there and
is a suffix of some token, then that string's prefixes that are tokens, longest first; a token whose scaled
score is exactly the unknown cost ends that list, so we walk the same list. The text is not changed (no space
prefix, no U+2581) and no BOS or EOS is added.
"""

from __future__ import annotations

import math
import string

from graphir.tokenizer.metadata import Metadata
from graphir.tokenizer.model import SpanModel
from graphir.tokenizer.tokens import ATTR_BYTE, TokenTable, utf8

_UNKNOWN = -10_000_000  # the scaled score of a code point no token covers
_INVALID = -20_000_000  # a suffix that is not a token, or a token whose score is not finite
_SENTINEL = ("", _UNKNOWN, -1)  # (text, scaled score, id) of the row that ends every list


def _byte_of(text: str) -> int | None:
    """The byte a ``<0xXX>`` token stands for; None for any other text."""
    if len(text) == 6 and text.startswith("<0x") and text.endswith(">") and set(text[3:5]) <= set(string.hexdigits):
        return int(text[3:5], 16)
    return None


def _scaled(score: float) -> int:
    """std::round(score * 1e4) as an int32: halves away from zero."""
    if not math.isfinite(score):
        return _INVALID
    x = score * 1e4
    return int(math.copysign(math.floor(abs(x) + 0.5), x))


class Plamo2(SpanModel):
    """plamo2: the cheapest cut into scored tokens, byte tokens for code points no token covers."""

    special_ids = {"bos": 1, "eos": 2, "unk": 0, "pad": 3}

    def load(self, md: Metadata, table: TokenTable) -> None:
        super().load(md, table)
        self._bytes: dict[int, int] = {}
        # every token's text and every suffix of one: (scaled score, id) for tokens, (_INVALID, -1) for the rest
        known: dict[str, tuple[int, int]] = {}
        for i, (text, score, attr) in enumerate(zip(table.tokens, table.scores, table.attrs)):
            if attr & ATTR_BYTE:
                b = _byte_of(text)
                if b is not None:
                    self._bytes[b] = i
                continue
            known[text] = (_scaled(score), i)
            for k in range(1, len(text)):
                known.setdefault(text[k:], (_INVALID, -1))
        missing = [b for b in range(256) if b not in self._bytes]
        if missing:
            raise md.err(f"plamo2 vocabulary without the byte token <0x{missing[0]:02X}> (llama.cpp refuses it)")
        self._known = known

    def _rows(self, longest: str) -> list[tuple[str, int, int]]:
        """The list llama.cpp walks for ``longest``: its prefixes that are known, longest first, then the sentinel."""
        known = self._known
        rows = [(p, *known[p]) for n in range(len(longest), 0, -1) if (p := longest[:n]) in known]
        return [*rows, _SENTINEL]

    def encode(self, text: str, out: list[int]) -> None:
        if text[:1] == "\ufeff":
            text = text[1:]
        n = len(text)
        cost = [0] * (n + 1)
        step: list[tuple[int, int]] = [(1, -1)] * n  # (length, token id or -1 for bytes)
        longest = ""  # the longest known string starting at the next position
        for i in range(n - 1, -1, -1):
            c, found = text[i], ""
            for prefix, score, _ in self._rows(longest):
                if c + prefix in self._known:
                    found = c + prefix
                    break
                if score == _UNKNOWN:
                    break
            longest = found
            best = 1 << 60
            for prefix, score, tid in self._rows(longest):
                length = len(prefix) or 1
                if score > _INVALID and cost[i + length] - score < best:
                    best = cost[i + length] - score
                    step[i] = (length, tid)
                if score == _UNKNOWN:
                    break
            cost[i] = best
        i = 0
        while i < n:
            length, tid = step[i]
            if tid >= 0:
                out.append(tid)
            else:
                out.extend(self._bytes[b] for b in utf8(text[i]))
            i += length

    def render(self, attr: int, text: str) -> bytes:
        """A byte token is its byte; every other token its text, unused ones too."""
        b = _byte_of(text) if attr & ATTR_BYTE else None
        return utf8(text) if b is None else bytes([b])
