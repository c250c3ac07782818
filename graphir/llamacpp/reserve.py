"""The child process that asks llama.cpp for its graphs: ``python -m graphir.llamacpp.reserve REQUEST``.

llama.cpp aborts the whole process on some metadata it cannot build (a failed GGML_ASSERT), so it runs here,
apart from the caller, which reads either a JSON answer on stdout or the cause on stderr.

REQUEST is a JSON object: ``path`` (a GGUF whose tensor data llama.cpp never reads: weights are not allocated),
``n_ctx``, ``n_ubatch``, ``embeddings`` (a pooling model's context outputs pooled embeddings) and ``graphs`` (a
list of ``[n_tokens, n_seqs, n_outputs]``, one per graph wanted). The answer holds, per graph, every tensor the
graph reaches (leaves before their users) as a record of ggml's own fields, and the library's list of
architecture names (``archs``). Only the standard library and llama-cpp-python's bindings are imported here.
"""

from __future__ import annotations

import ctypes as C
import functools
import json
import os
import sys
from typing import Any

GGML_MAX_DIMS, GGML_MAX_SRC, GGML_MAX_OP_PARAMS, GGML_MAX_NAME = 4, 10, 64, 64
_LOG_ERROR, _LOG_CONT = 4, 5
_FLASH_ATTN_DISABLED = 0  # graphir's attention is the unfused product-softmax-product


