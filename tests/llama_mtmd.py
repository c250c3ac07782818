"""llama.cpp's mtmd (libmtmd, bound by llama-cpp-python) as the towers' oracle: the images it encodes for a picture,
in prompt order, each with its rows and the patches its im2col made of the pixels.

mtmd needs a text model beside the tower (the width its rows must have, the vocabulary of the text around an image):
the tests pair their tiny towers with SmolLM2-135M's vocabulary (rows of 576). mtmd encodes with flash attention
where the CPU has it; graphir's towers compute clip's graph without it (as graphir's text models compute llama.cpp's
attention without it), so the oracle is asked for that graph unless a test says otherwise.
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

os.environ.setdefault("GGML_NO_BACKTRACE", "1")
import llama_cpp as L  # noqa: E402
import llama_cpp.mtmd_cpp as M  # noqa: E402
from llama_taps import _GGMLTensor, _quiet  # noqa: E402

from graphir.model.meta import open_model  # noqa: E402

_IMAGE_CHUNK = 1  # MTMD_INPUT_CHUNK_TYPE_IMAGE


@dataclass
class Encoded:
    """One image mtmd encoded: its rows [n_tokens, n_embd], and its patches as im2col laid them out [OH, OW, 3 P²]
    (float32 where the patch kernel is bf16, else f16: rounded)."""

    rows: np.ndarray
    patches: np.ndarray


def mtmd_encode(mmproj: Path, image: Path, text_model: Path, patch: int, flash_attn: bool = False) -> list[Encoded]:
    """Every image chunk of a prompt holding only ``image``'s marker, encoded by mtmd (2 threads, no warm-up)."""
    taps: list[np.ndarray] = []

    @L.ggml_backend_sched_eval_callback
    def callback(t: int, ask: bool, _: int) -> bool:
        tt = ctypes.cast(t, ctypes.POINTER(_GGMLTensor)).contents
        if not ask and tt.ne[0] == 3 * patch * patch and tt.type in (0, 1) and tt.nb[1] == tt.nb[0] * tt.ne[0]:
            kind = ctypes.c_float if tt.type == 0 else ctypes.c_uint16
            n = tt.ne[0] * tt.ne[1] * tt.ne[2]
            data = np.ctypeslib.as_array(ctypes.cast(tt.data, ctypes.POINTER(kind)), shape=(n,)).copy()
            data = data if tt.type == 0 else data.view(np.float16).astype(np.float32)
            taps.append(data.reshape(tt.ne[2], tt.ne[1], tt.ne[0]))
        return True

    L.llama_log_set(_quiet, None)
    M.mtmd_log_set(_quiet, None)
    L.llama_backend_init()
    params = L.llama_model_default_params()
    params.vocab_only = True
    model = L.llama_model_load_from_file(str(text_model).encode(), params)
    cp = M.mtmd_context_params_default()
    cp.use_gpu, cp.n_threads, cp.print_timings, cp.warmup = False, 2, False, False
    cp.flash_attn_type = 1 if flash_attn else 0
    cp.cb_eval = callback
    ctx = M.mtmd_init_from_file(str(mmproj).encode(), model, cp)
    if not ctx:
        L.llama_model_free(model)
        raise RuntimeError(f"mtmd cannot load {mmproj}")
    chunks = M.mtmd_input_chunks_init()
    bitmap = M.mtmd_helper_bitmap_init_from_file(ctx, str(image).encode(), False)
    try:
        if not bitmap:
            raise RuntimeError(f"mtmd cannot read {image}")
        marker = M.mtmd_default_marker()
        text = M.mtmd_input_text(text=marker, text_len=len(marker), add_special=False, parse_special=True)
        if M.mtmd_tokenize(ctx, chunks, ctypes.byref(text), (ctypes.c_void_p * 1)(bitmap), 1) != 0:
            raise RuntimeError(f"mtmd cannot tokenize {image}")
        out = []
        n_embd = open_model(str(text_model)).arch.hp.n_embd  # the rows' width (a vocab-only model reports none)
        for i in range(M.mtmd_input_chunks_size(chunks)):
            chunk = M.mtmd_input_chunks_get(chunks, i)
            if M.mtmd_input_chunk_get_type(chunk) != _IMAGE_CHUNK:
                continue
            taps.clear()
            if M.mtmd_encode_chunk(ctx, chunk) != 0:
                raise RuntimeError(f"mtmd cannot encode chunk {i} of {image}")
            n = M.mtmd_input_chunk_get_n_tokens(chunk)
            rows = np.ctypeslib.as_array(M.mtmd_get_output_embd(ctx), shape=(n * n_embd,)).reshape(n, n_embd).copy()
            out.append(Encoded(rows, taps[0]))
        return out
    finally:
        if bitmap:
            M.mtmd_bitmap_free(bitmap)
        M.mtmd_input_chunks_free(chunks)
        M.mtmd_free(ctx)
        L.llama_model_free(model)
