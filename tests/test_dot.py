"""to_dot: stable ids, operand slots on edges, layer slices with dashed boundary nodes; parse_layers; SVG through
Graphviz (and the README's picture)."""

from __future__ import annotations

import dataclasses
import re
import shutil
from pathlib import Path
from xml.etree import ElementTree

import pytest
from gguf import Keys

from graphir.cli import main
from graphir.errors import GraphirError
from graphir.graph.dot import parse_layers, to_dot, to_svg
from graphir.graph.ir import Graph, Node
from graphir.model.meta import from_preset, open_model
from graphir.model.presets import all_presets

NODE = re.compile(r'^  "((?:[^"\\]|\\.)+)" \[label="[^"]*", shape=\w+(, style="[\w,]+")?(, fillcolor="#\w+")?'
                  r'(, peripheries=2)?\];$')
EDGE = re.compile(r'^  "([^"]+)" -> "([^"]+)" \[label="(\d+)"\];$')


@pytest.fixture(scope="module")
def smol() -> Graph:
    return open_model("SmolLM2-135M").build_graph("kv", "prefill")


def node_ids(dot: str) -> list[str]:
    return [m.group(1) for m in map(NODE.match, dot.splitlines()) if m]


def edges(dot: str) -> list[tuple[str, str, int]]:
    return [(m.group(1), m.group(2), int(m.group(3))) for m in map(EDGE.match, dot.splitlines()) if m]


def test_ids_are_names_and_stable(smol: Graph) -> None:
    dot = to_dot(smol)
    assert dot == to_dot(open_model("SmolLM2-135M").build_graph("kv", "prefill"))
    assert node_ids(dot) == [n.name for n in smol.nodes]
    assert edges(dot) == [(x.name, n.name, slot) for n in smol.nodes for slot, x in enumerate(n.inputs)]


def test_layer_slice_has_boundary_nodes(smol: Graph) -> None:
    dot = to_dot(smol, (3, 4))
    lines = {nid: line for nid, line in zip(node_ids(dot), (ln for ln in dot.splitlines() if NODE.match(ln)))}
    boundary = [nid for nid, line in lines.items() if "dashed" in line]
    assert boundary == ["pos", "k_idxs", "v_idxs", "kq_mask", "blk.2.l_out"]
    assert [nid for nid in lines if nid not in boundary] == [n.name for n in smol.nodes if n.layer == 3]
    assert lines["blk.2.l_out"] == '  "blk.2.l_out" [label="add\\nblk.2.l_out\\nf32[576, n_tokens]", shape=box, ' \
                                   'style="dashed"];'
    assert all(smol[dst].layer == 3 for _, dst, _ in edges(dot))
    assert ("blk.2.l_out", "blk.3.ffn_inp", 1) in edges(dot)


def test_whole_small_graph() -> None:
    p = all_presets()["SmolLM2-135M"]
    g = from_preset("tiny", dataclasses.replace(p, keys={**p.keys, Keys.LLM.BLOCK_COUNT: 2})).build_graph()
    dot = to_dot(g)
    lines = dot.splitlines()
    assert lines[:3] == ["digraph graphir {", '  node [fontname="monospace", fontsize=10];',
                         '  edge [fontname="monospace", fontsize=9];']
    assert dot.endswith("\n}\n")
    assert all(NODE.match(ln) or EDGE.match(ln) for ln in lines[3:-1])
    assert len(node_ids(dot)) == len(g) and "dashed" not in dot
    assert '  "token_embd.weight" [label="weight\\ntoken_embd.weight\\nq8_0[576, 49152]", shape=note, ' \
           'style="filled", fillcolor="#e8e8e8"];' in lines
    assert '  "tokens" [label="input\\ntokens\\ni32[n_tokens]", shape=invhouse, style="filled", ' \
           'fillcolor="#d8e8f8"];' in lines
    assert '  "result_output" [label="mul_mat\\nresult_output\\nf32[49152, n_outputs]", shape=box, ' \
           'peripheries=2];' in lines
    assert '  "blk.1.attn_k.weight" -> "blk.1.Kcur" [label="0"];' in lines
    assert '  "blk.1.attn_norm" -> "blk.1.Kcur" [label="1"];' in lines


def test_names_are_escaped() -> None:
    x = Node('odd "name"', "input", (), {"role": "x"}, "f32", (4,))
    dot = to_dot(Graph({}, (), [x], {}))
    assert '  "odd \\"name\\"" [label="input\\nodd \\"name\\"\\nf32[4]", shape=invhouse' in dot


@pytest.mark.parametrize("spec, expected", [
    ("3:5", (3, 5)), ("3:", (3, 30)), (":2", (0, 2)), ("7", (7, 8)), (":", (0, 30)), ("0", (0, 1)),
    ("-1", (29, 30)), ("-3:", (27, 30)), (":-1", (0, 29)), ("-5:-2", (25, 28)), (" 4 : 6 ", (4, 6)), ("0:30", (0, 30)),
])
def test_parse_layers(spec: str, expected: tuple[int, int]) -> None:
    assert parse_layers(spec, 30) == expected


@pytest.mark.parametrize("spec, message", [
    ("", "expected A:B, A:, :B or N with whole numbers, got ''"),
    ("x", "expected A:B, A:, :B or N with whole numbers, got 'x'"),
    ("1:2:3", "expected A:B, A:, :B or N with whole numbers, got '1:2:3'"),
    ("1.5", "expected A:B, A:, :B or N with whole numbers, got '1.5'"),
    ("30", "layer 30 is out of range: the model has 30 layers (0..29)"),
    ("-31", "layer -31 is out of range: the model has 30 layers (0..29)"),
    ("0:31", "layer bound 31 is out of range: the model has 30 layers (0..29)"),
    ("5:3", "'5:3' selects no layer (it means 5:3; the start must be below the stop)"),
    ("-1:-1", "'-1:-1' selects no layer (it means 29:29; the start must be below the stop)"),
])
def test_parse_layers_rejects(spec: str, message: str) -> None:
    with pytest.raises(ValueError) as e:
        parse_layers(spec, 30)
    assert str(e.value) == message


# ---- SVG through Graphviz ----------------------------------------------------------------------------------

SVG = "{http://www.w3.org/2000/svg}"
HAS_DOT = shutil.which("dot") is not None
needs_dot = pytest.mark.skipif(not HAS_DOT, reason="Graphviz's dot is not installed (apt-get install graphviz; "
                                                   ".ci/run installs it)")


def drawn(svg: str) -> tuple[dict[str, list[str]], list[tuple[str, str, int]]]:
    """What a Graphviz SVG shows: each node's text lines by node id, and each edge with its slot label."""
    root = ElementTree.fromstring(svg)
    nodes, arrows = {}, []
    for g in root.iter(f"{SVG}g"):
        title = g.findtext(f"{SVG}title")
        texts = [t.text or "" for t in g.iter(f"{SVG}text")]
        if g.get("class") == "node":
            nodes[title] = texts
        elif g.get("class") == "edge":
            src, dst = title.split("->")
            arrows.append((src, dst, int(texts[0])))
    return nodes, arrows


def shown(g: Graph, layers: tuple[int, int]) -> tuple[dict[str, list[str]], list[tuple[str, str, int]]]:
    """What the DOT of a layer slice says each node's label is, and its edges."""
    dot = to_dot(g, layers)
    labels = {m.group(1): re.search(r'label="([^"]*)"', ln).group(1).replace("\\\\", "\\").split("\\n")  # type: ignore[union-attr]
              for ln in dot.splitlines() if (m := NODE.match(ln))}
    return labels, edges(dot)


@needs_dot
def test_svg_is_the_dot_graph_laid_out(smol: Graph, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["dump", "SmolLM2-135M", "--format", "svg", "--layers", "3"]) == 0
    svg = capsys.readouterr().out
    assert svg.startswith("<?xml") and svg.rstrip().endswith("</svg>")
    nodes, arrows = drawn(svg)
    labels, expected = shown(smol, (3, 4))
    assert nodes == labels and len(nodes) == 5 + sum(n.layer == 3 for n in smol.nodes)
    assert sorted(arrows) == sorted(expected)


@needs_dot
def test_the_readme_picture_is_llama_layer_0_as_the_graph_is_now() -> None:
    # README.md shows docs/llama-layer.svg, made by `graphir dump Llama-3.1-8B --format svg --layers 0 -o ...`;
    # compared by what it shows, not byte for byte, so another Graphviz version's layout still passes
    root = Path(__file__).resolve().parent.parent
    assert "](docs/llama-layer.svg)" in (root / "README.md").read_text()
    nodes, arrows = drawn((root / "docs" / "llama-layer.svg").read_text())
    labels, expected = shown(open_model("Llama-3.1-8B").build_graph("kv", "prefill"), (0, 1))
    assert nodes == labels
    assert sorted(arrows) == sorted(expected)


def test_svg_without_graphviz_names_the_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    assert main(["dump", "SmolLM2-135M", "--format", "svg", "--layers", "0"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err == ("graphir: error: --format svg needs Graphviz's 'dot' program, which is not on PATH: install the "
                   "'graphviz' package of your system (apt-get install graphviz, brew install graphviz, conda "
                   "install graphviz)\n")


def test_a_failing_dot_is_reported_with_its_message(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "dot"
    fake.write_text("#!/bin/sh\necho 'Error: syntax error in line 1' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(GraphirError, match=r"^Graphviz's dot \(.*/dot\) failed with exit 1: Error: syntax error in "
                                           r"line 1$"):
        to_svg("digraph {")

