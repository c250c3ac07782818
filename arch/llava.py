"""LLaVA's vision tower: CLIP's ViT with a two-layer MLP projector (``clip.projector_type`` "mlp"), as llama.cpp
builds it (tools/mtmd/models/llava.cpp) and mtmd feeds it.

CLIP differs from SigLIP in three ways a tower file shows: a class embedding joined to the patch rows (llama.cpp
joins it after them, so it takes the last position row, and its projector reads rows 1 to n: the class row and
every patch but the first), a LayerNorm before the layers, and a stack cut short: the projector reads the layer
the file names (``clip.vision.feature_layer``, several joined width-wise), else the output of all layers but the
last (old converters store all but CLIP's last layer, of which llama.cpp then runs all but the last again). The
projector is a linear layer, GELU and a second linear layer. LLaVA-1.5 letterboxes a picture into the square on
CLIP's mean colour; LLaVA-1.6 (the file's grid pinpoints) cuts a larger one into tiles of the square (anyres), each
an image of its own, with the whole picture stretched to one as the overview.
Reference: Radford et al. 2021, "Learning Transferable Visual Models From Natural Language Supervision" (CLIP);
Liu et al. 2023, "Improved Baselines with Visual Instruction Tuning" (LLaVA-1.5); Liu et al. 2024, "LLaVA-NeXT"
(1.6); llama.cpp tools/mtmd/models/llava.cpp, clip.cpp, mtmd.cpp and mtmd-image.cpp (llava-uhd).
"""

from __future__ import annotations

from gguf import MODEL_TENSOR as T
from gguf import Keys

from graphir.errors import MetadataError
from graphir.model import presets
from graphir.model.builder import GraphBuilder
from graphir.model.hparams import HParams, Key
from graphir.model.presets import Preset
from graphir.model.tensors import TensorSpec, with_bias
from graphir.model.tower import FILE_ARCH, ImagePrep, Tower
from graphir.model.vit import Options, build_inp, build_vit, patches_per_side, vit_tensors

V = Keys.ClipVision
PINPOINTS = "clip.vision.image_grid_pinpoints"  # llama.cpp's keys (gguf's Keys has no names for them)
FEATURE_LAYERS = "clip.vision.feature_layer"
CLIP_MEAN, CLIP_STD = [0.48145466, 0.4578275, 0.40821073], [0.26862954, 0.26130258, 0.27577711]
# LLaVA-1.6's image newline (the row its model puts after each row of features), which llama.cpp loads and its
# graph does not read: v.image_newline (its loader's name), model.image_newline (as llava_surgery_v2 leaves it)
NEWLINES = ("v.image_newline", "model.image_newline")


class Clip(Tower):
    """CLIP's tower and an MLP projector: the layers up to the feature layer, the class row dropped with the first
    patch's (as llama.cpp reads rows 1 to n of the class-last rows), mm.0, GELU, mm.2 to the text width. The
    projector's widths are its tensors' (llama.cpp's clip_n_mmproj_embd reads mm.2's): old converters write CLIP's
    own text projection (768) as ``projection_dim``."""

    widths = (("mlp_width", "mm.0.weight", 1), ("rows_width", "mm.2.weight", 1))

    def __init__(self, hp: HParams):
        S, pinpoints = hp.image_size, hp.grid_pinpoints
        if len(pinpoints) % 2:
            raise MetadataError(f"key '{PINPOINTS}' has {len(pinpoints)} values: it lists widths and heights in "
                                f"pairs")
        for w, h in zip(pinpoints[::2], pinpoints[1::2]):
            if w % S or h % S:  # llama.cpp's graph encodes square images only: a partial tile fails there too
                raise MetadataError(f"key '{PINPOINTS}': {w} x {h} is not whole tiles of the tower's {S} pixels")
        beyond = [f for f in hp.feature_layers if f > hp.n_layer]
        if beyond:
            raise MetadataError(f"key '{FEATURE_LAYERS}' names layer {beyond[0]}, beyond the tower's {hp.n_layer} "
                                f"(key '{V.BLOCK_COUNT}')")
        super().__init__(hp)

    @property
    def n_embd_out(self) -> int:
        return self.hp.rows_width

    @property
    def options(self) -> Options:
        """llama.cpp's llava graph: the class row, the norm before the layers, the stack run to the deepest
        feature layer (by default all layers but the last)."""
        hp = self.hp
        deepest = max(hp.feature_layers, default=-1)
        return Options(class_row=True, pre_norm=True, depth=deepest if deepest >= 0 else hp.n_layer - 1,
                       features=hp.feature_layers, ffn_either_way=True)

    def tensors(self) -> list[TensorSpec]:
        hp = self.hp
        M, D, width = hp.mlp_width, hp.rows_width, hp.n_embd * max(len(self.options.kept(hp.n_layer)), 1)
        return (vit_tensors(hp, patches_per_side(hp) ** 2 + 1, self.options)
                + [*with_bias(T.V_MMPROJ, (width, M), 0), *with_bias(T.V_MMPROJ, (M, D), 2)]
                + [TensorSpec(name, (D,), kind="vector", optional=True) for name in NEWLINES])

    def build(self, b: GraphBuilder) -> None:
        x = build_vit(b, build_inp(b), opts=self.options)
        width, n = x.shape[0], patches_per_side(self.hp) ** 2
        rows = b.op("cont", b.op("view", x, shape=(width, n), strides=(1, width), offset=width, name="patches.view"),
                    name="patches")
        h = b.op("gelu", b.linear(rows, b.w(T.V_MMPROJ, 0), b.w(T.V_MMPROJ, 0, "bias"), name="mm_0"), name="mm_0.gelu")
        b.build_output(b.linear(h, b.w(T.V_MMPROJ, 2), b.w(T.V_MMPROJ, 2, "bias"), name="mm_out"))


