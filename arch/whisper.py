"""Whisper's audio encoder with Ultravox's or Voxtral's projector, as llama.cpp builds them (tools/mtmd/models/
whisper-enc.cpp).

The input is one chunk of log-mel spectrogram, 3000 frames of 10 ms (30 s; graphir.media.audio makes it as mtmd
does): two convolutions over time (kernels of 3, each followed by GELU; the second of stride 2, halving the frames)
make one row per 20 ms, which a ViT's encoder takes with learned positions and pre-norm layers (the ViT's roles, in
the file's ``a.*`` tensors; GELU by erf in the FFN). The projector stacks each ``stack_factor`` rows into one (the
last padded with zeros). Ultravox's then RMS-normalises it and runs a SwiGLU MLP whose halves are the other way
round from ggml's (SiLU of the second), with an RMS norm in the middle, into the text model's width; Voxtral's
averages the encoder's rows two at a time first and runs a plain MLP with GELU. Which is data: ``head`` and
``pool``.
Reference: Radford et al. 2022, "Robust Speech Recognition via Large-Scale Weak Supervision" (Whisper); Fixie.ai's
ultravox_model.py (UltravoxProjector, StackAudioFrames); Mistral AI 2025, "Voxtral"; llama.cpp
tools/mtmd/models/whisper-enc.cpp and clip.cpp (build_stack, build_vit's audio average pool).
"""

from __future__ import annotations

from typing import ClassVar

from gguf import MODEL_TENSOR as T
from gguf import Keys

from graphir.errors import MetadataError
from graphir.graph.ir import Node
from graphir.model import presets
from graphir.model.builder import Act, GraphBuilder, Norm
from graphir.model.hparams import HParams, Key
from graphir.model.presets import Preset
from graphir.model.tensors import TensorSpec, spec
from graphir.model.tower import FILE_ARCH, MediaText, Tower
from graphir.model.vit import AUDIO_TENSORS, Options, build_vit, encoder_tensors

A = Keys.ClipAudio
KERNEL = 3  # both convolutions' kernel over time (ggml_conv_1d_ph: padded by half of it)
PROJ_EPS = 1e-6  # Ultravox's RMS norms, whatever the encoder's epsilon


