"""Tiny models of any architecture, made by llama.cpp itself from a test's metadata.

llama.cpp builds a model from GGUF metadata alone (``llama_model_init_from_user``): its loader creates every
tensor the architecture's builder may read, optional ones included, asks a callback for their data, and
``llama_model_save_to_file`` writes the result. So the tensor set a test checks is llama.cpp's, not graphir's
(llama.cpp's own tests/test-llama-archs.cpp covers its architectures this way). The metadata below follows that
test's: one set of keys for every architecture (each reads those it knows), with the sizes it gives a few.

    path = make(tmp_path / "qwen3.gguf", "qwen3")              # F32, seeded weights
    path = make(tmp_path / "qwen3moe.gguf", "qwen3moe", moe=True)
    q8 = quantize(path, tmp_path / "qwen3-q8_0.gguf", "Q8_0")  # llama.cpp's own quantizer
"""

from __future__ import annotations

import ctypes
import os
import tempfile
import zlib
from pathlib import Path
from typing import Any

import gguf
import numpy as np
from gguf import Keys

from graphir.convert import add_key

L, A, R, S = Keys.LLM, Keys.Attention, Keys.Rope, Keys.SSM

# Sizes per architecture where test-llama-archs.cpp departs from its defaults (its reasons: MLA's fixed head
# layout needs n_embd 128 and one head; Qwen3 is its MQA case, AFMoE its GQA one; DeepSeek-V2's latent sizes).
DEFAULTS = dict(n_vocab=128, n_embd=256, n_head=2, n_ff=384, n_layer=2, n_ctx=256)
SIZES: dict[str, dict[str, int]] = {
    "deepseek2": dict(n_embd=128, n_head=1, n_ff=192),
    "kimi-linear": dict(n_embd=128, n_head=1, n_ff=192), "bailingmoe3": dict(n_embd=128, n_head=1, n_ff=192),
    "mistral4": dict(n_embd=128, n_head=1, n_ff=192),
    "deepseek32": dict(n_embd=128, n_head=1, n_ff=192), "glm-dsa": dict(n_embd=128, n_head=1, n_ff=192),
    "laguna": dict(n_embd=160),
    "qwen3": dict(n_head=4, n_head_kv=1),
    "afmoe": dict(n_head=4, n_head_kv=2),  # its GQA case
    "nemotron_h": dict(n_layer=3), "nemotron_h_moe": dict(n_layer=3),  # attention, Mamba-2 and FFN layers
}
MLA = ("deepseek2", "mistral4", "kimi-linear", "bailingmoe3", "deepseek32", "glm-dsa")
# mixture-of-experts group two: a per-layer window pattern (odd layers slide) and a clamped SwiGLU, as that test gives
SWA_PER_LAYER = ("maple", "mimo2", "granite_swa")
SWIGLU_CLAMP = {"maple": 7.0}
# Ling 3.0's per-layer clamps of its experts' and shared experts' SwiGLUs, and the M-RoPE sections of its VL files
PER_LAYER_CLAMPS = {"bailingmoe3": ([0.0, 4.0], [0.0, 5.0])}
SECTIONS = {"bailingmoe3": [8, 12, 12, 0]}
# per-layer head counts: layer 1 has none (a recurrent layer)
HYBRID_HEADS = ("granitehybrid", "lfm2", "lfm2moe", "nemotron_h", "nemotron_h_moe", "jamba", "kimi-linear",
                "bailingmoe3", "plamo2")
FFN_LAYERS = ("nemotron_h", "nemotron_h_moe")  # per-layer FFN widths: only from layer 2 on
KDA_SAFE_GATE, KDA_GATE_LOWER_BOUND = "{arch}.kda.safe_gate", "{arch}.kda.gate_lower_bound"  # gguf-py lacks them
# RWKV-7's low-rank sizes (test-llama-archs.cpp skips RWKV: those of RWKV7-World-0.1B), and ARWKV-7's one token shift
RWKV7_LORA = {A.DECAY_LORA_RANK: 64, A.ICLR_LORA_RANK: 64, A.VALUE_RESIDUAL_MIX_LORA_RANK: 32, A.GATE_LORA_RANK: 128}
TOKEN_SHIFTS = {"arwkv7": 1}


