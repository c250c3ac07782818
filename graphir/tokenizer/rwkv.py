"""``tokenizer.ggml.model = "rwkv"``: RWKV's "world" tokenizer (llama.cpp's llm_tokenizer_rwkv).

Tokens are byte strings, written escaped in the token list (``\\n``, ``\\t``, ``\\r``, ``\\xhh``, ``\\`` before
any other character keeps it). The text's bytes are cut greedily from the left into the longest token that
starts there, as llama.cpp's trie walk finds it: it stops at the first byte no token continues with. Every
token renders as its bytes. No BOS or EOS is added and detokenizing cleans no spaces.
"""

from __future__ import annotations

from collections.abc import Mapping

from graphir.tokenizer.metadata import Metadata
from graphir.tokenizer.model import SpanModel
from graphir.tokenizer.tokens import TokenTable, utf8

_ESCAPES = {ord("t"): b"\t", ord("n"): b"\n", ord("r"): b"\r"}


def unescape(text: str) -> bytes:
    """A token's bytes, as llama_unescape_rwkv_token reads them (hex digits above 'a' and below it alike: an
    upper-case or non-hex digit gives what llama.cpp's arithmetic gives)."""
    out = bytearray()
    escaping, hex_left, acc = False, 0, 0
    for b in utf8(text):
        if hex_left:
            acc = ((acc << 4) + (b - 0x61 + 10 if 0x61 <= b < 0x80 else b - 0x30)) & 0xFF
            hex_left -= 1
            if not hex_left:
                out.append(acc)
                acc = 0
        elif escaping:
            if b == ord("x"):
                hex_left = 2
            else:
                out += _ESCAPES.get(b, bytes([b]))
            escaping = False
        elif b == ord("\\"):
            escaping = True
        else:
            out.append(b)
    return bytes(out)


class Rwkv(SpanModel):
    """rwkv: the longest token at each byte, from the left."""

    special_ids = {"bos": None, "eos": None, "unk": None}

    def load(self, md: Metadata, table: TokenTable) -> None:
        super().load(md, table)
        self._by_bytes: dict[bytes, int] = {}  # a later token with the same bytes wins, as in llama.cpp's trie
        self._continued: set[bytes] = set()  # every prefix of a token: where the trie walk can go on
        for i, text in enumerate(table.tokens):
            data = unescape(text)
            self._by_bytes[data] = i
            self._continued.update(data[:k] for k in range(1, len(data) + 1))

    def finish(self, table: TokenTable, special: Mapping[str, int | None], add_bos: bool, add_eos: bool) -> None:
        super().finish(table, special, add_bos, add_eos)
        self._unk = special["unk"]

    def encode(self, text: str, out: list[int]) -> None:
        data = utf8(text)
        pos, n = 0, len(data)
        while pos < n:
            if data[pos : pos + 1] not in self._continued:
                if self._unk is None:
                    raise ValueError(f"{self.label}: no token starts with the byte 0x{data[pos]:02x} and the "
                                     "vocabulary has no unknown token (llama.cpp would emit id -1)")
                out.append(self._unk)
                pos += 1
                continue
            end = None
            k = pos + 1
            while k <= n and data[pos:k] in self._continued:
                if data[pos:k] in self._by_bytes:
                    end = k
                k += 1
            if end is None:
                raise ValueError(f"{self.label}: no token is a prefix of the text at byte {pos} "
                                 "(llama.cpp would loop forever)")
            out.append(self._by_bytes[data[pos:end]])
            pos = end

    def render(self, attr: int, text: str) -> bytes:
        """Every token, special or not, is its unescaped bytes."""
        return unescape(text)
