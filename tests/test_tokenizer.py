"""Specifications for graphir.tokenizer: token-for-token agreement with llama.cpp.

The oracle is llama.cpp itself, through llama-cpp-python (`Llama(path, vocab_only=True)` for
tokenize and the C `llama_detokenize` / `llama_token_to_piece` / `llama_vocab_is_eog` for the
rest). Oracle tests are marked `oracle` and skip, with the reason shown, when `llama_cpp` is
not importable; a few golden id lists taken from llama.cpp keep the core checked without it.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

os.environ.setdefault("GGML_NO_BACKTRACE", "1")  # before llama_cpp loads libllama

import gguf
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import write_vocab_gguf

from graphir.errors import MetadataError
from graphir.files.gguf_file import read_header
from graphir.tokenizer.pretokenize import PRE_TOKENIZERS, SUPPORTED_PRE_TOKENIZERS
from graphir.tokenizer.unicode import unicode_class
from graphir.tokenizer.vocab import Vocab

pytestmark = pytest.mark.same_on_every_path  # tokenizing is the same on every CPU path

try:
    import llama_cpp
    from llama_vocab import Oracle, assert_same_detokenize, assert_same_pieces, assert_same_text_handling
except ImportError:  # the conftest skips every `oracle` test, with its reason, where it is missing
    llama_cpp = None

oracle = pytest.mark.oracle

SMOL_BOS, SMOL_IM_END = 1, 2  # <|im_start|>, <|im_end|>


@pytest.fixture(scope="module")
def smol(smollm2_gguf: Path) -> Vocab:
    return Vocab.from_file(smollm2_gguf)


@pytest.fixture(scope="module")
def smol_oracle(smollm2_gguf: Path):
    o = Oracle(smollm2_gguf)
    yield o
    o.close()


@pytest.fixture
def oracle_of():
    """Opens llama.cpp's tokenizer of a file (with metadata overrides), closed after the test."""
    opened: list[Oracle] = []

    def open_oracle(path: Path, overrides: dict[str, str | bool] | None = None) -> Oracle:
        opened.append(Oracle(path, overrides))
        return opened[-1]

    yield open_oracle
    for o in opened:
        o.close()


# ---------------------------------------------------------------------------------------------
# SmolLM2 (gpt2 byte-level BPE, pre-tokenizer "smollm")
# ---------------------------------------------------------------------------------------------

TEXTS = [
    "",
    "Hello world",
    "The quick brown fox jumps over the lazy dog.",
    "  two leading spaces",
    "trailing spaces   ",
    "multiple    inner     spaces",
    " ",
    "\n",
    "line one\nline two\n\nline four",
    "tabs\tand\t\ttabs",
    "windows\r\nline\r\nendings",
    "   \n  \t indented",
    "12345",
    "3.14159265358979 and 1,000,000",
    "order #42: 7 items at $19.99",
    "phone 555-0123, year 2024",
    "don't won't can't",
    "it's we're they've I'm you'll he'd",
    "IT'S WE'RE 'S 'T",
    "Hello, world! How are you? Fine... (really) [yes] {ok}",
    "a--b__c~~d^^e||f``g",
    "def f(x):\n    return x ** 2  # square\n",
    'if (a && b) { printf("%d\\n", a[i]); }',
    "SELECT * FROM t WHERE id = 'x';",
    "https://example.com/path?query=1&b=two#frag",
    "user@example.org",
    "😀 smile 👍🏽 thumbs",
    "family: 👨\u200d👩\u200d👧\u200d👦 flag: 🏳️\u200d🌈",
    "日本語のテキストです。",
    "中文文本，还有标点。",
    "한국어 텍스트",
    "café naïve résumé Ærøskøbing",
    "Crème brûlée à la française",
    "Привет, мир! Как дела?",
    "مرحبا بالعالم",
    "שלום עולם",
    "नमस्ते दुनिया",
    "mixed: hello мир 世界 مرحبا 123",
    "e\u0301 combining acute, a\u0308",
    "zero\u200bwidth\u200cjoiner\u200dtest",
    "nbsp\u00a0here\u2003em\u3000ideographic",
    "Ⅻ ½ ² ³ ٣ ١٢٣",
    "\u0000\u0001\u001f\u007f controls",
    "<|im_start|>user\nhi<|im_end|>",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|>",
    "text<|im_end|>more<|im_start|>",
    "<|im_start|<|im_end|>>",
    "ÿþ\u0100\u0120 byte-level edge chars",
]


def test_smollm2_vocab_facts(smol: Vocab) -> None:
    assert (smol.model, smol.pre, smol.n_vocab) == ("gpt2", "smollm", 49152)
    assert (smol.bos, smol.eos, smol.add_bos, smol.add_eos) == (1, 2, False, False)
    assert smol.tokens[SMOL_BOS] == "<|im_start|>" and smol.tokens[SMOL_IM_END] == "<|im_end|>"
    # eos <|im_end|>, <|endoftext|>, and <reponame> (a FIM repo token llama.cpp recognises by its text)
    assert smol.eog_ids == {0, 2, 4}
    assert smol.is_eog(2) and not smol.is_eog(1) and not smol.is_eog(100)


# Golden ids from llama.cpp, so the BPE path is checked even where the oracle is not installed.
SMOL_GOLDEN = {
    ("Hello world", False): [19556, 905],
    ("12345 don't", False): [33, 34, 35, 36, 37, 1326, 982],
    (" <|im_start|>", True): [216, 1],
}


@pytest.mark.parametrize(("text", "parse_special"), list(SMOL_GOLDEN))
def test_smollm2_golden(smol: Vocab, text: str, parse_special: bool) -> None:
    assert smol.tokenize(text, parse_special=parse_special) == SMOL_GOLDEN[(text, parse_special)]


def test_smollm2_chat_markers(smol: Vocab) -> None:
    text = "<|im_start|>user\nhi<|im_end|>"
    ids = smol.tokenize(text, parse_special=True)
    assert ids[0] == SMOL_BOS and ids[-1] == SMOL_IM_END
    plain = smol.tokenize(text, parse_special=False)
    assert SMOL_BOS not in plain and SMOL_IM_END not in plain and len(plain) > len(ids)
    # control tokens are dropped unless asked for; plain text comes back either way
    assert smol.detokenize(ids) == "user\nhi"
    assert smol.detokenize(ids, unparse_special=True) == text
    assert smol.detokenize(plain) == text


