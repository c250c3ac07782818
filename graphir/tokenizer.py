"""GGUF vocabularies: tokenize and detokenize exactly as llama.cpp does.

Three tokenizer models are supported, selected by ``tokenizer.ggml.model``:

* ``gpt2`` -- byte-level BPE. The text is cut into words by the pre-tokenizer regexes that
  llama.cpp picks from ``tokenizer.ggml.pre``; each word's UTF-8 bytes are mapped to
  printable characters with GPT-2's byte-to-unicode table and merged pair by pair, lowest
  merge rank (then leftmost pair) first.
* ``llama`` -- SentencePiece-style BPE over scores: spaces become U+2581, a space is
  prefixed to each run of text (``add_space_prefix``), adjacent symbols merge while their
  concatenation is a token, highest score (then leftmost) first, and whatever is left
  that is not a token falls back to ``<0xXX>`` byte tokens.
* ``bert`` -- WordPiece (llama.cpp's WPM). The text is normalized code point by code point
  (see ``_WpmTable``) and cut into words at whitespace, punctuation, ASCII symbols and CJK
  ideographs; each word, prefixed with U+2581, is split greedily into the longest tokens
  from the left, and a word with any position no token starts becomes the unknown token.
  convert_hf_to_gguf writes word-initial pieces with that U+2581 and ``##`` pieces bare.

Before any of them runs, special tokens are cut out of the text (llama.cpp's
``tokenizer_st_partition``): user-defined tokens always, control and unknown tokens only
with ``parse_special``; longer tokens are cut first.

How the pre-tokenizer regexes are matched, and why it is exact. llama.cpp never runs its
regexes over the real text: every code point >= 128 is first replaced by one placeholder
byte naming its Unicode class (letter, number, punctuation, mark, symbol, other; non-ASCII
whitespace becomes ``\\v``) and each ``\\p{..}`` in a regex becomes a bracket of that
placeholder plus the ASCII members of the class. The GPT-2 and Llama-3 regexes run through
hand-written scanners instead, which behave like the same regex over the same classes.
We build the same collapsed text and run the same collapsed regexes with Python's ``re``
(backtracking, leftmost-first alternation and ``\\s`` = ``[ \\t\\n\\v\\f\\r]`` under
``re.ASCII``, as in ECMAScript ``std::regex``), so splits land on the same code points.
Classes follow Unicode 15.1 general categories and the White_Space property, as
llama.cpp's generated tables do; the table is embedded (see ``_CLASS_RUNS``).
"""

from __future__ import annotations

import base64
import bisect
import heapq
import os
import re
import unicodedata
import zlib
from collections.abc import Mapping, Sequence

import gguf

from graphir.errors import MetadataError

__all__ = ["Vocab", "SUPPORTED_PRE_TOKENIZERS"]

_TK = gguf.Keys.Tokenizer

# llama_token_attr bits (llama.h)
ATTR_UNDEFINED = 0
ATTR_UNKNOWN = 1 << 0
ATTR_UNUSED = 1 << 1
ATTR_NORMAL = 1 << 2
ATTR_CONTROL = 1 << 3
ATTR_USER_DEFINED = 1 << 4
ATTR_BYTE = 1 << 5
ATTR_NORMALIZED = 1 << 6
ATTR_LSTRIP = 1 << 7
ATTR_RSTRIP = 1 << 8
ATTR_SINGLE_WORD = 1 << 9

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

_SPECIAL_ATTRS = ATTR_UNKNOWN | ATTR_CONTROL  # dropped from output unless rendering specials
_C_SPACE = " \t\n\v\f\r"  # C isspace() in the "C" locale: what lstrip/rstrip of special tokens eat
_ESCAPED_SPACE = "\u2581"

# ---------------------------------------------------------------------------------------------
# Unicode classes, collapsed text
# ---------------------------------------------------------------------------------------------

