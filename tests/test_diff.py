"""diff_graphs: summary, first mismatch (with its layer-scoped path) and layers, on real preset graphs.

Variants are made the way a reviewer would meet them: by editing the unfolded canonical text and parsing it
back (which re-verifies every node), or by building from changed preset metadata.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
from gguf import Keys

from graphir.graph.diff import diff_graphs
from graphir.graph.forms import from_text, to_text
from graphir.graph.hashing import graph_hash
from graphir.graph.ir import Graph
from graphir.model.meta import from_preset, open_model
from graphir.model.presets import all_presets

N_LAYER = 30  # SmolLM2-135M


@pytest.fixture(scope="module")
def smol() -> Graph:
    return open_model("SmolLM2-135M").build_graph("kv", "prefill")


def edited(g: Graph, *replacements: tuple[str, str]) -> Graph:
    """g's unfolded text with each ``old`` (which must occur exactly once) replaced, parsed back."""
    text = to_text(g, fold=False)
    for old, new in replacements:
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    return from_text(text)


def hash_line(a: Graph, b: Graph) -> str:
    return f"hash: {graph_hash(a)[:16]} -> {graph_hash(b)[:16]}"


def test_identical_graphs(smol: Graph) -> None:
    again = open_model("SmolLM2-135M").build_graph("kv", "prefill")
    parsed = from_text(to_text(smol))  # folded text, and leaves reordered by the printer: still the same graph
    for other in (again, parsed):
        d = diff_graphs(smol, other)
        assert (d.same, d.summary, d.first, d.layers, d.unified) == (True, [], None, [], "")
        assert d.render() == f"graphs are identical (hash {graph_hash(smol)[:16]})\n"


def test_one_attribute(smol: Graph) -> None:
    b = edited(smol, ("rms_norm(%blk.5.ffn_inp) {eps=1e-05}", "rms_norm(%blk.5.ffn_inp) {eps=1e-06}"))
    d = diff_graphs(smol, b)
    assert not d.same
    assert d.summary == [hash_line(smol, b), f"nodes: {len(smol)} -> {len(b)} (0 added, 0 removed, 1 changed)",
                         "layers: 5"]
    assert d.first == "blk.5.ffn_norm.rms_norm: attr eps: 1e-05 -> 1e-06"
    assert d.layers == [5]
    assert "-%blk.5.ffn_norm.rms_norm = rms_norm(%blk.5.ffn_inp) {eps=1e-05} : f32[576, n_tokens]\n" in d.unified
    assert "+%blk.5.ffn_norm.rms_norm = rms_norm(%blk.5.ffn_inp) {eps=1e-06} : f32[576, n_tokens]\n" in d.unified


def test_whole_model_eps_from_preset_metadata(smol: Graph) -> None:
    p = all_presets()["SmolLM2-135M"]
    p6 = dataclasses.replace(p, keys={**p.keys, Keys.Attention.LAYERNORM_RMS_EPS: 1e-6})
    b = from_preset("SmolLM2-135M", p6).build_graph("kv", "prefill")
    d = diff_graphs(smol, b)
    # two rms_norms per layer plus result_norm's
    assert d.summary == [hash_line(smol, b), "hparams norm_rms_eps: 1e-05 -> 1e-06",
                         f"nodes: {len(smol)} -> {len(b)} (0 added, 0 removed, {2 * N_LAYER + 1} changed)",
                         "layers: 0-29"]
    assert d.first == "blk.0.attn_norm.rms_norm: attr eps: 1e-05 -> 1e-06"
    assert d.layers == list(range(N_LAYER))


ADD_SCALE = ("%blk.3.Kcur.heads = reshape(%blk.3.Kcur)",
             "%blk.3.Kcur.scale = scale(%blk.3.Kcur) {s=0.5} : f32[192, n_tokens]\n"
             "%blk.3.Kcur.heads = reshape(%blk.3.Kcur.scale)")
DROP_V_CONT = [("%blk.3.v.cont = cont(%blk.3.v) : f16[n_kv, 64, 3]\n", ""),
               ("%blk.3.kqv = mul_mat(%blk.3.v.cont,", "%blk.3.kqv = mul_mat(%blk.3.v,")]


