"""The memory API (sequence operations, K-shift, clone/set_memory, saved state), as specifications.

Models are tiny random F32 GGUFs (conftest.write_model_gguf) with an f32 cache unless a test says otherwise.
Equivalence after *position edits* (seq_add, seq_div, a slid window) is checked on a one-layer model: there a
cached K/V row depends only on its token and position, so a cache whose positions were edited is exactly the
cache a fresh context builds for the edited history. With more layers, rows hold hidden states that attended
to tokens since removed, which no fresh context reproduces (true of llama.cpp's context shift as well).
"""

from __future__ import annotations

import os
import struct
import threading
from collections import Counter
from functools import lru_cache
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
from conftest import TINY_KEYS, memory_bytes, process_folder, write_model_gguf
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from graphir.batch import Batch
from graphir.running.context import Context
from graphir.errors import BatchError, CacheFullError, GraphirError, StateError
from graphir.model.presets import Preset
from graphir.running.runtime import Model, load

RNG = np.random.default_rng(7)
TOKENS = RNG.integers(0, 256, 300).tolist()
F32 = {"type_k": "f32", "type_v": "f32"}


@lru_cache(maxsize=None)
def model_path(arch: str = "llama", n_layer: int = 2, **keys: Any) -> Path:
    """A tiny random model's GGUF, written once per process (lru_cache) into a temporary directory."""
    d = process_folder("graphir-mem-")
    preset = Preset(arch, {**TINY_KEYS, gguf.Keys.LLM.BLOCK_COUNT: n_layer, **keys}, tied=False,
                    matrix_type=gguf.GGMLQuantizationType.F32)
    return write_model_gguf(d / f"{arch}-{n_layer}.gguf", preset)


@lru_cache(maxsize=None)
def model(arch: str = "llama", n_layer: int = 2, **keys: Any) -> Model:
    return load(str(model_path(arch, n_layer, **keys)))


def fresh(m: Model, tokens: list[int], **kw: Any) -> np.ndarray:
    """All-position logits of a fresh context for a token history at positions 0..n-1."""
    ctx = m.new_context(n_ctx=kw.pop("n_ctx", 256), **{**F32, **kw})
    ctx.decode(Batch.from_tokens(tokens, 0, outputs="all"))
    return ctx.logits().copy()


def cells(ctx: Context) -> Counter[tuple[int, tuple[int, ...]]]:
    """The cache as a multiset of (position, sequences) over non-empty cells."""
    mem = ctx.memory
    out: Counter[tuple[int, tuple[int, ...]]] = Counter()
    for c in np.flatnonzero(mem.pos >= 0):
        m = int(mem.seq[c])
        out[(int(mem.pos[c]), tuple(s for s in range(64) if m >> s & 1))] += 1
    return out


def test_the_attended_prefix_is_padded_to_256_cells_and_at_most_the_cache() -> None:
    """llama_kv_cache::get_n_kv: n_kv is the used prefix rounded up to 256 cells, the cells past the used ones
    masked; a cache of fewer cells attends over all of them. The mask is what the graph is fed."""
    m = model("llama", 1, **{gguf.Keys.LLM.CONTEXT_LENGTH: 1024})
    ctx = m.new_context(n_ctx=600, **F32)
    seen: list[tuple[int, np.ndarray]] = []
    program, run = ctx.program, ctx.program.run

    def run_seeing(env: dict[str, int], feeds: dict[str, np.ndarray], *a: Any, **k: Any) -> Any:
        seen.append((env["n_kv"], feeds["kq_mask"]))
        return run(env, feeds, *a, **k)

    program.run = run_seeing
    try:
        ctx.decode(Batch.from_tokens(TOKENS[:3], 0))
        ctx.decode(Batch.from_tokens(TOKENS[3:260], 3))
        ctx.decode(Batch.from_tokens((TOKENS * 2)[:330], 260))
    finally:
        del program.run
    assert [n for n, _ in seen] == [256, 512, 600]
    first = seen[0][1]
    assert first.shape == (3, 256) and np.isneginf(first[:, 3:]).all() and (first[:, :3] == np.triu(
        np.full((3, 3), -np.inf, np.float32), 1)).all()
    # the padding is a fact of the cache's mask, which a backend reads; a mask over the ubatch states none
    assert m.meta.build_graph("kv", "decode")["kq_mask"].attrs["pad"] == 256
    assert "pad" not in m.meta.build_graph("none", "prefill")["kq_mask"].attrs