# Unicode 15.1 classes of all code points, the data llama.cpp's unicode-data.cpp is generated from:
# run-length encoded as "<hex start delta><class>" with class L (letter), N (number),
# P (punctuation), M (mark), S (symbol), W (White_Space, which wins over the category) or
# O (other, unassigned included), then zlib-compressed and base85-encoded. Embedded rather
# than taken from `unicodedata`, whose Unicode version moves with the Python version
# (3.11 has 14.0). Regenerate on a Python whose unicodedata.unidata_version is "15.1.0" with
#   runs: for cp in range(0x110000): cls = "W" if cp in WHITE_SPACE else
#         (unicodedata.category(chr(cp))[0] if that is in "LNPMS" else "O"); emit on change
#   text = "".join(f"{start - previous_start:x}{cls}" ...)
#   base64.b85encode(zlib.compress(text.encode(), 9))
# WHITE_SPACE being 0x09-0x0D, 0x20, 0x85, 0xA0, 0x1680, 0x2000-0x200A, 0x2028, 0x2029,
# 0x202F, 0x205F and 0x3000.
_CLASS_RUNS = (
    "c-oDaNtU!Y5`?dWM&J$-;yo>L&3OMK^k)u{e`Zy8RWB4lfRKDJH#f!5=C9P8|8i^SZq1CiY^(2K^~G&=({-my_guF8<(k{R^"
    "dm8tX186Bi`PtEc8k8<5>~!P-Msa2Y(18vUnTXi*s9&RIu87H#W!D~=C}B)Swhn<M&u)5NtyP}{IX?k_}nxt7eBAO+nHVcxw"
    "^`$)xX2FskpsGR`$&~dDUg0ulvf<YbbuNF5z)3zPggl;yU7ut1MlaUU{@^C74y0Hf5r_D(m`^=DK6##RTu_T(o@P28(Ha=4I"
    "V>m76s+zut0au7OMWwzpK=gloCYbt-<VZjvK-pY0u|{css~utL@iRe_n<Tp@Fc#b}WVC2C)@AIllCWFiQ7z>J`KGPL_8KQXS"
    "dRLf<X^J6*xJy^2I_V_H>0>8%+ZOd`NFcxO1w%I~+dlUC_q4e4%*MbdpYIpIEMTQ>`QS<Zs@6P>P<lDJ6GJd%xNG%yl9^hm`"
    "qU9pr{soh_Yuyj!z^8;iGAWu#xhj`upIWL3GhSaTzQgza?tNpdwzs|MKhCrf;2Y+v!1Qa4?Ux%rm&s4C-z9YA+5vbz;q-I$K"
    "VMSm;5(6D#@Bln3`S1`oqQCOYz3J&TH>O`SP7k4W+$&QX-5e|)utoGN5t!d51Yy=eFrY-dwPFtHhZ>(({oR@X+eQ-C@Qtv2m"
    "|AKUL5OI_Zcf#vdH*|MJ}pZORBq&53o9z?bzA<ntFWApic1`t8!6QMXQb=oAE!EvmUAz@F@E5*^Ek0Vs@2HJPir{Etcon&z}"
    "qTU!JN~!)Hbe!rVIJib6Z|jie=!P*yFo<spBIb6-Z6N<iG#umn5>+@4GmFwn-MS-(ATKcD>Cbs#E(*h8#atTqX#vXs}|(yjo"
    "r>CAeGh<QU2UPdqv$1+2ZK9s~3#24_CWoR#+yO_mtdxOdV(`bA|^`^RM?Nh+~-f$GR>dxH))nEKwozNV}z}UAschRo#+Eq_u"
    "NPpC;O=42z6a(N@Rhk}=#Uiu4NHeSxv=l@?*e=>NI0f_N7-|GR?v3oj^BN!QeUDp934K;={i*e_8x5)uxH`M4^SO_;U(oI9r"
    "Z3-;`WInZPsX8+HY`>rFr&3T$V7>9WQcG<R#hKj&936}WqUVGJ%4(c4HeMN^Vk#5tWcK#PM3rQJRFHocPCBgKAM|5pifIUdb"
    "}0~E9YtD;_AWr=)JPdOr)^t<~{Ji-H~u`iHCVEmkdxf;1s=^*M6fv82Tvks~QW<2JwFw0-?Xv#|H}VXr3JbNC$RDKUo@+hDR"
    "^pmBT`2;pAL1@W)FK?<EXG8iEkE7ExhR`-)AqtVfp$e2E=&uu*Kg0yuQRSWJE`w8e#p5B%~YS5CN?kD>FO@}$HB`QtAoY&ca"
    "qgTU5c3h*jgv5raZC=s<PAkC^{nK3Dk%F@t&QQV~ds(#`Om@1Oa1+dROQhOn;5$xg+rQt!lm8iOOw#qf;R^1(Ns1@1SjDE1T"
    "npM}TnpdHzCK8)$%uf%;U$~>ar?(M!s>un`Dzxx44so8h`gc#Cn~D&-*Q8?R#jSiwCjZE`S9~vFu#7<j|87C&*|!M&fDIZ7k"
    "Z}W>W)Vlmg3Q|o_9fd+s6Rj5;D<~Q`KgF_aTi1fMHX{%qd3(N4ux@8Em+`-l3cH+KQz;is|?es6K4FsS`?N7mEniKD)!K&-^"
    "O-!X^2CXs-?Q{+A7|_JGfqSfP`4Qurx1W#)-wGWY--G2Y;tjq_+$zJn-ORk`iDVqf>KbT2yX6SBult3<&hLqDBhMZe_kc(bn"
    "zf0~Q2OhL7Fs`XhFJ|Be8_pzcKUlTvOHc(eW<lR0kbI9`dP%9rF|`$-7$$OI~DS_s$h2}N2kHY1o!^={(EMs2|ughaJX3KxH"
    "sM{_V=efOhhPLp6Hl_kej-0sfB8`PJej87){c`Yt!mGMCvjq<_EsKEY{gvv-s9n07fpus%)d1$9T#zo<xZ%)!g9u;xFUYlx>"
    "MvS}K#;J;v)X#Na;tGtiHCz@3zwqlQN)Y*}j8eU^hqPVRb`-f;wRv(VAoi>3{e)?xZktp%He4bl6{Af@s7v!cZw85{ixWmP#"
    "<8xeFn}y4v9QZW6aB~fG&<<y`XMx)Oap46<EDKl+c*AiA?#i;_z}V%>6%0fO)@Tk#A%nWPRFWbYR&||vUi!@i^bAq(cNrotv"
    "IjnqiKC_v!3(JZlZw7w-eK84MjpBWSy^ky@}^xEn#f?EGckn26&;b1_)$&Rr2&Y;U-g}vNk?MMovSU#f$mzdo+8-Cz{f%M6y"
    "EflkO4g={eqU0P~kfMf{t{TofR;c4yPRKH0HjvWMHEGFIX)X&YH^wK)Gd@nozDrjI3VM%#C?y3L;{Lrw4F^qhbQN|vybQXOA"
    "f7DxIw5i9U)DeJ_uIF7n!J9WC9S(V}=_p1cj5!)7zlEsAh5NPj%Nu#^nn-mnma0+d(TC*-`EhIjd`SD3LyeV;`w6jjs(AXv;"
    "7eky86o}aeOO0wTBf|C;pXM^+0%}@3;NQ6KI134kxA-ce07PfN<9bekpV&D_{T8Ip_eexdC_mHDW;#mNQCA!)^XV)7DPqccs"
    "NS+cdG-<Ac=Q{Zqvz{Xf6#yfNtx=zshwtWA@Bp?#XF#{gX5+uJM5z;7Fj6WiO!&I5+Cc{6Ple)+|v?X%i~AvPoH!2@fKxz57"
    "kfD?0h(j(&q2~GyeSw94|pyjYIoL2jp63o2%N{hF&5lQ9Do{85PLRWQRQGtc+ir5xGE!l#G$QNK1^^rH1mH1Wg)U!mWBhjRK"
    "r*pMxk^KmC;-f4`d`aiB9H+gNBWF$(Q1KA=MLqgr=KR|d`MphrrMwc`n)+do-<JJ0s6{it(+J^oVb;V<+5IzG=nh>Abfv+gZ"
    "+3!k)*mneZbAZT>l$;v%_o#AYF)%w{tCQepy&pfclYZr&h8GV0F668#=Za?bqo5(_c4p6s!(+npa^}4!sSBXhNAzhNT)KAk6"
    "TK6*5F>&+R$cD58MdiimamZ!M*I)<aA*g0g`$H*DR$*tbKShvU^QI%|)zZb&5ba;0ArEak&otC~X#WB5uPU?"
)