class LlavaVision(Clip):
    """LLaVA-1.5's and 1.6's tower: images as mtmd prepares them for the projector "mlp" (bicubic; a fitted picture
    on CLIP's mean colour; with pinpoints, the refined picture's border black); no text around the rows."""

    name = f"{FILE_ARCH}:mlp"
    keys = (Key("grid_pinpoints", PINPOINTS, tuple, (), count=-1, minimum=1),
            Key("feature_layers", FEATURE_LAYERS, tuple, (), count=-1))
    image_prep = ImagePrep("pinpoints", resize="bicubic", pad=(122, 116, 104))


# ---- presets: released towers, as their converters write their mmproj files ---------------------------------

C, A = Keys.Clip, Keys.ClipVision.Attention
# llava_surgery_v2 + convert_image_encoder_to_gguf.py: CLIP's tensors with biases, its pre-LayerNorm, the class
# embedding, the image newline, no patch bias and no post-LayerNorm; fc1 and fc2 named ffn_down and ffn_up
CLIP_TENSORS = (r"v\.pre_ln\.(weight|bias)|v\.blk\.\d+\.(attn_[qkv]|ln1|ln2)\.(weight|bias)|"
                r"v\.blk\.\d+\.(attn_out|ffn_up|ffn_down)\.bias|model\.image_newline")
SWAPPED_FFN = r"v\.blk\.\d+\.ffn_(up|down)\.(weight|bias)"

presets.register({
    # CLIP ViT-L/14 at 336 pixels, 23 of its 24 layers stored (llama.cpp runs 22 of them), the MLP projector to
    # Mistral-7B's width (4096, its tensors' shapes; projection_dim is CLIP's own 768); anyres on five pinpoints
    "LLaVA-1.6-Mistral-7B-mmproj": Preset(f"{FILE_ARCH}:mlp", {
        Keys.General.ARCHITECTURE: FILE_ARCH, C.PROJECTOR_TYPE: "mlp", C.HAS_VISION_ENCODER: True,
        "clip.has_text_encoder": False, "clip.has_llava_projector": True, V.USE_GELU: False,
        V.EMBEDDING_LENGTH: 1024, V.BLOCK_COUNT: 23, A.HEAD_COUNT: 16, V.FEED_FORWARD_LENGTH: 4096,
        A.LAYERNORM_EPS: 1e-5, V.IMAGE_SIZE: 336, V.PATCH_SIZE: 14, V.PROJECTION_DIM: 768,
        V.IMAGE_MEAN: CLIP_MEAN, V.IMAGE_STD: CLIP_STD,
        PINPOINTS: [336, 672, 672, 336, 672, 672, 1008, 336, 336, 1008],
        "clip.vision.image_crop_resolution": 224, "clip.vision.image_split_resolution": 224,
        "clip.vision.image_aspect_ratio": "anyres", "clip.vision.mm_patch_merge_type": "spatial_unpad",
        "clip.vision.mm_projector_type": "mlp2x_gelu",
    }, tied=False, include=CLIP_TENSORS, other_shape=SWAPPED_FFN,
        tensor_shapes={"mm.0.weight": (1024, 4096), "mm.2.weight": (4096, 4096)},
        source="liuhaotian/llava-v1.6-mistral-7b (mm_projector) and cmp-nct/llava-1.6-gguf config_vit.json, through "
               "llama.cpp's llava_surgery_v2.py and convert_image_encoder_to_gguf.py"),
})