class Whisper(Tower):
    """The encoder, its rows averaged ``pool`` at a time after the layers where the projector asks (Voxtral: 2),
    stacked, and a projector of ``head``: ``swiglu`` (Ultravox: the stacked rows' RMS norm ``mm.a.norm_pre``,
    ``mm.a.mlp.1`` to twice the MLP's width, SiLU of its second half times its first, the RMS norm
    ``mm.a.norm_mid``, ``mm.a.mlp.2`` into the text width) or ``gelu`` (Voxtral: ``mm.a.mlp.1``, GELU by erf,
    ``mm.a.mlp.2``). The MLP's width is mlp.1's (no key gives it)."""

    modality = "audio"
    fixed_ffn_act = "gelu_erf"
    widths = (("proj_ff", "mm.a.mlp.1.weight", 1),)
    keys: ClassVar[tuple[Key, ...]] = (Key("stack_factor", A.Projector.STACK_FACTOR, int, required=True, minimum=1),)
    head: ClassVar[str]
    pool: ClassVar[int] = 0

    def __init__(self, hp: HParams):
        if self.head == "swiglu" and hp.proj_ff % 2:
            raise MetadataError(f"tensor 'mm.a.mlp.1.weight' is {hp.proj_ff} wide: SwiGLU takes two halves")
        super().__init__(hp)

    @property
    def encoder(self) -> Options:
        """What the ViT's encoder runs here: the file's a.* tensors, the average pool where the projector asks."""
        return Options(tensors=AUDIO_TENSORS, pool=self.pool)

    @property
    def n_pos(self) -> int:
        """The encoder's rows for a chunk of mel frames (1500 for 3000): the stride-2 convolution's outputs."""
        return (self.audio_prep.chunk + 2 * (KERNEL // 2) - KERNEL) // 2 + 1

    @property
    def n_pooled(self) -> int:
        """The rows after the encoder: its own, or the pool's."""
        return self.n_pos // self.pool if self.pool else self.n_pos

    @property
    def n_rows(self) -> int:
        """The rows out of a chunk: the encoder's, stack_factor to a row, the last padded."""
        return -(-self.n_pooled // self.hp.stack_factor)

    def tensors(self) -> list[TensorSpec]:
        hp = self.hp
        E, M, wide, F = hp.n_embd, hp.n_mel_bins, hp.n_embd * hp.stack_factor, hp.proj_ff
        out = [spec(T.A_ENC_CONV1D, (KERNEL, M, E), 1), spec(T.A_ENC_CONV1D, (1, E), 1, "bias", kind="vector"),
               spec(T.A_ENC_CONV1D, (KERNEL, E, E), 2), spec(T.A_ENC_CONV1D, (1, E), 2, "bias", kind="vector"),
               *encoder_tensors(hp, self.n_pos, self.encoder), spec(T.A_MMPROJ, (wide, F), 1)]
        if self.head == "gelu":
            return out + [spec(T.A_MMPROJ, (F, hp.projection_dim), 2)]
        return out + [spec(T.A_MM_NORM_PRE, (wide,), kind="vector"), spec(T.A_MM_NORM_MID, (F // 2,), kind="vector"),
                      spec(T.A_MMPROJ, (F // 2, hp.projection_dim), 2)]

    def build(self, b: GraphBuilder) -> None:
        mel = b.input("inp_raw", "f32", (self.audio_prep.chunk, self.hp.n_mel_bins))
        x = _conv(b, _conv(b, mel, 1, stride=1), 2, stride=2)
        x = b.op("cont", b.op("transpose", x, name="after_conv1d.t"), name="after_conv1d")
        x = self._stacked(b, build_vit(b, x, Norm.LAYER, self.encoder))
        if self.head == "gelu":
            x = b.build_ffn(x, up=b.w(T.A_MMPROJ, 1), gate=None, down=b.w(T.A_MMPROJ, 2), act=Act.GELU_ERF,
                            name="mm_2")
        else:
            x = self._swiglu(b, x)
        b.build_output(x)

    def _stacked(self, b: GraphBuilder, x: Node) -> Node:
        """Each stack_factor rows [E, n] as one row [E stack_factor] (clip's build_stack), zero rows after the
        last."""
        hp = self.hp
        short = -self.n_pooled % hp.stack_factor
        if short:
            x = b.op("pad", x, pad=(0, short, 0, 0), name="stack.padded")
        return b.reshape(x, (hp.n_embd * hp.stack_factor, self.n_rows), name="after_stacked")

    def _swiglu(self, b: GraphBuilder, x: Node) -> Node:
        """Ultravox's projector of the stacked rows."""
        half, n = self.hp.proj_ff // 2, self.n_rows
        x = b.op("mul", b.op("rms_norm", x, eps=PROJ_EPS, name="mm_norm_pre.rms_norm"), b.w(T.A_MM_NORM_PRE),
                 name="mm_norm_pre")
        x = b.op("mul_mat", b.w(T.A_MMPROJ, 1), x, name="mm_1")
        first, second = (b.op("view", x, shape=(half, n), strides=(1, 2 * half), offset=off, name=tag)
                         for tag, off in (("mm_1.first", 0), ("mm_1.second", half)))
        x = b.op("swiglu", second, first, name="mm_swiglu")
        x = b.op("mul", b.op("rms_norm", x, eps=PROJ_EPS, name="mm_norm_mid.rms_norm"), b.w(T.A_MM_NORM_MID),
                 name="mm_norm_mid")
        return b.op("mul_mat", b.w(T.A_MMPROJ, 2), x, name="mm_2")


def _conv(b: GraphBuilder, x: Node, i: int, stride: int) -> Node:
    """ggml_conv_1d_ph of x [L, C] by ``a.conv1d.<i>`` [3, C, E]: im2col's 1-D windows (rounded to f16, f32 for a
    bf16 kernel only), times the kernel, giving [L / stride, E]; plus the bias [1, E], then GELU by erf."""
    kernel = b.w(T.A_ENC_CONV1D, i)
    C, E = kernel.shape[1], kernel.shape[2]
    cols = b.op("im2col", x, kw=KERNEL, kh=0, s0=stride, s1=0, p0=KERNEL // 2, p1=0, d0=1, d1=0,
                type="f32" if kernel.dtype == "bf16" else "f16", name=f"conv{i}.windows")
    conv = b.op("mul_mat", cols, b.reshape(kernel, (KERNEL * C, E), name=f"conv{i}.kernel.rows"), name=f"conv{i}")
    conv = b.op("add", conv, b.w(T.A_ENC_CONV1D, i, "bias"), name=f"conv{i}.b")
    return b.op("gelu_erf", conv, name=f"conv{i}.gelu")


class UltravoxAudio(Whisper):
    """Ultravox's: no text around the rows in a prompt."""

    name = f"{FILE_ARCH}:ultravox"
    head = "swiglu"


class VoxtralAudio(Whisper):
    """Voxtral's: the encoder's rows averaged two at a time; ``[BEGIN_AUDIO]`` before the rows in a prompt."""

    name = f"{FILE_ARCH}:voxtral"
    head = "gelu"
    pool = 2
    media_text = MediaText(begin="[BEGIN_AUDIO]")


# ---- presets: released towers, as convert_hf_to_gguf writes their mmproj files ------------------------------

AA = A.Attention
# What Whisper's conversion writes beyond the required: the LayerNorms, the biases of Q, V, the output and the FFN
# (K has none), the final LayerNorm
WHISPER_TENSORS = (r"a\.blk\.\d+\.(ln1|ln2)\.(weight|bias)|a\.blk\.\d+\.(attn_q|attn_v|attn_out|ffn_up|ffn_down)\.bias|"
                   r"a\.post_ln\.(weight|bias)")
KEPT_F32 = r"a\.position_embd\.weight"  # the converter keeps position tables in f32 (its convolutions in f16)


def _whisper(projector: str, stack: int, proj_ff: int, text: int, source: str) -> Preset:
    """Whisper-large-v3's encoder (1280 wide, 32 layers of 20 heads, an FFN of 5120, 128 mel bins) and a projector
    stacking ``stack`` rows, its MLP ``proj_ff`` wide, into a text width of ``text``."""
    keys: dict[str, object] = {
        Keys.General.ARCHITECTURE: FILE_ARCH, Keys.Clip.PROJECTOR_TYPE: projector, Keys.Clip.HAS_AUDIO_ENCODER: True,
        A.EMBEDDING_LENGTH: 1280, A.BLOCK_COUNT: 32, AA.HEAD_COUNT: 20, A.FEED_FORWARD_LENGTH: 5120,
        AA.LAYERNORM_EPS: 1e-5, A.NUM_MEL_BINS: 128, A.PROJECTION_DIM: text, A.Projector.STACK_FACTOR: stack,
    }
    return Preset(f"{FILE_ARCH}:{projector}", keys, tied=False, include=WHISPER_TENSORS, f32=KEPT_F32, source=source,
                  tensor_shapes={"mm.a.mlp.1.weight": (1280 * stack, proj_ff)})


presets.register({
    # Whisper-large-v3-turbo's encoder, 8 rows stacked, an MLP 4096 wide into Llama-3.2-1B's width
    "Ultravox-Llama-3.2-1B-mmproj": _whisper("ultravox", 8, 4096, 2048,
                                             "fixie-ai/ultravox-v0_5-llama-3_2-1b config.json (stack_factor, "
                                             "hidden_size) and openai/whisper-large-v3-turbo config.json"),
    # Whisper-large-v3's encoder, rows pooled by 2 and stacked by 4 (the converter's), an MLP into Ministral-3B's
    # width (linear_1: the audio FFN's 5120 to the text width; linear_2: text to text)
    "Voxtral-Mini-3B-mmproj": _whisper("voxtral", 4, 3072, 3072,
                                       "mistralai/Voxtral-Mini-3B-2507 config.json (audio_config, text_config "
                                       "hidden_size) and llama.cpp's VoxtralWhisperEncoderModel (stack factor)"),
})
