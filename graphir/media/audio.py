"""Audio as llama.cpp's mtmd prepares it for an audio tower (tools/mtmd/mtmd-audio.cpp), before the tower sees it:
decoded to mono float samples, then Whisper's log-mel spectrogram in mtmd's own float32 steps, cut into chunks of
the tower's input length.

mtmd decodes WAV, MP3 and FLAC with miniaudio to float32, one channel, at the tower's rate; here the same library
(the ``miniaudio`` package) decodes them with the same settings, and the samples are as many as mtmd reads: the
frame count miniaudio reports, counted at the tower's rate, a shortfall left as zeros. The spectrogram is mtmd's
arithmetic: its sin/cos table and Hann window (glibc's sinf and cosf), its radix-2 FFT down to an odd length and a
plain DFT there, power spectra by Slaney's mel filter bank summed four bins at a time, log10, clamped to 8 below the
largest value and scaled as (x + 4) / 4; the samples reflected at the start and followed by 30 s of silence, as
Whisper pads them.
"""

from __future__ import annotations

import math
import os
from functools import cache
from pathlib import Path

import miniaudio
import numpy as np

from graphir.errors import GraphirError
from graphir.graph.floats import cosf, sinf
from graphir.model.tower import AudioPrep

_F32 = np.float32
_MEL_FLOOR = 5.960464477539063e-08  # mtmd's floor of a mel band's power (a float), before log10
_INFO = {"WAV": miniaudio.wav_get_info, "MP3": miniaudio.mp3_get_info, "FLAC": miniaudio.flac_get_info}


def read_audio(path: str | os.PathLike[str], sample_rate: int) -> np.ndarray:
    """An audio file's samples as float32 mono [n] at ``sample_rate`` (the tower's), as mtmd's helper decodes them:
    a file mtmd takes for WAV, MP3 or FLAC (by its first bytes) through miniaudio, channels mixed and resampled;
    refused where mtmd fails (no decoder opens it, or not one frame decodes)."""
    label = os.fsdecode(path)
    try:
        data = Path(label).read_bytes()
    except FileNotFoundError:
        raise GraphirError(f"{label}: no such audio file") from None
    kind = _kind(data)
    if kind is None:
        raise GraphirError(f"{label}: not an audio file (WAV, MP3 or FLAC expected)")
    try:
        info = _INFO[kind](data)
        decoded = miniaudio.decode(data, miniaudio.SampleFormat.FLOAT32, 1, sample_rate)
    except miniaudio.DecodeError:
        raise GraphirError(f"{label}: cannot decode the {kind} data (corrupt, or an encoding miniaudio lacks)") \
            from None
    n = _frames_at(sample_rate, info.sample_rate, info.num_frames)
    got = np.frombuffer(decoded.samples, _F32)[:n]
    if got.size == 0:
        raise GraphirError(f"{label}: no {kind} frame decodes (empty or truncated)")
    samples = np.zeros(n, _F32)
    samples[:got.size] = got
    return samples


def _kind(head: bytes) -> str | None:
    """The format mtmd takes a file for by its first bytes (it needs 12): RIFF/WAVE, an ID3 tag or an MPEG sync
    word, fLaC."""
    if len(head) < 12:
        return None
    if head[:4] == b"RIFF" and head[8:12] == b"WAVE":
        return "WAV"
    if head[:3] == b"ID3" or (head[0] == 0xFF and head[1] & 0xE0 == 0xE0):
        return "MP3"
    return "FLAC" if head[:4] == b"fLaC" else None


