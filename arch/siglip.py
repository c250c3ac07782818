"""SigLIP vision towers and their projectors: Gemma 3's and Idefics3's (SmolVLM), as llama.cpp builds them in one
graph (tools/mtmd/models/siglip.cpp).

SigLIP is a plain ViT: patches of a square image, learned positions, LayerNorms, a GELU FFN, a final LayerNorm.
What follows is the projector, and what tells the two apart is data: Gemma 3 averages each n_merge x n_merge block
of patches into one (the 64 x 64 patches of an 896-pixel image become 256 rows), RMS-normalises the rows and
projects them to the text model's width; Idefics3 folds each block into one row n_merge^2 times wider (pixel
shuffle) and projects that.
Reference: Zhai et al. 2023, "Sigmoid Loss for Language Image Pre-Training"; Gemma Team 2025, "Gemma 3 Technical
Report"; Laurençon et al. 2024, "Building and better understanding vision-language models" (Idefics3); llama.cpp
tools/mtmd/models/siglip.cpp and clip.cpp (build_patch_merge_permute).
"""

from __future__ import annotations

from typing import ClassVar

from gguf import MODEL_TENSOR as T
from gguf import Keys

from graphir.errors import MetadataError
from graphir.graph.ir import Node
from graphir.model import presets
from graphir.model.builder import GraphBuilder
from graphir.model.hparams import HParams, Key
from graphir.model.presets import Preset
from graphir.model.tensors import TensorSpec, spec
from graphir.model.tower import FILE_ARCH, ImagePrep, MediaText, Tower
from graphir.model.vit import build_inp, build_vit, patches_per_side, vit_tensors

V = Keys.ClipVision


