"""Mistral 4 (``mistral4``) beyond the conformance row, whose llama.cpp-made model has neither of these: attention
temperature tuning (llama.cpp's saver drops its ``temperature_length``) and YaRN, whose magnitude mistral4 takes
with mscale 1 where deepseek2 takes mscale_all_dim. Files written from the tiny-header preset with the keys added;
llama.cpp is the oracle, and each file's logits must differ from those of the same weights without the keys."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import write_model_gguf
from gguf import Keys
from test_families import PROMPT, llama_cpp_prompt_logits, oracle, prompt_logits

from graphir.model.presets import all_presets

A, R = Keys.Attention, Keys.Rope
TOKENS = [t % 128 for t in PROMPT]  # 12 positions: three steps of a temperature length of 4

CASES = {
    "temperature": {A.TEMPERATURE_SCALE: 0.5, A.TEMPERATURE_LENGTH: 4},
    "yarn": {R.SCALING_TYPE: "yarn", R.SCALING_FACTOR: 4.0, R.SCALING_ORIG_CTX_LEN: 64,
             R.SCALING_YARN_LOG_MUL: 0.0707},
}


def _keys(case: dict[str, Any]) -> dict[str, Any]:
    return {k.format(arch="mistral4"): v for k, v in case.items()}


@oracle
@pytest.mark.parametrize("case", CASES)
def test_mistral4_files_with_a_tuning_give_llama_cpps_logits(case: str, tmp_path: Path) -> None:
    preset = all_presets()["mistral4-tiny-header"]
    tuned = write_model_gguf(tmp_path / f"{case}.gguf", preset, extra_md=_keys(CASES[case]))
    plain = write_model_gguf(tmp_path / "plain.gguf", preset)
    ours = prompt_logits(tuned, TOKENS)
    assert np.abs(ours - llama_cpp_prompt_logits(tuned, TOKENS)).max() <= 1e-3
    assert np.abs(ours - prompt_logits(plain, TOKENS)).max() > 1e-3
