"""``tokenizer.ggml.model = "llama"``: SentencePiece-style BPE over scores (llama.cpp's llm_tokenizer_spm).

Spaces become U+2581 and a space is prefixed to each run of text that starts the text or follows a special
token (``add_space_prefix``); adjacent symbols merge while their concatenation is a token, highest score (then
leftmost) first, and whatever is left that is not a token falls back to ``<0xXX>`` byte tokens.
"""

from __future__ import annotations

import heapq

from graphir.tokenizer.metadata import Metadata
from graphir.tokenizer.model import ESCAPED_SPACE, TokenizerModel
from graphir.tokenizer.tokens import TokenTable, utf8


class Spm(TokenizerModel):
    """llama: merges by token score, with byte-fallback tokens for what no token covers."""

    special_ids = {"bos": 1, "eos": 2, "unk": 0}
    add_space_prefix = True
    add_bos = True
    clean_spaces = False

    def load(self, md: Metadata, table: TokenTable) -> None:
        super().load(md, table)
        self._scores = table.scores

    def tokenize(self, text: str, frags: list[int | tuple[int, int]], out: list[int]) -> None:
        prev_special = True
        for f in frags:
            if isinstance(f, int):
                out.append(f)
                prev_special = True
            else:
                piece = text[f[0] : f[1]]
                if self.add_space_prefix and prev_special:
                    piece = " " + piece
                self._merge(piece.replace(" ", ESCAPED_SPACE), out)
                prev_special = False

    def _merge(self, text: str, out: list[int]) -> None:
        if not text:
            return
        tid, scores = self._ids, self._scores
        sym = list(text)
        n = len(sym)
        size = [1] * n  # in code points; a merged symbol only grows, so this detects stale pairs
        prev = list(range(-1, n - 1))
        nxt = list(range(1, n + 1))
        nxt[-1] = -1
        heap: list[tuple[float, int, int, int]] = []

        def add(left: int, right: int) -> None:
            if left < 0 or right < 0:
                return
            t = tid.get(sym[left] + sym[right])
            if t is not None:
                heapq.heappush(heap, (-scores[t], left, right, size[left] + size[right]))

        for i in range(1, n):
            add(i - 1, i)
        while heap:
            _, left, right, sz = heapq.heappop(heap)
            if size[left] == 0 or size[right] == 0 or size[left] + size[right] != sz:
                continue
            sym[left] += sym[right]
            size[left] = sz
            size[right] = 0
            nxt[left] = nxt[right]
            if nxt[right] >= 0:
                prev[nxt[right]] = left
            add(prev[left], left)
            add(left, nxt[left])
        i = 0
        while i != -1:
            s = sym[i]
            t = tid.get(s)
            if t is not None:
                out.append(t)
            else:
                out.extend(self._byte_token(b) for b in utf8(s))
            i = nxt[i]

    def _byte_token(self, b: int) -> int:
        t = self._ids.get(f"<0x{b:02X}>")
        if t is None and b < 0x80:
            t = self._ids.get(chr(b))
        if t is None:
            raise self._err(f"no byte-fallback token <0x{b:02X}> for a byte of the text")
        return t