class Siglip(Tower):
    """The tower and a projector of ``head`` pool (Gemma 3) or shuffle (Idefics3), merging n_merge x n_merge
    patches into one row."""

    head: ClassVar[str]

    def __init__(self, hp: HParams):
        side = patches_per_side(hp)
        if hp.n_merge < 2 and self.head == "shuffle":  # llama.cpp asserts it before it shuffles
            raise MetadataError(f"key '{V.Projector.SCALE_FACTOR}' is {hp.n_merge}: Idefics3's pixel shuffle merges "
                                f"at least 2 x 2 patches")
        if side < hp.n_merge:
            raise MetadataError(f"an image of {hp.image_size} pixels has {side} patches of {hp.patch_size} a side, "
                                f"fewer than the {hp.n_merge} the projector merges (key '{V.Projector.SCALE_FACTOR}')")
        super().__init__(hp)

    def tensors(self) -> list[TensorSpec]:
        hp = self.hp
        E = hp.n_embd
        out = vit_tensors(hp, patches_per_side(hp) ** 2)
        if self.head == "pool":
            return out + [spec(T.V_MM_SOFT_EMB_NORM, (E,), kind="vector"),
                          spec(T.V_MM_INP_PROJ, (hp.projection_dim, E))]
        return out + [spec(T.V_MMPROJ_FC, (E * hp.n_merge ** 2, hp.projection_dim))]

    def build(self, b: GraphBuilder) -> None:
        x = build_vit(b, build_inp(b))
        b.build_output(self._pooled(b, x) if self.head == "pool" else self._shuffled(b, x))

    def _pooled(self, b: GraphBuilder, x: Node) -> Node:
        """Gemma 3: each n_merge x n_merge block of patches averaged, the rows RMS-normalised (soft_emb_norm) and
        projected to the text width."""
        hp = self.hp
        side, k = patches_per_side(hp), hp.n_merge
        grid = b.reshape(b.op("cont", b.op("transpose", x, name="patches.t"), name="patches.planes"),
                         (side, side, hp.n_embd), name="patches.grid")
        pooled = b.op("pool_2d", grid, pool="avg", k0=k, k1=k, s0=k, s1=k, p0=0, p1=0, name="patches_pooled")
        n = pooled.shape[0] * pooled.shape[1]
        rows = b.op("cont", b.op("transpose", b.reshape(pooled, (n, hp.n_embd), name="pooled.planes"),
                                 name="pooled.t"), name="pooled_rows")
        rows = b.build_norm(rows, b.w(T.V_MM_SOFT_EMB_NORM), name="soft_emb_norm")
        proj = b.op("cont", b.op("transpose", b.w(T.V_MM_INP_PROJ), name="input_projection.t"),
                    name="input_projection.rows")
        return b.op("mul_mat", proj, rows, name="mm_out")

    def _shuffled(self, b: GraphBuilder, x: Node) -> Node:
        """Idefics3: each n_merge x n_merge block of patches folded into one row (pixel shuffle, the grid padded to
        a multiple of n_merge first), then projected."""
        hp = self.hp
        E, s = hp.n_embd, hp.n_merge
        w = h = patches_per_side(hp)
        cur = b.reshape(x, (E, w, h), name="shuffle.grid")
        pad_w, pad_h = -w % s, -h % s
        if pad_w or pad_h:
            cur = b.op("pad", cur, pad=(0, pad_w, pad_h, 0), name="shuffle.padded")
            w, h = w + pad_w, h + pad_h
        cur = b.reshape(cur, (E * s, w // s, h), name="shuffle.cols")
        cur = b.op("permute", cur, axes=(0, 2, 1, 3), name="shuffle.cols.t")
        cur = b.reshape(b.op("cont", cur, name="shuffle.cols.cont"), (E * s * s, h // s, w // s), name="shuffle.rows")
        cur = b.op("permute", cur, axes=(0, 2, 1, 3), name="shuffle.rows.t")
        cur = b.reshape(b.op("cont", cur, name="shuffle.rows.cont"), (E * s * s, (w // s) * (h // s)),
                        name="pixel_shuffle")
        return b.op("mul_mat", b.w(T.V_MMPROJ_FC), cur, name="mm_out")


class Gemma3Vision(Siglip):
    """Gemma 3's SigLIP: 4 x 4 patches averaged unless the file says otherwise (a test model's smaller grid)."""

    name = f"{FILE_ARCH}:gemma3"
    head = "pool"
    keys = (Key("n_merge", V.Projector.SCALE_FACTOR, int, 4, minimum=1),)
    image_prep = ImagePrep("fit", resize="bilinear")
    media_text = MediaText(begin="<start_of_image>", end="<end_of_image>", both_ways=True)


class Idefics3Vision(Siglip):
    """Idefics3's and SmolVLM's SigLIP: the file names the shuffle's factor (llama.cpp's default of 1 cannot
    shuffle); an image is cut into tiles of the tower's size (Lanczos), each slice first, then the whole image."""

    name = f"{FILE_ARCH}:idefics3"
    head = "shuffle"
    keys = (Key("n_merge", V.Projector.SCALE_FACTOR, int, 1, minimum=1),
            Key("longest_edge", V.PREPROC_IMAGE_SIZE, int, 0, minimum=0))
    image_prep = ImagePrep("tiles", resize="lanczos", overview_first=False)
    media_text = MediaText(slice_start="<fake_token_around_image><row_{row}_col_{col}>", row_end=("\n",),
                           overview_start=("\n\n", "<fake_token_around_image>", "<global-img>"),
                           overview_end=("<fake_token_around_image>",))


# ---- presets: released towers, as convert_hf_to_gguf writes their mmproj files ------------------------------

C, A = Keys.Clip, Keys.ClipVision.Attention
# Every optional tensor SigLIP's conversion writes: the patch bias, Q, K and V apart with biases, each layer's
# LayerNorms, the biases of attention's output and of the FFN, the final LayerNorm
SIGLIP_TENSORS = (r"v\.patch_embd\.bias|v\.blk\.\d+\.(attn_[qkv]|ln1|ln2)\.(weight|bias)|"
                  r"v\.blk\.\d+\.(attn_out|ffn_up|ffn_down)\.bias|v\.post_ln\.(weight|bias)")
EMBEDDINGS_F32 = r"v\.patch_embd\.weight|v\.position_embd\.weight"  # the converter keeps ".embeddings." in f32


def _siglip(projector: str, E: int, n_layer: int, n_head: int, n_ff: int, image: int, patch: int, eps: float,
            text: int, extra: dict[str, object], source: str, **kw: object) -> Preset:
    keys: dict[str, object] = {
        Keys.General.ARCHITECTURE: FILE_ARCH, C.PROJECTOR_TYPE: projector, C.HAS_VISION_ENCODER: True,
        V.USE_GELU: True, V.EMBEDDING_LENGTH: E, V.BLOCK_COUNT: n_layer, A.HEAD_COUNT: n_head,
        V.FEED_FORWARD_LENGTH: n_ff, A.LAYERNORM_EPS: eps, V.IMAGE_SIZE: image, V.PATCH_SIZE: patch,
        V.PROJECTION_DIM: text, V.IMAGE_MEAN: [0.5, 0.5, 0.5], V.IMAGE_STD: [0.5, 0.5, 0.5], **extra,
    }
    return Preset(f"{FILE_ARCH}:{projector}", keys, tied=False, include=SIGLIP_TENSORS, f32=EMBEDDINGS_F32,
                  source=source, **kw)  # type: ignore[arg-type]


presets.register({
    # SigLIP so400m at 896 pixels, 4 x 4 pooling to 256 rows of Gemma 3 4B's width; input_projection kept in f16
    "Gemma-3-4B-mmproj": _siglip("gemma3", 1152, 27, 16, 4304, 896, 14, 1e-6, 2560, {},
                                 "google/gemma-3-4b-it config.json (vision_config) and preprocessor_config.json"),
    # SigLIP base at 512 pixels (patches of 16), 4 x 4 pixel shuffle into SmolLM2-135M's width
    "SmolVLM-256M-mmproj": _siglip("idefics3", 768, 12, 12, 3072, 512, 16, 1e-6, 576,
                                   {V.Projector.SCALE_FACTOR: 4, V.PREPROC_IMAGE_SIZE: 2048},
                                   "HuggingFaceTB/SmolVLM-256M-Instruct config.json and preprocessor_config.json"),
})
