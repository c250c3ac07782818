"""Specification of graphir.graph.verify: a built graph passes; each kind of corruption is rejected naming node and op."""

from __future__ import annotations

import re
from functools import lru_cache

import pytest

from graphir.errors import GraphError
from graphir.graph.forms import from_text, to_text
from graphir.graph.ir import Graph, Node
from graphir.model.meta import open_model
from graphir.graph.verify import verify


@lru_cache(maxsize=None)
def _graph() -> Graph:
    return open_model("SmolLM2-135M").build_graph("kv", "prefill")


@lru_cache(maxsize=None)
def _text() -> str:
    return to_text(_graph(), fold=False)


def edited(old: str, new: str) -> str:
    """The unfolded SmolLM2 text with the one line ``old`` replaced by ``new``."""
    text = _text()
    assert text.count(old) == 1, old
    return text.replace(old, new)


def line_of(text: str, needle: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if needle in line)


def copy_with(nodes: list[Node], outputs: dict[str, Node] | None = None) -> Graph:
    g = _graph()
    return Graph(dict(g.meta), g.dims, nodes, dict(g.outputs) if outputs is None else outputs)


# --------------------------------------------------------------------------- accepted


@pytest.mark.parametrize("context, phase", [("none", "prefill"), ("kv", "prefill"), ("kv", "decode")])
def test_a_built_preset_graph_verifies(context, phase):
    assert verify(open_model("SmolLM2-135M").build_graph(context, phase)) is None


def test_the_unedited_text_parses_and_verifies():
    assert len(from_text(_text())) == len(_graph())


# --------------------------------------------------------------------------- rejected: recorded type


def test_a_recorded_shape_that_disagrees_with_inference_is_rejected():
    text = edited("%blk.3.Qcur = mul_mat(%blk.3.attn_q.weight, %blk.3.attn_norm) : f32[576, n_tokens]",
                  "%blk.3.Qcur = mul_mat(%blk.3.attn_q.weight, %blk.3.attn_norm) : f32[577, n_tokens]")
    with pytest.raises(GraphError, match=re.escape(
            "node blk.3.Qcur (mul_mat): recorded type f32[577, n_tokens], but its operands give f32[576, n_tokens]")):
        from_text(text)


def test_a_recorded_dtype_that_disagrees_with_inference_is_rejected():
    text = edited("%blk.3.Qcur = mul_mat(%blk.3.attn_q.weight, %blk.3.attn_norm) : f32[576, n_tokens]",
                  "%blk.3.Qcur = mul_mat(%blk.3.attn_q.weight, %blk.3.attn_norm) : f16[576, n_tokens]")
    with pytest.raises(GraphError, match=re.escape("node blk.3.Qcur (mul_mat): recorded type f16[576, n_tokens]")):
        from_text(text)


def test_operands_that_break_the_op_rule_are_rejected_with_the_rule_message():
    text = edited("%blk.3.ffn_swiglu = swiglu(%blk.3.ffn_gate, %blk.3.ffn_up) : f32[1536, n_tokens]",
                  "%blk.3.ffn_swiglu = swiglu(%blk.3.ffn_gate, %blk.3.attn_norm) : f32[1536, n_tokens]")
    with pytest.raises(GraphError, match=re.escape(
            "node blk.3.ffn_swiglu (swiglu): gate f32[1536, n_tokens] and up f32[576, n_tokens] differ")):
        from_text(text)


# --------------------------------------------------------------------------- rejected: op, attributes, dtype


def test_an_unknown_op_is_rejected():
    text = edited("%blk.3.ffn_swiglu = swiglu(", "%blk.3.ffn_swiglu = swoglu(")
    with pytest.raises(GraphError, match=re.escape("node blk.3.ffn_swiglu (swoglu): unknown op")):
        from_text(text)


def test_a_missing_attribute_is_rejected():
    text = edited("%blk.3.attn_norm.rms_norm = rms_norm(%blk.2.l_out) {eps=1e-05} : f32[576, n_tokens]",
                  "%blk.3.attn_norm.rms_norm = rms_norm(%blk.2.l_out) : f32[576, n_tokens]")
    with pytest.raises(GraphError, match=re.escape(
            "node blk.3.attn_norm.rms_norm (rms_norm): rms_norm attributes must be ['eps'], got []")):
        from_text(text)


def test_an_input_without_its_role_attribute_is_rejected():
    # the catalogue declares input's attributes as ("role", ...open); a leaf's attributes must still be checked
    text = edited("input %tokens : i32[n_tokens] {role=tokens}", "input %tokens : i32[n_tokens]")
    with pytest.raises(GraphError, match=r"node tokens \(input\): .*role"):
        from_text(text)


