"""llama.cpp oracles built for a chosen CPU path instead of the host's native one.

The installed llama-cpp-python is built with -march=native, so on an AVX-512 host it only ever shows the
AVX-512 path. To check graphir's AVX2 path there too, this builds the llama.cpp that llama-cpp-python vendors
(the very sources of the installed version, from its sdist) with the AVX2 flags only, once, into a cache
folder; llama-cpp-python loads it instead of its own library when LLAMA_CPP_LIB_PATH points there (before
it is imported: a process holds one libllama). Only ggml's CPU backend is built, where every CPU path's numbers
are made (under a minute on two cores); beside it go the installed llama-cpp-python's other libraries (libllama,
libggml, libggml-base, libmtmd), which are the same sources compiled without CPU-specific code, so a fresh machine
spends no time building libllama a second time.

The same serves CPUs with AMX: a native build there routes quantized matmuls to llama.cpp's AMX kernels,
which crash on the first decode (llama.cpp issue #20824), so the tests use an AVX-512 build without AMX,
with every other AVX-512 extension the host has, as llama.cpp on any other AVX-512 CPU runs.

    python3 tests/oracle_build.py avx2      # build (or find) it and print the folder
    python3 tests/oracle_build.py avx512 llama-server   # llama.cpp's server too, for bench/bench_serve.py
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

# cmake options per path: no -march=native, the instruction sets a native build on such a CPU enables
_AVX2 = ["-DGGML_NATIVE=OFF", "-DGGML_AVX=ON", "-DGGML_AVX2=ON", "-DGGML_FMA=ON", "-DGGML_F16C=ON", "-DGGML_BMI2=ON"]
PATH_FLAGS: dict[str, list[str]] = {"avx2": _AVX2, "avx512": [*_AVX2, "-DGGML_AVX512=ON"]}
# the AVX-512 path's optional extensions, each enabled when the host has it (LLVM's feature name -> option)
AVX512_EXTRAS = {"avx512vbmi": "-DGGML_AVX512_VBMI=ON", "avx512vnni": "-DGGML_AVX512_VNNI=ON",
                 "avx512bf16": "-DGGML_AVX512_BF16=ON", "avxvnni": "-DGGML_AVX_VNNI=ON"}


def flags(path: str) -> list[str]:
    if path != "avx512":
        return PATH_FLAGS[path]
    from graphir.backends.numba.primitives.isa import host_features

    return [*PATH_FLAGS[path], *(f for feat, f in AVX512_EXTRAS.items() if feat in host_features())]
COMMON_FLAGS = ["-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=ON", "-DLLAMA_BUILD_TESTS=OFF",
                "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_TOOLS=OFF", "-DLLAMA_BUILD_SERVER=OFF",
                "-DLLAMA_BUILD_COMMON=OFF", "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF",
                "-DCMAKE_BUILD_RPATH_USE_ORIGIN=ON"]     # the libraries find each other wherever they are copied


def cache_root() -> Path:
    return Path(os.environ.get("GRAPHIR_ORACLE_CACHE") or Path.home() / ".cache" / "graphir" / "oracles")


def llama_cpp_version() -> str:
    from importlib.metadata import version

    return version("llama_cpp_python")


# what is built: the library the oracles load, or llama.cpp's server (bench/bench_serve.py), with the options
# that enable it and the file that marks a finished build
TARGETS: dict[str, tuple[list[str], str]] = {
    "llama": ([], "libllama.so"),
    "llama-server": (["-DLLAMA_BUILD_TOOLS=ON", "-DLLAMA_BUILD_SERVER=ON", "-DLLAMA_BUILD_COMMON=ON"], "llama-server"),
}
CPU_BACKEND = "ggml-cpu"  # what target "llama" compiles: the rest comes from the installed package (module docstring)


def installed_libraries() -> Path:
    """The folder of the installed llama-cpp-python's shared libraries, found without importing it (importing loads
    libllama, which LLAMA_CPP_LIB_PATH must precede)."""
    import importlib.util

    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("llama-cpp-python is not installed: the oracle builds start from its libraries")
    return Path(next(iter(spec.submodule_search_locations))) / "lib"


def build(path: str, log=sys.stderr, target: str = "llama") -> Path:
    """The folder holding libllama.so (and, for target llama-server, that program) built for `path` (a
    PATH_FLAGS key), building it if it is not cached."""
    if path not in PATH_FLAGS:
        raise ValueError(f"no build flags for path {path!r}; known: {', '.join(PATH_FLAGS)}")
    version = llama_cpp_version()
    root = cache_root()
    extra, made = TARGETS[target]
    options = [*COMMON_FLAGS, *flags(path), *extra]  # later options win: a target's enable what COMMON_FLAGS disable
    built = CPU_BACKEND if target == "llama" else target
    key = hashlib.sha256(" ".join([*options, built]).encode()).hexdigest()[:8]
    out = root / f"llama-cpp-python-{version}-{path}-{key}"
    done = out / "bin" / made
    if done.exists():
        return done.parent
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f".{out.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)            # one build at a time, even from parallel test processes
        if done.exists():
            return done.parent
        cmake = shutil.which("cmake")
        if cmake is None:
            raise RuntimeError("cmake is needed to build llama.cpp for another CPU path (apt-get install cmake)")
        with tempfile.TemporaryDirectory(prefix="graphir-oracle-") as tmp:
            subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                            "-d", tmp, f"llama-cpp-python=={version}"], check=True, stdout=log, stderr=log)
            sdist = next(Path(tmp).glob("llama_cpp_python-*.tar.gz"))
            unpack(sdist, Path(tmp))
            src = next(Path(tmp).glob("llama_cpp_python-*/vendor/llama.cpp"))
            work = Path(tmp) / "build"
            subprocess.run([cmake, "-S", str(src), "-B", str(work), *options], check=True, stdout=log, stderr=log)
            subprocess.run([cmake, "--build", str(work), "--target", built, "-j", str(os.cpu_count() or 2)],
                           check=True, stdout=log, stderr=log)
            wanted = f"lib{CPU_BACKEND}.so" if built == CPU_BACKEND else made
            if not (work / "bin" / wanted).exists():
                raise RuntimeError(f"the build in {work} gave no bin/{wanted}")
            staging = out.with_name(out.name + ".partial")    # only the libraries (and the program) are kept
            shutil.rmtree(staging, ignore_errors=True)
            (staging / "bin").mkdir(parents=True)
            libraries = list((work / "bin").glob("lib*.so*"))
            if built == CPU_BACKEND:  # the installed libraries, their CPU backend replaced by this build's
                libraries = [*installed_libraries().glob("lib*.so*"),
                             *(f for f in libraries if f.name.startswith(f"lib{CPU_BACKEND}.so"))]
            else:
                libraries.append(work / "bin" / made)
            for f in libraries:
                (staging / "bin" / f.name).unlink(missing_ok=True)  # a later file replaces one of its name
                shutil.copy2(f, staging / "bin" / f.name, follow_symlinks=False)
            staging.rename(out)
    return done.parent


def unpack(sdist: Path, into: Path) -> None:
    """Unpack the sdist, refusing members that would land outside ``into``: Python before 3.11.4 (Debian 12's
    3.11.2) has no ``filter=`` argument, so the check it would make is made here."""
    with tarfile.open(sdist) as tar:
        if hasattr(tarfile, "data_filter"):
            tar.extractall(into, filter="data")
            return
        root = into.resolve()
        for member in tar.getmembers():
            target = (into / member.name).resolve()
            if root not in target.parents or member.issym() or member.islnk() or member.isdev():
                raise RuntimeError(f"{sdist.name}: member {member.name!r} is not a plain file inside the archive")
        tar.extractall(into)


if __name__ == "__main__":  # python3 tests/oracle_build.py [PATH [TARGET]]
    print(build(sys.argv[1] if len(sys.argv) > 1 else "avx2", target=sys.argv[2] if len(sys.argv) > 2 else "llama"))
