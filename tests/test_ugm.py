"""Specifications for SentencePiece unigram vocabularies (tokenizer.ggml.model "t5"): token-for-token agreement
with llama.cpp.

The vocabulary is a real one: sentencepiece trains a small unigram model on the multilingual corpus below, with
the nmt_nfkc normalization T5 uses, so it carries a real precompiled charsmap (NFKC and whitespace folding as a
double-array trie). It is written to a vocab-only GGUF the way convert_hf_to_gguf writes T5 vocabularies, and
llama.cpp, through llama-cpp-python, is the oracle. Tests that need no oracle spell the rules out, check
agreement with sentencepiece itself where llama.cpp follows it, and use small hand-built charsmaps.
"""

from __future__ import annotations

import io
import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("GGML_NO_BACKTRACE", "1")  # before llama_cpp loads libllama

import gguf
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import write_vocab_gguf

from graphir.errors import MetadataError
from graphir.tokenizer.vocab import Vocab

pytestmark = pytest.mark.same_on_every_path  # tokenizing is the same on every CPU path

try:
    import llama_cpp
    from llama_vocab import Oracle, assert_same_detokenize, assert_same_pieces, assert_same_text_handling
except ImportError:  # the conftest skips every `oracle` test, with its reason, where it is missing
    llama_cpp = None

oracle = pytest.mark.oracle
T = gguf.Keys.Tokenizer
PAD, EOS, UNK = 0, 1, 2  # T5's ids, and llama.cpp's defaults for "t5"
SPACE = "\u2581"
USER_SYMBOLS = ["<sep>", "\u210c\u2603"]  # "<sep>", "ℌ☃": one ASCII, one that NFKC would change ("ℌ" is "H")
EXTRA_IDS = 4  # like T5's config vocab_size (32128) past its tokenizer's (32100): [PAD<id>] unused tokens

CORPUS = """\
The quick brown fox jumps over the lazy dog. A wizard's job is to vex chumps quickly in fog.
Tokenizers cut text into pieces, and each piece has a score: the unigram model keeps the best cut.
Hello world! How are you today? I am fine, thanks; and you? We're testing the tokenizer again.
Numbers like 12345, 3.14159 and 2024-01-02 appear in text, as do prices of $19.99 and 50% discounts.
Café, naïve, résumé, Ångström, crème brûlée, façade, jalapeño, Zürich, Málaga, São Paulo.
Привет, мир! Как дела сегодня? Москва — столица России. Быстрая коричневая лиса прыгает.
日本語のテキストです。東京は大きな都市です。今日はいい天気ですね。ありがとうございます。
中文文本，还有标点。北京欢迎你。我们正在测试分词器。今天天气很好。
한국어 텍스트입니다. 서울은 큰 도시입니다. 감사합니다.
Γειά σου κόσμε. Η γρήγορη καφέ αλεπού πηδάει πάνω από τον τεμπέλη σκύλο.
مرحبا بالعالم. هذا نص عربي قصير للاختبار.
नमस्ते दुनिया। यह एक छोटा परीक्षण पाठ है।
Deutsch: Größe, Straße, übermäßig, Äpfel und Öl. Français: où est la bibliothèque? Español: ¿Dónde está?
"""

SPM_MISSING = "the reference SentencePiece tokenizer is in the test extra: pip install -e '.[test]'"


# ---------------------------------------------------------------------------------------------
# A real SentencePiece unigram model, read without protobuf
# ---------------------------------------------------------------------------------------------


def _fields(data: bytes) -> Iterator[tuple[int, int | bytes]]:
    """The (field number, value) pairs of a protobuf message: varints as ints, everything else as bytes."""

    def varint(i: int) -> tuple[int, int]:
        value = shift = 0
        while True:
            b = data[i]
            value |= (b & 0x7F) << shift
            shift += 7
            i += 1
            if b < 0x80:
                return value, i

    i = 0
    while i < len(data):
        key, i = varint(i)
        wire = key & 7
        if wire == 0:
            value, i = varint(i)
            yield key >> 3, value
            continue
        if wire == 2:
            size, i = varint(i)
        else:
            size = {1: 8, 5: 4}[wire]
        yield key >> 3, data[i : i + size]
        i += size


