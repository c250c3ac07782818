"""The OpenAI-compatible endpoints over a :class:`~graphir.serving.slots.Scheduler`, as a Starlette application:
``/v1/chat/completions``, ``/v1/completions``, ``/v1/embeddings``, ``/v1/models``, ``/health`` and ``/metrics``.

A request is checked whole (:mod:`graphir.serving.requests`) and tokenized before it joins the queue, so a bad
one is a 4xx that changes nothing; its events come back from the scheduler's thread through a queue of the
request's own. A streamed reply is server-sent events as OpenAI sends them; a client that goes away, streaming
or not, has its sequence freed before the next step.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable

import numpy as np
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from graphir.errors import GraphirError
from graphir.serving import requests as rq
from graphir.serving.metrics import prometheus
from graphir.serving.requests import RequestError
from graphir.serving.slots import Done, Embedding, Event, Failed, Job, Piece, QueueFull, Scheduler, TokenLogprob


@dataclass
class Service:
    """What the endpoints serve: the model, its slots, the name clients call it by, its chat template (None: the
    model has none), and the request counts /metrics reports."""
    model: Any
    scheduler: Scheduler
    name: str
    template: Any
    embedding: bool        # an embedding model: /v1/embeddings only
    max_embed_tokens: int  # the longest input one pooled decode takes (a ubatch)
    started: float = field(default_factory=time.time)
    responses: Counter[tuple[str, int]] = field(default_factory=Counter)

    @property
    def n_ctx_seq(self) -> int:
        return self.scheduler.n_ctx_seq


class ClientGone(Exception):
    """The client closed the connection before its reply was complete."""


class Replies:
    """The events of a request's jobs, carried from the scheduler's thread to the request's task."""

    def __init__(self, scheduler: Scheduler):
        self.scheduler = scheduler
        self.loop = asyncio.get_running_loop()
        self.queue: asyncio.Queue[tuple[int, Event]] = asyncio.Queue()
        self.jobs: list[Job] = []
        self.open = 0

    def submit(self, makers: list[Callable[[Callable[[Event], None]], Job]]) -> None:
        """Queue one job per maker (each given where its events go); a full queue cancels them all: 503."""
        for i, make in enumerate(makers):
            job = make(self._sink(i))
            try:
                self.scheduler.submit(job)
            except QueueFull as e:
                self.cancel()
                raise RequestError(f"the server is busy: {e}", status=503, kind="unavailable_error") from None
            self.jobs.append(job)
            self.open += 1

    def _sink(self, i: int) -> Callable[[Event], None]:
        def put(event: Event) -> None:
            try:
                self.loop.call_soon_threadsafe(self.queue.put_nowait, (i, event))
            except RuntimeError:  # the event loop has closed: the server is stopping
                pass
        return put

    async def events(self, request: Request | None) -> AsyncIterator[tuple[int, Event]]:
        """Each job's events until all are done; ``request``: watch it for a client that goes away (a stream's
        client is watched by Starlette, which cancels the stream)."""
        try:
            while self.open:
                try:
                    i, event = await asyncio.wait_for(self.queue.get(), 0.5)
                except asyncio.TimeoutError:
                    if request is not None and await request.is_disconnected():
                        raise ClientGone() from None
                    continue
                if isinstance(event, Failed):
                    raise RequestError(event.message, status=500, kind="server_error")
                if isinstance(event, (Done, Embedding)):
                    self.open -= 1
                yield i, event
        finally:
            if self.open:
                self.cancel()

    def cancel(self) -> None:
        for job in self.jobs:
            self.scheduler.cancel(job)


# ---- responses -------------------------------------------------------------------------------------------

def _error(e: RequestError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status)


def _usage(done: list[Done]) -> dict[str, Any]:
    prompt, completion = sum(d.prompt_tokens for d in done), sum(d.completion_tokens for d in done)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": sum(d.cached_tokens for d in done)}}


def _text(piece: bytes) -> str:
    return piece.decode("utf-8", errors="replace")


