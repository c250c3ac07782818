"""Specification of the ``graphir`` command line (graphir.cli, graphir.source, ``python -m graphir``).

Most cases call ``main([...])`` in-process and read stdout/stderr with capsys; a few run real subprocesses
to pin down what only a process shows (exit status, tracebacks, imported modules, hash-seed independence).
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest

import graphir.arch
from graphir.model.meta import open_model
from gguf import MODEL_TENSOR as T

from graphir.cli import main
from graphir.graph.hashing import graph_hash
from graphir.source import load_graph

QT = gguf.GGMLQuantizationType
PRESETS = ["SmolLM2-135M", "Llama-3.1-8B", "Llama-3.1-70B", "Llama-3.1-405B", "Mixtral-8x7B", "Qwen2.5-0.5B",
           "Qwen2.5-72B", "Qwen3-0.6B", "Qwen3-8B", "DeepSeek-V2-Lite", "DeepSeek-V3",
           "Qwen3-30B-A3B", "gpt-oss-20b", "gpt-oss-120b", "Qwen3.5-0.8B",
           "SmolLM3-3B", "GPT-2",
           "Phi-3-mini-4k", "Phi-3.5-mini", "Phi-4-mini", "BERT-base", "all-MiniLM-L6-v2", "Mamba-130M", "Mamba-2.8B",
           "Mamba-2-2.7B", "Granite-4.0-H-Tiny", "Granite-4.0-H-Small", "Gemma-2B", "Gemma-7B", "Gemma-2-2B", "Gemma-2-27B",
           "Gemma-3-1B", "Gemma-3-27B", "Gemma-3-270M", "T5-small", "T5-large", "flan-t5-xl", "T5-v1.1-XXL-encoder", "nomic-embed-text-v1.5", "Command-R-35B",
           "RWKV6-1.6B",
           "Arcee-tiny", "ERNIE-4.5-0.3B", "EXAONE-3.5-2.4B", "XVERSE-tiny", "Orion-14B", "InternLM2-7B", "Qwen-7B",
           "Seed-OSS-36B", "openPangu-Embedded-tiny", "Maincoder-tiny", "Hunyuan-dense-tiny", "Mistral-Small-3.1-24B",
           "Baichuan2-7B", "Baichuan2-13B",
           "Granite-3.1-2B", "MiniCPM-2B", "MiniCPM3-4B", "PLM-tiny", "Deci-tiny", "OpenELM-270M", "Nanbeige-tiny", "BitNet-b1.58-2B-4T", "Apertus-tiny",
           "Granite-3.1-3B-A800M",
           "GLM-4.5-Air", "GLM-4.6", "Qwen1.5-MoE-A2.7B", "MiniMax-M2", "OLMoE-1B-7B",
           "ERNIE-4.5-21B-A3B", "DBRX", "DeepSeek-MoE-16B",
           "dots.llm1", "Ling-lite", "Ling-2.0-synthetic",
           "Hunyuan-A13B", "Phi-3.5-MoE", "HY-V3-synthetic",
           "Llama-4-Scout", "Qwen3.5-397B-A17B", "Grok-1", "Snowflake-Arctic", "mistral4-tiny-header",  # issue 39
           "smallthinker-tiny-header", "maple-tiny-header", "mellum-tiny-header", "exaone-moe-tiny-header",
           "laguna-tiny-header", "mimo2-tiny-header", "step35-tiny-header", "granite_swa-tiny-header", "grovemoe-tiny-header", "cohere2moe-tiny-header", "afmoe-tiny-header",
           "Refact-1.6B", "BLOOM-560M", "StarCoder-15.5B", "StarCoder2-3B", "Command-R7B", "OLMo-2-7B", "Pythia-1.4B", "Phi-2", "Falcon-7B", "StableLM-2-1.6B", "GLM-4-9B",
           "CodeShell-tiny", "Jais2-tiny", "Nemotron-tiny", "OLMo-tiny", "PLaMo-tiny", "MPT-7B", "Jais-tiny", "GLM-4-tiny", "EXAONE-4-tiny",
           "EXAONE-4-32B-tiny", "PLaMo-3-tiny", "PLaMo-3-tiny-swa", "Talkie-tiny",
           "Muse-Glimmer-tiny", "Spark-2.5-tiny",
           "Falcon-H1-1.5B", "LFM2-1.2B", "LFM2-8B-A1B", "Qwen3-Next-80B-A3B",
           "Nemotron-H-8B", "Nemotron-Nano-9B-v2", "nemotron_h_moe-tiny-header", "Jamba-Mini-1.6", "PLaMo-2-1B",  # issue 40
           "Kimi-Linear-48B-A3B", "bailingmoe3-tiny-header",  # issue 40, new recurrent blocks
           "QRWKV6-32B",  # issue 40, linear-attention blocks
           "DeepSeek-V3.2-Exp", "glm-dsa-tiny-header",  # issue 40: sparse attention
           "RWKV7-World-0.1B", "RWKV7-World-1.5B", "ARWKV7-tiny",  # issue 40: RWKV-7
           "Gemma-3n-E2B", "Gemma-4-E2B",  # issue 40: cross-layer KV reuse
           "jina-embeddings-v2-base", "jina-embeddings-v3", "bge-reranker-v2-m3", "Qwen3-Embedding-0.6B", "nomic-embed-text-v2-moe",
           "EmbeddingGemma-300M", "llama-embed-tiny-header", "ModernBERT-base",  # issue 41
           "NeoBERT", "EuroBERT-210m",  # issue 41: pre-RMSNorm encoders
           "Qwen2.5-VL-7B", "Qwen3-VL-8B", "Qwen3-VL-30B-A3B", "PaddleOCR-VL-tiny", "Hunyuan-VL-tiny", "DeepSeek-OCR-tiny",
           "CogVLM-tiny",  # issue 41: vision-language text decoders
           "MiniMax-Text-01",  # issue 40, lightning attention
           "Dream-v0-Instruct-7B", "LLaDA-8B-Instruct", "llada-moe-tiny-header",  # issue 41: diffusion decoders
           "rnd1-tiny-header",
           "Gemma-3-4B-mmproj", "SmolVLM-256M-mmproj", "LLaVA-1.6-Mistral-7B-mmproj",  # issue 42: vision towers
           "Pixtral-12B-mmproj", "Qwen2.5-VL-7B-mmproj", "Qwen3-VL-2B-mmproj",
           "Ultravox-Llama-3.2-1B-mmproj", "Voxtral-Mini-3B-mmproj"]  # audio towers
# no layer's text folds into another's: OpenELM's layers each have a size of their own, Gemma 3n's and Gemma 4's each
# read their own slice of the per-layer inputs (at an offset of its own)
UNFOLDED = {"OpenELM-270M", "Gemma-3n-E2B", "Gemma-4-E2B"}
GRAPH_KINDS = [("kv", "prefill"), ("kv", "decode"), ("none", "prefill")]

# --------------------------------------------------------------------------- helpers

# A tiny llama: 2 layers, n_embd 64, 4 heads of 16 (2 kv heads), n_ff 128, vocab 256.
E, N_LAYER, N_HEAD, N_HEAD_KV, F, V = 64, 2, 4, 2, 128, 256
HEAD = E // N_HEAD
RMS_EPS_KEY = gguf.Keys.Attention.LAYERNORM_RMS_EPS.format(arch="llama")


def tensor_name(t: T, il: int | None = None, suffix: str = "weight") -> str:
    base = gguf.TENSOR_NAMES[t].format(bid=il) if il is not None else gguf.TENSOR_NAMES[t]
    return f"{base}.{suffix}"


def tiny_llama_tensors() -> dict[str, tuple[int, ...]]:
    """Name -> ggml-order shape of every tensor arch/llama.py expects (untied output head, no biases)."""
    shapes = {
        tensor_name(T.TOKEN_EMBD): (E, V),
        tensor_name(T.OUTPUT_NORM): (E,),
        tensor_name(T.OUTPUT): (E, V),
    }
    for il in range(N_LAYER):
        shapes.update({
            tensor_name(T.ATTN_NORM, il): (E,),
            tensor_name(T.ATTN_Q, il): (E, N_HEAD * HEAD),
            tensor_name(T.ATTN_K, il): (E, N_HEAD_KV * HEAD),
            tensor_name(T.ATTN_V, il): (E, N_HEAD_KV * HEAD),
            tensor_name(T.ATTN_OUT, il): (N_HEAD * HEAD, E),
            tensor_name(T.FFN_NORM, il): (E,),
            tensor_name(T.FFN_GATE, il): (E, F),
            tensor_name(T.FFN_UP, il): (E, F),
            tensor_name(T.FFN_DOWN, il): (F, E),
        })
    return shapes


def write_tiny_gguf(path: Path, *, arch: str = "llama", drop_keys: tuple[str, ...] = (),
                    drop_tensors: tuple[str, ...] = (), shapes: dict[str, tuple[int, ...]] | None = None,
                    f16: tuple[str, ...] = (), extra: dict[str, tuple[int, ...]] | None = None) -> Path:
    """Write the tiny llama with small F32 weights; the keyword arguments break it on purpose.

    Shapes are ggml order; numpy arrays are the reverse (ggml (E, V) is numpy (V, E)).
    """
    w = gguf.GGUFWriter(str(path), arch)
    keys = {
        gguf.Keys.LLM.CONTEXT_LENGTH: 256, gguf.Keys.LLM.EMBEDDING_LENGTH: E, gguf.Keys.LLM.BLOCK_COUNT: N_LAYER,
        gguf.Keys.LLM.FEED_FORWARD_LENGTH: F, gguf.Keys.Attention.HEAD_COUNT: N_HEAD,
        gguf.Keys.Attention.HEAD_COUNT_KV: N_HEAD_KV, gguf.Keys.Rope.FREQ_BASE: 10000.0,
        gguf.Keys.Attention.LAYERNORM_RMS_EPS: 1e-5, gguf.Keys.LLM.VOCAB_SIZE: V,
    }
    for template, value in keys.items():
        key = template.format(arch=arch)
        if key in drop_keys:
            continue
        if isinstance(value, float):
            w.add_float32(key, value)
        else:
            w.add_uint32(key, value)
    rng = np.random.default_rng(0)
    table = {**tiny_llama_tensors(), **(shapes or {}), **(extra or {})}
    for name, shape in table.items():
        if name in drop_tensors:
            continue
        data = (rng.standard_normal(tuple(reversed(shape))) * 0.02).astype(np.float32)
        w.add_tensor(name, data.astype(np.float16) if name in f16 else data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def run(capsys: pytest.CaptureFixture[str], *argv: object) -> tuple[int, str, str]:
    """main(argv) in-process: (exit status, stdout, stderr)."""
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def ok(capsys: pytest.CaptureFixture[str], *argv: object) -> str:
    rc, out, err = run(capsys, *argv)
    assert (rc, err) == (0, ""), err
    return out


def user_error(capsys: pytest.CaptureFixture[str], *argv: object) -> str:
    """Assert the one-line error contract and return the message."""
    rc, out, err = run(capsys, *argv)
    assert rc == 2, (rc, out, err)
    assert out == ""
    assert err.startswith("graphir: error: ") and err.endswith("\n") and err.count("\n") == 1, err
    assert "Traceback" not in err
    return err[len("graphir: error: "):-1]


def graphir_process(*argv: object, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "graphir", *map(str, argv)], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=300)


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    return write_tiny_gguf(tmp_path / "tiny.gguf")


@pytest.fixture(scope="module")
def smol(smollm2_gguf: Path) -> Path:
    return smollm2_gguf


# --------------------------------------------------------------------------- no command, help, version


def test_no_arguments_prints_help(capsys):
    out = ok(capsys)
    assert out.startswith("usage: graphir")
    for cmd in ("dump", "diff", "hash", "check", "archs", "info", "strip"):
        assert cmd in out


def test_help_and_version_exit_0(capsys):
    assert "--context" in ok(capsys, "dump", "--help")
    assert ok(capsys, "--version").startswith("graphir ")


@pytest.mark.parametrize("argv, fragment", [
    (["frobnicate"], "invalid choice: 'frobnicate'"),
    (["dump"], "required: SRC"),
    (["dump", "SmolLM2-135M", "--format", "png"], "invalid choice: 'png'"),
    (["dump", "SmolLM2-135M", "--context", "paged"], "invalid choice: 'paged'"),
    (["dump", "SmolLM2-135M", "--bogus"], "unrecognized arguments: --bogus"),
    (["strip", "x.gguf"], "required: -o/--output"),
    (["diff", "SmolLM2-135M"], "required: B"),
])
def test_usage_errors_are_one_line(capsys, argv, fragment):
    assert fragment in user_error(capsys, *argv)


# --------------------------------------------------------------------------- dump


@pytest.mark.parametrize("preset", PRESETS)
def test_dump_every_preset_in_every_form(capsys, preset):
    text = ok(capsys, "dump", preset)
    assert text.startswith("graphir graph v1\n")
    assert ("\n... blk." in text) != (preset in UNFOLDED)  # folded (interleaved: layer by layer)
    full = ok(capsys, "dump", preset, "--full")
    assert "..." not in full and (len(full) > len(text)) != (preset in UNFOLDED)
    doc = json.loads(ok(capsys, "dump", preset, "--format", "json"))
    assert doc["format"] == "graphir-graph" and doc["meta"]["context"] == open_model(preset).arch.contexts[0]
    assert ok(capsys, "dump", preset, "--format", "dot").lstrip().startswith(("digraph", "strict digraph"))


def test_preset_names_are_case_insensitive(capsys):
    assert ok(capsys, "dump", "smollm2-135m") == ok(capsys, "dump", "SmolLM2-135M")


@pytest.mark.parametrize("context, phase", GRAPH_KINDS)
def test_dump_context_and_phase(capsys, context, phase):
    out = ok(capsys, "dump", "Qwen2.5-0.5B", "--context", context, "--phase", phase)
    assert f"\ncontext {context}\nphase {phase}\n" in out


@pytest.mark.parametrize("fmt, extra", [("text", []), ("text", ["--full"]), ("json", [])])
@pytest.mark.parametrize("context, phase", GRAPH_KINDS)
def test_dump_round_trips_through_a_saved_graph(capsys, tmp_path, fmt, extra, context, phase):
    first = ok(capsys, "dump", "SmolLM2-135M", "--format", fmt, *extra, "--context", context, "--phase", phase)
    saved = tmp_path / f"saved.{fmt}"
    saved.write_text(first)
    assert ok(capsys, "dump", saved, "--format", fmt, *extra) == first  # saved context/phase are kept
    assert ok(capsys, "dump", saved, "--format", fmt, *extra, "--context", context, "--phase", phase) == first
    # across forms: the saved graph re-dumped in every form equals the preset's, and so does its hash
    assert ok(capsys, "hash", saved) == ok(capsys, "hash", "SmolLM2-135M", "--context", context, "--phase", phase)
    for other in (["--format", "text"], ["--format", "text", "--full"], ["--format", "json"]):
        assert ok(capsys, "dump", saved, *other) == ok(
            capsys, "dump", "SmolLM2-135M", *other, "--context", context, "--phase", phase)


def test_saved_graphs_are_recognised_by_content_not_extension(capsys, tmp_path):
    text, js = tmp_path / "looks-like.gguf", tmp_path / "looks-like.txt"
    text.write_text(ok(capsys, "dump", "Qwen2.5-0.5B"))
    js.write_text(ok(capsys, "dump", "Qwen2.5-0.5B", "--format", "json"))
    assert ok(capsys, "dump", text, "--format", "json") == js.read_text()
    assert ok(capsys, "dump", js) == text.read_text()


def test_dump_to_file_prints_nothing_and_matches_stdout(capsys, tmp_path):
    out = tmp_path / "g.txt"
    assert ok(capsys, "dump", "SmolLM2-135M", "-o", out) == ""
    assert out.read_text() == ok(capsys, "dump", "SmolLM2-135M")


def test_dump_of_a_gguf_mentions_no_path(capsys, tiny):
    for fmt in ("text", "json", "dot"):
        out = ok(capsys, "dump", tiny, "--format", fmt)
        assert str(tiny.parent) not in out and "tiny" not in out


def test_dump_layers_selects_layers_of_the_dot_graph(capsys):
    whole = ok(capsys, "dump", "SmolLM2-135M", "--format", "dot")
    part = ok(capsys, "dump", "SmolLM2-135M", "--format", "dot", "--layers", "2:4")
    assert part != whole and len(part) < len(whole)
    assert "blk.2." in part and "blk.3." in part
    assert "blk.0." not in part and "blk.7." not in part and "blk.29." not in part
    assert ok(capsys, "dump", "SmolLM2-135M", "--format", "dot", "--layers", "2:4") == part


@pytest.mark.parametrize("spec", ["banana", "3:1", "0:99", "-1:2", ""])
def test_dump_bad_layers_is_a_user_error(capsys, spec):
    assert "--layers" in user_error(capsys, "dump", "SmolLM2-135M", "--format", "dot", "--layers", spec)


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_layers_needs_a_picture_format(capsys, fmt):
    msg = user_error(capsys, "dump", "SmolLM2-135M", "--format", fmt, "--layers", "0:1")
    assert msg == f"--layers applies only to --format dot and svg (not {fmt})"


def test_full_needs_text(capsys):
    assert user_error(capsys, "dump", "SmolLM2-135M", "--format", "json", "--full") == \
        "--full applies only to --format text (not json)"


def test_failed_dump_writes_no_output_file(capsys, tmp_path):
    out = tmp_path / "g.txt"
    user_error(capsys, "dump", "no-such-model", "-o", out)
    user_error(capsys, "dump", "SmolLM2-135M", "--context", "none", "--phase", "decode", "-o", out)
    assert not out.exists()


def test_unwritable_output_is_a_user_error(capsys, tmp_path):
    msg = user_error(capsys, "dump", "SmolLM2-135M", "-o", tmp_path / "no-dir" / "g.txt")
    assert msg.startswith(str(tmp_path / "no-dir" / "g.txt") + ": cannot write")


class _FailsMidWrite:
    """A file whose first write stores half its data, then raises ``error`` (a full disk, a Ctrl-C)."""

    def __init__(self, path: str, mode: str, error: BaseException, sizes: list[int]):
        self.f, self.error, self.sizes = open(path, mode), error, sizes  # noqa: SIM115
        self.path = path

    def write(self, data: bytes) -> int:
        self.f.write(data[:len(data) // 2])
        self.f.flush()
        self.sizes.append(os.path.getsize(self.path))
        raise self.error

    def __enter__(self) -> _FailsMidWrite:
        return self

    def __exit__(self, *exc: object) -> None:
        self.f.close()


@pytest.mark.parametrize("error, rc, message", [
    (OSError(28, "No space left on device"), 2, "{0}: cannot write (No space left on device)"),
    (KeyboardInterrupt(), 130, "interrupted")], ids=["disk full", "interrupted"])
def test_a_write_failing_midway_leaves_the_old_output(capsys, tmp_path, monkeypatch, error, rc, message):
    from graphir.files import atomic

    out = tmp_path / "g.txt"
    out.write_text("the graph of yesterday\n")
    sizes: list[int] = []
    monkeypatch.setattr(atomic, "open", lambda p, m="r": _FailsMidWrite(p, m, error, sizes), raising=False)
    assert run(capsys, "dump", "SmolLM2-135M", "-o", out) == (rc, "", f"graphir: error: {message.format(out)}\n")
    assert sizes and sizes[0] > 0  # it failed with part of the graph written
    assert out.read_text() == "the graph of yesterday\n"
    assert [p.name for p in tmp_path.iterdir()] == ["g.txt"]


def test_dump_replaces_an_existing_output_whole(capsys, tmp_path):
    out = tmp_path / "g.txt"
    out.write_text("x" * 10**6)
    assert ok(capsys, "dump", "Qwen2.5-0.5B", "-o", out) == ""
    assert out.read_text() == ok(capsys, "dump", "Qwen2.5-0.5B")
    assert [p.name for p in tmp_path.iterdir()] == ["g.txt"]


def test_dump_to_a_device_writes_through_it(capsys):
    assert ok(capsys, "dump", "SmolLM2-135M", "-o", os.devnull) == ""
    assert stat.S_ISCHR(os.stat(os.devnull).st_mode)  # written to, not renamed over


def test_dump_to_a_directory_is_a_user_error(capsys, tmp_path):
    assert user_error(capsys, "dump", "SmolLM2-135M", "-o", tmp_path) == f"{tmp_path}: cannot write (Is a directory)"
    assert list(tmp_path.iterdir()) == []


def test_saved_graph_refuses_another_context_or_phase(capsys, tmp_path):
    saved = tmp_path / "kv-prefill.txt"
    saved.write_text(ok(capsys, "dump", "SmolLM2-135M"))
    assert user_error(capsys, "dump", saved, "--context", "none") == \
        f"{saved}: saved graph has context 'kv', but context 'none' was asked for"
    assert user_error(capsys, "hash", saved, "--phase", "decode") == \
        f"{saved}: saved graph has phase 'prefill', but phase 'decode' was asked for"


def test_corrupt_saved_graph_is_a_user_error(capsys, tmp_path):
    text = ok(capsys, "dump", "SmolLM2-135M")
    bad = tmp_path / "bad.txt"
    bad.write_text(text.replace("= rms_norm(", "= rms_nrom(", 1))
    assert user_error(capsys, "dump", bad).startswith(f"{bad}: ")
    badjson = tmp_path / "bad.json"
    badjson.write_text('{"format": "something else"}')
    assert "not a graphir JSON graph" in user_error(capsys, "dump", badjson)


# --------------------------------------------------------------------------- hash


@pytest.mark.parametrize("preset", PRESETS)
def test_hash_prints_the_graph_hash_and_nothing_else(capsys, preset):
    out = ok(capsys, "hash", preset)
    assert out == graph_hash(load_graph(preset)) + "\n"
    assert len(out) == 65 and all(c in "0123456789abcdef" for c in out[:-1])


def test_hash_depends_on_context_and_phase_and_survives_saving(capsys, tmp_path):
    hashes = {ok(capsys, "hash", "SmolLM2-135M", "--context", c, "--phase", p) for c, p in GRAPH_KINDS}
    assert len(hashes) == 3
    saved = tmp_path / "g.json"
    saved.write_text(ok(capsys, "dump", "SmolLM2-135M", "--format", "json", "--phase", "decode"))
    assert ok(capsys, "hash", saved) == ok(capsys, "hash", "SmolLM2-135M", "--phase", "decode")


# --------------------------------------------------------------------------- diff


def test_diff_same_is_exit_0(capsys):
    rc, out, err = run(capsys, "diff", "SmolLM2-135M", "smollm2-135m")
    assert (rc, err) == (0, "")


def test_diff_different_is_exit_1(capsys):
    rc, out, err = run(capsys, "diff", "SmolLM2-135M", "Llama-3.1-8B")
    assert (rc, err) == (1, "") and out.strip()
    rc2, out2, _ = run(capsys, "diff", "SmolLM2-135M", "Llama-3.1-8B")
    assert (rc2, out2) == (rc, out)  # deterministic


def test_diff_context_is_applied_to_both_sides(capsys):
    rc, _, err = run(capsys, "diff", "Qwen2.5-0.5B", "Qwen2.5-0.5B", "--context", "none")
    assert (rc, err) == (0, "")


def test_diff_json(capsys):
    rc, out, err = run(capsys, "diff", "Qwen2.5-0.5B", "Qwen2.5-72B", "--json")
    assert (rc, err) == (1, "")
    assert isinstance(json.loads(out), dict)
    rc, out, err = run(capsys, "diff", "Qwen2.5-0.5B", "Qwen2.5-0.5B", "--json")
    assert (rc, err) == (0, "") and isinstance(json.loads(out), dict)


def test_diff_saved_text_graph_against_a_preset(capsys, tmp_path):
    saved = tmp_path / "golden.txt"
    saved.write_text(ok(capsys, "dump", "SmolLM2-135M"))
    assert run(capsys, "diff", saved, "SmolLM2-135M")[0] == 0
    assert run(capsys, "diff", "SmolLM2-135M", saved)[0] == 0
    assert run(capsys, "diff", saved, "Llama-3.1-8B")[0] == 1
    # a saved decode graph is compared with the preset's decode graph unless told otherwise
    decode = tmp_path / "decode.txt"
    decode.write_text(ok(capsys, "dump", "SmolLM2-135M", "--phase", "decode"))
    assert run(capsys, "diff", decode, "SmolLM2-135M")[0] == 0
    assert run(capsys, "diff", decode, saved)[0] == 1
    assert "saved graph has phase 'decode', but phase 'prefill'" in user_error(
        capsys, "diff", decode, "SmolLM2-135M", "--phase", "prefill")


def test_diff_of_gguf_files(capsys, tiny, tmp_path):
    copy = write_tiny_gguf(tmp_path / "copy.gguf")
    assert run(capsys, "diff", tiny, copy)[0] == 0
    tied = write_tiny_gguf(tmp_path / "tied.gguf", drop_tensors=(tensor_name(T.OUTPUT),))
    assert run(capsys, "diff", tiny, tied)[0] == 1


def test_diff_errors_are_exit_2(capsys, tmp_path):
    assert "no such file or preset" in user_error(capsys, "diff", "SmolLM2-135M", "NoSuchModel")
    assert "no such file" in user_error(capsys, "diff", tmp_path / "missing.gguf", "SmolLM2-135M")


# --------------------------------------------------------------------------- check


def test_check_good_file(capsys, tiny):
    assert ok(capsys, "check", tiny) == f"ok: {len(tiny_llama_tensors())} tensors match llama\n"


def test_check_presets_pass(capsys):
    assert ok(capsys, "check", "SmolLM2-135M") == "ok: 272 tensors match llama\n"


def test_check_lists_every_problem_and_exits_1(capsys, tmp_path):
    q, ffn_norm = tensor_name(T.ATTN_Q, 1), tensor_name(T.FFN_NORM, 0)
    bad = write_tiny_gguf(
        tmp_path / "bad.gguf",
        drop_tensors=(tensor_name(T.FFN_UP, 0),),
        shapes={q: (E, 32)},
        f16=(ffn_norm,),
        extra={"blk.0.mystery.weight": (8,)},
    )
    rc, out, err = run(capsys, "check", bad)
    assert (rc, err) == (1, "")
    lines = out.splitlines()
    assert sorted(lines[:-1]) == sorted([
        "missing tensor 'blk.0.ffn_up.weight'",
        "tensor 'blk.1.attn_q.weight' has shape [64, 32], expected [64, 64]",
        "tensor 'blk.0.ffn_norm.weight' has type f16, expected f32",
        "unexpected tensor 'blk.0.mystery.weight'",
    ])
    assert lines[-1] == f"4 problems: {bad} does not match llama ({len(tiny_llama_tensors())} tensors declared)"


def test_check_of_a_saved_graph_is_a_user_error(capsys, tmp_path):
    saved = tmp_path / "g.txt"
    saved.write_text(ok(capsys, "dump", "SmolLM2-135M"))
    assert user_error(capsys, "check", saved) == f"{saved}: is a saved graph; check needs a GGUF file or a preset"


# --------------------------------------------------------------------------- archs, info


def test_archs_lists_architectures_and_presets(capsys):
    out = ok(capsys, "archs")
    lines = out.splitlines()
    assert lines[0] == "architectures:"
    rows = [line.split() for line in lines]  # names padded to the longest architecture name
    assert ["llama", "rope=norm"] in rows and ["qwen2", "rope=neox"] in rows
    assert ["mamba", "rope=none"] in rows and ["qwen35", "rope=imrope"] in rows
    pre = lines[lines.index("presets:") + 1:]
    assert len(pre) == len(PRESETS)
    assert ["SmolLM2-135M", "llama", "30", "layers"] in [p.split() for p in pre]
    assert [p.split()[0] for p in pre] == sorted(PRESETS, key=str.lower)  # by name, whichever module declares it


@pytest.mark.parametrize("preset,total,active,experts", [
    ("Qwen3-30B-A3B", 30532122624, 3353032704, "8 of 128"), ("Mixtral-8x7B", 46702792704, 12879925248, "2 of 8"),
    ("Granite-4.0-H-Tiny", 6939037248, 1465470528, "6 of 64"),
    ("Granite-4.0-H-Small", 32207337984, 8803121664, "10 of 72"),
])
def test_info_of_a_mixture_of_experts_counts_the_parameters_a_token_runs(capsys, preset, total, active, experts):
    """Active: every tensor but the stacked experts, plus n_expert_used / n_expert of those (the public figures:
    30.5B / 3.3B, 46.7B / 12.9B, 7B / 1B, 32B / 9B)."""
    out = ok(capsys, "info", preset)
    assert f"\ntotal    {total} parameters, " in out
    assert f"\nactive   {active} parameters per token ({experts} experts)\n" in out
    doc = json.loads(ok(capsys, "info", preset, "--json"))
    assert (doc["total_params"], doc["active_params"]) == (total, active)
    assert "active_params" not in json.loads(ok(capsys, "info", "Llama-3.1-8B", "--json"))


@pytest.mark.parametrize("preset", PRESETS)
def test_info_every_preset(capsys, preset):
    out = ok(capsys, "info", preset)
    assert out.startswith(f"source   {preset} (preset)\n")
    assert "\nhparams\n" in out and "\n  n_layer " in out and "\ntotal    " in out
    doc = json.loads(ok(capsys, "info", preset, "--json"))
    assert doc["kind"] == "preset" and doc["n_tensors"] == len(doc["tensors"])
    assert doc["total_params"] == sum(t["params"] for t in doc["tensors"])


def test_info_of_a_gguf_shows_bytes_and_offsets(capsys, tiny):
    out = ok(capsys, "info", tiny)
    assert "\narch     llama (rope norm)\n" in out
    header = next(line for line in out.splitlines() if line.lstrip().startswith("name "))
    assert header.split() == ["name", "type", "shape", "params", "bytes", "offset"]
    row = next(line for line in out.splitlines() if line.lstrip().startswith("token_embd.weight "))
    assert row.split()[:6] == ["token_embd.weight", "f32", "[64,", "256]", str(E * V), str(E * V * 4)]
    doc = json.loads(ok(capsys, "info", tiny, "--json"))
    assert doc["n_tensors"] == len(tiny_llama_tensors())
    assert doc["hparams"]["norm_rms_eps"] == 1e-05
    assert doc["tensors"][0]["offset"] == 0
    assert doc["total_bytes"] == 4 * doc["total_params"]


def test_info_of_a_saved_graph(capsys, tmp_path):
    saved = tmp_path / "g.txt"
    saved.write_text(ok(capsys, "dump", "SmolLM2-135M", "--context", "none"))
    doc = json.loads(ok(capsys, "info", saved, "--json"))
    assert (doc["kind"], doc["arch"], doc["context"], doc["n_tensors"]) == ("graph", "llama", "none", 272)
    assert doc["total_params"] == json.loads(ok(capsys, "info", "SmolLM2-135M", "--json"))["total_params"]


# --------------------------------------------------------------------------- strip


def test_strip_then_dump_equals_dump_of_the_original(capsys, tiny, tmp_path):
    header = tmp_path / "tiny-header.gguf"
    out = ok(capsys, "strip", tiny, "-o", header)
    kept, total = header.stat().st_size, tiny.stat().st_size
    assert out.startswith(f"wrote {header}: {kept} of {total} bytes kept (")
    assert kept < total
    for fmt in ("text", "json"):
        for c, p in GRAPH_KINDS:
            args = ("--format", fmt, "--context", c, "--phase", p)
            assert ok(capsys, "dump", header, *args) == ok(capsys, "dump", tiny, *args)
    assert ok(capsys, "check", header) == ok(capsys, "check", tiny)


def test_failed_strip_writes_nothing(capsys, tmp_path):
    notgguf = tmp_path / "notes.txt"
    notgguf.write_text("hello world\n")
    out = tmp_path / "out.gguf"
    assert "not a GGUF file" in user_error(capsys, "strip", notgguf, "-o", out)
    assert "no such file" in user_error(capsys, "strip", tmp_path / "missing.gguf", "-o", out)
    assert not out.exists()


# --------------------------------------------------------------------------- user errors, one line each


def _cut_inside_metadata(tmp_path: Path) -> Path:
    full = write_tiny_gguf(tmp_path / "full.gguf")
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(full.read_bytes()[:60])  # 24-byte fixed header, then the first keys
    return cut


def _not_gguf(tmp_path: Path) -> Path:
    p = tmp_path / "notes.gguf"
    p.write_text("hello, this is not a model\n")
    return p


ERROR_CASES = {
    "not a GGUF file": (lambda tp: ["dump", _not_gguf(tp)], "{0}: not a GGUF file (magic b'hell')"),
    "cut inside metadata": (lambda tp: ["dump", _cut_inside_metadata(tp)], "{0}: truncated inside metadata"),
    "unknown architecture": (
        lambda tp: ["dump", write_tiny_gguf(tp / "arch.gguf", arch="llamazing")],
        "{0}: unknown architecture 'llamazing' (known: " + ", ".join(graphir.arch.names()) + ")"),
    "missing hparam": (
        lambda tp: ["dump", write_tiny_gguf(tp / "key.gguf", drop_keys=(RMS_EPS_KEY,))],
        "{0}: missing key 'llama.attention.layer_norm_rms_epsilon'"),
    "wrong tensor shape": (
        lambda tp: ["dump", write_tiny_gguf(tp / "shape.gguf", shapes={"blk.0.attn_k.weight": (E, 48)})],
        "{0}: tensor 'blk.0.attn_k.weight' has shape [64, 48], expected [64, 32]"),
    "unknown preset": (lambda tp: ["dump", "Llama-9-1T"], "Llama-9-1T: no such file or preset (presets: "
                                                           "afmoe-tiny-header, all-MiniLM-L6-v2, "),
    "none with decode": (
        lambda tp: ["dump", "SmolLM2-135M", "--context", "none", "--phase", "decode"],
        "context 'none' has no decode phase"),
    "missing file": (lambda tp: ["dump", tp / "nowhere" / "x.gguf"], "{0}: no such file"),
}


@pytest.mark.parametrize("case", ERROR_CASES)
def test_user_error_is_one_line_and_exit_2(capsys, tmp_path, case):
    make, expected = ERROR_CASES[case]
    argv = make(tmp_path)
    msg = user_error(capsys, *argv)
    assert expected.format(argv[1]) in msg, msg


def test_each_user_error_has_its_own_message(capsys, tmp_path):
    messages = set()
    for i, (make, _) in enumerate(ERROR_CASES.values()):
        d = tmp_path / str(i)
        d.mkdir()
        messages.add(user_error(capsys, *make(d)).replace(str(d), "<dir>"))
    assert len(messages) == len(ERROR_CASES)


@pytest.mark.parametrize("cmd", ["hash", "info", "check"])
def test_the_same_errors_from_other_commands(capsys, tmp_path, cmd):
    assert "not a GGUF file" in user_error(capsys, cmd, _not_gguf(tmp_path))
    assert "unknown architecture 'llamazing'" in user_error(
        capsys, cmd, write_tiny_gguf(tmp_path / "a.gguf", arch="llamazing"))
    assert "no such file or preset" in user_error(capsys, cmd, "Llama-9-1T")


def test_load_graph_api(tiny):
    assert load_graph(tiny).meta["context"] == "kv"
    assert load_graph("SMOLLM2-135M", "none").meta == {**load_graph("SmolLM2-135M").meta, "context": "none"}
    from graphir.errors import GraphirError

    with pytest.raises(GraphirError, match="unknown context 'paged'"):
        load_graph("SmolLM2-135M", "paged")


# --------------------------------------------------------------------------- processes


def test_python_m_graphir(tmp_path):
    p = graphir_process()
    assert p.returncode == 0 and p.stdout.startswith("usage: graphir") and p.stderr == ""
    p = graphir_process("hash", "SmolLM2-135M")
    assert p.returncode == 0 and len(p.stdout) == 65


def test_process_errors_have_no_traceback(tmp_path):
    for argv in (["dump", _not_gguf(tmp_path)], ["dump", "nope"], ["diff", "a"], ["dump", "SmolLM2-135M",
                                                                                   "--layers", "1:2"]):
        p = graphir_process(*argv)
        assert p.returncode == 2 and p.stdout == ""
        assert p.stderr.startswith("graphir: error: ") and p.stderr.count("\n") == 1, p.stderr


def test_process_diff_exit_1():
    assert graphir_process("diff", "SmolLM2-135M", "Qwen2.5-0.5B").returncode == 1


def test_output_is_identical_across_processes_and_hash_seeds(tmp_path):
    for argv in (["dump", "Qwen2.5-0.5B", "--format", "json"], ["dump", "Qwen2.5-0.5B", "--format", "dot"],
                 ["info", "Qwen2.5-0.5B"], ["archs"], ["diff", "SmolLM2-135M", "Qwen2.5-0.5B", "--json"]):
        outs = {graphir_process(*argv, env={"PYTHONHASHSEED": seed}).stdout for seed in ("0", "1", "12345")}
        assert len(outs) == 1, argv


@pytest.mark.parametrize("fmt", ["text", "json", "dot"])
def test_dump_imports_neither_numba_nor_networkx(fmt):
    code = (
        "import os, sys\n"
        "from graphir.cli import main\n"
        f"rc = main(['dump', 'SmolLM2-135M', '--format', '{fmt}', '-o', os.devnull])\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('numba', 'networkx'))\n"
        "print(rc, heavy)\n"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert p.stdout == "0 []\n", p.stdout + p.stderr


def test_cli_import_is_light():
    code = ("import sys, graphir.cli\n"
            "print(sorted(m for m in ('numpy', 'gguf', 'numba', 'networkx') if m in sys.modules))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert p.stdout == "[]\n", p.stdout + p.stderr


# --------------------------------------------------------------------------- the real SmolLM2 file


def test_smollm2_check_passes(capsys, smol):
    assert ok(capsys, "check", smol) == "ok: 272 tensors match llama\n"


def test_smollm2_info_shows_272_tensors(capsys, smol):
    out = ok(capsys, "info", smol)
    assert "\ntensors  272\n" in out
    assert "\ntotal    134515008 parameters, " in out and " in 272 tensors\n" in out
    # the KV cache at the default 4096 cells: 30 layers x (K + V) x 192 values x 2 bytes per cell
    assert out.endswith("memory   kv at n_ctx 4096, n_seq_max 1, n_ubatch 512: 94371840 bytes\n"
                        "  size   cells  buffers     bytes\n  n_ctx   4096       60  94371840\n")
    doc = json.loads(ok(capsys, "info", smol, "--json"))
    assert doc["n_tensors"] == 272 and doc["gguf"]["version"] == 3 and not doc["gguf"]["header_only"]
    assert doc["total_bytes"] + doc["gguf"]["data_start"] == doc["gguf"]["file_bytes"]


@pytest.mark.parametrize("context, phase", GRAPH_KINDS)
def test_smollm2_dump_equals_the_preset(capsys, smol, context, phase):
    for fmt in ("text", "json"):
        args = ("--format", fmt, "--context", context, "--phase", phase)
        assert ok(capsys, "dump", smol, *args) == ok(capsys, "dump", "SmolLM2-135M", *args)
    args = ("--full", "--context", context, "--phase", phase)
    assert ok(capsys, "dump", smol, *args) == ok(capsys, "dump", "SmolLM2-135M", *args)
    assert ok(capsys, "hash", smol, "--context", context, "--phase", phase) == \
        ok(capsys, "hash", "SmolLM2-135M", "--context", context, "--phase", phase)


def test_smollm2_strip_then_dump(capsys, smol, tmp_path):
    header = tmp_path / "smol-header.gguf"
    out = ok(capsys, "strip", smol, "-o", header)
    assert out.startswith(f"wrote {header}: {header.stat().st_size} of {smol.stat().st_size} bytes kept")
    assert ok(capsys, "dump", header) == ok(capsys, "dump", smol)
    assert run(capsys, "diff", header, "SmolLM2-135M")[0] == 0