@dataclass
class SpModel:
    """What convert_hf_to_gguf reads from a tokenizer.model: sentencepiece_model.proto's ModelProto
    (1: repeated SentencePiece {1: piece, 2: float score, 3: Type, NORMAL when absent}, 3: NormalizerSpec
    {1: name, 2: precompiled_charsmap, 3: add_dummy_prefix, 4: remove_extra_whitespaces, 5: escape_whitespaces},
    whose bools default to true)."""

    proto: bytes
    pieces: list[tuple[str, float, int]]
    normalizer: str
    charsmap: bytes
    add_dummy_prefix: bool
    remove_extra_whitespaces: bool

    @classmethod
    def parse(cls, proto: bytes) -> SpModel:
        pieces, spec = [], {}
        for field, value in _fields(proto):
            if field == 1:
                p = dict(_fields(value))  # type: ignore[arg-type]
                score = struct.unpack("<f", p[2])[0] if 2 in p else 0.0  # type: ignore[arg-type]
                pieces.append((p[1].decode(), score, p.get(3, 1)))  # type: ignore[union-attr]
            elif field == 3:
                spec = dict(_fields(value))  # type: ignore[arg-type]
        return cls(proto, pieces, spec[1].decode(), spec.get(2, b""), bool(spec.get(3, 1)),  # type: ignore[union-attr]
                   bool(spec.get(4, 1)))


def train_model() -> SpModel:
    spm = pytest.importorskip("sentencepiece", reason=SPM_MISSING)
    out = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(CORPUS.splitlines()), model_writer=out, model_type="unigram", vocab_size=400,
        hard_vocab_limit=False, normalization_rule_name="nmt_nfkc", character_coverage=1.0,
        pad_id=PAD, eos_id=EOS, unk_id=UNK, bos_id=-1, user_defined_symbols=USER_SYMBOLS,
        num_threads=1, minloglevel=2)
    return SpModel.parse(out.getvalue())


def t5_metadata(m: SpModel) -> dict[str, object]:
    """The tokenizer keys convert_hf_to_gguf writes for a T5 checkpoint with this tokenizer.model (T5Model.set_vocab
    and gguf.SpecialVocab reading T5's tokenizer files).

    Ids past the model's pieces are "[PAD<id>]" unused tokens scored -10000; SentencePiece's user-defined pieces
    are written as normal tokens (the converter asks only IsUnknown/IsControl/IsUnused/IsByte). T5's
    post-processor "$A </s>" sets add_eos, not add_bos.
    """
    n = len(m.pieces) + EXTRA_IDS
    tokens, scores, types = [f"[PAD{i}]" for i in range(n)], [-10000.0] * n, [5] * n
    for i, (piece, score, kind) in enumerate(m.pieces):
        tokens[i], scores[i], types[i] = piece, score, 1 if kind == 4 else kind  # sentencepiece's types are GGUF's
    return {
        T.MODEL: "t5", T.PRE: "default", T.LIST: tokens, T.SCORES: scores, T.TOKEN_TYPE: types,
        T.ADD_PREFIX: m.add_dummy_prefix, T.REMOVE_EXTRA_WS: m.remove_extra_whitespaces,
        T.PRECOMPILED_CHARSMAP: m.charsmap, T.EOS_ID: EOS, T.UNK_ID: UNK, T.PAD_ID: PAD,
        T.ADD_BOS: False, T.ADD_EOS: True,
    }


