"""Running models: ``graphir.load`` maps a GGUF's weights and compiles its graphs with a backend.

The graphs that run are the very graphs the snapshots check: ``Model`` builds them from the same
:class:`~graphir.model.meta.ModelMeta` and hands them to the backend (the numba one unless asked otherwise, found
through :mod:`graphir.running.backend`) with the file's memory-mapped weights.
"""

from __future__ import annotations

import codecs
import threading
import time
from functools import cached_property
from typing import Any, Callable, Iterator

import numpy as np

from graphir.model.architecture import Architecture
from graphir.running.backend import DEFAULT, Program
from graphir.running.backend import get as get_backend
from graphir.running.batch import Batch
from graphir.running.context import Context
from graphir.running.encdec import EncoderDecoderContext
from graphir.errors import GraphirError, TensorError
from graphir.model.hparams import HParams
from graphir.graph.ir import Graph
from graphir.model.meta import ModelMeta, open_model
from graphir.files.weights import GGUFWeights


class Model:
    """A GGUF model ready to run. Weights are memory-mapped and prepared per tensor on first use."""

    def __init__(self, meta: ModelMeta, isa: str | None = None, backend: str = DEFAULT):
        if meta.header is None:
            raise GraphirError(f"{meta.label} is a preset: it has metadata but no weights; load a GGUF file")
        self.meta = meta
        self.backend = get_backend(backend)
        self.numerics = self.backend.numerics(isa)   # the llama.cpp CPU path the kernels reproduce
        runs = self.backend.weight_types()
        for t in meta.header.tensors.values():
            if len(t.shape) == 2 and t.dtype not in runs:
                raise TensorError(f"{meta.header.path}: tensor '{t.name}' is {t.dtype.name}, a type the {backend} "
                                  f"backend does not multiply (it runs {', '.join(sorted(q.name for q in runs))})")
        self.weights = GGUFWeights(meta.header)
        self._prepared: dict[str, Any] = {}
        self._programs: dict[tuple[Any, ...], Program] = {}
        self._graphs: dict[tuple[Any, ...], Graph] = {}
        self._lock = threading.RLock()  # weight() runs inside program()'s lock

    @property
    def arch(self) -> Architecture:
        return self.meta.arch

    @property
    def hparams(self) -> HParams:
        return self.meta.arch.hp

    @cached_property
    def vocab(self) -> Any:
        from graphir.tokenizer.vocab import Vocab

        return Vocab.from_metadata(self.meta.label, self.meta.metadata)

    def weight(self, name: str) -> Any:
        """A vector as its f32 array; a matrix as a backend weight (repacked once, shared by contexts). Both are
        read-only: contexts in several threads read them at once (the matrices are memory-mapped read-only)."""
        with self._lock:
            if name not in self._prepared:
                t = self.weights[name]
                if len(t.shape) != 2:  # vectors and stacked parameters (RWKV's [E,1,1,5] mixes) stay dense
                    from gguf.quants import dequantize

                    try:
                        flat = dequantize(np.asarray(t.data), t.qtype)
                    except NotImplementedError:
                        raise TensorError(f"{self.meta.header.path}: tensor '{name}' is {t.qtype.name}, a type "
                                          f"graphir cannot read") from None
                    dense = np.asarray(flat, np.float32).reshape(tuple(reversed(t.shape)))
                    dense.flags.writeable = False
                    self._prepared[name] = dense
                else:
                    self._prepared[name] = self.backend.prepare_weight(t.data, t.qtype, t.ne0)
            return self._prepared[name]

    def program(self, kind: str, pooling: str = "none", n_ctx_seq: int = 0,
                phase: str = "prefill") -> tuple[Program, Graph]:
        """A memory kind's compiled graph (the prefill graph: it binds any ubatch size; or the encoder's),
        shared by contexts whose sizes give the same graph (Architecture.variant), and the graph itself."""
        key = (kind, phase, pooling, self.arch.variant(n_ctx_seq))
        program = self.compiled(key, lambda: self.meta.build_graph(kind, phase, pooling, n_ctx_seq))
        return program, self._graphs[key]

    def compiled(self, key: tuple[Any, ...], make: Callable[[], Graph]) -> Program:
        """The program of the graph ``make()`` builds, compiled once per key and shared by contexts (contexts
        ask for their memory's own graphs, such as the K-shift, this way)."""
        with self._lock:
            if key not in self._programs:
                graph = make()
                self._graphs[key] = graph
                self._programs[key] = self.backend.compile(graph, self.weight, self.numerics)
            return self._programs[key]

    def new_context(self, kind: str | None = None, **kw: Any) -> Context | EncoderDecoderContext:
        """See :class:`graphir.running.context.Context` for the parameters (n_ctx, n_batch, n_ubatch, n_seq_max, kind,
        ...). An encoder-decoder model's contexts are ``encoder-decoder`` (its default:
        :class:`graphir.running.encdec.EncoderDecoderContext`) and ``encoder`` (its encoder alone)."""
        if self.arch.encoder_stack is not None and kind in (None, EncoderDecoderContext.kind):
            return EncoderDecoderContext(self, **kw)
        return Context(self, kind=kind, **kw)

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]:
        return self.vocab.tokenize(text, add_special=add_special, parse_special=parse_special)

    def detokenize(self, ids: list[int]) -> str:
        return self.vocab.detokenize(ids)

    def generate(self, prompt: str, max_tokens: int = 128, temperature: float = 0.0, top_k: int = 40,
                 top_p: float = 0.95, seed: int | None = None, ctx: Context | EncoderDecoderContext | None = None,
                 stats: dict[str, float] | None = None) -> Iterator[str]:
        """Stream the text of up to max_tokens sampled tokens (greedy when temperature is 0).

        >>> "".join(model.generate("The capital of France is", max_tokens=8))   # doctest: +SKIP
        """
        ids = self.tokenize(prompt, add_special=True, parse_special=True)
        if not ids:
            raise GraphirError("the prompt has no tokens")
        ctx = ctx or self.new_context(n_ctx=min(self.hparams.n_ctx_train, len(ids) + max_tokens),
                                      n_batch=max(512, len(ids)), n_ubatch=512)
        rng = np.random.default_rng(seed)
        text_of = codecs.getincrementaldecoder("utf-8")(errors="replace")  # holds a character split across tokens
        t0 = time.perf_counter()
        n_past = ctx.prompt(ids)
        t1 = time.perf_counter()
        n = 0
        for n in range(1, max_tokens + 1):
            tok = sample(ctx.logits_ith(-1), temperature, top_k, top_p, rng)
            if self.vocab.is_eog(tok):
                n -= 1
                break
            text = text_of.decode(self.vocab.token_to_piece(tok))
            if text:
                yield text
            if n == max_tokens:
                break
            ctx.decode(Batch.one(tok, n_past + n - 1))
        rest = text_of.decode(b"", final=True)  # bytes the last token left incomplete
        if rest:
            yield rest
        if stats is not None:
            t2 = time.perf_counter()
            stats.update(prompt_tokens=len(ids), prompt_s=t1 - t0, gen_tokens=n, gen_s=t2 - t1)


