"""LFM2 and LFM2-MoE as specifications, where the conformance table's tiny models (one attention layer, one
short-convolution layer) do not reach: the released layouts, the state a convolution layer keeps, the forms
graphir refuses, and the older Hugging Face configs."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import gguf
import pytest
from conftest import process_folder
from test_families import SEQ_RM_CASES, seq_rm_against_llama_cpp

import llama_made
from graphir.errors import GraphirError, MetadataError, TensorError
from graphir.memory.kinds import assemble
from graphir.memory.layers import Attention, ContextParams, Recurrent
from graphir.model.meta import from_preset, open_model
from graphir.model.presets import all_presets
from graphir.running.runtime import load

K = gguf.Keys
DATA = Path(__file__).parent / "data" / "hf"
_made: dict[str, Path] = {}


def preset(name: str, **keys: object):
    p = all_presets()[name]
    return replace(p, keys={**p.keys, **keys})


def test_layers_without_kv_heads_convolve_and_keep_their_last_inputs_only() -> None:
    arch = from_preset("LFM2-1.2B", all_presets()["LFM2-1.2B"]).arch
    attention = [il for il, n in enumerate(arch.needs) if isinstance(n, Attention)]
    assert attention == [2, 5, 8, 10, 12, 14]
    convs = {n for n in arch.needs if isinstance(n, Recurrent)}
    assert convs == {Recurrent(2 * 2048, 0)}  # l_cache - 1 columns of the width, no scan state
    memory = assemble("hybrid", arch.needs, ContextParams(n_ctx=256, n_seq_max=2))
    rows = {k: v for k, v in memory.buffer_shapes().items() if "rs_" in k}
    assert len(rows) == 2 * 10 and all(shape[1] in (0, 4096) for shape, _ in rows.values())


def test_a_sliding_window_makes_every_attention_layer_slide_in_the_hybrid_iswa_memory() -> None:
    """As llama.cpp's loader: a window > 0 makes each attention layer of LFM2 slide (none stays full), and the
    memory is the hybrid whose attention part is an iswa pair (llama_memory_hybrid_iswa); its window cache holds
    the window of each sequence and a ubatch. LFM2-MoE's loader reads no window; 0 is no window."""
    arch = from_preset("x", preset("LFM2-1.2B", **{K.Attention.SLIDING_WINDOW: 4096})).arch
    assert {n.window for n in arch.needs if isinstance(n, Attention)} == {4096}
    assert arch.contexts[0] == "hybrid_iswa"
    memory = assemble("hybrid_iswa", arch.needs, ContextParams(n_ctx=16384, n_ubatch=512))
    attn = memory.parts["attn"]
    assert list(memory.parts) == ["attn", "recr"] and list(attn.parts) == ["swa"]  # type: ignore[attr-defined]
    assert attn.parts["swa"].n_ctx == 4608  # type: ignore[attr-defined]
    with pytest.raises(GraphirError, match="swa_full"):
        memory.seq_add(0, 0, -1, 1)
    for name, keys in (("LFM2-8B-A1B", {K.Attention.SLIDING_WINDOW: 4096}), ("LFM2-1.2B", {K.Attention.SLIDING_WINDOW: 0})):
        assert from_preset("x", preset(name, **keys)).arch.contexts[0] == "hybrid"


@pytest.mark.oracle
@SEQ_RM_CASES
def test_seq_rm_with_a_window_answers_as_the_hybrid_does(p0: int, p1: int, ours: bool, llama_cpps: bool) -> None:
    """Positions 0..4 held by llama.cpp's tiny LFM2 with a window of 4: the recurrent part decides first, as in
    llama.cpp's llama_memory_hybrid_iswa (a cut into the state's history is refused; graphir refuses a cut in
    the middle too, see tests/test_arch_granite.py)."""
    if "swa" not in _made:
        _made["swa"] = llama_made.make(process_folder("lfm2-swa-") / "F32.gguf", "lfm2",
                                       **{"lfm2.attention.sliding_window": 4})
    model = load(str(_made["swa"]))
    assert seq_rm_against_llama_cpp(model, _made["swa"], [5, 17, 40, 3, 9], p0, p1) == (ours, llama_cpps)


def test_non_causal_attention_is_refused() -> None:
    with pytest.raises(MetadataError, match=r"'lfm2\.attention\.causal' is false"):
        from_preset("x", preset("LFM2-1.2B", **{K.Attention.CAUSAL: False}))


def test_the_moe_layers_follow_the_leading_dense_ones() -> None:
    arch = from_preset("LFM2-8B-A1B", all_presets()["LFM2-8B-A1B"]).arch
    dense = [il for il in range(24) if "blk.%d.ffn_gate.weight" % il in arch.specs]
    routed = [il for il in range(24) if "blk.%d.ffn_gate_exps.weight" % il in arch.specs]
    assert dense == [0, 1] and routed == list(range(2, 24))
    assert arch.specs["blk.2.exp_probs_b.bias"].shape == (32,)
    with pytest.raises(MetadataError, match=r"'lfm2moe\.expert_count'"):  # llama.cpp's loader asserts them
        from_preset("x", preset("LFM2-8B-A1B", **{K.LLM.EXPERT_COUNT: 0}))


@pytest.mark.parametrize("func", [0, 7])
def test_an_unknown_gating_function_is_refused_naming_its_key(func: int) -> None:
    with pytest.raises(MetadataError, match=r"'lfm2moe\.expert_gating_func' = \d+: not a gating function"):
        from_preset("x", preset("LFM2-8B-A1B", **{K.LLM.EXPERT_GATING_FUNC: func}))


def test_an_older_config_names_its_attention_layers_by_index(tmp_path: Path) -> None:
    doc = json.loads((DATA / "LFM2-1.2B" / "config.json").read_text())
    doc["full_attn_idxs"] = [il for il, t in enumerate(doc.pop("layer_types")) if t == "full_attention"]
    (tmp_path / "config.json").write_text(json.dumps(doc))
    ours, theirs = open_model(str(tmp_path)), open_model(str(DATA / "LFM2-1.2B"))
    assert ours.metadata == theirs.metadata


@pytest.mark.parametrize("name", ["LFM2-1.2B", "LFM2-8B-A1B"])
def test_the_graph_holds_kv_in_the_attention_layers_and_conv_rows_in_the_others(name: str) -> None:
    from graphir.graph.forms import to_text

    meta = open_model(name)
    text = to_text(meta.build_graph(phase="decode"), fold=False)
    held = [line.split()[1] for line in text.splitlines() if line.startswith("input %blk.")]
    kv = meta.arch.hp.n_head_kv
    assert held == [f"%blk.{il}.{b}" for il in range(meta.arch.hp.n_layer)
                    for b in (("cache_k", "cache_v") if kv[il] else ("rs_r",))]


def test_q_k_and_v_load_fused_or_apart_as_llama_cpps_loader_takes_them() -> None:
    from graphir.graph.forms import to_text

    fused = replace(all_presets()["LFM2-1.2B"], include=r"blk\.\d+\.attn_qkv\.weight")
    text = to_text(from_preset("x", fused).build_graph(phase="decode"), fold=False)
    assert "%blk.2.wqkv = mul_mat(%blk.2.attn_qkv.weight" in text and "attn_q.weight" not in text
    neither = replace(all_presets()["LFM2-1.2B"], include="")
    with pytest.raises(TensorError, match=r"missing tensor 'blk\.2\.attn_qkv\.weight'"):
        from_preset("x", neither).build_graph(phase="decode")