@pytest.mark.parametrize("text", TEXTS)
def test_smollm2_roundtrip(smol: Vocab, text: str) -> None:
    for parse_special in (False, True):
        ids = smol.tokenize(text, parse_special=parse_special)
        assert smol.detokenize(ids, unparse_special=True) == text
        assert b"".join(smol.token_to_piece(i) for i in ids) == text.encode()


@oracle
@pytest.mark.parametrize("text", TEXTS)
def test_smollm2_matches_llama_cpp(smol: Vocab, smol_oracle: Oracle, text: str) -> None:
    for add_special in (False, True):
        for parse_special in (False, True):
            assert smol.tokenize(text, add_special, parse_special) == smol_oracle.tokenize(
                text, add_special, parse_special
            ), (add_special, parse_special)
    ids = smol_oracle.tokenize(text, False, True)
    if ids[:1] != [SMOL_BOS]:  # Llama.detokenize drops a space after a leading BOS; llama_detokenize does not
        assert smol.detokenize_bytes(ids) == smol_oracle.llm.detokenize(ids)
    assert_same_detokenize(smol, smol_oracle, [ids])


@oracle
def test_smollm2_pieces_and_eog_match_llama_cpp(smol: Vocab, smol_oracle: Oracle) -> None:
    assert (smol.bos, smol.eos, smol.add_bos, smol.add_eos) == smol_oracle.facts()
    assert_same_pieces(smol, smol_oracle)


@oracle
def test_smollm2_detokenize_special_ids_match_llama_cpp(smol: Vocab, smol_oracle: Oracle) -> None:
    cases = [[1, 19556, 2], [19556, 0], [2, 2, 1], [0], [], [216, 19556], [1, 216, 905], list(range(0, 40))]
    assert_same_detokenize(smol, smol_oracle, cases)


_fragments = st.one_of(
    st.text(max_size=12),
    st.text(alphabet=" \t\n\r0123456789'sStTdDmMlLreEvV.,!?-_$+<>|^~`", max_size=12),
    st.sampled_from(["<|im_start|>", "<|im_end|>", "<|endoftext|>", " ", "  ", "\n\n", "'s", "'LL", "1234567",
                     "\u00a0", "\u3000", "é", "\U0002ebf0", "\U000e0061", "😀"]),
)
_texts = st.lists(_fragments, max_size=6).map("".join)


@oracle
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=_texts, parse_special=st.booleans())
def test_smollm2_random_text_matches_llama_cpp(
    smol: Vocab, smol_oracle: Oracle, text: str, parse_special: bool
) -> None:
    ids = smol.tokenize(text, parse_special=parse_special)
    assert ids == smol_oracle.tokenize(text, True, parse_special)
    assert smol.detokenize_bytes(ids, unparse_special=True) == smol_oracle.detokenize(ids, False, True)


@oracle
def test_10kb_of_english_tokenizes_as_llama_cpp_does(smollm2_gguf: Path, smol_oracle: Oracle) -> None:
    """A cold word cache (a fresh vocabulary) over 10 KB of prose; its speed is bench/bench_text.py's to measure."""
    rnd = random.Random(1234)
    words = ("the of and to in is was for that with as on by at from this be are it an which or have not had "
             "but were they their one all been has more when there can also into other only time new some "
             "could these two may first then do any like my now over such our man me even most made after "
             "language model token vocabulary graph compute numba backend attention layer weight").split()
    parts = []
    while sum(map(len, parts)) < 10_000:
        sentence = " ".join(rnd.choice(words) for _ in range(rnd.randint(5, 15)))
        parts.append(sentence.capitalize() + rnd.choice([". ", ", ", "? ", ".\n", f" {rnd.randint(0, 99999)}. "]))
    text = "".join(parts)[:10_000]
    ids = Vocab.from_file(smollm2_gguf).tokenize(text)
    assert ids == smol_oracle.tokenize(text, True, False)
    assert Vocab.from_file(smollm2_gguf).detokenize(ids) == text


def test_unicode_classes_agree_with_unicodedata() -> None:
    """The embedded Unicode 15.1 class table agrees with this Python's unicodedata where both assign a code point."""
    import unicodedata

    white_space = {0x09, 0x0A, 0x0B, 0x0C, 0x0D, 0x20, 0x85, 0xA0, 0x1680, *range(0x2000, 0x200B), 0x2028, 0x2029,
                   0x202F, 0x205F, 0x3000}
    checked = 0
    for cp in range(0x110000):
        cat = unicodedata.category(chr(cp))
        if cat == "Cn":  # unassigned in this Python's Unicode version (may be assigned in 15.1)
            continue
        expected = "W" if cp in white_space else cat[0] if cat[0] in "LNPMS" else "O"
        assert unicode_class(cp) == expected, hex(cp)
        checked += 1
    assert checked > 250_000
    # assigned in 15.0 / 15.1 (CJK Extension H and I), letters there whatever this Python says
    assert unicode_class(0x31350) == unicode_class(0x2EBF0) == "L"
    assert unicode_class(0x2EE5E) == "O"  # still unassigned in 15.1


@oracle
def test_unicode_classes_match_llama_cpp(tmp_path: Path) -> None:
    """Each code point's class, as llama.cpp's pre-tokenizers see it, at every class boundary of the table.

    A probe vocabulary merges "a", "1" and "!" with any following byte, so whether "a" + c comes
    out as one token tells whether c is a letter (same word under the GPT-2 regex), "1" + c a
    number, "!" + c neither-nor-space, and "!" + c under the 'default' pre-tokenizer punctuation.
    """
    from graphir.tokenizer.bpe import _BYTE_TO_UNI
    from graphir.tokenizer.unicode import _RUN_STARTS

    T = gguf.Keys.Tokenizer
    tokens = list(_BYTE_TO_UNI) + [p + b for p in "a1!" for b in _BYTE_TO_UNI]
    merges = [p + " " + b for p in "a1!" for b in _BYTE_TO_UNI]
    md = {T.MODEL: "gpt2", T.LIST: tokens, T.TOKEN_TYPE: [1] * len(tokens), T.MERGES: merges,
          T.BOS_ID: 0, T.EOS_ID: 0, T.ADD_BOS: False}
    o_gpt2 = Oracle(write_vocab_gguf(tmp_path / "gpt2.gguf", {**md, T.PRE: "gpt-2"}))
    o_default = Oracle(write_vocab_gguf(tmp_path / "default.gguf", {**md, T.PRE: "default"}))
    ids = {t: i for i, t in enumerate(tokens)}
    try:
        cps = sorted({c for start in _RUN_STARTS for c in (start - 1, start)} - {-1} - set(range(0xD800, 0xE000)))
        for cp in cps:
            c = chr(cp)
            head = _BYTE_TO_UNI[c.encode()[0]]

            def joined(o: Oracle, p: str) -> bool:
                return o.tokenize(p + c, False, False)[0] == ids[p + head]

            letter, number, other = joined(o_gpt2, "a"), joined(o_gpt2, "1"), joined(o_gpt2, "!")
            punct = joined(o_default, "!")
            seen = "L" if letter else "N" if number else ("P" if punct else "O") if other else "W"
            mine = unicode_class(cp)
            if cp >= 0x80:  # ASCII is matched literally, not through the table
                assert seen == {"M": "O", "S": "O"}.get(mine, mine), hex(cp)
    finally:
        o_gpt2.close()
        o_default.close()


