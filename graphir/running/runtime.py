"""Running models: ``graphir.load`` maps a GGUF's weights and compiles its graphs with a backend.

The graphs that run are the very graphs the snapshots check: ``Model`` builds them from the same
:class:`~graphir.model.meta.ModelMeta` and hands them to the backend (the numba one unless asked otherwise, found
through :mod:`graphir.running.backend`) with the file's memory-mapped weights.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from functools import cached_property
from typing import Any, Callable, Iterator, Mapping, Sequence

import numpy as np
from gguf import MODEL_TENSOR

from graphir.model.architecture import Architecture
from graphir.running.backend import DEFAULT, Program
from graphir.running.backend import get as get_backend
from graphir.running.chat import ChatTemplate
from graphir.running.context import Context
from graphir.running.encdec import EncoderDecoderContext
from graphir.running.generation import Generation
from graphir.running.sampling import Sampling
from graphir.running.multimodal import MultimodalContext
from graphir.running.tower import TowerContext
from graphir.errors import GraphirError, TensorError
from graphir.model.hparams import HParams
from graphir.model.tensors import same_shape
from graphir.graph.ir import Graph
from graphir.model.meta import ModelMeta, open_model
from graphir.model.tensors import tensor_name
from graphir.files.weights import GGUFWeights


class Model:
    """A GGUF model ready to run. Weights are memory-mapped and prepared per tensor on first use."""

    def __init__(self, meta: ModelMeta, isa: str | None = None, backend: str = DEFAULT):
        if meta.header is None:
            from graphir.model.hf_config import is_hf_source

            what = "a Hugging Face config, read" if is_hf_source(meta.label) else "a preset"
            raise GraphirError(f"{meta.label} is {what} for its graph: it has metadata but no weights to run; load a "
                               f"GGUF file (graphir convert makes one of a BERT checkpoint)")
        self.meta = meta
        self.backend, self.backend_name = get_backend(backend), backend
        self.numerics = self.backend.numerics(isa)   # the llama.cpp CPU path the kernels reproduce
        problems = meta.arch.check(meta.tensors)  # before a context sizes its memory by the hparams
        if problems:
            more = f" (and {len(problems) - 1} more: graphir check lists them)" if len(problems) > 1 else ""
            raise TensorError(f"{meta.header.path}: {problems[0]}{more}")
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

    @property
    def position_rows(self) -> int:
        """The rows of the model's learned position table (0: it has none): no token's position may reach them."""
        table = self.meta.tensors.get(tensor_name(MODEL_TENSOR.POS_EMBD))
        return int(table.shape[1]) if table is not None else 0

    @cached_property
    def vocab(self) -> Any:
        from graphir.tokenizer.vocab import Vocab

        return Vocab.from_metadata(self.meta.label, self.meta.metadata)

    def weight(self, name: str, stacked: bool = False) -> Any:
        """A vector as its f32 array; a matrix as a backend weight (repacked once, shared by contexts); with
        ``stacked``, a 3-D tensor of matrices (a mixture's experts, [n_embd, n_ff, n_expert]; MLA's per-head k_b
        and v_b) as one backend weight of all their rows, which the matrix products split. All are read-only: contexts in several
        threads read them at once (the matrices are memory-mapped read-only)."""
        with self._lock:
            key = (name, stacked)
            if key not in self._prepared:
                t = self.weights[name]
                spec = self.arch.specs.get(name)
                # as the graph has it: the family's shape (its other one where the file has that), trailing 1s kept
                shape = t.shape if spec is None else spec.also if spec.also and same_shape(t.shape, spec.also) \
                    else spec.shape
                if len(shape) == 2 or (stacked and len(shape) == 3):
                    if t.qtype not in self.backend.weight_types():  # matrices are checked at load; stacks here
                        raise TensorError(f"{self.meta.header.path}: tensor '{name}' is {t.qtype.name}, a type the "
                                          f"backend does not multiply")
                    data = np.asarray(t.data)
                    rows = data.reshape(-1, data.shape[-1])  # quantized data already is rows
                    self._prepared[key] = self.backend.prepare_weight(rows, t.qtype, t.ne0, self.numerics)
                else:  # vectors and stacked parameters (RWKV's [E,1,1,5] mixes) stay dense
                    from gguf.quants import dequantize

                    try:
                        raw = np.asarray(t.data)  # bf16 comes as uint16 values: gguf decodes its bytes
                        flat = dequantize(raw.view(np.uint8) if raw.dtype == np.uint16 else raw, t.qtype)
                    except NotImplementedError:
                        raise TensorError(f"{self.meta.header.path}: tensor '{name}' is {t.qtype.name}, a type "
                                          f"graphir cannot read") from None
                    dense = np.asarray(flat, np.float32).reshape(tuple(reversed(shape)))
                    dense.flags.writeable = False
                    self._prepared[key] = dense
            return self._prepared[key]

    def program(self, kind: str, pooling: str = "none", n_ctx_seq: int = 0,
                phase: str = "prefill", rows: bool = False, image: tuple[int, int] | None = None
                ) -> tuple[Program, Graph]:
        """A memory kind's compiled graph (the prefill graph: it binds any ubatch size; or the encoder's),
        shared by contexts whose sizes give the same graph (Architecture.variant), and the graph itself;
        ``rows``: the graph of ubatches that carry embedding rows in place of token ids; ``image``: a tower's
        graph for an image of (width, height) pixels, compiled once per size."""
        key = (kind, phase, pooling, self.arch.variant(n_ctx_seq)) + (("rows",) if rows else ()) + \
            ((image,) if image else ())
        program = self.compiled(key, lambda: self.meta.build_graph(kind, phase, pooling, n_ctx_seq, rows, image))
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

    def new_context(self, kind: str | None = None, mmproj: Model | str | os.PathLike[str] | None = None,
                    **kw: Any) -> Context | EncoderDecoderContext | TowerContext | MultimodalContext:
        """See :class:`graphir.running.context.Context` for the parameters (n_ctx, n_batch, n_ubatch, n_seq_max, kind,
        ...). An encoder-decoder model's contexts are ``encoder-decoder`` (its default:
        :class:`graphir.running.encdec.EncoderDecoderContext`) and ``encoder`` (its encoder alone); an mmproj
        file's is a :class:`graphir.running.tower.TowerContext` (images in, rows out). ``mmproj``: a tower (its
        file, or its loaded model) beside the model's context, composed as llama.cpp's mtmd composes them
        (:class:`graphir.running.multimodal.MultimodalContext`)."""
        if mmproj is not None:
            tower = mmproj if isinstance(mmproj, Model) else \
                Model(open_model(os.fsdecode(mmproj)), self.numerics.path.name, self.backend_name)
            return MultimodalContext(self, tower, kind=kind, **kw)
        if self.arch.tower:
            if kind not in (None, TowerContext.kind):
                raise GraphirError(f"{self.meta.label}: a tower's context is '{TowerContext.kind}', not '{kind}'")
            return TowerContext(self, **kw)
        if self.arch.encoder_stack is not None and kind in (None, EncoderDecoderContext.kind):
            return EncoderDecoderContext(self, **kw)
        return Context(self, kind=kind, **kw)

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]:
        return self.vocab.tokenize(text, add_special=add_special, parse_special=parse_special)

    def detokenize(self, ids: list[int]) -> str:
        return self.vocab.detokenize(ids)

    def generate(self, prompt: str, max_tokens: int = 128, temperature: float = 0.0, top_k: int = 40,
                 top_p: float = 0.95, seed: int | None = None, ctx: Context | EncoderDecoderContext | None = None,
                 stats: dict[str, Any] | None = None, min_p: float = 0.0, repeat_penalty: float = 1.0) -> Iterator[str]:
        """Stream the text of up to max_tokens sampled tokens (greedy when temperature is 0); special tokens in
        the prompt are parsed. ``stats`` receives token counts, times and the finish reason ("stop": an
        end-of-generation token; "length": max_tokens).

        >>> "".join(model.generate("The capital of France is", max_tokens=8))   # doctest: +SKIP
        """
        ids = self.tokenize(prompt, add_special=True, parse_special=True)
        return self._continue(ids, max_tokens, Sampling(temperature, top_k, top_p, min_p, repeat_penalty, seed=seed),
                              ctx, stats)

    def _continue(self, ids: list[int], max_tokens: int | None, sampling: Sampling,
                  ctx: Context | EncoderDecoderContext | None, stats: dict[str, Any] | None) -> Iterator[str]:
        """Decode ``ids``, then stream the text of the tokens sampled after them; None: until the context is full."""
        if not ids:
            raise GraphirError("the prompt has no tokens")
        n_ctx = min(self.hparams.n_ctx_train, 4096) if max_tokens is None else len(ids) + max_tokens
        ctx = ctx or self.new_context(n_ctx=min(self.hparams.n_ctx_train, n_ctx), n_batch=max(512, len(ids)),
                                      n_ubatch=512)
        generation = self.generation(ctx, sampling, shift=False)
        return self._stream(generation, ids, max_tokens, stats)

    def generation(self, ctx: Context | EncoderDecoderContext, sampling: Sampling, n_keep: int = 0,
                   shift: bool = True) -> Generation:
        """Sequence 0 of ``ctx`` as a generation (:class:`graphir.running.generation.Generation`); refused, in
        one line, for a model that has no LM head (an embedding model's text is read with embed)."""
        if not ctx.has_logits:
            raise GraphirError(f"{self.meta.label} is an embedding model ('{self.arch.name}' has no LM head, so it "
                               f"generates no text): read its embeddings (graphir embed, ctx.embeddings())")
        return Generation(self, ctx, sampling.sampler(), n_keep, shift)

    @staticmethod
    def _stream(generation: Generation, ids: list[int], max_tokens: int | None,
                stats: dict[str, Any] | None) -> Iterator[str]:
        t0 = time.perf_counter()
        generation.feed(ids)
        if stats is not None:
            stats.update(prompt_tokens=len(ids), prompt_s=time.perf_counter() - t0)
        yield from generation.reply(max_tokens, stats)

    # ---- llama-cpp-python's calls, with their names and result shapes -------------------------------------

    def chat_template(self, source: str | None = None) -> ChatTemplate:
        """The GGUF's chat template (``tokenizer.chat_template``), or ``source`` when given."""
        v = self.vocab
        text = source if source is not None else self.meta.metadata.get("tokenizer.chat_template")
        if not isinstance(text, str):
            raise GraphirError(f"{self.meta.label} has no chat template (tokenizer.chat_template): give one "
                               f"(chat_template=... or graphir chat --chat-template FILE)")
        bos, eos = ("" if t is None else v.tokens[t] for t in (v.bos, v.eos))
        return ChatTemplate(text, bos, eos, "the given chat template" if source is not None
                            else f"{self.meta.label}: tokenizer.chat_template")

    def chat(self, messages: Sequence[Mapping[str, Any]], max_tokens: int | None = None,
             chat_template: str | None = None, stats: dict[str, Any] | None = None, **sampling: Any) -> Iterator[str]:
        """Stream the assistant's reply to ``messages`` ([{"role": "user", "content": "..."}, ...]), rendered with
        the model's chat template; it ends at an end-of-generation token, at max_tokens, or when the context is
        full (max_tokens None). ``sampling``: the fields of :class:`graphir.running.sampling.Sampling`, whose
        defaults are llama-cpp-python's but for temperature (0.2, as its create_chat_completion)."""
        prompt = self.chat_template(chat_template).render(messages)
        ids = self.tokenize(prompt, add_special=False, parse_special=True)  # the template places BOS itself
        return self._continue(ids, max_tokens, Sampling(**{"temperature": 0.2, **sampling}), None, stats)

    def create_completion(self, prompt: str, max_tokens: int | None = 16, stream: bool = False,
                          **sampling: Any) -> dict[str, Any] | Iterator[dict[str, Any]]:
        """llama-cpp-python's ``create_completion``: the completion of ``prompt`` as an OpenAI-style dict, or
        (``stream``) its chunks."""
        ids = self.tokenize(prompt, add_special=True, parse_special=True)
        stats: dict[str, Any] = {}
        pieces = self._continue(ids, max_tokens, Sampling(**sampling), None, stats)
        head = {"id": f"cmpl-{uuid.uuid4()}", "object": "text_completion", "created": int(time.time()),
                "model": self.meta.label}

        def choice(text: str, finish: str | None) -> dict[str, Any]:
            return {"text": text, "index": 0, "logprobs": None, "finish_reason": finish}

        if stream:
            def chunks() -> Iterator[dict[str, Any]]:
                for piece in pieces:
                    yield {**head, "choices": [choice(piece, None)]}
                yield {**head, "choices": [choice("", stats["finish_reason"])]}
            return chunks()
        text = "".join(pieces)
        return {**head, "choices": [choice(text, stats["finish_reason"])], "usage": _usage(stats)}

    def create_chat_completion(self, messages: Sequence[Mapping[str, Any]], max_tokens: int | None = None,
                               stream: bool = False, chat_template: str | None = None,
                               **sampling: Any) -> dict[str, Any] | Iterator[dict[str, Any]]:
        """llama-cpp-python's ``create_chat_completion``: the assistant's message as an OpenAI-style dict, or
        (``stream``) its chunks: a role delta, content deltas, and an empty delta with the finish reason."""
        stats: dict[str, Any] = {}
        pieces = self.chat(messages, max_tokens, chat_template, stats, **sampling)
        head = {"id": f"chatcmpl-{uuid.uuid4()}", "created": int(time.time()), "model": self.meta.label}

        def chunk(delta: dict[str, str], finish: str | None) -> dict[str, Any]:
            return {**head, "object": "chat.completion.chunk",
                    "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}

        if stream:
            def chunks() -> Iterator[dict[str, Any]]:
                yield chunk({"role": "assistant"}, None)
                for piece in pieces:
                    yield chunk({"content": piece}, None)
                yield chunk({}, stats["finish_reason"])
            return chunks()
        text = "".join(pieces)
        return {**head, "object": "chat.completion",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                             "finish_reason": stats["finish_reason"]}],
                "usage": _usage(stats)}


def _usage(stats: dict[str, Any]) -> dict[str, int]:
    p, c = int(stats["prompt_tokens"]), int(stats["gen_tokens"])
    return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}


def load(path: str, isa: str | None = None, backend: str = DEFAULT) -> Model:
    """Load a GGUF model: ``model = graphir.load("SmolLM2-135M-Instruct.Q4_1.gguf")``.

    isa: the llama.cpp CPU path whose numbers to reproduce ("avx512", "avx2"); default: GRAPHIR_ISA, else the
    host's own (``model.numerics`` says which, and whether it is exact on this host). backend: the name an
    installed backend registered (graphir.running.backend)."""
    return Model(open_model(path), isa, backend)
