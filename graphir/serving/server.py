"""``graphir serve``: a model, one context of ``--parallel`` sequences, its scheduler on a thread of its own,
and the OpenAI endpoints served by uvicorn on a socket bound here (so a port 0 is known before the first request)
and closed cleanly on Ctrl-C or SIGTERM (uvicorn's handling: running requests end, the scheduler stops)."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
from pathlib import Path
from typing import Any, AsyncIterator, Callable, Iterator

from graphir.errors import GraphirError
from graphir.serving.api import Service, make_app
from graphir.serving.slots import Scheduler


def service(model: Any, n_ctx: int, parallel: int, n_batch: int, n_ubatch: int, type_k: str, type_v: str,
            queue_size: int, name: str | None, template_source: str | None, pooling: str | None) -> Service:
    """The model's context (``parallel`` sequences of ``n_ctx // parallel`` cells each, llama-server's layout)
    and the scheduler over it."""
    if model.arch.encoder_stack is not None:
        raise GraphirError(f"a '{model.arch.name}' model is an encoder-decoder: graphir serve runs decoders and "
                           f"embedding models")
    if n_ctx < parallel:
        raise GraphirError(f"-c/--ctx-size {n_ctx} cannot give each of --parallel {parallel} requests a cell")
    ctx = model.new_context(n_ctx=n_ctx, n_seq_max=parallel, unified=False, n_batch=n_batch, n_ubatch=n_ubatch,
                            type_k=type_k, type_v=type_v, pooling=pooling)
    embedding = not ctx.has_logits
    if embedding and ctx.pooling == "none":
        raise GraphirError(f"{model.meta.label} is an embedding model without pooling: /v1/embeddings returns one "
                           f"vector per input; start the server with --pooling mean, cls or last")
    template = None
    if not embedding and (template_source is not None or "tokenizer.chat_template" in model.meta.metadata):
        template = model.chat_template(template_source)
    label = name or Path(str(model.meta.header.path)).stem
    return Service(model, Scheduler(model, ctx, n_ctx // parallel, queue_size), label, template, embedding,
                   ctx.n_ubatch)


def run(svc: Service, host: str, port: int, announce: Callable[[str], None],
        warm_up: Callable[[], None] | None = None) -> None:
    """Serve until Ctrl-C or SIGTERM; ``warm_up`` runs first on the scheduler's thread, and ``announce`` is told
    the address once the server is ready."""
    import uvicorn

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(2048)  # before the address is announced: uvicorn listens only after the lifespan's startup
    except OSError as e:
        sock.close()
        raise GraphirError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    app = make_app(svc)

    @contextlib.asynccontextmanager
    async def lifespan(_: Any) -> AsyncIterator[None]:
        ready = svc.scheduler.start(warm_up)
        await asyncio.to_thread(ready.wait)
        bound = sock.getsockname()
        announce(f"http://{'[' + host + ']' if family == socket.AF_INET6 else host}:{bound[1]}")
        try:
            yield
        finally:
            svc.scheduler.stop()

    class Server(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            """Ctrl-C or SIGTERM stop the server (a second one at once); once stopped, the process exits 0
            (uvicorn would raise the signal again)."""
            def stop(sig: int, frame: Any) -> None:
                self.force_exit = self.should_exit
                self.should_exit = True

            before = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
            try:
                yield
            finally:
                for sig, handler in before.items():
                    signal.signal(sig, handler)

    app.router.lifespan_context = lifespan
    server = Server(uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on",
                                   timeout_graceful_shutdown=5))
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
