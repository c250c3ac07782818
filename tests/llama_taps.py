"""llama.cpp's intermediate tensors, through its eval callback: the oracle for node-by-node comparisons.

llama-cpp-python exposes the callback but not ggml's tensor struct, so the struct's leading fields are
declared here (ggml.h's layout, stable across recent releases). Only contiguous f32 tensors are kept.
"""

from __future__ import annotations

import ctypes
import os

import numpy as np

os.environ.setdefault("GGML_NO_BACKTRACE", "1")
import llama_cpp as L  # noqa: E402


class _GGMLTensor(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("buffer", ctypes.c_void_p), ("ne", ctypes.c_int64 * 4),
                ("nb", ctypes.c_size_t * 4), ("op", ctypes.c_int), ("op_params", ctypes.c_int32 * 16),
                ("flags", ctypes.c_int32), ("src", ctypes.c_void_p * 10), ("view_src", ctypes.c_void_p),
                ("view_offs", ctypes.c_size_t), ("data", ctypes.c_void_p), ("name", ctypes.c_char * 64)]


_I32 = 26  # GGML_TYPE_I32


@L.llama_log_callback
def _quiet(level: int, text: bytes, user_data: int) -> None:  # module-level: the C side keeps the pointer
    pass


def llama_cpp_taps(path: str, tokens: list[int], cache_type: int = 1, ints: bool = False,
                   first: bool = False) -> dict[str, np.ndarray]:
    """Decode ``tokens`` in one batch (no flash attention, KV cache of ggml type cache_type: 1 = f16, 0 = f32)
    and return every contiguous f32 tensor by llama.cpp's name (``attn_norm-3``, ``result_output``, ...), the
    last of a name computed twice, or with ``first`` the first (GroveMoE's two mixtures name their nodes alike);
    ``ints``: the contiguous i32 ones too (``ffn_moe_argsort-1``: each token's experts, best first)."""
    got: dict[str, np.ndarray] = {}

    @L.ggml_backend_sched_eval_callback
    def callback(t: int, ask: bool, _: int) -> bool:
        tt = ctypes.cast(t, ctypes.POINTER(_GGMLTensor)).contents
        kind = {0: ctypes.c_float, **({_I32: ctypes.c_int32} if ints else {})}.get(tt.type)
        if not ask and kind and tt.nb[0] == 4 and tt.nb[1] == 4 * tt.ne[0] and tt.nb[2] == tt.nb[1] * tt.ne[1]:
            n = tt.ne[0] * tt.ne[1] * tt.ne[2] * tt.ne[3]
            data = np.ctypeslib.as_array(ctypes.cast(tt.data, ctypes.POINTER(kind)), shape=(n,))
            name = tt.name.decode()
            if not (first and name in got):
                got[name] = data.reshape(tt.ne[3], tt.ne[2], tt.ne[1], tt.ne[0]).squeeze().copy()
        return True

    L.llama_log_set(_quiet, None)
    L.llama_backend_init()
    model = L.llama_model_load_from_file(path.encode(), L.llama_model_default_params())
    params = L.llama_context_default_params()
    params.n_ctx, params.n_threads, params.n_threads_batch = 256, 2, 2
    params.cb_eval, params.type_k, params.type_v, params.flash_attn_type = callback, cache_type, cache_type, 0
    ctx = L.llama_init_from_model(model, params)
    try:
        ids = (L.llama_token * len(tokens))(*tokens)  # kept alive until decode has read it
        batch = L.llama_batch_get_one(ids, len(tokens))
        if L.llama_decode(ctx, batch) != 0:
            raise RuntimeError("llama_decode failed")
    finally:
        L.llama_free(ctx)
        L.llama_model_free(model)
    return got