def _decode_class_runs() -> tuple[list[int], str]:
    text = zlib.decompress(base64.b85decode("".join(_CLASS_RUNS))).decode("ascii")
    starts: list[int] = []
    classes: list[str] = []
    cp = 0
    for delta, cls in re.findall(r"([0-9a-f]+)([LNPMSWO])", text):
        cp += int(delta, 16)
        starts.append(cp)
        classes.append(cls)
    return starts, "".join(classes)


_RUN_STARTS, _RUN_CLASSES = _decode_class_runs()


def _unicode_class(cp: int) -> str:
    """The class llama.cpp gives a code point: one of L N P M S W O (see _CLASS_RUNS)."""
    if not 0 <= cp < 0x110000:
        return "O"
    return _RUN_CLASSES[bisect.bisect_right(_RUN_STARTS, cp) - 1]


# Placeholder of each class in the collapsed text (the bytes llama.cpp uses).
_PLACEHOLDER = {"N": "\xd1", "L": "\xd2", "P": "\xd3", "M": "\xd4", "S": "\xd5", "W": "\x0b", "O": "\xd0"}
_PH_NUMBER, _PH_LETTER, _PH_PUNCT, _PH_MARK, _PH_SYMBOL = (_PLACEHOLDER[c] for c in "NLPMS")


class _Collapse(dict):
    """str.translate table: ASCII stays, every other code point becomes its class placeholder (memoized)."""

    def __init__(self) -> None:
        super().__init__((i, i) for i in range(128))

    def __missing__(self, cp: int) -> str:
        ph = self[cp] = _PLACEHOLDER[_unicode_class(cp)]
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


# ---------------------------------------------------------------------------------------------
# Pre-tokenizers (llama-vocab.cpp: llm_tokenizer_bpe and the tokenizer.ggml.pre table)
# ---------------------------------------------------------------------------------------------

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


class _Pre:
    """What a tokenizer.ggml.pre value selects: the regexes and the flags llama.cpp sets with them."""

    __slots__ = ("regexes", "clean_spaces", "ignore_merges", "add_bos", "no_default_bos")

    def __init__(self, regexes: str, *, clean_spaces: bool = True, ignore_merges: bool = False,
                 add_bos: bool = False, no_default_bos: bool = False) -> None:
        self.regexes = regexes
        self.clean_spaces = clean_spaces
        self.ignore_merges = ignore_merges
        self.add_bos = add_bos
        self.no_default_bos = no_default_bos


def _pre_table() -> dict[str, _Pre]:
    t: dict[str, _Pre] = {"default": _Pre("default")}
    for n in ("gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es", "jina-v2-de", "a.x-4.0",
              "mellum", "modern-bert", "exaone4", "mpt", "olmo", "jais", "roberta-bpe", "jina-v1-en",
              "jina-v2-code"):
        t[n] = _Pre("gpt2")
    for n in ("trillion", "granite-docling"):
        t[n] = _Pre("gpt2", clean_spaces=False)
    for n in ("starcoder", "refact", "codeshell", "exaone", "minerva-7b"):
        t[n] = _Pre("smollm")
    for n in ("smollm", "command-r"):
        t[n] = _Pre("smollm", clean_spaces=False)
    for n in ("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2"):
        t[n] = _Pre("llama3", ignore_merges=True, add_bos=True)
    for n in ("dbrx", "smaug-bpe"):
        t[n] = _Pre("llama3")
    for n in ("glm4", "chatglm-bpe"):
        t[n] = _Pre("llama3", no_default_bos=True)
    for n in ("qwen2", "deepseek-r1-qwen"):
        t[n] = _Pre("qwen2", clean_spaces=False)
    for n in ("stablelm2", "megrez"):
        t[n] = _Pre("qwen2")
    t["falcon"] = _Pre("falcon")
    return t


_PRE = _pre_table()
SUPPORTED_PRE_TOKENIZERS: tuple[str, ...] = tuple(sorted(_PRE))
_COMPILED: dict[str, tuple[re.Pattern[str], ...]] = {
    k: tuple(_collapse_regex(r) for r in v) for k, v in _PRE_REGEXES.items()
}

# ---------------------------------------------------------------------------------------------
# WordPiece normalization (llama-vocab.cpp: llm_tokenizer_wpm_session::preprocess)
# ---------------------------------------------------------------------------------------------

# Unicode 15.1 simple lowercase mappings (UnicodeData.txt field 13), the data llama.cpp's
# unicode_tolower is generated from: "<hex code point delta><signed hex offset to its lowercase>,"
# per mapped code point, zlib-compressed and base85-encoded. Embedded because str.lower() moves
# with the Python version (3.10 has Unicode 13.0 and misses the 40 case pairs 14.0 added). Regenerate
# on a Python whose unicodedata.unidata_version is "15.1.0", where the first code point of str.lower()
# is the simple lowercase (the full one differs only for U+0130, adding U+0307), with
#   pairs: for cp in range(0x110000) (surrogates skipped): low = chr(cp).lower();
#          if low != chr(cp): emit (cp, ord(low[0]))
#   text = "".join(f"{cp - previous_cp:x}{lower - cp:+x}," ...)
#   base64.b85encode(zlib.compress(text.encode(), 9))
_LOWER_PAIRS = (
    "c-rk)>6WV?41OTw97&MnaoBwSN4SY-wVlpXduv;#^CMqKSPWs2L@NPp^HMP8`QL;UO+ct-SCYw|Dey)I+|?NCY2LF!iwp}zDx;7x"
    "6$W5~bk9;?h-VFYDrKZnR)b!TQpb98_9aq;Q9%W~(6Ci`X<ClsfU0p~GVzlCzaw!umNYaAiEh>C+uZJ8RYRI;fYHS=uq#P+btW>g"
    "tUCsK)kFpJvZ}@ls~ao8u*1051RyjY4dg||e$64-<>W0IYvIV;Z9X*;)99G$4P+;)8AR7U7T~P`AF*k}-k0GS^*<goe5x&vClts_"
    "b5Mwy_Chi&eLRE8%qV3P-e#`-V}EQFb63gvC}X1f4@Uf|*XrOm|1&8_m1F-4rs4S6_AU8u^zqJqx9SrSEa=ua%I{>z*Loc$@MLC3"
    "QPw5+!Tj3V=nDCyvF!=C9Tx_$Wde%BfcI6G8!e%w?WKrmL(zmv4HTh<U*p4oqZLGY?+xML>%gKq^qXxv)Sy9v?<t0orSR?nU+nqg"
    "TSB09=bAn<3#zZIoF3|)M66ouo8NMQPcdmnWW6pserh-b_jGjbhf4iI=fyes5n6q9PjofU(M>6iEf!NZ&37BIzOq=Es!R_}6burC"
    "fho>_U}$e|P{}8Rhe5s`!y+eSIrlIvTINYuNH356but3j$isv42Q=De0i1=}3UFVyJBON^m=ZY&s6G~ADQ}+7>pJ)DDMuRuaZa@!"
    "0R921UPRd"
)


