"""Pixtral's tower (projector type "pixtral"): a picture encoded at its own aspect (the graph built per size), 2D RoPE
on Q and K, RMS norms, a SwiGLU FFN, the GELU MLP projector, an [IMG_BREAK] row after each row of patches but the
last, Mistral-Small-3.1's patch merger where the file has it; checked against llama.cpp's mtmd on tiny files the
tests write, alone and composed with SmolLM2-135M."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from mmproj_files import TINY_INCLUDE, V, tiny_tower, write_mmproj, with_tokens
from test_towers import _patches, greedy_after, text_model  # noqa: F401 (text_model: a fixture)

import graphir
from graphir.errors import GraphirError, MetadataError
from graphir.graph.verify import verify
from graphir.model.meta import ModelMeta, open_model

P = 14  # the tiny tower's patch
# pictures (seeded noise, PNG) and the size mtmd encodes each at: whole patches already; sides rounded to patches
# (a letterbox: wider, taller); too few patches (scaled up to 8); too many (scaled down to 1024); one row of patches
# (no break rows)
PICTURES = {"exact": (56, 42), "wide": (90, 40), "tall": (30, 70), "small": (20, 20), "large": (700, 400),
            "strip": (112, 14)}
# the merger's variant: Mistral-Small-3.1's 2 x 2 patch merger, its norm and projection in the file
MERGER = {V.SPATIAL_MERGE_SIZE: 2}
MERGER_INCLUDE = TINY_INCLUDE["pixtral"] + r"|mm\.input_norm\.weight|mm\.patch_merger\.weight"


def _tower(merged: bool = False, **keys: object):
    preset = tiny_tower("pixtral", **{**(MERGER if merged else {}), **keys})
    return replace(preset, include=MERGER_INCLUDE) if merged else preset


def _picture(tmp_path: Path, shape: str) -> Path:
    from PIL import Image

    w, h = PICTURES[shape]
    path = tmp_path / f"{shape}.png"
    Image.fromarray(np.random.default_rng(w * h).integers(0, 256, (h, w, 3), dtype=np.uint8)).save(path)
    return path


def test_a_tiny_pixtral_mmproj_builds_its_graph_at_any_size(tmp_path: Path) -> None:
    """The default graph takes the file's square (56 pixels: 4 x 4 patches, 4 rows of 4 and 3 break rows); a
    sized copy takes 84 x 42 (6 x 3 patches: 18 rows and 2 breaks), pos_h and pos_w the patches' rows and columns;
    no learned positions, Q and K turned in two halves."""
    m = open_model(str(write_mmproj(tmp_path / "mmproj.gguf", _tower())))
    assert m.arch.name == "clip:pixtral" and m.arch.check(m.tensors) == [] and m.arch.any_size
    assert "v.position_embd.weight" not in m.tensors and "v.blk.0.ffn_gate.weight" in m.tensors
    g = m.build_graph()
    verify(g)
    inputs = {n.name: n.shape for n in g.nodes if n.op == "input"}
    assert inputs == {"inp_raw": (56, 56, 3), "pos_h": (16,), "pos_w": (16,)}
    assert g.outputs["embd"].shape == (576, 19)
    ropes = [n for n in g.nodes if n.op == "rope" and n.name.startswith("blk.0.Qcur")]
    assert [(n.attrs["n_dims"], n.attrs["mode"]) for n in ropes] == [(4, "norm")] * 2
    assert [n.attrs["freq_scale"] for n in ropes] == [1.0, float(np.float32(10000.0) ** np.float32(-2 / 8))]
    sized = m.build_graph(image=(84, 42))
    verify(sized)
    assert {n.name: n.shape for n in sized.nodes if n.op == "input"} == {
        "inp_raw": (84, 42, 3), "pos_h": (18,), "pos_w": (18,)}
    assert sized.outputs["embd"].shape == (576, 20)
    inputs = m.arch.at_size(84, 42).image_inputs()
    assert inputs["pos_h"].tolist() == [0] * 6 + [1] * 6 + [2] * 6 and inputs["pos_w"].tolist() == list(range(6)) * 3
    merged = open_model(str(write_mmproj(tmp_path / "merged.gguf", _tower(merged=True))))
    assert merged.arch.check(merged.tensors) == [] and merged.arch.hp.n_merge == 2
    out = merged.build_graph(image=(112, 56))  # 8 x 4 patches merged into 4 x 2 rows, one break
    verify(out)
    assert next(n for n in out.nodes if n.name == "merge.blocks").shape == (128, 4, 2)
    assert out.outputs["embd"].shape == (576, 9)


def test_the_preset_is_pixtral_12bs_tower() -> None:
    m = open_model("Pixtral-12B-mmproj")
    hp = m.arch.hp
    assert (hp.n_embd, hp.n_layer, hp.n_head, hp.n_ff, hp.image_size, hp.patch_size, hp.projection_dim) == (
        1024, 24, 16, 4096, 1024, 16, 5120)
    assert hp.ffn_act == "silu" and hp.n_merge == 1 and m.arch.check(m.tensors) == []
    assert m.tensors["v.token_embd.img_break"].shape[0] == 5120 and "mm.patch_merger.weight" not in m.tensors
    assert m.build_graph().outputs["embd"].shape == (5120, 64 * 64 + 63)


@pytest.mark.parametrize("shape", sorted(PICTURES))
@pytest.mark.parametrize("dtype", ["F32", "F16"])
@pytest.mark.parametrize("merged", [False, True], ids=["pixtral", "merger"])
def test_rows_and_pixels_are_mtmds(merged: bool, dtype: str, shape: str, tmp_path: Path, text_model: Path) -> None:
    """One image at the size mtmd gives the picture (its sides rounded to patches, or scaled into 8 to 1024 of
    them: the small and large pictures), pixel for pixel (where its im2col holds them, rounded to f16); its rows
    within 1e-3 of mtmd's. mtmd makes a break row as an uninitialised tensor scaled by 0 plus the break embedding:
    the embedding itself where that memory held a number, NaN where it held a NaN or an infinity (which happens
    when other tests ran before in the process). graphir's break rows are the file's embedding, bit for bit, and
    every row mtmd defines is held to it."""
    from llama_mtmd import mtmd_encode

    path = write_mmproj(tmp_path / "mmproj.gguf", _tower(merged), Q[dtype])
    picture = _picture(tmp_path, shape)
    theirs = mtmd_encode(path, picture, text_model, patch=P)
    ours = graphir.load(str(path)).new_context().encode_image(picture)
    assert len(ours) == len(theirs) == 1
    (tile, rows), their = ours[0], theirs[0]
    assert np.array_equal(_patches(tile.pixels, P).astype(np.float16).astype(np.float32), their.patches)
    assert rows.shape == their.rows.shape
    breaks = _break_rows(tile.pixels.shape, 2 if merged else 1)
    embedding = next(t for t in gguf.GGUFReader(path).tensors if t.name == "v.token_embd.img_break").data
    assert np.array_equal(rows[breaks], np.broadcast_to(embedding, (len(breaks), rows.shape[1])))
    defined = np.isfinite(their.rows).all(axis=1)
    assert np.delete(defined, breaks).all(), "mtmd's patch rows are all numbers"
    assert np.abs(rows[defined] - their.rows[defined]).max() <= 1e-3, float(np.abs(rows - their.rows)[defined].max())


def _break_rows(planes: tuple[int, ...], merge: int) -> list[int]:
    """Where the break rows lie among an image's rows: after each row of its (merged) patches but the last."""
    px, py = planes[2] // P // merge, planes[1] // P // merge
    return [line * (px + 1) + px for line in range(py - 1)]


