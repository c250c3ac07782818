"""Continuous batching, as llama-server's loop runs it: each request is a sequence of one context (a *slot*), and
every step decodes one batch holding the next token of every request that is generating and the pending prompt
tokens of the new ones, as many as the batch has room for. Requests join and leave between steps without
waiting for each other; one that finishes, is cancelled or whose client went away frees its sequence at once.

A new request whose prompt begins with what a running request's sequence holds starts from a copy of it
(``seq_cp``) and decodes only the rest; where the memory cannot drop part of a sequence (recurrent state) it
starts afresh. The loop runs on a thread of its own; requests and their events cross over through
:meth:`Scheduler.submit` and each job's ``on_event``.
"""

from __future__ import annotations

import codecs
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Union

import numpy as np

from graphir.batch import Batch
from graphir.errors import GraphirError
from graphir.running.sampling import Sampling
from graphir.serving.stops import StopScan

log = logging.getLogger("graphir.serve")


@dataclass(frozen=True)
class TokenLogprob:
    token: int
    piece: bytes
    logprob: float
    top: tuple[tuple[int, bytes, float], ...]  # the most likely tokens at this step, best first


@dataclass(frozen=True)
class Piece:
    """Text the reply goes on with (possibly empty while a stop string may be forming) and, when asked for, the
    log-probabilities of the tokens it came from."""
    text: str
    logprobs: tuple[TokenLogprob, ...] = ()


@dataclass(frozen=True)
class Done:
    finish_reason: str  # "stop": an end-of-generation token or a stop string; "length": max_tokens or a full context
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int  # prompt tokens taken from another sequence instead of decoded


@dataclass(frozen=True)
class Embedding:
    vector: np.ndarray
    prompt_tokens: int


@dataclass(frozen=True)
class Failed:
    message: str


Event = Union[Piece, Done, Embedding, Failed]


@dataclass(eq=False)
class Job:
    """One request: its prompt tokens and what to do with them. ``on_event`` is called on the scheduler's thread."""
    ids: list[int]
    on_event: Callable[[Event], None]
    sampling: Sampling = field(default_factory=lambda: Sampling(temperature=0.0))
    max_tokens: int | None = None  # None: until the end of the text or of the sequence's context
    stop: tuple[str, ...] = ()
    logprobs: int | None = None    # None: none; k: each token's log-probability and the k most likely
    embed: bool = False            # a pooled embedding of the prompt instead of a continuation
    ignore_eos: bool = False       # llama-server's: end-of-generation tokens are never sampled
    cancelled: bool = False


class QueueFull(GraphirError):
    """More requests waiting than the queue holds."""


class Slot:
    """A sequence of the context and the request it serves."""

    def __init__(self, seq: int):
        self.seq = seq
        self.job: Job | None = None
        self.held: list[int] = []     # tokens the sequence holds, by position
        self.todo: list[int] = []     # prompt tokens still to decode
        self.pending: int | None = None  # sampled and sent, decoded by the next step
        self.generated = 0
        self.cached = 0

    def start(self, job: Job, held: list[int]) -> None:
        self.job, self.held, self.todo, self.pending = job, held, job.ids[len(held):], None
        self.generated, self.cached = 0, len(held)
        self.pick = job.sampling.sampler()
        self.history = list(job.ids)
        self.text = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.scan = StopScan(job.stop)


def common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    differ = np.flatnonzero(np.asarray(a[:n]) != np.asarray(b[:n]))
    return int(differ[0]) if len(differ) else n