def test_added_and_removed_op_in_one_layer(smol: Graph) -> None:
    b = edited(smol, ADD_SCALE, *DROP_V_CONT)
    d = diff_graphs(smol, b, "built", "edited")
    assert d.summary == [hash_line(smol, b), f"nodes: {len(smol)} -> {len(b)} (1 added, 1 removed, 2 changed)",
                         "layers: 3", f"ops: cont {2 * N_LAYER} -> {2 * N_LAYER - 1}, scale 0 -> 1",
                         "blk.3: cont 2 -> 1, scale 0 -> 1"]
    assert d.first == ("blk.3.Kcur.scale: only in edited "
                       "(%blk.3.Kcur.scale = scale(%blk.3.Kcur) {s=0.5} : f32[192, n_tokens])")
    assert d.layers == [3]
    assert d.unified.startswith("--- built\n+++ edited\n@@ ")
    assert "\n+%blk.3.Kcur.scale = scale(%blk.3.Kcur) {s=0.5} : f32[192, n_tokens]\n" in d.unified
    assert "\n-%blk.3.v.cont = cont(%blk.3.v) : f16[n_kv, 64, 3]\n" in d.unified


def test_removed_op_is_first_when_alone(smol: Graph) -> None:
    b = edited(smol, *DROP_V_CONT)
    d = diff_graphs(smol, b)
    assert d.summary[1:] == [f"nodes: {len(smol)} -> {len(b)} (0 added, 1 removed, 1 changed)", "layers: 3",
                             f"ops: cont {2 * N_LAYER} -> {2 * N_LAYER - 1}", "blk.3: cont 2 -> 1"]
    assert d.first == "blk.3.v.cont: only in a (%blk.3.v.cont = cont(%blk.3.v) : f16[n_kv, 64, 3])"


def test_k_and_v_projections_swapped(smol: Graph) -> None:
    # K and V weights have equal shapes here, so swapping their names swaps what Kcur and Vcur read
    text = to_text(smol, fold=False)
    swapped = (text.replace("blk.3.attn_k.weight", "@").replace("blk.3.attn_v.weight", "blk.3.attn_k.weight")
               .replace("@", "blk.3.attn_v.weight"))
    b = from_text(swapped)
    assert b["blk.3.Kcur"].inputs[0].name == "blk.3.attn_v.weight"
    d = diff_graphs(smol, b)
    assert graph_hash(smol) != graph_hash(b)
    assert d.summary == [hash_line(smol, b), f"nodes: {len(smol)} -> {len(b)} (0 added, 0 removed, 2 changed)",
                         "layers: 3"]
    assert d.first == "blk.3.Kcur: operand 0 (w): %blk.3.attn_k.weight -> %blk.3.attn_v.weight"
    assert d.layers == [3]


def test_weight_dtype_change(smol: Graph) -> None:
    b = edited(smol, ("weight %blk.3.attn_q.weight : q4_1[576, 576]", "weight %blk.3.attn_q.weight : q8_0[576, 576]"))
    d = diff_graphs(smol, b)
    assert d.summary == [hash_line(smol, b), f"nodes: {len(smol)} -> {len(b)} (0 added, 0 removed, 1 changed)",
                         "layers: 3", "weight changed: %blk.3.attn_q.weight: q4_1[576, 576] -> q8_0[576, 576]"]
    assert d.first == "blk.3.attn_q.weight: type q4_1[576, 576] -> q8_0[576, 576]"
    assert d.layers == [3]


def test_weights_added_and_removed(smol: Graph) -> None:
    b = edited(smol, ("%blk.7.Qcur = mul_mat(%blk.7.attn_q.weight, %blk.7.attn_norm) : f32[576, n_tokens]",
                      "weight %blk.7.attn_q.bias : f32[576]\n"
                      "%blk.7.Qcur.w = mul_mat(%blk.7.attn_q.weight, %blk.7.attn_norm) : f32[576, n_tokens]\n"
                      "%blk.7.Qcur = add(%blk.7.Qcur.w, %blk.7.attn_q.bias) : f32[576, n_tokens]"))
    d = diff_graphs(smol, b)
    # Qcur turns from mul_mat into add, and the new Qcur.w is a mul_mat: only add and weight counts move
    assert d.summary[1:] == [f"nodes: {len(smol)} -> {len(b)} (2 added, 0 removed, 1 changed)", "layers: 7",
                             f"ops: add {2 * N_LAYER} -> {2 * N_LAYER + 1}, "
                             f"weight {9 * N_LAYER + 2} -> {9 * N_LAYER + 3}",
                             "blk.7: add 2 -> 3, weight 9 -> 10",
                             "weight added: %blk.7.attn_q.bias : f32[576]"]
    assert d.first == "blk.7.attn_q.bias: only in b (weight %blk.7.attn_q.bias : f32[576])"
    back = diff_graphs(b, smol)
    assert back.summary[-1] == "weight removed: %blk.7.attn_q.bias : f32[576]"
    assert back.first == "blk.7.attn_q.bias: only in a (weight %blk.7.attn_q.bias : f32[576])"


