"""A vocabulary's GGUF keys, read with their types checked and errors that name the file.

The vocabulary and each tokenizer model read their own keys (the token list, merges, the pre-tokenizer,
normalizer options) through this one reader, so a malformed key is reported the same way wherever it is read.
"""

from __future__ import annotations

from collections.abc import Mapping

from graphir.errors import MetadataError

# BertNormalizer options (gguf-py's Keys.Tokenizer.NORMALIZER_*, which older gguf lacks): WordPiece reads both,
# the whitespace model the first
KEY_LOWERCASE = "tokenizer.ggml.normalizer.lowercase"
KEY_STRIP_ACCENTS = "tokenizer.ggml.normalizer.strip_accents"


class Metadata:
    """GGUF metadata (``read_header(path).metadata``) read for one vocabulary; ``label`` names the file in errors."""

    __slots__ = ("label", "_md")

    def __init__(self, label: str, md: Mapping[str, object]) -> None:
        self.label = label
        self._md = md

    def err(self, msg: str) -> MetadataError:
        return MetadataError(f"{self.label}: {msg}")

    def raw(self, key: str) -> object:
        """The value as stored, None when absent."""
        return self._md.get(key)

    def get(self, key: str, kind: type | tuple[type, ...], default: object = None):
        """The value, which must be of ``kind`` (bool also takes an int, int takes no bool); ``default`` when absent."""
        if key not in self._md:
            return default
        value = self._md[key]
        if kind is bool:
            if isinstance(value, (bool, int)):
                return bool(value)
        elif kind is int:
            if isinstance(value, int) and not isinstance(value, bool):
                return value
        elif isinstance(value, kind):
            return value
        raise self.err(f"metadata key {key!r} has the wrong type ({type(value).__name__})")

    def array(self, key: str, convert: type, required: bool = False) -> list | None:
        """A metadata array converted element-wise (str arrays must already hold str)."""
        value = self._md.get(key)
        if value is None:
            if required:
                raise self.err(f"metadata key {key!r} is missing")
            return None
        try:
            if isinstance(value, (str, bytes)):
                raise TypeError
            if convert is str:
                if not set(map(type, value)) <= {str}:  # type: ignore[call-overload]
                    raise TypeError
                return list(value)  # type: ignore[call-overload]
            return list(map(convert, value))  # type: ignore[call-overload]
        except (TypeError, ValueError):
            raise self.err(f"metadata key {key!r} is not an array of {convert.__name__}") from None
