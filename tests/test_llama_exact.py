"""graphir's numba backend against llama.cpp's CPU backend, bit for bit (oracle tests, need llama-cpp-python).

The backend emulates the order of every float operation llama.cpp's x86 build performs, on the CPU path the
oracle was built for (see the docstrings of graphir.backends.numba: primitives.isa, quant, kernels): Q4_1/Q8_0
dot products lane by lane with FMA and hsum_float_8, attention through tinyBLAS / ggml_vec_dot_f16 on the f16 cache with
the KV length padded to 256, softmax with ggml_v_expf and per-register double sums, RoPE with glibc's cosf/sinf
and the compiled FMA pattern, rms_norm's sequential double sum. So intermediates are compared with
np.array_equal, not a tolerance (on a host whose llama.cpp path graphir does not emulate, with isa.APPROX:
conftest.oracle_is_exact): one flipped rounding anywhere shows, and it would grow through the 8-bit activation
quantization of the following layers (before this emulation: ~2e-7 after blk.0, ~0.2 in the residual by
blk.10, logits ~0.5 off).

The real SmolLM2-135M Q4_1 model (tied Q8_0 LM head): every tapped intermediate of all 30 layers and the
logits, for a 5-token and a 1-token prompt (the two attention paths: tinyBLAS for n >= 2 query rows,
vec_dot_f16 for 1) and both cache types; decode steps against llama.cpp decoding token by token. Unit level:
the Q4_1 / Q8_0 matmul on llama.cpp's own inputs of random-weight models, one matmul site at a time.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

import gguf
import numpy as np
import pytest
from conftest import assert_llama_logits, oracle_is_exact, write_model_gguf

from graphir.backends.numba.primitives.isa import APPROX
from graphir.backends.numba.quant.weight import QWeight
from graphir.batch import Batch
from graphir.model.presets import Preset
from graphir.running.runtime import load

pytestmark = pytest.mark.oracle

Q = gguf.GGMLQuantizationType
PROMPT = [504, 3575, 282, 4649, 314]                       # "The capital of France is"
# llama.cpp's greedy continuation (temperature 0) of PROMPT
CONTINUATION = [7042, 30, 198, 198, 504, 1797, 1918, 553, 253, 2155, 282, 4723, 216, 35, 33, 33, 2215, 701, 30, 198]

# llama.cpp tensor name -> graphir node name inside blk.N
STAGES = {"attn_norm": "attn_norm", "Qcur": "Qcur.rope", "Kcur": "Kcur.rope", "kq": "kq",
          "kq_soft_max": "kq_soft_max", "kqv": "kqv", "kqv_out": "kqv_out", "attn_out": "attn_out",
          "ffn_inp": "ffn_inp", "ffn_norm": "ffn_norm", "ffn_up": "ffn_up", "ffn_gate": "ffn_gate",
          "ffn_swiglu": "ffn_swiglu", "ffn_out": "ffn_out", "l_out": "l_out"}
# matmul sites: (llama.cpp input, weight, llama.cpp output)
MATMULS = [("attn_norm", "attn_v", "Vcur"), ("kqv_out", "attn_output", "attn_out"), ("ffn_norm", "ffn_up", "ffn_up"),
           ("ffn_norm", "ffn_gate", "ffn_gate"), ("ffn_swiglu", "ffn_down", "ffn_out")]


def llama_taps(path: Path, tokens: list[int], cache_type: int) -> dict[str, np.ndarray]:
    """llama_taps.llama_cpp_taps, with the token array kept alive until llama_decode has read it."""
    import llama_taps

    orig, keep = llama_taps.L.llama_batch_get_one, []

    def hold(arr, n):  # type: ignore[no-untyped-def]
        keep.append(arr)
        return orig(arr, n)

    llama_taps.L.llama_batch_get_one = hold
    try:
        return llama_taps.llama_cpp_taps(str(path), tokens, cache_type)
    finally:
        llama_taps.L.llama_batch_get_one = orig


def graphir_taps(path: Path, tokens: list[int], cache: str) -> dict[str, np.ndarray]:
    ctx = load(str(path)).new_context(n_ctx=64, type_k=cache, type_v=cache)
    taps: dict[str, np.ndarray] = {}
    ctx.decode(Batch.from_tokens(tokens, 0, outputs="all"), taps)
    return taps


def same(a: np.ndarray, b: np.ndarray) -> bool:
    """Bit-identical; on a path graphir does not emulate, within APPROX.rel of the largest |value|."""
    if oracle_is_exact():
        return np.array_equal(a, b)
    return a.shape == b.shape and bool(np.abs(a - b).max() <= APPROX.rel * np.abs(a).max())


def differences(ref: dict[str, np.ndarray], ours: dict[str, np.ndarray], n_layer: int,
                n_tokens: int) -> list[str]:
    """Every stage of every layer that is not bit-identical (not within APPROX.rel of its largest value, where
    graphir does not run the oracle's path), with its max |difference|."""
    bad = []
    for il in range(n_layer):
        for lname, gname in STAGES.items():
            a, b = ref[f"{lname}-{il}"], np.asarray(ours[f"blk.{il}.{gname}"], np.float32)
            if lname in ("kq", "kq_soft_max"):            # llama.cpp: n_kv padded to 256 cells
                a = a.reshape(-1, n_tokens, a.shape[-1])
                b = b.reshape(a.shape[0], n_tokens, -1)
                if lname == "kq_soft_max" and np.any(a[..., b.shape[-1]:]):
                    bad.append(f"{lname}-{il}: padding cells have nonzero probability")
                a = a[..., :b.shape[-1]]
            else:                                          # llama.cpp's last layer keeps the output rows only
                a = a.reshape(-1, a.shape[-1])
                b = b.reshape(-1, a.shape[-1])[-a.shape[0]:]
            if not same(a, b):
                bad.append(f"{lname}-{il}: max |d| {np.abs(a - b).max():.3g}")
    return bad


@pytest.fixture(scope="module", params=[("f16", 5), ("f16", 1), ("f32", 5)], ids=lambda p: f"{p[0]}-cache-{p[1]}tok")
def smollm2_run(request, smollm2_gguf):  # type: ignore[no-untyped-def]
    cache, n = request.param
    tokens = PROMPT[:n]
    ref = llama_taps(smollm2_gguf, tokens, {"f16": 1, "f32": 0}[cache])
    return tokens, ref, graphir_taps(smollm2_gguf, tokens, cache)


def test_smollm2_every_intermediate_of_every_layer_is_bit_exact(smollm2_run):  # type: ignore[no-untyped-def]
    tokens, ref, ours = smollm2_run
    assert differences(ref, ours, 30, len(tokens)) == []


def test_smollm2_final_norm_and_logits_are_bit_exact(smollm2_run):  # type: ignore[no-untyped-def]
    tokens, ref, ours = smollm2_run
    for name in ("result_norm", "result_output"):
        a = ref[name].reshape(-1, ref[name].shape[-1])
        b = ours[name].reshape(-1, a.shape[-1])[-a.shape[0]:]
        assert_llama_logits(b, a, name)


def test_smollm2_decode_steps_match_llama_cpp_token_by_token(smollm2_gguf):  # type: ignore[no-untyped-def]
    """Prompt in one batch, then one token per decode (vec_dot_f16 attention over the growing cache): the logits
    of every step are identical, so the greedy continuation is llama.cpp's. (Both engines are fed llama.cpp's
    greedy tokens, so on an unemulated path each step is compared with APPROX.)"""
    os.environ.setdefault("GGML_NO_BACKTRACE", "1")
    import llama_cpp

    n = 12
    llm = llama_cpp.Llama(model_path=str(smollm2_gguf), n_ctx=256, n_batch=256, n_threads=2, verbose=False)
    llm.eval(PROMPT)
    ctx = load(str(smollm2_gguf)).new_context(n_ctx=64)
    ctx.decode(Batch.from_tokens(PROMPT, 0))
    greedy = []
    for i in range(n):
        ref = np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(llm.n_vocab(),))
        assert_llama_logits(ctx.logits_ith(-1), ref, f"step {i}")
        greedy.append(int(np.argmax(ref)))
        llm.eval([greedy[-1]])
        ctx.decode(Batch.one(greedy[-1], len(PROMPT) + i))
    if oracle_is_exact():        # llama.cpp's own continuation on both emulated paths
        assert greedy == CONTINUATION[:n]


