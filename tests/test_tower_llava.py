"""LLaVA's tower (projector type "mlp"): CLIP's ViT with its class row, pre-LayerNorm and a stack cut short at the
feature layer, the MLP projector, and images as mtmd prepares them for it (LLaVA-1.5's letterbox on CLIP's mean
colour, LLaVA-1.6's anyres tiles on the file's pinpoints), checked against llama.cpp's mtmd on tiny files the tests
write, alone and composed with SmolLM2-135M."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from mmproj_files import V, tiny_tower, write_mmproj
from test_towers import PICTURES, _patches, _picture, greedy_after, text_model  # noqa: F401 (text_model: a fixture)

import graphir
from graphir.arch.llava import FEATURE_LAYERS, PINPOINTS, SWAPPED_FFN
from graphir.errors import GraphirError, MetadataError
from graphir.graph.verify import verify
from graphir.model.meta import ModelMeta, open_model
from graphir.running.runtime import Model

# The tiny tower's variants: LLaVA-1.6 (anyres on its pinpoints), LLaVA-1.5 (no pinpoints: letterboxed), a file
# naming its feature layers (the stack's input and its last layer's output, joined), an old converter's FFN names
VARIANTS = {
    "anyres": {},
    "fit": {PINPOINTS: None},
    "features": {FEATURE_LAYERS: [0, 2]},
}


def _tower(variant: str, **keys: object):
    preset = tiny_tower("mlp", **{**VARIANTS.get(variant, {}), **keys})
    return replace(preset, other_shape=SWAPPED_FFN) if variant == "swapped" else preset


# picture -> the images mtmd encodes for it: within the square one (stretched, or letterboxed without pinpoints);
# wider 2 x 1 tiles and the overview, taller 1 x 2 and the overview
EXPECTED_IMAGES = {"anyres": {"square": 1, "wide": 3, "tall": 3}, "fit": {"square": 1, "wide": 1, "tall": 1},
                   "features": {"wide": 3}, "swapped": {"wide": 3}}


def test_a_tiny_llava_mmproj_builds_its_graph(tmp_path: Path) -> None:
    """16 patches and the class row after them; one of the two layers runs (all but the last); the projector reads
    rows 1 to 16 of the 17 and makes 16 rows of 576."""
    m = open_model(str(write_mmproj(tmp_path / "mmproj.gguf", _tower("anyres"))))
    assert m.arch.name == "clip:mlp" and m.arch.check(m.tensors) == []
    assert m.arch.hp.grid_pinpoints == (56, 112, 112, 56, 112, 112) and m.arch.hp.ffn_act == "gelu_quick"
    g = m.build_graph()
    verify(g)
    by_name = {n.name: n for n in g.nodes}
    assert by_name["inp_raw"].shape == (56, 56, 3)
    assert by_name["inp_cls"].shape == (32, 17) and by_name["pre_ln"].op == "add"
    assert sorted({n.name.split(".")[1] for n in g.nodes if n.name.startswith("blk.")}) == ["0"]
    view = by_name["patches.view"]
    assert (view.shape, view.attrs["offset"]) == ((32, 16), 32)
    assert [n.op for n in g.nodes if n.name.startswith("mm_")][-3:] == ["gelu", "mul_mat", "add"]
    assert g.outputs["embd"].shape == (576, 16)
    features = open_model(str(write_mmproj(tmp_path / "f.gguf", _tower("features")))).build_graph()
    assert next(n for n in features.nodes if n.name == "features.1").shape == (64, 17)
    assert {n.name.split(".")[1] for n in features.nodes if n.name.startswith("blk.")} == {"0", "1"}


def test_an_old_converters_ffn_names_are_taken_by_shape(tmp_path: Path) -> None:
    """fc1 and fc2 written as ffn_down and ffn_up (llava's surgery): the graph reads each by its shape, as
    llama.cpp's loader swaps them."""
    m = open_model(str(write_mmproj(tmp_path / "old.gguf", _tower("swapped"))))
    assert m.tensors["v.blk.0.ffn_down.weight"].shape[:2] == (32, 64) and m.arch.check(m.tensors) == []
    g = m.build_graph()
    up = next(n for n in g.nodes if n.name == "blk.0.ffn_up")
    assert (up.inputs[0].name, up.shape) == ("v.blk.0.ffn_down.weight", (64, 17))


def test_the_preset_is_llava_16s_tower() -> None:
    m = open_model("LLaVA-1.6-Mistral-7B-mmproj")
    hp = m.arch.hp
    assert (hp.n_embd, hp.n_layer, hp.n_head, hp.n_ff, hp.image_size, hp.patch_size) == (1024, 23, 16, 4096, 336, 14)
    assert m.arch.options.depth == 22 and m.tensors["v.blk.0.ffn_down.weight"].shape[:2] == (1024, 4096)
    assert (hp.projection_dim, hp.mlp_width, hp.rows_width) == (768, 4096, 4096)  # rows as wide as mm.2 makes them
    assert m.build_graph().outputs["embd"].shape == (4096, 576)


# --------------------------------------------------------------------------- against llama.cpp's mtmd

CASES = [(v, d, s) for v in ("anyres", "fit") for d in ("F32", "F16") for s in sorted(PICTURES)] + \
        [("features", "F32", "wide"), ("swapped", "F32", "wide"), ("features", "F16", "wide")]


@pytest.mark.parametrize("variant,dtype,shape", CASES, ids=["-".join(c) for c in CASES])
def test_rows_and_pixels_are_mtmds(variant: str, dtype: str, shape: str, tmp_path: Path, text_model: Path) -> None:
    """The images graphir prepares from a picture are mtmd's, in its order, pixel for pixel where mtmd's im2col
    shows them (rounded to f16, as it rounds them); each image's rows within 1e-3 of mtmd's (flash attention off
    in both)."""
    from llama_mtmd import mtmd_encode

    path = write_mmproj(tmp_path / "mmproj.gguf", _tower(variant), Q[dtype])
    picture = _picture(tmp_path, shape)
    theirs = mtmd_encode(path, picture, text_model, patch=14)
    ours = graphir.load(str(path)).new_context().encode_image(picture)
    assert len(ours) == len(theirs) == EXPECTED_IMAGES[variant][shape]
    for (tile, rows), their in zip(ours, theirs):
        f16 = _patches(tile.pixels, 14).astype(np.float16).astype(np.float32)
        assert np.array_equal(f16, their.patches), tile.kind
        assert rows.shape == their.rows.shape == (16, 576)
        assert np.abs(rows - their.rows).max() <= 1e-3, (tile.kind, float(np.abs(rows - their.rows).max()))


@pytest.mark.parametrize("variant", ["anyres", "fit"])
@pytest.mark.parametrize("shape", sorted(PICTURES))
def test_pixels_are_mtmds_in_float32(variant: str, shape: str, tmp_path: Path, text_model: Path) -> None:
    """With a bf16 patch kernel ggml's im2col keeps the pixels in float32: graphir's are mtmd's, bit for bit
    (the stretched overview, the tiles of the letterboxed refinement on black, a letterbox on CLIP's mean)."""
    from llama_mtmd import mtmd_encode

    path = write_mmproj(tmp_path / "mmproj.gguf", _tower(variant), bf16_kernel=True)
    picture = _picture(tmp_path, shape)
    theirs = mtmd_encode(path, picture, text_model, patch=14)
    ours = graphir.load(str(path)).new_context().encode_image(picture)
    assert [their.patches.dtype for their in theirs] == [np.float32] * len(ours) and ours
    for (tile, rows), their in zip(ours, theirs):
        assert np.array_equal(_patches(tile.pixels, 14), their.patches), tile.kind
        assert np.abs(rows - their.rows).max() <= 1e-3


# --------------------------------------------------------------------------- composed with a text model

PROMPT = "<|im_start|>user\nWhat is in this picture? <__media__> Answer briefly.<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def smollm2(text_model: Path) -> Model:  # noqa: F811 (the fixture imported above)
    return graphir.load(str(text_model))


@pytest.mark.parametrize("shape", sorted(PICTURES))
def test_a_prompt_with_a_picture_continues_as_mtmds(shape: str, tmp_path: Path, text_model: Path,  # noqa: F811
                                                    smollm2: Model) -> None:
    """SmolLM2-135M with the tiny LLaVA-1.6 tower: the prompt split as mtmd splits it (the tiles' rows and the
    overview's, no text between them), decoded causally: the logits after it within 1e-3 of llama.cpp's and the next
    8 greedy tokens llama.cpp's."""
    from llama_mtmd import mtmd_generate

    mmproj, picture = write_mmproj(tmp_path / "mmproj.gguf", _tower("anyres")), _picture(tmp_path, shape)
    layout, logits, tokens = mtmd_generate(mmproj, text_model, PROMPT, [picture], 8)
    ctx = smollm2.new_context(n_ctx=1024, mmproj=str(mmproj))
    chunks = ctx.tokenize(PROMPT, [picture])
    assert [c.tokens if c.rows is None else len(c) for c in chunks] == layout
    assert [len(c) for c in chunks if c.rows is not None] == [16] * EXPECTED_IMAGES["anyres"][shape]
    assert not any(c.both_ways for c in chunks)
    n_past = ctx.eval(chunks)
    assert np.abs(ctx.text.logits()[-1] - logits).max() <= 1e-3
    assert greedy_after(ctx, n_past, 8) == tokens


# --------------------------------------------------------------------------- bad files

BAD = {
    "odd pinpoints": ({PINPOINTS: [56, 112, 112]}, "key 'clip.vision.image_grid_pinpoints' has 3 values: it lists "
                                                   "widths and heights in pairs"),
    "partial tiles": ({PINPOINTS: [56, 100]}, "key 'clip.vision.image_grid_pinpoints': 56 x 100 is not whole tiles "
                                              "of the tower's 56 pixels"),
    "pinpoint of 0": ({PINPOINTS: [56, 0]}, "key 'clip.vision.image_grid_pinpoints[1]' is 0: it must be at least 1"),
    "feature layer beyond": ({FEATURE_LAYERS: [3]}, "key 'clip.vision.feature_layer' names layer 3, beyond the "
                                                    "tower's 2 (key 'clip.vision.block_count')"),
    "feature layer not a number": ({FEATURE_LAYERS: ["last"]}, "key 'clip.vision.feature_layer[0]' should be int, "
                                                               "got str 'last'"),
    "no image std": ({V.IMAGE_STD: [0.5]}, "key 'clip.vision.image_std' must hold at least 3 values (red, green, "
                                           "blue), got [0.5]"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_bad_llava_mmproj_is_one_line_naming_the_key(case: str, tmp_path: Path) -> None:
    keys, message = BAD[case]
    path = write_mmproj(tmp_path / "bad.gguf", _tower("anyres"))
    bad = ModelMeta(str(path), _tower("anyres", **keys).metadata(), open_model(str(path)).tensors)
    with pytest.raises(MetadataError, match=re.escape(f"{path}: {message}")) as e:
        bad.arch
    assert "\n" not in str(e.value)


def test_a_file_without_the_class_embedding_or_the_projector_is_refused(tmp_path: Path) -> None:
    path = write_mmproj(tmp_path / "m.gguf", _tower("anyres"), drop=("v.class_embd",))
    m = open_model(str(path))
    assert m.arch.check(m.tensors) == ["missing tensor 'v.class_embd'"]
    with pytest.raises(GraphirError, match=re.escape(f"{path}: missing tensor 'v.class_embd'")):
        m.build_graph()
    path = write_mmproj(tmp_path / "p.gguf", _tower("anyres"), drop=("mm.2.weight",))
    with pytest.raises(MetadataError, match=re.escape(
            f"{path}: missing tensor 'mm.2.weight' (its shape gives the tower's rows_width)")):
        open_model(str(path)).arch