def _decode_lower_pairs() -> dict[int, int]:
    text = zlib.decompress(base64.b85decode("".join(_LOWER_PAIRS))).decode("ascii")
    lower: dict[int, int] = {}
    cp = 0
    for delta, offset in re.findall(r"([0-9a-f]+)([+-][0-9a-f]+),", text):
        cp += int(delta, 16)
        lower[cp] = cp + int(offset, 16)
    return lower


_LOWER = _decode_lower_pairs()

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
        cp, cls = key, _unicode_class(key)
        # unicodedata's NFD is 15.1's for every code point 15.1 assigns: decompositions never change, and
        # none of the code points 14.0-15.1 added has one; "O" skips those a newer Unicode assigns
        if self.strip_accents and cls != "O":
            cp = ord(unicodedata.normalize("NFD", chr(cp))[0])
            cls = _unicode_class(cp)
        if cls == "W":
            out = " "
        elif cp == 0xFFFD or any(a <= cp <= b for a, b in _CONTROL) or (self.strip_accents and cls == "M"):
            out = ""  # NUL, which llama.cpp tests for by name, is among the controls
        else:
            c = chr(_LOWER.get(cp, cp) if self.lowercase else cp)
            alone = cls == "P" or (cls == "S" and cp < 0x7F) or any(a <= cp <= b for a, b in _CJK)
            out = f" {c} " if alone else c
        self[key] = out
        return out


# Tokenizer models llama.cpp knows but this module does not implement.
_OTHER_MODELS = ("t5", "rwkv", "plamo2", "gemma4", "hybriddna", "whitespace", "no_vocab", "none")

# ---------------------------------------------------------------------------------------------
# GPT-2 byte <-> unicode
# ---------------------------------------------------------------------------------------------


def _bytes_to_unicode() -> list[str]:
    keep = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table = [""] * 256
    for b in keep:
        table[b] = chr(b)
    n = 0
    for b in range(256):
        if not table[b]:
            table[b] = chr(256 + n)
            n += 1
    return table


_BYTE_TO_UNI = _bytes_to_unicode()
_LATIN1_TO_UNI = {b: _BYTE_TO_UNI[b] for b in range(256)}  # str.translate over bytes.decode("latin-1")
_UNI_TO_BYTE = {c: b for b, c in enumerate(_BYTE_TO_UNI)}


def _decode_byte_level(text: str) -> bytes:
    """llama_decode_text: a byte-level token's characters back to bytes; unmapped ones are flagged in-line."""
    out = bytearray()
    for ch in text:
        b = _UNI_TO_BYTE.get(ch)
        if b is not None:
            out.append(b)
        else:
            utf8 = ch.encode("utf-8", "surrogatepass")
            out += b"[UNK_BYTE_0x" + utf8.hex().encode() + text.encode("utf-8", "surrogatepass") + b"]"
    return bytes(out)


def _utf8(s: str) -> bytes:
    return s.encode("utf-8", "surrogatepass")


# ---------------------------------------------------------------------------------------------
# Vocab
# ---------------------------------------------------------------------------------------------

# Texts llama.cpp recognises when the metadata does not name the token (llama_vocab::impl::load).
_EOT_TEXTS = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>",
              "<EOT>", "_<EOT>", "[EOT]", "<\uff5cend\u2581of\u2581sentence\uff5c>", "<end_of_utterance>")
_EOM_TEXTS = ("<|eom_id|>",)
_FIM_TEXTS = {
    "fim_pre": ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<\uff5cfim\u2581begin\uff5c>", "<PRE>",
                "\u2581<PRE>", "<|code_prefix|>", "<|prefix|>"),
    "fim_suf": ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<\uff5cfim\u2581hole\uff5c>", "<SUF>",
                "\u2581<SUF>", "<|code_suffix|>", "<|suffix|>"),
    "fim_mid": ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<\uff5cfim\u2581end\uff5c>", "<MID>",
                "\u2581<MID>", "<|code_middle|>", "<|middle|>"),
    "fim_pad": ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"),
    "fim_rep": ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    "fim_sep": ("<|file_sep|>",),
}
_EOG_TEXTS = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
              "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
              "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
              "<\uff5cend\u2581of\u2581sentence\uff5c>", "[e~[")
_ALWAYS_RENDERED = ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>")  # gpt-oss: user-defined