@pytest.mark.oracle
@pytest.mark.parametrize("unified", [False, True], ids=["streams", "unified"])
def test_smollm2_sequences_decoded_together_are_llama_cpps_in_either_layout(smollm2_gguf, unified):  # type: ignore[no-untyped-def]
    """Three prompts, then five steps decoding one token of each in one batch. With a stream per sequence
    (kv_unified=false, llama-server's layout) each stream attends as a batch of its own, so every sequence gets
    the bits it gets alone; in the unified layout one matrix product over the three tokens sums in another order
    (up to 0.8 apart in the logits here), and llama.cpp's bits are those too."""
    from test_families import LlamaCpp

    model = load(str(smollm2_gguf))
    prompts = [PROMPT, PROMPT[:5], PROMPT[3:]]
    ours = model.new_context(n_ctx=2048, n_seq_max=4, unified=unified)
    theirs = LlamaCpp(smollm2_gguf, n_ctx=2048, n_seq_max=4, n_ubatch=512, unified=unified)
    alone = [model.new_context(n_ctx=2048, n_seq_max=4, unified=unified) for _ in prompts]
    try:
        for s, (p, c) in enumerate(zip(prompts, alone)):
            ours.decode(Batch.from_tokens(p, 0, seq_id=s))
            theirs.decode(p, range(len(p)), [s] * len(p))
            c.decode(Batch.from_tokens(p, 0))
        apart = 0.0
        for k, t in enumerate(CONTINUATION[:5]):
            pos = [len(p) + k for p in prompts]
            ours.decode(Batch(np.full(3, t), np.array(pos), [(0,), (1,), (2,)], np.ones(3, bool)))
            theirs.decode([t] * 3, pos, [0, 1, 2])
            for s, c in enumerate(alone):
                c.decode(Batch.one(t, pos[s]))
                assert_llama_logits(ours.logits_ith(s), theirs.logits_ith(s), f"step {k}, sequence {s}")
                apart = max(apart, float(np.abs(ours.logits_ith(s) - c.logits_ith(-1)).max()))
    finally:
        theirs.close()
    assert (apart == 0.0) == (not unified), apart