# ---------------------------------------------------------------------------------------------
# Pre-tokenizers: the SmolLM2 vocabulary and merges under another tokenizer.ggml.pre
# ---------------------------------------------------------------------------------------------

# A varied text set: code, numbers of every length up to 20 digits, CJK (Han, kana, Hangul), Arabic, Devanagari,
# Thai, emoji, contractions in both cases, whitespace runs (one longer than 512), newlines, full-width and
# CJK punctuation, marks, and the literal markers some pre-tokenizers cut out (chameleon's).
PRE_TEXTS = [
    "Hello world, it's 2024-01-02; ¿qué? “quotes” $5+3=8 ^~| `x`",
    " ".join("1234567890123456789012"[:n] for n in range(1, 21)) + " 3.14159 1,000,000 0x1F ١٢٣٤٥ ½ Ⅻ ²",
    "a  ½  1234\t\t56 x  ٣٤",
    "don't I'll we're THEY'RE 'Ll 'S x'd DON'T You'VE it’s l'été it'sy they'rex I'dk",
    "def f(x):\n    return x**2  # comment\r\n\r\n  \n\tz\n\n\n",
    'if (a && b) { printf("%d\\n", a[i]); } // done\n#include <stdio.h>\nx->y ::z ... =>',
    "  leading and trailing   " + " " * 600 + "x" + "\t" * 20 + "\n" * 5 + " \n \r\n\r\n",
    "(hello) [world] {foo} <bar> $baz @qux #tag !!!...??? ---=== +++ *** ~~~ ___",
    "hello , world . foo ' bar 's 'm 're 've",
    "camelCaseWord HTMLParser XMLHttpRequest ÉCOLE École iPhone McDonald's",
    "😀👍🏽 🏳️\u200d🌈 日本語のテキストです。中文文本，还有标点、顿号…… 한국어 텍스트 ㄱㄴ ㄅㄆ",
    "Привет, мир! مرحبا بالعالم، كيف حالك؟ ۔ नमस्ते दुनिया। สวัสดีครับ ខ្មែរ",
    "x\u00a0y\u2003z\u3000w \u0085v\u2028u",
    "e\u0301 a\u0308 \u200b\u200d n\u0303o ﬁ ＡＢＣ ａｂｃ １２３ ！？",
    "<sentinel:12>IMGIMGABZ IMGIMGZ <sentinel:x>",
    "\u2581spaced\u2581out ▁▁x",
    "<|im_start|>user\nhi 12345<|im_end|>\n<|endoftext|>",
]


@pytest.fixture(scope="module")
def smol_tokenizer_md(smollm2_gguf: Path) -> dict[str, object]:
    """SmolLM2's token list and merges, with no BOS/EOS ids and no flags: every default of the pre shows."""
    md = read_header(smollm2_gguf).metadata
    T = gguf.Keys.Tokenizer
    return {k: md[k] for k in (T.MODEL, T.LIST, T.TOKEN_TYPE, T.MERGES)}


# Words of PRE_TEXTS that several pre-tokenizers keep whole but SmolLM2's merges never build, added as tokens
# (byte-level spelled, and one raw for the pre-tokenizers that keep words UTF-8): they show whether a
# pre-tokenizer takes a word that is a token as that token (ignore_merges, Gemma 4's newline runs).
_UNMERGED_WORDS = (" Привет", "123", "日本語のテキストです", "\n\n\n")
_PRE_TEST_VOCAB = 8192  # SmolLM2's first tokens: llama.cpp loads them ~6x faster than all 49152
_JOINED = 6  # byte characters up to which every piece of PRE_TEXTS is a token


@pytest.fixture(scope="module")
def pre_test_md(smol_tokenizer_md: dict[str, object]) -> dict[str, object]:
    """SmolLM2's first tokens and the merges that build them (a prefix of a BPE is a BPE), then, ranked after
    them, every piece of PRE_TEXTS up to _JOINED byte characters as a token, made from any two parts of it: two
    neighbours merge whenever they spell such a piece, so a cut between them shows in the ids (SmolLM2 alone
    never merges digits, nor many other neighbours). And the extra words."""
    from graphir.tokenizer.bpe import _BYTE_TO_UNI

    T = gguf.Keys.Tokenizer
    tokens = list(smol_tokenizer_md[T.LIST])[:_PRE_TEST_VOCAB]  # type: ignore[call-overload]
    kept = set(tokens)
    merges = [m for m in smol_tokenizer_md[T.MERGES]  # type: ignore[attr-defined]
              if {*(pair := m.split(" ", 1)), "".join(pair)} <= kept]
    spelled = ["".join(_BYTE_TO_UNI[b] for b in text.encode()) for text in PRE_TEXTS]
    pieces = sorted(dict.fromkeys(t[i : i + n] for t in spelled for n in range(2, _JOINED + 1)
                                  for i in range(len(t) - n + 1)), key=len)
    known = set(merges)
    merges += [m for p in pieces for j in range(1, len(p)) if (m := f"{p[:j]} {p[j:]}") not in known]
    words = ["".join(_BYTE_TO_UNI[b] for b in w.encode()) for w in _UNMERGED_WORDS] + ["\n\n\n"]
    extra = list(dict.fromkeys(t for t in pieces + words if t not in kept))
    types = list(smol_tokenizer_md[T.TOKEN_TYPE])[:_PRE_TEST_VOCAB]  # type: ignore[call-overload]
    return {**smol_tokenizer_md, T.LIST: tokens + extra, T.TOKEN_TYPE: types + [1] * len(extra), T.MERGES: merges}


