"""Which llama.cpp CPU path the kernels reproduce, as data.

llama.cpp is built for the CPU it runs on (GGML_NATIVE), and its x86 builds differ in the last bits: the
AVX-512 build sums in 16-lane registers and reduces them with `_mm512_reduce_add_ps`, the AVX2 build in 8-lane
registers, reduced by `_mm_hadd_ps` where `GGML_F32_VEC_REDUCE` is used, and the two builds carry different
`ggml_v_expf` approximations. To give the numbers of the llama.cpp next to it, graphir detects the host once
and its kernels take that path's parameters (`IsaPath`); every other step (the quantized dot products, the
activation quantizers, tinyBLAS's per-element FMA order, RoPE, rms_norm) is the same on both paths.

`GRAPHIR_ISA=avx2` (or `avx512`) picks a path by hand, e.g. to reproduce another machine's results. A host
whose llama.cpp takes a path not listed here (ARM NEON, x86 without AVX2) runs the AVX2 path's arithmetic:
its results are then within `APPROX` of that host's llama.cpp, not equal to them.
"""

from __future__ import annotations

import functools
import os
import platform
import re
from dataclasses import dataclass, replace

from graphir.errors import GraphirError

__all__ = ["APPROX", "IsaPath", "Numerics", "PATHS", "host_path", "native_build", "numerics", "path_of_llama_cpp"]

# ggml_v_expf variants (vec.h)
EXPF_SCALEF = 0     # AVX-512: degree-5 polynomial ending in fma(c1, b, 1), then _mm512_scalef_ps(j, n)
EXPF_SPLIT = 1      # AVX2 (and NEON): polynomial without the 1, k + k*j, 2^n split in two factors when |n| > 126
# the last step of GGML_F32_VEC_REDUCE / GGML_F16_VEC_REDUCE, once the accumulators are added into one register
REDUCE_HALVES = 0   # _mm512_reduce_add_ps: high half onto low, down to one lane
REDUCE_HADD = 1     # AVX: 256 -> 128 bits, then _mm_hadd_ps twice (adjacent lanes)



@dataclass(frozen=True)
class Approx:
    """How far graphir's numbers may be from a llama.cpp whose path it does not reproduce, as measured between
    its two emulated paths (graphir's AVX2 path against llama.cpp's AVX-512 build) on SmolLM2-135M Q4_1, with
    a margin: one flipped rounding is amplified by the 8-bit activation quantization of the next layers."""

    logit_abs: float    # max |logit difference| at any prompt position (measured: 1.33 over 5 prompts)
    logit_cos: float    # min cosine similarity of two positions' logit vectors (measured: 0.9961)
    rel: float          # max |difference| of an intermediate over max |value| (measured: 3.0e-7 on 5 tokens)


APPROX = Approx(logit_abs=2.0, logit_cos=0.99, rel=1e-5)


@dataclass(frozen=True)
class IsaPath:
    """The parameters of one llama.cpp x86 CPU build that change results.

    lanes: float32 lanes of one register in ggml's vector loops (silu, swiglu, soft_max, norm's variance,
        vec_dot_f16/f32 with 4 registers per step) and tinyBLAS's k-step (tinyBLAS runs when k % lanes == 0).
    reduce: the final horizontal sum of GGML_F32_VEC_REDUCE (REDUCE_*); single-register sums (soft_max's and
        the variance's per-block sums, tinyBLAS's hsum) halve down to one lane on both paths.
    expf: the ggml_v_expf variant (EXPF_*) that soft_max and SiLU use.
    requires: the CPU features a native llama.cpp build needs to take this path (LLVM's names).
    ggml_features: the features llama.cpp's system info reports as 1 for a build of this path (the most
        specific path whose features all show is the build's).
    repacked: weight types this path's llama.cpp moves into its REPACK buffer where a 2-D matrix's rows come in
        eights (ggml-cpu repack.cpp), whose interleaved kernels sum in their own order; graphir's products take
        that order there (quant.weight).
    split_chains: the build computes ``s += a * b`` whose s carries from one loop iteration to the next as a
        multiply, then an add, not one FMA: GCC tuned for AMD's Zen cores (what -march=native picks there) avoids
        such FMA chains; a build for a named path (GGML_NATIVE=OFF, generic tuning) and one for an Intel core fuse
        them. Of the kernels graphir reproduces, IQ4_NL's vec_dot takes it (its last, odd block). A PATHS entry is
        the named build; the host's own path is its native build's (native_build).
    tinyBLAS's tile shapes (4x6 with 32 vector registers, 4x3 with 16) are not listed: they change which
    outputs a task computes, not the order in which any one output is summed.
    """

    name: str
    lanes: int
    reduce: int
    expf: int
    requires: tuple[str, ...]
    ggml_features: tuple[str, ...]
    repacked: tuple[str, ...]
    describes: str
    split_chains: bool = False


