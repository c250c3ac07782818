"""The merge loop that BPE and SentencePiece share: adjacent symbols merge, best pair first.

The models differ only in what ranks a pair: BPE's merge rank of the pair, SentencePiece's score of the token
the pair spells. Both merge the best-ranked pair (ties: the leftmost) and then rank the new symbol's pairs with
its neighbours, until no pair ranks at all (llama.cpp's llm_tokenizer_bpe and llm_tokenizer_spm).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable


def merge(text: str, rank: Callable[[str, str], float | None]) -> list[str]:
    """The symbols ``text`` ends as: its characters, merged while ``rank`` of a pair is not None, lowest first."""
    sym = list(text)
    n = len(sym)
    if n < 2:
        return sym
    size = [1] * n  # in code points; a merged symbol only grows, so a pair whose sizes no longer add up is stale
    prev = list(range(-1, n - 1))
    nxt = list(range(1, n + 1))
    nxt[-1] = -1
    heap: list[tuple[float, int, int, int]] = []
    for i in range(1, n):
        r = rank(sym[i - 1], sym[i])
        if r is not None:
            heapq.heappush(heap, (r, i - 1, i, 2))
    while heap:
        _, left, right, sz = heapq.heappop(heap)
        if size[left] == 0 or size[right] == 0 or size[left] + size[right] != sz:
            continue
        sym[left] += sym[right]
        sym[right] = ""
        size[left] = sz
        size[right] = 0
        after = nxt[left] = nxt[right]
        if after >= 0:
            prev[after] = left
        for a, b in ((prev[left], left), (left, after)):
            if a >= 0 and b >= 0:
                r = rank(sym[a], sym[b])
                if r is not None:
                    heapq.heappush(heap, (r, a, b, size[a] + size[b]))
    return [s for s in sym if s]
