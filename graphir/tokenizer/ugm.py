"""``tokenizer.ggml.model = "t5"``: SentencePiece's unigram model (llama.cpp's llm_tokenizer_ugm).

Each span of text between special tokens is normalized on its own, then cut into the tokens whose scores add up
highest (Viterbi). All of it works on UTF-8 bytes, as llama.cpp does, because the normalizer can stop inside a
code point and the rest has to see the same bytes llama.cpp sees.

Normalizing: at each position, the longest way into the user-defined tokens' trie is kept as it is -- the
deepest path, not the longest whole token, so a mere prefix of a user-defined token escapes normalization;
otherwise the longest key of the precompiled charsmap (SentencePiece's NFKC table: a double-array trie and
NUL-terminated replacements) is replaced; otherwise one code point is kept (a byte that starts none becomes
U+FFFD). Then every space becomes U+2581: with ``remove_extra_whitespaces`` runs of spaces go and each word
gets one U+2581 before it (whatever ``add_space_prefix`` says), else one more goes before the first word only
with ``add_space_prefix``. A vocabulary without a charsmap skips the replacing, not the rest.

Viterbi: normal, user-defined (score 0) and unused tokens are candidates; a code point no token covers exactly
is also the unknown token, at the lowest normal score minus 10, and adjacent unknown tokens become one.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping

import gguf
import numpy as np

from graphir.tokenizer.metadata import Metadata
from graphir.tokenizer.model import ESCAPED_SPACE, TokenizerModel
from graphir.tokenizer.tokens import ATTR_NORMAL, ATTR_UNUSED, ATTR_USER_DEFINED, TokenTable, utf8

_TK = gguf.Keys.Tokenizer

_SPACE = utf8(ESCAPED_SPACE)
_FFFD = utf8("\ufffd")
_UNK_PENALTY = np.float32(10.0)  # subtracted in float32, as llama.cpp does
_WORST = -sys.float_info.max  # the score of a position no path has reached yet
_FLT_MAX = float(np.finfo(np.float32).max)
_SEARCHED = ATTR_NORMAL | ATTR_USER_DEFINED | ATTR_UNUSED  # the tokens the Viterbi search may pick

# UTF-8 length by the high four bits of a lead byte, as llama.cpp's Viterbi steps (a stray byte counts as one)
_STEP = (1,) * 12 + (2, 2, 3, 4)


def _code_point_len(data: bytes, i: int) -> int:
    """Bytes of the code point at ``data[i]``, or 0 when they are not one: llama.cpp's unicode_cpt_from_utf8,
    which checks continuation bytes but not overlong forms or surrogates."""
    b = data[i]
    if b < 0x80:
        return 1
    n = 2 if 0xC0 <= b < 0xE0 else 3 if 0xE0 <= b < 0xF0 else 4 if 0xF0 <= b < 0xF8 else 0
    if n == 0 or i + n > len(data) or any(c & 0xC0 != 0x80 for c in data[i + 1 : i + n]):
        return 0
    return n


def _charsmap_bytes(md: Metadata, raw: object) -> bytes:
    key = _TK.PRECOMPILED_CHARSMAP
    if isinstance(raw, (bytes, bytearray)):
        return bytes(raw)
    if isinstance(raw, (str, Mapping)) or not hasattr(raw, "__len__"):
        raise md.err(f"metadata key {key!r} is not an array of bytes")
    try:
        arr = np.asarray(raw)
    except (TypeError, ValueError):
        raise md.err(f"metadata key {key!r} is not an array of bytes") from None
    if arr.size and (arr.dtype.kind not in "iu" or arr.ndim != 1 or arr.min() < -128 or arr.max() > 255):
        raise md.err(f"metadata key {key!r} is not an array of bytes (int8 or uint8)")
    return arr.astype(np.uint8).tobytes()


class _Charsmap:
    """A precompiled charsmap: SentencePiece's double-array trie (darts-clone, whose subtrees are shared) over the
    bytes of the keys, and the NUL-terminated replacements its leaves point to.

    :meth:`match` walks it as llama.cpp does. llama.cpp checks indices as it walks and throws, mid-tokenization,
    on one past the end or on a replacement out of range or unterminated; here every node any bytes can reach is
    checked once at load, so such a map is refused before any text is tokenized.
    """

    def __init__(self, md: Metadata, blob: bytes) -> None:
        key = _TK.PRECOMPILED_CHARSMAP
        self.starts: frozenset[int] = frozenset()  # the first bytes of the keys
        if len(blob) < 4:
            raise md.err(f"{key} has {len(blob)} bytes, too few for the size of its trie")
        size = int.from_bytes(blob[:4], "little")
        if size + 4 >= len(blob):  # llama.cpp's own check: no room left for the replacements
            raise md.err(f"{key} says its trie has {size} bytes, but the whole map has {len(blob)}")
        n = size // 4  # llama.cpp ignores a trailing partial unit
        if n == 0:
            return
        strings = blob[4 + size :]
        u = np.frombuffer(blob, "<u4", n, 4).astype(np.int64)
        label = u & 0x800000FF  # the top bit marks value units, which no byte's label matches
        nxt = np.arange(n) ^ ((u >> 10) << ((u & 0x200) >> 6))
        leaf = (u >> 8) & 1 == 1
        labels = np.arange(1, 256)  # a NUL byte ends llama.cpp's walk
        self._root = root = int(nxt[0])
        seen, leaves = {root}, []
        states = np.array([root])
        while len(states):
            cand = states[:, None] ^ labels
            if (cand >= n).any():
                raise md.err(f"{key}: its trie points past its {n} entries")
            child = cand[label[cand] == labels]
            leaves.append(child[leaf[child]])
            new = set(nxt[child].tolist()) - seen
            seen |= new
            states = np.array(sorted(new), dtype=np.int64)
        # a leaf's replacement: the offset in the unit its child state names, up to the next NUL
        idx = np.concatenate(leaves)
        at = nxt[idx]
        if (at >= n).any():
            raise md.err(f"{key}: its trie points past its {n} entries")
        off = u[at] & 0x7FFFFFFF
        nuls = np.flatnonzero(np.frombuffer(strings, np.uint8) == 0)
        k = np.searchsorted(nuls, off)
        if (off >= len(strings)).any() or (k >= len(nuls)).any():
            raise md.err(f"{key}: a replacement of its trie is out of range or not NUL-terminated")
        self._replace = {i: strings[o:e] for i, o, e in zip(idx.tolist(), off.tolist(), nuls[k].tolist())}
        self._label, self._nxt = label.tolist(), nxt.tolist()
        self.starts = frozenset(c for c in range(1, 256) if self._label[root ^ c] == c)

    def match(self, data: bytes, i: int) -> tuple[int, bytes] | None:
        """The end and replacement of the longest key at ``data[i]`` (whose first byte is one of :attr:`starts`)."""
        label, nxt, replace = self._label, self._nxt, self._replace
        state, found = self._root, None
        for j in range(i, len(data)):
            c = data[j]
            at = state ^ c
            if c == 0 or label[at] != c:
                break
            r = replace.get(at)
            if r is not None:
                found = (j + 1, r)
            state = nxt[at]
        return found


class Ugm(TokenizerModel):
    """t5: SentencePiece unigram, the best-scoring cut of text normalized by the precompiled charsmap."""

    special_ids = {"eos": 1, "unk": 2, "pad": 0}
    add_eos = True  # llama.cpp ends a T5 text with </s>
    clean_spaces = False

    def __init__(self, md: Metadata, pre: str | None) -> None:
        raw = md.raw(_TK.PRECOMPILED_CHARSMAP)
        self._charsmap = None if raw is None else _Charsmap(md, _charsmap_bytes(md, raw))
        super().__init__(md, pre)
        self.remove_extra_whitespaces = md.get(_TK.REMOVE_EXTRA_WS, bool, False)

    def load(self, md: Metadata, table: TokenTable) -> None:
        """Which tokens are searched, and which guard text from normalization, go by the types in the file:
        llama.cpp builds its tries before it retypes tokens by their text."""
        super().load(md, table)
        self._table = table
        tokens, attrs = table.tokens, table.attrs
        searched = [(utf8(t), i) for i, (t, a) in enumerate(zip(tokens, attrs)) if a & _SEARCHED]
        self._pieces = dict(searched)
        self._prefixes = {d[:j] for d, _ in searched for j in range(1, len(d) + 1)}  # the token trie's nodes
        user = [utf8(t) for t, a in zip(tokens, attrs) if a & ATTR_USER_DEFINED]
        self._user_prefixes = {d[:j] for d in user for j in range(1, len(d) + 1)}
        self._user_starts = frozenset(d[0] for d in user)
        lowest = min([_FLT_MAX, *(s for s, a in zip(table.scores, attrs) if a & ATTR_NORMAL)])  # std::min's NaNs
        self._unk_score = float(np.float32(lowest) - _UNK_PENALTY)
        self._scores: list[float] | None = None

    def finish(self, table: TokenTable, special: Mapping[str, int | None], add_bos: bool, add_eos: bool) -> None:
        super().finish(table, special, add_bos, add_eos)
        self._unk = special["unk"]

    def tokenize(self, text: str, frags: list[int | tuple[int, int]], out: list[int]) -> None:
        for f in frags:
            if isinstance(f, int):
                out.append(f)
            else:
                self._viterbi(self._normalize(utf8(text[f[0] : f[1]])), out)

    def _normalize(self, data: bytes) -> bytes:
        cm, user, user_starts = self._charsmap, self._user_prefixes, self._user_starts
        starts = cm.starts if cm is not None else frozenset()
        parts: list[bytes] = []
        i, n = 0, len(data)
        while i < n:
            b = data[i]
            if b in user_starts:
                j = i + 1
                while j < n and data[i : j + 1] in user:
                    j += 1
                parts.append(data[i:j])
                i = j
                continue
            if b in starts:
                found = cm.match(data, i)  # type: ignore[union-attr]
                if found is not None:
                    i = found[0]
                    parts.append(found[1])
                    continue
            k = _code_point_len(data, i)
            parts.append(data[i : i + k] if k else _FFFD)
            i += k or 1
        spaced = b"".join(parts)
        if self.remove_extra_whitespaces:
            return b"".join(_SPACE + w for w in spaced.split(b" ") if w)
        if self.add_space_prefix:
            lead = len(spaced) - len(spaced.lstrip(b" "))
            if lead < len(spaced):
                spaced = spaced[:lead] + b" " + spaced[lead:]
        return spaced.replace(b" ", _SPACE)

    def _token_scores(self) -> list[float]:
        """Each token's Viterbi score: its float32 score, 0 for a user-defined token. Read on first use: llama.cpp
        asks for the type while tokenizing, after it has retyped tokens by their text."""
        if self._scores is None:
            t = self._table
            f32 = np.asarray(t.scores, np.float32).tolist()
            self._scores = [0.0 if a & ATTR_USER_DEFINED else s for s, a in zip(f32, t.attrs)]
        return self._scores

    def _viterbi(self, data: bytes, out: list[int]) -> None:
        n = len(data)
        if n == 0:
            return
        scores, pieces, prefixes = self._token_scores(), self._pieces, self._prefixes
        unk, unk_score = self._unk, self._unk_score
        best = [_WORST] * (n + 1)  # the best score of data[:j], the last token of that cut, and where it starts
        best[0] = 0.0
        token: list[int | None] = [unk] * (n + 1)
        start = [0] * (n + 1)
        i = 0
        while i < n:
            step = min(_STEP[data[i] >> 4], n - i)
            here = best[i]
            whole = False  # a token is exactly the code point at i
            j = i + 1
            while j <= n and data[i:j] in prefixes:
                t = pieces.get(data[i:j])
                if t is not None:
                    whole = whole or j - i == step
                    s = here + scores[t]
                    if s > best[j]:
                        best[j], token[j], start[j] = s, t, i
                j += 1
            if not whole:
                s, j = here + unk_score, i + step
                if s > best[j]:
                    best[j], token[j], start[j] = s, unk, i
            i += step
        ids: list[int] = []
        j, prev_unk = n, False
        while True:
            t = token[j]
            if not (prev_unk and t == unk):
                if t is None:
                    raise self._err(f"the text has a character no token covers, and {_TK.UNK_ID} is not set")
                ids.append(t)
            if start[j] == 0:
                break
            prev_unk, j = t == unk, start[j]
        out.extend(reversed(ids))
