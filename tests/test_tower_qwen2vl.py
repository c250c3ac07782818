"""Qwen2-VL's and Qwen2.5-VL's towers (projector types "qwen2vl_merger", "qwen2.5vl_merger"): a picture encoded at
its own aspect, two patch kernels added, the 2 x 2 blocks' order, M-RoPE in ggml's vision mode, the merger;
Qwen2.5-VL's RMS norms, SwiGLU and window attention; checked against llama.cpp's mtmd on tiny files the tests
write."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from mmproj_files import V, tiny_tower, write_mmproj
from test_towers import _patches, greedy_after, text_model  # noqa: F401 (text_model: a fixture)

import graphir
from graphir.errors import MetadataError
from graphir.graph.verify import verify
from graphir.model.meta import ModelMeta, open_model

P = 14  # the tiny tower's patch
PROJECTORS = ("qwen2vl_merger", "qwen2.5vl_merger")
# pictures (seeded noise, PNG) and the size mtmd encodes each at: whole 2 x 2 blocks already (one window); sides
# rounded to blocks (252 x 140: 9 x 5 blocks, windows of 4 x 4 blocks, some partial); too few blocks (scaled up to 8)
PICTURES = {"exact": (112, 84), "wide": (250, 130), "small": (20, 20)}


def _picture(tmp_path: Path, shape: str) -> Path:
    from PIL import Image

    w, h = PICTURES[shape]
    path = tmp_path / f"{shape}.png"
    Image.fromarray(np.random.default_rng(w * h).integers(0, 256, (h, w, 3), dtype=np.uint8)).save(path)
    return path


@pytest.mark.parametrize("projector", PROJECTORS)
def test_a_tiny_qwen_vl_mmproj_builds_its_graph_at_any_size(projector: str, tmp_path: Path) -> None:
    """112 x 84 pixels: 8 x 6 patches, 12 merged rows; positions four a patch in the blocks' order; Qwen2.5-VL's
    window inputs (one window here: the identity permutation, a mask of zeros); Q and K turned in vision mode."""
    m = open_model(str(write_mmproj(tmp_path / "mmproj.gguf", tiny_tower(projector))))
    assert m.arch.name == f"clip:{projector}" and m.arch.check(m.tensors) == [] and m.arch.any_size
    assert "v.patch_embd.weight.1" in m.tensors and "v.position_embd.weight" not in m.tensors
    g = m.build_graph(image=(112, 84))
    verify(g)
    windowed = projector == "qwen2.5vl_merger"
    inputs = {n.name: n.shape for n in g.nodes if n.op == "input"}
    assert inputs == {"inp_raw": (112, 84, 3), "positions": (192,),
                      **({"window_mask": (48, 48), "window_idx": (12,), "inv_window_idx": (12,)} if windowed else {})}
    assert g.outputs["embd"].shape == (576, 12)
    ropes = [n for n in g.nodes if n.op == "rope_multi" and n.name.startswith("blk.0.")]
    assert [(n.attrs["n_dims"], n.attrs["mode"], tuple(n.attrs["sections"])) for n in ropes] == \
        [(4, "vision", (2, 2, 2, 2))] * 2
    given = m.arch.at_size(112, 84).image_inputs()
    pos = given["positions"].reshape(4, 48)
    assert pos[0, :8].tolist() == [0, 0, 1, 1, 0, 0, 1, 1] and pos[1, :8].tolist() == [0, 1, 0, 1, 2, 3, 2, 3]
    assert np.array_equal(pos[0], pos[2]) and np.array_equal(pos[1], pos[3])
    if windowed:
        assert given["window_idx"].tolist() == given["inv_window_idx"].tolist() == list(range(12))
        assert not given["window_mask"].any()


def test_qwen25_vl_windows_group_the_blocks() -> None:
    """252 x 140 pixels: 9 x 5 blocks in windows of 4 x 4 blocks (3 across, 2 down), each window's blocks together
    in raster order; the mask lets a patch see its own window's only; window_idx undoes inv_window_idx."""
    m = open_model("Qwen2.5-VL-7B-mmproj")
    assert m.arch.hp.n_wa_pattern == 8
    given = m.arch.at_size(252, 140).image_inputs()
    order, place = given["inv_window_idx"], given["window_idx"]
    assert order[:16].tolist() == [0, 1, 2, 3, 9, 10, 11, 12, 18, 19, 20, 21, 27, 28, 29, 30]
    assert np.array_equal(place[order], np.arange(45))
    mask = given["window_mask"]
    assert (mask[:64, :64] == 0).all() and (mask[:64, 64:] < -1e38).all()


