"""RWKV-7 and ARWKV-7 where the conformance table does not reach: the recurrent state after N tokens against
llama.cpp's own, the head sizes on which llama.cpp's wkv7 is deterministic, the value residual crossing layers,
and the forms graphir refuses.

llama.cpp's ggml_compute_forward_rwkv_wkv7_f32 (ggml-cpu/ops.cpp, its GGML_SIMD branch) steps its two inner loops
by GGML_F32_STEP floats (64 on AVX-512, 32 on AVX2), bounded only by ``j < head_size``: a head that is not a
multiple of the step reads (and writes) past the head's row, so the logits depend on what lies there. Heads of 64
and 128 (every released RWKV-7) are whole steps on both paths, and there llama.cpp is deterministic.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import gguf
import numpy as np
import pytest
from conftest import assert_llama_logits, process_folder
from test_families import LlamaCpp

import graphir.arch
import llama_made
from graphir.batch import Batch
from graphir.errors import MetadataError
from graphir.model.meta import from_preset
from graphir.model.presets import all_presets
from graphir.running.runtime import load

K = gguf.Keys
PROMPT = [5, 17, 3, 99, 42, 7, 64, 1, 120, 33]


def made(arch: str, head: int) -> Path:
    """llama.cpp's tiny ``arch`` (n_embd 256) with heads of ``head``."""
    folder = process_folder(f"rwkv7-{arch}-{head}-")
    return llama_made.make(folder / "F32.gguf", arch, **{K.WKV.HEAD_SIZE.format(arch=arch): head})