@pytest.fixture(scope="module")
def pre_test_gguf(tmp_path_factory: pytest.TempPathFactory, pre_test_md: dict[str, object]) -> Path:
    """A vocab-only GGUF of that vocabulary; each test gives it its pre-tokenizer (llama.cpp's kv_overrides)."""
    path = tmp_path_factory.mktemp("pre") / "smollm2-vocab.gguf"
    return write_vocab_gguf(path, {**pre_test_md, gguf.Keys.Tokenizer.PRE: "default"})


def _byte_bpe_metadata() -> dict[str, object]:
    """A byte-level BPE vocabulary of the 256 byte characters and nothing else."""
    from graphir.tokenizer.bpe import _BYTE_TO_UNI

    T = gguf.Keys.Tokenizer
    return {T.MODEL: "gpt2", T.LIST: list(_BYTE_TO_UNI), T.TOKEN_TYPE: [1] * 256, T.MERGES: [], T.BOS_ID: 0,
            T.EOS_ID: 0}


def test_every_supported_pre_tokenizer_builds() -> None:
    md = _byte_bpe_metadata()
    text = "It's 2024!\n\tok ünï 中文 😀"
    for name in SUPPORTED_PRE_TOKENIZERS:
        v = Vocab.from_metadata("x.gguf", {**md, gguf.Keys.Tokenizer.PRE: name})
        assert v.pre == name
        ids = v.tokenize(text, add_special=False)
        if PRE_TOKENIZERS[name].byte_encode:  # one byte token per byte
            assert len(ids) == len(text.encode()) and v.detokenize(ids) == text
    # no pre key at all: llama.cpp falls back to 'default'
    assert Vocab.from_metadata("x.gguf", md).pre == "default"


@oracle
@pytest.mark.parametrize("pre", SUPPORTED_PRE_TOKENIZERS)
def test_pre_tokenizer_matches_llama_cpp(oracle_of, pre_test_gguf: Path, pre_test_md: dict[str, object],
                                         pre: str) -> None:
    """Every tokenizer.ggml.pre graphir knows: the same ids as llama.cpp on PRE_TEXTS, the same text back, and
    the same defaults (BOS id, add_bos/add_eos/add_sep) -- so a value added to the table is checked here."""
    T = gguf.Keys.Tokenizer
    mine = Vocab.from_metadata(pre_test_gguf.name, {**pre_test_md, T.PRE: pre})
    o = oracle_of(pre_test_gguf, {T.PRE: pre})
    assert ((mine.bos, mine.eos, mine.add_bos, mine.add_eos), mine.add_sep) == (o.facts(), o.add_sep())
    for text in PRE_TEXTS:
        try:
            ids = [mine.tokenize(text, True, parse_special) for parse_special in (False, True)]
        except ValueError as e:  # llama.cpp would abort the process on this text: graphir refuses it instead
            assert "leaves a space inside the word" in str(e) and not PRE_TOKENIZERS[pre].byte_encode
            continue
        assert ids == [o.tokenize(text, True, parse_special) for parse_special in (False, True)], text
        for remove_special in (False, True):
            for unparse_special in (False, True):
                assert mine.detokenize_bytes(ids[1], remove_special, unparse_special) == o.detokenize(
                    ids[1], remove_special, unparse_special), (text, remove_special, unparse_special)


@oracle
def test_kimi_k2_without_merges_matches_llama_cpp(oracle_of, tmp_path: Path) -> None:
    """Kimi-K2 files may lack merges (llama.cpp then merges nothing); any other pre-tokenizer needs them."""
    T = gguf.Keys.Tokenizer
    md = {k: v for k, v in _byte_bpe_metadata().items() if k != T.MERGES}
    path = write_vocab_gguf(tmp_path / "kimi.gguf", {**md, T.PRE: "kimi-k2"})
    mine, o = Vocab.from_file(path), oracle_of(path)
    assert_same_text_handling(mine, o, PRE_TEXTS[:4])
    with pytest.raises(MetadataError, match=r"k\.gguf: .*tokenizer\.ggml\.merges"):
        Vocab.from_metadata("k.gguf", {**md, T.PRE: "qwen2"})


@oracle
@pytest.mark.parametrize(("pre", "lowercase"), [("whitespace", None), ("whitespace", True), ("gpt-2", None)])
def test_whitespace_model_matches_llama_cpp(oracle_of, pre_test_gguf: Path, pre_test_md: dict[str, object], pre: str,
                                            lowercase: bool | None) -> None:
    """tokenizer.ggml.model 'whitespace': whitespace dropped, each run between tokenized with the pre-tokenizer,
    lowercased unless the normalizer key (or, by default, the 'whitespace' pre-tokenizer) says not."""
    from graphir.tokenizer.metadata import KEY_LOWERCASE

    T = gguf.Keys.Tokenizer
    keys: dict[str, str | bool] = {T.MODEL: "whitespace", T.PRE: pre}
    if lowercase is not None:
        keys[KEY_LOWERCASE] = lowercase
    mine = Vocab.from_metadata(pre_test_gguf.name, {**pre_test_md, **keys})
    o = oracle_of(pre_test_gguf, keys)
    for text in PRE_TEXTS:
        ids = [mine.tokenize(text, True, parse_special) for parse_special in (False, True)]
        assert ids == [o.tokenize(text, True, parse_special) for parse_special in (False, True)], text
        assert mine.detokenize_bytes(ids[1]) == o.detokenize(ids[1])


