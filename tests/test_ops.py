"""Specification of graphir.graph.ops: the catalogue's contents and each op's shape/dtype rule, in ggml (ne0-first) order."""

from __future__ import annotations

import pytest

from graphir.graph.dims import Sym
from graphir.graph.ir import Node
from graphir.graph.ops import BINARY, COMPUTING, LEAVES, OPS, UNARY, VIEWS, ShapeError, infer

T = Sym.named("n_tokens")
KV = Sym.named("n_kv")
CTX = Sym.named("n_ctx")

ROPE = {"n_dims": 64, "mode": "norm", "n_ctx_orig": 8192, "freq_base": 10000.0, "freq_scale": 1.0,
        "ext_factor": 0.0, "attn_factor": 1.0, "beta_fast": 32.0, "beta_slow": 1.0}


def t(dtype: str, *shape) -> Node:
    """A leaf of the given type, to feed an op."""
    return Node("x", "input", (), {"role": "x"}, dtype, tuple(shape))


def rejects(op: str, inputs: list[Node], attrs: dict, match: str) -> None:
    with pytest.raises(ShapeError, match=match):
        infer(op, inputs, attrs)


# --------------------------------------------------------------------------- the catalogue

ALL_OPS = ["add", "add_id", "argsort_top_k", "cast", "clamp", "concat", "cont", "div", "exp", "fill", "gated_delta_net",
           "gated_linear_attn", "geglu",
           "gelu", "gelu_erf", "gelu_quick", "get_rows", "im2col", "input", "interpolate", "l2_norm", "lightning_indexer", "mean", "moe_sum",
           "mul", "mul_mat", "mul_mat_id", "neg", "norm", "pad", "permute", "pool_2d", "reglu",
           "relu", "repeat", "reshape", "rms_norm", "rope", "rope_multi", "rwkv_wkv6", "rwkv_wkv7", "scale", "scale_bias",
           "set_rows", "sigmoid", "silu", "soft_max", "softplus", "sqr", "sqrt", "ssm_conv", "ssm_scan", "ssm_scan_heads",
           "sub", "sum_rows", "swiglu", "swiglu_clamp", "swiglu_oai", "tanh", "transpose", "view", "weight", "xielu"]
KINDS = {"leaf", "movement", "elementwise", "unary", "norm", "reduce", "matmul", "attention", "recurrent", "memory"}


def test_catalogue_holds_exactly_the_known_ops():
    assert sorted(OPS) == ALL_OPS


def test_every_op_is_registered_under_its_own_name():
    assert all(d.name == name for name, d in OPS.items())


@pytest.mark.parametrize("name", ALL_OPS)
def test_every_op_has_a_kind_a_rule_and_a_doc(name):
    d = OPS[name]
    assert d.kind in KINDS
    assert callable(d.infer)
    assert d.doc.strip()


@pytest.mark.parametrize("name", ALL_OPS)
def test_optional_operands_come_only_at_the_end(name):
    slots = OPS[name].operands
    first_optional = next((i for i, s in enumerate(slots) if s.endswith("?")), len(slots))
    assert all(s.endswith("?") for s in slots[first_optional:])


def test_only_inputs_and_weights_are_leaves():
    assert sorted(n for n, d in OPS.items() if d.kind == "leaf") == ["input", "weight"]


def test_only_input_accepts_further_attributes():
    assert sorted(n for n, d in OPS.items() if d.open_attrs) == ["input"]


def test_rope_has_an_optional_freq_factors_operand():
    assert OPS["rope"].operands == ("a", "pos", "freq_factors?")
    assert OPS["rope"].min_arity == 2


# --------------------------------------------------------------------------- infer: catalogue checks


def test_the_named_groups_are_the_catalogues():
    assert LEAVES == {"input", "weight"}
    assert BINARY == {"add", "sub", "mul", "div"}
    assert UNARY == {"scale", "silu", "gelu", "gelu_erf", "gelu_quick", "relu", "sqr", "neg", "exp", "tanh", "sigmoid",
                     "softplus", "clamp", "fill", "cast", "xielu", "sqrt", "scale_bias"}
    assert VIEWS == {"reshape", "view", "permute", "transpose", "cont"}
    assert COMPUTING == set(OPS) - LEAVES