class Scheduler:
    """The slots of ``ctx`` (one per sequence, ``ctx.n_seq_max``) and the queue of requests waiting for one."""

    def __init__(self, model: Any, ctx: Any, n_ctx_seq: int, queue_size: int):
        if ctx.n_batch < ctx.n_seq_max:
            raise GraphirError(f"a batch of {ctx.n_batch} tokens cannot hold the next token of each of "
                               f"{ctx.n_seq_max} requests: -b/--batch-size must be at least --parallel")
        self.model, self.ctx, self.n_ctx_seq, self.queue_size = model, ctx, n_ctx_seq, queue_size
        self.slots = [Slot(s) for s in range(ctx.n_seq_max)]
        self.waiting: deque[Job] = deque()
        self.wake = threading.Condition()
        self.stopping = False
        self.thread: threading.Thread | None = None
        self.counters = dict(requests=0, prompt_tokens=0, cached_tokens=0, generated_tokens=0, steps=0,
                             failed_steps=0, decode_s=0.0)

    # ---- the other threads' side ----------------------------------------------------------------------

    def submit(self, job: Job) -> None:
        with self.wake:
            if len(self.waiting) >= self.queue_size:
                raise QueueFull(f"{len(self.waiting)} requests are waiting already (the queue holds "
                                f"{self.queue_size}: --queue-size)")
            self.waiting.append(job)
            self.counters["requests"] += 1
            self.wake.notify()

    def cancel(self, job: Job) -> None:
        """Stop a job (its client went away): its sequence is freed before the next step."""
        with self.wake:
            job.cancelled = True
            self.wake.notify()

    def start(self, warm_up: Callable[[], None] | None = None) -> threading.Event:
        """Run the loop on a thread of its own, ``warm_up`` first; the event is set once the loop is ready. The
        kernels are first run on that thread too: with OpenMP, each thread that starts parallel kernels keeps a
        pool of its own, and an idle pool left by another thread takes the cores from it (a third of the
        speed, measured on SmolLM2)."""
        ready = threading.Event()

        def main() -> None:
            try:
                if warm_up is not None:
                    warm_up()
            finally:
                ready.set()
            self.run()

        self.thread = threading.Thread(target=main, name="graphir-slots", daemon=True)
        self.thread.start()
        return ready

    def stop(self) -> None:
        with self.wake:
            self.stopping = True
            self.wake.notify()
        if self.thread is not None:
            self.thread.join()

    def busy(self) -> int:
        return sum(s.job is not None for s in self.slots)

    def cells_used(self) -> int:
        return sum(len(s.held) for s in self.slots)

    # ---- the loop -------------------------------------------------------------------------------------

    def run(self) -> None:
        while True:
            with self.wake:
                while not self.stopping and not self.waiting and not any(s.job for s in self.slots):
                    self.wake.wait()
                if self.stopping:
                    break
                self._drop_cancelled()
                admitted = self._admit()
            try:
                for slot in admitted:
                    if slot.job is not None and slot.job.embed:
                        self._embed(slot)
                if any(s.job for s in self.slots):
                    self.step()
            except Exception as e:  # a fault of the server's own: its requests end with it, the loop goes on
                log.exception("the scheduler failed")
                for s in self.slots:
                    if s.job is not None:
                        self._end(s, Failed(f"internal error: {type(e).__name__}: {e}"))
        for s in self.slots:
            if s.job is not None:
                self._end(s, Failed("the server is shutting down"))
        for job in self.waiting:
            job.on_event(Failed("the server is shutting down"))

    def _drop_cancelled(self) -> None:
        for s in self.slots:
            if s.job is not None and s.job.cancelled:
                self._free(s)
        self.waiting = deque(j for j in self.waiting if not j.cancelled)

    def _admit(self) -> list[Slot]:
        """Give waiting jobs the free slots, each starting from the longest prefix another sequence holds."""
        admitted = []
        for slot in self.slots:
            if slot.job is None and self.waiting:
                job = self.waiting.popleft()
                slot.start(job, [] if job.embed else self._reuse(slot, job.ids))
                admitted.append(slot)
        return admitted

    def _reuse(self, slot: Slot, ids: list[int]) -> list[int]:
        """Copy into the slot's sequence the one that shares the longest prefix with ``ids`` and cut it there
        (at least the last prompt token is decoded again: its logits start the reply)."""
        best, source = 0, None
        for other in self.slots:
            n = common_prefix(other.held, ids) if other is not slot and other.job is not None else 0
            if n > best:
                best, source = n, other
        best = min(best, len(ids) - 1)
        if source is None or best <= 0:
            return []
        mem = self.ctx.memory
        mem.seq_cp(source.seq, slot.seq, -1, -1)
        if not mem.seq_rm(slot.seq, best, -1):  # the memory keeps no positions to cut at: start afresh
            mem.seq_rm(slot.seq, -1, -1)
            return []
        return ids[:best]

    def step(self) -> None:
        """Decode the next token of every generating slot in one batch, then pending prompt tokens, each slot's
        in a batch of its own, up to n_batch of them. A prompt is never cut into a batch of other sequences'
        tokens: there llama.cpp's equal split would put its first tokens in a ubatch of their own, and so it
        gives each request the bits it gives alone (with the per-sequence streams the context has)."""
        going = []
        for s in self.slots:
            if s.job is not None and s.pending is not None:
                if len(s.held) >= self.n_ctx_seq:  # the sequence's share of the context is full
                    self._finish(s, "length")
                else:
                    going.append(s)
        if going:
            self._decode([(s, [s.pending]) for s in going if s.pending is not None])
        room = self.ctx.n_batch
        for s in self.slots:
            if s.job is not None and s.todo and room > 0:
                chunk = s.todo[:room]
                room -= len(chunk)
                self._decode([(s, chunk)])

    def _decode(self, parts: list[tuple[Slot, list[int]]]) -> None:
        """One batch of each slot's tokens after what its sequence holds; a slot whose tokens end its prompt or
        are its generated token gets logits, and its next token is sampled."""
        tokens = [t for _, ts in parts for t in ts]
        pos = [len(s.held) + k for s, ts in parts for k in range(len(ts))]
        seqs = [(s.seq,) for s, ts in parts for _ in ts]
        wanted = [k == len(ts) - 1 and (s.pending is not None or len(ts) == len(s.todo)) for s, ts in parts
                  for k in range(len(ts))]
        t0 = time.perf_counter()
        try:
            self.ctx.decode(Batch(np.asarray(tokens), np.asarray(pos), seqs, np.asarray(wanted)))
        except Exception as e:  # the memory is as it was: the jobs of this batch end with the error
            self.counters["failed_steps"] += 1
            for s, _ in parts:
                self._end(s, Failed(f"decoding failed: {e}"))
            return
        self.counters["steps"] += 1
        self.counters["decode_s"] += time.perf_counter() - t0
        outputs = []
        for s, ts in parts:
            s.held += ts
            if s.pending is not None:
                s.pending = None
                outputs.append(s)
            else:
                s.todo = s.todo[len(ts):]
                self.counters["prompt_tokens"] += len(ts)
                if not s.todo:
                    outputs.append(s)
        logits = self.ctx.logits()
        for row, s in enumerate(outputs):
            self._next(s, logits[row])

    def _next(self, s: Slot, logits: np.ndarray) -> None:
        """Sample the slot's next token and send what it adds to the text."""
        job = s.job
        assert job is not None
        if job.ignore_eos:
            logits = logits.copy()
            logits[list(self.model.vocab.eog_ids)] = -np.inf
        tok = s.pick(logits, s.history)
        vocab = self.model.vocab
        if vocab.is_eog(tok):
            self._finish(s, "stop")
            return
        s.generated += 1
        self.counters["generated_tokens"] += 1
        s.history.append(tok)
        piece = vocab.token_to_piece(tok)
        shown, stopped = s.scan.add(s.text.decode(piece))
        job.on_event(Piece(shown, (self._logprob(tok, piece, logits, job.logprobs),) if job.logprobs is not None
                           else ()))
        if stopped:
            self._finish(s, "stop", at_stop_string=True)
        elif job.max_tokens is not None and s.generated >= job.max_tokens:
            self._finish(s, "length")
        else:
            s.pending = tok

    def _logprob(self, tok: int, piece: bytes, logits: np.ndarray, k: int) -> TokenLogprob:
        z = logits.astype(np.float64)
        lse = z.max() + np.log(np.exp(z - z.max()).sum())
        top = np.argsort(-z, kind="stable")[:k]
        piece_of = self.model.vocab.token_to_piece
        return TokenLogprob(tok, piece, float(z[tok] - lse), tuple((int(t), piece_of(int(t)), float(z[t] - lse))
                                                                    for t in top))

    def _embed(self, s: Slot) -> None:
        """A pooled embedding of the job's prompt: one decode of the whole prompt in the slot's sequence."""
        job = s.job
        assert job is not None
        try:
            self.ctx.decode(Batch(np.asarray(job.ids), np.arange(len(job.ids)), [(s.seq,)] * len(job.ids),
                                  np.ones(len(job.ids), bool)))
            vector = self.ctx.embeddings_seq(s.seq).copy()
        except Exception as e:
            self._end(s, Failed(f"decoding failed: {e}"))
            return
        self.counters["prompt_tokens"] += len(job.ids)
        self._end(s, Embedding(vector, len(job.ids)))

    def _finish(self, s: Slot, reason: str, at_stop_string: bool = False) -> None:
        """End the reply: the text held back (an unfinished character, a possible stop string's start) is sent
        unless a stop string ended it."""
        job = s.job
        assert job is not None
        if not at_stop_string:
            shown, stopped = s.scan.add(s.text.decode(b"", final=True))
            rest = shown if stopped else shown + s.scan.flush()
            if rest:
                job.on_event(Piece(rest))
        self.counters["cached_tokens"] += s.cached
        self._end(s, Done(reason, len(job.ids), s.generated, s.cached))

    def _end(self, s: Slot, event: Event) -> None:
        job = s.job
        self._free(s)
        if job is not None:
            job.on_event(event)

    def _free(self, s: Slot) -> None:
        if self.ctx.memory.keeps_cells:  # an encoder's memory keeps nothing between decodes
            self.ctx.memory.seq_rm(s.seq, -1, -1)
        s.job, s.held, s.todo, s.pending = None, [], [], None