# --- unit level: the quantized dot products on random weights ---------------------------------------------

@pytest.fixture(scope="module", params=[Q.Q4_1, Q.Q8_0], ids=lambda t: t.name)
def random_model(request, tmp_path_factory):  # type: ignore[no-untyped-def]
    """A 1-layer llama with random weights of one type (LM head tied to token_embd, so also of that type),
    head_dim 64 with GQA 2/1, and its tensors for QWeight."""
    from conftest import TINY_KEYS

    k = gguf.Keys
    keys = {**TINY_KEYS, k.LLM.BLOCK_COUNT: 1, k.LLM.EMBEDDING_LENGTH: 128, k.LLM.FEED_FORWARD_LENGTH: 384,
            k.Attention.HEAD_COUNT: 2, k.Attention.HEAD_COUNT_KV: 1}
    preset = Preset("llama", keys, tied=True, matrix_type=Q.F32)
    path = write_model_gguf(tmp_path_factory.mktemp("rnd") / f"{request.param.name}.gguf", preset, request.param)
    tensors = {t.name: t for t in gguf.GGUFReader(path).tensors}
    return path, tensors


def qweight(t) -> QWeight:  # type: ignore[no-untyped-def]
    return QWeight.prepare(t.data, t.tensor_type, int(t.shape[0]))


@pytest.mark.parametrize("tokens", [[17], [5, 17, 200, 3, 99, 42, 7]], ids=["n1", "n7"])
def test_quantized_matmul_equals_llama_cpp_on_its_own_inputs(random_model, tokens):  # type: ignore[no-untyped-def]
    """Each matmul site given llama.cpp's input (so no upstream difference can hide or cause a mismatch):
    ggml_vec_dot_q4_1_q8_1 / ggml_vec_dot_q8_0_q8_0 (and tinyBLAS for Q8_0 when n >= 2) reproduced."""
    path, tensors = random_model
    ref = llama_taps(path, tokens, 1)
    for src, weight, dst in MATMULS:
        x = np.ascontiguousarray(ref[f"{src}-0"].reshape(-1, ref[f"{src}-0"].shape[-1]))
        y = qweight(tensors[f"blk.0.{weight}.weight"]).matmul(x)
        want = ref[f"{dst}-0"].reshape(y.shape)
        assert same(y, want), f"{weight}: max |d| {np.abs(y - want).max()}"
    x = np.ascontiguousarray(ref["result_norm"].reshape(-1, ref["result_norm"].shape[-1]))
    head = qweight(tensors["token_embd.weight"])
    assert same(head.matmul(x), ref["result_output"].reshape(x.shape[0], -1))
    many = np.ascontiguousarray(np.repeat(x, 9, axis=0))   # the GEMM kernel: same rows, same results
    assert np.array_equal(head.matmul(many), np.repeat(head.matmul(x), 9, axis=0))   # GEMM rows = GEMV rows
    assert same(head.matmul(many), np.repeat(ref["result_output"].reshape(x.shape[0], -1), 9, axis=0))


def test_random_model_is_bit_exact_end_to_end(random_model):  # type: ignore[no-untyped-def]
    path, _ = random_model
    tokens = [5, 17, 200, 3, 99, 42, 7, 250, 128]
    ref, ours = llama_taps(path, tokens, 1), graphir_taps(path, tokens, "f16")
    assert differences(ref, ours, 1, len(tokens)) == []
    assert_llama_logits(ours["result_output"][-1], ref["result_output"])