def test_the_preset_is_qwen25_vl_7bs_tower() -> None:
    m = open_model("Qwen2.5-VL-7B-mmproj")
    hp = m.arch.hp
    assert (hp.n_embd, hp.n_layer, hp.n_head, hp.n_ff, hp.patch_size, hp.projection_dim) == (
        1280, 32, 16, 3420, 14, 3584)
    assert hp.ffn_act == "silu" and hp.n_merge == 2 and m.arch.check(m.tensors) == []
    assert m.tensors["mm.0.weight"].shape == (5120, 5120) and m.tensors["mm.2.weight"].shape == (5120, 3584)


@pytest.mark.parametrize("shape", sorted(PICTURES))
@pytest.mark.parametrize("dtype", ["F32", "F16"])
@pytest.mark.parametrize("projector", PROJECTORS)
def test_rows_and_pixels_are_mtmds(projector: str, dtype: str, shape: str, tmp_path: Path,
                                   text_model: Path) -> None:  # noqa: F811
    """One image at the size mtmd gives the picture, pixel for pixel (where its im2col holds them, rounded to f16);
    its rows within 1e-3 of mtmd's (Qwen2.5-VL's wide picture through windows and a full-attention layer)."""
    from llama_mtmd import mtmd_encode

    path = write_mmproj(tmp_path / "mmproj.gguf", tiny_tower(projector), Q[dtype])
    picture = _picture(tmp_path, shape)
    theirs = mtmd_encode(path, picture, text_model, patch=P)
    ours = graphir.load(str(path)).new_context().encode_image(picture)
    assert len(ours) == len(theirs) == 1
    (tile, rows), their = ours[0], theirs[0]
    assert np.array_equal(_patches(tile.pixels, P).astype(np.float16).astype(np.float32), their.patches)
    assert rows.shape == their.rows.shape
    diff = float(np.abs(rows - their.rows).max())
    print(f"{projector} {dtype} {shape}: rows {rows.shape}, max diff {diff:.3g}")
    assert diff <= 1e-3, diff


