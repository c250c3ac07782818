"""GGUF vocabularies: tokenize and detokenize exactly as llama.cpp does.

:class:`Vocab` is what every tokenizer model shares: the token list, special tokens (their ids, recognised
by text where the metadata names none, and the attributes llama.cpp forces on them), cutting special tokens
out of the text, rendering tokens as bytes and joining them back into text. How text between special tokens
becomes ids is the job of the class that ``tokenizer.ggml.model`` picks from :data:`MODELS`.

Before any model runs, special tokens are cut out of the text (llama.cpp's ``tokenizer_st_partition``):
user-defined tokens always, control and unknown tokens only with ``parse_special``; longer tokens are cut first.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

import gguf

from graphir.tokenizer.bpe import Bpe, Gemma4Bpe, HybridDnaBpe, WhitespaceBpe
from graphir.tokenizer.chunks import Chunks
from graphir.tokenizer.metadata import Metadata
from graphir.tokenizer.model import TokenizerModel
from graphir.tokenizer.plamo2 import Plamo2
from graphir.tokenizer.rwkv import Rwkv
from graphir.tokenizer.spm import Spm
from graphir.tokenizer.tokens import (ATTR_CONTROL, ATTR_LSTRIP, ATTR_NORMAL, ATTR_RSTRIP, ATTR_UNKNOWN,
                                      ATTR_UNUSED, ATTR_USER_DEFINED, TokenTable, utf8)
from graphir.tokenizer.ugm import Ugm
from graphir.tokenizer.wpm import Wpm

_TK = gguf.Keys.Tokenizer

# tokenizer.ggml.model -> the model that tokenizes for it
MODELS: dict[str, type[TokenizerModel]] = {
    "bert": Wpm, "gemma4": Gemma4Bpe, "gpt2": Bpe, "hybriddna": HybridDnaBpe, "llama": Spm, "plamo2": Plamo2,
    "rwkv": Rwkv, "t5": Ugm, "test": Chunks, "whitespace": WhitespaceBpe,
}
# Tokenizer models llama.cpp accepts for a file without a vocabulary: there is nothing to tokenize with.
_NO_VOCAB_MODELS = ("no_vocab", "none")

_SPECIAL_ATTRS = ATTR_UNKNOWN | ATTR_CONTROL  # dropped from output unless rendering specials
_C_SPACE = " \t\n\v\f\r"  # C isspace() in the "C" locale: what lstrip/rstrip of special tokens eat

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


class Vocab(TokenTable):
    """A GGUF vocabulary with llama.cpp's tokenizer: ``tokenize``/``detokenize``/``token_to_piece``/``is_eog``.

    Build it with :meth:`from_metadata` (or :meth:`from_file`). Token ids are plain ints;
    ``bos``/``eos`` are None when the vocabulary has none.
    """

    label: str
    model: str
    pre: str | None
    bos: int | None
    eos: int | None
    eot: int | None
    eom: int | None
    unk: int | None
    sep: int | None
    pad: int | None
    add_bos: bool
    add_eos: bool
    add_sep: bool
    add_space_prefix: bool
    clean_spaces: bool

    # -- construction -------------------------------------------------------------------------

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> Vocab:
        """Read a GGUF's header and build its vocabulary."""
        from graphir.files.gguf_file import read_header

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

    def _load(self, label: str, mapping: Mapping[str, object]) -> None:
        md = Metadata(label, mapping)
        self.label = label
        name = md.raw(_TK.MODEL)
        if name is None:
            raise md.err(f"metadata key {_TK.MODEL!r} is missing: the file has no tokenizer")
        if not isinstance(name, str):
            raise md.err(f"metadata key {_TK.MODEL!r} is not a string ({name!r})")
        pre = md.get(_TK.PRE, str)
        model_class = MODELS.get(name)
        if model_class is None:
            supported = ", ".join(sorted(MODELS))
            if name in _NO_VOCAB_MODELS:
                raise md.err(f"tokenizer model {name!r} ({_TK.MODEL}) is not supported: the file has no vocabulary "
                             f"(llama.cpp loads it without one); supported: {supported}")
            raise md.err(f"unknown tokenizer model {name!r} ({_TK.MODEL}); supported: {supported}")
        self.model = name
        self._model = model = model_class(md, pre)
        self.pre, self.add_space_prefix, self.clean_spaces = model.pre, model.add_space_prefix, model.clean_spaces

        self._read_tokens(md)
        model.load(md, self)
        n = self.n_vocab

        # special token ids: defaults out of range are dropped; metadata ids out of range are ignored
        special: dict[str, int | None] = {slot: None for _, slot in _SPECIAL_KEYS}
        special.update(model.special_ids)
        for key, slot in _SPECIAL_KEYS:
            if special[slot] is not None and special[slot] >= n:  # type: ignore[operator]
                special[slot] = None
            value = md.get(key, int)
            if value is not None and 0 <= value < n:
                special[slot] = value
        self.add_bos = md.get(_TK.ADD_BOS, bool, model.add_bos) or model.always_bos
        self.add_eos = md.get(_TK.ADD_EOS, bool, model.add_eos)
        self.add_sep = md.get(_TK.ADD_SEP, bool, model.add_sep)
        model.finish(self, special, self.add_bos, self.add_eos)

        self._detect_specials(special)
        self.bos, self.eos, self.eot, self.eom = special["bos"], special["eos"], special["eot"], special["eom"]
        self.unk, self.sep, self.pad = special["unk"], special["sep"], special["pad"]
        self.special_ids = dict(special)

        # cut out longest first (ties: lower id first)
        ids = [i for i, a in enumerate(self.attrs) if a & (ATTR_CONTROL | ATTR_USER_DEFINED | ATTR_UNKNOWN)]
        self._special_cache = sorted(ids, key=lambda i: -len(utf8(self.tokens[i])))
        self._apply_name_rules(md)

        self._pieces: list[bytes | None] = [None] * n

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

    def _apply_name_rules(self, md: Metadata) -> None:
        """Per-model lstrip/rstrip of special tokens, keyed on names as llama.cpp does."""
        name = str(md.raw(gguf.Keys.General.NAME) or "").lower()
        pre = str(md.raw(_TK.PRE) or "")
        arch = str(md.raw(gguf.Keys.General.ARCHITECTURE) or "")

        def set_attr(text: str, bit: int, on: bool) -> None:
            i = self.token_to_id.get(text)
            if i is None:
                raise md.err(f"token {text!r} is missing from the vocabulary")
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
        add_special = add_special and self._model.adds_specials
        wrap = add_special and self._model.always_wraps
        if add_special and (self.add_bos or wrap):
            out.append(self.bos)  # type: ignore[arg-type]
        self._model.tokenize(text, frags, out)
        if wrap:
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
        return self._model.render(self.attrs[id], self.tokens[id])

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
