"""A small graph's plan plays its kernels from a tape (backends.tape): the bits of the same steps run from Python,
outputs that stay the caller's after the next run, and kernels of its own that round as numpy does."""

from __future__ import annotations

from typing import Any

import gguf
import numpy as np
import pytest

from graphir.backends.numba import tape
from graphir.backends.numba.kernels.rows import (ADD, DIV, MUL, NEG, RELU, SCALE, SQR, SUB, binary_kernel, move_rows,
                                                 set_rows_f16, unary_kernel, weight_rows)
from graphir.backends.numba.primitives.jit import ARITH_PAR_MIN
from graphir.batch import Batch
from graphir.running.runtime import load
from test_fuzz_state import PRESETS
from conftest import TinyModels, make_tiny_preset, write_model_gguf

Q = gguf.GGMLQuantizationType


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> TinyModels:
    return TinyModels(tmp_path_factory.mktemp("tape"), PRESETS)


def generate(m: Any) -> tuple[np.ndarray, list[Any]]:
    """Two sequences' prompt, then six greedy steps of both: every logits row, and the context's plans. The
    first step's logits are checked to stay as they were after the next step (not the arena's memory)."""
    ctx = m.new_context(n_ctx=64, n_seq_max=2)
    ctx.decode(Batch(list(range(3, 11)), None, [(0,)] * 4 + [(1,)] * 4, [True] * 8))
    rows = [ctx.logits().copy()]
    held = kept = None
    for step in range(6):
        nxt = [int(np.argmax(ctx.logits_ith(j))) for j in (-2, -1)]
        ctx.decode(Batch(nxt, None, [(0,), (1,)], [True, True]))
        rows.append(ctx.logits().copy())
        if step == 0:
            held, kept = ctx.logits(), ctx.logits().copy()
    assert np.array_equal(held, kept)
    return np.concatenate(rows), list(ctx._plans.values())


@pytest.mark.parametrize("model, dtype", [("llama", Q.Q4_1), ("llama", Q.Q8_0), ("llama", Q.F32), ("iswa", Q.Q8_0),
                                          ("deepseek2", Q.Q4_1), ("hybrid", Q.F32), ("mamba", Q.F32)])
def test_a_taped_generation_gives_the_bits_of_its_steps_run_from_python(tiny, monkeypatch, model, dtype):
    m = load(str(tiny.path(model, dtype)))
    taped, plans = generate(m)
    assert any(p.lock is not None for p in plans)            # small plans: recorded
    monkeypatch.setattr(tape, "ARENA_MAX", -1)                # nothing is small enough: every step from Python
    plain, plans = generate(m)
    assert not any(p.lock is not None for p in plans)
    assert np.array_equal(taped.view(np.uint32), plain.view(np.uint32))


@pytest.mark.parametrize("family, dtype", [("rwkv6", Q.F32), ("mamba2", Q.F32), ("bert", Q.F32),
                                           ("mamba", Q.F16)])   # one sequence: F16 rows shorter than a step
def test_a_taped_run_of_another_family_gives_the_bits_of_its_steps_run_from_python(tmp_path, monkeypatch, family,
                                                                                   dtype):
    m = load(str(write_model_gguf(tmp_path / f"{family}.gguf", make_tiny_preset(family), dtype)))

    def run() -> tuple[np.ndarray, list[Any]]:
        ctx, rows = m.new_context(n_ctx=64), []
        for i in range(4):   # a prompt of 5 tokens four times over, or 5 tokens then 3 steps
            if m.hparams.causal:
                ctx.decode(Batch.from_tokens([3, 4, 5, 6, 7], 0) if i == 0 else Batch.one(8 + i, 4 + i))
            else:            # an encoder keeps nothing between decodes
                ctx.decode(Batch.from_tokens([3, 4, 5, 6, 7], 0))
            rows.append((ctx.logits() if ctx.has_logits else ctx.embeddings()).copy())
        return np.concatenate(rows), list(ctx._plans.values())

    taped, plans = run()
    assert any(p.lock is not None for p in plans)
    monkeypatch.setattr(tape, "ARENA_MAX", -1)
    plain, _ = run()
    assert np.array_equal(taped.view(np.uint32), plain.view(np.uint32))