def test_an_image_of_its_own_size_is_encoded_by_its_own_graph(tmp_path: Path) -> None:
    """Pixels of a size in whole patches compile that size's graph once; a size of partial patches, or a square
    tower given another size, is one line naming it."""
    path = write_mmproj(tmp_path / "mmproj.gguf", _tower())
    model = graphir.load(str(path))
    ctx = model.new_context()
    wide = np.zeros((3, 42, 84), np.float32)
    assert ctx.encode(wide).shape == (20, 576) and ctx.encode(wide).shape == (20, 576)
    assert ctx.encode(np.zeros((3, 56, 56), np.float32)).shape == (19, 576)
    with pytest.raises(GraphirError, match=re.escape(
            f"{path}: a 'clip:pixtral' tower takes images of whole 14-pixel patches, not 80 x 42")):
        ctx.encode(np.zeros((3, 42, 80), np.float32))
    with pytest.raises(GraphirError, match=re.escape(
            f"{path}: the tower encodes float32 pixels [3, height, width] of whole 14-pixel patches, got float32 "
            f"[42, 84]")):
        ctx.encode(np.zeros((42, 84), np.float32))
    gemma = open_model(str(write_mmproj(tmp_path / "gemma.gguf", tiny_tower("gemma3"))))
    with pytest.raises(MetadataError, match=re.escape(
            "a 'clip:gemma3' tower takes images of its own 56 pixels square, not 84 x 42")):
        gemma.build_graph(image=(84, 42))


