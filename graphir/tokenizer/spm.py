"""``tokenizer.ggml.model = "llama"``: SentencePiece-style BPE over scores (llama.cpp's llm_tokenizer_spm).

Spaces become U+2581 and a space is prefixed to each run of text that starts the text or follows a special
token (``add_space_prefix``); adjacent symbols merge while their concatenation is a token, highest score (then
leftmost) first, and whatever is left that is not a token falls back to ``<0xXX>`` byte tokens.
"""

from __future__ import annotations

from graphir.tokenizer.merge import merge
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
        tid, scores = self._ids, table.scores

        def rank(left: str, right: str) -> float | None:
            t = tid.get(left + right)
            return None if t is None else -scores[t]

        self._rank = rank

    def tokenize(self, text: str, frags: list[int | tuple[int, int]], out: list[int]) -> None:
        tid = self._ids
        prev_special = True
        for f in frags:
            if isinstance(f, int):
                out.append(f)
                prev_special = True
            else:
                piece = text[f[0] : f[1]]
                if self.add_space_prefix and prev_special:
                    piece = " " + piece
                for s in merge(piece.replace(" ", ESCAPED_SPACE), self._rank):
                    t = tid.get(s)
                    if t is not None:
                        out.append(t)
                    else:
                        out.extend(self._byte_token(b) for b in utf8(s))
                prev_special = False

    def _byte_token(self, b: int) -> int:
        t = self._ids.get(f"<0x{b:02X}>")
        if t is None and b < 0x80:
            t = self._ids.get(chr(b))
        if t is None:
            raise self._err(f"no byte-fallback token <0x{b:02X}> for a byte of the text")
        return t