def _frames_at(rate: int, source_rate: int, frames: int) -> int:
    """How many frames mtmd reads: miniaudio's count of a source's ``frames`` resampled to ``rate``
    (ma_calculate_frame_count_after_resampling): the whole frames of the ratio, one more when the source holds the
    input that one more needs by its integer estimate."""
    if rate == source_rate or frames == 0:
        return frames
    out = frames * rate // source_rate
    return out + (out * (source_rate % rate) + out * (source_rate // rate) // rate <= frames)


def log_mel(samples: np.ndarray, n_mel: int, prep: AudioPrep) -> list[np.ndarray]:
    """The chunks of Whisper's log-mel spectrogram of mono samples, as mtmd makes them with the tower's ``prep``:
    each float32 [n_mel, prep.chunk]; the last, incomplete chunk (the padding's) dropped."""
    rate, n_fft, window, hop, chunk = prep.sample_rate, prep.n_fft, prep.window, prep.hop, prep.chunk
    x = np.asarray(samples, _F32).reshape(-1)
    if x.size == 0:
        raise GraphirError("the audio holds no samples")
    if x.size < n_fft // 2 + 1:  # the reflection needs one sample more than half a window
        x = np.concatenate([x, np.zeros(n_fft // 2 + 1 - x.size, _F32)])
    edge = n_fft // 2
    padded = np.zeros(x.size + chunk * hop + 2 * edge, _F32)  # then a chunk's length (30 s) of silence
    padded[edge:edge + x.size] = x
    padded[:edge] = x[1:edge + 1][::-1]
    n_frames = (padded.size - n_fft) // hop + 1
    sin, cos = _table(n_fft)
    hann = np.zeros(n_fft, _F32)
    hann[(n_fft - window) // 2:(n_fft - window) // 2 + window] = _hann(window)
    frames = padded[np.arange(n_frames)[:, None] * hop + np.arange(n_fft)] * hann
    re, im = _fft(frames, sin, cos)
    bins = n_fft // 2 + 1
    power = re[:, :bins] * re[:, :bins] + im[:, :bins] * im[:, :bins]
    mel = _log10_mel(power, _filters(n_mel, n_fft, rate))
    wide = mel.astype(np.float64)  # compared and scaled in double, stored as floats
    floor = wide.max() - 8.0
    mel = ((np.where(wide < floor, np.float64(_F32(floor)), wide) + 4.0) / 4.0).astype(_F32)
    return [np.ascontiguousarray(mel[:, off:off + chunk]) for off in range(0, n_frames - chunk + 1, chunk)]


@cache
def _table(n: int) -> tuple[np.ndarray, np.ndarray]:
    """mtmd's sin and cos of 2 pi i / n, glibc's sinf and cosf of the angle rounded to a float."""
    angles = [2 * math.pi * i / n for i in range(n)]
    return np.array([sinf(a) for a in angles], _F32), np.array([cosf(a) for a in angles], _F32)


def _hann(n: int) -> np.ndarray:
    """A periodic Hann window: 0.5 (1 - cosf(2 pi i / n)), in double, stored as floats."""
    return np.array([0.5 * (1.0 - cosf(2.0 * math.pi * i / n)) for i in range(n)], _F32)


def _fft(x: np.ndarray, sin: np.ndarray, cos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """mtmd's forward FFT of real rows x [F, N] in float32: even and odd samples apart, recursively, down to an odd
    length, where a DFT sums the terms in order; the halves joined by the table's twiddles."""
    n = x.shape[1]
    if n == 1:
        return x.copy(), np.zeros_like(x)
    if n % 2:
        return _dft(x, sin, cos)
    er, ei = _fft(x[:, 0::2], sin, cos)
    odd_r, odd_i = _fft(x[:, 1::2], sin, cos)
    at = np.arange(n // 2) * (len(sin) // n)
    c, s = cos[at], -sin[at]
    tr, ti = c * odd_r, s * odd_i
    ur, ui = c * odd_i, s * odd_r
    return (np.concatenate([er + tr - ti, er - tr + ti], axis=1),
            np.concatenate([ei + ur + ui, ei - ur - ui], axis=1))


def _dft(x: np.ndarray, sin: np.ndarray, cos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The DFT of rows of odd length N: for each k, the terms x[n] cos and -x[n] sin added in order of n."""
    n = x.shape[1]
    at = (np.arange(n)[:, None] * np.arange(n)[None, :] * (len(sin) // n)) % len(sin)  # [k, n]
    re, im = np.zeros_like(x), np.zeros_like(x)
    for j in range(n):
        re += x[:, j, None] * cos[at[:, j]]
        im += -x[:, j, None] * sin[at[:, j]]
    return re, im


def _log10_mel(power: np.ndarray, filters: np.ndarray) -> np.ndarray:
    """Each frame's mel bands [n_mel, F]: the power by each filter, four bins' float products added in float and
    the blocks summed in double, floored and taken to log10, as floats."""
    bins = power.shape[1]
    total = np.zeros((filters.shape[0], power.shape[0]), np.float64)
    k = 0
    while k < bins - 3:
        block = power[None, :, k] * filters[:, k, None]
        for i in range(1, 4):
            block = block + power[None, :, k + i] * filters[:, k + i, None]
        total += block
        k += 4
    for j in range(k, bins):
        total += power[None, :, j] * filters[:, j, None]
    return np.log10(np.maximum(total, _MEL_FLOOR)).astype(_F32)


@cache
def _filters(n_mel: int, n_fft: int, rate: int) -> np.ndarray:
    """Slaney's mel filter bank [n_mel, n_fft / 2 + 1] from 0 Hz to half the rate, each triangle normalised by its
    width (librosa's default, which mtmd computes at load), in double, stored as floats."""
    lin, min_hz = 3 / 200.0, 1000.0
    min_mel, step = min_hz * lin, math.log(6.4) / 27.0

    def to_hz(m: float) -> float:
        return m / lin if m < min_mel else min_hz * math.exp((m - min_mel) * step)

    top = float(_F32(0.5) * _F32(rate))
    hi = top * lin if top < min_hz else min_mel + math.log(top / min_hz) / step
    hz = np.array([to_hz(hi * (i / (n_mel + 1))) for i in range(n_mel + 2)])
    f = np.arange(n_fft // 2 + 1) * (rate / n_fft)
    left, center, right = hz[:-2, None], hz[1:-1, None], hz[2:, None]
    up = (f - left) / np.maximum(1e-30, center - left)
    down = (right - f) / np.maximum(1e-30, right - center)
    w = np.where((f >= left) & (f <= center), up, np.where((f > center) & (f <= right), down, 0.0))
    return (w * (2.0 / np.maximum(1e-30, right - left))).astype(_F32)