def sample(logits: np.ndarray, temperature: float, top_k: int, top_p: float, rng: np.random.Generator) -> int:
    """llama.cpp's default chain, reduced: greedy at temperature 0, else top-k -> top-p -> temperature -> draw."""
    if temperature <= 0:
        return int(np.argmax(logits))
    idx = np.argsort(-logits, kind="stable")
    if top_k > 0:
        idx = idx[:top_k]
    z = logits[idx].astype(np.float64)
    p = np.exp(z - z.max())
    p /= p.sum()
    keep = int(np.searchsorted(np.cumsum(p), top_p) + 1) if top_p < 1 else len(idx)
    idx, z = idx[:keep], z[:keep] / temperature
    p = np.exp(z - z.max())
    return int(rng.choice(idx, p=p / p.sum()))


def load(path: str, isa: str | None = None, backend: str = DEFAULT) -> Model:
    """Load a GGUF model: ``model = graphir.load("SmolLM2-135M-Instruct.Q4_1.gguf")``.

    isa: the llama.cpp CPU path whose numbers to reproduce ("avx512", "avx2"); default: GRAPHIR_ISA, else the
    host's own (``model.numerics`` says which, and whether it is exact on this host). backend: the name an
    installed backend registered (graphir.running.backend)."""
    return Model(open_model(path), isa, backend)
