"""Pre-tokenizers: how a BPE vocabulary cuts text into words, chosen by ``tokenizer.ggml.pre``.

Every ``tokenizer.ggml.pre`` value llama.cpp accepts is a row of :data:`PRE_TOKENIZERS`: the regexes it applies,
one after the other (each cuts the pieces the previous one left), and the flags it sets on the vocabulary around
them (clean-up of spaces when detokenizing, whole words that skip the merges, BOS, spaces spelled U+2581, ...).
The regexes are kept as llama.cpp writes them, so a new value is one row, and a new regex one entry of
:data:`REGEXES`.

How the regexes are matched, and why it is exact. llama.cpp runs a regex that names a Unicode class (``\\p{L}``)
over a "collapsed" text: every code point >= 128 is replaced by one placeholder byte naming its class (letter,
number, punctuation, mark, symbol, other; non-ASCII whitespace becomes ``\\v``) and each ``\\p{..}`` becomes a
bracket of that placeholder plus the ASCII members of the class. A regex that names no class runs over the real
code points, non-ASCII whitespace again made ``\\v``. A few regexes select hand-written scanners instead; each of
those behaves like a regex over the same classes, written in :data:`_SCANNER_EQUIVALENTS`. We build the same
texts and run the same regexes with Python's ``re`` (backtracking, leftmost-first alternation, ``\\s`` =
``[ \\t\\n\\v\\f\\r]`` under ``re.ASCII``, as in ECMAScript ``std::regex``), so splits land on the same code points.
The classes are graphir.tokenizer.unicode's.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache

from graphir.tokenizer.unicode import unicode_class

# Placeholder of each class in the collapsed text (the bytes llama.cpp uses); Han has its own in the text the
# Kimi-K2 scanner sees, which tells Han ideographs from other letters.
_PLACEHOLDER = {"N": "\xd1", "L": "\xd2", "P": "\xd3", "M": "\xd4", "S": "\xd5", "W": "\x0b", "O": "\xd0"}
_PH_HAN = "\xd6"
# Code points the Kimi-K2 scanner counts as Han (llama.cpp's unicode_cpt_is_han)
_HAN_RANGES = ((0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F), (0x2B740, 0x2B81F),
               (0x2B820, 0x2CEAF), (0x2CEB0, 0x2EBEF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F))


class _Translation(dict):
    """str.translate table (memoized): ASCII stays; another code point becomes its class's placeholder when
    ``collapse``, Han's when ``han`` and it is Han, else stays itself -- non-ASCII whitespace becomes ``\\v``."""

    def __init__(self, collapse: bool, han: bool) -> None:
        super().__init__((i, i) for i in range(128))
        self.collapse, self.han = collapse, han

    def __missing__(self, cp: int) -> str:
        cls = unicode_class(cp)
        if self.han and any(lo <= cp <= hi for lo, hi in _HAN_RANGES):
            ph = _PH_HAN
        elif self.collapse or cls == "W":
            ph = _PLACEHOLDER[cls]
        else:
            ph = chr(cp)
        self[cp] = ph
        return ph


_WIDE, _COLLAPSED, _COLLAPSED_HAN = _Translation(False, False), _Translation(True, False), _Translation(True, True)

# What each \p{..} stands for in a collapsed regex: the placeholder plus the ASCII members.
_UCAT = {
    "N": _PLACEHOLDER["N"] + "0-9",
    "L": _PLACEHOLDER["L"] + "A-Za-z",
    "P": _PLACEHOLDER["P"] + r"!-#%-*,-/:-;?-@\[-\]_\{\}",
    "M": _PLACEHOLDER["M"],
    "S": _PLACEHOLDER["S"] + r"\$\+<->^`\|~",
}
_UCAT_NAMES = {r"\p{" + k + "}": v for k, v in _UCAT.items()}
_UCAT_NAMES.update({r"\p{L" + s + "}": _UCAT["L"] for s in "ultmo"})
_HAN_NAME = r"\p{Han}"


def _rewrite(expr: str) -> str:
    """A llama.cpp regex for Python's ``re`` over the text :func:`_translation` gives: each ``\\p{..}`` becomes
    its bracket (llama.cpp's unicode_regex_split), ``\\p{Han}`` the Han placeholder, and ``$`` (ECMAScript: the
    end of the text only) ``\\Z``."""
    names = {**_UCAT_NAMES, _HAN_NAME: _PH_HAN}
    out: list[str] = []
    inside = False
    i = 0
    while i < len(expr):
        c = expr[i]
        escaped = i > 0 and expr[i - 1] == "\\"
        if c == "[" and not escaped:
            inside = True
        elif inside and c == "]" and not escaped:
            inside = False
        elif c == "$" and not escaped and not inside:
            out.append(r"\Z")
            i += 1
            continue
        elif expr.startswith("\\p{", i):
            close = expr.find("}", i + 3)
            body = names.get(expr[i : close + 1]) if close != -1 else None
            if body is not None:
                out.append(body if inside else "[" + body + "]")
                i = close + 1
                continue
        out.append(c)
        i += 1
    return "".join(out)