@pytest.mark.parametrize("dtype", [Q.Q4_1, Q.Q4_K, Q.Q6_K, Q.IQ4_XS, Q.IQ2_XXS], ids=lambda q: q.name)
def test_a_quantized_llamas_step_is_a_handful_of_steps(tmp_path, monkeypatch, dtype):
    """From a plan's second run: every layer's kernels in one played segment, the GEMVs of the exact kinds',
    Q4_K's and the other K- and I-quants' layouts among them, with the bits of the steps run from Python; what
    stays in Python is the embedding's rows, the output rows' selection, the feeds' copy and the segments."""
    wide = {"{arch}.embedding_length": 256, "{arch}.feed_forward_length": 512}   # whole 256-element super-blocks
    m = load(str(write_model_gguf(tmp_path / f"llama-{dtype.name}.gguf", make_tiny_preset("llama", **wide), dtype)))

    def steps() -> tuple[np.ndarray, list[tuple[bool, bool, int]]]:
        """Three one-token steps after a prompt: their logits, and after each whether the step's plan has tapes,
        whether it played them, and its number of steps."""
        ctx, rows, seen = m.new_context(n_ctx=64), [], []
        ctx.decode(Batch.from_tokens([3, 4, 5], 0))
        for i in range(3):
            ctx.decode(Batch.one(6 + i, 3 + i))
            rows.append(ctx.logits().copy())
            (plan,) = [p for k, p in ctx._plans.items() if dict(k[1])["n_tokens"] == 1]
            seen.append((bool(plan.tapes), plan.lock is not None, len(plan.steps)))
        return np.concatenate(rows), seen

    taped, seen = steps()
    assert seen[0][:2] == (True, False)                       # its first run: without its tape
    assert seen[-1][1] and seen[-1][2] <= 6
    monkeypatch.setattr(tape, "ARENA_MAX", -1)                # every step from Python
    plain, seen = steps()
    assert not seen[-1][1]
    assert np.array_equal(taped.view(np.uint32), plain.view(np.uint32))


@pytest.mark.parametrize("family", ["mamba", "rwkv6"])
def test_a_recurrent_step_is_one_played_segment(tmp_path, family):
    """Mamba's conv state (the last columns of conv_x, made contiguous), RWKV6's wkv, its LoRA stack's products
    and its empty views of a one-token batch's previous tokens are on the tape too, and so are the rows of an F32
    or F16 embedding: a generation step is the feeds' copy and one segment."""
    path = write_model_gguf(tmp_path / f"{family}.gguf", make_tiny_preset(family), Q.F32)
    ctx = load(str(path)).new_context(n_ctx=64)
    ctx.decode(Batch.from_tokens([3, 4, 5], 0))
    for i in range(2):
        ctx.decode(Batch.one(6 + i, 3 + i))
    (plan,) = [p for k, p in ctx._plans.items() if dict(k[1])["n_tokens"] == 1]
    assert plan.lock is not None and len(plan.steps) == 2


@pytest.mark.parametrize("written_row, python", [(2, ""), (1, ""), (2, "reads"), (2, "writes")],
                         ids=["read-in-place", "copied-first-the-run-writes-it", "copied-first-python-reads-it",
                              "copied-first-python-writes-the-buffer"])