def test_the_builder_names_an_unknown_op():
    from graphir.model.builder import GraphBuilder
    from graphir.errors import GraphError
    from graphir.memory.kv import KVCache
    from graphir.model.meta import open_model

    m = open_model("SmolLM2-135M")
    b = GraphBuilder(m.arch, m.label, m.tensors, KVCache(m.arch.needs), "prefill")
    with b.layer(3), pytest.raises(GraphError, match=r"unknown op 'swoglu' \(for node blk\.3\.ffn_out\): not in"):
        b.op("swoglu", t("f32", 4), name="ffn_out")


def test_infer_rejects_an_unknown_op():
    rejects("frobnicate", [t("f32", 4)], {}, "unknown op 'frobnicate'")


def test_infer_rejects_too_few_operands():
    rejects("rope", [t("f32", 64, 9, T)], ROPE, r"rope takes 2\.\.3 operands, got 1")


def test_infer_rejects_too_many_operands():
    rejects("silu", [t("f32", 4), t("f32", 4)], {}, r"silu takes 1\.\.1 operands, got 2")


def test_infer_rejects_a_missing_attribute():
    rejects("rms_norm", [t("f32", 576, T)], {}, r"rms_norm attributes must be \['eps'\], got \[\]")


def test_infer_rejects_an_extra_attribute():
    rejects("silu", [t("f32", 4)], {"inplace": True}, r"silu attributes must be \[\], got \['inplace'\]")


def test_infer_requires_attributes_in_catalogue_order():
    rejects("soft_max", [t("f32", 4, 4)], {"max_bias": 0.0, "scale": 1.0},
            r"soft_max attributes must be \['scale', 'max_bias'\]")


def test_leaves_have_no_inference_rule():
    rejects("weight", [], {"tensor": "w"}, "leaves declare their own type")


# --------------------------------------------------------------------------- get_rows


def test_get_rows_gathers_dequantized_rows():
    assert infer("get_rows", [t("q8_0", 576, 49152), t("i32", T)], {}) == ("f32", (576, T))


def test_get_rows_rejects_float_ids():
    rejects("get_rows", [t("q8_0", 576, 49152), t("f32", T)], {}, "row ids must be integer, got f32")


def test_get_rows_rejects_2d_ids_over_a_2d_source():
    rejects("get_rows", [t("f32", 576, 100), t("i32", T, 2)], {},
            r"2-D row ids i32\[n_tokens, 2\] need a 3-D source with 2 batches, got f32\[576, 100\]")


def test_get_rows_with_2d_ids_picks_rows_per_batch():
    """ggml's batched form: MoE takes each token's selected probabilities, ids [n_expert_used, n_tokens]."""
    assert infer("get_rows", [t("f32", 1, 8, T), t("i32", 2, T)], {}) == ("f32", (1, 2, T))
    rejects("get_rows", [t("f32", 1, 8, 3), t("i32", 2, T)], {}, r"need a 3-D source with n_tokens batches")


def test_get_rows_rejects_4d_ids():
    rejects("get_rows", [t("f32", 576, 100), t("i32", 2, 2, 2, 2)], {},
            r"row ids must be 1-D \(or 2-D or 3-D, batched\)")


def test_get_rows_rejects_a_3d_source():
    rejects("get_rows", [t("f32", 64, 9, T), t("i32", 5)], {}, r"source must be 2-D, got f32\[64, 9, n_tokens\]")


# --------------------------------------------------------------------------- mul_mat


def test_mul_mat_contracts_ne0():
    # w = [K, M], x = [K, N] -> [M, N]
    assert infer("mul_mat", [t("q4_1", 576, 1536), t("f32", 576, T)], {}) == ("f32", (1536, T))


def test_mul_mat_broadcasts_w_over_the_batch_dims_of_x():
    # w = [K, M, A2], x = [K, N, B2] with A2 | B2 -> [M, N, B2]  (GQA: 3 kv heads serve 9 query heads)
    assert infer("mul_mat", [t("f16", 64, KV, 3), t("f32", 64, T, 9)], {}) == ("f32", (KV, T, 9))