def _chat_logprob(t: TokenLogprob) -> dict[str, Any]:
    def one(piece: bytes, lp: float) -> dict[str, Any]:
        return {"token": _text(piece), "logprob": lp, "bytes": list(piece)}
    return {**one(t.piece, t.logprob), "top_logprobs": [one(p, lp) for _, p, lp in t.top]}


def _completion_logprobs(tokens: list[TokenLogprob], offset: int) -> dict[str, Any]:
    """The legacy completions form: parallel lists, and each token's offset in the text."""
    offsets, at = [], offset
    for t in tokens:
        offsets.append(at)
        at += len(_text(t.piece))
    return {"tokens": [_text(t.piece) for t in tokens], "token_logprobs": [t.logprob for t in tokens],
            "top_logprobs": [{_text(p): lp for _, p, lp in t.top} for t in tokens], "text_offset": offsets}


def _sse(payload: dict[str, Any] | str) -> str:
    return f"data: {payload if isinstance(payload, str) else json.dumps(payload)}\n\n"


# ---- the endpoints ---------------------------------------------------------------------------------------

def make_app(service: Service) -> Starlette:
    sched, model = service.scheduler, service.model

    def need_generation(endpoint: str) -> None:
        if service.embedding:
            raise RequestError(f"{service.name} is an embedding model: it serves /v1/embeddings, not {endpoint}",
                               status=400)

    def generation_job(ids: list[int], req: dict[str, Any], top_logprobs: int | None) -> Callable[..., Job]:
        n = rq.max_tokens(req)
        if len(ids) >= service.n_ctx_seq:
            raise RequestError(f"the prompt has {len(ids)} tokens; a request's context holds {service.n_ctx_seq} "
                               f"(-c/--ctx-size divided by --parallel), prompt and reply together", "messages"
                               if "messages" in req else "prompt")
        if n is not None and n > model.hparams.n_ctx_train:  # more than the model can ever hold: a mistake
            raise RequestError(f"max_tokens={n} is more than the {model.hparams.n_ctx_train} positions the model "
                               f"was trained with", "max_tokens")
        sampling, stop = rq.sampling(req), rq.stops(req)
        return lambda sink: Job(ids, sink, sampling, n, stop, top_logprobs, ignore_eos=req["ignore_eos"])

    async def chat(request: Request) -> Response:
        req = rq.parse(await request.body(), rq.CHAT, ("messages",))
        need_generation("/v1/chat/completions")
        if service.template is None:
            raise RequestError(f"{service.name} has no chat template: start the server with --chat-template FILE, "
                               f"or use /v1/completions", status=400)
        msgs = rq.messages(req)

        def tokens() -> list[int]:
            try:
                prompt = service.template.render(msgs)
            except GraphirError as e:
                raise RequestError(str(e), "messages") from None
            return model.tokenize(prompt, add_special=False, parse_special=True)  # the template places BOS

        ids = await run_in_threadpool(tokens)
        top = req["top_logprobs"] if req["logprobs"] else None
        replies = Replies(sched)
        replies.submit([generation_job(ids, req, top)])
        head = {"id": f"chatcmpl-{uuid.uuid4()}", "created": int(time.time()), "model": service.name}
        if req["stream"]:
            usage = bool((req["stream_options"] or {}).get("include_usage"))

            def chunk(delta: dict[str, Any], finish: str | None, lps: list[TokenLogprob] | None = None) -> str:
                choice = {"index": 0, "delta": delta, "logprobs": None if lps is None else
                          {"content": [_chat_logprob(t) for t in lps]}, "finish_reason": finish}
                return _sse({**head, "object": "chat.completion.chunk", "choices": [choice],
                             **({"usage": None} if usage else {})})

            async def stream() -> AsyncIterator[str]:
                yield chunk({"role": "assistant", "content": ""}, None)
                async for _, event in _guarded(replies.events(None)):
                    if isinstance(event, Piece):
                        if event.text or event.logprobs:
                            yield chunk({"content": event.text}, None, list(event.logprobs) if top is not None
                                        else None)
                    elif isinstance(event, Done):
                        yield chunk({}, event.finish_reason)
                        if usage:
                            yield _sse({**head, "object": "chat.completion.chunk", "choices": [],
                                        "usage": _usage([event])})
                    elif isinstance(event, dict):  # an error after the stream began
                        yield _sse(event)
                yield _sse("[DONE]")
            return StreamingResponse(stream(), media_type="text/event-stream")
        text: list[str] = []
        lps: list[TokenLogprob] = []
        done: list[Done] = []
        async for _, event in replies.events(request):
            if isinstance(event, Piece):
                text.append(event.text)
                lps += event.logprobs
            elif isinstance(event, Done):
                done.append(event)
        return JSONResponse({**head, "object": "chat.completion", "choices": [{
            "index": 0, "message": {"role": "assistant", "content": "".join(text)},
            "logprobs": None if top is None else {"content": [_chat_logprob(t) for t in lps]},
            "finish_reason": done[0].finish_reason}], "usage": _usage(done)})

    async def completions(request: Request) -> Response:
        req = rq.parse(await request.body(), rq.COMPLETION, ("prompt",))
        need_generation("/v1/completions")
        prompts = rq.texts_or_ids(req["prompt"])

        def tokens() -> list[tuple[str, list[int]]]:
            out = []
            for p in prompts:
                if isinstance(p, str):
                    out.append((p, model.tokenize(p, add_special=True, parse_special=True)))
                else:
                    _check_ids(p, model.hparams.n_vocab, "prompt")
                    out.append((model.detokenize(p), list(p)))
            return out

        pairs = await run_in_threadpool(tokens)
        for text, ids in pairs:
            if not ids:
                raise RequestError(f"the prompt {text[:40]!r} has no tokens", "prompt")
        top = req["logprobs"]
        replies = Replies(sched)
        replies.submit([generation_job(ids, req, top) for _, ids in pairs])
        head = {"id": f"cmpl-{uuid.uuid4()}", "created": int(time.time()), "model": service.name,
                "object": "text_completion"}
        echo = [text if req["echo"] else "" for text, _ in pairs]
        if req["stream"]:
            usage = bool((req["stream_options"] or {}).get("include_usage"))

            def chunk(i: int, text: str, finish: str | None, lps: list[TokenLogprob] | None, at: int) -> str:
                return _sse({**head, "choices": [{"index": i, "text": text, "finish_reason": finish,
                                                  "logprobs": None if lps is None else _completion_logprobs(lps, at)}],
                             **({"usage": None} if usage else {})})

            async def stream() -> AsyncIterator[str]:
                sent = [len(e) for e in echo]
                for i, e in enumerate(echo):
                    if e:
                        yield chunk(i, e, None, None, 0)
                done = []
                async for i, event in _guarded(replies.events(None)):
                    if isinstance(event, Piece):
                        if event.text or event.logprobs:
                            yield chunk(i, event.text, None, list(event.logprobs) if top is not None else None,
                                        sent[i])
                            sent[i] += len(event.text)
                    elif isinstance(event, Done):
                        done.append(event)
                        yield chunk(i, "", event.finish_reason, None, sent[i])
                    elif isinstance(event, dict):
                        yield _sse(event)
                if usage and len(done) == len(pairs):
                    yield _sse({**head, "choices": [], "usage": _usage(done)})
                yield _sse("[DONE]")
            return StreamingResponse(stream(), media_type="text/event-stream")
        texts: list[list[str]] = [[e] for e in echo]
        lps: list[list[TokenLogprob]] = [[] for _ in pairs]
        finished: dict[int, Done] = {}
        async for i, event in replies.events(request):
            if isinstance(event, Piece):
                texts[i].append(event.text)
                lps[i] += event.logprobs
            elif isinstance(event, Done):
                finished[i] = event
        return JSONResponse({**head, "choices": [
            {"index": i, "text": "".join(texts[i]), "finish_reason": finished[i].finish_reason,
             "logprobs": None if top is None else _completion_logprobs(lps[i], len(echo[i]))}
            for i in range(len(pairs))], "usage": _usage(list(finished.values()))})

    async def embeddings(request: Request) -> Response:
        req = rq.parse(await request.body(), rq.EMBEDDING, ("input",))
        if not service.embedding:
            raise RequestError(f"{service.name} generates text: /v1/embeddings needs an embedding model (one "
                               f"whose GGUF pools its tokens)", "input")
        inputs = rq.texts_or_ids(req["input"])

        def tokens() -> list[list[int]]:
            out = []
            for p in inputs:
                ids = model.tokenize(p, add_special=True, parse_special=True) if isinstance(p, str) else list(p)
                if not isinstance(p, str):
                    _check_ids(ids, model.hparams.n_vocab, "input")
                if not ids:
                    raise RequestError(f"input {p!r} has no tokens", "input")
                if len(ids) > min(service.max_embed_tokens, service.n_ctx_seq):
                    raise RequestError(f"an input has {len(ids)} tokens; one embedding takes at most "
                                       f"{min(service.max_embed_tokens, service.n_ctx_seq)} (-ub/--ubatch-size)",
                                       "input")
                out.append(ids)
            return out

        all_ids = await run_in_threadpool(tokens)
        replies = Replies(sched)
        replies.submit([lambda sink, ids=ids: Job(ids, sink, embed=True) for ids in all_ids])
        vectors: dict[int, Embedding] = {}
        async for i, event in replies.events(request):
            if isinstance(event, Embedding):
                vectors[i] = event
        data = []
        for i in range(len(all_ids)):
            v = vectors[i].vector.astype(np.float64)
            v = (v / max(float(np.linalg.norm(v)), 1e-12)).astype(np.float32)  # unit length, as OpenAI's
            data.append({"object": "embedding", "index": i, "embedding": v.tolist() if req["encoding_format"] ==
                         "float" else base64.b64encode(v.astype("<f4").tobytes()).decode()})
        n = sum(e.prompt_tokens for e in vectors.values())
        return JSONResponse({"object": "list", "data": data, "model": service.name,
                             "usage": {"prompt_tokens": n, "total_tokens": n}})

    async def models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": service.name, "object": "model",
                                                          "created": int(service.started), "owned_by": "graphir"}]})

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def metrics(request: Request) -> Response:
        return PlainTextResponse(prometheus(service), media_type="text/plain; version=0.0.4")

    def endpoint(handler: Callable[[Request], Any]) -> Callable[[Request], Any]:
        async def run(request: Request) -> Response:
            try:
                response = await handler(request)
            except RequestError as e:
                response = _error(e)
            except ClientGone:
                response = Response(status_code=499)
            except GraphirError as e:  # a request the model cannot take (a token id, a template)
                response = _error(RequestError(str(e)))
            service.responses[(request.url.path, response.status_code)] += 1
            return response
        return run

    async def not_found(request: Request, exc: Exception) -> Response:
        status = exc.status_code if isinstance(exc, HTTPException) else 500
        message = (f"no endpoint {request.method} {request.url.path}" if status in (404, 405)
                   else "internal error")
        service.responses[(request.url.path, status)] += 1
        return _error(RequestError(message, status=status, kind="invalid_request_error" if status < 500
                                   else "server_error"))

    routes = [Route("/v1/chat/completions", endpoint(chat), methods=["POST"]),
              Route("/v1/completions", endpoint(completions), methods=["POST"]),
              Route("/v1/embeddings", endpoint(embeddings), methods=["POST"]),
              Route("/v1/models", endpoint(models), methods=["GET"]),
              Route("/health", endpoint(health), methods=["GET"]),
              Route("/metrics", endpoint(metrics), methods=["GET"])]
    return Starlette(routes=routes, exception_handlers={HTTPException: not_found, Exception: not_found})


async def _guarded(events: AsyncIterator[tuple[int, Event]]) -> AsyncIterator[tuple[int, Any]]:
    """A stream's events, an error after the stream began becoming an OpenAI error object (a status is sent
    already)."""
    try:
        async for item in events:
            yield item
    except RequestError as e:
        yield -1, e.body()


def _check_ids(ids: list[int], n_vocab: int, param: str) -> None:
    bad = [t for t in ids if not 0 <= t < n_vocab]
    if bad:
        raise RequestError(f"token id {bad[0]} is not in the vocabulary (0 to {n_vocab - 1})", param)
