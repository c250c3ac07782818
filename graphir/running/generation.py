"""Generation over one context as llama.cpp's command-line tools run it: text fed in batches of at most n_batch
tokens, tokens sampled one at a time, and a context that is full either shifted or stopped.

The shift is llama.cpp's: the first ``n_keep`` tokens stay, half of the others are forgotten (the oldest), and
the rest slide back into their positions (``seq_rm`` then ``seq_add``; the memory re-ropes its K rows before
the next decode). A memory that cannot move positions (a sliding-window cache that dropped rows, M-RoPE keys)
or cannot forget part of a sequence (recurrent state) cannot shift: there the generation stops and says why
(:attr:`Generation.full`), as it does when the shift is off.
"""

from __future__ import annotations

import codecs
import time
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from graphir.batch import Batch
from graphir.errors import GraphirError


class ContextFull(GraphirError):
    """Text that the context cannot take: more tokens than its cells, or no shift possible."""


class Generation:
    """Sequence 0 of ``ctx``: what it holds, and the text it goes on with. ``shift``: whether a full context is
    shifted (where the memory can) or ends the generation."""

    def __init__(self, model: Any, ctx: Any, pick: Callable[[np.ndarray, list[int]], int], n_keep: int = 0,
                 shift: bool = True):
        self.model, self.ctx, self.pick = model, ctx, pick
        self.n_keep = n_keep
        self.shift = shift
        self.tokens: list[int] = []   # what the memory holds, by position
        self.pending: list[int] = []  # sampled, shown, not yet decoded: the next feed starts with them
        self.history: list[int] = []  # every token seen, for the repetition penalty
        self.full: str | None = None  # why the last reply stopped short: the context was full
        self.media: Any = None  # a tower beside the context (a MultimodalContext), for prompts with pictures
        self.shifts = 0

    @property
    def encoder_decoder(self) -> bool:
        return hasattr(self.ctx, "encode")

    def feed(self, ids: list[int], progress: Callable[[int], None] | None = None) -> None:
        """Decode the pending tokens and ``ids`` after what the context holds, n_batch tokens at a time,
        shifting when they do not fit; ``progress(n)``: n more tokens decoded."""
        if self.encoder_decoder and ids:  # the source goes to the encoder, the decoder starts on it: one feed
            if self.tokens:
                raise GraphirError("an encoder-decoder's generation takes one text: its source")
            self.tokens = [0] * self.ctx.prompt(ids)
            self.history += ids
            return
        todo = self.pending + ids
        if len(todo) + min(self.n_keep, len(self.tokens)) > self.ctx.n_ctx:
            raise ContextFull(f"the text has {len(todo)} tokens, more than the context's {self.ctx.n_ctx} cells "
                              f"can take (-c/--ctx-size)")
        for i in range(0, len(todo), self.ctx.n_batch):
            chunk = todo[i:i + self.ctx.n_batch]
            self._room(len(chunk))
            self.ctx.decode(Batch.from_tokens(chunk, len(self.tokens)))
            self.tokens += chunk
            if progress is not None:
                progress(len(chunk))
        self.pending = []
        self.history += ids

    def feed_chunks(self, media: Any, chunks: Sequence[Any]) -> None:
        """Decode a multimodal prompt (graphir.running.multimodal: text tokens and images' rows) after what the
        context holds; an image's rows take positions as tokens do, hold no token (-1 here) and are not history."""
        self.feed([])  # the last token sampled, if it is not decoded yet
        held = [t for c in chunks for t in (c.tokens if c.rows is None else (-1,) * len(c))]
        if len(self.tokens) + len(held) > self.ctx.n_ctx:
            raise ContextFull(f"the prompt takes {len(held)} positions with its images; the context has "
                              f"{self.ctx.n_ctx - len(self.tokens)} cells left (-c/--ctx-size)")
        media.eval(chunks, n_past=len(self.tokens))
        self.tokens += held
        self.history += [t for t in held if t >= 0]

    def _room(self, n: int) -> None:
        """Make room for ``n`` tokens: shift as llama.cpp does, or raise ContextFull."""
        mem = self.ctx.memory
        while len(self.tokens) + n > self.ctx.n_ctx:
            keep = min(self.n_keep, len(self.tokens))
            discard = (len(self.tokens) - keep) // 2
            full = f"the context is full ({self.ctx.n_ctx} cells)"
            if not mem.can_shift():
                raise ContextFull(f"{full} and a {mem.kind} memory cannot shift its positions")
            if not self.shift:
                raise ContextFull(f"{full} and the context shift is off (--no-context-shift)")
            if discard == 0:
                raise ContextFull(f"{full} with the {keep} tokens a shift keeps (--keep)")
            if not mem.seq_rm(0, keep, keep + discard):  # nothing changed
                raise ContextFull(f"{full} and a {mem.kind} memory cannot forget part of a sequence")
            mem.seq_add(0, keep + discard, -1, -discard)
            del self.tokens[keep:keep + discard]
            self.shifts += 1

    def reply(self, max_tokens: int | None, stats: dict[str, Any] | None = None) -> Iterator[str]:
        """Stream the text of up to ``max_tokens`` sampled tokens (None: until an end-of-generation token, or a
        full context that cannot shift). ``stats`` receives gen_tokens, gen_s and finish_reason ("stop": an
        end-of-generation token; "length": max_tokens or a full context, as llama-cpp-python says)."""
        vocab = self.model.vocab
        text_of = codecs.getincrementaldecoder("utf-8")(errors="replace")  # a character split across tokens
        t0, n, finish = time.perf_counter(), 0, "length"
        self.full = None
        try:
            while max_tokens is None or n < max_tokens:
                if self.pending:  # the last token sampled, decoded only when another is wanted
                    try:
                        self.feed([])
                    except ContextFull as e:
                        self.full = str(e)
                        break
                tok = self.pick(self.ctx.logits_ith(-1), self.history)
                if vocab.is_eog(tok):
                    finish = "stop"
                    break
                n += 1
                self.pending = [tok]
                self.history.append(tok)
                text = text_of.decode(vocab.token_to_piece(tok))
                if text:
                    yield text
            rest = text_of.decode(b"", final=True)  # bytes the last token left incomplete
            if rest:
                yield rest
        finally:
            if stats is not None:
                stats.update(gen_tokens=n, gen_s=time.perf_counter() - t0, finish_reason=finish)