def test_mul_mat_result_is_f32_for_f16_operands():
    assert infer("mul_mat", [t("f16", 8, 4), t("f16", 8, 2)], {}) == ("f32", (4, 2))


def test_mul_mat_rejects_different_inner_dims():
    rejects("mul_mat", [t("f32", 576, 1536), t("f32", 512, T)], {},
            r"inner dimensions differ: f32\[576, 1536\] x f32\[512, n_tokens\]")


def test_mul_mat_rejects_batch_dims_that_do_not_divide():
    rejects("mul_mat", [t("f16", 64, KV, 2), t("f32", 64, T, 9)], {},
            r"cannot broadcast f16\[64, n_kv, 2\] over f32\[64, n_tokens, 9\] in dims 2-3")


# --------------------------------------------------------------------------- mixture of experts


def test_mul_mat_id_gives_each_token_a_row_per_selected_expert():
    # w = [K, M, n_expert], x = [K, 1, T] (or a row per slot), ids = [n_used, T] -> [M, n_used, T]
    w, ids = t("q4_k", 2048, 768, 128), t("i32", 8, T)
    assert infer("mul_mat_id", [w, t("f32", 2048, 1, T), ids], {}) == ("f32", (768, 8, T))
    assert infer("mul_mat_id", [t("f32", 768, 2048, 128), t("f32", 768, 8, T), ids], {}) == ("f32", (2048, 8, T))


@pytest.mark.parametrize("w,x,ids,match", [
    (("f32", 64, 16), ("f32", 64, 1, T), ("i32", 2, T), r"expert weights must be 3-D"),
    (("f32", 64, 16, 4), ("f32", 64, 1, T), ("i64", 2, T), r"expert ids must be i32\[n_expert_used, n_tokens\]"),
    (("f32", 64, 16, 4), ("f32", 64, T), ("i32", 2, T), r"x must be 3-D"),
    (("f32", 64, 16, 4), ("f32", 32, 1, T), ("i32", 2, T), r"inner dimensions differ"),
    (("f32", 64, 16, 4), ("f32", 64, 3, T), ("i32", 2, T), r"needs 1 or 2 rows per token"),
    (("f32", 64, 16, 4), ("f32", 64, 1, 5), ("i32", 2, T), r"differ in tokens"),
])
def test_mul_mat_id_rejects_operands_that_do_not_fit(w, x, ids, match):
    rejects("mul_mat_id", [t(*w), t(*x), t(*ids)], {}, match)


def test_argsort_top_k_keeps_k_ids_per_row():
    assert infer("argsort_top_k", [t("f32", 128, T)], {"k": 8}) == ("i32", (8, T))
    rejects("argsort_top_k", [t("f32", 8, T)], {"k": 9}, r"k=9 must be in \[1, 8\]")


def test_sum_rows_and_moe_sum_reduce_one_axis():
    assert infer("sum_rows", [t("f32", 8, T)], {}) == ("f32", (1, T))
    assert infer("moe_sum", [t("f32", 2048, 8, T)], {}) == ("f32", (2048, T))
    rejects("moe_sum", [t("f32", 2048, T)], {}, r"expects \[n_embd, n_expert_used, n_tokens\]")


def test_add_id_adds_each_slots_expert_bias_row():
    assert infer("add_id", [t("f32", 2880, 4, T), t("f32", 2880, 32), t("i32", 4, T)], {}) == ("f32", (2880, 4, T))
    rejects("add_id", [t("f32", 2880, 4, T), t("f32", 64, 32), t("i32", 4, T)], {},
            r"biases f32\[64, 32\] are not \[2880, n_expert\]")
    rejects("add_id", [t("f32", 2880, 4, T), t("f32", 2880, 32), t("i32", 2, T)], {},
            r"ids must be i32\[4, n_tokens\]")


# --------------------------------------------------------------------------- add / mul (broadcast by repetition)


