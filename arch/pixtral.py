"""Pixtral's vision tower (``clip.projector_type`` "pixtral"), as llama.cpp builds it (tools/mtmd/models/pixtral.cpp)
and mtmd feeds it.

A picture keeps its aspect: mtmd rounds its sides to whole patches (scaled to hold 8 to 1024 of them), and the graph
is built for that size. The ViT has no learned positions: Q and K are turned by 2D RoPE (a patch's row on one half
of each head, its column on the other), its norms are RMS norms (one before the layers too), its FFN a SwiGLU. The
projector is a linear layer, GELU and a second linear layer to the text model's width; after each row of patches
but the last the tower puts the text model's [IMG_BREAK] embedding (the file's ``v.token_embd.img_break``), and
mtmd closes the picture with the text [IMG_END]. Mistral-Small-3.1's files add a patch merger (n_merge x n_merge
patches folded into one row and projected, after an RMS norm), used where the file has its tensors.
Reference: Mistral AI 2024, "Pixtral 12B"; Su et al. 2021, "RoFormer" (RoPE); llama.cpp tools/mtmd/models/pixtral.cpp,
clip.cpp (build_rope_2d, build_vit), mtmd.cpp and mtmd-image.cpp (dyn_size).
"""

from __future__ import annotations

import numpy as np
from gguf import MODEL_TENSOR as T
from gguf import Keys

from graphir.graph.ir import Node
from graphir.model import presets
from graphir.model.builder import Act, GraphBuilder, Norm
from graphir.model.hparams import Key
from graphir.model.presets import Preset
from graphir.model.tensors import TensorSpec, spec, with_bias
from graphir.model.tower import FILE_ARCH, ImagePrep, MediaText, Tower
from graphir.model.vit import Options, build_inp, build_vit, patch_grid, vit_tensors

V = Keys.ClipVision
ROPE_THETA = 10000.0  # llama.cpp's loader sets it for Pixtral whatever the file says
MERGER = "mm.patch_merger.weight"