# metadata key -> special-token slot, in llama.cpp's order (the deprecated keys come last and win)
_SPECIAL_KEYS = (
    (_TK.BOS_ID, "bos"), (_TK.EOS_ID, "eos"), (_TK.EOT_ID, "eot"), (_TK.EOM_ID, "eom"),
    (_TK.UNK_ID, "unk"), (_TK.SEP_ID, "sep"), (_TK.PAD_ID, "pad"), (_TK.MASK_ID, "mask"),
    (_TK.FIM_PRE_ID, "fim_pre"), (_TK.FIM_SUF_ID, "fim_suf"), (_TK.FIM_MID_ID, "fim_mid"),
    (_TK.FIM_PAD_ID, "fim_pad"), (_TK.FIM_REP_ID, "fim_rep"), (_TK.FIM_SEP_ID, "fim_sep"),
    (_TK.PREFIX_ID, "fim_pre"), (_TK.SUFFIX_ID, "fim_suf"), (_TK.MIDDLE_ID, "fim_mid"),
)

_WORD_CACHE_MAX = 1 << 16

# BertNormalizer options, for WordPiece only (gguf-py's Keys.Tokenizer.NORMALIZER_*, which older gguf lacks)
_KEY_LOWERCASE = "tokenizer.ggml.normalizer.lowercase"
_KEY_STRIP_ACCENTS = "tokenizer.ggml.normalizer.strip_accents"