@pytest.mark.parametrize("op", ["add", "mul"])
def test_binary_broadcasts_a_row_vector_over_columns(op):
    assert infer(op, [t("f32", 576, T), t("f32", 576)], {}) == ("f32", (576, T))


def test_binary_of_equal_shapes_keeps_the_shape():
    assert infer("add", [t("f32", 576, T), t("f32", 576, T)], {}) == ("f32", (576, T))


def test_binary_accepts_a_vector_whose_length_divides_ne0():
    # ggml_can_repeat: 576 % 3 == 0, so [3] tiles 192 times along ne0
    assert infer("add", [t("f32", 576, T), t("f32", 3)], {}) == ("f32", (576, T))


def test_binary_rejects_a_vector_whose_length_does_not_divide_ne0():
    rejects("add", [t("f32", 576, T), t("f32", 5)], {}, r"cannot broadcast f32\[5\] into f32\[576, n_tokens\]")


def test_binary_rejects_broadcasting_the_larger_operand_into_the_smaller():
    rejects("mul", [t("f32", 576), t("f32", 576, T)], {},
            r"operand 1 f32\[576, n_tokens\] has more non-1 dimensions than operand 0 f32\[576\]")


def test_binary_rejects_a_symbolic_dim_into_a_different_symbol():
    rejects("add", [t("f32", 576, T), t("f32", 576, KV)], {}, r"cannot broadcast f32\[576, n_kv\]")


# --------------------------------------------------------------------------- unary and norms


@pytest.mark.parametrize("op, attrs", [("silu", {}), ("gelu", {}), ("relu", {}), ("scale", {"s": 0.5}),
                                       ("rms_norm", {"eps": 1e-5}), ("norm", {"eps": 1e-5})])
def test_unary_keeps_the_shape_and_computes_in_f32(op, attrs):
    assert infer(op, [t("f16", 576, T)], attrs) == ("f32", (576, T))


@pytest.mark.parametrize("op, attrs", [("silu", {}), ("rms_norm", {"eps": 1e-5})])
def test_unary_rejects_an_integer_operand(op, attrs):
    rejects(op, [t("i32", T)], attrs, "expects a float operand, got i32")


# --------------------------------------------------------------------------- gated units


@pytest.mark.parametrize("op", ["swiglu", "geglu"])
def test_glu_of_equal_gate_and_up_keeps_the_shape(op):
    assert infer(op, [t("f32", 1536, T), t("f32", 1536, T)], {}) == ("f32", (1536, T))


def test_glu_rejects_gate_and_up_of_different_shapes():
    rejects("swiglu", [t("f32", 1536, T), t("f32", 1024, T)], {},
            r"gate f32\[1536, n_tokens\] and up f32\[1024, n_tokens\] differ")


def test_swiglu_oai_is_a_gated_unit_with_alpha_and_limit():
    attrs = {"alpha": 1.702, "limit": 7.0}
    assert infer("swiglu_oai", [t("f32", 2880, 4, T), t("f32", 2880, 4, T)], attrs) == ("f32", (2880, 4, T))
    rejects("swiglu_oai", [t("f32", 2880, T), t("f32", 2880, T)], {"limit": 7.0, "alpha": 1.702},
            r"swiglu_oai attributes must be \['alpha', 'limit'\]")


# --------------------------------------------------------------------------- rope


def test_rope_keeps_the_shape_of_its_heads():
    assert infer("rope", [t("f32", 64, 9, T), t("i32", T)], ROPE) == ("f32", (64, 9, T))


def test_rope_accepts_freq_factors_of_half_the_rotated_dims():
    assert infer("rope", [t("f32", 64, 9, T), t("i32", T), t("f32", 32)], ROPE) == ("f32", (64, 9, T))


def test_rope_rejects_positions_that_do_not_match_ne2():
    rejects("rope", [t("f32", 64, 9, T), t("i32", 9)], ROPE,
            r"positions i32\[9\] do not match the token axis \(ne2\) of f32\[64, 9, n_tokens\]")


def test_rope_rejects_non_i32_positions():
    rejects("rope", [t("f32", 64, 9, T), t("i64", T)], ROPE, r"positions must be i32\[n\], got i64\[n_tokens\]")