def test_pre_tokenizer_flags(smol_tokenizer_md: dict[str, object]) -> None:
    T = gguf.Keys.Tokenizer
    llama3 = Vocab.from_metadata("x.gguf", {**smol_tokenizer_md, T.PRE: "llama-bpe"})
    assert llama3.add_bos and llama3.tokenize("hi")[0] == llama3.bos  # llama3 vocabularies add BOS by default
    assert Vocab.from_metadata("x.gguf", {**smol_tokenizer_md, T.PRE: "llama-bpe", T.ADD_BOS: False}).add_bos is False
    # how words are cut (SmolLM2 has no multi-digit tokens, so look at the pre-tokenizer's words)
    words = {name: Vocab.from_metadata("x.gguf", {**smol_tokenizer_md, T.PRE: name})._model.words(
        "x 1234567 it'S\r\n\n y") for name in ("llama3", "qwen2", "smollm", "gpt-2", "default")}
    assert words["llama3"] == ["x", " ", "123", "456", "7", " it", "'S", "\r\n\n", " y"]
    assert words["qwen2"] == ["x", " ", *"1234567", " it", "'S", "\r\n\n", " y"]
    assert words["smollm"] == ["x", " ", *"1234567", " it", "'", "S", "\r\n\n", " y"]
    assert words["gpt-2"] == ["x", " 1234567", " it", "'", "S", "\r\n\n", " y"]
    assert words["default"] == ["x", " ", "123", "456", "7", " it", "'", "S", "\r\n\n", " y"]
    # clean_up_tokenization_spaces: on for gpt-2, off for smollm
    gpt2 = Vocab.from_metadata("x.gguf", {**smol_tokenizer_md, T.PRE: "gpt-2"})
    smol = Vocab.from_metadata("x.gguf", {**smol_tokenizer_md, T.PRE: "smollm"})
    text = "hello , world . it 's"
    assert gpt2.detokenize(gpt2.tokenize(text)) == "hello, world. it's"
    assert smol.detokenize(smol.tokenize(text)) == text


# ---------------------------------------------------------------------------------------------
# llama (SentencePiece-style) vocabularies: a small synthetic vocabulary
# ---------------------------------------------------------------------------------------------

SPM_CORPUS = ("hello world the quick brown fox jumps over lazy dog tokenization sentence piece "
              "日本語 テスト привет мир café naïve").split()


def _spm_metadata(**overrides: object) -> dict[str, object]:
    """<unk> <s> </s>, 256 byte tokens, special tokens of each type, and pieces of a small corpus.

    Scores come from a coarse grid so that equal-score pairs (left-first ties) happen.
    """
    rnd = random.Random(7)
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [2, 3, 3] + [6] * 256
    scores = [0.0, 0.0, 0.0] + [0.0] * 256
    for text, ty in (("<|user|>", 4), ("<|ctl|>", 3), ("<unused0>", 5), ("<undef>", 0), ("<|im_end|>", 1)):
        tokens.append(text)
        types.append(ty)
        scores.append(0.0)
    pieces: set[str] = {"\u2581", "\u2581\u2581", "\u2581\u2581\u2581\u2581"}
    for word in SPM_CORPUS:
        w = "\u2581" + word
        for i in range(len(w)):
            for j in range(i + 1, min(len(w), i + 6) + 1):
                pieces.add(w[i:j])
    for p in sorted(pieces):
        tokens.append(p)
        types.append(1)
        scores.append(-rnd.randint(1, 24) / 2)
    md: dict[str, object] = {
        gguf.Keys.Tokenizer.MODEL: "llama",
        gguf.Keys.Tokenizer.LIST: tokens,
        gguf.Keys.Tokenizer.SCORES: scores,
        gguf.Keys.Tokenizer.TOKEN_TYPE: types,
        gguf.Keys.Tokenizer.BOS_ID: 1,
        gguf.Keys.Tokenizer.EOS_ID: 2,
        gguf.Keys.Tokenizer.UNK_ID: 0,
    }
    md.update(overrides)
    return md


SPM_VARIANTS = {
    "default": {},
    "no_space_prefix": {gguf.Keys.Tokenizer.ADD_PREFIX: False},
    "eos_no_bos": {gguf.Keys.Tokenizer.ADD_BOS: False, gguf.Keys.Tokenizer.ADD_EOS: True},
}

SPM_TEXTS = [
    "", " ", "  ", "hello", "hello world", " hello", "hello ", "  hello   world  ", "the quick brown fox",
    "jumps over the lazy dog", "tokenization", "sentencepiece", "Hello World", "hello\nworld", "a\tb\r\nc",
    "日本語のテスト", "привет мир", "café naïve", "zzz QQQ 123", "😀 emoji", "x\u00a0y",
    "<|user|>hello", "hello<|user|>world", "<|ctl|> hello", "<|ctl|><|user|>", "<s>hello</s>",
    "<unk>", "<unused0><undef>", "<|im_end|>", "▁hello", "hello▁world",
]


# Golden ids from llama.cpp for the default synthetic vocabulary (add_special=True).
SPM_GOLDEN = {
    ("hello world", False): [1, 499, 544],
    ("  the quick brown fox", False): [1, 553, 535, 527, 484, 494],
    ("naïve café\n", False): [1, 513, 488, 13],
    ("<|user|>привет<|ctl|>", False): [1, 259, 551, 458, 63, 127, 281, 410, 342, 127, 65],
    ("<|user|>привет<|ctl|>", True): [1, 259, 551, 458, 260],
    ("Zz 9", False): [1, 479, 93, 443, 479, 60],
}


@pytest.mark.parametrize(("text", "parse_special"), list(SPM_GOLDEN))
def test_spm_golden(spm_files: dict[str, Path], text: str, parse_special: bool) -> None:
    v = Vocab.from_file(spm_files["default"])
    ids = v.tokenize(text, parse_special=parse_special)
    assert ids == SPM_GOLDEN[(text, parse_special)]
    # the space prefixed at tokenization stays after a removed BOS, and a special token is followed by one
    expected = " " + text if not text.startswith("<|user|>") else "<|user|> привет<|ctl|>"
    assert v.detokenize(ids, remove_special=True, unparse_special=True) == expected


@pytest.fixture(scope="module")
def spm_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("spm")
    return {name: write_vocab_gguf(d / f"{name}.gguf", _spm_metadata(**ov)) for name, ov in SPM_VARIANTS.items()}


def test_spm_vocab_facts(spm_files: dict[str, Path]) -> None:
    v = Vocab.from_file(spm_files["default"])
    facts = (v.model, v.pre, v.bos, v.eos, v.add_bos, v.add_eos, v.add_space_prefix)
    assert facts == ("llama", None, 1, 2, True, False, True)
    assert v.eog_ids == {2, v.token_to_id["<|im_end|>"]}  # eos and <|im_end|>, recognised by its text
    nl = v.tokenize("hello\nworld", add_special=False)
    assert v.token_to_id["<0x0A>"] in nl  # no "\n" piece: byte fallback
    assert v.token_to_piece(v.token_to_id["<0x0A>"]) == b"\n"
    assert v.token_to_piece(v.token_to_id["\u2581hello"]) == b" hello"
    assert v.token_to_piece(1, special=False) == b"" and v.token_to_piece(1) == b"<s>"