def metadata(arch: str, moe: bool = False, **changes: Any) -> dict[str, Any]:
    """The keys (full names) llama.cpp is given for a tiny ``arch``: every architecture's keys at once, each
    reading what it knows; ``changes`` replace sizes (n_embd, n_layer, ...) or keys (full names)."""
    size = {**DEFAULTS, **SIZES.get(arch, {}), **{k: v for k, v in changes.items() if k in DEFAULTS or k == "n_head_kv"}}
    n_vocab, n_embd, n_head, n_ff, n_layer, n_ctx = (size[k] for k in DEFAULTS)
    n_head_kv = size.get("n_head_kv", n_head)
    head = n_embd // n_head
    k = {}

    def put(template: str, value: Any) -> None:
        k[template.format(arch=arch)] = value

    k[Keys.General.ARCHITECTURE] = arch
    for template, value in ((L.VOCAB_SIZE, n_vocab), (L.CONTEXT_LENGTH, n_ctx), (L.EMBEDDING_LENGTH, n_embd),
                            (L.FEATURES_LENGTH, n_embd), (L.BLOCK_COUNT, n_layer), (L.LEADING_DENSE_BLOCK_COUNT, 1),
                            (L.FEED_FORWARD_LENGTH, n_ff), (L.USE_PARALLEL_RESIDUAL, False), (L.LOGIT_SCALE, 1.0),
                            (L.TIME_MIX_EXTRA_DIM, 64), (L.TIME_DECAY_EXTRA_DIM, 128), (L.FULL_ATTENTION_INTERVAL, 2),
                            (L.RESIDUAL_SCALE, 3.5565588200778455)):
        put(template, value)
    if arch in FFN_LAYERS:
        put(L.FEED_FORWARD_LENGTH, [0 if il <= 1 else n_ff for il in range(n_layer)])
    if arch in HYBRID_HEADS:
        per_layer = [0 if il == 1 else n_head for il in range(n_layer)]
        put(A.HEAD_COUNT, per_layer)
        put(A.HEAD_COUNT_KV, per_layer)
    else:
        put(A.HEAD_COUNT, n_head)
        put(A.HEAD_COUNT_KV, n_head_kv)
    put(A.MAX_ALIBI_BIAS, 8.0)
    if arch in MLA:
        for template, value in ((A.KEY_LENGTH, 576), (A.VALUE_LENGTH, 512), (R.DIMENSION_COUNT, 64),
                                (A.KEY_LENGTH_MLA, 192), (A.VALUE_LENGTH_MLA, 128)):
            put(template, value)
    for template, value in ((A.CLAMP_KQV, 1.0), (A.LAYERNORM_EPS, 1e-5), (A.LAYERNORM_RMS_EPS, 1e-5),
                            (A.GROUPNORM_EPS, 1e-5), (A.GROUPNORM_GROUPS, 8), (A.Q_LORA_RANK, 512),
                            (A.KV_LORA_RANK, 512), (A.REL_BUCKETS_COUNT, 8), (A.SLIDING_WINDOW, n_ctx // 8),
                            (A.SLIDING_WINDOW_PATTERN, 2), (R.DIMENSION_SECTIONS, SECTIONS.get(arch, [head // 4] * 4))):
        put(template, value)
    # sparse attention's indexer (every arch is given it); a top_k above any cache keeps every key, as there
    for template, value in ((A.Indexer.HEAD_COUNT, 64), (A.Indexer.KEY_LENGTH, 128), (A.Indexer.TOP_K, 131072)):
        put(template, value)
    if arch in SWA_PER_LAYER:
        put(A.SLIDING_WINDOW_PATTERN, [il % 2 for il in range(n_layer)])
    if arch in SWIGLU_CLAMP:
        put(L.SWIGLU_CLAMP_EXP, SWIGLU_CLAMP[arch])
    if arch in PER_LAYER_CLAMPS:
        put(L.SWIGLU_CLAMP_EXP, PER_LAYER_CLAMPS[arch][0])
        put(L.SWIGLU_CLAMP_SHEXP, PER_LAYER_CLAMPS[arch][1])
    for template, value in RWKV7_LORA.items():
        put(template, value)
    if arch in TOKEN_SHIFTS:
        put(L.TOKEN_SHIFT_COUNT, TOKEN_SHIFTS[arch])
    k[Keys.Tokenizer.MODEL] = "test"  # llama.cpp's dummy tokenizer: ids are what the tests feed
    k[Keys.Tokenizer.LIST] = [f"tok_{i}" for i in range(n_vocab)]
    k[Keys.Tokenizer.SCORES] = [0.0] * n_vocab
    k[Keys.Tokenizer.TOKEN_TYPE_COUNT] = 2  # BERT's segment table (llama.cpp's BERT loaders refuse a model without)
    if moe:
        for template, value in ((L.EXPERT_FEED_FORWARD_LENGTH, n_ff), (L.EXPERT_SHARED_FEED_FORWARD_LENGTH, n_ff // 2),
                                (L.INTERLEAVE_MOE_LAYER_STEP, 2), (L.EXPERT_COUNT, 2), (L.EXPERT_USED_COUNT, 2),
                                (L.EXPERT_SHARED_COUNT, 1), (L.EXPERT_GATING_FUNC, 2), (L.EXPERT_GROUP_SCALE, 1.0),
                                (L.EXPERTS_PER_GROUP, 1)):
            put(template, value)
    for template, value in ((S.INNER_SIZE, 256 if arch in ("qwen3next", "qwen35", "qwen35moe") else 2 * n_embd), (S.CONV_KERNEL, 4),
                            (S.STATE_SIZE, 128), (S.TIME_STEP_RANK, n_head), (S.GROUP_COUNT, 0 if arch == "plamo2" else 2),
                            (Keys.WKV.HEAD_SIZE, n_embd // n_head), (Keys.ShortConv.L_CACHE, 3),
                            (Keys.KDA.HEAD_DIM, 128), (KDA_SAFE_GATE, True), (KDA_GATE_LOWER_BOUND, -5.0)):
        put(template, value)
    k.update({name: v for name, v in changes.items() if name not in size})
    return k


def _lib(name: str) -> ctypes.CDLL:
    """A library of the llama.cpp that llama-cpp-python loaded (LLAMA_CPP_LIB_PATH's, or its own)."""
    from llama_cpp import llama_cpp

    return ctypes.CDLL(str(Path(llama_cpp._lib._name).parent / f"lib{name}.so"))


class _GgufInitParams(ctypes.Structure):
    _fields_ = [("no_alloc", ctypes.c_bool), ("ctx", ctypes.c_void_p)]


def _write_header(path: Path, md: dict[str, Any]) -> None:
    w = gguf.GGUFWriter(str(path), md[Keys.General.ARCHITECTURE])
    for name, value in md.items():
        if name != Keys.General.ARCHITECTURE:
            add_key(w, name, value)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()


def make(path: Path, arch: str, moe: bool = False, seed: int = 42, stdev: float = 0.1, **changes: Any) -> Path:
    """Write ``path``: the tiny ``arch`` llama.cpp makes from :func:`metadata`, every tensor N(0, stdev) seeded by
    its name (Mamba's A negative, as a state must decay), F32 as llama.cpp creates them."""
    import llama_cpp

    ggml = base = _lib("ggml-base")  # ggml's tensors, its backend calls and its GGUF reader
    base.gguf_init_from_file.restype = ctypes.c_void_p
    base.gguf_init_from_file.argtypes = [ctypes.c_char_p, _GgufInitParams]
    base.gguf_free.argtypes = [ctypes.c_void_p]
    for fn, res in (("ggml_nelements", ctypes.c_int64), ("ggml_nbytes", ctypes.c_size_t),
                    ("ggml_get_name", ctypes.c_char_p)):
        getattr(ggml, fn).restype, getattr(ggml, fn).argtypes = res, [ctypes.c_void_p]
    ggml.ggml_backend_tensor_set.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t]

    failures: list[str] = []

    def fill(tensor: int, _: int) -> None:
        try:
            name = ggml.ggml_get_name(tensor).decode()
            kind = ctypes.c_int32.from_address(tensor).value  # ggml_tensor.type, its first field
            rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
            x = rng.normal(0.0, stdev, ggml.ggml_nelements(tensor)).astype(np.float32)
            if "ssm_a" in name:
                x = -np.abs(x)
            data = {0: x, 1: x.astype(np.float16)}.get(kind)
            if data is None:
                raise ValueError(f"tensor {name} has ggml type {kind}, not F32 or F16")
            assert data.nbytes == ggml.ggml_nbytes(tensor)
            ggml.ggml_backend_tensor_set(tensor, data.ctypes.data, 0, data.nbytes)
        except Exception as e:  # noqa: BLE001 - an exception must not cross into C
            failures.append(f"{type(e).__name__}: {e}")

    with tempfile.TemporaryDirectory() as tmp:
        header = Path(tmp) / "metadata.gguf"
        _write_header(header, metadata(arch, moe, **changes))
        ctx = base.gguf_init_from_file(str(header).encode(), _GgufInitParams(True, None))
        if not ctx:
            raise RuntimeError(f"llama.cpp could not read the metadata written for {arch}")
        try:
            callback = llama_cpp.llama_model_set_tensor_data_t(fill)
            params = llama_cpp.llama_model_default_params()
            model = llama_cpp.llama_model_init_from_user(ctx, callback, None, params)
            if not model or failures:
                raise RuntimeError(f"llama.cpp made no '{arch}' model" + (f": {failures[0]}" if failures else ""))
            try:
                llama_cpp.llama_model_save_to_file(model, str(path).encode())
            finally:
                llama_cpp.llama_model_free(model)
        finally:
            base.gguf_free(ctx)
    return path


# llama.cpp's file types its quantizer makes only with an importance matrix (llama-quant.cpp,
# tensor_requires_imatrix: IQ1_S .. IQ3_XXS tensors; IQ2_M's are IQ2_S)
NEEDS_IMATRIX = ("IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ2_M", "IQ3_XXS")


def quantize(src: Path, dst: Path, ftype: str, pure: bool = False, allow_requantize: bool = False,
             nthread: int = 2) -> Path:
    """``dst``: ``src`` through llama.cpp's own quantizer (``llama_model_quantize``) to ``ftype``, a name of
    llama.cpp's file types (F16, Q8_0, Q4_K_M, IQ4_XS, ...: LLAMA_FTYPE_MOSTLY_<ftype>); ``pure``: every matrix of
    the type's own weight type (llama-quantize --pure), where its shape allows; ``allow_requantize``: ``src`` may
    be quantized already. The types of NEEDS_IMATRIX get an importance matrix of seeded weights per input column."""
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{ftype}")
    params.nthread, params.pure, params.allow_requantize = nthread, pure, allow_requantize
    if ftype in NEEDS_IMATRIX:
        entries = importance(src)
        params.imatrix = (llama_cpp.llama_model_imatrix_data * len(entries))(*entries)
    if llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), ctypes.byref(params)) != 0:
        raise RuntimeError(f"llama.cpp could not quantize {src} to {ftype}")
    return dst


def importance(src: Path) -> list[Any]:
    """llama.cpp's importance-matrix entries for every matrix of ``src`` (one weight per input column, per expert
    for a 3-D tensor), closed by a nameless entry; the arrays live as long as the list."""
    import llama_cpp

    entries = []
    for t in gguf.GGUFReader(src).tensors:
        if len(t.shape) >= 2:
            n = int(t.shape[0]) * (int(t.shape[2]) if len(t.shape) > 2 else 1)
            w = np.random.default_rng(zlib.crc32(t.name.encode())).uniform(0.5, 1.5, n).astype(np.float32)
            e = llama_cpp.llama_model_imatrix_data(t.name.encode(), w.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), n)
            e._keep = w
            entries.append(e)
    return [*entries, llama_cpp.llama_model_imatrix_data(None, None, 0)]


if __name__ == "__main__":  # python3 tests/llama_made.py ARCH [moe] OUT.gguf
    import sys

    os.environ.setdefault("GGML_NO_BACKTRACE", "1")
    make(Path(sys.argv[-1]), sys.argv[1], moe="moe" in sys.argv[2:-1])