def test_a_row_gathered_from_a_memory_is_read_in_place_or_copied_before_the_run(written_row, python):
    """Tape.row_in_place: a gather of one row of a buffer the tape does not own is no instruction; the tape's
    rows of the value (and of a window of it) point into the buffer. Where the run writes that row before the
    value's reader (here: it scatters 100s into buf[dst]), or a Python step reads the value or writes the buffer,
    the row is copied into the value before the run instead: the reader sees row 1 as it was either way."""
    t = tape.Tape(16)
    buf = np.arange(12, dtype=np.float32).reshape(3, 4)
    src, dst = t.arena((1,), np.int64), t.arena((1,), np.int64)
    value = t.row_in_place(buf, src)
    window, hundreds, out = value.reshape(1, 4), t.arena((1, 4)), t.arena((1, 4))
    hundreds[...] = 100
    assert t.emit(tape.MOVE, move_rows, (hundreds, buf, dst, True),
                  (t.ref("f2", hundreds), t.ref("f2", buf), t.ref("i64", dst), 1))
    t.writes_rows(buf, dst)
    if python == "writes":
        t.writes_rows(buf, None)
    assert t.emit(tape.BINARY, binary_kernel(window.size), (window, window, 1, out, ADD),
                  (t.ref("f2", window), t.ref("f2", window), 1, t.ref("f2", out), ADD))
    run, place = t.segment(), t.finish([value] if python == "reads" else [])
    src[0], dst[0] = 1, written_row
    place()
    run()
    assert out.tolist() == [[8.0, 10.0, 12.0, 14.0]]
    assert buf[written_row].tolist() == [100.0] * 4
    copied = written_row == 1 or python != ""
    assert value.tolist() == ([[4.0, 5.0, 6.0, 7.0]] if copied else [[0.0] * 4])   # unread where in place


def test_a_float_weights_rows_are_numpys_and_a_row_outside_it_raises():
    """The embedding lookup of an F16 or F32 table on the tape: numpy's float32 of each value (f16 subnormals,
    infinities and both zeros included); an id outside the table raises instead of reading past it."""
    rng = np.random.default_rng(0)
    bits = rng.integers(0, 1 << 16, (6, 8), dtype=np.uint16)
    bits[bits & 0x7C00 == 0x7C00] &= 0xBFFF        # no NaN (the hardware conversion quiets a signaling one)
    bits[0, :4] = [0x0001, 0x8000, 0x7C00, 0xFC00]  # the smallest subnormal, -0, +inf, -inf
    ids = np.array([5, 0, 5, 2], np.int64)
    for w in (bits.view(np.float16), rng.standard_normal((6, 8)).astype(np.float32)):
        flat = w.reshape(-1).view(np.uint16) if w.dtype == np.float16 else w.reshape(-1)
        out = np.empty((4, 8), np.float32)
        weight_rows(flat, 8, ids, out)
        assert np.array_equal(out.view(np.uint32), w[ids].astype(np.float32).view(np.uint32))
        with pytest.raises(IndexError, match="outside the weight's rows"):
            weight_rows(flat, 8, np.array([1, 6], np.int64), out)


def test_a_values_storage_is_reused_after_its_last_reader_and_never_for_what_is_written_before_the_run():
    """The arena's liveness-based reuse: storage comes back to the pool when the last holder of it (a value or a
    window of it) is released, and a later value takes it; what is written before the run (fresh) never takes
    pooled storage, nor gives its own back."""
    t = tape.Tape(16)
    a, feed = t.arena((4, 8)), t.arena((16,), fresh=True)
    window = a[1:]
    for v in (a, window, feed):
        t.hold(v)
    t.release(a)
    assert not np.shares_memory(t.arena((2, 8)), a)          # its window still holds it
    t.release(window)
    t.release(feed)
    b = t.arena((3, 8))
    assert np.shares_memory(b, a) and not b.any()             # a's storage, zeroed
    assert not np.shares_memory(t.arena((16,)), feed)
    assert not np.shares_memory(t.arena((1,)), b)              # taken storage is gone from the pool