def write_t5_gguf(path: Path, metadata: dict[str, object]) -> Path:
    """A vocab-only T5 GGUF llama.cpp loads with vocab_only=True; the charsmap is a UINT8 array, as the converter
    writes it (a list of ints would be INT32, which llama.cpp refuses)."""
    K = gguf.Keys
    return write_vocab_gguf(path, metadata, "t5", {
        K.LLM.CONTEXT_LENGTH: 512, K.LLM.EMBEDDING_LENGTH: 64, K.LLM.BLOCK_COUNT: 2, K.LLM.FEED_FORWARD_LENGTH: 128,
        K.Attention.HEAD_COUNT: 4, K.Attention.LAYERNORM_RMS_EPS: 1e-6})


# Normalizer and special-token settings: as converted; SentencePiece's user-defined pieces typed USER_DEFINED (as
# an added_tokens.json makes them); each whitespace setting; a bos; and llama.cpp's defaults for what is absent.
_OPTIONAL = (T.PRE, T.EOS_ID, T.UNK_ID, T.PAD_ID, T.ADD_BOS, T.ADD_EOS, T.ADD_PREFIX, T.REMOVE_EXTRA_WS,
             T.PRECOMPILED_CHARSMAP)
VARIANTS: dict[str, dict[str, object]] = {
    "t5": {},
    "user_defined": {},  # token types set in variant_md
    "no_charsmap": {T.PRECOMPILED_CHARSMAP: None},
    "keep_spaces": {T.REMOVE_EXTRA_WS: False},
    "no_prefix": {T.ADD_PREFIX: False, T.REMOVE_EXTRA_WS: False},
    "merge_no_prefix": {T.ADD_PREFIX: False},
    "bos": {T.BOS_ID: PAD, T.ADD_BOS: True, T.ADD_EOS: False},
    "defaults": {k: None for k in _OPTIONAL},
    "bare": {k: None for k in (*_OPTIONAL, T.SCORES, T.TOKEN_TYPE)},  # every token normal, every score 0
}


def variant_md(md: dict[str, object], name: str) -> dict[str, object]:
    out = {**md, **VARIANTS[name]}
    if name == "user_defined":
        types = zip(md[T.LIST], md[T.TOKEN_TYPE])  # type: ignore[call-overload]
        out[T.TOKEN_TYPE] = [4 if t in USER_SYMBOLS else k for t, k in types]
    return {k: v for k, v in out.items() if v is not None}


@pytest.fixture(scope="module")
def sp_model() -> SpModel:
    return train_model()


@pytest.fixture(scope="module")
def t5_md(sp_model: SpModel) -> dict[str, object]:
    return t5_metadata(sp_model)


