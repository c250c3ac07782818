"""to_networkx: names as ids, one edge per operand keyed by slot; and nothing else imports networkx."""

from __future__ import annotations

import subprocess
import sys

import networkx as nx
import pytest

from graphir.graph.forms import from_text, to_text
from graphir.graph.ir import Graph
from graphir.model.meta import open_model
from graphir.graph.nxview import to_networkx


@pytest.fixture(scope="module")
def smol() -> Graph:
    return open_model("SmolLM2-135M").build_graph("kv", "prefill")


def test_counts_and_dag(smol: Graph) -> None:
    G = to_networkx(smol)
    assert isinstance(G, nx.MultiDiGraph)
    assert list(G.nodes) == [n.name for n in smol.nodes]
    assert G.number_of_edges() == sum(len(n.inputs) for n in smol.nodes)
    assert nx.is_directed_acyclic_graph(G)
    assert G.graph["outputs"] == {"embd": "result_norm", "logits": "result_output"}


def test_node_attributes(smol: Graph) -> None:
    G = to_networkx(smol)
    assert G.nodes["blk.3.Kcur"] == {"op": "mul_mat", "dtype": "f32", "shape": "[192, n_tokens]", "layer": 3,
                                     "attrs": {}}
    assert G.nodes["blk.0.attn_norm.rms_norm"]["attrs"] == {"eps": "1e-05"}
    assert G.nodes["blk.0.Kcur.heads"]["attrs"] == {"shape": "[64, 3, n_tokens]"}
    assert G.nodes["token_embd.weight"] == {"op": "weight", "dtype": "q8_0", "shape": "[576, 49152]", "layer": None,
                                            "attrs": {"tensor": "token_embd.weight"}}


def test_edges_carry_slots_in_order(smol: Graph) -> None:
    G = to_networkx(smol)
    for n in smol.nodes:
        ins = sorted(G.in_edges(n.name, keys=True, data="slot"), key=lambda e: e[2])
        assert [(src, key, slot) for src, _, key, slot in ins] == [(x.name, i, i) for i, x in enumerate(n.inputs)]


def test_same_operand_twice_keeps_both_edges(smol: Graph) -> None:
    text = to_text(smol, fold=False).replace(
        "%blk.0.attn_norm = mul(%blk.0.attn_norm.rms_norm, %blk.0.attn_norm.weight)",
        "%blk.0.attn_norm = mul(%blk.0.attn_norm.rms_norm, %blk.0.attn_norm.rms_norm)")
    G = to_networkx(from_text(text))
    assert sorted(G["blk.0.attn_norm.rms_norm"]["blk.0.attn_norm"]) == [0, 1]


def test_ancestors(smol: Graph) -> None:
    up = nx.ancestors(to_networkx(smol), "result_output")
    assert {"token_embd.weight", "tokens", "blk.0.attn_k.weight", "blk.29.ffn_down.weight", "kq_mask"} <= up
    assert "result_output" not in up


def test_building_and_printing_do_not_import_networkx() -> None:
    code = ("import sys\n"
            "from graphir.model.meta import open_model\n"
            "from graphir.graph.forms import to_text, to_json\n"
            "from graphir.graph.hashing import graph_hash\n"
            "from graphir.graph.diff import diff_graphs\n"
            "from graphir.graph.dot import to_dot\n"
            "g = open_model('SmolLM2-135M').build_graph('kv', 'prefill')\n"
            "to_text(g); to_json(g); graph_hash(g); diff_graphs(g, g); to_dot(g, (0, 1))\n"
            "assert 'networkx' not in sys.modules, 'networkx was imported'\n")
    subprocess.run([sys.executable, "-c", code], check=True)