def test_spm_space_prefix_and_specials(spm_files: dict[str, Path]) -> None:
    v = Vocab.from_file(spm_files["default"])
    hello = v.token_to_id["\u2581hello"]
    user = v.token_to_id["<|user|>"]
    assert v.tokenize("hello", add_special=False) == [hello]
    # user-defined tokens are cut out even without parse_special; text after a special gets a space again
    assert v.tokenize("<|user|>hello") == [1, user, hello]
    # the space prefixed at tokenization is dropped from the first piece -- unless a BOS comes first
    assert v.detokenize(v.tokenize("hello world", add_special=False)) == "hello world"
    assert v.detokenize(v.tokenize("hello world")) == " hello world"
    assert v.detokenize([1, hello], remove_special=True) == " hello"
    assert v.detokenize([1, hello], unparse_special=True) == "<s> hello"
    no_prefix = Vocab.from_file(spm_files["no_space_prefix"])
    assert no_prefix.tokenize("hello", add_special=False) != [hello]
    eos = Vocab.from_file(spm_files["eos_no_bos"])
    assert eos.tokenize("hello") == [hello, 2] and eos.tokenize("") == [2]


@pytest.fixture(scope="module")
def spm_oracles(spm_files: dict[str, Path]):
    oracles = {name: Oracle(path) for name, path in spm_files.items()}
    yield oracles
    for o in oracles.values():
        o.close()


@oracle
@pytest.mark.parametrize("variant", list(SPM_VARIANTS))
def test_spm_matches_llama_cpp(spm_files: dict[str, Path], spm_oracles: dict[str, Oracle], variant: str) -> None:
    mine = Vocab.from_file(spm_files[variant])
    o = spm_oracles[variant]
    assert (mine.bos, mine.eos, mine.add_bos, mine.add_eos) == o.facts()
    assert_same_text_handling(mine, o, SPM_TEXTS)
    for i in range(mine.n_vocab):
        assert mine.token_to_piece(i, True) == o.piece(i, True)
        assert mine.token_to_piece(i, False) == o.piece(i, False)
        assert mine.is_eog(i) == o.is_eog(i)


@pytest.fixture(scope="module")
def spm_pair(spm_files: dict[str, Path], spm_oracles: dict[str, Oracle]):
    return Vocab.from_file(spm_files["default"]), spm_oracles["default"]


_spm_fragments = st.one_of(
    st.sampled_from(SPM_CORPUS + [" ", "  ", "\n", "<|user|>", "<|ctl|>", "<s>", "</s>", "\u2581", "Z", "9"]),
    st.text(alphabet="".join(sorted(set("".join(SPM_CORPUS)))) + " ", max_size=10),
    st.text(max_size=6),
)


@oracle
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.lists(_spm_fragments, max_size=6).map("".join), add_special=st.booleans(), parse_special=st.booleans())
def test_spm_random_text_matches_llama_cpp(spm_pair, text: str, add_special: bool, parse_special: bool) -> None:
    mine, o = spm_pair
    ids = mine.tokenize(text, add_special, parse_special)
    assert ids == o.tokenize(text, add_special, parse_special)
    assert mine.detokenize_bytes(ids) == o.detokenize(ids)


# ---------------------------------------------------------------------------------------------
# gemma4 vocabularies: BPE the SentencePiece way (U+2581 spaces, UTF-8 words, <0xXX> byte tokens)
# ---------------------------------------------------------------------------------------------

GEMMA4_CORPUS = "hello world the quick brown fox 日本語 привет café".split()


def _gemma4_metadata() -> dict[str, object]:
    """<pad> <eos> <bos> <unk>, 256 byte tokens, the corpus' characters, and merges that build each word with its
    U+2581 from the left; newline runs of two and three are tokens, only the first one built by a merge."""
    chars = sorted({c for w in GEMMA4_CORPUS for c in w} | {"\u2581", "\n"})
    tokens = ["<pad>", "<eos>", "<bos>", "<unk>"] + [f"<0x{b:02X}>" for b in range(256)] + chars
    merges = ["\n \n"]
    for word in ["\u2581" + w for w in GEMMA4_CORPUS] + ["\u2581\u2581"]:
        for i in range(2, len(word) + 1):
            merge = f"{word[:i - 1]} {word[i - 1]}"
            if merge not in merges:
                merges.append(merge)
                tokens.append(word[:i])
    tokens += ["\n\n", "\n\n\n"]
    T = gguf.Keys.Tokenizer
    return {T.MODEL: "gemma4", T.LIST: tokens, T.TOKEN_TYPE: [3, 3, 3, 2] + [6] * 256 + [1] * (len(tokens) - 260),
            T.MERGES: merges, T.BOS_ID: 2, T.EOS_ID: 1, T.UNK_ID: 3, T.PAD_ID: 0, T.ADD_BOS: False}


GEMMA4_TEXTS = ["", "hello world", " the  quick brown fox ", "a\n\nb\n\n\nc\n\n\n\n", "日本語 привет café!",
                "😀 x", "<bos>hello<eos>", "\u2581hello", "tab\tx\r\n"]


@oracle
def test_gemma4_matches_llama_cpp(oracle_of, tmp_path: Path) -> None:
    path = write_vocab_gguf(tmp_path / "gemma4.gguf", _gemma4_metadata())
    mine, o = Vocab.from_file(path), oracle_of(path)
    # the model implies the 'gemma4' pre-tokenizer, and BOS is added even where the file says not to
    assert (mine.pre, mine.add_bos, mine.clean_spaces) == ("gemma4", True, True)
    assert (mine.bos, mine.eos, mine.add_bos, mine.add_eos) == o.facts()
    assert_same_text_handling(mine, o, GEMMA4_TEXTS)
    assert_same_pieces(mine, o)


# ---------------------------------------------------------------------------------------------
# plamo2 vocabularies (PLaMo 2 and 3): a small synthetic vocabulary
# ---------------------------------------------------------------------------------------------

PLAMO2_CORPUS = ("hello world the quick brown fox 日本語のテキスト 東京都 привет мир café 12345 "
                 "<|plamo:op|> [PAD1]").split(" ")