@pytest.fixture(scope="module")
def t5_files(t5_md: dict[str, object], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("t5")
    return {name: write_t5_gguf(d / f"{name}.gguf", variant_md(t5_md, name)) for name in VARIANTS}


@pytest.fixture(scope="module")
def t5_vocabs(t5_files: dict[str, Path]) -> dict[str, Vocab]:
    return {name: Vocab.from_file(path) for name, path in t5_files.items()}


@pytest.fixture(scope="module")
def t5_oracles(t5_files: dict[str, Path]):
    oracles = {name: Oracle(path) for name, path in t5_files.items()}
    yield oracles
    for o in oracles.values():
        o.close()


@pytest.fixture(scope="module")
def t5(t5_vocabs: dict[str, Vocab]) -> Vocab:
    return t5_vocabs["t5"]


def pieces(v: Vocab, text: str) -> list[str]:
    return [v.tokens[i] for i in v.tokenize(text, add_special=False)]


def normalized_bytes(v: Vocab, text: str) -> bytes:
    """A span of text after normalization: what the Viterbi search sees."""
    return v._model._normalize(text.encode())  # type: ignore[attr-defined]


def normalized(v: Vocab, text: str) -> str:
    return normalized_bytes(v, text).decode("utf-8", "replace")


TEXTS = [
    "",
    " ",
    "   ",
    "\t\n\r",
    "Hello world",
    "hello world",
    " Hello world ",
    "  leading and trailing  ",
    "The quick brown fox jumps over the lazy dog.",
    "tabs\tand\t\ttabs",
    "line one\nline two\r\n\r\nline four",
    "ｆｕｌｌ－ｗｉｄｔｈ ＡＢＣ １２３ ｶﾀｶﾅ",
    "ﬁne ﬂow ﬀ ﬃ ﬄ",
    "cafe\u0301 nai\u0308ve A\u030angstro\u0308m",
    "e\u0301\u0301 \u0301 lone mark",
    "① ⅻ ¼ ² ™ … ㍻ ℃ ﷺ",
    "nbsp\u00a0here\u3000ideographic\u2028line\u200bzero\ufeffbom\u00adsoft",
    "\x01\x07\x7f controls \x1b[0m \x85",
    "日本語のテキストです。",
    "中文文本，还有标点。",
    "한국어 텍스트",
    "Привет, мир!",
    "Γειά σου κόσμε",
    "مرحبا بالعالم",
    "नमस्ते दुनिया",
    "😀 smile 👍🏽 family 👨\u200d👩\u200d👧",
    "☃☃☃ snow ☃ man☃",
    "zzxqvj QQQQ xkcd",
    "Größe Straße ÄÖÜ",
    "<sep>",
    "a<sep>b <sep> c",
    "＜sep＞ ＜ｓｅｐ＞",
    "<se <sep",
    "\u210c\u2603",
    "\u210c \u2603 \u210c\u2603\u210c\u2603 \u210cx \u210d \u210b \u210c\u0301",
    "x \u210c\u2603 y",
    "</s>",
    "<pad><unk></s>",
    "hello</s>world",
    "<unk> text",
    "▁hello ▁▁ ▁",
    "x" * 200,
    "don't won't it's we're , . ! ?",
]


# ---------------------------------------------------------------------------------------------
# What llama.cpp does, spelled out
# ---------------------------------------------------------------------------------------------


def test_model_as_trained(sp_model: SpModel) -> None:
    assert sp_model.normalizer == "nmt_nfkc" and len(sp_model.charsmap) > 100_000
    assert sp_model.add_dummy_prefix and sp_model.remove_extra_whitespaces
    assert [p[0] for p in sp_model.pieces[:5]] == ["<pad>", "</s>", "<unk>", *USER_SYMBOLS]
    assert [p[2] for p in sp_model.pieces[:5]] == [3, 3, 2, 4, 4]
    assert 200 < len(sp_model.pieces) <= 400


def test_t5_vocab_facts(t5: Vocab, t5_vocabs: dict[str, Vocab]) -> None:
    facts = (t5.model, t5.pre, t5.bos, t5.eos, t5.unk, t5.pad, t5.add_bos, t5.add_eos, t5.add_space_prefix)
    assert facts == ("t5", None, None, EOS, UNK, PAD, False, True, True)
    assert t5.eog_ids == {EOS} and not t5.clean_spaces
    d = t5_vocabs["defaults"]  # no optional key: llama.cpp's defaults for t5
    assert (d.bos, d.eos, d.unk, d.pad, d.add_bos, d.add_eos, d.add_space_prefix) == (None, EOS, UNK, PAD, False,
                                                                                      True, False)
    assert t5.tokenize("") == [EOS] and t5.tokenize("", add_special=False) == []


def test_normalization(t5: Vocab, t5_vocabs: dict[str, Vocab]) -> None:
    """The charsmap is NFKC plus SentencePiece's whitespace and control folding; spaces become U+2581."""
    assert normalized(t5, "ｆｕｌｌ ﬁ ① ¼ e\u0301") == "▁full▁fi▁1▁1⁄4▁é"
    assert normalized(t5, "a\tb\nc\u3000d\u200be\u00a0f\x01g\x7f") == "▁a▁b▁c▁d▁e▁fg"
    assert normalized(t5, "ﷺ") == "▁صلى▁الله▁عليه▁وسلم"  # a replacement with spaces in it
    assert normalized(t5, "\u00ad") == "▁\u00ad"  # not in the map: kept
    assert pieces(t5, "ｆｕｌｌ ﬁne") == pieces(t5, "full fine")
    plain = t5_vocabs["no_charsmap"]
    assert normalized(plain, "ｆｕｌｌ\tﬁ") == "▁ｆｕｌｌ\tﬁ"  # no charsmap: only spaces change
    assert UNK in plain.tokenize("ｆｕｌｌ", False) and UNK not in t5.tokenize("ｆｕｌｌ", False)


def test_whitespace(t5_vocabs: dict[str, Vocab]) -> None:
    """remove_extra_whitespaces drops runs of spaces and puts one U+2581 before every word -- even without
    add_space_prefix, which otherwise puts one before the first word only."""
    text = "  a  b "
    assert normalized(t5_vocabs["t5"], text) == "▁a▁b"
    assert normalized(t5_vocabs["merge_no_prefix"], text) == "▁a▁b"
    assert normalized(t5_vocabs["keep_spaces"], text) == "▁▁▁a▁▁b▁"
    assert normalized(t5_vocabs["no_prefix"], text) == "▁▁a▁▁b▁"
    assert normalized(t5_vocabs["keep_spaces"], " \t ") == "▁▁▁"  # no word, no prefix
    # each span between special tokens is normalized on its own, so each gets its U+2581
    t5 = t5_vocabs["t5"]
    assert t5.tokenize("a</s>b", False, True) == [*t5.tokenize("a", False), EOS, *t5.tokenize("b", False)]


def test_unknown_characters(t5: Vocab) -> None:
    """A code point no token covers exactly is the unknown token; adjacent unknown tokens become one."""
    assert pieces(t5, "☃☃☃") == [SPACE, "<unk>"]
    assert pieces(t5, "☃ ☃") == [SPACE, "<unk>", SPACE, "<unk>"]
    assert t5.detokenize(t5.tokenize("☃☃ x")) == " x"  # rendered only with unparse_special
    assert t5.detokenize(t5.tokenize("☃☃ x"), unparse_special=True) == "<unk> x</s>"
    assert t5.detokenize(t5.tokenize("☃☃ x"), remove_special=True) == " x"


def test_user_defined_tokens(t5_vocabs: dict[str, Vocab]) -> None:
    ud, t5 = t5_vocabs["user_defined"], t5_vocabs["t5"]
    sep, snow = ud.token_to_id["<sep>"], ud.token_to_id["\u210c\u2603"]
    # cut out before normalization, with or without parse_special
    assert ud.tokenize("a<sep>\u210c\u2603", False) == [*ud.tokenize("a", False), sep, snow]
    # text that normalizes to one is matched by the search, at score 0
    assert ud.tokenize("＜sep＞", False) == [ud.token_to_id[SPACE], sep]
    # the normalizer keeps as it is whatever runs into a user-defined token, so a prefix escapes NFKC ...
    assert normalized(ud, "\u210c") == "▁\u210c" and normalized(t5, "\u210c") == "▁H"
    assert pieces(ud, "\u210c") == [SPACE, "<unk>"]
    # ... even part of a code point: "ℋ" shares two of its bytes with "ℌ", the third becomes U+FFFD; "①" shares
    # one, so every character from U+2000 to U+2FFF escapes NFKC and comes out unknown
    assert normalized_bytes(ud, "\u210b") == "▁".encode() + b"\xe2\x84" + "\ufffd".encode()
    assert normalized(ud, "①") == "▁\ufffd\ufffd\ufffd" and normalized(t5, "①") == "▁1"
    assert pieces(ud, "①") == [SPACE, "<unk>"]
    # converted as T5 converts them, they are normal tokens: not cut out, and normalized like any text
    assert t5.tokenize("\u210c\u2603", False) != [snow] and t5.tokenize("<sep>", False) == [t5.token_to_id[SPACE], sep]


SMALL = {T.MODEL: "t5", T.LIST: ["<pad>", "</s>", "<unk>", SPACE, "x", "y", "xy", SPACE + "yy"],
         T.SCORES: [0.0, 0.0, 0.0, -1.0, -5.0, -5.0, -1.0, -30.0], T.TOKEN_TYPE: [3, 3, 2, 1, 1, 1, 5, 4],
         T.ADD_PREFIX: True}


def test_unused_and_user_defined_tokens_are_searched() -> None:
    """Unused tokens are candidates with their own score (the converter's [PAD<id>] padding, scored -10000,
    could come out of text); user-defined ones score 0 whatever the file says ("▁yy" is never in the text, so
    it is not cut out before normalization)."""
    v = Vocab.from_metadata("s.gguf", SMALL)
    assert v.tokenize("xy", False) == [3, 6]
    assert v.tokenize("yy", False) == [7] and v.tokenize("yyy", False) == [7, 5]
    assert v.tokenize("xz", False) == [3, 4, UNK]  # the unknown score is the lowest normal score (-5) minus 10


# Texts without a character whose first UTF-8 byte starts a user-defined token ("<", and U+2000..U+2FFF, whose
# lead byte is that of "ℌ☃"): llama.cpp keeps such a byte out of normalization (see test_user_defined_tokens).
_USER_LEADS = {s.encode()[0] for s in USER_SYMBOLS}
SP_TEXTS = [t for t in TEXTS if not any(c.encode()[0] in _USER_LEADS for c in t)]


def test_agrees_with_sentencepiece(sp_model: SpModel, t5_vocabs: dict[str, Vocab]) -> None:
    """Where llama.cpp follows SentencePiece the ids are SentencePiece's own."""
    spm = pytest.importorskip("sentencepiece", reason=SPM_MISSING)
    sp = spm.SentencePieceProcessor(model_proto=sp_model.proto)
    ud = t5_vocabs["user_defined"]
    for text in SP_TEXTS:
        assert ud.tokenize(text, False) == sp.encode(text), text


@oracle
def test_5000_characters_tokenize_as_llama_cpp_does(t5: Vocab, t5_oracles: dict[str, Oracle]) -> None:
    """Mixed scripts, symbols and spaces; the speed of the same job is bench/bench_text.py's to measure."""
    text = ("The quick brown fox jumps over the lazy dog. Café naïve ﬁne ｆｕｌｌ 日本語のテキスト 😀☃ \t " * 80)[:5000]
    ids = t5.tokenize(text, add_special=False)
    assert len(ids) > 1000
    assert ids == t5_oracles["t5"].tokenize(text, False, False)


# ---------------------------------------------------------------------------------------------
# Against llama.cpp
# ---------------------------------------------------------------------------------------------


@oracle
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_matches_llama_cpp(t5_vocabs: dict[str, Vocab], t5_oracles: dict[str, Oracle], variant: str) -> None:
    mine, o = t5_vocabs[variant], t5_oracles[variant]
    assert (mine.bos, mine.eos, mine.add_bos, mine.add_eos) == o.facts()
    n = mine.n_vocab
    assert_same_text_handling(mine, o, [*TEXTS, f"[PAD{n - 1}] x[PAD{n - 2}]y"])
    assert_same_pieces(mine, o)
    assert_same_detokenize(mine, o, [[PAD, EOS, UNK], [EOS], [UNK, UNK, 5], [5, EOS], list(range(n - 8, n)), []])


@oracle
def test_small_vocabulary_matches_llama_cpp(tmp_path: Path) -> None:
    path = write_t5_gguf(tmp_path / "small.gguf", SMALL)
    mine, o = Vocab.from_file(path), Oracle(path)
    try:
        assert_same_text_handling(mine, o, ["xy", "yyy", "xz", "yy xyx zz", " x  y ", "xyyxyyy"])
    finally:
        o.close()


_fragments = st.one_of(
    st.text(max_size=8),
    st.text(alphabet="".join(sorted(set(CORPUS))) + "  \t\n", max_size=12),
    st.sampled_from(["<sep>", "＜sep＞", "\u210c\u2603", "\u210c", "\u210b", "</s>", "<pad>", "<unk>", "ｆｕｌｌ", "ﬁ",
                     "e\u0301", "\u0301", "①", "¼", "ﷺ", "  ", "\t", "\u3000", "\u200b", "▁", "☃", "😀", "hello"]),
)


@oracle
@settings(max_examples=150, deadline=None)
@given(text=st.lists(_fragments, max_size=6).map("".join),
       variant=st.sampled_from(["t5", "user_defined", "keep_spaces", "bare"]),
       add_special=st.booleans(), parse_special=st.booleans())
def test_random_text_matches_llama_cpp(t5_vocabs: dict[str, Vocab], t5_oracles: dict[str, Oracle], text: str,
                                       variant: str, add_special: bool, parse_special: bool) -> None:
    mine, o = t5_vocabs[variant], t5_oracles[variant]
    ids = mine.tokenize(text, add_special, parse_special)
    assert ids == o.tokenize(text, add_special, parse_special)
    assert mine.detokenize_bytes(ids, False, True) == o.detokenize(ids, False, True)


# ---------------------------------------------------------------------------------------------
# Hand-built charsmaps: the format, and malformed ones
# ---------------------------------------------------------------------------------------------


def build_charsmap(mapping: dict[bytes, bytes]) -> bytes:
    """A precompiled charsmap in SentencePiece's format (a little-endian u32 size, darts-clone units, NUL-terminated
    replacements), one 256-unit block per trie node: a node's children sit at its block's start XOR their byte,
    and a key's replacement offset in the unit at the start of its own block."""
    units = [256 << 10]  # the root: its children are in block 1
    blocks: dict[bytes, int] = {b"": 1}
    strings = b""

    def unit(i: int) -> int:
        while len(units) <= i:
            units.append(0)
        return units[i]

    for key, repl in mapping.items():
        for depth in range(1, len(key) + 1):
            prefix = key[:depth]
            if prefix not in blocks:
                blocks[prefix] = len(blocks) + 1
                at = blocks[key[: depth - 1]] * 256 + prefix[-1]
                unit(at)
                units[at] = prefix[-1] | (at ^ blocks[prefix] * 256) << 10
        leaf = blocks[key[:-1]] * 256 + key[-1]
        units[leaf] |= 1 << 8
        unit(blocks[key] * 256)
        units[blocks[key] * 256] = 1 << 31 | len(strings)
        strings += repl + b"\0"
    unit(len(blocks) * 256 + 255)
    return struct.pack(f"<I{len(units)}I", 4 * len(units), *units) + strings


TINY_MAP = {b"a": b"b", b"ab": b"X Y", b"q": b"", b"\xc3\xa9": b"e", b"\t": b" ", b"zz": b"\xe2\x98\x83"}


def test_hand_built_charsmap(t5_md: dict[str, object]) -> None:
    """Longest key first, multi-byte keys, a replacement with a space, an empty one."""
    v = Vocab.from_metadata("tiny.gguf", {**t5_md, T.PRECOMPILED_CHARSMAP: build_charsmap(TINY_MAP)})
    assert normalized(v, "a ab aab q\tqé zzz") == "▁b▁X▁Y▁bX▁Y▁e▁☃z"
    as_ints = Vocab.from_metadata("tiny.gguf", {**t5_md, T.PRECOMPILED_CHARSMAP: list(build_charsmap(TINY_MAP))})
    assert normalized(as_ints, "ab") == "▁X▁Y"  # as read from a file: a list of ints


@oracle
def test_hand_built_charsmap_matches_llama_cpp(t5_md: dict[str, object], tmp_path: Path) -> None:
    path = write_t5_gguf(tmp_path / "tiny.gguf", {**t5_md, T.PRECOMPILED_CHARSMAP: build_charsmap(TINY_MAP)})
    mine, o = Vocab.from_file(path), Oracle(path)
    try:
        assert_same_text_handling(mine, o, ["a ab aab q\tqé zzz", "abab", "qqq", "é", "zz", "z", "ba", "a\tb"])
    finally:
        o.close()


def _with_units(blob: bytes, change) -> bytes:
    """The charsmap with its units changed by ``change`` (a function of the list of units)."""
    size = struct.unpack_from("<I", blob)[0]
    units = list(struct.unpack_from(f"<{size // 4}I", blob, 4))
    change(units)
    return struct.pack(f"<I{len(units)}I", size, *units) + blob[4 + size :]


def test_malformed_charsmaps_are_clear_errors(t5_md: dict[str, object]) -> None:
    good = build_charsmap(TINY_MAP)
    size = struct.unpack_from("<I", good)[0]
    cases = {
        "empty": b"",
        "three bytes": b"\x01\x02\x03",
        "truncated": good[:100],
        "no replacements": good[: 4 + size],
        "size too large": struct.pack("<I", len(good)) + good[4:],
        "units past the end": struct.pack("<I", 256 * 4) + good[4 : 4 + 256 * 4] + good[4 + size :],  # root only
        "offset out of range": _with_units(good, lambda u: u.__setitem__(u.index(1 << 31), 1 << 31 | 10_000)),
        "unterminated": good[:-1],
    }
    for name, blob in cases.items():
        with pytest.raises(MetadataError, match=r"c\.gguf: .*tokenizer\.ggml\.precompiled_charsmap"):
            Vocab.from_metadata("c.gguf", {**t5_md, T.PRECOMPILED_CHARSMAP: blob})
            pytest.fail(name)
    for value in ("text", [1.5, 2.5], [300, 1], [[1, 2]], 7):
        with pytest.raises(MetadataError, match=r"c\.gguf: .*tokenizer\.ggml\.precompiled_charsmap.* bytes"):
            Vocab.from_metadata("c.gguf", {**t5_md, T.PRECOMPILED_CHARSMAP: value})


def write_empty_charsmap_gguf(path: Path, metadata: dict[str, object]) -> Path:
    """A GGUF whose charsmap is an empty UINT8 array, which gguf-py refuses to write: written with one byte, then
    patched."""
    write_t5_gguf(path, {**metadata, T.PRECOMPILED_CHARSMAP: b"{"})
    key = T.PRECOMPILED_CHARSMAP.encode()
    one = key + struct.pack("<IIQ", gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.UINT8, 1) + b"{"
    data = path.read_bytes()
    assert data.count(one) == 1
    path.write_bytes(data.replace(one, one[:-9] + struct.pack("<Q", 0)))
    return path


@oracle
def test_llama_cpp_refuses_the_charsmaps_it_checks_at_load(tmp_path: Path) -> None:
    """llama.cpp checks the size header at load, an empty map included (and throws mid-tokenization on the other
    faults, so those are not asked of it)."""
    good = build_charsmap(TINY_MAP)
    size = struct.unpack_from("<I", good)[0]
    paths = [write_empty_charsmap_gguf(tmp_path / "empty.gguf", SMALL)]
    for i, blob in enumerate((b"\x01\x02\x03", good[: 4 + size], struct.pack("<I", len(good)) + good[4:])):
        paths.append(write_t5_gguf(tmp_path / f"bad{i}.gguf", {**SMALL, T.PRECOMPILED_CHARSMAP: blob}))
    for path in paths:
        with pytest.raises(ValueError, match="Failed to load"):
            Oracle(path)
        with pytest.raises(MetadataError, match="precompiled_charsmap"):
            Vocab.from_file(path)
    assert Vocab.from_file(write_t5_gguf(tmp_path / "good.gguf", {**SMALL, T.PRECOMPILED_CHARSMAP: good})).n_vocab


def test_no_unknown_token_is_a_clear_error() -> None:
    v = Vocab.from_metadata("u.gguf", {T.MODEL: "t5", T.LIST: ["\u2581a", "a"], T.TOKEN_TYPE: [1, 1]})
    assert v.unk is None and v.tokenize("a a", False) == [1, 0]
    with pytest.raises(MetadataError, match=r"u\.gguf: .*no token covers.*tokenizer\.ggml\.unknown_token_id"):
        v.tokenize("ab", False)
