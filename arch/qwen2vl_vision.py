"""Qwen2-VL's, Qwen2.5-VL's and Qwen3-VL's vision towers (``clip.projector_type`` "qwen2vl_merger",
"qwen2.5vl_merger", "qwen3vl_merger"), as llama.cpp builds them (tools/mtmd/models/qwen2vl.cpp, qwen3vl.cpp) and mtmd
feeds them.

A picture keeps its aspect (mtmd's dyn_size: sides rounded to whole 2 x 2 blocks of patches, 8 to 4096 blocks).
The patch embedding is the model's 3-D convolution over two frames, a still image being both: two kernels
(``v.patch_embd.weight`` and ``.weight.1``) over the same pixels, added. The patches are reordered so that each 2 x 2
block is four rows in a row; the ViT has no learned positions, Q and K are turned by M-RoPE in ggml's vision mode
(each patch's row and column); after the layers the merger joins each block's four rows into one and projects it
(mm.0, GELU, mm.2). Qwen2-VL: LayerNorms and a GELU-approximated MLP; Qwen2.5-VL: RMS norms, a SwiGLU FFN and window
attention: the blocks grouped by windows of 112 pixels (the rows permuted before the layers and back after the
merger), every layer but each n_wa_pattern-th attending within its window. Qwen3-VL: learned positions too (a square
grid, bilinearly resized to the picture's patches and put in the blocks' order), Q, K and V from one product, and
DeepStack: the outputs of the layers the file marks, each merged by a merger of its own (LayerNorm, MLP), their rows
joined width-wise after the main merger's (the decoder adds each part to one of its first layers' outputs).
Reference: Wang et al. 2024, "Qwen2-VL"; Bai et al. 2025, "Qwen2.5-VL Technical Report"; Qwen team 2025, "Qwen3-VL";
llama.cpp tools/mtmd/models/qwen2vl.cpp, qwen3vl.cpp, clip.cpp (loader, clip_image_batch_encode), mtmd.cpp,
mtmd-image.cpp (dyn_size).
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import ClassVar

import numpy as np
from gguf import MODEL_TENSOR as T
from gguf import Keys

from graphir.errors import MetadataError
from graphir.graph.ir import Node
from graphir.model import presets
from graphir.model.builder import Act, GraphBuilder, Norm
from graphir.model.hparams import Key
from graphir.model.presets import Preset
from graphir.model.tensors import TensorSpec, spec, tensor_name, with_bias
from graphir.model.tower import FILE_ARCH, ImagePrep, MediaText, Tower
from graphir.model.vit import CHANNELS, Options, build_inp, build_vit, patch_grid, vit_tensors

V = Keys.ClipVision
ROPE_THETA = 10000.0  # clip's qwen2vl graph turns Q and K at this base whatever the file says
MERGE = 2  # the graph merges 2 x 2 blocks of patches (clip's qwen2vl graph fixes it)
WINDOW = 112  # Qwen2.5-VL's attention window in pixels (llama.cpp's default; its loader reads no key for it)
LOWEST = np.finfo(np.float32).min  # a masked score: C++'s lowest float
KERNELS = ("weight", "weight.1")  # the 3-D convolution's two frames, one 2-D kernel each
# mtmd's preparation aligns the sides to n_merge x n_merge blocks; the graph merges 2 x 2 whatever the file says
_MERGE_KEY = Key("n_merge", V.SPATIAL_MERGE_SIZE, int, MERGE, minimum=MERGE, maximum=MERGE)


class QwenVL(Tower):
    """The Qwen-VL ViT (M-RoPE, the norms and FFN its variant names, window attention where the file asks for it)
    and its 2 x 2 patch merger."""

    any_size = True
    norm: ClassVar[Norm] = Norm.LAYER
    learned_positions: ClassVar[bool] = False  # a grid of them (v.position_embd, n_pos rows) besides M-RoPE
    options = Options(pre_norm=True, rope_theta=ROPE_THETA, mrope=True, ffn_either_way=True)
    image_prep = ImagePrep("aspect", resize="bicubic", min_tokens=8, max_tokens=4096)
    media_text = MediaText(begin="<|vision_start|>", end="<|vision_end|>")

    @property
    def window_pattern(self) -> int:
        """Every layer but each n-th attends within windows (0: none)."""
        return self.hp.n_wa_pattern

    def tensors(self) -> list[TensorSpec]:
        hp = self.hp
        E, P, D = hp.n_embd, hp.patch_size, hp.projection_dim
        if any(il >= hp.n_layer for il in self.deepstack):
            raise MetadataError(f"key '{V.IS_DEEPSTACK_LAYERS}' marks layer {max(self.deepstack)}; the tower has "
                                f"{hp.n_layer} layers")
        return (vit_tensors(hp, 0, self.options)
                + [spec(T.V_ENC_EMBD_PATCH, (P, P, CHANNELS, E), suffix=KERNELS[1]),
                   *with_bias(T.V_MMPROJ, (4 * E, 4 * E), 0), *with_bias(T.V_MMPROJ, (4 * E, D), 2)]
                + ([spec(T.V_ENC_EMBD_POS, (E, hp.n_pos))] if self.learned_positions else [])
                + [s for il in self.deepstack for s in (*with_bias(T.V_DS_NORM, (4 * E,), il),
                                                        *with_bias(T.V_DS_FC1, (4 * E, 4 * E), il),
                                                        *with_bias(T.V_DS_FC2, (4 * E, D), il))])

    def image_inputs(self) -> dict[str, np.ndarray]:
        """Each patch's positions (row, column, row, column; section-major, in the rows' order inside the layers)
        and, with window attention, the blocks' permutation into windows (window_idx: where each block went;
        inv_window_idx: which block each place holds) and the mask keeping each window's patches to themselves."""
        px, py = self.row_grid(0)
        order = self._window_order(px, py)
        place = np.empty_like(order)
        place[order] = np.arange(len(order), dtype=np.int32)
        by, bx = np.divmod(np.arange(px * py), px)
        dy, dx = np.divmod(np.arange(MERGE * MERGE), MERGE)
        rows, cols = (MERGE * b[:, None] + d[None, :] for b, d in ((by, dy), (bx, dx)))
        at = (place[:, None] * MERGE * MERGE + np.arange(MERGE * MERGE)[None, :]).ravel()
        n = rows.size
        pos = np.empty((4, n), np.int32)
        for section, values in enumerate((rows, cols, rows, cols)):
            pos[section, at] = values.ravel()
        inputs = {"positions": pos.ravel()}
        if self.window_pattern:
            windows = np.repeat(self._window_of(px, py)[order], MERGE * MERGE)
            mask = np.where(windows[:, None] == windows[None, :], np.float32(0), LOWEST).astype(np.float32)
            inputs.update(window_idx=place, inv_window_idx=order, window_mask=mask)
        return inputs

    @property
    def deepstack(self) -> tuple[int, ...]:
        """The layers whose outputs have mergers of their own (those the file marks, where its variant reads the
        key)."""
        return tuple(il for il, on in enumerate(getattr(self.hp, "is_deepstack", ())) if on)

    @property
    def n_embd_out(self) -> int:
        """The main merger's rows and each deepstack merger's, side by side."""
        return self.hp.projection_dim * (1 + len(self.deepstack))

    def row_grid(self, n_rows: int) -> tuple[int, int]:
        """The 2 x 2 blocks across and down the frame, one row each: mtmd's grid for the decoder's M-RoPE."""
        width, height = self.frame
        return width // self.hp.patch_size // MERGE, height // self.hp.patch_size // MERGE

    def _window_of(self, px: int, py: int) -> np.ndarray:
        """Each block's window (raster order over windows of WINDOW pixels)."""
        side = WINDOW // self.hp.patch_size // MERGE
        wy, wx = np.divmod(np.arange(px * py), px)
        return (wy // side) * -(-px // side) + wx // side

    def _window_order(self, px: int, py: int) -> np.ndarray:
        """The blocks in the order the layers take them: window by window, each window's in raster order (the
        identity without window attention)."""
        blocks = np.arange(px * py, dtype=np.int32)
        if not self.window_pattern:
            return blocks
        return blocks[np.argsort(self._window_of(px, py), kind="stable")].astype(np.int32)

    def build(self, b: GraphBuilder) -> None:
        E = self.hp.n_embd
        nx, ny = patch_grid(b)
        x = self._positioned(b, _in_blocks(b, build_inp(b, KERNELS), nx, ny, "inp"), nx, ny)
        if self.window_pattern:
            x = self._permuted(b, x, "inv_window_idx", E * MERGE * MERGE)
        taps: list[tuple[int, Node]] = []
        x = build_vit(b, x, self.norm, replace(self.options, window_pattern=self.window_pattern, taps=self.deepstack),
                      taps)
        x = _merged(b, x, (T.V_MMPROJ, 0, T.V_MMPROJ, 2), "mm")
        for il, rows in taps:
            x = b.op("concat", x, _merged(b, rows, (T.V_DS_FC1, il, T.V_DS_FC2, il), "deepstack", T.V_DS_NORM),
                     dim=0, name="deepstack_out")
        if self.window_pattern:
            x = self._permuted(b, x, "window_idx", x.shape[0])
        b.build_output(x)

    def _positioned(self, b: GraphBuilder, x: Node, nx: int, ny: int) -> Node:
        """x plus the learned positions where the variant has them: their square grid resized to nx x ny where it
        differs (bilinear, corners aligned: clip's resize_position_embeddings), in the rows' 2 x 2 blocks."""
        if not self.learned_positions:
            return x
        E, side = self.hp.n_embd, math.isqrt(self.hp.n_pos)
        pos = b.w(T.V_ENC_EMBD_POS)
        if (nx, ny) != (side, side):
            grid = b.op("permute", b.reshape(pos, (E, side, side), name="pos.grid"), axes=(2, 0, 1),
                        name="pos.planes")
            sized = b.op("interpolate", grid, w=nx, h=ny, align_corners=True, name="pos.resized")
            pos = b.op("cont", b.op("permute", sized, axes=(1, 2, 0), name="pos.rows.t"), name="pos.rows")
            pos = b.reshape(pos, (E, nx * ny), name="pos.sized")
        return b.op("add", x, _in_blocks(b, pos, nx, ny, "pos"), name="inp_pos_emb")

    def _permuted(self, b: GraphBuilder, x: Node, ids: str, width: int) -> Node:
        """x's blocks (its rows joined ``width`` wide) in the order of input ``ids``, in x's shape."""
        n = x.shape[0] * x.shape[1] // width
        rows = x if x.shape[0] == width else b.reshape(x, (width, n), name=f"{ids}.rows")
        taken = b.op("get_rows", rows, b.input(ids, "i32", (n,)), name=f"{ids}.taken")
        return taken if rows is x else b.reshape(taken, x.shape, name=f"{ids}.out")


def _in_blocks(b: GraphBuilder, x: Node, nx: int, ny: int, tag: str) -> Node:
    """Rows [E, nx ny] in the image's row order reordered so that each 2 x 2 block's four are in a row."""
    E = x.shape[0]
    blocks = b.op("permute", b.reshape(x, (MERGE * E, nx // MERGE, MERGE, ny // MERGE), name=f"{tag}.pairs"),
                  axes=(0, 2, 1, 3), name=f"{tag}.blocks.t")
    return b.reshape(b.op("cont", blocks, name=f"{tag}.blocks"), (E, nx * ny), name=f"{tag}_blocks")


def _merged(b: GraphBuilder, x: Node, ffn: tuple[T, int, T, int], tag: str, norm: T | None = None) -> Node:
    """Each block's four rows of x joined into one, through a LayerNorm of the joined width where ``norm`` names
    one, and through the GELU MLP ``ffn`` (up tensor and index, down tensor and index), each with its bias."""
    E, n = x.shape
    x = b.reshape(x, (E * MERGE * MERGE, n // (MERGE * MERGE)), name="merged")
    up, i_up, down, i_down = ffn
    if norm is not None:
        x = b.build_norm(x, b.w(norm, i_up), b.w(norm, i_up, "bias"), Norm.LAYER, name=f"{tag}.norm")
    return b.build_ffn(x, up=b.w(up, i_up), up_b=b.w(up, i_up, "bias"), gate=None, down=b.w(down, i_down),
                       down_b=b.w(down, i_down, "bias"), act=Act.GELU, name=f"{tag}_out")


class Qwen2VL(QwenVL):
    """Qwen2-VL's: LayerNorms, the FFN of the file's activation, no window attention (llama.cpp's loader reads the
    key, its encoder fills windows for Qwen2.5-VL only)."""

    name = f"{FILE_ARCH}:qwen2vl_merger"
    keys = (_MERGE_KEY, Key("n_wa_pattern", V.N_WA_PATTERN, int, 0, maximum=0))


class Qwen25VL(QwenVL):
    """Qwen2.5-VL's: RMS norms, a SwiGLU FFN, window attention but in each n_wa_pattern-th layer (0: none)."""

    name = f"{FILE_ARCH}:qwen2.5vl_merger"
    norm = Norm.RMS
    options = replace(QwenVL.options, gated_ffn=True)
    keys = (_MERGE_KEY, Key("n_wa_pattern", V.N_WA_PATTERN, int, required=True, minimum=0))


class Qwen3VL(QwenVL):
    """Qwen3-VL's: learned positions besides M-RoPE (a square grid resized to the picture's patches), Q, K and V
    from one product, LayerNorms and a GELU FFN; each layer the file marks as deepstack (``is_deepstack_layers``)
    hands its output to a merger of its own (a LayerNorm over the joined rows, then the MLP), whose rows join the
    main merger's width-wise, in layer order."""

    name = f"{FILE_ARCH}:qwen3vl_merger"
    learned_positions = True
    options = replace(QwenVL.options, fused_qkv=True)
    keys = (_MERGE_KEY, Key("n_wa_pattern", V.N_WA_PATTERN, int, 0, maximum=0),
            Key("is_deepstack", V.IS_DEEPSTACK_LAYERS, tuple, (), count=-1, minimum=0, maximum=1))
    widths = (("n_pos", tensor_name(T.V_ENC_EMBD_POS), 1),)  # the learned positions: a square grid of them


# ---- presets: released towers, as convert_hf_to_gguf writes their mmproj files ------------------------------

C, A = Keys.Clip, Keys.ClipVision.Attention
# What the conversion of Qwen2.5-VL writes beyond the required tensors: the RMS norms in each layer and the merger's
# (post_ln, without biases), the biases of Q, K, V, the output and the FFN
QWEN25VL_TENSORS = (r"v\.blk\.\d+\.ln[12]\.weight|v\.post_ln\.weight|"
                    r"v\.blk\.\d+\.(attn_[qkv]|attn_out|ffn_up|ffn_gate|ffn_down)\.bias")

# Qwen3-VL's: LayerNorms with biases before attention, the FFN and the merger (post_ln), Q, K and V's fused bias and
# those of the output and the FFN, the patch embedding's
QWEN3VL_TENSORS = (r"v\.blk\.\d+\.ln[12]\.(weight|bias)|v\.post_ln\.(weight|bias)|v\.patch_embd\.bias|"
                   r"v\.blk\.\d+\.(attn_out|ffn_up|ffn_down)\.bias")

presets.register({
    # Qwen2.5-VL's ViT (32 layers, 1280 wide, patches of 14, full attention in layers 7, 15, 23 and 31) and its
    # merger to Qwen2.5-7B's 3584
    "Qwen2.5-VL-7B-mmproj": Preset(f"{FILE_ARCH}:qwen2.5vl_merger", {
        Keys.General.ARCHITECTURE: FILE_ARCH, C.PROJECTOR_TYPE: "qwen2.5vl_merger", C.HAS_VISION_ENCODER: True,
        V.USE_SILU: True, V.EMBEDDING_LENGTH: 1280, V.BLOCK_COUNT: 32, A.HEAD_COUNT: 16, V.FEED_FORWARD_LENGTH: 3420,
        A.LAYERNORM_EPS: 1e-6, V.IMAGE_SIZE: 560, V.PATCH_SIZE: 14, V.PROJECTION_DIM: 3584, V.N_WA_PATTERN: 8,
        V.IMAGE_MEAN: [0.48145466, 0.4578275, 0.40821073], V.IMAGE_STD: [0.26862954, 0.26130258, 0.27577711],
    }, tied=False, include=QWEN25VL_TENSORS,
        source="Qwen/Qwen2.5-VL-7B-Instruct config.json (vision_config) and preprocessor_config.json, through "
               "convert_hf_to_gguf.py (Qwen2VLVisionModel)"),
    # Qwen3-VL-2B's ViT (24 layers, 1024 wide, patches of 16, a 48 x 48 grid of learned positions, deepstack
    # mergers after layers 5, 11 and 17) and its mergers to Qwen3-1.7B's 2048
    "Qwen3-VL-2B-mmproj": Preset(f"{FILE_ARCH}:qwen3vl_merger", {
        Keys.General.ARCHITECTURE: FILE_ARCH, C.PROJECTOR_TYPE: "qwen3vl_merger", C.HAS_VISION_ENCODER: True,
        V.USE_GELU: True, V.EMBEDDING_LENGTH: 1024, V.BLOCK_COUNT: 24, A.HEAD_COUNT: 16, V.FEED_FORWARD_LENGTH: 4096,
        A.LAYERNORM_EPS: 1e-6, V.IMAGE_SIZE: 768, V.PATCH_SIZE: 16, V.PROJECTION_DIM: 2048,
        V.SPATIAL_MERGE_SIZE: 2, V.IS_DEEPSTACK_LAYERS: [il in (5, 11, 17) for il in range(24)],
        V.IMAGE_MEAN: [0.5, 0.5, 0.5], V.IMAGE_STD: [0.5, 0.5, 0.5],
    }, tied=False, include=QWEN3VL_TENSORS, f32=r"v\.position_embd\.weight",
        tensor_shapes={"v.position_embd.weight": (1024, 2304)},
        source="Qwen/Qwen3-VL-2B-Instruct config.json (vision_config: depth 24, hidden_size 1024, "
               "num_position_embeddings 2304, deepstack_visual_indexes [5, 11, 17]) and preprocessor_config.json, "
               "through convert_hf_to_gguf.py (Qwen3VLVisionModel)"),
})
