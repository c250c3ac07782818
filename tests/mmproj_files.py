"""Tiny mmproj files: a tower's keys and every tensor clip.cpp's loader reads for it, random weights seeded by name.

The keys are what convert_hf_to_gguf writes for the projector (general.architecture ``clip``, the projector type,
the ``clip.vision.*`` sizes, an image's mean and deviation); the sizes are small enough to write in a millisecond.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import gguf
import numpy as np

from graphir.arch.whisper import WHISPER_TENSORS
from graphir.convert import add_key
from graphir.model.meta import from_preset
from graphir.model.presets import Preset

V, C = gguf.Keys.ClipVision, gguf.Keys.Clip
Q = gguf.GGMLQuantizationType

# A 56-pixel image of 14-pixel patches (a 4 x 4 grid), 32 wide, 4 heads, 2 layers; rows of 576, SmolLM2-135M's
# width (the text model tests/llama_mtmd.py pairs a tower with)
TINY_VISION: dict[str, object] = {
    gguf.Keys.General.ARCHITECTURE: "clip", C.HAS_VISION_ENCODER: True, V.USE_GELU: True,
    V.EMBEDDING_LENGTH: 32, V.BLOCK_COUNT: 2, V.Attention.HEAD_COUNT: 4, V.FEED_FORWARD_LENGTH: 64,
    V.Attention.LAYERNORM_EPS: 1e-6, V.IMAGE_SIZE: 56, V.PATCH_SIZE: 14, V.PROJECTION_DIM: 576,
    V.IMAGE_MEAN: [0.5, 0.5, 0.5], V.IMAGE_STD: [0.5, 0.5, 0.5], V.Projector.SCALE_FACTOR: 2,
}
# what a projector's conversion writes beyond those: Idefics3's longest edge (tiles of 2 x 2 images at most);
# LLaVA's CLIP (GELU's sigmoid approximation, CLIP's mean and deviation, anyres on pinpoints of 1 x 2, 2 x 1 and
# 2 x 2 tiles)
TINY_EXTRA: dict[str, dict[str, object]] = {
    "idefics3": {V.PREPROC_IMAGE_SIZE: 112},
    "mlp": {V.USE_GELU: None, V.IMAGE_MEAN: [0.48145466, 0.4578275, 0.40821073],
            V.IMAGE_STD: [0.26862954, 0.26130258, 0.27577711],
            "clip.vision.image_grid_pinpoints": [56, 112, 112, 56, 112, 112]},
    # Pixtral's: a SwiGLU FFN (use_silu), CLIP's mean and deviation
    "pixtral": {V.USE_GELU: None, V.USE_SILU: True, V.IMAGE_MEAN: [0.48145466, 0.4578275, 0.40821073],
                V.IMAGE_STD: [0.26862954, 0.26130258, 0.27577711]},
    # Qwen2-VL's: GELU's sigmoid approximation (no activation key); Qwen2.5-VL's: SwiGLU, full attention in every
    # second layer (window attention in the first)
    "qwen2vl_merger": {V.USE_GELU: None},
    "qwen2.5vl_merger": {V.USE_GELU: None, V.USE_SILU: True, V.N_WA_PATTERN: 2},
    # Qwen3-VL's: both layers' outputs through deepstack mergers of their own (rows 3 x 576 wide)
    "qwen3vl_merger": {V.IS_DEEPSTACK_LAYERS: [True, True]},
}
POSITIONS, KERNEL = "v.position_embd.weight", "v.patch_embd.weight"
AUDIO_POSITIONS, AUDIO_KERNEL = "a.position_embd.weight", "a.conv1d.1.weight"
# every optional tensor a SigLIP conversion writes (arch/siglip.py)
SIGLIP_INCLUDE = (r"v\.patch_embd\.bias|v\.blk\.\d+\.(attn_[qkv]|ln1|ln2)\.(weight|bias)|"
                  r"v\.blk\.\d+\.(attn_out|ffn_up|ffn_down)\.bias|v\.post_ln\.(weight|bias)")
# every optional tensor a projector's conversion writes where it differs from SigLIP's: LLaVA's CLIP has a
# LayerNorm before the layers, none after them and no patch bias
TINY_INCLUDE = {"mlp": r"v\.pre_ln\.(weight|bias)|v\.blk\.\d+\.(attn_[qkv]|ln1|ln2)\.(weight|bias)|"
                       r"v\.blk\.\d+\.(attn_out|ffn_up|ffn_down)\.bias",
                "pixtral": r"v\.pre_ln\.weight|v\.blk\.\d+\.ln[12]\.weight|mm\.[12]\.bias",
                # Qwen2-VL's LayerNorms (the merger's as post_ln) and biases; Qwen2.5-VL's RMS norms
                "qwen2vl_merger": r"v\.blk\.\d+\.(ln1|ln2)\.(weight|bias)|v\.post_ln\.(weight|bias)|"
                                  r"v\.blk\.\d+\.(attn_[qkv]|attn_out|ffn_up|ffn_down)\.bias",
                "qwen2.5vl_merger": r"v\.blk\.\d+\.ln[12]\.weight|v\.post_ln\.weight|"
                                    r"v\.blk\.\d+\.(attn_[qkv]|attn_out|ffn_up|ffn_gate|ffn_down)\.bias",
                # Qwen3-VL's LayerNorms and biases (Q, K and V's fused one is required)
                "qwen3vl_merger": r"v\.blk\.\d+\.(ln1|ln2)\.(weight|bias)|v\.post_ln\.(weight|bias)|"
                                  r"v\.patch_embd\.bias|v\.blk\.\d+\.(attn_out|ffn_up|ffn_down)\.bias"}
# the shapes of the tensors a projector's widths are read from (Tower.widths): LLaVA's MLP, 576 wide throughout
# Qwen3-VL's learned positions, a 4 x 4 grid
TINY_SHAPES: dict[str, dict[str, tuple[int, ...]]] = {"mlp": {"mm.0.weight": (32, 576), "mm.2.weight": (576, 576)},
                                                      "qwen3vl_merger": {POSITIONS: (32, 16)}}


def tiny_tower(projector: str, **keys: Any) -> Preset:
    """The tiny tower of a projector type, its keys overridden by ``keys`` (gguf key -> value; None drops one)."""
    merged = {**TINY_VISION, C.PROJECTOR_TYPE: projector, **TINY_EXTRA.get(projector, {}), **keys}
    return Preset(f"clip:{projector}", {k: v for k, v in merged.items() if v is not None}, tied=False,
                  matrix_type=Q.F32, include=TINY_INCLUDE.get(projector, SIGLIP_INCLUDE),
                  tensor_shapes=TINY_SHAPES.get(projector, {}))


A = gguf.Keys.ClipAudio
# An audio tower (Whisper's encoder, Ultravox's projector): 40 mel bins, 64 wide, 4 heads, 2 layers, 4 rows stacked
# into one, an MLP 128 wide into rows of 576 (SmolLM2-135M's width)
TINY_AUDIO: dict[str, object] = {
    gguf.Keys.General.ARCHITECTURE: "clip", C.HAS_AUDIO_ENCODER: True, A.EMBEDDING_LENGTH: 64, A.BLOCK_COUNT: 2,
    A.Attention.HEAD_COUNT: 4, A.FEED_FORWARD_LENGTH: 128, A.Attention.LAYERNORM_EPS: 1e-5, A.NUM_MEL_BINS: 40,
    A.PROJECTION_DIM: 576, A.Projector.STACK_FACTOR: 4,
}
TINY_AUDIO_MLP = 128
# what a projector's conversion writes beyond those: Voxtral's stack of 5 (its 750 pooled rows into 150; a stack of
# 4 makes one row more than mtmd counts, and llama.cpp aborts)
TINY_AUDIO_EXTRA: dict[str, dict[str, object]] = {"voxtral": {A.Projector.STACK_FACTOR: 5}}


def tiny_audio_tower(projector: str = "ultravox", **keys: Any) -> Preset:
    """The tiny audio tower of a projector type, its keys overridden by ``keys`` (gguf key -> value; None drops
    one)."""
    merged = {**TINY_AUDIO, C.PROJECTOR_TYPE: projector, **TINY_AUDIO_EXTRA.get(projector, {}), **keys}
    E, stack = (merged.get(k) or TINY_AUDIO[k] for k in (A.EMBEDDING_LENGTH, A.Projector.STACK_FACTOR))
    wide = int(E) * int(stack)  # type: ignore[call-overload]  # mm.a.mlp.1's rows: the stacked rows' width
    return Preset(f"clip:{projector}", {k: v for k, v in merged.items() if v is not None}, tied=False,
                  matrix_type=Q.F32, include=WHISPER_TENSORS,  # what Whisper's conversion writes
                  tensor_shapes={"mm.a.mlp.1.weight": (wide, TINY_AUDIO_MLP)})


def write_mmproj(path: Path, preset: Preset, dtype: Q = Q.F32, drop: tuple[str, ...] = (),
                 bf16_kernel: bool = False) -> Path:
    """An mmproj GGUF of the preset's keys and every tensor it declares (``drop``: left out on purpose); matrices of
    ``dtype`` (F32 or F16), vectors (and columns of them, a convolution's bias [1, n]) F32, norms near 1;
    ``bf16_kernel``: the patch kernel (an audio tower's first convolution's) in bf16 (ggml's im2col then keeps the
    pixels, or the mel frames, in f32)."""
    meta = from_preset("fixture", preset)
    w = gguf.GGUFWriter(str(path), "clip")
    for key, value in preset.metadata().items():
        if key != gguf.Keys.General.ARCHITECTURE:
            add_key(w, key, value)
    for name, info in meta.tensors.items():
        if name in drop:
            continue
        rng = np.random.default_rng(int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "little"))
        shape = tuple(info.shape)[::-1]  # numpy order
        if len(shape) == 1 or shape[-1] == 1:
            norm = name.endswith(".weight") and ("ln" in name or "norm" in name)
            w.add_tensor(name, ((1.0 if norm else 0.0) + 0.1 * rng.standard_normal(shape)).astype(np.float32))
            continue
        data = rng.standard_normal(shape) / np.sqrt(np.prod(shape[1:]))  # std 1/sqrt(fan-in)
        if bf16_kernel and name in (KERNEL, AUDIO_KERNEL):  # bf16: the top half of each float32 (truncated, exact)
            w.add_tensor(name, (data.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16), raw_shape=shape,
                         raw_dtype=Q.BF16)
            continue
        # clip adds the positions as f32 rows, as converters write them
        f16 = dtype == Q.F16 and name not in (POSITIONS, AUDIO_POSITIONS)
        w.add_tensor(name, data.astype(np.float16 if f16 else np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def with_tokens(src: Path, dst: Path, texts: list[str]) -> Path:
    """A copy of the GGUF ``src`` whose last vocabulary entries are renamed to ``texts``, control tokens: the tokens
    a projector wraps its images in, given to a text model whose vocabulary lacks them (SmolLM2-135M's, for
    Idefics3's ``<fake_token_around_image>``, ``<global-img>`` and ``<row_r_col_c>``). The tensors are copied as
    they are; the renamed tokens' old texts no longer tokenize as before."""
    r = gguf.GGUFReader(str(src))
    arch = r.fields[gguf.Keys.General.ARCHITECTURE].contents()
    w = gguf.GGUFWriter(str(dst), arch)
    for name, field in r.fields.items():
        if name.startswith("GGUF.") or name == gguf.Keys.General.ARCHITECTURE:
            continue
        value = field.contents()
        if name == gguf.Keys.Tokenizer.LIST:
            value = value[:len(value) - len(texts)] + texts
        elif name == gguf.Keys.Tokenizer.TOKEN_TYPE:
            value = value[:len(value) - len(texts)] + [int(gguf.TokenType.CONTROL)] * len(texts)
        w.add_key_value(name, value, field.types[0], field.types[-1] if len(field.types) > 1 else None)
    for t in r.tensors:
        w.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)  # data in rows of blocks, or the values
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst
