"""Specification of graphir.graph.forms: canonical text/JSON that round-trip byte for byte, layer folding, float
spelling, parser errors, and independence from the hash seed."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from functools import lru_cache

import pytest

from graphir.errors import GraphError
from graphir.graph.forms import from_json, from_text, to_json, to_text
from graphir.graph.hashing import graph_hash
from graphir.graph.ir import Graph, Node
from graphir.model.meta import open_model
from conftest import graph_cases

CASES = graph_cases()
IDS = [f"{p}-{c}-{ph}" for p, c, ph in CASES]


@lru_cache(maxsize=None)
def build(preset: str, context: str = "kv", phase: str = "prefill") -> Graph:
    return open_model(preset).build_graph(context, phase)


def smol_text(fold: bool = True) -> str:
    return to_text(build("SmolLM2-135M"), fold=fold)


def fold_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("...")]


def full_layers(text: str) -> list[int]:
    """Layers that have at least one node printed in full (not through a fold line), in order."""
    seen: list[int] = []
    for line in text.splitlines():
        m = re.match(r"^(?:weight |input )?%blk\.(\d+)\.", line)
        if m and int(m.group(1)) not in seen:
            seen.append(int(m.group(1)))
    return seen


def replace_once(text: str, old: str, new: str) -> str:
    assert text.count(old) == 1, old
    return text.replace(old, new)


# --------------------------------------------------------------------------- round trips, every preset


@pytest.mark.parametrize("preset, context, phase", CASES, ids=IDS)
def test_folded_text_round_trips_byte_identically(preset, context, phase):
    g = build(preset, context, phase)
    text = to_text(g)
    g2 = from_text(text)
    assert to_text(g2) == text
    assert graph_hash(g2) == graph_hash(g)


@pytest.mark.parametrize("preset, context, phase", CASES, ids=IDS)
def test_unfolded_text_round_trips_byte_identically(preset, context, phase):
    g = build(preset, context, phase)
    text = to_text(g, fold=False)
    g2 = from_text(text)
    assert to_text(g2, fold=False) == text
    assert graph_hash(g2) == graph_hash(g)


@pytest.mark.parametrize("preset, context, phase", CASES, ids=IDS)
def test_json_round_trips_byte_identically(preset, context, phase):
    g = build(preset, context, phase)
    doc = to_json(g)
    g2 = from_json(doc)
    assert to_json(g2) == doc
    assert graph_hash(g2) == graph_hash(g)


@pytest.mark.parametrize("preset, context, phase", CASES, ids=IDS)
def test_folded_text_parses_to_the_same_nodes_as_unfolded_text(preset, context, phase):
    g = build(preset, context, phase)
    assert to_text(from_text(to_text(g)), fold=False) == to_text(g, fold=False)


@pytest.mark.parametrize("preset, context, phase", CASES, ids=IDS)
def test_text_parses_to_the_graph_whose_json_the_builder_gives(preset, context, phase):
    g = build(preset, context, phase)
    assert to_json(from_text(to_text(g))) == to_json(g)


def test_json_is_valid_json_with_format_and_version():
    doc = json.loads(to_json(build("SmolLM2-135M")))
    assert (doc["format"], doc["version"]) == ("graphir-graph", 1)
    assert len(doc["nodes"]) == len(build("SmolLM2-135M"))


def test_text_starts_with_magic_and_version():
    assert smol_text().splitlines()[0] == "graphir graph v1"


# --------------------------------------------------------------------------- folding


def test_smollm2_text_has_exactly_one_fold_line():
    assert fold_lines(smol_text()) == ["... blk.2-28 like blk.1"]


def test_smollm2_prints_in_full_only_the_first_two_layers_and_the_last():
    # blk.0 reads inp_embd, not a previous layer; blk.29 gathers output rows
    assert full_layers(smol_text()) == [0, 1, 29]


def test_smollm2_folded_text_unfolds_to_thirty_layers():
    g = from_text(smol_text())
    assert sorted({n.layer for n in g.nodes if n.layer is not None}) == list(range(30))
    assert len(g) == len(build("SmolLM2-135M"))


def test_unfolded_text_has_no_fold_lines():
    assert fold_lines(smol_text(fold=False)) == []


def _with_eps_changed_in_blk5() -> str:
    return replace_once(smol_text(fold=False),
                        "%blk.5.attn_norm.rms_norm = rms_norm(%blk.4.l_out) {eps=1e-05}",
                        "%blk.5.attn_norm.rms_norm = rms_norm(%blk.4.l_out) {eps=1e-06}")


def test_a_deviating_layer_breaks_the_fold_and_is_printed():
    folded = to_text(from_text(_with_eps_changed_in_blk5()))
    assert "%blk.5.attn_norm.rms_norm = rms_norm(%blk.4.l_out) {eps=1e-06} : f32[576, n_tokens]" in folded


def test_only_the_deviating_layer_is_printed_and_the_rest_fold_like_the_first_equal_layer():
    folded = to_text(from_text(_with_eps_changed_in_blk5()))
    assert fold_lines(folded) == ["... blk.2-4 like blk.1", "... blk.6-28 like blk.1"]
    assert full_layers(folded) == [0, 1, 5, 29]


def test_text_folded_around_a_deviating_layer_unfolds_to_the_edited_graph():
    edited = _with_eps_changed_in_blk5()
    assert to_text(from_text(to_text(from_text(edited))), fold=False) == edited


def test_a_fold_may_refer_to_any_printed_layer():
    text = replace_once(smol_text(), "... blk.2-28 like blk.1", "... blk.2-3 like blk.1\n... blk.4-28 like blk.1")
    assert to_text(from_text(text), fold=False) == smol_text(fold=False)


# --------------------------------------------------------------------------- floats


def test_text_prints_eps_as_the_shortest_float32_spelling():
    text = smol_text()
    assert "{eps=1e-05}" in text
    assert "9.999999747378752e-06" not in text


def test_hparams_line_prints_floats_as_the_shortest_float32_spelling():
    hparams = next(line for line in smol_text().splitlines() if line.startswith("hparams "))
    assert "norm_rms_eps=1e-05" in hparams.split()
    assert "rope_freq_base=100000.0" in hparams.split()


def test_qwen_eps_prints_as_1e_06():
    text = to_text(build("Qwen2.5-0.5B"))
    assert "{eps=1e-06}" in text
    assert "9.999999974752427e-07" not in text


def test_an_irrational_scale_prints_as_its_float32_spelling():
    # 1/sqrt(128) as float32
    assert "{scale=0.088388346, max_bias=0.0}" in to_text(build("Llama-3.1-8B"))


def test_json_writes_eps_as_the_shortest_float32_spelling():
    doc = to_json(build("SmolLM2-135M"))
    assert '"eps": 1e-05' in doc
    assert "9.999999747378752e-06" not in doc


def test_parsed_floats_are_float32_values():
    g = from_text(smol_text())
    assert g["blk.0.attn_norm.rms_norm"].attrs["eps"] == 9.999999747378752e-06


# --------------------------------------------------------------------------- parser errors


def test_text_with_a_wrong_magic_is_rejected():
    text = "graphir grph v1\n" + smol_text().split("\n", 1)[1]
    with pytest.raises(GraphError, match=re.escape("not a graphir text graph (first line 'graphir grph v1')")):
        from_text(text)


def test_text_of_another_version_is_rejected():
    text = "graphir graph v2\n" + smol_text().split("\n", 1)[1]
    with pytest.raises(GraphError, match=re.escape("graph text version 2 is not supported (this graphir reads v1)")):
        from_text(text)


def test_empty_text_is_rejected():
    with pytest.raises(GraphError, match="empty graph text"):
        from_text("")


def test_a_bad_line_is_rejected_with_its_line_number():
    lines = smol_text().splitlines()
    lines.insert(20, "this is not a node")
    with pytest.raises(GraphError, match=re.escape("line 21: not a node line: this is not a node")):
        from_text("\n".join(lines) + "\n")


def test_a_fold_referring_to_an_unprinted_layer_is_rejected():
    text = replace_once(smol_text(), "... blk.2-28 like blk.1", "... blk.2-28 like blk.40")
    lineno = text.splitlines().index("... blk.2-28 like blk.40") + 1
    with pytest.raises(GraphError, match=re.escape(f"line {lineno}: fold refers to blk.40, which was not printed")):
        from_text(text)


def test_a_malformed_fold_line_is_rejected():
    text = replace_once(smol_text(), "... blk.2-28 like blk.1", "... blk.2-28 as blk.1")
    lineno = text.splitlines().index("... blk.2-28 as blk.1") + 1
    with pytest.raises(GraphError, match=re.escape(f"line {lineno}: bad fold line: ... blk.2-28 as blk.1")):
        from_text(text)


def test_a_malformed_dim_line_is_rejected():
    text = replace_once(smol_text(), "dim n_ctx in [1, inf]", "dim n_ctx between 1 and inf")
    with pytest.raises(GraphError, match=r"line \d+: bad dim line: dim n_ctx between 1 and inf"):
        from_text(text)


def test_a_malformed_hparams_line_is_rejected_with_its_line_number():
    text = replace_once(smol_text(), "hparams arch=llama ", "hparams arch=llama oops ")
    lineno = next(i for i, line in enumerate(text.splitlines(), 1) if line.startswith("hparams "))
    with pytest.raises(GraphError, match=rf"^line {lineno}: "):
        from_text(text)


def test_json_with_a_node_row_that_is_not_an_object_is_rejected():
    doc = json.loads(to_json(build("SmolLM2-135M")))
    doc["nodes"][3] = 1
    with pytest.raises(GraphError):
        from_json(json.dumps(doc))


def test_json_that_is_not_json_is_rejected():
    with pytest.raises(GraphError, match="^not JSON: "):
        from_json("graphir graph v1\n")


def test_json_of_another_format_is_rejected():
    doc = json.loads(to_json(build("SmolLM2-135M")))
    doc["format"] = "onnx"
    with pytest.raises(GraphError, match=re.escape("not a graphir JSON graph (format 'onnx')")):
        from_json(json.dumps(doc))


def test_json_of_another_version_is_rejected():
    doc = json.loads(to_json(build("SmolLM2-135M")))
    doc["version"] = 2
    with pytest.raises(GraphError, match=re.escape("graph JSON version 2 is not supported (this graphir reads v1)")):
        from_json(json.dumps(doc))


def test_json_with_an_operand_before_its_definition_is_rejected():
    doc = json.loads(to_json(build("SmolLM2-135M")))
    doc["nodes"].reverse()
    with pytest.raises(GraphError, match="graph JSON refers to unknown node or field"):
        from_json(json.dumps(doc))


# --------------------------------------------------------------------------- determinism across processes

_DUMP = """
import json, sys
from graphir.model.meta import open_model
from graphir.graph.forms import to_text, to_json
from graphir.graph.hashing import graph_hash
g = open_model('SmolLM2-135M').build_graph('kv', 'prefill')
json.dump({'text': to_text(g), 'unfolded': to_text(g, fold=False), 'json': to_json(g), 'hash': graph_hash(g),
           'str_hash': hash('n_tokens')}, sys.stdout)
"""


def _dump(seed: str) -> dict:
    env = {**os.environ, "PYTHONHASHSEED": seed}
    out = subprocess.run([sys.executable, "-c", _DUMP], env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


@lru_cache(maxsize=None)
def _dumps() -> tuple[dict, dict]:
    return _dump("1"), _dump("2")


def test_the_two_subprocesses_really_run_with_different_hash_seeds():
    a, b = _dumps()
    assert a["str_hash"] != b["str_hash"]


@pytest.mark.parametrize("form", ["text", "unfolded", "json", "hash"])
def test_forms_do_not_depend_on_the_hash_seed(form):
    a, b = _dumps()
    assert a[form] == b[form]


def test_forms_from_a_subprocess_equal_those_of_this_process():
    a, _ = _dumps()
    g = build("SmolLM2-135M")
    assert (a["text"], a["json"], a["hash"]) == (to_text(g), to_json(g), graph_hash(g))


# --------------------------------------------------------------------------- attribute values


def _one_input(**attrs) -> Graph:
    x = Node("x", "input", (), {"role": "x", **attrs}, "f32", (4,))
    return Graph({}, (), [x], {"out": x})


@pytest.mark.parametrize("value", ["linear", "true", "inf", "nan", "123", "a b", ""])
def test_a_string_attribute_survives_a_text_round_trip_as_a_string(value):
    g = from_text(to_text(_one_input(note=value)))
    assert g["x"].attrs["note"] == value


@pytest.mark.parametrize("value", [True, False, 0, -3, 1.5, float("inf")])
def test_a_scalar_attribute_survives_a_text_round_trip(value):
    g = from_text(to_text(_one_input(note=value)))
    assert g["x"].attrs["note"] == value
    assert type(g["x"].attrs["note"]) is type(value)


def test_a_float_attribute_comes_back_rounded_to_float32():
    g = from_text(to_text(_one_input(note=1e-05)))
    assert g["x"].attrs["note"] == 9.999999747378752e-06
