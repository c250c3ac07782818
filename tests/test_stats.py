"""``graphir stats``: what a model costs, from its graph and declarations, checked against llama.cpp's own
figures where it has them (parameters, model bytes, the KV buffer it allocates) and against the arithmetic of
the architecture where it has none (the FLOPs of a decode step)."""

from __future__ import annotations

import ctypes
import json
import re
from pathlib import Path
from typing import Any

import pytest
from conftest import make_tiny_preset, write_model_gguf

from graphir.cli import main

oracle = pytest.mark.oracle


def stats(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    assert main(["stats", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def llama_cpp_figures(path: Path, n_ctx: int) -> tuple[int, int, str]:
    """llama.cpp's parameter count, model bytes, and the KV cache size its log prints, for a context of n_ctx."""
    import llama_cpp
    from llama_cpp._logger import llama_log_callback

    lines: list[str] = []

    @llama_cpp.llama_log_callback  # type: ignore[misc]
    def keep(level: int, text: bytes, user: Any) -> None:
        lines.append(text.decode(errors="replace"))

    llama_cpp.llama_log_set(keep, ctypes.c_void_p(0))
    try:
        llm = llama_cpp.Llama(str(path), n_ctx=n_ctx, n_threads=2, verbose=False)
        n_params, size = llm._model.n_params(), llm._model.size()
        llm.close()
    finally:
        llama_cpp.llama_log_set(llama_log_callback, ctypes.c_void_p(0))
    (kv,) = [m.group(1) for line in lines if (m := re.search(r"llama_kv_cache: size = +([\d.]+) MiB", line))]
    return n_params, size, kv


@oracle
def test_parameters_weight_bytes_and_kv_cache_are_llama_cpps(smollm2_gguf: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    s = stats(capsys, str(smollm2_gguf), "--n-ctx", "4096")
    n_params, size, kv_mib = llama_cpp_figures(smollm2_gguf, 4096)
    assert (s["params"], s["weight_bytes"]) == (n_params, size) == (134515008, 96576768)
    assert s["memory"]["parts"]["n_ctx"] == {"cells": 4096, "buffers": 60, "bytes": 94371840, "bytes_per_cell": 23040}
    assert f"{s['memory']['bytes'] / 2**20:.2f}" == kv_mib == "90.00"


@oracle
def test_a_mixture_of_experts_counts_its_active_parameters(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_model_gguf(tmp_path / "moe.gguf", make_tiny_preset("qwen3moe", tied=False))
    s = stats(capsys, str(path), "--n-ctx", "256")
    n_params, size, kv_mib = llama_cpp_figures(path, 256)
    assert (s["params"], s["weight_bytes"]) == (n_params, size)
    assert f"{s['memory']['bytes'] / 2**20:.2f}" == kv_mib
    experts = 2 * 3 * 64 * 32 * 8  # 2 layers of gate, up and down stacks [64, 32, 8]
    assert s["active_params"] == s["params"] - experts + experts // 8 * 2


def test_a_decode_step_costs_what_the_architecture_says(capsys: pytest.CaptureFixture[str]) -> None:
    """SmolLM2-135M: per layer Q and O (576 x 576), K and V (576 x 192), the SwiGLU FFN (3 x 576 x 1536), and
    the attention's two products over n_kv cached positions (9 heads of 64); then the LM head (576 x 49152).
    Twice each multiply-add."""
    s = stats(capsys, "SmolLM2-135M")
    attn, ffn = 2 * (576 * 576 * 2 + 576 * 192 * 2), 2 * 3 * 576 * 1536
    assert s["flops"]["decode"] == f"{2 * 2 * 9 * 64 * 30}*n_kv+{30 * (attn + ffn) + 2 * 576 * 49152}"
    # a prompt: the last layer's FFN runs on the rows that are output only (as llama.cpp's graph does)
    assert s["flops"]["prefill"] == (f"{30 * attn + 29 * ffn}*n_tokens+{ffn + 2 * 576 * 49152}*n_outputs+"
                                     f"{2 * 2 * 9 * 64 * 30}*n_kv*n_tokens")


def test_the_text_report_names_each_part(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["stats", "Qwen3.5-0.8B", "--n-ctx", "1024"]) == 0
    out = capsys.readouterr().out
    assert "memory   hybrid, n_ctx 1024" in out and "n_ctx  1024 cells" in out and "n_rs" in out
    assert re.search(r"decode +\d+\*n_kv\+\d+", out), out