def test_a_dropped_context_frees_its_cache_though_the_shared_program_planned_over_it() -> None:
    """A plan views a context's cache buffers; the plans live with the context, not with the model's program that
    every context shares, so the cache goes when the context does."""
    import gc
    import weakref

    ctx = model().new_context(n_ctx=64, **F32)
    ctx.decode(Batch.from_tokens(TOKENS[:5], 0))
    ctx.decode(Batch.one(TOKENS[5], 5))
    buffers = [weakref.ref(b) for b in ctx.memory.buffers().values()]
    assert buffers and all(b() is not None for b in buffers)
    del ctx
    gc.collect()
    assert all(b() is None for b in buffers)


# ---- (a) a random walk over the API against a pure-Python model of the cells --------------------------------

N_CTX, N_SEQ = 16, 3
seqs = st.integers(0, N_SEQ - 1)
bound = st.integers(-1, 18)


class CacheMachine(RuleBasedStateMachine):
    """Reference: a list of cells [pos, set of seqs]; llama.cpp semantics (a shared cell moves for all seqs)."""

    UNIFIED = True

    @initialize()
    def start(self) -> None:
        self.ctx = model("llama", 1).new_context(n_ctx=N_CTX, n_seq_max=N_SEQ, n_ubatch=4, unified=self.UNIFIED, **F32)
        self.ref: list[list[Any]] = []

    # reference helpers
    def _cap(self, seq: int) -> int:
        if self.UNIFIED:
            return N_CTX - len(self.ref)
        return N_CTX // N_SEQ - sum(1 for _, ss in self.ref if seq in ss)

    def _next(self, seq: int) -> int:
        return max((p for p, ss in self.ref if seq in ss), default=-1) + 1

    @staticmethod
    def _in(p: int, p0: int, p1: int) -> bool:
        return max(p0, 0) <= p and (p1 < 0 or p < p1)

    @rule(seq=seqs, n=st.integers(1, 6), other=st.one_of(st.none(), seqs))
    def decode(self, seq: int, n: int, other: int | None) -> None:
        ids = (seq,)
        if other is not None and other != seq and self.UNIFIED and self._next(other) == self._next(seq):
            ids = (seq, other)  # one token shared by two sequences
        toks = TOKENS[:n]
        batch = Batch(toks, None, [ids] * n, [True] * n)
        if n > min(self._cap(s) for s in ids):
            before = memory_bytes(self.ctx)
            with pytest.raises(CacheFullError):
                self.ctx.decode(batch)
            assert memory_bytes(self.ctx) == before
            return
        p = self._next(seq)
        self.ctx.decode(batch)
        self.ref += [[p + i, set(ids)] for i in range(n)]
        assert self.ctx.logits().shape == (n, 256)

    @rule(seq=st.integers(-1, N_SEQ - 1), p0=bound, p1=bound)
    def seq_rm(self, seq: int, p0: int, p1: int) -> None:
        assert self.ctx.memory.seq_rm(seq, p0, p1) is True
        for c in self.ref:
            if self._in(c[0], p0, p1) and (seq < 0 or seq in c[1]):
                c[1] = set() if seq < 0 else c[1] - {seq}
        self.ref = [c for c in self.ref if c[1]]

    @rule(src=seqs, dst=seqs, p0=bound, p1=bound)
    def seq_cp(self, src: int, dst: int, p0: int, p1: int) -> None:
        if not self.UNIFIED and src != dst:
            if p0 > 0 or p1 >= 0:
                with pytest.raises(GraphirError, match="only whole sequences are copied"):
                    self.ctx.memory.seq_cp(src, dst, p0, p1)
                return
            self.ctx.memory.seq_cp(src, dst, p0, p1)
            self.ref = [c for c in self.ref if c[1] != {dst}] + [[p, {dst}] for p, ss in self.ref if src in ss]
            return
        self.ctx.memory.seq_cp(src, dst, p0, p1)
        for c in self.ref:
            if self._in(c[0], p0, p1) and src in c[1]:
                c[1].add(dst)

    @rule(seq=seqs)
    def seq_keep(self, seq: int) -> None:
        self.ctx.memory.seq_keep(seq)
        self.ref = [[p, {seq}] for p, ss in self.ref if seq in ss]

    @rule(seq=seqs, p0=bound, p1=bound, delta=st.integers(-6, 6))
    def seq_add(self, seq: int, p0: int, p1: int, delta: int) -> None:
        self.ctx.memory.seq_add(seq, p0, p1, delta)
        for c in self.ref:
            if self._in(c[0], p0, p1) and seq in c[1]:
                c[0] += delta
        self.ref = [c for c in self.ref if c[0] >= 0]

    @rule(seq=seqs, p0=bound, p1=bound, d=st.integers(1, 3))
    def seq_div(self, seq: int, p0: int, p1: int, d: int) -> None:
        self.ctx.memory.seq_div(seq, p0, p1, d)
        for c in self.ref:
            if self._in(c[0], p0, p1) and seq in c[1]:
                c[0] //= d

    @rule(data=st.booleans())
    def clear(self, data: bool) -> None:
        self.ctx.memory.clear(data)
        self.ref = []

    @rule(new_context=st.booleans())
    def save_load(self, new_context: bool) -> None:
        data = self.ctx.state_save()
        if new_context:
            self.ctx = self.ctx.model.new_context(n_ctx=N_CTX, n_seq_max=N_SEQ, n_ubatch=4, unified=self.UNIFIED,
                                                  **F32)
        else:
            self.ctx.memory.clear()
        self.ctx.state_load(data)

    @rule()
    def clone_set_memory(self) -> None:
        mem = self.ctx.memory.clone()
        self.ctx.memory.seq_rm(-1, -1, -1)
        self.ctx.set_memory(mem)

    @rule(src=seqs, dst=seqs)
    def seq_save_load(self, src: int, dst: int) -> None:
        data = self.ctx.state_seq_save(src)
        saved = [p for p, ss in self.ref if src in ss]
        rest = [[p, ss - {dst}] for p, ss in self.ref]
        rest = [c for c in rest if c[1]]
        cap = (N_CTX - len(rest)) if self.UNIFIED else N_CTX // N_SEQ - sum(1 for _, ss in rest if dst in ss)
        if len(saved) > cap:
            before = memory_bytes(self.ctx)
            with pytest.raises(StateError, match="no room for the saved sequence"):
                self.ctx.state_seq_load(data, dst)
            assert memory_bytes(self.ctx) == before
            return
        self.ctx.state_seq_load(data, dst)
        self.ref = rest + [[p, {dst}] for p in saved]

    @invariant()
    def cells_and_positions_match(self) -> None:
        if not hasattr(self, "ctx"):
            return
        want = Counter((p, tuple(sorted(ss))) for p, ss in self.ref)
        assert cells(self.ctx) == want
        for s in range(N_SEQ):
            ps = [p for p, ss in self.ref if s in ss]
            assert self.ctx.memory.seq_pos_min(s) == (min(ps) if ps else -1)
            assert self.ctx.memory.seq_pos_max(s) == (max(ps) if ps else -1)