class Vocab:
    """A GGUF vocabulary with llama.cpp's tokenizer: ``tokenize``/``detokenize``/``token_to_piece``/``is_eog``.

    Build it with :meth:`from_metadata` (or :meth:`from_file`). Token ids are plain ints;
    ``bos``/``eos`` are None when the vocabulary has none.
    """

    label: str
    model: str
    pre: str | None
    n_vocab: int
    bos: int | None
    eos: int | None
    eot: int | None
    eom: int | None
    unk: int | None
    sep: int | None
    pad: int | None
    add_bos: bool
    add_eos: bool
    add_space_prefix: bool
    clean_spaces: bool

    # -- construction -------------------------------------------------------------------------

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> Vocab:
        """Read a GGUF's header and build its vocabulary."""
        from graphir.gguf_file import read_header

        header = read_header(path)
        return cls.from_metadata(os.path.basename(header.path), header.metadata)

    @classmethod
    def from_metadata(cls, label: str, metadata: Mapping[str, object]) -> Vocab:
        """Build from GGUF metadata (``read_header(path).metadata``); ``label`` names the file in errors.

        Raises MetadataError for a missing or malformed tokenizer key, an unknown or
        unsupported ``tokenizer.ggml.model``, or an unknown ``tokenizer.ggml.pre``.
        """
        self = cls.__new__(cls)
        self._load(label, metadata)
        return self

    def _err(self, msg: str) -> MetadataError:
        return MetadataError(f"{self.label}: {msg}")

    def _get(self, md: Mapping[str, object], key: str, kind: type | tuple[type, ...], default: object = None):
        if key not in md:
            return default
        value = md[key]
        if kind is bool:
            if isinstance(value, (bool, int)):
                return bool(value)
        elif kind is int:
            if isinstance(value, int) and not isinstance(value, bool):
                return value
        elif isinstance(value, kind):
            return value
        raise self._err(f"metadata key {key!r} has the wrong type ({type(value).__name__})")

    def _array(self, md: Mapping[str, object], key: str, convert: type, required: bool = False) -> list | None:
        """A metadata array converted element-wise (str arrays must already hold str)."""
        value = md.get(key)
        if value is None:
            if required:
                raise self._err(f"metadata key {key!r} is missing")
            return None
        try:
            if isinstance(value, (str, bytes)):
                raise TypeError
            if convert is str:
                if not all(isinstance(v, str) for v in value):  # type: ignore[attr-defined]
                    raise TypeError
                return list(value)  # type: ignore[call-overload]
            return [convert(v) for v in value]  # type: ignore[attr-defined]
        except (TypeError, ValueError):
            raise self._err(f"metadata key {key!r} is not an array of {convert.__name__}") from None

    def _load(self, label: str, md: Mapping[str, object]) -> None:
        self.label = label
        model = md.get(_TK.MODEL)
        if model is None:
            raise self._err(f"metadata key {_TK.MODEL!r} is missing: the file has no tokenizer")
        if not isinstance(model, str):
            raise self._err(f"metadata key {_TK.MODEL!r} is not a string ({model!r})")
        pre_name = self._get(md, _TK.PRE, str)

        special = {name: None for _, name in _SPECIAL_KEYS}
        self.ignore_merges = False
        pre: _Pre | None = None
        if model == "llama":
            special.update(bos=1, eos=2, unk=0)
            self.add_space_prefix, self.clean_spaces, self.add_bos, self.add_eos = True, False, True, False
            self.pre = None
        elif model == "gpt2":
            special.update(bos=11, eos=11)
            self.add_space_prefix, self.clean_spaces, self.add_bos, self.add_eos = False, True, False, False
            name = pre_name if pre_name else "default"  # llama.cpp: missing pre -> 'default' (with a warning)
            pre = _PRE.get(name)
            if pre is None:
                raise self._err(
                    f"unknown pre-tokenizer {name!r} ({_TK.PRE}); supported: {', '.join(SUPPORTED_PRE_TOKENIZERS)}"
                )
            self.pre = name
            self.clean_spaces = pre.clean_spaces
            self.ignore_merges = pre.ignore_merges
            self.add_bos = pre.add_bos
            if pre.no_default_bos:
                special["bos"] = None
        elif model == "bert":
            special.update(bos=101, unk=100, sep=102, pad=0, mask=103)
            self.add_space_prefix, self.clean_spaces, self.add_bos, self.add_eos = False, True, True, False
            self.pre = None  # llama.cpp reads tokenizer.ggml.pre for gpt2 vocabularies only
            lowercase = self._get(md, _KEY_LOWERCASE, bool, True)
            self._wpm_table = _WpmTable(lowercase, self._get(md, _KEY_STRIP_ACCENTS, bool, lowercase))
        elif model in _OTHER_MODELS:
            raise self._err(f"tokenizer model {model!r} ({_TK.MODEL}) is not supported; supported: bert, gpt2, llama")
        else:
            raise self._err(f"unknown tokenizer model {model!r} ({_TK.MODEL}); supported: bert, gpt2, llama")
        self.model = model
        self.add_space_prefix = self._get(md, _TK.ADD_PREFIX, bool, self.add_space_prefix)

        tokens = self._array(md, _TK.LIST, str, required=True)
        assert tokens is not None
        n = len(tokens)
        self.n_vocab = n
        scores = self._array(md, _TK.SCORES, float)
        types = self._array(md, _TK.TOKEN_TYPE, int)
        for key, arr in ((_TK.SCORES, scores), (_TK.TOKEN_TYPE, types)):
            if arr is not None and len(arr) < n:
                raise self._err(f"{key} has {len(arr)} entries for {n} tokens")

        self.tokens = [t if t else f"[EMPTY_{i}]" for i, t in enumerate(tokens)]
        self.token_to_id: dict[str, int] = {}
        for i, t in enumerate(self.tokens):
            j = self.token_to_id.setdefault(t, i)
            if j != i:
                raise self._err(f"duplicate token in vocabulary: {t!r} has ids {j} and {i}")
        self.scores: list[float] = scores[:n] if scores is not None else [0.0] * n
        self.attrs: list[int] = (
            [_TYPE_TO_ATTR.get(t, ATTR_UNDEFINED) for t in types[:n]] if types else [ATTR_NORMAL] * n
        )

        if model == "gpt2":
            merges = self._array(md, _TK.MERGES, str, required=True)
            assert merges is not None
            ranks: dict[tuple[str, str], int] = {}
            for i, m in enumerate(merges):
                cut = m.find(" ", 1)
                pair = (m[:cut], m[cut + 1 :]) if cut != -1 else ("", "")
                ranks.setdefault(pair, i)
            self._ranks = ranks

        # special token ids: defaults out of range are dropped; metadata ids out of range are ignored
        for key, name in _SPECIAL_KEYS:
            if special[name] is not None and special[name] >= n:
                special[name] = None
            value = self._get(md, key, int)
            if value is not None and 0 <= value < n:
                special[name] = value
        self.add_bos = self._get(md, _TK.ADD_BOS, bool, self.add_bos)
        self.add_eos = self._get(md, _TK.ADD_EOS, bool, self.add_eos)
        if model == "bert":  # llama.cpp asserts both whenever it adds special tokens
            for key, name in ((_TK.BOS_ID, "bos"), (_TK.SEP_ID, "sep")):
                if special[name] is None:
                    raise self._err(f"a WordPiece vocabulary wraps texts in bos and sep, but {key} is not set")
            byte = next((i for i, a in enumerate(self.attrs) if a & ATTR_BYTE), None)
            if byte is not None:  # llama.cpp aborts rendering it
                raise self._err(f"token {byte} of a WordPiece vocabulary has the byte type ({_TK.TOKEN_TYPE})")
            self._max_token_len = max(map(len, self.tokens))
        else:
            if self.add_bos and special["bos"] is None:
                raise self._err(f"{_TK.ADD_BOS} is true, but {_TK.BOS_ID} is not set")
            if self.add_eos and special["eos"] is None:
                raise self._err(f"{_TK.ADD_EOS} is true, but {_TK.EOS_ID} is not set")

        self._detect_specials(special)
        self.bos, self.eos, self.eot, self.eom = special["bos"], special["eos"], special["eot"], special["eom"]
        self.unk, self.sep, self.pad = special["unk"], special["sep"], special["pad"]
        self.special_ids = dict(special)

        # cut out longest first (ties: lower id first)
        ids = [i for i, a in enumerate(self.attrs) if a & (ATTR_CONTROL | ATTR_USER_DEFINED | ATTR_UNKNOWN)]
        self._special_cache = sorted(ids, key=lambda i: -len(_utf8(self.tokens[i])))
        self._apply_name_rules(md)

        self._pieces: list[bytes | None] = [None] * n
        self._words: dict[str, tuple[int, ...]] = {}
        if pre is not None:
            self._pre_patterns = _COMPILED[pre.regexes]

    def _detect_specials(self, special: dict[str, int | None]) -> None:
        """llama.cpp's recognition of end-of-turn / FIM / EOG tokens by their text, and the attributes it forces."""
        attrs, tid = self.attrs, self.token_to_id

        def force_control(i: int) -> None:
            attrs[i] |= ATTR_CONTROL

        def detect(slot: str, texts: Sequence[str]) -> None:
            if special[slot] is not None:
                return
            found = sorted(tid[t] for t in texts if t in tid)
            if found:  # llama.cpp takes the first in hash order; we take the lowest id
                special[slot] = found[0]
                force_control(found[0])

        detect("eot", _EOT_TEXTS)
        detect("eom", _EOM_TEXTS)
        for slot, texts in _FIM_TEXTS.items():
            detect(slot, texts)

        for i, a in enumerate(attrs):
            if a & ATTR_CONTROL and not a & ATTR_UNUSED and "unused" in self.tokens[i]:
                attrs[i] = a | ATTR_UNUSED

        eog: set[int] = {special[s] for s in ("fim_pad", "fim_rep", "fim_sep") if special[s] is not None}
        for t in _EOG_TEXTS:
            i = tid.get(t)
            if i is not None:
                eog.add(i)
                force_control(i)
        for t in _ALWAYS_RENDERED:
            i = tid.get(t)
            if i is not None:
                attrs[i] = ATTR_USER_DEFINED
        for s in ("eos", "eot", "eom"):
            if special[s] is not None:
                eog.add(special[s])  # type: ignore[arg-type]

        texts = {self.tokens[i]: i for i in eog}
        has_call = "<|call|>" in texts or "<|calls|>" in texts
        if "<|end|>" in texts and has_call and ("<|return|>" in texts or "<|flush|>" in texts):
            eog.discard(texts["<|end|>"])
            attrs[texts["<|end|>"]] = ATTR_USER_DEFINED
        if "<|tool_response>" in texts and "</s>" in texts:
            eog.discard(texts["</s>"])
            attrs[texts["</s>"]] = ATTR_NORMAL
        self._eog = frozenset(eog)

    def _apply_name_rules(self, md: Mapping[str, object]) -> None:
        """Per-model lstrip/rstrip of special tokens, keyed on names as llama.cpp does."""
        name = str(md.get(gguf.Keys.General.NAME, "") or "").lower()
        pre = str(md.get(_TK.PRE, "") or "")
        arch = str(md.get(gguf.Keys.General.ARCHITECTURE, "") or "")

        def set_attr(text: str, bit: int, on: bool) -> None:
            i = self.token_to_id.get(text)
            if i is None:
                raise self._err(f"token {text!r} is missing from the vocabulary")
            self.attrs[i] = self.attrs[i] | bit if on else self.attrs[i] & ~bit

        if any(s in pre for s in ("jina-v2-de", "jina-v2-es", "jina-v2-code")) or any(
            s in arch for s in ("nomic-bert-moe", "jina-bert-v3")
        ):
            if "<mask>" in self.token_to_id:
                set_attr("<mask>", ATTR_LSTRIP, True)
        elif "phi-3" in name or "phi3" in name:
            for i in self._special_cache:
                self.attrs[i] |= ATTR_RSTRIP
            set_attr("</s>", ATTR_RSTRIP, True)
            for t in ("<unk>", "<s>", "<|endoftext|>"):
                set_attr(t, ATTR_RSTRIP, False)
        elif "modern-bert" in name and "[MASK]" in self.token_to_id:
            set_attr("[MASK]", ATTR_LSTRIP, True)

    # -- queries ------------------------------------------------------------------------------

    def is_eog(self, id: int) -> bool:
        """True for tokens that end generation (eos, eot, eom and the end-of-turn/FIM tokens llama.cpp recognises)."""
        return id in self._eog

    @property
    def eog_ids(self) -> frozenset[int]:
        return self._eog

    def _check_id(self, id: int) -> None:
        if not 0 <= id < self.n_vocab:
            raise ValueError(f"{self.label}: token id {id} is out of range [0, {self.n_vocab})")

    # -- tokenize -----------------------------------------------------------------------------

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]:
        """Token ids of ``text``, as llama_tokenize(text, add_special, parse_special).

        ``add_special`` adds BOS/EOS as the vocabulary's add_bos/add_eos flags say -- but a
        WordPiece text always gets bos ([CLS]) and sep ([SEP]), as in llama.cpp, whatever the flags;
        ``parse_special`` lets control tokens written in the text (``<|im_start|>``) become
        single tokens -- user-defined tokens always do.
        """
        out: list[int] = []
        frags = self._partition(text, parse_special) if text else []
        if add_special and (self.add_bos or self.model == "bert"):
            out.append(self.bos)  # type: ignore[arg-type]
        if self.model == "llama":
            prev_special = True
            for f in frags:
                if isinstance(f, int):
                    out.append(f)
                    prev_special = True
                else:
                    piece = text[f[0] : f[1]]
                    if self.add_space_prefix and prev_special:
                        piece = " " + piece
                    self._spm(piece.replace(" ", _ESCAPED_SPACE), out)
                    prev_special = False
        else:
            encode = self._wpm if self.model == "bert" else self._bpe
            for f in frags:
                if isinstance(f, int):
                    out.append(f)
                else:
                    encode(text[f[0] : f[1]], out)
        if add_special and self.model == "bert":
            out.append(self.sep)  # type: ignore[arg-type]
        elif add_special and self.add_eos:
            out.append(self.eos)  # type: ignore[arg-type]
        return out

    def _partition(self, text: str, parse_special: bool) -> list[int | tuple[int, int]]:
        """tokenizer_st_partition: cut special tokens out of the text, one token at a time, longest first."""
        frags: list[int | tuple[int, int]] = [(0, len(text))]
        for sid in self._special_cache:
            attr = self.attrs[sid]
            if not parse_special and attr & (ATTR_CONTROL | ATTR_UNKNOWN):
                continue
            st = self.tokens[sid]
            if not any(not isinstance(f, int) and text.find(st, f[0], f[1]) != -1 for f in frags):
                continue
            new: list[int | tuple[int, int]] = []
            for f in frags:
                if isinstance(f, int):
                    new.append(f)
                    continue
                s, e = f
                while True:
                    m = text.find(st, s, e)
                    if m == -1:
                        if s < e:
                            new.append((s, e))
                        break
                    le = m
                    if attr & ATTR_LSTRIP:
                        while le > s and text[le - 1] in _C_SPACE:
                            le -= 1
                    if le > s:
                        new.append((s, le))
                    new.append(sid)
                    s = m + len(st)
                    if s >= e:
                        break
                    if attr & ATTR_RSTRIP:
                        while s < e and text[s] in _C_SPACE:
                            s += 1
            frags = new
        return frags

    # gpt2: pre-tokenize, byte-encode, merge
    def _split(self, text: str) -> list[str]:
        collapsed = text.translate(_COLLAPSE)
        bounds = [(0, len(text))]
        for pat in self._pre_patterns:
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

    def _bpe(self, text: str, out: list[int]) -> None:
        words = self._words
        for w in self._split(text):
            ids = words.get(w)
            if ids is None:
                ids = self._bpe_word(_utf8(w).decode("latin-1").translate(_LATIN1_TO_UNI))
                if len(words) >= _WORD_CACHE_MAX:
                    words.clear()
                words[w] = ids
            out.extend(ids)

    def _bpe_word(self, word: str) -> tuple[int, ...]:
        tid = self.token_to_id
        if self.ignore_merges and word in tid:
            return (tid[word],)
        sym = list(word)
        n = len(sym)
        if n > 1:
            ranks = self._ranks
            prev = list(range(-1, n - 1))
            nxt = list(range(1, n + 1))
            nxt[-1] = -1
            heap: list[tuple[int, int, int, str]] = []

            def add(left: int, right: int) -> None:
                if left < 0 or right < 0:
                    return
                r = ranks.get((sym[left], sym[right]))
                if r is not None:
                    heapq.heappush(heap, (r, left, right, sym[left] + sym[right]))

            for i in range(1, n):
                add(i - 1, i)
            while heap:
                _, left, right, merged = heapq.heappop(heap)
                ls, rs = sym[left], sym[right]
                if not ls or not rs or ls + rs != merged:
                    continue  # stale
                sym[left] = merged
                sym[right] = ""
                nxt[left] = nxt[right]
                if nxt[right] >= 0:
                    prev[nxt[right]] = left
                add(prev[left], left)
                add(left, nxt[left])
        ids: list[int] = []
        for s in sym:
            if not s:
                continue
            t = tid.get(s)
            if t is not None:
                ids.append(t)
                continue
            for b in _utf8(s):  # not a token: its single-byte pieces that are (ASCII only)
                t = tid.get(chr(b)) if b < 0x80 else None
                if t is not None:
                    ids.append(t)
        return tuple(ids)

    # bert: normalize, cut into words, longest tokens first
    def _wpm(self, text: str, out: list[int]) -> None:
        words = self._words
        for w in text.translate(self._wpm_table).split(" "):
            if not w:
                continue
            ids = words.get(w)
            if ids is None:
                ids = self._wpm_word(_ESCAPED_SPACE + w)
                if len(words) >= _WORD_CACHE_MAX:
                    words.clear()
                words[w] = ids
            out.extend(ids)

    def _wpm_word(self, word: str) -> tuple[int, ...]:
        tid, n = self.token_to_id, len(word)
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
                if self.unk is None:
                    raise self._err(f"the text has a word no token covers, and {_TK.UNK_ID} is not set")
                return (self.unk,)
        return tuple(ids)

    # llama: SentencePiece-style merge by score
    def _spm(self, text: str, out: list[int]) -> None:
        if not text:
            return
        tid, scores = self.token_to_id, self.scores
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
                out.extend(self._byte_token(b) for b in _utf8(s))
            i = nxt[i]

    def _byte_token(self, b: int) -> int:
        t = self.token_to_id.get(f"<0x{b:02X}>")
        if t is None and b < 0x80:
            t = self.token_to_id.get(chr(b))
        if t is None:
            raise self._err(f"no byte-fallback token <0x{b:02X}> for a byte of the text")
        return t

    # -- detokenize ---------------------------------------------------------------------------

    def token_to_piece(self, id: int, special: bool = True) -> bytes:
        """The bytes one token stands for (llama_token_to_piece with lstrip=0).

        Pieces may end inside a UTF-8 sequence: join the bytes of consecutive tokens and decode
        incrementally when streaming. With ``special=False`` control and unknown tokens give b"".
        """
        self._check_id(id)
        if not special and self.attrs[id] & _SPECIAL_ATTRS:
            return b""
        piece = self._pieces[id]
        if piece is None:
            piece = self._pieces[id] = self._make_piece(id)
        return piece

    def _make_piece(self, id: int) -> bytes:
        attr, text = self.attrs[id], self.tokens[id]
        if attr & (_SPECIAL_ATTRS | ATTR_USER_DEFINED):
            return _utf8(text)
        if attr & ATTR_NORMAL:
            if self.model == "gpt2":
                return _decode_byte_level(text)
            return _utf8(text.replace(_ESCAPED_SPACE, " "))
        if attr & ATTR_BYTE:
            return bytes([int(text[3:5], 16)])
        return b""  # undefined / unused tokens render as nothing

    def detokenize_bytes(
        self, ids: Sequence[int], remove_special: bool = False, unparse_special: bool = False
    ) -> bytes:
        """The text of ``ids`` as bytes, as llama_detokenize(ids, remove_special, unparse_special)."""
        ids = list(ids)
        remove_space = self.add_space_prefix
        if remove_special and self.add_bos and ids and ids[0] == self.bos:
            remove_space = False
            ids = ids[1:]
        if remove_special and self.add_eos and ids and ids[-1] == self.eos:
            ids = ids[:-1]
        out = bytearray()
        for t in ids:
            piece = self.token_to_piece(t, unparse_special)
            if remove_space and piece[:1] == b" ":
                piece = piece[1:]
            remove_space = False
            out += piece
        if self.clean_spaces:
            out = _clean_spaces(out)
        return bytes(out)

    def detokenize(self, ids: Sequence[int], remove_special: bool = False, unparse_special: bool = False) -> str:
        """The text of ``ids`` (llama_detokenize); bytes that are not valid UTF-8 become U+FFFD.

        ``remove_special`` drops a leading BOS / trailing EOS the vocabulary adds itself;
        ``unparse_special`` renders control tokens (``<|im_end|>``) instead of dropping them.
        For SentencePiece vocabularies the space prefixed at tokenization is removed.
        """
        return self.detokenize_bytes(ids, remove_special, unparse_special).decode("utf-8", "replace")

    def __repr__(self) -> str:
        return (f"Vocab({self.label!r}, model={self.model!r}, pre={self.pre!r}, n_vocab={self.n_vocab}, "
                f"bos={self.bos}, eos={self.eos}, add_bos={self.add_bos}, add_eos={self.add_eos})")