def test_rope_rejects_n_dims_larger_than_the_head():
    rejects("rope", [t("f32", 64, 9, T), t("i32", T)], {**ROPE, "n_dims": 128},
            "n_dims=128 does not fit head size 64")


def test_rope_rejects_odd_n_dims():
    rejects("rope", [t("f32", 64, 9, T), t("i32", T)], {**ROPE, "n_dims": 63}, "n_dims=63 does not fit head size 64")


def test_rope_rejects_freq_factors_of_the_wrong_length():
    rejects("rope", [t("f32", 64, 9, T), t("i32", T), t("f32", 64)], ROPE,
            r"freq factors must be f32\[32\], got f32\[64\]")


MROPE = {**ROPE, "mode": "imrope", "sections": (11, 11, 10, 0)}


def test_rope_multi_keeps_the_shape_of_its_heads_and_takes_four_positions_a_token():
    assert infer("rope_multi", [t("f32", 256, 8, T), t("i32", 4 * T)], MROPE) == ("f32", (256, 8, T))
    rejects("rope_multi", [t("f32", 256, 8, T), t("i32", T)], MROPE,
            r"positions i32\[n_tokens\] do not match the token axis \(ne2\) of f32\[256, 8, n_tokens\], 4 a token")


@pytest.mark.parametrize("attrs,match", [
    ({"mode": "neox"}, r"mode='neox': multi-section RoPE is 'imrope'"),
    ({"sections": (11, 11, 10)}, r"sections=\[11, 11, 10\] must be 4 counts"),
    ({"sections": (0, 0, 0, 32)}, r"sections=\[0, 0, 0, 32\] must be 4 counts of rotated pairs, one of the first"),
    ({"sections": (30, 30, 10, 0)}, r"sections=\[30, 30, 10, 0\] hold more pairs than head size 64"),
    ({"n_dims": 66}, r"n_dims=66 does not fit head size 64"),
])
def test_rope_multi_rejects_bad_sections_and_the_rules_of_rope(attrs, match):
    rejects("rope_multi", [t("f32", 64, 8, T), t("i32", 4 * T)], {**MROPE, **attrs}, match)


S_ = Sym.named("n_seqs")


def gdn(d=80, hk=2, h=4, n=T, s=S_, **over) -> list[Node]:
    """gated_delta_net operands: q, k [d, hk, n, s], v [d, h, n, s], g, beta [1, h, n, s], state [d, d, h, s]."""
    shapes = {"q": (d, hk, n, s), "k": (d, hk, n, s), "v": (d, h, n, s), "g": (1, h, n, s), "beta": (1, h, n, s),
              "state": (d, d, h, s), **over}
    return [t("f32", *shapes[k]) for k in ("q", "k", "v", "g", "beta", "state")]


def test_gated_delta_net_returns_every_output_then_the_final_states_flat():
    assert infer("gated_delta_net", gdn(n=5, s=2), {}) == ("f32", (80 * 4 * 5 * 2 + 80 * 80 * 4 * 2,))


def test_gated_delta_net_takes_a_decay_per_key_channel_too():
    assert infer("gated_delta_net", gdn(n=5, s=2, g=(80, 4, 5, 2)), {}) == ("f32", (80 * 4 * 5 * 2 + 80 * 80 * 4 * 2,))


@pytest.mark.parametrize("over,match", [
    ({"k": (80, 2, T)}, r"q f32\[80, 2, n_tokens, n_seqs\] and k f32\[80, 2, n_tokens\] must be the same 4-D"),
    ({"q": (64, 2, T, S_), "k": (64, 2, T, S_)}, r"does not fit v .*: key and value heads are both 80 wide"),
    ({"q": (80, 3, T, S_), "k": (80, 3, T, S_)}, r"4 value heads do not share 3 key heads evenly"),
    ({"g": (16, 4, T, S_)}, r"g f32\[16, 4, n_tokens, n_seqs\] is not \[1 \(a decay per head\) or 80 \(per key"),
    ({"beta": (1, 2, T, S_)}, r"beta f32\[1, 2, n_tokens, n_seqs\] is not \[1, 4"),
    ({"state": (80, 80, 2, S_)}, r"state f32\[80, 80, 2, n_seqs\] is not \[80, 80, 4, n_seqs\]"),
])
def test_gated_delta_net_rejects_operands_that_do_not_fit(over, match):
    rejects("gated_delta_net", gdn(**over), {}, match)


