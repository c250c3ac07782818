"""A context: one memory, one compiled graph, and the decode loop that feeds ubatches through them.

Mirrors llama.cpp's ``llama_context::decode``: validate the batch, split it into ubatches, ask the memory
to place all of them before anything runs (a batch that does not fit changes nothing), then per ubatch
commit the placement, feed the graph and collect the requested outputs in batch order.

Before each decode the context applies the memory's pending maintenance (``memory.update()``: the K-shift
after ``seq_add``/``seq_div``), as llama.cpp does, once the batch is known to fit. Memory and whole-context
state can be swapped (``get_memory``/``set_memory``) and saved (``state_save``/``state_load``, per sequence
``state_seq_save``/``state_seq_load``; format in :mod:`graphir.running.state`).

The memory kind chooses how a batch is cut into ubatches (``Memory.split``: simple, equal, sequential or seq, see
:mod:`graphir.batch`). A KV cache needs ``simple``: a token may carry several sequence ids, every token's
cell is chosen per token, and the mask (built from cells) isolates the sequences; ``equal``/``seq`` are for
memories that advance one state per sequence per ubatch. Outputs always come back in batch order.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import threading
import warnings
from dataclasses import replace
from typing import Any, Callable, Iterator, Protocol

import numpy as np

from graphir.files.atomic import write_atomic
from graphir.model.architecture import Architecture
from graphir.batch import SPLITS, Batch, UBatch, validate
from graphir.errors import BatchError, GraphirError, StateError
from graphir.model.hparams import HParams
from graphir.model import ubatch_inputs
from graphir.graph.ir import Graph
from graphir.memory import Memory
from graphir.memory.kinds import assemble
from graphir.memory.layers import ContextParams
from graphir.running.pooling import pooling_inputs, pooling_rule

_serial = itertools.count(1)  # contexts are named by number in errors (a context busy in another thread)


def available_bytes() -> int | None:
    """What can still be allocated without swapping: Linux's MemAvailable (/proc/meminfo); None elsewhere."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def check_fits(need: int, what: str) -> None:
    """Refuse, before allocating, memory that the system does not have (numpy would die midway with
    MemoryError, or the kernel would kill the process)."""
    avail = available_bytes()
    if avail is not None and need > avail:
        raise GraphirError(f"{what} needs {need} bytes ({need / 2**30:.1f} GiB) for its memory, but only {avail} "
                           f"bytes ({avail / 2**30:.1f} GiB) are available (MemAvailable); lower n_ctx or n_seq_max")


class Busy:
    """One call at a time on a context: a call from a second thread is refused, not queued behind the first (a
    context is one conversation: two threads interleaving in it is a bug that waiting would only hide). The
    memory API (``ctx.memory.seq_rm``, ...) is the memory's own and not guarded: call it from the thread that
    decodes."""

    def __init__(self, name: str):
        self.name, self._lock, self._holder = name, threading.Lock(), ""

    @contextlib.contextmanager
    def __call__(self, what: str) -> Iterator[None]:
        here = threading.current_thread().name
        if not self._lock.acquire(blocking=False):
            raise GraphirError(f"{self.name} is busy ({self._holder}): {what} from thread '{here}' is refused; "
                               f"a context serves one thread at a time, so give each thread its own context")
        self._holder = f"{what} in thread '{here}'"
        try:
            yield
        finally:
            self._lock.release()


def _positive(**sizes: Any) -> None:
    for name, v in sizes.items():
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise GraphirError(f"{name}={v!r}: a context size must be a positive integer")

class ModelView(Protocol):
    """What a context needs of its model (graphir.running.runtime.Model has it): the architecture and its compiled
    programs. The model creates contexts, so the context names no model class."""

    @property
    def arch(self) -> Architecture: ...

    @property
    def hparams(self) -> HParams: ...

    @property
    def position_rows(self) -> int: ...

    def program(self, kind: str, pooling: str = "none", n_ctx_seq: int = 0, phase: str = "prefill",
                rows: bool = False) -> tuple[Any, Graph]: ...

    def compiled(self, key: tuple[Any, ...], make: Callable[[], Graph]) -> Any: ...


