"""Which llama.cpp CPU path graphir reproduces, and that each path is llama.cpp's on its own build.

The oracle tests of the other files compare graphir with the llama.cpp the process loaded (the installed,
natively built llama-cpp-python). Here: the detected path is that build's; the paths really differ (the other
path is not bit-exact, and stays within the tolerance the README documents for hosts graphir does not
emulate); and on a host whose native path is AVX-512, the whole oracle suite runs once more against a
llama.cpp built for AVX2 only (tests/oracle_build.py), with graphir on its AVX2 path, so neither path can rot
unseen.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import apart
import numpy as np
import pytest
from conftest import logit_distance, oracle_path
from numba import njit

from graphir.backends.numba.primitives import isa
from graphir.backends.numba.primitives import expf
from graphir.batch import Batch
from graphir.errors import GraphirError
from graphir.running.runtime import load

ROOT = Path(__file__).resolve().parent.parent


@njit  # not cached: numba's cache would not see edits of the kernels it inlines
def _expf_lanes(x, variant, out):
    for i in range(x.shape[0]):
        out[i] = expf.v_expf_split(x[i]) if variant == isa.EXPF_SPLIT else expf.v_expf_scalef(x[i])


def v_expf(x: np.ndarray, path: isa.IsaPath) -> np.ndarray:
    out = np.empty_like(x)
    _expf_lanes(x, path.expf, out)
    return out


@pytest.mark.parametrize("path", isa.PATHS.values(), ids=list(isa.PATHS))
def test_each_paths_expf_is_a_faithful_float_exp(path: isa.IsaPath) -> None:
    """ggml_v_expf's accuracy on every path, over the range softmax and SiLU use (vec.h documents 1.45 ulp +
    0.5; measured against float64 exp: 2.18 ulp for the AVX-512 variant, 1.85 for the AVX2 one), and its
    edges: overflow to inf, flush to zero, NaN through."""
    x = np.concatenate([np.linspace(-87.0, 88.0, 400_001, dtype=np.float32),
                        np.float32(2.0) ** -np.arange(1, 30, dtype=np.float32)])
    got = v_expf(x, path).astype(np.float64)
    want = np.exp(x.astype(np.float64))
    ulp = np.spacing(want.astype(np.float32)).astype(np.float64)
    assert (np.abs(got - want) / ulp).max() <= 2.5
    edges = v_expf(np.array([89.0, 200.0, -105.0, -300.0, np.nan, 0.0], np.float32), path)
    assert edges[0] == np.inf and edges[1] == np.inf and edges[2] == 0 and edges[3] == 0
    assert np.isnan(edges[4]) and edges[5] == 1.0


def test_the_two_expf_variants_differ_in_the_last_bit() -> None:
    """Why the path matters: the AVX-512 and AVX2 ggml_v_expf round differently for some inputs."""
    x = np.linspace(-20.0, 0.0, 100_001, dtype=np.float32)
    a, b = v_expf(x, isa.PATHS["avx512"]), v_expf(x, isa.PATHS["avx2"])
    differ = np.mean(a != b)
    assert 0.001 < differ < 0.5
    assert np.abs(a.astype(np.float64) - b).max() <= 2 * np.spacing(np.float32(1.0))


@njit(error_model="numpy")
def _libm_mismatches(stride, log):
    """How many float32 bit patterns, every stride-th, the written-out function and the C library's (numba's
    math.exp/math.log of a float32 call expf/logf) give different bits for."""
    bad = 0
    for i in range(0, 1 << 32, stride):
        x = np.uint32(i)
        f = np.array([x]).view(np.float32)[0]
        a, b = (expf.libm_logf(f), math.log(f)) if log else (expf.libm_expf(f), math.exp(f))
        bad += np.array([a]).view(np.uint32)[0] != np.array([b]).view(np.uint32)[0]
    return bad


@pytest.mark.parametrize("name", ["expf", "logf"])
def test_the_written_out_expf_and_logf_are_the_c_librarys_bit_for_bit(name: str) -> None:
    """ggml's scalar loops (Mamba's scan) call the C library's expf and logf; kernels that vectorize them compute
    glibc's algorithm themselves. Checked against the C library on every 61st float32 bit pattern (all 2^32 agreed
    when these were written; a mishandled edge, subnormal inputs left unscaled, shows here, while an FMA left unfused
    or a constant one ulp off changed none of these 70 million results), and numba's math functions checked to be the C library's on the edges: nan,
    infinities, zeros, subnormals, overflow and underflow bounds."""
    assert _libm_mismatches(61, name == "logf") == 0
    libm = ctypes.CDLL(ctypes.util.find_library("m"))
    fn = getattr(libm, name)
    fn.restype, fn.argtypes = ctypes.c_float, [ctypes.c_float]
    edges = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.0, 1e-45, 1e-40, 88.72, 88.73, -103.0, -103.5,
                      -104.0, 3.4e38], np.float32)
    want = np.array([fn(float(v)) for v in edges], np.float32)
    got = np.array([(expf.libm_logf if name == "logf" else expf.libm_expf)(v) for v in edges], np.float32)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


def test_a_path_is_chosen_by_name_and_a_bad_name_is_a_clear_error() -> None:
    chosen = isa.numerics("avx2")
    assert (chosen.path.name, chosen.chosen_by, chosen.exact) == ("avx2", "chosen", isa.host_path() == "avx2")
    with pytest.raises(GraphirError, match=r"unknown numerics path 'neon': expected one of avx512, avx2"):
        isa.numerics("neon")


def test_graphir_isa_sets_the_default_and_info_says_so() -> None:
    env = {**os.environ, "GRAPHIR_ISA": "avx2"}
    out = subprocess.run([sys.executable, "-m", "graphir", "info", "SmolLM2-135M"], env=env, capture_output=True,
                         text=True, check=True).stdout
    line = next(x for x in out.splitlines() if x.startswith("numerics "))
    assert line.startswith("numerics avx2 (llama.cpp's x86 AVX2 (+FMA, F16C) CPU build), set by GRAPHIR_ISA")
    bad = subprocess.run([sys.executable, "-m", "graphir", "info", "SmolLM2-135M"], capture_output=True, text=True,
                         env={**os.environ, "GRAPHIR_ISA": "sse2"})
    assert bad.returncode == 2
    assert bad.stderr == "graphir: error: GRAPHIR_ISA='sse2': expected one of avx512, avx2 or auto\n"


@pytest.mark.parametrize("core, split", [("znver4", True), ("znver5", True), ("sapphirerapids", False),
                                         ("x86-64", False)])
def test_a_native_build_for_a_zen_core_splits_fma_chains_and_a_named_build_does_not(monkeypatch, core, split):
    """GCC's -march=native on AMD's Zen cores tunes away FMAs whose sum carries over a loop (the IQ4_NL vec_dot's
    last odd block: test_requantized_iq4 against the native llama.cpp); the named builds (oracle_build.py: no
    -march=native) fuse them."""
    from llvmlite import binding

    monkeypatch.setattr(binding, "get_host_cpu_name", lambda: core)
    assert [isa.native_build(p).split_chains for p in isa.PATHS.values()] == [split] * len(isa.PATHS)
    assert not any(p.split_chains for p in isa.PATHS.values())


def test_system_info_names_the_build_path() -> None:
    avx512 = "CPU : SSE3 = 1 | AVX = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | AVX512 = 1 | LLAMAFILE = 1 |"
    avx2 = "CPU : SSE3 = 1 | AVX = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | BMI2 = 1 | AVX512 = 0 |"
    neon = "CPU : NEON = 1 | ARM_FMA = 1 | FP16_VA = 1 | DOTPROD = 1 | LLAMAFILE = 1 |"
    assert [isa.path_of_llama_cpp(s) for s in (avx512, avx2, neon)] == ["avx512", "avx2", None]


@pytest.mark.oracle
def test_the_detected_path_is_the_oracles() -> None:
    """What a user gets by default (detection, or GRAPHIR_ISA) is the path of the llama.cpp next to it; the
    oracle tests of this run assert bit-exactness exactly when this holds."""
    want = oracle_path()
    num = isa.numerics()
    if want is None:
        assert not num.exact, f"llama.cpp here takes a path graphir does not emulate, yet {num.describe()}"
        return
    assert num.path.name == want, (
        f"graphir runs its {num.path.name} path ({num.chosen_by}), but the llama.cpp it is compared with was "
        f"built for {want}: install llama-cpp-python from source on this machine (README), or set GRAPHIR_ISA")


SMOL_PROMPTS = ["<|im_start|>user\nWhat is 12 * 7?<|im_end|>\n<|im_start|>assistant\n",
                "Once upon a time, in a small village by the sea,", "Les étoiles brillent la nuit, et"]


@pytest.mark.oracle
def test_another_paths_numbers_differ_but_stay_within_the_documented_tolerance(smollm2_gguf: Path) -> None:
    """graphir on the path the oracle was not built for stands for a host graphir does not emulate: its
    logits are not llama.cpp's, and they stay within isa.APPROX, the tolerance the README states."""
    import llama_cpp

    here = oracle_path()
    if here is None:
        pytest.skip("the oracle's path is not emulated: every oracle test of this run checks isa.APPROX already")
    other = next(name for name in isa.PATHS if name != here)
    model = load(str(smollm2_gguf), isa=other)
    llm = llama_cpp.Llama(model_path=str(smollm2_gguf), n_ctx=256, n_batch=256, n_threads=2, logits_all=True,
                          verbose=False)
    worst, cos = 0.0, 1.0
    for prompt in SMOL_PROMPTS:
        ids = model.tokenize(prompt, parse_special=True)
        llm.reset()
        llm.eval(ids)
        ref = np.array(llm.scores[: len(ids)], np.float64)
        ctx = model.new_context(n_ctx=256)
        ctx.decode(Batch.from_tokens(ids, 0, outputs="all"))
        d, c = logit_distance(ctx.logits(), ref)
        worst, cos = max(worst, d), min(cos, c)
    assert worst > 0, f"the {other} and {here} paths gave the same logits: the prompts no longer tell them apart"
    assert worst <= isa.APPROX.logit_abs and cos >= isa.APPROX.logit_cos, (worst, cos)