def _translation(expr: str) -> _Translation:
    """The text a regex runs over: collapsed when it names a Unicode class, else the real code points."""
    if _HAN_NAME in expr:
        return _COLLAPSED_HAN
    return _COLLAPSED if any(name in expr for name in _UCAT_NAMES) else _WIDE


# -- the regexes, as llama.cpp writes them --------------------------------------------------------------------

_CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_LLAMA3 = _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_QWEN2 = _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_BLOOM = r" ?[^(\s|.,!?\u2026\u3002\uff0c\u3001\u0964\u06d4\u060c)]+"
_CJK_KANA = r"[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+"
_CJK_HANGUL = r"[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+"
_PUNCT_THEN_LETTERS = r"""[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"""
_CASED_WORDS = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+" + _CONTRACTIONS + "?"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*" + _CONTRACTIONS + "?"
)
_NEWLINE_RUNS = r"[^\n]+|[\n]+"
_DEEPSEEK_LETTERS = (
    r"\s?[A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293\u0295-\u02af\u0370-\u0373"
    r"\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c\u038e-\u03a1\u03a3-\u03f5\u03f7-\u0481\u048a-\u052f"
    r"\u0531-\u0556\u10a0-\u10c5\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba\u1cbd-\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77"
    r"\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45\u1f48-\u1f4d\u1f50-\u1f57\u1f59\u1f5b\u1f5d\u1f5f-\u1f7d"
    r"\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe\u1fc2-\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4"
    r"\u1ff6-\u1ffc\u2102\u2107\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134\u2139"
    r"\u213c-\u213f\u2145-\u2149\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3\ua640-\ua66d"
    r"\ua680-\ua69b\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf\ufb00-\ufb06\ufb13-\ufb17\uff21-\uff3a"
    r"\uff41-\uff5a\U00010400-\U0001044f\U000104b0-\U000104d3\U000104d8-\U000104fb\U00010c80-\U00010cb2"
    r"\U00010cc0-\U00010cf2\U000118a0-\U000118df\U0001e900-\U0001e943]+"
)