def test_a_generation_steps_arena_reuses_the_storage_of_its_dead_values(tiny, monkeypatch):
    """A decode step's values share storage by liveness: the arena holds fewer arrays than its steps make."""
    made = []
    arena = tape.Tape.arena
    monkeypatch.setattr(tape.Tape, "arena", lambda self, *a, **k: made.append(k.get("fresh", False))
                        or arena(self, *a, **k))
    ctx = load(str(tiny.path("llama", Q.Q4_1))).new_context(n_ctx=64)
    ctx.decode(Batch.from_tokens([3, 4, 5], 0))
    for i in range(2):
        ctx.decode(Batch.one(6 + i, 3 + i))
    (plan,) = [p for k, p in ctx._plans.items() if dict(k[1])["n_tokens"] == 1]
    t = next(fn.tape for fn, *_ in plan.steps if isinstance(fn, tape.Segment))
    assert made.count(False) > 2 * len(t.holders) > 0     # the steps' values, and the storage they take


def test_set_rows_into_f16_rounds_as_numpy():
    bits = np.concatenate([np.random.default_rng(0).integers(0, 2**32, 1 << 16, dtype=np.uint64).astype(np.uint32),
                           np.arange(0x33000000 - 64, 0x33000000 + 64, dtype=np.uint32),   # to the smallest half
                           np.arange(0x387FE000 - 64, 0x38800000 + 64, dtype=np.uint32),   # subnormal to normal
                           np.arange(0x477FE000, 0x47800000 + 64, dtype=np.uint32),        # to the largest, inf
                           np.array([0x7F800000, 0xFF800000, 0x7F800001, 0x7FC00001, 0x7F802000, 0x80000000],
                                    np.uint32)])
    src = np.resize(bits, (len(bits) + 63) // 64 * 64).view(np.float32).reshape(-1, 64)
    dst = np.zeros((len(src) + 2, 64), np.uint16)
    ids = np.arange(len(src), dtype=np.int64)[::-1] + 1
    set_rows_f16(dst, src, ids)
    with np.errstate(all="ignore"):
        want = src.astype(np.float16).view(np.uint16)
    assert np.array_equal(dst[ids], want) and not dst[0].any() and not dst[-1].any()


_SERIAL_AND_PARALLEL = [0, ARITH_PAR_MIN]    # sizes that pick each variant of a row kernel


@pytest.mark.parametrize("op, f", [(ADD, np.add), (SUB, np.subtract), (MUL, np.multiply), (DIV, np.divide)])
@pytest.mark.parametrize("y_shape, div", [((2, 3, 1000), 1),   # y of x's rows
                                          ((1000,), 1),        # one row every row takes
                                          ((3, 1000), 1),      # rows that x's repeat: x's rows 0-2, 3-5 take them
                                          ((2, 1, 1000), 3)])  # a row for each three of x's
@pytest.mark.parametrize("size", _SERIAL_AND_PARALLEL)
def test_row_arithmetic_is_numpys(op, f, y_shape, div, size):
    """x of (2, 3, 1000) as six rows, y numpy-broadcast to it as rows the kernel takes by div."""
    rng = np.random.default_rng(op)
    x, y = rng.standard_normal((2, 3, 1000)).astype(np.float32) * 1e3, rng.standard_normal(y_shape).astype(np.float32)
    out = np.empty((6, 1000), np.float32)
    binary_kernel(size)(x.reshape(6, 1000), y.reshape(-1, 1000), div, out, op)
    assert np.array_equal(out, f(x, y).reshape(out.shape))


@pytest.mark.parametrize("size", _SERIAL_AND_PARALLEL)
def test_row_unary_ops_are_numpys(size):
    x = np.array([-0.0, 0.0, np.nan, -np.nan, -1.5, 2.25, -np.inf, np.inf, 3e38, -1e-45], np.float32).reshape(2, 5)
    s = np.float32(0.7)
    with np.errstate(all="ignore"):     # 3e38 squared: inf, as numpy and C give it
        wants = ((RELU, np.maximum(x, np.float32(0))), (SQR, np.multiply(x, x)), (NEG, np.negative(x)), (SCALE, x * s))
    for op, want in wants:
        out = np.empty_like(x)
        unary_kernel(size)(x, out, op, s)
        assert np.array_equal(out.view(np.uint32), want.view(np.uint32)), op
