"""Kimi-Linear (kimi-linear) and Ling 3.0 (bailingmoe3): the facts of their headers the conformance table's tiny
models do not reach (a released layout, the refusals llama.cpp asserts, the RoPE a file asks for). The rows of the
table (tests/test_conformance.py) check both against llama.cpp."""

from __future__ import annotations

from typing import Any

import pytest

from graphir.errors import MetadataError
from graphir.memory.layers import LatentAttention, Recurrent
from graphir.model.meta import open_model
from graphir.model.presets import all_presets

KIMI, LING = "Kimi-Linear-48B-A3B", "bailingmoe3-tiny-header"


def arch_of(preset: str, **changes: Any) -> Any:
    """The architecture of a preset's header with some keys (names without the architecture) changed."""
    p = all_presets()[preset]
    md = {**p.metadata(), **{f"{p.arch}.{k}": v for k, v in changes.items()}}
    from graphir.model.architecture import REGISTRY

    return REGISTRY[p.arch].from_metadata(preset, md)


def test_kimis_mla_layers_are_every_fourth_and_the_last_and_keep_latent_rows() -> None:
    arch = open_model(KIMI).arch
    mla = [il for il, need in enumerate(arch.needs) if isinstance(need, LatentAttention)]
    assert mla == [3, 7, 11, 15, 19, 23, 26]
    assert {need.n_embd_latent for il, need in enumerate(arch.needs) if il in mla} == {512 + 64}
    kda = {need for need in arch.needs if isinstance(need, Recurrent)}
    # q, k and v each keep 3 conv columns of 32 heads x 128; one 128 x 128 delta state per head
    assert kda == {Recurrent(3 * 3 * 4096, 128 * 128 * 32)}
    assert arch.contexts[0] == "hybrid"


@pytest.mark.parametrize("changes,match", [
    ({"kda.safe_gate": False}, r"'bailingmoe3\.kda\.safe_gate' = False .* the safe gate"),
    ({"kda.gate_lower_bound": 0.0}, r"'bailingmoe3\.kda\.gate_lower_bound' = 0\.0: .*bounded below by a negative"),
    ({"expert_gating_func": 7}, r"'bailingmoe3\.expert_gating_func' = 7: not a gating graphir builds"),
])
def test_ling3_refuses_what_llama_cpp_asserts_in_one_line_naming_the_key(changes: dict, match: str) -> None:
    with pytest.raises(MetadataError, match=match):
        arch_of(LING, **changes)


def test_ling3_text_files_rope_plainly_and_its_vl_files_by_sections() -> None:
    assert arch_of(LING).rope_mode == "mrope" and arch_of(LING).positions_per_token == 4
    plain = arch_of(LING, **{"rope.dimension_sections": [0, 0, 0, 0]})
    assert plain.rope_mode == "norm" and plain.positions_per_token == 1


def test_ling3s_draft_layer_loads_and_stays_out_of_the_graph() -> None:
    arch = arch_of(LING, block_count=5, nextn_predict_layers=1, swiglu_clamp_exp=[0.0] * 5, swiglu_clamp_shexp=[0.0] * 5,
                   **{"attention.head_count_kv": [1, 0, 0, 1, 1]})
    assert arch.kda.n_trunk == 4 and len(arch.needs) == 4
    draft = {s.name: s for s in arch.tensors() if s.name.startswith("blk.4.")}
    assert draft["blk.4.nextn.eh_proj.weight"].optional and draft["blk.4.layer_output_norm.weight"].optional