PATHS: dict[str, IsaPath] = {p.name: p for p in (
    IsaPath("avx512", 16, REDUCE_HALVES, EXPF_SCALEF, ("avx512f", "avx512dq"), ("AVX512",),
            ("Q4_0", "Q4_K", "Q2_K", "IQ4_NL", "MXFP4"), "llama.cpp's x86 AVX-512 CPU build"),
    IsaPath("avx2", 8, REDUCE_HADD, EXPF_SPLIT, ("avx2", "fma", "f16c"), ("AVX2", "FMA", "F16C"),
            ("Q4_0", "Q4_K", "IQ4_NL", "MXFP4"), "llama.cpp's x86 AVX2 (+FMA, F16C) CPU build"),
)}


@dataclass(frozen=True)
class Numerics:
    """The path in use and whether it is the host's own llama.cpp path (exact) or an approximation of it."""

    path: IsaPath
    host: str           # the host's llama.cpp path as detected: a PATHS name, or a description of the CPU
    exact: bool         # path is what a native llama.cpp build on this host computes
    chosen_by: str      # "detected", "GRAPHIR_ISA" or "chosen" (by the caller)

    def describe(self) -> str:
        by = {"detected": "detected", "GRAPHIR_ISA": "set by GRAPHIR_ISA", "chosen": "chosen"}[self.chosen_by]
        head = f"{self.path.name} ({self.path.describes}), {by}"
        near = f"logits within {APPROX.logit_abs} (cosine >= {APPROX.logit_cos}) of"
        if not self.exact and self.host in PATHS:
            return (f"{head}; a native llama.cpp here takes {self.host}: bit-exact with a llama.cpp built for "
                    f"{self.path.name}, {near} the native one")
        if not self.exact:
            return f"{head}; this host's llama.cpp path ({self.host}) is not reproduced: {near} it"
        amx = ("; llama.cpp's AMX kernels are not reproduced: the numbers are a build's without AMX (README)"
               if self.path.name == "avx512" and "amx-int8" in host_features() else "")
        return f"{head}: bit-exact with this host's llama.cpp where the README's numerics section says so{amx}"


@functools.cache
def host_features() -> frozenset[str]:
    """The host CPU's features as LLVM names them (what numba compiles for)."""
    from llvmlite import binding

    return frozenset(k for k, v in binding.get_host_cpu_features().items() if v)


def path_of_llama_cpp(system_info: str) -> str | None:
    """The PATHS name of the llama.cpp build whose `llama_print_system_info()` this is, or None for a build
    whose path is not emulated (e.g. ARM, or x86 without AVX2)."""
    on = set(re.findall(r"(\w+) = 1", system_info))
    for p in PATHS.values():                    # most specific first
        if all(f in on for f in p.ggml_features):
            return p.name
    return None


def host_path() -> str:
    """The PATHS name a native llama.cpp build takes on this host, or a description of a host it does not list."""
    machine = platform.machine().lower()
    if machine not in ("x86_64", "amd64", "i686", "i386"):
        return f"{machine} (not an x86 path)"
    feats = host_features()
    for p in PATHS.values():
        if all(f in feats for f in p.requires):
            return p.name
    return "x86 without AVX2+FMA+F16C"


def native_build(path: IsaPath) -> IsaPath:
    """``path`` as a native build on this host computes it: with split_chains where GCC tunes for the host's core
    as for AMD's Zen (LLVM names those cores znver1, znver2, ...)."""
    from llvmlite import binding

    return replace(path, split_chains=True) if binding.get_host_cpu_name().startswith("znver") else path


def numerics(name: str | None = None) -> Numerics:
    """The path to run: `name` if given, else GRAPHIR_ISA if set, else the host's (detected once per process)."""
    if name is None:
        return _default()
    key = name.strip().lower()
    if key not in PATHS:
        raise GraphirError(f"unknown numerics path {name!r}: expected one of {', '.join(PATHS)}")
    host = host_path()
    return Numerics(native_build(PATHS[key]) if key == host else PATHS[key], host, key == host, "chosen")


@functools.cache
def _default() -> Numerics:
    host = host_path()
    forced = os.environ.get("GRAPHIR_ISA", "").strip().lower()
    if forced and forced != "auto":
        if forced not in PATHS:
            raise GraphirError(f"GRAPHIR_ISA={forced!r}: expected one of {', '.join(PATHS)} or auto")
        return Numerics(native_build(PATHS[forced]) if forced == host else PATHS[forced], host, forced == host,
                        "GRAPHIR_ISA")
    if host in PATHS:
        return Numerics(native_build(PATHS[host]), host, True, "detected")
    return Numerics(PATHS["avx2"], host, False, "detected")