def _in_order(parts: list[np.ndarray], rows: list[int]) -> np.ndarray:
    """The ubatches' output rows (``rows``: their places in the batch, in ubatch order) in batch order, as one
    array of the context's own: a generation step's single part, already in order and made by this run, is taken
    as it is (copying it twice took 30-60 us a token)."""
    if len(parts) == 1 and parts[0].flags.owndata and all(a < b for a, b in zip(rows, rows[1:])):
        return parts[0]
    return np.concatenate(parts)[np.argsort(rows, kind="stable")]


def _requested(rows: np.ndarray, ub: UBatch) -> np.ndarray:
    """The rows of the ubatch's requested outputs: a graph that selects none (llama.cpp's CogVLM takes every
    token's row to its head) gives one per token, of which the requested ones are taken here."""
    return rows[ub.out_ids] if len(rows) == len(ub) != len(ub.out_ids) else rows


class Context:
    """Create with :meth:`graphir.running.runtime.Model.new_context`."""

    def __init__(self, model: ModelView, n_ctx: int | None = None, n_batch: int = 512, n_ubatch: int = 512,
                 n_seq_max: int = 1, kind: str | None = None, embeddings: bool = False, type_k: str = "f16",
                 type_v: str = "f16", unified: bool = True, pooling: str | None = None, swa_full: bool = False):
        """``kind``: the memory (default: the first the model's layers fit, graphir.memory.kinds: kv for
        decoders, none for encoders, recurrent for Mamba/RWKV). ``unified``: one pool of n_ctx cells shared by all sequences (default), or False for
        llama.cpp's non-unified layout, n_ctx // n_seq_max cells per sequence (see :mod:`graphir.memory.kv`).
        ``pooling``: none, mean, cls, last or rank (default: the model's); pooled contexts output every token.
        ``swa_full``: sliding-window layers keep every cell instead of a window-sized cache (llama.cpp's option;
        needed for position edits and for rolling back further than the window)."""
        hp, arch = model.hparams, model.arch
        self.model, self.kind = model, kind or arch.contexts[0]
        self.n_ctx = n_ctx or min(hp.n_ctx_train, 4096)
        self.name = f"context #{next(_serial)} ({arch.name}, kind {self.kind}, n_ctx {self.n_ctx})"
        _positive(n_batch=n_batch, n_ubatch=n_ubatch, n_seq_max=n_seq_max,
                  **({} if n_ctx in (None, 0) else {"n_ctx": n_ctx}))  # 0: the default, as in llama.cpp
        phase, memory_kind = "prefill", self.kind
        known = (("encoder-decoder", "encoder") if arch.encoder_stack is not None else ()) + arch.contexts
        if self.kind == "encoder":  # an encoder-decoder's encoder alone: no cache, every batch in one ubatch
            if arch.encoder_stack is None:
                raise GraphirError(f"a '{arch.name}' model has no encoder (context 'encoder' is an "
                                   f"encoder-decoder's); it runs with context {' or '.join(known)}")
            arch, phase, memory_kind = arch.encoder_stack, "encode", "none"
        elif self.kind not in arch.contexts:
            raise GraphirError(f"a '{arch.name}' model runs with context {' or '.join(known)}, not '{self.kind}'")
        n_ctx_seq = self.n_ctx if unified else self.n_ctx // n_seq_max  # llama.cpp's n_ctx_seq
        self._table = model.position_rows  # rows of a learned position table
        self._positions = arch.positions_per_token
        if self._table and self.n_ctx > self._table:
            raise GraphirError(f"n_ctx={self.n_ctx} exceeds the {self._table} positions this model was trained "
                               f"with (its position embeddings end there)")
        if n_ctx_seq > hp.n_ctx_train:  # llama.cpp warns at the same point, and goes on
            warnings.warn(f"{self.name}: a sequence may hold {n_ctx_seq} positions, more than the {hp.n_ctx_train} "
                          f"the model was trained with; outputs beyond them may degrade", stacklevel=3)
        self.n_batch, self.n_ubatch, self.n_seq_max = n_batch, min(n_ubatch, n_batch), n_seq_max
        self.pooling = pooling or hp.pooling
        params = ContextParams(self.n_ctx, n_seq_max, self.n_ubatch, type_k, type_v, unified, swa_full,
                               n_pos=self._positions, owner=hp)
        check_fits(assemble(memory_kind, arch.needs, replace(params, buffers=False)).nbytes(), self.name)
        self._memory: Memory = assemble(memory_kind, arch.needs, params)
        self.program, self._graph = model.program(memory_kind, self.pooling, n_ctx_seq, phase)
        self._pool_rule = pooling_rule(self._graph, self.pooling)
        # the graph of ubatches carrying embedding rows, compiled when a batch first brings rows
        self._rows_program = lambda: model.program(memory_kind, self.pooling, n_ctx_seq, phase, rows=True)[0]
        self._n_embd_inp = arch.n_embd_inp
        self._ruled = ubatch_inputs.rules_of(self._graph)  # inputs filled per ubatch by a rule the graph states
        self._plans: dict[tuple[Any, ...], Any] = {}  # the program's plans over this context's memory (Program.run)
        self._row_plans: dict[tuple[Any, ...], Any] = {}  # and those of the program of rows
        self._variant = arch.variant(n_ctx_seq)
        self._memory.bind_shift(self._graph, self._run_graph)
        self.has_logits = "logits" in self.program.outputs
        self.embeddings_enabled = embeddings or not self.has_logits  # an encoder's only output is embeddings
        self._busy = Busy(self.name)  # one call at a time per context; contexts run in parallel
        self.causal_attn = True  # set_causal_attn
        self._logits = np.zeros((0, hp.n_vocab), np.float32)
        self._embd = np.zeros((0, hp.n_embd), np.float32)
        self._pooled: dict[int, np.ndarray] = {}
        self._row: dict[int, int] = {}

    def __repr__(self) -> str:
        return self.name

    def _run_graph(self, key: tuple[Any, ...], make: Callable[[], Graph], env: dict[str, int],
                   feeds: dict[str, np.ndarray]) -> None:
        """Run a graph of the memory's own (the K-shift) on its buffers, compiled once per model and key."""
        self.model.compiled((self.kind, self.pooling, self._variant, *key), make).run(env, feeds)

    def set_causal_attn(self, causal: bool) -> None:
        """Whether the next batches' tokens attend to the cells of their sequences causally (default) or to all of
        them, later positions too (llama.cpp's llama_set_causal_attn: mtmd turns it off while a Gemma 3 decoder
        takes an image's rows, which then see each other both ways)."""
        self.causal_attn = bool(causal)

    def decode(self, batch: Batch, taps: dict[str, np.ndarray] | None = None) -> None:
        """Run a batch; afterwards :meth:`logits` holds one row per requested output, in batch order.

        ``taps``: a dict that receives every intermediate by node name (last ubatch wins), for debugging.

        Whatever stops it midway (a failing kernel, KeyboardInterrupt, an exception from ``taps``) leaves the
        context exactly as it was before the batch, pending shifts included.
        """
        if len(batch) > self.n_batch:
            raise BatchError(f"batch of {len(batch)} tokens exceeds n_batch={self.n_batch}")
        if self.pooling != "none":  # llama.cpp: a pooled context outputs every token
            batch = batch.every_output()
        with self._busy("decode"), np.errstate(all="ignore"):  # IEEE arithmetic, as ggml's: an overflow is inf
            mem = self.memory
            pos = validate(batch, self.model.hparams.n_vocab, self.n_seq_max, mem.last_pos, self._n_embd_inp,
                           self._positions)
            why = mem.refuse(batch, pos) or self._beyond_table(pos)
            if why:
                raise BatchError(why)
            ubatches = SPLITS[mem.split](batch, pos, self.n_ubatch)
            if not self.causal_attn:
                ubatches = [replace(ub, causal=False) for ub in ubatches]
            program, own_plans = (self.program, self._plans) if batch.embd is None else \
                (self._rows_program(), self._row_plans)
            plans = mem.prepare(ubatches)  # raises CacheFullError before anything changed
            snap = mem.snapshot(plans)
            logits, embd, rows, pooled = [], [], [], {}
            try:
                mem.update()  # pending K-shift: the cells' contents change representation, not meaning
                for ub, plan in zip(ubatches, plans):
                    feeds = mem.apply(ub, plan)
                    env = {"n_tokens": len(ub), "n_outputs": len(ub.out_ids), "n_ctx": self.n_ctx}
                    env.update((k, feeds.pop(k)) for k in [k for k, v in feeds.items() if isinstance(v, int)])
                    feeds.update(ub.feeds(self._positions), out_ids=ub.out_ids)
                    feeds.update(ubatch_inputs.fill(self._ruled, ub))
                    seqs: list[int] = []
                    if self.pooling != "none":
                        seqs, extra = pooling_inputs(ub, self._pool_rule)
                        feeds.update(extra)
                        env["n_seqs"] = len(seqs)
                    out = program.run(env, feeds, taps, held=mem.buffers(), plans=own_plans)
                    if self.has_logits:
                        logits.append(_requested(out["logits"], ub))
                    if self.embeddings_enabled:
                        embd.append(_requested(out["embd"], ub))
                    for r, s in enumerate(seqs):  # a sequence spanning ubatches keeps the last (llama.cpp)
                        pooled[s] = out["pooled"][r].copy()
                    rows.extend(ub.batch_index[ub.out_ids].tolist())
                outputs = (_in_order(logits, rows) if logits else self._logits[:0],
                           _in_order(embd, rows) if self.embeddings_enabled else self._embd, pooled,
                           {b: r for r, b in enumerate(sorted(rows))})
            except BaseException:
                mem.restore(snap)
                raise
            self._logits, self._embd, self._pooled, self._row = outputs  # with the memory, all or nothing

    def _beyond_table(self, pos: np.ndarray) -> str | None:
        """Why a position has no row in the model's learned position table (its cache may have room)."""
        if self._table and pos.max() >= self._table:
            i = int(np.argmax(pos >= self._table))
            return (f"token {i} has position {int(pos[i])}, beyond the {self._table} positions this model was "
                    f"trained with (its position embeddings end there)")
        return None

    def prompt(self, ids: list[int]) -> int:
        """Decode a prompt as sequence 0 from position 0 (generation's first step); the position the next
        token takes."""
        self.decode(Batch.from_tokens(ids, 0))
        return len(ids)

    # ---- memory ----------------------------------------------------------------------------------------

    @property
    def memory(self) -> Memory:
        """The context's memory: ``ctx.memory.seq_rm(1, -1, -1)``, ``ctx.memory.update()``, ..."""
        return self._memory

    def get_memory(self) -> Memory:
        return self._memory

    def set_memory(self, mem: Memory) -> None:
        """Install ``mem`` (e.g. an earlier ``ctx.memory.clone()``) as this context's memory.

        It must be compatible: same kind, model hyperparameters, cache types, n_ctx, n_seq_max and layout;
        else StateError names the first mismatch. The object itself is installed, not a copy.
        """
        cur = self._memory
        if mem.kind != cur.kind:
            raise StateError(f"cannot set memory: kind '{mem.kind}' differs from this context's '{cur.kind}'")
        theirs_hp, ours_hp = mem.params.owner, cur.params.owner
        if theirs_hp != ours_hp:
            diff = [k for k, v in ours_hp.as_dict().items() if theirs_hp.as_dict().get(k) != v]
            raise StateError(f"cannot set memory: it was made for a model with different hyperparameters "
                             f"({', '.join(diff)})")
        theirs, ours = mem.layout(), cur.layout()
        for k in ours:
            if theirs.get(k) != ours[k]:
                raise StateError(f"cannot set memory: {k}={theirs.get(k)!r}, this context has {k}={ours[k]!r}")
        with self._busy("set_memory"):
            mem.bind_shift(self._graph, self._run_graph)
            self._memory = mem
            self._plans.clear()  # they view the buffers of the memory it replaces
            self._row_plans.clear()

    def state_save(self, path: str | os.PathLike[str] | None = None) -> bytes:
        """The whole context (memory cells, K/V rows, last outputs) as bytes; also written to ``path`` if given,
        all at once or not at all (an interrupted or failed write leaves whatever ``path`` held before)."""
        from graphir.running import state

        with self._busy("state_save"):
            data = state.write(self.model.hparams, self.memory, state.Outputs(
                self._logits, self._row, self._embd if self.embeddings_enabled else None))
        if path is not None:
            try:
                write_atomic(path, data)
            except OSError as e:
                raise StateError(f"cannot write state file {os.fspath(path)!r}: {e.strerror}") from None
        return data

    def state_load(self, data: bytes | str | os.PathLike[str]) -> None:
        """Restore a :meth:`state_save` (bytes or a file path). Raises StateError and changes nothing if the
        data is corrupt, truncated, or from another model / cache type / context size."""
        from graphir.running import state

        with self._busy("state_load"):
            out = state.read(self.model.hparams, self.memory, data, self.embeddings_enabled)
            self._logits, self._row = out.logits, out.row
            if out.embd is not None:
                self._embd = out.embd

    def state_seq_save(self, seq: int) -> bytes:
        """One sequence's cells and K/V rows as bytes."""
        from graphir.running import state

        with self._busy("state_seq_save"):
            return state.write(self.model.hparams, self.memory, None, seq)

    def state_seq_load(self, data: bytes | str | os.PathLike[str], dst_seq: int) -> None:
        """Replace sequence ``dst_seq`` with a saved sequence (saved under any id)."""
        from graphir.running import state

        with self._busy("state_seq_load"):
            state.read_seq(self.model.hparams, self.memory, data, dst_seq)

    # ---- outputs ---------------------------------------------------------------------------------------

    def logits(self) -> np.ndarray:
        """(n_outputs, n_vocab) float32, rows in batch order."""
        if not self.has_logits:
            raise GraphirError(f"a '{self.model.arch.name}' model has no LM head: read ctx.embeddings() or "
                               f"ctx.embeddings_seq(seq)")
        return self._logits

    def logits_ith(self, i: int) -> np.ndarray:
        """Logits of the batch's token i (negative counts from the end of the batch's outputs)."""
        return self._logits[self._output_row(i)]

    def embeddings(self) -> np.ndarray:
        """(n_outputs, n_embd): the final normed hidden state of every output token."""
        if not self.embeddings_enabled:
            raise GraphirError("embeddings are off: create the context with embeddings=True")
        return self._embd

    def embeddings_seq(self, seq: int) -> np.ndarray:
        """(n_embd,): sequence ``seq``'s pooled embedding from the last decode (its last ubatch)."""
        if self.pooling == "none":
            raise GraphirError("this context does not pool: create it with pooling='mean', 'cls', 'last' or 'rank'")
        if seq not in self._pooled:
            raise GraphirError(f"seq {seq} has no pooled embedding: it was not in the last decoded batch")
        return self._pooled[seq]

    def _output_row(self, i: int) -> int:
        if i < 0:
            if -i > len(self._logits):
                raise IndexError(f"output {i} out of range: the last batch produced {len(self._logits)}")
            return len(self._logits) + i
        if i not in self._row:
            raise IndexError(f"token {i} of the last batch has no output (its output flag was off)")
        return self._row[i]
