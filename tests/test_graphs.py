"""Golden graphs: one readable text file per (preset, context, phase) under snapshots/test_graphs/.

A change that alters any graph fails here until the snapshot is updated on purpose
(``python -m pytest tests/test_graphs.py --snapshot-update``) and the diff is reviewed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from conftest import graph_cases

from graphir.graph.forms import to_text
from graphir.memory.kinds import assemble
from graphir.memory.kv import KVCache, rope_plan, split_heads
from graphir.memory.latent import LatentCache
from graphir.memory.layers import ContextParams
from graphir.model.meta import open_model
from graphir.model.presets import all_presets
from graphir.testing import graph_text
from graphir.graph.verify import verify

SNAPSHOT_DIR = Path(__file__).resolve().parent.parent / "snapshots"
CASES = graph_cases()
# presets whose cached K cannot be re-roped exactly, and why (test_unshiftable_presets_say_so checks them)
NOT_SHIFTABLE = {"Hunyuan-A13B": "K is RMS-normalised after RoPE", "Hunyuan-dense-tiny": "K is RMS-normalised after RoPE",
                 "Maincoder-tiny": "K is RMS-normalised after RoPE", "Talkie-tiny": "K is RMS-normalised after RoPE",
                 "Hunyuan-VL-tiny": "K is RMS-normalised after RoPE",
                 **dict.fromkeys(("Qwen2.5-VL-7B", "Qwen3-VL-8B", "Qwen3-VL-30B-A3B", "PaddleOCR-VL-tiny"),
                                 "K turns by M-RoPE sections (llama.cpp's cache cannot shift it either)")}
SHIFT_CASES = sorted(p for p in all_presets()  # presets with a KV cache whose K is roped
                     if "kv" in open_model(p).arch.contexts and open_model(p).arch.rope_mode != "none"
                     and p not in NOT_SHIFTABLE)
LATENT_SHIFT_CASES = sorted(p for p in all_presets() if "mla" in open_model(p).arch.contexts)  # MLA's latent rows


class GraphText(graph_text()):  # type: ignore[misc,valid-type]
    """graphir.testing's extension (the canonical text as it is), with the snapshots in the repository's
    snapshots/ folder."""

    @classmethod
    def dirname(cls, *, test_location: Any) -> str:
        return str(SNAPSHOT_DIR / test_location.basename)


@pytest.fixture
def graph_snapshot(snapshot: Any) -> Any:
    return snapshot.use_extension(GraphText)


@pytest.mark.parametrize("preset,context,phase", CASES, ids=[f"{p}-{c}-{ph}" for p, c, ph in CASES])
def test_graph(preset: str, context: str, phase: str, graph_snapshot: Any) -> None:
    assert to_text(open_model(preset).build_graph(context, phase)) == graph_snapshot


@pytest.mark.parametrize("preset", sorted(NOT_SHIFTABLE))
def test_unshiftable_presets_say_so(preset: str) -> None:
    """K changed after its rotation: no re-roping gives what the model would have cached at the new positions."""
    assert not rope_plan(open_model(preset).build_graph("kv", "prefill"))[0]


@pytest.mark.parametrize("preset", SHIFT_CASES)
def test_k_shift_graph(preset: str, graph_snapshot: Any) -> None:
    """The KV cache's K-shift (re-roping cached K after seq_add/seq_div) is a graph like any other."""
    m = open_model(preset)
    graph = m.build_graph("kv", "prefill")
    shiftable, plan = rope_plan(graph)
    assert shiftable and sorted(plan) == sorted({n.layer for n in graph.nodes if n.name.endswith(("Kcur.rope", "k_pe.rope"))})
    cache = assemble("kv", m.arch.needs, ContextParams(n_ctx=4))
    assert isinstance(cache, KVCache)
    shift = cache.k_shift_graph(graph.meta, plan)
    verify(shift)
    assert to_text(shift) == graph_snapshot


@pytest.mark.parametrize("preset", LATENT_SHIFT_CASES)
def test_latent_k_shift_graph(preset: str, graph_snapshot: Any) -> None:
    """The latent cache's K-shift turns the RoPE'd key part at the end of each cached row, in every layer."""
    m = open_model(preset)
    graph = m.build_graph("mla", "prefill")
    shiftable, plan = rope_plan(graph)
    assert shiftable and sorted(plan) == list(range(m.arch.hp.n_layer))
    split = split_heads(graph)
    assert set(split.values()) == {(576, 1)}  # one head of [latent 512 | key part 64]
    cache = assemble("mla", m.arch.needs, ContextParams(n_ctx=4))
    assert isinstance(cache, LatentCache)
    shift = cache.k_shift_graph(graph.meta, plan, split)
    verify(shift)
    assert to_text(shift) == graph_snapshot


def test_every_snapshot_file_belongs_to_a_case() -> None:
    # NOTE: syrupy reports unused snapshots only when pytest runs without path arguments; this holds always.
    expected = {f"test_graph[{p}-{c}-{ph}].graph.txt" for p, c, ph in CASES}
    expected |= {f"test_k_shift_graph[{p}].graph.txt" for p in SHIFT_CASES}
    expected |= {f"test_latent_k_shift_graph[{p}].graph.txt" for p in LATENT_SHIFT_CASES}
    assert sorted(p.name for p in (SNAPSHOT_DIR / "test_graphs").iterdir()) == sorted(expected)
