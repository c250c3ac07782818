"""Pre-tokenizers: how a byte-level BPE vocabulary cuts text into words, chosen by ``tokenizer.ggml.pre``.

Each ``tokenizer.ggml.pre`` value llama.cpp knows selects regexes, applied one after the other (each cuts the
pieces the previous one left), and flags that change the vocabulary around them: clean-up of spaces when
detokenizing, whole words that skip the merges, and whether BOS is added.

How the regexes are matched, and why it is exact. llama.cpp never runs its regexes over the real text: every
code point >= 128 is first replaced by one placeholder byte naming its Unicode class (letter, number,
punctuation, mark, symbol, other; non-ASCII whitespace becomes ``\\v``) and each ``\\p{..}`` in a regex becomes
a bracket of that placeholder plus the ASCII members of the class. The GPT-2 and Llama-3 regexes run through
hand-written scanners instead, which behave like the same regex over the same classes. We build the same
collapsed text and run the same collapsed regexes with Python's ``re`` (backtracking, leftmost-first
alternation and ``\\s`` = ``[ \\t\\n\\v\\f\\r]`` under ``re.ASCII``, as in ECMAScript ``std::regex``), so splits
land on the same code points. The classes are graphir.tokenizer.unicode's.
"""

from __future__ import annotations

import re

from graphir.tokenizer.unicode import unicode_class

# Placeholder of each class in the collapsed text (the bytes llama.cpp uses).
_PLACEHOLDER = {"N": "\xd1", "L": "\xd2", "P": "\xd3", "M": "\xd4", "S": "\xd5", "W": "\x0b", "O": "\xd0"}
_PH_NUMBER, _PH_LETTER, _PH_PUNCT, _PH_MARK, _PH_SYMBOL = (_PLACEHOLDER[c] for c in "NLPMS")


class _Collapse(dict):
    """str.translate table: ASCII stays, every other code point becomes its class placeholder (memoized)."""

    def __init__(self) -> None:
        super().__init__((i, i) for i in range(128))

    def __missing__(self, cp: int) -> str:
        ph = self[cp] = _PLACEHOLDER[unicode_class(cp)]
        return ph


_COLLAPSE = _Collapse()

# What each \p{..} stands for in a collapsed regex: the placeholder plus the ASCII members.
_UCAT = {
    "N": _PH_NUMBER + "0-9",
    "L": _PH_LETTER + "A-Za-z",
    "P": _PH_PUNCT + r"!-#%-*,-/:-;?-@\[-\]_\{\}",
    "M": _PH_MARK,
    "S": _PH_SYMBOL + r"\$\+<->^`\|",
}
_UCAT_NAMES = {r"\p{" + k + "}": v for k, v in _UCAT.items()}
_UCAT_NAMES.update({r"\p{L" + s + "}": _UCAT["L"] for s in "ultmo"})


def _collapse_regex(expr: str) -> re.Pattern[str]:
    """Rewrite a pre-tokenizer regex for collapsed text, the way llama.cpp's unicode_regex_split does."""
    out: list[str] = []
    inside = False
    i = 0
    while i < len(expr):
        c = expr[i]
        if c == "[" and (i == 0 or expr[i - 1] != "\\"):
            out.append("[")
            inside = True
            i += 1
            continue
        if inside and c == "]" and expr[i - 1] != "\\":
            out.append("]")
            inside = False
            i += 1
            continue
        if expr.startswith("\\p{", i):
            close = expr.find("}", i + 3)
            name = expr[i : close + 1] if close != -1 else ""
            if name in _UCAT_NAMES:
                body = _UCAT_NAMES[name]
                out.append(body if inside else "[" + body + "]")
                i = close + 1
                continue
        out.append(c)
        i += 1
    return re.compile("".join(out), re.ASCII)


# GPT-2's regex. llama.cpp runs a scanner equal to it plus a final `\s+` (a lone whitespace
# before a non-space), so we append that alternative.
_RE_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_RE_LLAMA3 = (
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_RE_QWEN2 = (
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

_PRE_REGEXES: dict[str, tuple[str, ...]] = {
    "default": (r"[\p{P}\$\+<=>\^~\|]+", _RE_GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"),
    "gpt2": (_RE_GPT2,),
    "smollm": (r"\p{N}", _RE_GPT2),  # also starcoder, refact, command-r, ...
    "llama3": (_RE_LLAMA3,),
    "qwen2": (_RE_QWEN2,),
    "falcon": (r"[\p{P}\$\+<=>\^~\|`]+", _RE_GPT2, r"[0-9][0-9][0-9]"),
}

_COMPILED: dict[str, tuple[re.Pattern[str], ...]] = {
    k: tuple(_collapse_regex(r) for r in v) for k, v in _PRE_REGEXES.items()
}


class PreTokenizer:
    """What a tokenizer.ggml.pre value selects: the regexes and the flags llama.cpp sets with them."""

    __slots__ = ("patterns", "clean_spaces", "ignore_merges", "add_bos", "no_default_bos")

    def __init__(self, regexes: str, *, clean_spaces: bool = True, ignore_merges: bool = False,
                 add_bos: bool = False, no_default_bos: bool = False) -> None:
        self.patterns = _COMPILED[regexes]
        self.clean_spaces = clean_spaces
        self.ignore_merges = ignore_merges
        self.add_bos = add_bos
        self.no_default_bos = no_default_bos

    def split(self, text: str) -> list[str]:
        """The words of ``text``: each regex cuts every piece the previous ones left, matches and gaps alike."""
        collapsed = text.translate(_COLLAPSE)
        bounds = [(0, len(text))]
        for pat in self.patterns:
            nb: list[tuple[int, int]] = []
            for s, e in bounds:
                pos = s
                for m in pat.finditer(collapsed, s, e):
                    ms, me = m.span()
                    if ms > pos:
                        nb.append((pos, ms))
                    if me > ms:
                        nb.append((ms, me))
                    pos = me
                if pos < e:
                    nb.append((pos, e))
            bounds = nb
        return [text[s:e] for s, e in bounds]


def _pre_table() -> dict[str, PreTokenizer]:
    t: dict[str, PreTokenizer] = {"default": PreTokenizer("default")}
    for n in ("gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es", "jina-v2-de", "a.x-4.0",
              "mellum", "modern-bert", "exaone4", "mpt", "olmo", "jais", "roberta-bpe", "jina-v1-en",
              "jina-v2-code"):
        t[n] = PreTokenizer("gpt2")
    for n in ("trillion", "granite-docling"):
        t[n] = PreTokenizer("gpt2", clean_spaces=False)
    for n in ("starcoder", "refact", "codeshell", "exaone", "minerva-7b"):
        t[n] = PreTokenizer("smollm")
    for n in ("smollm", "command-r"):
        t[n] = PreTokenizer("smollm", clean_spaces=False)
    for n in ("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2"):
        t[n] = PreTokenizer("llama3", ignore_merges=True, add_bos=True)
    for n in ("dbrx", "smaug-bpe"):
        t[n] = PreTokenizer("llama3")
    for n in ("glm4", "chatglm-bpe"):
        t[n] = PreTokenizer("llama3", no_default_bos=True)
    for n in ("qwen2", "deepseek-r1-qwen"):
        t[n] = PreTokenizer("qwen2", clean_spaces=False)
    for n in ("stablelm2", "megrez"):
        t[n] = PreTokenizer("qwen2")
    t["falcon"] = PreTokenizer("falcon")
    return t


PRE_TOKENIZERS = _pre_table()
SUPPORTED_PRE_TOKENIZERS: tuple[str, ...] = tuple(sorted(PRE_TOKENIZERS))
