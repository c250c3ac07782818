"""Qwen3-VL's tower (projector type "qwen3vl_merger"): learned positions resized to the picture's patches (bilinear,
corners aligned) besides M-RoPE, Q, K and V from one product, the merger and the deepstack mergers whose rows join
the main merger's; checked against llama.cpp's mtmd on tiny files the tests write."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from mmproj_files import V, tiny_tower, write_mmproj
from test_tower_qwen2vl import PROMPT, TEXT_WIDTH, VISION_TOKENS, _picture, made_text
from test_towers import _patches, greedy_after, text_model  # noqa: F401 (text_model: a fixture)

import graphir
from graphir.errors import MetadataError
from graphir.graph.verify import verify
from graphir.model.meta import ModelMeta, open_model

P = 14  # the tiny tower's patch
PROJECTOR = "qwen3vl_merger"
# the pictures of test_tower_qwen2vl at the sizes mtmd encodes them: 8 x 6 patches (the 4 x 4 position grid
# stretched), 18 x 10, 6 x 6 (a small picture scaled up to 9 blocks)
SIZES = {"exact": (112, 84), "wide": (252, 140), "small": (84, 84)}
# the rows' width as llama.cpp's clip_n_mmproj_embd gives it: mm.2's, once for the main merger and once for each
# deepstack layer the tiny file marks (both)
ROWS_WIDTH = 576 * 3


def test_a_tiny_qwen3_vl_mmproj_builds_its_graph_at_any_size(tmp_path: Path) -> None:
    """112 x 84 pixels: 8 x 6 patches, 12 merged rows, each the main merger's and both deepstack layers' (3 x 576
    wide); the 4 x 4 positions resized to 8 x 6; Q, K and V views of one product; no position grid at its own
    size resizes nothing."""
    m = open_model(str(write_mmproj(tmp_path / "mmproj.gguf", tiny_tower(PROJECTOR))))
    assert m.arch.name == f"clip:{PROJECTOR}" and m.arch.check(m.tensors) == [] and m.arch.any_size
    assert m.arch.deepstack == (0, 1) and m.arch.n_embd_out == 3 * 576 and m.arch.hp.n_pos == 16
    g = m.build_graph(image=(112, 84))
    verify(g)
    assert {n.name: n.shape for n in g.nodes if n.op == "input"} == {"inp_raw": (112, 84, 3), "positions": (192,)}
    assert g.outputs["embd"].shape == (3 * 576, 12)
    resized = [n for n in g.nodes if n.op == "interpolate"]
    assert [(n.shape, n.attrs["align_corners"]) for n in resized] == [((8, 6, 32), True)]
    assert [n.attrs["offset"] for n in g.nodes if n.op == "view" and n.name.startswith("blk.0.")] == [0, 32, 64]
    assert not [n for n in m.build_graph(image=(56, 56)).nodes if n.op == "interpolate"]


def test_the_preset_is_qwen3_vl_2bs_tower() -> None:
    m = open_model("Qwen3-VL-2B-mmproj")
    hp = m.arch.hp
    assert (hp.n_embd, hp.n_layer, hp.n_head, hp.n_ff, hp.patch_size, hp.projection_dim, hp.n_pos) == (
        1024, 24, 16, 4096, 16, 2048, 2304)
    assert m.arch.deepstack == (5, 11, 17) and m.arch.n_embd_out == 4 * 2048 and m.arch.check(m.tensors) == []
    assert m.tensors["v.blk.0.attn_qkv.weight"].shape == (1024, 3072)
    assert m.tensors["v.deepstack.17.fc2.weight"].shape == (4096, 2048)


@pytest.mark.parametrize("shape", sorted(SIZES))
@pytest.mark.parametrize("dtype", ["F32", "F16"])
def test_rows_and_pixels_are_mtmds(dtype: str, shape: str, tmp_path: Path, text_model: Path) -> None:  # noqa: F811
    """One image at the size mtmd gives the picture, pixel for pixel (where its im2col holds them, rounded to f16);
    its rows, the main merger's and both deepstack mergers', within 1e-3 of mtmd's."""
    from llama_mtmd import mtmd_encode

    path = write_mmproj(tmp_path / "mmproj.gguf", tiny_tower(PROJECTOR), Q[dtype])
    picture = _picture(tmp_path, shape)
    theirs = mtmd_encode(path, picture, text_model, patch=P, n_embd=ROWS_WIDTH)
    ours = graphir.load(str(path)).new_context().encode_image(picture)
    assert len(ours) == len(theirs) == 1
    (tile, rows), their = ours[0], theirs[0]
    assert tile.pixels.shape[:0:-1] == SIZES[shape]  # planes [3, H, W]
    assert np.array_equal(_patches(tile.pixels, P).astype(np.float16).astype(np.float32), their.patches)
    assert rows.shape == their.rows.shape == (SIZES[shape][0] * SIZES[shape][1] // (4 * P * P), ROWS_WIDTH)
    diff = float(np.abs(rows - their.rows).max())
    print(f"{PROJECTOR} {dtype} {shape}: rows {rows.shape}, max diff {diff:.3g}")
    assert diff <= 1e-3, diff


BAD = {
    "deepstack past the layers": ({V.IS_DEEPSTACK_LAYERS: [False, False, True]},
                                  "key 'clip.vision.is_deepstack_layers' marks layer 2; the tower has 2 layers"),
    "deepstack not a flag": ({V.IS_DEEPSTACK_LAYERS: [2, 0]},
                             "key 'clip.vision.is_deepstack_layers[0]' is 2: it must be at most 1"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_bad_qwen3_vl_mmproj_is_one_line_naming_the_key(case: str, tmp_path: Path) -> None:
    keys, message = BAD[case]
    path = write_mmproj(tmp_path / "bad.gguf", tiny_tower(PROJECTOR))
    bad = ModelMeta(str(path), tiny_tower(PROJECTOR, **keys).metadata(), open_model(str(path)).tensors)
    with pytest.raises(MetadataError, match=re.escape(message)):
        bad.arch.tensors()


def test_a_file_without_its_positions_is_refused(tmp_path: Path) -> None:
    path = write_mmproj(tmp_path / "m.gguf", tiny_tower(PROJECTOR), drop=("v.position_embd.weight",))
    with pytest.raises(MetadataError, match=re.escape("missing tensor 'v.position_embd.weight'")):
        open_model(str(path)).arch


# --------------------------------------------------------------------------- composed with a text model

# A tiny Qwen3-VL text model llama.cpp makes (M-RoPE in sections), 64 wide as the towers' merger rows, three layers
# of which the first two take deepstack rows (llama.cpp's last layer takes none): input rows 3 x 64 wide, as the
# tiny tower's
N_DEEPSTACK = 2


@pytest.fixture(scope="module")
def qwen3vl_text(tmp_path_factory: pytest.TempPathFactory, text_model: Path) -> Path:  # noqa: F811
    return made_text(tmp_path_factory.mktemp("qwen3vl") / "text.gguf", text_model, "qwen3vl",
                     n_layer=N_DEEPSTACK + 1, **{"qwen3vl.n_deepstack_layers": N_DEEPSTACK})


@pytest.mark.parametrize("shape", ["wide"])
def test_a_prompt_with_a_picture_continues_as_mtmds(shape: str, tmp_path: Path, qwen3vl_text: Path) -> None:
    """The prompt split as mtmd splits it (<|vision_start|>, the rows, <|vision_end|>), the rows (each deepstack
    layer's part added to its layer's output by the text model) at mtmd's M-RoPE positions and the text after them
    where mtmd continues it: the logits after the prompt within 1e-3 of llama.cpp's and the next 8 greedy tokens
    llama.cpp's."""
    from llama_mtmd import mtmd_generate

    tower = tiny_tower(PROJECTOR, **{V.PROJECTION_DIM: TEXT_WIDTH})
    mmproj, picture = write_mmproj(tmp_path / "mmproj.gguf", tower), _picture(tmp_path, shape)
    layout, logits, tokens = mtmd_generate(mmproj, qwen3vl_text, PROMPT, [picture], 8)
    model = graphir.load(str(qwen3vl_text))
    ctx = model.new_context(n_ctx=512, mmproj=str(mmproj))
    chunks = ctx.tokenize(PROMPT, [picture])
    assert [c.tokens if c.rows is None else len(c) for c in chunks] == layout
    begin, end = (model.vocab.tokenize(t, add_special=False, parse_special=True) for t in VISION_TOKENS)
    assert chunks[0].tokens[-1:] == tuple(begin) and chunks[2].tokens[:1] == tuple(end)
    px, py = (n // P // 2 for n in SIZES[shape])
    assert chunks[1].grid == (px, py) and chunks[1].rows.shape == (px * py, TEXT_WIDTH * (1 + N_DEEPSTACK))
    n_past = ctx.eval(chunks)
    assert n_past == len(chunks[0]) + max(px, py) + len(chunks[2])
    diff = float(np.abs(ctx.text.logits()[-1] - logits).max())
    print(f"{PROJECTOR} {shape}: logits max diff {diff:.3g}")
    assert diff <= 1e-3, diff
    assert greedy_after(ctx, n_past, 8) == tokens
