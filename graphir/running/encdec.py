"""An encoder-decoder context: an encoder context and a decoder context, composed.

The encoder context runs the model's encoder stack (no cache, bidirectional, the whole batch in one
ubatch: ``Context(kind="encoder")``, which is also what an encoder-only user gets). The decoder context runs
the decoder stack with a ``cross`` memory: its KV cache plus the encoder output of each sequence
(:mod:`graphir.memory.cross`). :meth:`EncoderDecoderContext.encode` runs the first and hands its output to
the second's memory, for the batch's sequences; :meth:`decode` runs the second. Nothing else connects them,
so another encoder (audio, vision) plugs in the same way: a context whose output rows, with their sequence
ids, are stored into the decoder's memory.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from graphir.errors import GraphirError
from graphir.memory import Memory
from graphir.memory.cross import CrossMemory
from graphir.batch import Batch
from graphir.running.context import Busy, Context, ModelView


class EncoderDecoderContext:
    """Create with ``model.new_context()`` (the default for encoder-decoder models). ``encode(batch)``, then
    ``decode(batch)`` per sequence; outputs, memory and saved state are the decoder's (whose memory holds
    the encoder output, so a saved state resumes without encoding again)."""

    kind = "encoder-decoder"

    def __init__(self, model: ModelView, n_ctx: int | None = None, n_batch: int = 512, n_ubatch: int = 512,
                 n_seq_max: int = 1, embeddings: bool = False, type_k: str = "f16", type_v: str = "f16",
                 unified: bool = True, pooling: str | None = None, swa_full: bool = False):
        """Sizes as :class:`~graphir.running.context.Context`; both halves get them (the encoder attends within
        one ubatch, so a source may have up to min(n_ctx, n_ubatch) tokens)."""
        sizes = dict(n_ctx=n_ctx, n_batch=n_batch, n_ubatch=n_ubatch, n_seq_max=n_seq_max)
        self.model = model
        self.encoder = Context(model, kind="encoder", embeddings=True, pooling="none", **sizes)  # type: ignore[arg-type]
        self.decoder = Context(model, kind="cross", embeddings=embeddings, type_k=type_k, type_v=type_v,
                               unified=unified, pooling=pooling, swa_full=swa_full, **sizes)  # type: ignore[arg-type]
        self.n_ctx, self.n_batch, self.n_seq_max = self.decoder.n_ctx, self.decoder.n_batch, n_seq_max
        self.name = f"{self.kind} context of {self.encoder.name} and {self.decoder.name}"
        self._busy = Busy(self.name)  # an encode stores into the decoder's memory: not during a decode

    def __repr__(self) -> str:
        return self.name

    def encode(self, batch: Batch) -> None:
        """Run the encoder over ``batch`` (every token is an output) and keep its output as the encoder output
        of the batch's sequences, replacing theirs; other sequences keep their own. A failed encode changes
        nothing."""
        full = Batch(batch.tokens, batch.pos, batch.seq_ids, np.ones(len(batch), bool))
        with self._busy("encode"):
            self.encoder.decode(full)
            self._cross.encoder_output.store(self.encoder.embeddings(), full.seq_ids)

    def decode(self, batch: Batch, taps: dict[str, np.ndarray] | None = None) -> None:
        """Run the decoder; every sequence in ``batch`` must have encoder output (else BatchError, nothing
        changed)."""
        with self._busy("decode"):
            self.decoder.decode(batch, taps)

    def prompt(self, ids: list[int]) -> int:
        """Encode a prompt as sequence 0 and decode the decoder start token (the model's, else BOS, as
        llama.cpp's examples do); the position the next token takes."""
        start = self.model.arch.decoder_start()
        if start is None:
            start = self.model.vocab.bos  # type: ignore[attr-defined]
        if start is None:
            raise GraphirError(f"a '{self.model.arch.name}' model without decoder_start_token_id needs a BOS token "
                               f"to start decoding, and its vocabulary has none")
        self.encode(Batch.from_tokens(ids, 0))
        self.decode(Batch.one(start, 0))
        return 1

    @property
    def _cross(self) -> CrossMemory:
        return self.decoder.memory  # type: ignore[return-value]

    # ---- the decoder's memory, outputs and state -------------------------------------------------------

    @property
    def memory(self) -> Memory:
        """The decoder's memory: its KV cache and the encoder output of each sequence."""
        return self.decoder.memory

    def get_memory(self) -> Memory:
        return self.decoder.get_memory()

    def set_memory(self, mem: Memory) -> None:
        with self._busy("set_memory"):
            self.decoder.set_memory(mem)

    @property
    def has_logits(self) -> bool:
        return self.decoder.has_logits

    @property
    def program(self) -> Any:
        """The decoder's compiled graph."""
        return self.decoder.program

    def logits(self) -> np.ndarray:
        return self.decoder.logits()

    def logits_ith(self, i: int) -> np.ndarray:
        return self.decoder.logits_ith(i)

    def embeddings(self) -> np.ndarray:
        """The decoder's final normed hidden states (create the context with embeddings=True)."""
        return self.decoder.embeddings()

    def encoder_embeddings(self) -> np.ndarray:
        """(n_tokens, n_embd): the last encode's output, in batch order."""
        return self.encoder.embeddings()

    def state_save(self, path: str | os.PathLike[str] | None = None) -> bytes:
        with self._busy("state_save"):
            return self.decoder.state_save(path)

    def state_load(self, data: bytes | str | os.PathLike[str]) -> None:
        with self._busy("state_load"):
            self.decoder.state_load(data)

    def state_seq_save(self, seq: int) -> bytes:
        with self._busy("state_seq_save"):
            return self.decoder.state_seq_save(seq)

    def state_seq_load(self, data: bytes | str | os.PathLike[str], dst_seq: int) -> None:
        with self._busy("state_seq_load"):
            self.decoder.state_seq_load(data, dst_seq)