def test_contexts_differ(smol: Graph) -> None:
    none = open_model("SmolLM2-135M").build_graph("none", "prefill")
    d = diff_graphs(smol, none, "kv", "none")
    # per layer the cache inputs, rows, writes and views go (8), and k, v, v.cont, kq, kq_soft_max change type
    # (5); globally k_idxs and v_idxs go and kq_mask changes type
    assert d.summary == [
        hash_line(smol, none),
        "context: kv -> none",
        "dim n_kv: [1, n_ctx] -> -",
        "dim n_ctx: [1, inf] -> -",
        f"nodes: {len(smol)} -> {len(none)} (0 added, {8 * N_LAYER + 2} removed, {5 * N_LAYER + 1} changed)",
        "layers: 0-29",
        f"ops: input {2 * N_LAYER + 6} -> 4, reshape {6 * N_LAYER} -> {4 * N_LAYER}, set_rows {2 * N_LAYER} -> 0, "
        f"view {2 * N_LAYER} -> 0",
        "global: input 6 -> 4",
        "blk.0-29: input 2 -> 0, reshape 6 -> 4, set_rows 2 -> 0, view 2 -> 0",
    ]
    assert d.first == "k_idxs: only in kv (input %k_idxs : i64[n_tokens] {role=k_idxs})"
    assert d.layers == list(range(N_LAYER))


def test_same_structure_different_names(smol: Graph) -> None:
    b = edited(smol, ("%blk.3.q = permute", "%blk.3.q_heads = permute"),
               ("%blk.3.kq = mul_mat(%blk.3.k, %blk.3.q)", "%blk.3.kq = mul_mat(%blk.3.k, %blk.3.q_heads)"))
    d = diff_graphs(smol, b)
    assert graph_hash(smol) == graph_hash(b) and not d.same
    assert d.summary == [f"hash: {graph_hash(smol)[:16]} on both sides (same structure; names or header differ)",
                         f"nodes: {len(smol)} -> {len(b)} (1 added, 1 removed, 1 changed)", "layers: 3"]
    assert d.first == ("blk.3.q: only in a "
                       "(%blk.3.q = permute(%blk.3.Qcur.rope) {axes=[0, 2, 1, 3]} : f32[64, n_tokens, 9])")


def test_header_only_change(smol: Graph) -> None:
    b = edited(smol, ("n_ctx_train=8192", "n_ctx_train=4096"))
    d = diff_graphs(smol, b)
    assert d.summary == [f"hash: {graph_hash(smol)[:16]} on both sides (same structure; names or header differ)",
                         "hparams n_ctx_train: 8192 -> 4096"]
    assert (d.same, d.first, d.layers) == (False, None, [])
    assert d.render() == "\n".join(d.summary) + "\n\n" + d.unified


def test_render_and_json(smol: Graph) -> None:
    b = edited(smol, ("rms_norm(%blk.5.ffn_inp) {eps=1e-05}", "rms_norm(%blk.5.ffn_inp) {eps=1e-06}"))
    d = diff_graphs(smol, b, "old.txt", "new.txt")
    assert d.render() == "\n".join(d.summary) + f"\nfirst mismatch: {d.first}\n\n" + d.unified
    doc = json.loads(json.dumps(d.as_dict()))
    assert doc == {"same": False, "a": {"label": "old.txt", "hash": graph_hash(smol)},
                   "b": {"label": "new.txt", "hash": graph_hash(b)}, "summary": d.summary, "first": d.first,
                   "layers": [5], "unified": d.unified}
    assert diff_graphs(smol, b, "old.txt", "new.txt") == d  # deterministic


def test_405b_one_layer_edit_is_found_in_its_layer() -> None:
    """Two 4542-node graphs; the speed of the same diff is bench/bench_graph.py's to measure (target 1 s)."""
    a = open_model("Llama-3.1-405B").build_graph("kv", "prefill")
    b = edited(a, ("rms_norm(%blk.59.l_out) {eps=1e-05}", "rms_norm(%blk.59.l_out) {eps=1e-06}"))
    d = diff_graphs(a, b)
    assert (d.first, d.layers) == ("blk.60.attn_norm.rms_norm: attr eps: 1e-05 -> 1e-06", [60])
