"""The token list of a GGUF vocabulary: each token's text, id, score and llama.cpp attributes.

The vocabulary reads it and the tokenizer models look tokens up in it, so it sits below both.
"""

from __future__ import annotations

import gguf

from graphir.tokenizer.metadata import Metadata

_TK = gguf.Keys.Tokenizer

# llama_token_attr bits (llama.h)
ATTR_UNDEFINED = 0
ATTR_UNKNOWN = 1 << 0
ATTR_UNUSED = 1 << 1
ATTR_NORMAL = 1 << 2
ATTR_CONTROL = 1 << 3
ATTR_USER_DEFINED = 1 << 4
ATTR_BYTE = 1 << 5
ATTR_LSTRIP = 1 << 7
ATTR_RSTRIP = 1 << 8

# tokenizer.ggml.token_type values (gguf.TokenType) -> attribute
_TYPE_TO_ATTR = {
    0: ATTR_UNDEFINED,  # UNDEFINED
    1: ATTR_NORMAL,
    2: ATTR_UNKNOWN,
    3: ATTR_CONTROL,
    4: ATTR_USER_DEFINED,
    5: ATTR_UNUSED,
    6: ATTR_BYTE,
}


def utf8(s: str) -> bytes:
    return s.encode("utf-8", "surrogatepass")


class TokenTable:
    """Every token's text (``tokens``, an empty one named ``[EMPTY_<id>]`` as llama.cpp does), id
    (``token_to_id``), score and attributes (``attrs``, llama_token_attr bits from the token types)."""

    n_vocab: int
    tokens: list[str]
    token_to_id: dict[str, int]
    scores: list[float]
    attrs: list[int]

    def _read_tokens(self, md: Metadata) -> None:
        tokens = md.array(_TK.LIST, str, required=True)
        assert tokens is not None
        n = len(tokens)
        self.n_vocab = n
        scores = md.array(_TK.SCORES, float)
        types = md.array(_TK.TOKEN_TYPE, int)
        for key, arr in ((_TK.SCORES, scores), (_TK.TOKEN_TYPE, types)):
            if arr is not None and len(arr) < n:
                raise md.err(f"{key} has {len(arr)} entries for {n} tokens")

        self.tokens = [t if t else f"[EMPTY_{i}]" for i, t in enumerate(tokens)]
        self.token_to_id = dict(zip(self.tokens, range(n)))
        if len(self.token_to_id) != n:
            first: dict[str, int] = {}
            for i, t in enumerate(self.tokens):
                j = first.setdefault(t, i)
                if j != i:
                    raise md.err(f"duplicate token in vocabulary: {t!r} has ids {j} and {i}")
        self.scores = scores[:n] if scores is not None else [0.0] * n
        self.attrs = [_TYPE_TO_ATTR.get(t, ATTR_UNDEFINED) for t in types[:n]] if types else [ATTR_NORMAL] * n