def _plamo2_metadata() -> dict[str, object]:
    """Control tokens, 256 byte tokens, every piece (up to 6 code points) of PLAMO2_CORPUS words and of the words
    with a space before them, scores from a coarse grid (equal costs happen), one token whose scaled score is
    exactly the unknown cost (as PLaMo's padding tokens have), one with an infinite score, and unused pads."""
    rnd = random.Random(11)
    tokens = ["<|plamo:unk|>", "<|plamo:bos|>", "<|plamo:eos|>", "<|plamo:pad|>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [2, 3, 3, 3] + [6] * 256
    scores = [0.0] * len(tokens)
    pieces: set[str] = set()
    for word in PLAMO2_CORPUS + [" " + w for w in PLAMO2_CORPUS]:
        for i in range(len(word)):
            pieces.update(word[i:j] for j in range(i + 1, min(len(word), i + 6) + 1))
    for p in sorted(pieces):
        tokens.append(p)
        types.append(1)
        scores.append(-rnd.randint(1, 16) / 2)
    for text, score, ty in (("quick brown", -1000.0, 1), ("天気", float("-inf"), 1), ("[PAD2]", -1000.0, 5)):
        tokens.append(text)
        types.append(ty)
        scores.append(score)
    T = gguf.Keys.Tokenizer
    return {T.MODEL: "plamo2", T.PRE: "default", T.LIST: tokens, T.SCORES: scores, T.TOKEN_TYPE: types,
            T.BOS_ID: 1, T.EOS_ID: 2, T.UNK_ID: 0, T.PAD_ID: 3}


PLAMO2_TEXTS = [
    "", " ", "hello world", "the quick brown fox", "the quick brown", "日本語のテキスト", "東京都の天気", "привет мир",
    "café 12345 67890", "\ufeffhello", "hello\ufeff", "xyz 😀 emoji", "<|plamo:bos|>hello<|plamo:eos|>",
    "<|plamo:op|> [PAD1][PAD2]", "quick brownfox", "  two  spaces  ", "tab\tand\nnewline",
]


@pytest.fixture(scope="module")
def plamo2_pair(tmp_path_factory: pytest.TempPathFactory):
    path = write_vocab_gguf(tmp_path_factory.mktemp("plamo2") / "plamo2.gguf", _plamo2_metadata())
    o = Oracle(path)
    yield Vocab.from_file(path), o
    o.close()


@oracle
def test_plamo2_matches_llama_cpp(plamo2_pair) -> None:
    mine, o = plamo2_pair
    assert (mine.model, mine.add_space_prefix, mine.clean_spaces) == ("plamo2", False, False)
    assert (mine.bos, mine.eos, mine.add_bos, mine.add_eos) == o.facts()
    assert_same_text_handling(mine, o, PLAMO2_TEXTS)
    assert_same_pieces(mine, o)


@oracle
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.lists(st.one_of(st.sampled_from(PLAMO2_CORPUS + [" ", "  ", "\ufeff"]), st.text(max_size=5)),
                     max_size=6).map("".join))
def test_plamo2_random_text_matches_llama_cpp(plamo2_pair, text: str) -> None:
    mine, o = plamo2_pair
    ids = mine.tokenize(text, True, True)
    assert ids == o.tokenize(text, True, True)
    assert mine.detokenize_bytes(ids, False, True) == o.detokenize(ids, False, True)


def test_plamo2_without_a_byte_token_is_refused() -> None:
    md = _plamo2_metadata()
    tokens = list(md[gguf.Keys.Tokenizer.LIST])  # type: ignore[call-overload]
    tokens[4 + 0x41] = "<0xZZ>"
    with pytest.raises(MetadataError, match=r"p\.gguf: plamo2 vocabulary without the byte token <0x41>"):
        Vocab.from_metadata("p.gguf", {**md, gguf.Keys.Tokenizer.LIST: tokens})


# ---------------------------------------------------------------------------------------------
# rwkv vocabularies: escaped byte-string tokens, longest match from the left
# ---------------------------------------------------------------------------------------------


def _rwkv_metadata() -> dict[str, object]:
    """Every byte (printable ASCII as itself, the rest \\xhh), words and pieces of text, escapes of each kind, an
    upper-case hex escape (llama.cpp reads it as another byte, here the same as '"': the later token wins), and
    a user-defined token."""
    tokens = [chr(b) if 0x20 <= b < 0x7F and b != 0x5C else f"\\x{b:02x}" for b in range(256)]
    tokens += ["\\\\", "\\n\\n", "\\t\\t", "\\r\\n", " the", " quick", " qu", "hello", "hell", " world", "日本",
               "日本語", "привет", "\\xe6\\x97", "ab\\'cd", "\\xAB", "<|user|>"]
    T = gguf.Keys.Tokenizer
    return {T.MODEL: "rwkv", T.LIST: tokens, T.TOKEN_TYPE: [1] * (len(tokens) - 1) + [4]}


RWKV_TEXTS = ["", "hello world", " the quick brown", "hell", "日本語 日本 日", "привет\r\n\n\n\t\t\t",
              "ab'cd ab\\cd \\", 'say "hi"', "<|user|>hello<|user|>", "😀 \x00\x7f"]


@oracle
def test_rwkv_matches_llama_cpp(oracle_of, tmp_path: Path) -> None:
    path = write_vocab_gguf(tmp_path / "rwkv.gguf", _rwkv_metadata())
    mine, o = Vocab.from_file(path), oracle_of(path)
    assert (mine.model, mine.bos, mine.eos, mine.add_bos, mine.add_eos) == ("rwkv", *o.facts())
    assert_same_text_handling(mine, o, RWKV_TEXTS)
    assert_same_pieces(mine, o)
    assert mine.tokenize('"')[0] == mine.token_to_id["\\xAB"]


def test_rwkv_text_no_token_starts_is_refused_or_unknown() -> None:
    """Where llama.cpp would emit id -1 (no token starts with the byte, no unknown token) graphir refuses the text;
    with an unknown token that token stands for the byte; a byte only longer tokens start with is refused too."""
    md = _rwkv_metadata()
    T = gguf.Keys.Tokenizer
    tokens = list(md[T.LIST])  # type: ignore[call-overload]
    tokens[ord("z")], tokens[ord("y")] = "yy", "<unk>"
    no_z = Vocab.from_metadata("r.gguf", {**md, T.LIST: tokens})
    with pytest.raises(ValueError, match="no token starts with the byte 0x7a"):
        no_z.tokenize("z")
    with pytest.raises(ValueError, match="no token is a prefix of the text at byte 0"):
        no_z.tokenize("y")
    unk = no_z.token_to_id["<unk>"]
    assert Vocab.from_metadata("r.gguf", {**md, T.LIST: tokens, T.UNK_ID: unk}).tokenize("azyy") == [ord("a"), unk,
                                                                                                        ord("z")]