# --- the AVX2 path against a llama.cpp built for AVX2 ---------------------------------------------------------

def _why_no_avx2_rerun() -> str | None:
    if os.environ.get("GRAPHIR_ISA"):
        return f"GRAPHIR_ISA={os.environ['GRAPHIR_ISA']}: this run already checks a chosen path"
    if isa.host_path() != "avx512":
        return f"host path {isa.host_path()}: the native oracle already is this host's only x86 path"
    return None


def _avx2_rerun() -> subprocess.CompletedProcess | None:
    """The oracle tests a CPU path can change, in a pytest of their own against llama.cpp built for AVX2, graphir on
    its AVX2 path (GRAPHIR_ISA, which also keeps the subprocess from running this test again); None where
    _why_no_avx2_rerun says why not. Beside the other tests (tests/apart.py): its own numba cache and basetemp."""
    if _why_no_avx2_rerun():
        return None
    from oracle_build import build

    env = apart.own_numba_cache({**os.environ, "LLAMA_CPP_LIB_PATH": str(build("avx2")), "GRAPHIR_ISA": "avx2"})
    return apart.run([sys.executable, "-m", "pytest", "-q", "-m", "oracle and not same_on_every_path",
                      "-p", "no:cacheprovider", "--basetemp", str(Path(apart.scratch("graphir-avx2-")) / "tmp"),
                      "--deselect", "tests/test_numerics.py::test_the_avx2_path_equals_a_llama_cpp_built_for_avx2"],
                     timeout=1800, cwd=ROOT, env=env)


@pytest.mark.oracle
@pytest.mark.apart(work=_avx2_rerun)
def test_the_avx2_path_equals_a_llama_cpp_built_for_avx2(apart_result: subprocess.CompletedProcess | None) -> None:
    """On a host whose native path is AVX-512 (AVX2 code runs there too), every oracle test whose result a CPU
    path can change runs again in a subprocess against llama.cpp built with only AVX2/FMA/F16C, graphir on its
    AVX2 path (graphs and tokenizers, the same on every path, are left out)."""
    reason = _why_no_avx2_rerun()
    if reason:
        pytest.skip(reason)
    run = apart_result
    tail = run.stdout.strip().splitlines()[-1] if run.stdout.strip() else run.stderr[-2000:]
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]
    passed = re.search(r"(\d+) passed", tail)
    assert passed and int(passed.group(1)) >= 100, tail
    assert not re.search(r"failed|error|skipped", tail), tail