def test_an_unknown_dtype_is_rejected():
    text = edited("weight %blk.3.attn_q.weight : q4_1[576, 576]", "weight %blk.3.attn_q.weight : q9_9[576, 576]")
    with pytest.raises(GraphError, match=re.escape("node blk.3.attn_q.weight (weight): unknown dtype 'q9_9'")):
        from_text(text)


def test_a_weight_whose_tensor_attribute_is_not_its_name_is_rejected():
    nodes = list(_graph().nodes)
    i = next(i for i, n in enumerate(nodes) if n.name == "blk.3.attn_q.weight")
    w = nodes[i]
    nodes[i] = Node(w.name, "weight", (), {"tensor": "blk.4.attn_q.weight"}, w.dtype, w.shape)
    with pytest.raises(GraphError, match=re.escape(
            "node blk.3.attn_q.weight (weight): a weight's tensor attribute must be its name")):
        verify(copy_with(nodes))


def test_a_leaf_with_operands_is_rejected():
    g = _graph()
    x = g["tokens"]
    nodes = list(g.nodes)
    nodes.append(Node("stray", "input", (x,), {"role": "stray"}, "i32", x.shape))
    with pytest.raises(GraphError, match=re.escape("node stray (input): a leaf takes no operands")):
        verify(copy_with(nodes))


# --------------------------------------------------------------------------- rejected: order and names


def test_an_operand_used_before_its_definition_is_rejected_by_the_verifier():
    nodes = list(_graph().nodes)
    names = [n.name for n in nodes]
    w, q = names.index("blk.3.attn_q.weight"), names.index("blk.3.Qcur")
    nodes[w], nodes[q] = nodes[q], nodes[w]
    with pytest.raises(GraphError, match=re.escape(
            "node blk.3.Qcur (mul_mat): operand 0 %blk.3.attn_q.weight is not defined before use")):
        verify(copy_with(nodes))


def test_an_operand_used_before_its_definition_is_rejected_by_the_text_parser_with_line_and_name():
    text = edited("%blk.3.attn_norm.rms_norm = rms_norm(%blk.2.l_out)", "%blk.3.attn_norm.rms_norm = rms_norm(%blk.3.l_out)")
    lineno = line_of(text, "%blk.3.attn_norm.rms_norm = ")
    with pytest.raises(GraphError, match=rf"^line {lineno}: .*blk\.3\.l_out"):
        from_text(text)


def test_a_duplicate_name_is_rejected_by_the_verifier():
    g = _graph()
    nodes = list(g.nodes)
    q = g["blk.3.Qcur"]
    i = nodes.index(q)
    nodes.insert(i + 1, Node("blk.3.Qcur", q.op, q.inputs, q.attrs, q.dtype, q.shape))
    with pytest.raises(GraphError, match=re.escape("node blk.3.Qcur (mul_mat): name used twice")):
        verify(copy_with(nodes))


def test_a_duplicate_name_is_rejected_by_the_text_parser_with_its_line():
    line = "%blk.3.Qcur = mul_mat(%blk.3.attn_q.weight, %blk.3.attn_norm) : f32[576, n_tokens]"
    text = edited(line, line + "\n" + line)
    lineno = line_of(text, line) + 1
    with pytest.raises(GraphError, match=re.escape(f"line {lineno}: duplicate name %blk.3.Qcur")):
        from_text(text)


# --------------------------------------------------------------------------- rejected: outputs


def test_an_output_that_is_not_a_node_of_the_graph_is_rejected_by_the_verifier():
    g = _graph()
    ghost = Node("ghost", "input", (), {"role": "ghost"}, "f32", (576,))
    with pytest.raises(GraphError, match=re.escape("output logits (%ghost) is not a node of the graph")):
        verify(copy_with(list(g.nodes), {**g.outputs, "logits": ghost}))


def test_an_output_naming_no_node_is_rejected_by_the_text_parser():
    text = edited("output logits = %result_output", "output logits = %ghost")
    with pytest.raises(GraphError, match=re.escape("output refers to unknown node %ghost")):
        from_text(text)


def test_an_output_of_integer_type_is_rejected():
    g = _graph()
    with pytest.raises(GraphError, match=re.escape("output logits (%tokens) has non-float type i32")):
        verify(copy_with(list(g.nodes), {**g.outputs, "logits": g["tokens"]}))