BAD = {
    "no window pattern": ("qwen2.5vl_merger", {V.N_WA_PATTERN: None}, "missing key 'clip.vision.n_wa_pattern'"),
    "merge of 3": ("qwen2vl_merger", {V.SPATIAL_MERGE_SIZE: 3},
                   "key 'clip.vision.spatial_merge_size' is 3: it must be at most 2"),
    "Qwen2-VL windows": ("qwen2vl_merger", {V.N_WA_PATTERN: 4},
                         "key 'clip.vision.n_wa_pattern' is 4: it must be at most 0"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_bad_qwen_vl_mmproj_is_one_line_naming_the_key(case: str, tmp_path: Path) -> None:
    projector, keys, message = BAD[case]
    path = write_mmproj(tmp_path / "bad.gguf", tiny_tower(projector))
    bad = ModelMeta(str(path), tiny_tower(projector, **keys).metadata(), open_model(str(path)).tensors)
    with pytest.raises(MetadataError, match=re.escape(f"{path}: {message}")):
        bad.arch


def test_a_file_without_the_second_kernel_is_refused(tmp_path: Path) -> None:
    path = write_mmproj(tmp_path / "m.gguf", tiny_tower("qwen2vl_merger"), drop=("v.patch_embd.weight.1",))
    m = open_model(str(path))
    assert m.arch.check(m.tensors) == ["missing tensor 'v.patch_embd.weight.1'"]


# --------------------------------------------------------------------------- composed with a text model

# A tiny Qwen2-VL text model llama.cpp makes (M-RoPE in sections), 64 wide as the towers' rows, with SmolLM2-135M's
# vocabulary, its last two entries renamed to the tokens mtmd wraps the rows in
TEXT_WIDTH = 64
VISION_TOKENS = ["<|vision_start|>", "<|vision_end|>"]
PROMPT = "<|im_start|>user\nWhat is in this picture? <__media__> Answer briefly.<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def qwen2vl_text(tmp_path_factory: pytest.TempPathFactory, text_model: Path) -> Path:  # noqa: F811
    return made_text(tmp_path_factory.mktemp("qwen2vl") / "text.gguf", text_model, "qwen2vl")


def made_text(path: Path, text_model: Path, arch: str, **keys: object) -> Path:
    """A tiny text model of ``arch`` llama.cpp makes at ``path`` (``keys``: its own beyond llama_made's), with
    ``text_model``'s vocabulary, the last entries renamed to VISION_TOKENS."""
    import gguf
    import llama_made

    reader = gguf.GGUFReader(str(text_model))
    vocab = {name: field.contents() for name, field in reader.fields.items() if name.startswith("tokenizer.ggml.")}
    tokens, types = vocab[gguf.Keys.Tokenizer.LIST], vocab[gguf.Keys.Tokenizer.TOKEN_TYPE]
    vocab[gguf.Keys.Tokenizer.LIST] = tokens[:-len(VISION_TOKENS)] + VISION_TOKENS
    vocab[gguf.Keys.Tokenizer.TOKEN_TYPE] = types[:-len(VISION_TOKENS)] + [int(gguf.TokenType.CONTROL)] * 2
    vocab.pop(gguf.Keys.Tokenizer.SCORES, None)
    return llama_made.make(path, arch, n_vocab=len(tokens), n_embd=TEXT_WIDTH, n_ctx=1024, **vocab, **keys)


@pytest.mark.parametrize("shape", ["wide", "exact"])
@pytest.mark.parametrize("projector", PROJECTORS)
def test_a_prompt_with_a_picture_continues_as_mtmds(projector: str, shape: str, tmp_path: Path,
                                                     qwen2vl_text: Path) -> None:
    """The prompt split as mtmd splits it (<|vision_start|>, the rows, <|vision_end|>), the rows at mtmd's M-RoPE
    positions (one time, each at its line and column) and the text after them where mtmd continues it: the logits
    after the prompt within 1e-3 of llama.cpp's and the next 8 greedy tokens llama.cpp's."""
    from llama_mtmd import mtmd_generate

    tower = tiny_tower(projector, **{V.PROJECTION_DIM: TEXT_WIDTH})
    mmproj, picture = write_mmproj(tmp_path / "mmproj.gguf", tower), _picture(tmp_path, shape)
    layout, logits, tokens = mtmd_generate(mmproj, qwen2vl_text, PROMPT, [picture], 8)
    model = graphir.load(str(qwen2vl_text))
    ctx = model.new_context(n_ctx=512, mmproj=str(mmproj))
    chunks = ctx.tokenize(PROMPT, [picture])
    assert [c.tokens if c.rows is None else len(c) for c in chunks] == layout
    begin, end = (model.vocab.tokenize(t, add_special=False, parse_special=True) for t in VISION_TOKENS)
    assert chunks[0].tokens[-1:] == tuple(begin) and chunks[2].tokens[:1] == tuple(end)
    px, py = (n // P // 2 for n in _sized(shape))
    assert chunks[1].grid == (px, py) and len(chunks[1]) == px * py
    n_past = ctx.eval(chunks)
    assert n_past == len(chunks[0]) + max(px, py) + len(chunks[2])
    diff = float(np.abs(ctx.text.logits()[-1] - logits).max())
    print(f"{projector} {shape}: logits max diff {diff:.3g}")
    assert diff <= 1e-3, diff
    assert greedy_after(ctx, n_past, 8) == tokens


def _sized(shape: str) -> tuple[int, int]:
    """The size mtmd encodes a picture at (whole 28-pixel blocks)."""
    return {"exact": (112, 84), "wide": (252, 140)}[shape]