def seq_state(o: LlamaCpp, seq: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """llama.cpp's saved state of one sequence of a recurrent memory: its magic and the sequence id
    (llama_context::state_seq_get_data), then llama_memory_recurrent::state_write's one cell, its position, and
    every layer's rolling row ``r``, then every layer's recurrent row ``s``."""
    lib = o.lib
    size = lib.llama_state_seq_get_size(o.ctx.ctx, seq)
    buf = (ctypes.c_uint8 * size)()
    assert lib.llama_state_seq_get_data(o.ctx.ctx, buf, size, seq) == size
    data = bytes(buf)
    _magic, seq_id, cells, _pos, n_seq_ids, s_trans, n_layer = np.frombuffer(data[:28], np.int32)
    assert (seq_id, cells, n_seq_ids, s_trans) == (seq, 1, 0, 0)
    at, rows = 28, []
    for _ in range(2 * n_layer):
        dtype, nbytes = int(np.frombuffer(data[at:at + 4], np.int32)[0]), int(np.frombuffer(data[at + 4:at + 12],
                                                                                            np.uint64)[0])
        assert dtype == 0  # GGML_TYPE_F32
        rows.append(np.frombuffer(data[at + 12:at + 12 + nbytes], np.float32))
        at += 12 + nbytes
    assert at == size
    return rows[:n_layer], rows[n_layer:]


@pytest.mark.oracle
@pytest.mark.parametrize("arch", ["rwkv7", "arwkv7"])
def test_the_state_after_n_tokens_is_llama_cpps(arch: str) -> None:
    """After a prompt in two ubatches and three single steps, every layer's token shifts and WKV state of the
    sequence are llama.cpp's (bit for bit on its own CPU path)."""
    path = made(arch, 64)
    ctx, o = load(str(path)).new_context(n_ctx=64, n_ubatch=6), LlamaCpp(path, n_ctx=64, n_ubatch=6)
    try:
        ctx.decode(Batch.from_tokens(PROMPT, 0))
        o.decode(PROMPT, range(len(PROMPT)), [0] * len(PROMPT))
        for p, t in enumerate((9, 8, 7), len(PROMPT)):
            ctx.decode(Batch.one(t, p))
            o.decode([t], [p], [0])
        theirs_r, theirs_s = seq_state(o, 0)
        memory = ctx.memory
        cell = int(np.flatnonzero(memory.seq & 1)[0])
        buffers = memory.buffers()
        for il, (r, s) in enumerate(zip(theirs_r, theirs_s)):
            assert_llama_logits(buffers[f"blk.{il}.rs_r"][cell], r, f"layer {il}'s token shifts")
            assert_llama_logits(buffers[f"blk.{il}.rs_s"][cell], s, f"layer {il}'s WKV state")
    finally:
        o.close()


def llama_cpp_logits(path: Path, one_by_one: bool) -> np.ndarray:
    o = LlamaCpp(path, n_ctx=64)
    try:
        if one_by_one:
            rows = []
            for p, t in enumerate(PROMPT):
                o.decode([t], [p], [0])
                rows.append(o.logits_ith(0))
            return np.stack(rows)
        o.decode(PROMPT, range(len(PROMPT)), [0] * len(PROMPT))
        return np.stack([o.logits_ith(i) for i in range(len(PROMPT))])
    finally:
        o.close()


@pytest.mark.oracle
@pytest.mark.parametrize("head", [64, 128])
def test_llama_cpps_wkv7_is_deterministic_on_whole_vector_steps_and_graphir_is_it(head: int) -> None:
    """With heads a multiple of ggml's vector step, llama.cpp's tiny RWKV-7 gives the same logits in three fresh
    contexts, batched and token by token, and graphir's equal them."""
    path = made("rwkv7", head)
    batched = [llama_cpp_logits(path, one_by_one=False) for _ in range(3)]
    stepped = [llama_cpp_logits(path, one_by_one=True) for _ in range(2)]
    assert all(b.tobytes() == batched[0].tobytes() for b in batched[1:])
    assert all(s.tobytes() == stepped[0].tobytes() for s in stepped[1:])
    ctx = load(str(path)).new_context(n_ctx=64)
    ctx.decode(Batch.from_tokens(PROMPT, 0, outputs="all"))
    assert_llama_logits(ctx.logits(), batched[0], "prompt logits")
    steps = load(str(path)).new_context(n_ctx=64)
    ours = []
    for p, t in enumerate(PROMPT):
        steps.decode(Batch.one(t, p))
        ours.append(steps.logits_ith(-1).copy())
    assert_llama_logits(np.stack(ours), stepped[0], "token-by-token logits")


def test_the_value_residual_flows_from_layer_0_into_every_later_layer() -> None:
    """Layer 0's value is v_first; every later layer mixes it into its own value, and layer 0 reads none of its
    own residual projections (loaded, with the in-context rate's rank, as llama.cpp's loader takes them)."""
    meta = from_preset("RWKV7-World-0.1B", all_presets()["RWKV7-World-0.1B"])
    g = meta.build_graph("recurrent", "prefill")
    nodes = {n.name: n for n in g.nodes}
    assert "blk.0.tm_v.mixed" not in nodes
    for il in range(1, 12):
        first = nodes[f"blk.{il}.tm_v.first"]
        assert first.inputs[0].name == "blk.0.tm_v"  # v_first - v
    assert meta.tensors["blk.0.time_mix_v1.weight"].shape[1] == 64  # iclr's rank, not the value residual's 32
    assert meta.tensors["blk.1.time_mix_v1.weight"].shape[1] == 32
    used = {i.name for n in g.nodes for i in n.inputs}
    assert "blk.0.time_mix_v1.weight" not in used and "blk.1.time_mix_v1.weight" in used


@pytest.mark.parametrize("arch, shifts", [("rwkv7", 1), ("arwkv7", 2)])
def test_a_token_shift_count_llama_cpps_graph_asserts_against_is_refused_naming_it(arch: str, shifts: int) -> None:
    md = llama_made.metadata(arch, **{K.LLM.TOKEN_SHIFT_COUNT.format(arch=arch): shifts})
    with pytest.raises(MetadataError, match=f"{arch}.token_shift_count"):
        graphir.arch.get(arch).from_metadata(arch, md)