# --------------------------------------------------------------------------- soft_max


def test_soft_max_with_a_matching_mask_keeps_the_scores_shape():
    attrs = {"scale": 0.125, "max_bias": 0.0}
    assert infer("soft_max", [t("f32", KV, T, 9), t("f32", KV, T)], attrs) == ("f32", (KV, T, 9))


def test_soft_max_without_a_mask_keeps_the_shape():
    assert infer("soft_max", [t("f32", KV, T, 9)], {"scale": 1.0, "max_bias": 0.0}) == ("f32", (KV, T, 9))


def test_soft_max_takes_one_sink_per_head():
    attrs = {"scale": 0.125, "max_bias": 0.0}
    assert infer("soft_max", [t("f32", KV, T, 9), t("f32", KV, T), t("f32", 9)], attrs) == ("f32", (KV, T, 9))
    rejects("soft_max", [t("f32", KV, T, 9), t("f32", KV, T), t("f32", 8)], attrs,
            r"sinks must be f32\[9\] \(one per head, ne2 of the scores\), got f32\[8\]")


def test_soft_max_rejects_a_mask_that_does_not_cover_the_scores():
    rejects("soft_max", [t("f32", KV, T, 9), t("f32", T, T)], {"scale": 0.125, "max_bias": 0.0},
            r"mask f32\[n_tokens, n_tokens\] does not match scores f32\[n_kv, n_tokens, 9\]")


# --------------------------------------------------------------------------- reshape / view


def test_reshape_splits_heads_and_keeps_the_dtype():
    assert infer("reshape", [t("f16", 576, T)], {"shape": (64, 9, T)}) == ("f16", (64, 9, T))


def test_reshape_rejects_a_different_element_count():
    rejects("reshape", [t("f32", 576, T)], {"shape": (64, 8, T)},
            r"cannot reshape f32\[576, n_tokens\] to \[64, 8, n_tokens\]")


def test_view_takes_its_shape_from_the_attributes_and_keeps_the_dtype():
    attrs = {"shape": (64, 3, KV), "strides": (1, 64, 192), "offset": 0}
    assert infer("view", [t("f16", 192, CTX)], attrs) == ("f16", (64, 3, KV))


def test_view_rejects_strides_of_another_rank():
    rejects("view", [t("f16", 192, CTX)], {"shape": (64, 3, KV), "strides": (1, 64), "offset": 0},
            r"view shape \[64, 3, n_kv\] and strides \[1, 64\] differ in rank")


# --------------------------------------------------------------------------- permute / transpose / cont


def test_permute_sends_axis_i_to_axes_i():
    # [d, n_head, T] -> [d, T, n_head]
    assert infer("permute", [t("f32", 64, 9, T)], {"axes": (0, 2, 1, 3)}) == ("f32", (64, T, 9))


def test_permute_rotates_axes_and_keeps_the_dtype():
    # axis 0 -> 1, axis 1 -> 2, axis 2 -> 0: [64, 3, n_kv] -> [n_kv, 64, 3]
    assert infer("permute", [t("f16", 64, 3, KV)], {"axes": (1, 2, 0, 3)}) == ("f16", (KV, 64, 3))


def test_permute_rejects_axes_that_are_not_a_permutation():
    rejects("permute", [t("f32", 64, 9, T)], {"axes": (0, 0, 1, 3)}, r"axes \[0, 0, 1, 3\] are not a permutation")


def test_permute_rejects_fewer_axes_than_the_rank():
    rejects("permute", [t("f32", 64, 9, T)], {"axes": (1, 0)}, r"axes \[1, 0\] are not a permutation for")


def test_transpose_swaps_ne0_and_ne1_of_a_matrix():
    assert infer("transpose", [t("f32", 4, 5)], {}) == ("f32", (5, 4))