# The regexes of each of llama.cpp's pre-tokenizer types (llm_tokenizer_bpe), under the name of its first value.
REGEXES: dict[str, tuple[str, ...]] = {
    "default": (r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"),
    "gpt-2": (_GPT2,),
    "starcoder": (r"\p{N}", _GPT2),
    "falcon": (r"[\p{P}\$\+<=>\^~\|`]+", _GPT2, r"[0-9][0-9][0-9]"),
    "llama3": (_LLAMA3,),
    "jais-2": (
        _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
        r"|\s{512}(?!\S)|\s{256}(?!\S)|\s{128}(?!\S)|\s{64}(?!\S)|\s{32}(?!\S)|\s{16}(?!\S)|\s{8}(?!\S)|\s{4}(?!\S)"
        r"|\s{1,2}(?!\S)|\s{1}",
    ),
    "qwen2": (_QWEN2,),
    "qwen35": (
        _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)"
        r"|\s+",
    ),
    "deepseek-llm": ("[\r\n]", _DEEPSEEK_LETTERS, r"\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+",
                     r"\s+$", _CJK_HANGUL, r"\p{N}+"),
    "deepseek-coder": ("[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", _CJK_HANGUL, r"\p{N}"),
    "deepseek-v3": (r"\p{N}{1,3}", _CJK_KANA,
                    _PUNCT_THEN_LETTERS + r"| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"),
    "spark2_5": (r"\p{N}{1,3}", _CJK_KANA,
                 _PUNCT_THEN_LETTERS + r"| ?[\p{P}\p{S}]+|[\r\n]|\s+(?!\S)|\s+", r"\p{N}"),
    "youtu": (
        r"[\uac00-\ud7a3\u3131-\u318e]+|[\uff01\u2026\u201c\u201d\u2018\u2019\u2014\uff1a\uff1b\uff0c\u3001-\u303f"
        r"\ufe30-\ufe4f]+|[\u3105-\u312f]+|[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
        _CASED_WORDS + r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    ),
    "bloom": (_BLOOM,),
    "viking": (_BLOOM, r"\p{N}"),
    "tekken": (
        r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+"
        r"|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*"
        r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    ),
    "chameleon": (r"<sentinel:[0-9]+>", r"(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z", r"([\t\n]|    |  )", r"\p{N}",
                  r"[\p{P}!-/:-@\[-`{-~]", _GPT2),
    "gpt-4o": (
        r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+" + _CONTRACTIONS + "?"
        r"|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*" + _CONTRACTIONS + "?"
        r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    ),
    "granite-embed-multi-97m": (
        r"[^\r\n\p{L}\p{N}]?((?=[\p{L}\p{M}])([^a-z]))*((?=[\p{L}\p{M}])([^A-Z]))+" + _CONTRACTIONS + "?"
        r"|[^\r\n\p{L}\p{N}]?((?=[\p{L}\p{M}])([^a-z]))+((?=[\p{L}\p{M}])([^A-Z]))*" + _CONTRACTIONS + "?"
        r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    ),
    "tiny_aya": (r"\d{1,3}(?=(?:\d{3})*\b)",
                 _CASED_WORDS + r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"),
    "kimi-k2": (r"\p{Han}+",),
    "superbpe": (r"\p{N}+", r"(?=(\d{3})+(?!\d))"),
    "bailingmoe": (r"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                   r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+",),
    "seed-coder": (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+|\s+(?!\S)"
                   r"|\s+",),
    "ufakzeka": (r"[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",),
    "afmoe": (
        r"\p{AFMoE_digits}",
        r"[\u4e00-\u9fff\u3400-\u4dbf\u8c48-\ufaff\u3040-\u309f\u30a0-\u30ff\uff65-\uff9f\u2f00-\u2fdf\u0e40-\u0e7f"
        r"\u0e80-\u0eff\u1780-\u17ff\u1000-\u109f\uaa60-\uaa7f\ua9e0-\ua9ff\uac00-\ud7af\u1100-\u11ff]+",
        _PUNCT_THEN_LETTERS + r"| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    ),
    "laguna": (_NEWLINE_RUNS, _QWEN2),
    "exaone-moe": (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?(?:\p{L}\p{M}*(?: \p{L}\p{M}*)*)+|\p{N}"
                   r"| ?[^\s\p{L}\p{N}]+[\r\n/]?|\s*[\r\n]|\s+(?!\S)|\s+",),
    "gemma4": (_NEWLINE_RUNS,),
    "minicpm5": (r"\p{N}{1,3}", _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}+| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+"),
    "whitespace": (r"\S+",),
}

# A number cut in threes from its end; what precedes a number goes with its first piece (the AFMoE scanner
# cuts only after digits).
_DIGITS_FROM_RIGHT = r"[^\p{N}]*\p{N}{1,3}(?=(?:\p{N}{3})*(?!\p{N}))"
# Regexes llama.cpp does not run but hands to a scanner of its own, and the regex each scanner behaves like.
_SCANNER_EQUIVALENTS = {
    _GPT2: _GPT2 + r"|\s+",  # the GPT-2 scanner also takes a lone whitespace before a non-space
    r"\p{Han}+": r"\p{Han}+|[^\r\n\p{L}\p{N}\p{Han}]?\p{L}+(?:'[sS]|'[tT]|'[mM]|'[dD]|'[rR][eE]|'[vV][eE]|'[lL][lL])?"
                 r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}\p{Han}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",  # Kimi-K2's scanner
    r"\p{AFMoE_digits}": _DIGITS_FROM_RIGHT,
    r"\d{1,3}(?=(?:\d{3})*\b)": _DIGITS_FROM_RIGHT,
}


@cache
def _compiled(expr: str) -> tuple[re.Pattern[str], _Translation]:
    expr = _SCANNER_EQUIVALENTS.get(expr, expr)
    return re.compile(_rewrite(expr), re.ASCII), _translation(expr)


@dataclass(frozen=True)
class PreTokenizer:
    """What a ``tokenizer.ggml.pre`` value selects: its regexes and the flags llama.cpp sets with them."""

    regexes: str  # a key of REGEXES
    clean_spaces: bool = True  # detokenizing applies clean_up_tokenization_spaces
    ignore_merges: bool = False  # a word that is a token is that token, whatever the merges say
    add_bos: bool = False  # llama.cpp's default for tokenizer.ggml.add_bos_token
    no_default_bos: bool = False  # no BOS id unless the metadata names one
    add_sep: bool = False  # llama.cpp's default for tokenizer.ggml.add_sep_token
    spm_style: bool = False  # spaces become U+2581 and words stay UTF-8 (no byte-to-unicode spelling)
    byte_encode: bool = True  # words are spelled with GPT-2's byte-to-unicode characters
    always_bos: bool = False  # add_bos is true whatever the metadata says (Gemma 4)
    newline_runs_whole: bool = False  # a run of newlines that is a token is that token (Gemma 4)
    lowercase: bool = True  # the whitespace model lowercases unless tokenizer.ggml.normalizer.lowercase says not

    def split(self, text: str) -> list[str]:
        """The words of ``text``: each regex cuts every piece the previous ones left, matches and gaps alike."""
        seen: dict[int, str] = {}
        bounds = [(0, len(text))]
        for expr in REGEXES[self.regexes]:
            pat, table = _compiled(expr)
            subject = seen.get(id(table))
            if subject is None:
                subject = seen[id(table)] = text.translate(table)
            nb: list[tuple[int, int]] = []
            for s, e in bounds:
                pos = s
                for m in pat.finditer(subject, s, e):
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


_NO_CLEAN = {"clean_spaces": False}
_SPM_STYLE = {"spm_style": True, "byte_encode": False}

# Every tokenizer.ggml.pre value llama.cpp accepts (llama_vocab::impl::load): names, regexes, flags.
_ROWS: tuple[tuple[tuple[str, ...], str, dict[str, bool]], ...] = (
    (("default",), "default", {}),
    (("minicpm5",), "minicpm5", {"ignore_merges": True}),
    (("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2", "jina-v5-nano"),
     "llama3", {"ignore_merges": True, "add_bos": True}),
    (("deepseek-llm",), "deepseek-llm", _NO_CLEAN),
    (("deepseek-coder",), "deepseek-coder", _NO_CLEAN),
    (("deepseek-v3", "hunyuan-dense", "hy_v4", "joyai-llm"), "deepseek-v3", _NO_CLEAN),
    (("spark2_5",), "spark2_5", _NO_CLEAN),
    (("youtu",), "youtu", {"clean_spaces": False, "ignore_merges": True}),
    (("falcon",), "falcon", {}),
    (("starcoder", "refact", "codeshell", "exaone", "minerva-7b", "mellum2"), "starcoder", {}),
    (("smollm", "command-r"), "starcoder", _NO_CLEAN),
    (("gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es", "jina-v2-de", "a.x-4.0", "mellum",
      "modern-bert", "mpt", "olmo", "jais", "exaone4"), "gpt-2", {}),
    (("jina-v1-en", "jina-v2-code", "roberta-bpe"), "gpt-2", {"add_sep": True}),
    (("trillion", "granite-docling"), "gpt-2", _NO_CLEAN),
    (("jais-2",), "jais-2", {}),
    (("gemma4", "granite-embed-multi-311m"), "gemma4", {**_SPM_STYLE, "always_bos": True, "newline_runs_whole": True}),
    (("sarvam-moe",), "gemma4", {**_SPM_STYLE, "clean_spaces": False}),
    (("whitespace",), "whitespace", {"byte_encode": False, "lowercase": False}),
    (("qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "hunyuan", "grok-2", "solar-open"), "qwen2", _NO_CLEAN),
    (("stablelm2", "megrez"), "qwen2", {}),
    (("qwen35",), "qwen35", _NO_CLEAN),
    (("dbrx", "smaug-bpe"), "llama3", {}),
    (("chatglm-bpe",), "llama3", {"no_default_bos": True}),
    (("glm4", "glm5"), "llama3", {"no_default_bos": True, "ignore_merges": True}),
    (("bloom", "gpt3-finnish"), "bloom", {}),
    (("poro-chat",), "bloom", _NO_CLEAN),
    (("viking",), "viking", _NO_CLEAN),
    (("tekken",), "tekken", {"clean_spaces": False, "ignore_merges": True, "add_bos": True}),
    (("exaone-moe",), "exaone-moe", {}),
    (("chameleon",), "chameleon", {"clean_spaces": False, "add_bos": True}),
    (("gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2"), "gpt-4o", _NO_CLEAN),
    (("granite-embed-multi-97m",), "granite-embed-multi-97m", {"clean_spaces": False, "ignore_merges": True}),
    (("tiny_aya", "cohere2moe"), "tiny_aya", _NO_CLEAN),
    (("superbpe",), "superbpe", _NO_CLEAN),
    (("bailingmoe", "bailingmoe2", "llada-moe"), "bailingmoe", _NO_CLEAN),
    (("seed-coder",), "seed-coder", _NO_CLEAN),
    (("kimi-k2",), "kimi-k2", _NO_CLEAN),
    (("ufakzeka",), "ufakzeka", _NO_CLEAN),
    (("afmoe",), "afmoe", _NO_CLEAN),
    (("laguna",), "laguna", _NO_CLEAN),
)

PRE_TOKENIZERS: dict[str, PreTokenizer] = {
    name: PreTokenizer(regexes, **flags) for names, regexes, flags in _ROWS for name in names
}
SUPPORTED_PRE_TOKENIZERS: tuple[str, ...] = tuple(sorted(PRE_TOKENIZERS))