class PerSeqCacheMachine(CacheMachine):
    UNIFIED = False


_SETTINGS = settings(max_examples=30, stateful_step_count=20, deadline=None,
                     suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
TestUnifiedCacheAgainstReference = CacheMachine.TestCase
TestUnifiedCacheAgainstReference.settings = _SETTINGS
TestPerSequenceCacheAgainstReference = PerSeqCacheMachine.TestCase
TestPerSequenceCacheAgainstReference.settings = _SETTINGS


# ---- (b) end-to-end: edited caches give the logits of the equivalent history ----------------------------------

ARCHS = pytest.mark.parametrize("arch", ["llama", "qwen2"])
LAYOUTS = pytest.mark.parametrize("unified", [True, False])


@ARCHS
@LAYOUTS
def test_fork_with_seq_cp_then_diverge_in_one_batch(arch: str, unified: bool) -> None:
    m = model(arch)
    P, A, B = TOKENS[:7], TOKENS[7:10], TOKENS[20:24]
    ctx = m.new_context(n_ctx=64, n_seq_max=2, unified=unified, **F32)
    ctx.decode(Batch.from_tokens(P, 0))
    ctx.memory.seq_cp(0, 1, -1, -1)
    assert ctx.memory.seq_pos_max(1) == len(P) - 1
    # both continuations in one batch, interleaved: outputs come back in batch order
    order = [(0, t) for t in A] + [(1, t) for t in B]
    order = [order[i] for i in (0, 3, 1, 4, 2, 5, 6)]
    ctx.decode(Batch([t for _, t in order], None, [(s,) for s, _ in order], [True] * len(order)))
    ra, rb = fresh(m, P + A)[len(P):], fresh(m, P + B)[len(P):]
    got_a = ctx.logits()[[i for i, (s, _) in enumerate(order) if s == 0]]
    got_b = ctx.logits()[[i for i, (s, _) in enumerate(order) if s == 1]]
    assert np.abs(got_a - ra).max() <= 1e-4 and np.abs(got_b - rb).max() <= 1e-4
    # drop one continuation, the other goes on
    ctx.memory.seq_rm(1, -1, -1)
    assert ctx.memory.seq_pos_max(1) == -1
    ctx.decode(Batch.one(TOKENS[30]))
    assert np.abs(ctx.logits_ith(-1) - fresh(m, P + A + [TOKENS[30]])[-1]).max() <= 1e-4


@ARCHS
def test_a_prompt_token_shared_by_two_sequences_is_stored_once(arch: str) -> None:
    m = model(arch)
    P, A, B = TOKENS[:6], TOKENS[6:9], TOKENS[40:42]
    ctx = m.new_context(n_ctx=64, n_seq_max=2, **F32)
    ctx.decode(Batch(P, None, [(0, 1)] * len(P), [False] * (len(P) - 1) + [True]))
    assert int((ctx.memory.pos >= 0).sum()) == len(P)
    ctx.decode(Batch(A + B, None, [(0,)] * len(A) + [(1,)] * len(B), [True] * (len(A) + len(B))))
    assert np.abs(ctx.logits()[:len(A)] - fresh(m, P + A)[len(P):]).max() <= 1e-4
    assert np.abs(ctx.logits()[len(A):] - fresh(m, P + B)[len(P):]).max() <= 1e-4


def test_the_per_sequence_layout_refuses_shared_tokens_and_keeps_sequences_in_their_streams() -> None:
    ctx = model("llama").new_context(n_ctx=16, n_seq_max=2, unified=False, **F32)
    with pytest.raises(BatchError, match=r"token 0 belongs to sequences \(0, 1\): .* \(unified=True\)"):
        ctx.decode(Batch([1], None, [(0, 1)], [True]))
    ctx.decode(Batch([1, 2, 3], None, [(1,), (0,), (1,)], [True] * 3))
    assert set(np.flatnonzero(ctx.memory._holds(1))) <= set(range(8, 16))
    ctx.decode(Batch.from_tokens(TOKENS[:6], seq_id=1))
    with pytest.raises(CacheFullError, match="needs 1 cells of sequence 1's stream, 0 of 8 are free"):
        ctx.decode(Batch.one(5, seq_id=1))


@ARCHS
def test_rolling_back_the_tail_with_seq_rm_then_redecoding(arch: str) -> None:
    m = model(arch)
    P, X, Y = TOKENS[:8], TOKENS[8:13], TOKENS[50:54]
    ctx = m.new_context(n_ctx=64, **F32)
    ctx.decode(Batch.from_tokens(P + X, 0))
    ctx.memory.seq_rm(0, len(P), -1)
    ctx.decode(Batch.from_tokens(Y, outputs="all"))
    assert np.abs(ctx.logits() - fresh(m, P + Y)[len(P):]).max() <= 1e-4


@ARCHS
def test_seq_keep_leaves_one_sequence_that_continues(arch: str) -> None:
    m = model(arch)
    a, b = TOKENS[:5], TOKENS[5:12]
    ctx = m.new_context(n_ctx=64, n_seq_max=2, **F32)
    ctx.decode(Batch(a + b, [*range(5), *range(7)], [(0,)] * 5 + [(1,)] * 7, [False] * 12))
    ctx.memory.seq_keep(1)
    assert ctx.memory.seq_pos_max(0) == -1 and int((ctx.memory.pos >= 0).sum()) == len(b)
    ctx.decode(Batch.one(TOKENS[99], seq_id=1))
    assert np.abs(ctx.logits_ith(-1) - fresh(m, b + [TOKENS[99]])[-1]).max() <= 1e-4


SHIFT_TOL = 2e-5


@ARCHS
@LAYOUTS
@pytest.mark.parametrize("n,drop", [(10, 3), (40, 20), (100, 97), (120, 1)])
def test_sliding_a_window_re_ropes_k(arch: str, unified: bool, n: int, drop: int) -> None:
    """seq_rm of the oldest tokens + seq_add(-drop) of the rest, then decode: the fresh context computes RoPE
    at the new positions directly, the shifted cache rotated K twice (by p, then by -drop) in float32.

    Measured max |Δ logits| (f32 cache, |logits| ~ 3.5): 9.5e-7 .. 4.2e-6 over these windows (and windows up
    to 250 tokens); asserted <= SHIFT_TOL = 2e-5. (With an f16 cache K is rounded to f16 twice: ~1e-3 .. 3e-3.)
    """
    m = model(arch, 1)
    ctx = m.new_context(n_ctx=256 if unified else 512, n_seq_max=1 if unified else 2, unified=unified, **F32)
    ctx.decode(Batch.from_tokens(TOKENS[:n], 0))
    ctx.memory.seq_rm(0, 0, drop)
    ctx.memory.seq_add(0, drop, -1, -drop)
    assert (ctx.memory.seq_pos_min(0), ctx.memory.seq_pos_max(0)) == (0, n - drop - 1)
    assert ctx.memory.can_shift()
    ctx.decode(Batch.from_tokens(TOKENS[n:n + 4], outputs="all"))
    err = np.abs(ctx.logits() - fresh(m, TOKENS[drop:n + 4])[-4:]).max()
    assert err <= SHIFT_TOL, err


@ARCHS
def test_seq_div_shifts_k_by_new_minus_old(arch: str) -> None:
    """Keep even positions 0,2,..,8, divide by 2 -> 0..4: the history of the even tokens. llama.cpp records the
    pending shift as old - new (trap 9), which would rotate K the wrong way; this fails with that sign."""
    m = model(arch, 1)
    ctx = m.new_context(n_ctx=64, **F32)
    ctx.decode(Batch.from_tokens(TOKENS[:10], 0))
    for p in range(1, 10, 2):
        ctx.memory.seq_rm(0, p, p + 1)
    ctx.memory.seq_div(0, -1, -1, 2)
    assert sorted(ctx.memory.pos[ctx.memory.pos >= 0].tolist()) == [0, 1, 2, 3, 4]
    assert ctx.memory.update() is True and ctx.memory.update() is False  # explicit update; then nothing pending
    ctx.decode(Batch.one(TOKENS[10]))
    err = np.abs(ctx.logits_ith(-1) - fresh(m, TOKENS[0:10:2] + [TOKENS[10]])[-1]).max()
    assert err <= SHIFT_TOL, err


def test_seq_add_below_zero_removes_cells_and_shifts_are_lazy() -> None:
    ctx = model("llama", 1).new_context(n_ctx=32, **F32)
    ctx.decode(Batch.from_tokens(TOKENS[:6], 0))
    k0 = ctx.memory.buffers()["blk.0.cache_k"].copy()
    ctx.memory.seq_add(0, 0, 4, -2)  # positions 0,1 -> removed; 2,3 -> 0,1; 4,5 stay
    assert sorted(ctx.memory.pos[ctx.memory.pos >= 0].tolist()) == [0, 1, 4, 5]
    assert np.array_equal(ctx.memory.buffers()["blk.0.cache_k"], k0)  # nothing touched K yet
    assert ctx.memory.update() is True
    assert not np.array_equal(ctx.memory.buffers()["blk.0.cache_k"], k0)


def test_a_memoryless_context_says_what_it_cannot_do() -> None:
    ctx = model("llama").new_context(kind="none")
    with pytest.raises(GraphirError, match="memory kind 'none' cannot seq_rm"):
        ctx.memory.seq_rm(0, -1, -1)
    assert ctx.memory.can_shift() is False
    with pytest.raises(StateError, match="memory kind 'none' keeps no state"):
        ctx.state_save()


# ---- (c) saved state reproduces logits bit for bit --------------------------------------------------------------

@ARCHS
@pytest.mark.parametrize("cache", ["f32", "f16"])
def test_save_then_load_reproduces_logits_bit_for_bit(arch: str, cache: str, tmp_path: Path) -> None:
    m = model(arch)
    kw = dict(n_ctx=48, n_seq_max=2, type_k=cache, type_v=cache)
    ctx = m.new_context(**kw)
    ctx.decode(Batch(TOKENS[:9], None, [(0,)] * 5 + [(1,)] * 4, [True] * 9))
    ctx.memory.seq_add(1, -1, -1, 3)  # a pending shift is part of the state too
    saved_logits = ctx.logits().copy()
    data = ctx.state_save(tmp_path / "s.bin")
    assert (tmp_path / "s.bin").read_bytes() == data
    step = Batch([TOKENS[20], TOKENS[21]], None, [(0,), (1,)], [True, True])
    ctx.decode(step)
    want = ctx.logits().copy()
    # the same context, rewound
    ctx.state_load(data)
    assert np.array_equal(ctx.logits(), saved_logits) and np.array_equal(ctx.logits_ith(6), saved_logits[6])
    ctx.decode(step)
    assert np.array_equal(ctx.logits(), want)
    # a new context, from the file
    ctx2 = m.new_context(**kw)
    ctx2.state_load(str(tmp_path / "s.bin"))
    assert np.array_equal(ctx2.logits(), saved_logits)
    ctx2.decode(step)
    assert np.array_equal(ctx2.logits(), want)


@ARCHS
def test_one_sequence_saved_and_loaded_under_another_id(arch: str) -> None:
    m = model(arch)
    ctx = m.new_context(n_ctx=48, n_seq_max=3, **F32)
    ctx.decode(Batch(TOKENS[:10], None, [(0,)] * 6 + [(2,)] * 4, [False] * 10))
    data = ctx.state_seq_save(0)
    ctx.decode(Batch.one(TOKENS[30], seq_id=0))
    source = ctx.logits_ith(-1).copy()
    fresh = m.new_context(n_ctx=32, n_seq_max=2, **F32)  # another size: a sequence state only needs room
    fresh.state_seq_load(data, 1)
    fresh.decode(Batch.one(TOKENS[30], seq_id=1))
    other = m.new_context(n_ctx=32, n_seq_max=2, **F32)
    other.decode(Batch.from_tokens(TOKENS[100:103], 0, seq_id=1))  # dst's old contents are replaced
    other.state_seq_load(data, 1)
    assert (other.memory.seq_pos_min(1), other.memory.seq_pos_max(1)) == (0, 5)
    other.decode(Batch.one(TOKENS[30], seq_id=1))
    assert np.array_equal(other.logits_ith(-1), fresh.logits_ith(-1))
    # in the source context seq 2's cells lie between the sequence's and its next token's, so the products with
    # V add the same terms at other places of ggml's vector lanes (as in llama.cpp): equal up to that rounding
    assert np.abs(source - fresh.logits_ith(-1)).max() <= 1e-5 * np.abs(source).max()
    with pytest.raises(StateError, match="state of one sequence .*state_seq_load"):
        other.state_load(data)


# ---- (d) bad state data is refused and changes nothing --------------------------------------------------------

def _loaded_context(m: Model, **kw: Any) -> Context:
    ctx = m.new_context(**{"n_ctx": 32, "n_seq_max": 2, **F32, **kw})
    ctx.decode(Batch(TOKENS[:6], None, [(0,)] * 3 + [(1,)] * 3, [True] * 6))
    return ctx


@lru_cache(maxsize=None)
def _bad_states() -> dict[str, tuple[Any, str]]:
    good = _loaded_context(model("llama")).state_save()
    flipped = bytearray(good)
    flipped[len(flipped) // 2] ^= 0x40
    return {
        "flipped byte": (bytes(flipped), "state data is corrupt: checksum mismatch"),
        "truncated": (good[:-100], f"state data is truncated: {len(good) - 100} of {len(good)} bytes"),
        "tiny": (good[:5], "state data is truncated: 5 bytes, not even a header"),
        "not state": (b"GGUF" + bytes(60), r"not graphir state data \(bad magic\)"),
        "other hparams": (_loaded_context(model("llama", 2, **{gguf.Keys.Rope.FREQ_BASE: 500000.0})).state_save(),
                          "state was saved from a model with different hyperparameters: rope_freq_base=500000.0 "
                          r"\(this model: 10000.0\)"),
        "other arch": (_loaded_context(model("qwen2")).state_save(),
                       "state was saved from a 'qwen2' model; this model is 'llama'"),
        "other cache type": (_loaded_context(model("llama"), type_k="f16", type_v="f16").state_save(),
                             "state has type_k='f16', this context has type_k='f32'"),
        "other n_ctx": (_loaded_context(model("llama"), n_ctx=64).state_save(),
                        "state has n_ctx=64, this context has n_ctx=32"),
        "other layout": (_loaded_context(model("llama"), unified=False).state_save(),
                         "state has unified=False, this context has unified=True"),
    }


@pytest.mark.parametrize("case", ["flipped byte", "truncated", "tiny", "not state", "other hparams", "other arch",
                                  "other cache type", "other n_ctx", "other layout"])
def test_bad_state_raises_state_error_and_leaves_the_context_byte_identical(case: str) -> None:
    data, message = _bad_states()[case]
    ctx = _loaded_context(model("llama"))
    ctx.decode(Batch.one(TOKENS[50], seq_id=1))
    before = memory_bytes(ctx)
    with pytest.raises(StateError, match=message):
        ctx.state_load(data)
    assert memory_bytes(ctx) == before
    if case not in ("other n_ctx", "other layout"):  # a sequence state is checked the same way
        with pytest.raises(StateError):
            ctx.state_seq_load(data, 0)
        assert memory_bytes(ctx) == before


def test_a_version_1_state_is_refused_saying_why_and_changes_nothing() -> None:
    """Version 1 wrote every memory as K/V-shaped cells; version 2 lets each memory write its own section."""
    good = _loaded_context(model("llama")).state_save()
    old = bytearray(good)
    struct.pack_into("<I", old, 8, 1)
    ctx = _loaded_context(model("llama"))
    before = memory_bytes(ctx)
    with pytest.raises(StateError, match=r"state format version 1 is no longer read: it predates memories that "
                                         r"save their own sections .*; save the state again"):
        ctx.state_load(bytes(old))
    assert memory_bytes(ctx) == before


def test_set_memory_takes_a_clone_and_refuses_an_incompatible_memory() -> None:
    m = model("llama")
    ctx = m.new_context(n_ctx=32, **F32)
    ctx.decode(Batch.from_tokens(TOKENS[:5], 0))
    snap = ctx.memory.clone()
    assert snap.buffers()["blk.0.cache_k"] is not ctx.memory.buffers()["blk.0.cache_k"]
    ctx.decode(Batch.one(TOKENS[5]))
    want = ctx.logits_ith(-1).copy()
    ctx.memory.clear()
    assert ctx.get_memory().seq_pos_max(0) == -1
    ctx.set_memory(snap)
    assert ctx.get_memory() is snap
    ctx.decode(Batch.one(TOKENS[5]))
    assert np.array_equal(ctx.logits_ith(-1), want)
    for other, message in [(m.new_context(n_ctx=64, **F32), "n_ctx=64, this context has n_ctx=32"),
                           (m.new_context(n_ctx=32), "type_k='f16', this context has type_k='f32'"),
                           (m.new_context(n_ctx=32, n_seq_max=2, **F32), "n_seq_max=2, this context has n_seq_max=1"),
                           (model("qwen2").new_context(n_ctx=32, **F32), r"different hyperparameters \(arch"),
                           (m.new_context(kind="none"), "kind 'none' differs from this context's 'kv'")]:
        with pytest.raises(StateError, match=message):
            ctx.set_memory(other.memory)


# ---- (e) contexts sharing one model run in parallel threads -------------------------------------------------------

def _generate(ctx: Context, prompt: list[int], n: int) -> np.ndarray:
    ctx.decode(Batch.from_tokens(prompt, 0))
    rows = [ctx.logits_ith(-1).copy()]
    for _ in range(n):
        ctx.decode(Batch.one(int(np.argmax(rows[-1]))))
        rows.append(ctx.logits_ith(-1).copy())
    return np.array(rows)


def test_two_contexts_on_one_model_decode_at_once_from_two_threads() -> None:
    m = model("qwen2")
    prompts = [TOKENS[:20], TOKENS[100:113]]
    want = [_generate(m.new_context(n_ctx=64, **F32), p, 12) for p in prompts]
    got: list[Any] = [None, None]
    ctxs = [m.new_context(n_ctx=64, **F32) for _ in prompts]

    def work(i: int) -> None:
        for _ in range(3):
            ctxs[i].memory.clear()
            got[i] = _generate(ctxs[i], prompts[i], 12)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(np.array_equal(g, w) for g, w in zip(got, want))


# ---- (f) the per-sequence layout gives the unified layout's logits ------------------------------------------------

@ARCHS
def test_per_sequence_layout_gives_the_same_logits_as_unified(arch: str) -> None:
    m = model(arch)
    outs = []
    for unified in (True, False):
        ctx = m.new_context(n_ctx=96, n_seq_max=3, unified=unified, **F32)
        ctx.decode(Batch(TOKENS[:15], None, [(0,)] * 5 + [(1,)] * 6 + [(2,)] * 4, [True] * 15))
        ctx.memory.seq_rm(1, 3, -1)
        ctx.memory.seq_rm(2, -1, -1)  # (with one stream per sequence seq_cp replaces dst; unified adds to it)
        ctx.memory.seq_cp(0, 2, -1, -1)
        ctx.decode(Batch(TOKENS[40:46], None, [(0,), (1,), (2,)] * 2, [True] * 6))
        outs.append(ctx.logits().copy())
    assert np.abs(outs[0] - outs[1]).max() <= 1e-5


# ---- llama.cpp as the oracle ----------------------------------------------------------------------------------

@pytest.mark.oracle
def test_seq_rm_and_window_shift_match_llama_cpp() -> None:
    """seq_rm of the tail + re-decode (2 layers), and seq_rm + seq_add (K-shift, 1 layer), against llama.cpp."""
    os.environ.setdefault("GGML_NO_BACKTRACE", "1")
    import llama_cpp

    for n_layer, scenario in ((2, "rollback"), (1, "slide")):
        m = model("llama", n_layer)
        llm = llama_cpp.Llama(model_path=str(model_path("llama", n_layer)), n_ctx=64,
                              n_batch=64, logits_all=True, verbose=False, n_threads=2, type_k=0, type_v=0)
        ctx = m.new_context(n_ctx=64, **F32)
        if scenario == "rollback":
            first, keep, then = TOKENS[:12], 7, TOKENS[60:65]
            llm.eval(first)
            llm._ctx.kv_cache_seq_rm(0, keep, -1)
            ctx.decode(Batch.from_tokens(first, 0))
            ctx.memory.seq_rm(0, keep, -1)
            llm.n_tokens = keep
        else:
            first, drop, then = TOKENS[:20], 6, TOKENS[60:65]
            llm.eval(first)
            llm._ctx.kv_cache_seq_rm(0, 0, drop)
            llm._ctx.kv_cache_seq_shift(0, drop, -1, -drop)
            ctx.decode(Batch.from_tokens(first, 0))
            ctx.memory.seq_rm(0, 0, drop)
            ctx.memory.seq_add(0, drop, -1, -drop)
            llm.n_tokens = len(first) - drop
            keep = llm.n_tokens
        llm.eval(then)
        ref = np.array(llm.scores[keep:keep + len(then)], dtype=np.float32)
        ctx.decode(Batch.from_tokens(then, outputs="all"))
        assert ref.std() > 0.5
        assert np.abs(ctx.logits() - ref).max() <= 1e-3, scenario