def test_transpose_swaps_ne0_and_ne1_of_a_3d_tensor():
    # ggml_transpose is ggml_permute(a, 1, 0, 2, 3): any rank, ne2/ne3 stay put
    assert infer("transpose", [t("f32", 4, 5, 6)], {}) == ("f32", (5, 4, 6))


def test_cont_keeps_dtype_and_shape():
    assert infer("cont", [t("f16", KV, 64, 3)], {}) == ("f16", (KV, 64, 3))


# --------------------------------------------------------------------------- concat


def test_concat_adds_the_sizes_along_dim():
    assert infer("concat", [t("f32", 64, T), t("f32", 64, 3)], {"dim": 1}) == ("f32", (64, T + 3))


def test_concat_along_ne0():
    assert infer("concat", [t("f32", 32, T), t("f32", 32, T)], {"dim": 0}) == ("f32", (64, T))


def test_pad_appends_zeros_along_each_dim():
    assert infer("pad", [t("f32", 64, T)], {"pad": (192, 0, 0, 0)}) == ("f32", (256, T))


def test_concat_rejects_operands_that_differ_off_the_axis():
    rejects("concat", [t("f32", 64, T), t("f32", 32, T)], {"dim": 1},
            r"cannot concat f32\[64, n_tokens\] and f32\[32, n_tokens\] on 1")


# --------------------------------------------------------------------------- set_rows


def test_set_rows_returns_the_destination_type():
    assert infer("set_rows", [t("f16", 192, CTX), t("f32", 192, T), t("i64", T)], {}) == ("f16", (192, CTX))


def test_set_rows_rejects_rows_whose_count_differs_from_the_ids():
    rejects("set_rows", [t("f16", 192, CTX), t("f32", 192, T), t("i64", 4)], {},
            r"rows f32\[192, n_tokens\] do not fit f16\[192, n_ctx\] at ids i64\[4\]")


def test_set_rows_rejects_rows_of_another_width():
    rejects("set_rows", [t("f16", 192, CTX), t("f32", 64, T), t("i64", T)], {},
            r"rows f32\[64, n_tokens\] do not fit f16\[192, n_ctx\]")


def test_batched_set_rows_writes_each_batchs_rows_of_a_3d_destination():
    assert infer("set_rows", [t("f32", 32, 8, T), t("f32", 32, 4, T), t("i32", 4, T)], {}) == ("f32", (32, 8, T))
    rejects("set_rows", [t("f32", 32, 8, T), t("f32", 32, 4, T), t("i32", 3, T)], {}, "do not fit")


def test_get_rows_with_3d_ids_gathers_per_two_batch_dims():
    assert infer("get_rows", [t("f32", 1, 32, 8, T), t("i32", 2, 8, T)], {}) == ("f32", (1, 2, 8, T))
    rejects("get_rows", [t("f32", 1, 32, 8), t("i32", 2, 8, T)], {}, r"need a 4-D source with 8 x n_tokens batches")


def test_repeat_tiles_to_a_shape_each_size_divides():
    assert infer("repeat", [t("f32", 64, 1, T)], {"shape": (64, 16, T)}) == ("f32", (64, 16, T))
    rejects("repeat", [t("f32", 64, 3, T)], {"shape": (64, 16, T)}, "cannot repeat")


def test_cast_changes_the_type_between_f32_and_i32_only():
    assert infer("cast", [t("i32", 2, T)], {"type": "f32"}) == ("f32", (2, T))
    assert infer("cast", [t("f32", 2, T)], {"type": "i32"}) == ("i32", (2, T))
    with pytest.raises(ShapeError, match="casts between f32 and i32, not f16 to i32"):
        infer("cast", [t("f16", 2, T)], {"type": "i32"})


def test_fill_keeps_the_shape():
    assert infer("fill", [t("f32", 32, 8, T)], {"c": float("-inf")}) == ("f32", (32, 8, T))


def test_set_rows_rejects_float_ids():
    rejects("set_rows", [t("f16", 192, CTX), t("f32", 192, T), t("f32", T)], {},
            r"row ids must be integer 1-D, got f32\[n_tokens\]")