def _clean_spaces(text: bytearray) -> bytearray:
    """llama_detokenize's clean_up_tokenization_spaces: three in-place passes, replayed literally."""
    sp, ap = ord(" "), ord("'")
    # 1: " ?", " !", " .", " ," lose the space
    t, total1 = text, len(text)
    total = 1 if total1 else 0
    for i in range(1, total1):
        x = t[i]
        if t[i - 1] == sp and x in b"?!.,":
            total -= 1
        t[total] = x
        total += 1
    # 2: " ' " loses both spaces
    total2 = total
    total = 1 if total2 else 0
    i = 1
    while i < total2:
        x = t[i]
        if x == ap and i + 1 < total2 and t[i - 1] == sp and t[i + 1] == sp:
            total -= 1
            i += 1
            t[i] = 0
        t[total] = x
        total += 1
        i += 1
    # 3: " 's", " 'm", " 're", " 've" lose the space
    total3 = total
    total = 1 if total3 else 0
    for i in range(1, total3):
        x = t[i]
        if t[i - 1] == sp and x == ap and i + 1 < total3:
            x1 = t[i + 1]
            if x1 in b"sm":
                total -= 1
            elif x1 not in b"td" and i + 2 < total3:
                x2 = t[i + 2]
                if (x1, x2) in ((ord("r"), ord("e")), (ord("v"), ord("e"))):
                    total -= 1
        t[total] = x
        total += 1
    return t[:total]