class Pixtral(Tower):
    """Pixtral's ViT (RMS norms, 2D RoPE, SwiGLU), the optional patch merger, the GELU MLP projector and the
    [IMG_BREAK] rows."""

    any_size = True
    options = Options(pre_norm=True, rope_theta=ROPE_THETA, gated_ffn=True)

    def tensors(self) -> list[TensorSpec]:
        hp = self.hp
        E, D, k = hp.n_embd, hp.projection_dim, hp.n_merge
        return (vit_tensors(hp, 0, self.options)
                + [spec(T.V_MM_INP_NORM, (E,), kind="vector", optional=True),
                   spec(T.V_MM_PATCH_MERGER, (E * k * k, E), optional=True),
                   *with_bias(T.V_MMPROJ, (E, D), 1, bias_optional=True),
                   *with_bias(T.V_MMPROJ, (D, D), 2, bias_optional=True),
                   spec(T.V_TOK_EMBD_IMG_BREAK, (D,), suffix="", kind="vector")])

    def image_inputs(self) -> dict[str, np.ndarray]:
        """Each patch's row (pos_h) and column (pos_w), in the image's row order."""
        nx = self.frame[0] // self.hp.patch_size
        n = nx * (self.frame[1] // self.hp.patch_size)
        at = np.arange(n, dtype=np.int32)
        return {"pos_h": at // nx, "pos_w": at % nx}

    def build(self, b: GraphBuilder) -> None:
        x = build_vit(b, build_inp(b), Norm.RMS, self.options)
        if b.w_opt(T.V_MM_PATCH_MERGER) is not None:
            x = self._merged(b, x)
        x = b.build_ffn(x, up=b.w(T.V_MMPROJ, 1), up_b=b.w_opt(T.V_MMPROJ, 1, "bias"), gate=None,
                        down=b.w(T.V_MMPROJ, 2), down_b=b.w_opt(T.V_MMPROJ, 2, "bias"), act=Act.GELU, name="mm_out")
        b.build_output(self._with_breaks(b, x))

    def _merged(self, b: GraphBuilder, x: Node) -> Node:
        """Mistral-Small-3.1's merger: the rows RMS-normalised (mm.input_norm), each n_merge x n_merge block of the
        patch grid unfolded into one row (an im2col of the grid, its channels the width) and projected."""
        k, E = self.hp.n_merge, self.hp.n_embd
        nx, ny = patch_grid(b)
        x = b.build_norm(x, b.w(T.V_MM_INP_NORM), kind=Norm.RMS, name="mm_input_norm")
        planes = b.op("cont", b.op("permute", b.reshape(x, (E, nx, ny), name="merge.grid"), axes=(2, 0, 1, 3),
                                   name="merge.planes.t"), name="merge.planes")
        cols = b.op("im2col", planes, kw=k, kh=k, s0=k, s1=k, p0=0, p1=0, d0=1, d1=1, type="f32",
                    name="merge.blocks")
        rows = b.reshape(cols, (E * k * k, (nx // k) * (ny // k)), name="merge.rows")
        return b.op("mul_mat", b.w(T.V_MM_PATCH_MERGER), rows, name="patch_merged")

    def _with_breaks(self, b: GraphBuilder, x: Node) -> Node:
        """The rows [D, px py] with the [IMG_BREAK] row after each row of px (merged) patches but the last: the
        grid [D, px, py] joined with a column of break rows, all but the last row read."""
        D = x.shape[0]
        px, py = (n // self.hp.n_merge for n in patch_grid(b))
        grid = b.reshape(x, (D, px, py), name="rows.grid")
        brk = b.reshape(b.w(T.V_TOK_EMBD_IMG_BREAK, suffix=""), (D, 1, 1), name="img_break.row")
        breaks = b.op("repeat", brk, shape=(D, 1, py), name="img_break.rows")
        joined = b.op("concat", grid, breaks, dim=1, name="rows.with_breaks")
        n = px * py + py - 1
        return b.op("cont", b.op("view", joined, shape=(D, n), strides=(1, D), offset=0, name="rows.view"),
                    name="rows_out")


class PixtralVision(Pixtral):
    """Pixtral-12B's tower, and Mistral-Small-3.1's with its merger (the file's spatial merge size): bicubic, the
    picture's own size within 8 to 1024 (merged) patches; [IMG_END] after its rows."""

    name = f"{FILE_ARCH}:pixtral"
    keys = (Key("n_merge", V.SPATIAL_MERGE_SIZE, int, 1, minimum=1),)
    image_prep = ImagePrep("aspect", resize="bicubic", min_tokens=8, max_tokens=1024)
    media_text = MediaText(end="[IMG_END]")


# ---- presets: released towers, as convert_hf_to_gguf writes their mmproj files ------------------------------

C, A = Keys.Clip, Keys.ClipVision.Attention
# What the conversion of mistral-community/pixtral-12b writes beyond the required tensors: the RMS norms (before the
# layers and in each layer, without biases) and the projector's biases; no other biases
PIXTRAL_TENSORS = r"v\.pre_ln\.weight|v\.blk\.\d+\.ln[12]\.weight|mm\.[12]\.bias"

presets.register({
    # Pixtral-ViT (24 layers, 1024 wide, patches of 16 up to 1024 pixels) and its projector to Mistral-NeMo's 5120
    "Pixtral-12B-mmproj": Preset(f"{FILE_ARCH}:pixtral", {
        Keys.General.ARCHITECTURE: FILE_ARCH, C.PROJECTOR_TYPE: "pixtral", C.HAS_VISION_ENCODER: True,
        V.USE_SILU: True, V.EMBEDDING_LENGTH: 1024, V.BLOCK_COUNT: 24, A.HEAD_COUNT: 16, V.FEED_FORWARD_LENGTH: 4096,
        A.LAYERNORM_EPS: 1e-5, V.IMAGE_SIZE: 1024, V.PATCH_SIZE: 16, V.PROJECTION_DIM: 5120,
        V.IMAGE_MEAN: [0.48145466, 0.4578275, 0.40821073], V.IMAGE_STD: [0.26862954, 0.26130258, 0.27577711],
    }, tied=False, include=PIXTRAL_TENSORS,
        source="mistral-community/pixtral-12b config.json (vision_config) and preprocessor_config.json, through "
               "convert_hf_to_gguf.py (LlavaVisionModel)"),
})