BAD = {
    "merge of 0": ({V.SPATIAL_MERGE_SIZE: 0}, "key 'clip.vision.spatial_merge_size' is 0: it must be at least 1"),
    "no patch size": ({V.PATCH_SIZE: None}, "missing key 'clip.vision.patch_size'"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_bad_pixtral_mmproj_is_one_line_naming_the_key(case: str, tmp_path: Path) -> None:
    keys, message = BAD[case]
    path = write_mmproj(tmp_path / "bad.gguf", _tower())
    bad = ModelMeta(str(path), _tower(**keys).metadata(), open_model(str(path)).tensors)
    with pytest.raises(MetadataError, match=re.escape(f"{path}: {message}")):
        bad.arch


def test_a_file_without_the_break_row_is_refused(tmp_path: Path) -> None:
    path = write_mmproj(tmp_path / "m.gguf", _tower(), drop=("v.token_embd.img_break",))
    m = open_model(str(path))
    assert m.arch.check(m.tensors) == ["missing tensor 'v.token_embd.img_break'"]
    with pytest.raises(GraphirError, match=re.escape(f"{path}: missing tensor 'v.token_embd.img_break'")):
        m.build_graph()


# --------------------------------------------------------------------------- composed with a text model

# Pixtral's text model has [IMG_BREAK] and [IMG_END] (mtmd wraps the rows in the latter): SmolLM2-135M with its last
# entries renamed to them stands in for it
PIXTRAL_TOKENS = ["[IMG_BREAK]", "[IMG_END]"]
PROMPT = "<|im_start|>user\nWhat is in this picture? <__media__> Answer briefly.<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def pixtral_text(tmp_path_factory: pytest.TempPathFactory, text_model: Path) -> Path:  # noqa: F811
    return with_tokens(text_model, tmp_path_factory.mktemp("pixtral") / "text.gguf", PIXTRAL_TOKENS)


@pytest.mark.parametrize("shape", ["strip"])
def test_a_prompt_with_a_picture_continues_as_mtmds(shape: str, tmp_path: Path, pixtral_text: Path) -> None:
    """The prompt split as mtmd splits it (the picture's rows, then [IMG_END]), decoded: the logits after it within
    1e-3 of llama.cpp's and the next 8 greedy tokens llama.cpp's. The picture is one patch high: mtmd's break rows
    (see the rows test) may be NaN and would turn its logits NaN; the rows test holds the break rows."""
    from llama_mtmd import mtmd_generate

    mmproj, picture = write_mmproj(tmp_path / "mmproj.gguf", _tower()), _picture(tmp_path, shape)
    layout, logits, tokens = mtmd_generate(mmproj, pixtral_text, PROMPT, [picture], 8)
    model = graphir.load(str(pixtral_text))
    ctx = model.new_context(n_ctx=512, mmproj=str(mmproj))
    chunks = ctx.tokenize(PROMPT, [picture])
    assert [c.tokens if c.rows is None else len(c) for c in chunks] == layout
    end = model.vocab.tokenize("[IMG_END]", add_special=False, parse_special=True)
    assert len(end) == 1 and chunks[2].tokens[0] == end[0]
    n_past = ctx.eval(chunks)
    diff = float(np.abs(ctx.text.logits()[-1] - logits).max())
    assert diff <= 1e-3, diff
    assert greedy_after(ctx, n_past, 8) == tokens
