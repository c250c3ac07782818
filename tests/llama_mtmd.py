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
from typing import Any

import numpy as np

os.environ.setdefault("GGML_NO_BACKTRACE", "1")
import llama_cpp as L  # noqa: E402
import llama_cpp.mtmd_cpp as M  # noqa: E402
from llama_taps import _GGMLTensor, _quiet  # noqa: E402

from graphir.model.meta import open_model  # noqa: E402

_IMAGE_CHUNK = 1  # MTMD_INPUT_CHUNK_TYPE_IMAGE
_MEDIA_CHUNKS = (_IMAGE_CHUNK, 2)  # and MTMD_INPUT_CHUNK_TYPE_AUDIO: chunks of rows


@dataclass
class Encoded:
    """One image mtmd encoded: its rows [n_tokens, n_embd], and its patches as im2col laid them out [OH, OW, 3 P²]
    (float32 where the patch kernel is bf16, else f16: rounded)."""

    rows: np.ndarray
    patches: np.ndarray


class Mtmd:
    """An mtmd context over an mmproj file beside a text model (2 threads, no warm-up); ``generate`` also makes a
    llama context of the text model (an f16 cache, no flash attention: llama-cpp-python's defaults)."""

    def __init__(self, mmproj: Path, text_model: Path, patch: int = 14, flash_attn: bool = False,
                 vocab_only: bool = True, window: int = 0, n_embd: int = 0):
        """``window``: the length of the im2col rows to keep (3 P² by default: a patch; an audio tower's first
        convolution's: 3 n_mel); ``n_embd``: the rows' width where it is not the text model's (clip's
        n_mmproj_embd: Qwen3-VL's rows hold each deepstack merger's beside the main merger's)."""
        self.taps: list[np.ndarray] = []
        window = window or 3 * patch * patch

        @L.ggml_backend_sched_eval_callback
        def callback(t: int, ask: bool, _: int) -> bool:  # ggml's im2col of the patches: [3 P², OW, OH]
            tt = ctypes.cast(t, ctypes.POINTER(_GGMLTensor)).contents
            if not ask and tt.ne[0] == window and tt.type in (0, 1) and tt.nb[1] == tt.nb[0] * tt.ne[0]:
                kind = ctypes.c_float if tt.type == 0 else ctypes.c_uint16
                n = tt.ne[0] * tt.ne[1] * tt.ne[2]
                data = np.ctypeslib.as_array(ctypes.cast(tt.data, ctypes.POINTER(kind)), shape=(n,)).copy()
                data = data if tt.type == 0 else data.view(np.float16).astype(np.float32)
                self.taps.append(data.reshape(tt.ne[2], tt.ne[1], tt.ne[0]))
            return True

        self._callback = callback  # kept alive as long as the context
        L.llama_log_set(_quiet, None)
        M.mtmd_log_set(_quiet, None)
        L.llama_backend_init()
        params = L.llama_model_default_params()
        params.vocab_only = vocab_only
        self.model = L.llama_model_load_from_file(str(text_model).encode(), params)
        # the rows' width (a vocab-only model has none)
        self.n_embd = n_embd or open_model(str(text_model)).arch.hp.n_embd
        cp = M.mtmd_context_params_default()
        cp.use_gpu, cp.n_threads, cp.print_timings, cp.warmup = False, 2, False, False
        cp.flash_attn_type = 1 if flash_attn else 0
        cp.cb_eval = callback
        self.ctx = M.mtmd_init_from_file(str(mmproj).encode(), self.model, cp)
        if not self.ctx:
            L.llama_model_free(self.model)
            raise RuntimeError(f"mtmd cannot load {mmproj}")

    def close(self) -> None:
        M.mtmd_free(self.ctx)
        L.llama_model_free(self.model)

    def chunks(self, prompt: str, images: list[Path]) -> Any:
        """mtmd_tokenize of the prompt and the images (a chunks handle; free with mtmd_input_chunks_free)."""
        bitmaps = [M.mtmd_helper_bitmap_init_from_file(self.ctx, str(p).encode(), False) for p in images]
        try:
            if not all(bitmaps):
                raise RuntimeError(f"mtmd cannot read {images}")
            chunks = M.mtmd_input_chunks_init()
            text = M.mtmd_input_text(text=prompt.encode(), text_len=len(prompt.encode()), add_special=True,
                                     parse_special=True)
            if M.mtmd_tokenize(self.ctx, chunks, ctypes.byref(text), (ctypes.c_void_p * len(bitmaps))(*bitmaps),
                               len(bitmaps)) != 0:
                M.mtmd_input_chunks_free(chunks)
                raise RuntimeError(f"mtmd cannot tokenize {prompt!r}")
            return chunks
        finally:
            for b in bitmaps:
                if b:
                    M.mtmd_bitmap_free(b)

    def layout(self, chunks: Any) -> list[tuple[int, ...] | int]:
        """Each chunk: its text tokens, or an image's row count."""
        out: list[tuple[int, ...] | int] = []
        for i in range(M.mtmd_input_chunks_size(chunks)):
            chunk = M.mtmd_input_chunks_get(chunks, i)
            if M.mtmd_input_chunk_get_type(chunk) in _MEDIA_CHUNKS:
                out.append(int(M.mtmd_input_chunk_get_n_tokens(chunk)))
            else:
                n = ctypes.c_ulong(0)
                ids = M.mtmd_input_chunk_get_tokens_text(chunk, ctypes.byref(n))
                out.append(tuple(ids[j] for j in range(n.value)))
        return out

    def encode(self, image: Path) -> list[Encoded]:
        """Every image (or audio) chunk of a prompt holding only ``image``'s marker, encoded."""
        chunks = self.chunks(M.mtmd_default_marker().decode(), [image])
        try:
            out = []
            for i in range(M.mtmd_input_chunks_size(chunks)):
                chunk = M.mtmd_input_chunks_get(chunks, i)
                if M.mtmd_input_chunk_get_type(chunk) not in _MEDIA_CHUNKS:
                    continue
                self.taps.clear()
                if M.mtmd_encode_chunk(self.ctx, chunk) != 0:
                    raise RuntimeError(f"mtmd cannot encode chunk {i} of {image}")
                n = M.mtmd_input_chunk_get_n_tokens(chunk)
                rows = np.ctypeslib.as_array(M.mtmd_get_output_embd(self.ctx), shape=(n * self.n_embd,))
                out.append(Encoded(rows.reshape(n, self.n_embd).copy(), self.taps[0]))
            return out
        finally:
            M.mtmd_input_chunks_free(chunks)

    def samples(self, audio: Path) -> np.ndarray:
        """The float32 mono samples mtmd's helper decodes from an audio file (miniaudio, at the tower's rate)."""
        bitmap = M.mtmd_helper_bitmap_init_from_file(self.ctx, str(audio).encode(), False)
        if not bitmap:
            raise RuntimeError(f"mtmd cannot read {audio}")
        try:
            n = M.mtmd_bitmap_get_n_bytes(bitmap)
            data = ctypes.cast(M.mtmd_bitmap_get_data(bitmap), ctypes.POINTER(ctypes.c_float))
            return np.ctypeslib.as_array(data, shape=(n // 4,)).copy()
        finally:
            M.mtmd_bitmap_free(bitmap)

    def generate(self, prompt: str, images: list[Path], n_predict: int, n_ctx: int = 1024,
                 n_batch: int = 512) -> tuple[list[tuple[int, ...] | int], np.ndarray, list[int]]:
        """The prompt's layout, the logits after it, and the tokens llama.cpp chooses greedily from there
        (mtmd_helper_eval_chunks, then one token at a time; needs a model loaded with weights)."""
        params = L.llama_context_default_params()
        params.n_ctx, params.n_batch, params.n_ubatch, params.n_threads, params.n_threads_batch = \
            n_ctx, n_batch, n_batch, 2, 2
        params.flash_attn_type = 0
        lctx = L.llama_init_from_model(self.model, params)
        chunks = self.chunks(prompt, images)
        try:
            n_past = ctypes.c_int(0)
            if M.mtmd_helper_eval_chunks(self.ctx, lctx, chunks, 0, 0, n_batch, True, ctypes.byref(n_past)) != 0:
                raise RuntimeError("mtmd_helper_eval_chunks failed")
            n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(self.model))
            first = np.ctypeslib.as_array(L.llama_get_logits_ith(lctx, -1), shape=(n_vocab,)).copy()
            out: list[int] = []
            for _ in range(n_predict):
                logits = np.ctypeslib.as_array(L.llama_get_logits_ith(lctx, -1), shape=(n_vocab,))
                out.append(int(np.argmax(logits)))
                ids = (L.llama_token * 1)(out[-1])
                if L.llama_decode(lctx, L.llama_batch_get_one(ids, 1)) != 0:
                    raise RuntimeError("llama_decode failed")
            return self.layout(chunks), first, out
        finally:
            M.mtmd_input_chunks_free(chunks)
            L.llama_free(lctx)


def mtmd_generate(mmproj: Path, text_model: Path, prompt: str, media: list[Path], n_predict: int,
                  **kwargs: Any) -> tuple[list[tuple[int, ...] | int], np.ndarray, list[int]]:
    """Mtmd.generate on a context of its own (the text model loaded with its weights), closed after."""
    m = Mtmd(mmproj, text_model, vocab_only=False)
    try:
        return m.generate(prompt, media, n_predict, **kwargs)
    finally:
        m.close()


def mtmd_encode(mmproj: Path, image: Path, text_model: Path, patch: int, flash_attn: bool = False,
                n_embd: int = 0) -> list[Encoded]:
    """Every image chunk of a prompt holding only ``image``'s marker, encoded by mtmd (rows ``n_embd`` wide where
    not the text model's)."""
    m = Mtmd(mmproj, text_model, patch, flash_attn, n_embd=n_embd)
    try:
        return m.encode(image)
    finally:
        m.close()