# ---------------------------------------------------------------------------------------------
# hybriddna vocabularies: byte-level BPE, DNA between <dna> tags cut into marked 6-mers
# ---------------------------------------------------------------------------------------------

HYBRIDDNA_TEXTS = ["no dna here CCCCCC", "x <dna>acgtacCCCCCCaaa</dna> y", "<dna>AC", "<dna></dna><dna>GGGGGGT",
                   "<dna>ééé</dna>é", "a</dna>b<dna>TTTTTTTTTTTT</dna></dna>"]


@oracle
def test_hybriddna_matches_llama_cpp(oracle_of, tmp_path: Path) -> None:
    """The tags and <oov> are normal tokens; the k-mer CCCCCC shares its letters with a BPE token."""
    from graphir.tokenizer.bpe import _BYTE_TO_UNI

    T = gguf.Keys.Tokenizer
    kmers = [k + "\ue000" for k in ("AAAAAA", "ACGTAC", "CCCCCC", "AAAAAT", "TTTTTT", "GAAAAA")]
    tokens = list(_BYTE_TO_UNI) + ["CC", "CCCC", "CCCCCC", "<dna>", "</dna>", "<oov>"] + kmers
    md = {T.MODEL: "hybriddna", T.PRE: "gpt-2", T.LIST: tokens, T.TOKEN_TYPE: [1] * len(tokens),
          T.MERGES: ["C C", "CC CC", "CCCC CC"], T.BOS_ID: 0, T.EOS_ID: 0}
    path = write_vocab_gguf(tmp_path / "dna.gguf", md)
    mine, o = Vocab.from_file(path), oracle_of(path)
    assert_same_text_handling(mine, o, HYBRIDDNA_TEXTS)
    assert_same_pieces(mine, o)
    assert mine.token_to_piece(mine.token_to_id["ACGTAC\ue000"]) == b"ACGTAC"


@oracle
def test_dummy_test_tokenizer_matches_llama_cpp(oracle_of, tmp_path: Path) -> None:
    """tokenizer.ggml.model 'test', as the tiny models llama.cpp makes carry it: hashed 5-byte chunks."""
    T = gguf.Keys.Tokenizer
    tokens = [f"tok_{i}" for i in range(97)] + ["<|user|>"]
    md = {T.MODEL: "test", T.LIST: tokens, T.SCORES: [0.0] * len(tokens), T.TOKEN_TYPE: [1] * 97 + [4]}
    path = write_vocab_gguf(tmp_path / "test.gguf", md)
    mine, o = Vocab.from_file(path), oracle_of(path)
    assert_same_text_handling(mine, o, ["", "a", "hello world", "日本語のテキスト 😀", "x<|user|>yz" * 3])
    assert_same_pieces(mine, o)


# ---------------------------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------------------------


def test_unknown_tokenizer_model_is_a_clear_error() -> None:
    with pytest.raises(MetadataError, match=r"weird\.gguf: unknown tokenizer model 'sentencepiece2'"):
        Vocab.from_metadata("weird.gguf", _spm_metadata(**{gguf.Keys.Tokenizer.MODEL: "sentencepiece2"}))
    for name in ("no_vocab", "none"):  # llama.cpp knows them (a file without a vocabulary): nothing to tokenize
        with pytest.raises(MetadataError, match=rf"{name}\.gguf: tokenizer model '{name}' .* is not supported"):
            Vocab.from_metadata(f"{name}.gguf", _spm_metadata(**{gguf.Keys.Tokenizer.MODEL: name}))
    md = _spm_metadata()
    del md[gguf.Keys.Tokenizer.MODEL]
    with pytest.raises(MetadataError, match=r"none\.gguf: .*tokenizer\.ggml\.model.* missing"):
        Vocab.from_metadata("none.gguf", md)


def test_unknown_pre_tokenizer_is_a_clear_error(smol_tokenizer_md: dict[str, object]) -> None:
    with pytest.raises(MetadataError, match=r"odd\.gguf: unknown pre-tokenizer 'klingon' \(tokenizer\.ggml\.pre\)"):
        Vocab.from_metadata("odd.gguf", {**smol_tokenizer_md, gguf.Keys.Tokenizer.PRE: "klingon"})
    # llama.cpp spells GPT-2's pre-tokenizer "gpt-2"; "gpt2" is not one of its names
    with pytest.raises(MetadataError, match="unknown pre-tokenizer 'gpt2'"):
        Vocab.from_metadata("odd.gguf", {**smol_tokenizer_md, gguf.Keys.Tokenizer.PRE: "gpt2"})


def test_malformed_vocabularies_are_clear_errors(smol_tokenizer_md: dict[str, object]) -> None:
    T = gguf.Keys.Tokenizer
    dup = _spm_metadata()
    dup[T.LIST] = list(dup[T.LIST])  # type: ignore[call-overload]
    dup[T.LIST][5] = dup[T.LIST][4]  # type: ignore[index]
    with pytest.raises(MetadataError, match=r"d\.gguf: duplicate token in vocabulary: '<0x01>' has ids 4 and 5"):
        Vocab.from_metadata("d.gguf", dup)
    no_merges = {k: v for k, v in smol_tokenizer_md.items() if k != T.MERGES}
    with pytest.raises(MetadataError, match=r"m\.gguf: .*tokenizer\.ggml\.merges"):
        Vocab.from_metadata("m.gguf", no_merges)
    with pytest.raises(MetadataError, match=r"b\.gguf: tokenizer\.ggml\.add_bos_token is true, but .*bos_token_id"):
        Vocab.from_metadata("b.gguf", {**smol_tokenizer_md, T.PRE: "glm4", T.BOS_ID: 10**6, T.ADD_BOS: True})
    with pytest.raises(ValueError, match="out of range"):
        Vocab.from_metadata("s.gguf", _spm_metadata()).token_to_piece(10**6)
