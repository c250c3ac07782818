"""llama.cpp's tokenizer for one GGUF, loaded vocab-only: the oracle of the tokenizer tests."""

from __future__ import annotations

import ctypes
import os
from pathlib import Path
from typing import Any

os.environ.setdefault("GGML_NO_BACKTRACE", "1")  # before llama_cpp loads libllama

import llama_cpp  # noqa: E402  (only imported by oracle tests, which skip without it)


class Oracle:
    def __init__(self, path: Path, overrides: dict[str, str | bool] | None = None) -> None:
        """``overrides``: metadata values llama.cpp reads instead of the file's, or where it has none (kv_overrides)."""
        self.llm = llama_cpp.Llama(str(path), vocab_only=True, verbose=False, kv_overrides=overrides)
        self.vocab = self.llm._model.vocab

    def tokenize(self, text: str, add_special: bool, parse_special: bool) -> list[int]:
        return self.llm.tokenize(text.encode("utf-8"), add_bos=add_special, special=parse_special)

    def detokenize(self, ids: list[int], remove_special: bool = False, unparse_special: bool = False) -> bytes:
        arr = (llama_cpp.llama_token * max(1, len(ids)))(*ids)
        cap = 64 + 64 * len(ids)
        buf = ctypes.create_string_buffer(cap)
        n = llama_cpp.llama_detokenize(self.vocab, arr, len(ids), buf, cap, remove_special, unparse_special)
        assert n >= 0
        return buf.raw[:n]

    def piece(self, id: int, special: bool) -> bytes:
        buf = ctypes.create_string_buffer(256)
        n = llama_cpp.llama_token_to_piece(self.vocab, id, buf, 256, 0, special)
        assert n >= 0
        return buf.raw[:n]

    def is_eog(self, id: int) -> bool:
        return bool(llama_cpp.llama_vocab_is_eog(self.vocab, id))

    def facts(self, sep: bool = False) -> tuple[int | None | bool, ...]:
        """(bos, eos[, sep], add_bos, add_eos) as llama.cpp sees them; -1 ids become None."""
        v = self.vocab
        ids = (llama_cpp.llama_vocab_bos(v), llama_cpp.llama_vocab_eos(v)) + ((llama_cpp.llama_vocab_sep(v),) if sep else ())
        flags = (bool(llama_cpp.llama_vocab_get_add_bos(v)), bool(llama_cpp.llama_vocab_get_add_eos(v)))
        return (*(None if i < 0 else i for i in ids), *flags)

    def add_sep(self) -> bool:
        return bool(llama_cpp.llama_vocab_get_add_sep(self.vocab))

    def close(self) -> None:
        self.llm.close()


def assert_same_text_handling(mine: Any, o: Oracle, texts: list[str]) -> None:
    """Every text tokenizes as llama.cpp does (specials added or not, parsed or not), and llama.cpp's ids
    detokenize to the same bytes under every flag combination."""
    for text in texts:
        for add_special in (False, True):
            for parse_special in (False, True):
                assert mine.tokenize(text, add_special, parse_special) == o.tokenize(
                    text, add_special, parse_special
                ), (text, add_special, parse_special)
        assert_same_detokenize(mine, o, [o.tokenize(text, True, True)])


def assert_same_detokenize(mine: Any, o: Oracle, cases: list[list[int]]) -> None:
    """Each id list detokenizes to llama.cpp's bytes, with and without specials removed or unparsed."""
    for ids in cases:
        for remove_special in (False, True):
            for unparse_special in (False, True):
                assert mine.detokenize_bytes(ids, remove_special, unparse_special) == o.detokenize(
                    ids, remove_special, unparse_special
                ), (ids, remove_special, unparse_special)


def assert_same_pieces(mine: Any, o: Oracle) -> None:
    """Every token's piece (special or not) and the end-of-generation set equal llama.cpp's."""
    for i in range(mine.n_vocab):
        assert mine.token_to_piece(i, special=True) == o.piece(i, True), i
        assert mine.token_to_piece(i, special=False) == o.piece(i, False), i
    assert {i for i in range(mine.n_vocab) if o.is_eog(i)} == mine.eog_ids