class GGMLTensor(C.Structure):
    """ggml.h's struct ggml_tensor, field for field (read only)."""

    _fields_ = [("type", C.c_int), ("buffer", C.c_void_p), ("ne", C.c_int64 * GGML_MAX_DIMS),
                ("nb", C.c_size_t * GGML_MAX_DIMS), ("op", C.c_int),
                ("op_params", C.c_int32 * (GGML_MAX_OP_PARAMS // 4)), ("flags", C.c_int32),
                ("src", C.c_void_p * GGML_MAX_SRC), ("view_src", C.c_void_p), ("view_offs", C.c_size_t),
                ("data", C.c_void_p), ("name", C.c_char * GGML_MAX_NAME), ("extra", C.c_void_p),
                ("padding", C.c_char * 8)]


class Unusable(Exception):
    """llama.cpp refused the request; the message is its cause, said once."""


def _symbol(lib: C.CDLL, *names: str) -> Any:
    """The first of ``names`` the library exports (C++ functions are found by their mangled name)."""
    for name in names:
        try:
            return getattr(lib, name)
        except AttributeError:
            continue
    raise Unusable(f"the installed llama.cpp lacks {names[0]} (llama-cpp-python 0.3.36 or newer has it)")


def _bindings() -> Any:
    """llama-cpp-python's ctypes bindings (``llama_cpp.llama_cpp``) without the package's ``__init__``, which
    also loads its high-level API (numpy, jinja2): a quarter of a second of a reading that should take two."""
    import importlib.util
    import types

    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or not spec.submodule_search_locations:
        raise Unusable("llama-cpp-python is not installed")
    if "llama_cpp" not in sys.modules:
        package = types.ModuleType("llama_cpp")
        package.__path__ = list(spec.submodule_search_locations)
        sys.modules["llama_cpp"] = package
    import llama_cpp.llama_cpp

    return llama_cpp.llama_cpp


class Library:
    """The functions of libllama and libggml-base this reader calls, with their C signatures."""

    def __init__(self) -> None:
        bindings = _bindings()
        self.L = bindings
        llama = bindings._lib
        base = C.CDLL(os.path.join(bindings._base_path, "libggml-base.so"))  # beside the libllama it loaded
        self.reserve = _symbol(llama, "_Z19llama_graph_reserveP13llama_contextjjj", "llama_graph_reserve")
        self.reserve.restype, self.reserve.argtypes = C.c_void_p, [C.c_void_p, C.c_uint32, C.c_uint32, C.c_uint32]
        self.arch_name = _symbol(llama, "_Z13llm_arch_name8llm_arch")
        self.arch_name.restype, self.arch_name.argtypes = C.c_char_p, [C.c_int]
        for fn, res, args in (("ggml_graph_n_nodes", C.c_int, [C.c_void_p]),
                              ("ggml_graph_node", C.c_void_p, [C.c_void_p, C.c_int]),
                              ("ggml_op_name", C.c_char_p, [C.c_int]),
                              ("ggml_op_desc", C.c_char_p, [C.c_void_p]),
                              ("ggml_type_name", C.c_char_p, [C.c_int]),
                              ("ggml_get_name", C.c_char_p, [C.c_void_p]),
                              ("ggml_nelements", C.c_int64, [C.c_void_p])):
            f = _symbol(base, fn)
            f.restype, f.argtypes = res, args
            setattr(self, fn, f)
        if not hasattr(bindings.llama_model_params(), "no_alloc"):
            raise Unusable("the installed llama-cpp-python has no llama_model_params.no_alloc (0.3.36 or newer has it)")

    @functools.cache
    def op_name(self, op: int) -> str:
        return str(self.ggml_op_name(op).decode())

    @functools.cache
    def type_name(self, t: int) -> str:
        return str(self.ggml_type_name(t).decode().lower())

    def archs(self) -> list[str]:
        """Every architecture name the library knows, in its enum's order (up to its unknown marker)."""
        names = []
        for i in range(4096):
            name = self.arch_name(i).decode()
            if name in ("(unknown)", "unknown"):
                break
            names.append(name)
        return names


def _records(lib: Library, gf: int) -> list[list[Any]]:
    """Every tensor the graph reaches, leaves first where they are used: [name, op, desc, type, ne, nb,
    op_params, sources (indices into this list), flags, view_offs, address]. Addresses only order tensors by
    creation (a ggml context hands out memory in order): llama.cpp gives a sliding-window cache's inputs the
    names of the other cache's, and creates them second."""
    index: dict[int, int] = {}
    out: list[list[Any]] = []

    def visit(p: int) -> int:
        stack = [(p, False)]
        while stack:
            q, expanded = stack.pop()
            if q in index:
                continue
            t = GGMLTensor.from_address(q)
            srcs = [s for s in t.src if s and s != q]  # ggml_cast makes its result its own destination source
            if not expanded:
                stack.append((q, True))
                stack.extend((s, False) for s in reversed(srcs) if s not in index)
                continue
            index[q] = len(out)
            op = lib.op_name(t.op)
            out.append([t.name.decode("utf-8", "replace"), op,
                        lib.ggml_op_desc(q).decode() if op in ("UNARY", "GLU") else op, lib.type_name(t.type),
                        list(t.ne), list(t.nb), list(t.op_params), [index[s] for s in srcs], t.flags, t.view_offs, q])
        return index[p]

    for i in range(lib.ggml_graph_n_nodes(gf)):
        visit(lib.ggml_graph_node(gf, i))
    _check_layout(lib, lib.ggml_graph_node(gf, -1))
    return out


def _check_layout(lib: Library, p: int) -> None:
    """GGMLTensor reads ggml's struct by its layout: a ggml whose struct moved would give garbage, not an error.
    So one node is read both ways, through the struct and through ggml's own accessors."""
    t = GGMLTensor.from_address(p)
    n = 1
    for d in t.ne:
        n *= d
    if t.name != lib.ggml_get_name(p) or n != lib.ggml_nelements(p):
        raise Unusable("the installed ggml lays out its tensors otherwise than ggml.h of llama-cpp-python 0.3.36")


def run(request: dict[str, Any]) -> dict[str, Any]:
    lib = Library()
    L = lib.L
    errors: list[str] = []

    @L.llama_log_callback
    def log(level: int, text: bytes, _: Any) -> None:
        msg = text.decode("utf-8", "replace")
        if level == _LOG_ERROR:
            errors.append(msg)
        elif level == _LOG_CONT and errors:
            errors[-1] += msg

    L.llama_log_set(log, None)
    L.llama_backend_init()
    answer: dict[str, Any] = {"archs": lib.archs(), "graphs": []}
    if "path" not in request:
        return answer

    def refused(what: str) -> Unusable:
        cause = next((e.strip() for e in reversed(errors) if e.strip() and "failed to load model" not in e), "")
        return Unusable(cause or what)

    mp = L.llama_model_default_params()
    mp.no_alloc, mp.n_gpu_layers, mp.load_mode = True, 0, L.LLAMA_LOAD_MODE_NONE
    mp.use_extra_bufts = False  # repacking buffer types (AMX, ...) change where weights live, not the graph
    model = L.llama_model_load_from_file(os.fsencode(request["path"]), mp)
    if not model:
        raise refused("llama.cpp could not create the model")
    cp = L.llama_context_default_params()
    cp.n_ctx, cp.n_batch, cp.n_ubatch = request["n_ctx"], request["n_ubatch"], request["n_ubatch"]
    cp.n_seq_max, cp.flash_attn_type, cp.swa_full = 1, _FLASH_ATTN_DISABLED, False  # graphir's iswa: swa_full off
    cp.n_threads = cp.n_threads_batch = 1
    cp.embeddings = request["embeddings"]
    ctx = L.llama_init_from_model(model, cp)
    if not ctx:
        raise refused("llama.cpp could not create a context for the model")
    for n_tokens, n_seqs, n_outputs in request["graphs"]:
        gf = lib.reserve(ctx, n_tokens, n_seqs, n_outputs)
        if not gf:
            raise refused(f"llama.cpp could not build the graph of {n_tokens} tokens")
        answer["graphs"].append(_records(lib, gf))
    return answer


def main() -> int:
    try:
        answer = run(json.loads(sys.argv[1]))
    except Unusable as e:
        sys.stderr.write(f"graphir-llamacpp: {e}\n")
        return 2
    json.dump(answer, sys.stdout, separators=(",", ":"))
    sys.stdout.flush()
    os._exit(0)  # skip freeing llama.cpp's objects: the process ends here anyway


if __name__ == "__main__":
    sys.exit(main())
