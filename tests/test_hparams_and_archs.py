"""Specification of hparams reading, the architecture registry, tensor checks, and the graphs the llama family builds."""

from __future__ import annotations

import dataclasses
import re
from functools import lru_cache

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

import graphir.arch
from graphir.arch.llama import Llama
from graphir.model.architecture import REGISTRY, Architecture
from graphir.model.builder import GraphBuilder
from graphir.graph.dims import Sym
from graphir.errors import GraphError, GraphirError, MetadataError, TensorError
from graphir.graph.forms import from_json, from_text, to_json, to_text
from graphir.model.hparams import read_hparams
from graphir.graph.ir import Graph
from graphir.memory.inputs import RecurrentState
from graphir.memory.kinds import assemble
from graphir.memory.layers import Attention, LatentAttention
from graphir.model.meta import ModelMeta, from_preset, open_model
from graphir.model.presets import all_presets

L, A, R = gguf.Keys.LLM, gguf.Keys.Attention, gguf.Keys.Rope
SMOL = "SmolLM2-135M"


def key(template: str, arch: str = "llama") -> str:
    return template.format(arch=arch)


_TEMPLATES = {
    "n_embd": L.EMBEDDING_LENGTH, "n_layer": L.BLOCK_COUNT, "n_ctx": L.CONTEXT_LENGTH, "n_ff": L.FEED_FORWARD_LENGTH,
    "vocab": L.VOCAB_SIZE, "n_head": A.HEAD_COUNT, "n_head_kv": A.HEAD_COUNT_KV, "key_length": A.KEY_LENGTH,
    "value_length": A.VALUE_LENGTH, "rms_eps": A.LAYERNORM_RMS_EPS, "causal": A.CAUSAL, "scale": A.SCALE,
    "freq_base": R.FREQ_BASE, "n_rot": R.DIMENSION_COUNT, "scaling_type": R.SCALING_TYPE,
    "scaling_factor": R.SCALING_FACTOR, "orig_ctx": R.SCALING_ORIG_CTX_LEN,
}


def smol_md(**changes: object) -> dict[str, object]:
    """SmolLM2's metadata with keys (short names of gguf.Keys templates) replaced, or removed when None."""
    md = all_presets()[SMOL].metadata()
    for template, value in changes.items():
        k = key(_TEMPLATES[template])
        if value is None:
            del md[k]
        else:
            md[k] = value
    return md


def hparams(md: dict[str, object], arch: str = "llama"):
    return graphir.arch.get(arch).from_metadata(SMOL, md).hp


@lru_cache(maxsize=None)
def build(preset: str, context: str = "kv", phase: str = "prefill") -> Graph:
    return open_model(preset).build_graph(context, phase)


# =========================================================================== hparams


def test_hparams_read_every_given_key():
    hp = open_model(SMOL).arch.hp
    assert (hp.arch, hp.n_vocab, hp.n_ctx_train, hp.n_embd, hp.n_layer, hp.n_ff) == ("llama", 49152, 8192, 576, 30, 1536)
    assert (hp.n_head, hp.n_head_kv, hp.n_rot, hp.rope_freq_base) == (9, 3, 64, 100000.0)


def test_head_count_kv_defaults_to_head_count():
    assert hparams(smol_md(n_head_kv=None)).n_head_kv == 9


def test_key_and_value_length_default_to_n_embd_over_n_head():
    hp = hparams(smol_md(n_embd=576, n_head=9))
    assert (hp.n_embd_head_k, hp.n_embd_head_v) == (64, 64)


def test_key_length_overrides_the_default():
    md = smol_md(key_length=128, n_rot=None)
    hp = hparams(md)
    assert (hp.n_embd_head_k, hp.n_embd_head_v, hp.n_rot) == (128, 64, 128)


def test_rope_dimension_count_defaults_to_the_key_length():
    assert hparams(smol_md(n_rot=None)).n_rot == 64


def test_rope_freq_base_defaults_to_10000():
    assert hparams(smol_md(freq_base=None)).rope_freq_base == 10000.0


def test_rope_scaling_defaults_to_linear_with_scale_one():
    hp = hparams(smol_md())
    assert (hp.rope_scaling, hp.rope_freq_scale) == ("linear", 1.0)


def test_a_linear_rope_scaling_factor_becomes_its_inverse_freq_scale():
    assert hparams(smol_md(scaling_factor=4.0)).rope_freq_scale == 0.25


def test_rope_scaling_type_none_ignores_the_factor():
    assert hparams(smol_md(scaling_factor=4.0, scaling_type="none")).rope_freq_scale == 1.0


def test_original_context_defaults_to_the_training_context():
    assert hparams(smol_md()).n_ctx_orig_yarn == 8192
    assert hparams(smol_md(orig_ctx=4096)).n_ctx_orig_yarn == 4096


def test_vocab_size_defaults_to_the_tokenizer_list_length():
    md = smol_md(vocab=None)
    md[gguf.Keys.Tokenizer.LIST] = ["a", "b", "c"]
    assert hparams(md).n_vocab == 3


def test_causal_defaults_to_true_and_reads_the_key():
    assert hparams(smol_md()).causal is True
    assert hparams(smol_md(causal=False)).causal is False


def test_floats_are_rounded_to_float32():
    assert hparams(smol_md()).norm_rms_eps == float(np.float32(1e-5))
    assert hparams(smol_md()).norm_rms_eps != 1e-5


def test_a_preset_float_and_the_same_float32_from_a_file_give_equal_hparams():
    from_file = smol_md(rms_eps=float(np.float32(1e-5)))
    assert hparams(from_file) == hparams(smol_md(rms_eps=1e-5))


def test_an_int_is_accepted_for_a_float_key():
    hp = hparams(smol_md(freq_base=10000))
    assert hp.rope_freq_base == 10000.0 and type(hp.rope_freq_base) is float


@pytest.mark.parametrize("short, name", [
    ("rms_eps", "llama.attention.layer_norm_rms_epsilon"),
    ("n_embd", "llama.embedding_length"),
    ("n_layer", "llama.block_count"),
    ("n_ctx", "llama.context_length"),
    ("n_ff", "llama.feed_forward_length"),
    ("n_head", "llama.attention.head_count"),
])
def test_a_missing_required_key_is_named(short, name):
    with pytest.raises(MetadataError, match=re.escape(f"{SMOL}: missing key '{name}'")):
        hparams(smol_md(**{short: None}))


@pytest.mark.parametrize("short, value, message", [
    ("n_layer", "30", "key 'llama.block_count' should be int, got str '30'"),
    ("n_layer", True, "key 'llama.block_count' should be int, got bool True"),
    ("n_layer", 30.0, "key 'llama.block_count' should be int, got float 30.0"),
    ("rms_eps", "1e-5", "key 'llama.attention.layer_norm_rms_epsilon' should be float, got str '1e-5'"),
    ("causal", 1, "key 'llama.attention.causal' should be bool, got int 1"),
])
def test_a_value_of_the_wrong_type_is_rejected(short, value, message):
    with pytest.raises(MetadataError, match=re.escape(message)):
        hparams(smol_md(**{short: value}))


def test_a_per_layer_array_whose_layers_agree_is_that_one_value_and_the_same_graph():
    md = smol_md(n_head_kv=[3] * 30, n_ff=[1536] * 30, n_head=[9] * 30)
    assert hparams(md) == hparams(smol_md())
    meta = ModelMeta(SMOL, md, open_model(SMOL).tensors)
    assert to_text(meta.build_graph("kv", "decode")) == to_text(build(SMOL, "kv", "decode"))


def test_a_per_layer_array_is_read_per_layer_and_printed_canonically():
    hp = read_hparams(SMOL, smol_md(n_layer=4, n_head_kv=[3, 0, 3, 1]), "llama")
    assert hp.n_head_kv == (3, 0, 3, 1) and [hp.head_count_kv(il) for il in range(4)] == [3, 0, 3, 1]
    assert hp.n_embd_k_gqa_at(3) == 64 and hp.head_count(2) == 9 and hp.ff_length(1) == 1536
    assert hp.as_dict()["n_head_kv"] == (3, 0, 3, 1)
    g = Graph({"arch": "test-per-layer", "hparams": hp.as_dict()}, (), [], {})
    assert "n_head_kv=[3,0,3,1]" in to_text(g).splitlines()[2].split()
    assert from_text(to_text(g)).meta["hparams"] == hp.as_dict()
    assert from_json(to_json(g)).meta["hparams"] == hp.as_dict()


def test_a_per_layer_array_of_the_wrong_length_or_type_is_refused():
    with pytest.raises(MetadataError, match=re.escape("key 'llama.attention.head_count_kv' has 3 values, one per "
                                                      "layer needs 30")):
        hparams(smol_md(n_head_kv=[3, 3, 3]))
    with pytest.raises(MetadataError, match=re.escape("key 'llama.feed_forward_length[1]' should be int")):
        hparams(smol_md(n_ff=[1536, "x"] + [1536] * 28))
    with pytest.raises(MetadataError, match=re.escape("key 'llama.rope.freq_base' is an array; graphir reads one "
                                                      "value for it")):
        hparams(smol_md(freq_base=[1.0] * 30))


def test_a_family_with_one_size_for_all_layers_refuses_layers_that_differ():
    with pytest.raises(MetadataError, match=re.escape("key 'llama.attention.head_count_kv' differs between layers; "
                                                      "the 'llama' family gives every layer the same size")):
        hparams(smol_md(n_head_kv=[3, 1] * 15))


def test_n_embd_not_divisible_by_n_head_is_rejected_without_a_key_length():
    with pytest.raises(MetadataError, match="n_embd 576 is not divisible by n_head 7"):
        hparams(smol_md(n_head=7, n_head_kv=7))


# =========================================================================== registry


def test_registry_names_every_family_module_s_architectures_sorted():
    """Each module of graphir.arch registers itself: the registry lists its architectures (and no test toy)."""
    names = graphir.arch.names()
    assert names == sorted(set(names)) and {"llama", "qwen2", "gemma3", "mamba2", "t5encoder"} <= set(names)
    assert all(REGISTRY[n].__module__.startswith("graphir.arch.") for n in names) and "test-hybrid" not in names


def test_get_returns_the_registered_class():
    assert graphir.arch.get("llama").name == "llama"
    assert graphir.arch.get("qwen2") is REGISTRY["qwen2"]


@pytest.mark.parametrize("name", graphir.arch.names())
def test_a_family_builds_its_own_graph_or_is_data_over_one(name):
    """A family's class sits directly below Architecture and builds its graph, or is a variant of such a class
    registered under another name that overrides no method (it sets constants: name, keys, traits)."""
    cls = graphir.arch.get(name)
    base = cls if cls.__bases__ == (Architecture,) else cls.__bases__[0]
    assert base.__bases__ == (Architecture,) and "build" in vars(base), f"{name}: {cls.__mro__}"
    overridden = [k for k, v in vars(cls).items()
                  if callable(v) and not isinstance(v, type) or isinstance(v, classmethod)]
    assert cls is base or (cls.__bases__ == (base,) and not overridden), f"{name} overrides {overridden}"


def test_an_unknown_architecture_is_rejected_listing_the_known_ones():
    known = ", ".join(graphir.arch.names())
    with pytest.raises(MetadataError, match=re.escape(f"unknown architecture 'nope' (known: {known})")):
        graphir.arch.get("nope")


def test_a_model_whose_metadata_names_an_unknown_architecture_is_rejected():
    md = {**smol_md(), gguf.Keys.General.ARCHITECTURE: "nope"}
    with pytest.raises(MetadataError, match="unknown architecture 'nope'"):
        ModelMeta("x.gguf", md, {}).arch


def test_a_model_without_an_architecture_key_is_rejected():
    md = smol_md()
    del md[gguf.Keys.General.ARCHITECTURE]
    with pytest.raises(MetadataError, match=re.escape("x.gguf: missing key 'general.architecture'")):
        ModelMeta("x.gguf", md, {}).arch


# =========================================================================== Architecture.check


def smol_tensors() -> dict:
    return dict(open_model(SMOL).tensors)


def smol_arch() -> Architecture:
    return open_model(SMOL).arch


@pytest.mark.parametrize("preset", list(all_presets()))
def test_every_preset_declares_exactly_the_expected_tensors(preset):
    m = open_model(preset)
    assert m.arch.check(m.tensors) == []


def test_an_absent_tied_output_is_not_reported():
    tensors = smol_tensors()
    assert "output.weight" not in tensors
    assert smol_arch().check(tensors) == []


def test_a_missing_tensor_is_reported():
    tensors = smol_tensors()
    del tensors["blk.3.ffn_up.weight"]
    assert smol_arch().check(tensors) == ["missing tensor 'blk.3.ffn_up.weight'"]


def test_an_unexpected_tensor_is_reported():
    tensors = smol_tensors()
    tensors["blk.30.attn_q.weight"] = dataclasses.replace(tensors["blk.0.attn_q.weight"], name="blk.30.attn_q.weight")
    assert smol_arch().check(tensors) == ["unexpected tensor 'blk.30.attn_q.weight'"]


def test_a_tensor_of_the_wrong_shape_is_reported():
    tensors = smol_tensors()
    tensors["blk.0.attn_k.weight"] = dataclasses.replace(tensors["blk.0.attn_k.weight"], shape=(576, 576))
    assert smol_arch().check(tensors) == ["tensor 'blk.0.attn_k.weight' has shape [576, 576], expected [576, 192]"]


def test_a_norm_vector_stored_as_f16_is_reported():
    tensors = smol_tensors()
    tensors["blk.0.attn_norm.weight"] = dataclasses.replace(tensors["blk.0.attn_norm.weight"], dtype=Q.F16)
    assert smol_arch().check(tensors) == ["tensor 'blk.0.attn_norm.weight' has type f16, expected f32"]


def test_a_q4_k_matrix_whose_ne0_is_not_a_multiple_of_256_is_reported():
    tensors = smol_tensors()
    tensors["blk.0.attn_q.weight"] = dataclasses.replace(tensors["blk.0.attn_q.weight"], dtype=Q.Q4_K)
    assert smol_arch().check(tensors) == [
        "tensor 'blk.0.attn_q.weight' has type q4_k whose 256-element blocks do not divide ne0=576"]


def test_a_q4_k_matrix_whose_ne0_is_a_multiple_of_256_fits():
    m = open_model("Llama-3.1-8B")
    tensors = dict(m.tensors)
    tensors["blk.0.attn_q.weight"] = dataclasses.replace(tensors["blk.0.attn_q.weight"], dtype=Q.Q4_K)
    assert m.arch.check(tensors) == []


def test_an_integer_matrix_is_reported():
    tensors = smol_tensors()
    tensors["blk.0.ffn_down.weight"] = dataclasses.replace(tensors["blk.0.ffn_down.weight"], dtype=Q.I32)
    assert smol_arch().check(tensors) == ["tensor 'blk.0.ffn_down.weight' has type i32, which is not a weight type"]


def test_every_problem_is_listed_once_in_declaration_order_then_unexpected_ones():
    tensors = smol_tensors()
    del tensors["blk.1.ffn_gate.weight"]
    tensors["blk.0.attn_norm.weight"] = dataclasses.replace(tensors["blk.0.attn_norm.weight"], dtype=Q.F16)
    tensors["extra.weight"] = dataclasses.replace(tensors["output_norm.weight"], name="extra.weight")
    assert smol_arch().check(tensors) == [
        "tensor 'blk.0.attn_norm.weight' has type f16, expected f32",
        "missing tensor 'blk.1.ffn_gate.weight'",
        "unexpected tensor 'extra.weight'",
    ]


def test_building_with_a_missing_tensor_raises_a_tensor_error_naming_it():
    m = open_model(SMOL)
    tensors = dict(m.tensors)
    del tensors["blk.3.ffn_up.weight"]
    with pytest.raises(TensorError, match=re.escape(f"{SMOL}: missing tensor 'blk.3.ffn_up.weight'")):
        ModelMeta(SMOL, m.metadata, tensors).build_graph()


def test_building_with_a_misshapen_tensor_raises_a_tensor_error_naming_it():
    m = open_model(SMOL)
    tensors = dict(m.tensors)
    tensors["blk.0.attn_k.weight"] = dataclasses.replace(tensors["blk.0.attn_k.weight"], shape=(576, 576))
    with pytest.raises(TensorError, match=re.escape(
            f"{SMOL}: tensor 'blk.0.attn_k.weight' has shape [576, 576], expected [576, 192]")):
        ModelMeta(SMOL, m.metadata, tensors).build_graph()


# =========================================================================== builder: the LM head


def test_a_tied_model_reads_logits_through_token_embd():
    g = build(SMOL)
    assert "output.weight" not in g
    assert g["result_output"].inputs[0].name == "token_embd.weight"


def test_an_untied_model_reads_logits_through_output_weight():
    g = build("Llama-3.1-8B")
    assert g["result_output"].inputs[0].name == "output.weight"
    assert g["output.weight"].type_str == "f16[4096, 128256]"


def test_the_outputs_are_the_final_norm_and_the_logits():
    g = build(SMOL)
    assert {r: n.name for r, n in g.outputs.items()} == {"embd": "result_norm", "logits": "result_output"}
    assert g.outputs["logits"].type_str == "f32[49152, n_outputs]"


# =========================================================================== builder: llama vs qwen2


def _ropes(g: Graph) -> list:
    return [n for n in g.nodes if n.op == "rope"]


def test_qwen2_ropes_in_neox_mode():
    assert {n.attrs["mode"] for n in _ropes(build("Qwen2.5-0.5B"))} == {"neox"}


def test_llama_ropes_in_norm_mode():
    assert {n.attrs["mode"] for n in _ropes(build(SMOL))} == {"norm"}


@pytest.mark.parametrize("which, tensor", [("Qcur", "attn_q"), ("Kcur", "attn_k"), ("Vcur", "attn_v")])
def test_qwen2_adds_the_qkv_bias_to_each_projection(which, tensor):
    g = build("Qwen2.5-0.5B")
    for il in range(g.n_layer):
        b = g[f"blk.{il}.{which}.b"]
        assert b.op == "add"
        assert [i.name for i in b.inputs] == [f"blk.{il}.{which}", f"blk.{il}.{tensor}.bias"]
        assert g[f"blk.{il}.{which}.heads"].inputs == (b,)


def test_llama_has_no_bias_adds():
    g = build(SMOL)
    assert not [n.name for n in g.nodes if n.name.endswith(".bias")]
    assert not [n.name for n in g.nodes if n.name.endswith(".b")]


def test_llama_3_1_passes_rope_freqs_as_ropes_third_operand():
    g = build("Llama-3.1-8B")
    assert g["rope_freqs.weight"].type_str == "f32[64]"
    assert all(len(n.inputs) == 3 and n.inputs[2].name == "rope_freqs.weight" for n in _ropes(g))
    assert len(_ropes(g)) == 2 * 32


@pytest.mark.parametrize("preset", [SMOL, "Qwen2.5-0.5B"])
def test_models_without_rope_freqs_rope_with_two_operands(preset):
    assert all(len(n.inputs) == 2 for n in _ropes(build(preset)))


def test_rope_takes_its_parameters_from_hparams():
    r = build(SMOL)["blk.0.Qcur.rope"]
    assert r.attrs == {"n_dims": 64, "mode": "norm", "n_ctx_orig": 8192, "freq_base": 100000.0, "freq_scale": 1.0,
                       "ext_factor": 0.0, "attn_factor": 1.0, "beta_fast": 32.0, "beta_slow": 1.0}


def test_kq_scale_is_one_over_sqrt_head_size():
    assert build(SMOL)["blk.0.kq_soft_max"].attrs["scale"] == 0.125


def test_an_attention_scale_key_overrides_the_kq_scale():
    m = open_model(SMOL)
    md = smol_md(scale=0.5)
    g = ModelMeta(SMOL, md, m.tensors).build_graph()
    assert g["blk.0.kq_soft_max"].attrs["scale"] == 0.5


# =========================================================================== builder: last layer rows


@pytest.mark.parametrize("preset", [SMOL, "Qwen2.5-0.5B"])
def test_only_the_last_layer_gathers_output_rows(preset):
    g = build(preset)
    last = g.n_layer - 1
    gathered = sorted({n.layer for n in g.nodes if n.name.endswith((".attn_out.rows", ".inp.rows"))})
    assert gathered == [last]


def test_the_last_layer_gathers_rows_before_the_ffn():
    g = build(SMOL)
    rows_a, rows_x = g["blk.29.attn_out.rows"], g["blk.29.inp.rows"]
    assert [i.name for i in rows_a.inputs] == ["blk.29.attn_out", "out_ids"]
    assert [i.name for i in rows_x.inputs] == ["blk.28.l_out", "out_ids"]
    assert g["blk.29.ffn_inp"].inputs == (rows_a, rows_x)
    assert g["blk.29.ffn_inp"].type_str == "f32[576, n_outputs]"


def test_other_layers_add_attention_to_the_residual_directly():
    g = build(SMOL)
    assert [i.name for i in g["blk.28.ffn_inp"].inputs] == ["blk.28.attn_out", "blk.27.l_out"]


# =========================================================================== builder: memory kinds


@pytest.mark.parametrize("il", [0, 15, 29])
@pytest.mark.parametrize("which", ["k", "v"])
def test_kv_context_writes_the_cache_before_the_view_attention_reads(il, which):
    g = build(SMOL)
    names = [n.name for n in g.nodes]
    write, view = g[f"blk.{il}.cache_{which}.write"], g[f"blk.{il}.cache_{which}.view"]
    assert write.op == "set_rows" and view.op == "view"
    assert view.inputs == (write,)
    assert names.index(write.name) < names.index(view.name)
    assert g[f"blk.{il}.{which}"].inputs == (view,)


def test_kv_cache_stores_k_after_rope():
    g = build(SMOL)
    assert g["blk.0.k_rows"].inputs[0].name == "blk.0.Kcur.rope"
    assert g["blk.0.cache_k.write"].inputs[1].name == "blk.0.k_rows"


def test_kv_cache_buffers_are_per_layer_f16_inputs_of_n_ctx_cells():
    g = build(SMOL)
    c = g["blk.7.cache_k"]
    assert (c.op, c.type_str, c.attrs) == ("input", "f16[192, n_ctx]", {"role": "cache_k"})


def test_kv_context_mask_spans_the_cache():
    assert build(SMOL)["kq_mask"].type_str == "f32[n_kv, n_tokens]"


def test_kv_prefill_declares_token_output_and_cache_dims():
    assert [str(d) for d in build(SMOL).dims] == [
        "n_tokens in [1, inf]", "n_outputs in [1, n_tokens]", "n_kv in [1, n_ctx]", "n_ctx in [1, inf]"]


def test_none_context_mask_spans_the_ubatch():
    assert build(SMOL, "none")["kq_mask"].type_str == "f32[n_tokens, n_tokens]"


def test_none_context_has_no_cache():
    g = build(SMOL, "none")
    assert not [n.name for n in g.nodes if n.op == "set_rows" or "cache" in n.name]
    assert [d.name for d in g.dims] == ["n_tokens", "n_outputs"]


def test_none_context_attends_over_the_current_keys():
    g = build(SMOL, "none")
    assert g["blk.0.k"].inputs[0].name == "blk.0.Kcur.rope"
    assert g["blk.0.kq"].type_str == "f32[n_tokens, n_tokens, 9]"


def test_decode_declares_only_cache_dims():
    assert [d.name for d in build(SMOL, "kv", "decode").dims] == ["n_kv", "n_ctx"]


def test_decode_has_one_token_everywhere():
    g = build(SMOL, "kv", "decode")
    used = set()
    for n in g.nodes:
        for d in n.shape:
            if isinstance(d, Sym):
                used |= d.symbols
    assert used == {"n_kv", "n_ctx"}
    assert (g["tokens"].shape, g["pos"].shape, g["out_ids"].shape) == ((1,), (1,), (1,))
    assert g.outputs["logits"].type_str == "f32[49152, 1]"


def test_decode_mask_is_one_row_over_the_cache():
    assert build(SMOL, "kv", "decode")["kq_mask"].type_str == "f32[n_kv, 1]"


def test_none_context_refuses_the_decode_phase():
    with pytest.raises(GraphirError, match=re.escape("context 'none' has no decode phase (it has: prefill)")):
        open_model(SMOL).build_graph("none", "decode")


def test_an_unknown_context_is_refused():
    with pytest.raises(GraphirError, match=re.escape("unknown context 'paged' (known: kv, iswa, recurrent, hybrid, hybrid_iswa, cross, mla, kv_dsa, none)")):
        open_model(SMOL).build_graph("paged", "prefill")


def test_an_unknown_phase_is_refused():
    with pytest.raises(GraphirError, match=re.escape("unknown phase 'train' (known: prefill, decode, encode)")):
        open_model(SMOL).build_graph("kv", "train")


def test_a_model_whose_layers_no_memory_holds_is_refused_naming_the_layer_kind():
    class Unheld(Llama):  # a test-only family: latent-attention layers and sliding-window ones, which no kind mixes
        name = "test-unheld"

        def layers(self):
            return tuple(Attention(512, 512, window=4) if il % 2 else LatentAttention(8) for il in range(self.hp.n_layer))

    try:
        with pytest.raises(MetadataError, match=re.escape("no memory kind holds a 'test-unheld' model's layers "
                                                          "(of kind latent, swa)")):
            Unheld(open_model(SMOL).arch.hp).contexts
    finally:
        REGISTRY.pop("test-unheld")


@pytest.mark.parametrize("kind, request_, message", [
    ("kv", lambda b, m: m.input_for(b, 0, RecurrentState("s")), "memory kind 'kv' holds no recurrent state for layer 0"),
    ("none", lambda b, m: m.input_for(b, 2, RecurrentState("r", write=True)),
     "memory kind 'none' holds no recurrent state for layer 2")])
def test_a_request_the_memory_does_not_hold_is_refused_naming_the_layer(kind, request_, message):
    m = open_model(SMOL)
    b = GraphBuilder(m.arch, m.label, m.tensors, assemble(kind, m.arch.needs), "prefill")
    with pytest.raises(GraphError, match=re.escape(message)):
        request_(b, b.memory)


def test_a_layer_request_outside_a_layer_is_refused():
    m = open_model(SMOL)
    b = GraphBuilder(m.arch, m.label, m.tensors, assemble("kv", m.arch.needs), "prefill")
    with pytest.raises(GraphError, match=re.escape("build_rs is a layer's request: call it inside `with b.layer(il)`")):
        b.build_rs("s")


# =========================================================================== builder: GQA


def test_gqa_scores_have_one_matrix_per_query_head():
    g = build(SMOL)
    assert g["blk.0.k"].type_str == "f16[64, n_kv, 3]"
    assert g["blk.0.q"].type_str == "f32[64, n_tokens, 9]"
    assert g["blk.0.kq"].type_str == "f32[n_kv, n_tokens, 9]"


def test_gqa_scores_of_llama_3_1_8b_have_32_heads_over_8_kv_heads():
    g = build("Llama-3.1-8B")
    assert g["blk.0.k"].type_str == "f16[128, n_kv, 8]"
    assert g["blk.0.kq"].type_str == "f32[n_kv, n_tokens, 32]"


def test_attention_output_is_flattened_back_to_n_embd():
    assert build(SMOL)["blk.0.kqv_out"].type_str == "f32[576, n_tokens]"


def test_graph_meta_records_arch_context_phase_and_hparams():
    g = build("Qwen2.5-0.5B", "kv", "decode")
    assert (g.meta["arch"], g.meta["context"], g.meta["phase"]) == ("qwen2", "kv", "decode")
    assert g.meta["hparams"]["n_head_kv"] == 2


def test_from_preset_labels_the_model_by_name():
    assert from_preset("my-label", all_presets()[SMOL]).label == "my-label"


# =========================================================================== what llama.cpp's loader accepts


@pytest.mark.parametrize("written", [-1, 2**32 - 1])
def test_an_unspecified_pooling_type_is_none_as_llama_cpp_makes_it(written: int):
    """llama.cpp writes LLAMA_POOLING_TYPE_UNSPECIFIED (-1, stored as a uint32) for a model that names none."""
    md = {**smol_md(), key(L.POOLING_TYPE): written}
    assert hparams(md).pooling == "none"


def test_a_pooling_type_llama_cpp_does_not_know_is_refused():
    with pytest.raises(MetadataError, match="unknown pooling type 7"):
        hparams({**smol_md(), key(L.POOLING_TYPE): 7})


@pytest.mark.parametrize("pattern", [[True, False, True, False], [1, 0, 1, 0], [5, 0, 2, 0]])
def test_a_sliding_pattern_reads_bools_and_ints_alike(pattern: list[object]):
    """llama.cpp reads a bool, int32 or uint32 array here; any nonzero entry marks a sliding layer."""
    md = all_presets()["Gemma-2-2B"].metadata()
    md[key(L.BLOCK_COUNT, "gemma2")] = 4
    md[key(A.SLIDING_WINDOW_PATTERN, "gemma2")] = pattern
    assert hparams(md, "gemma2").swa_layers == (1, 0, 1, 0)


@pytest.mark.parametrize("written,expected,fits", [
    ((64,), (64, 1, 1), True), ((64, 1, 1), (64,), True), ((64, 1), (64, 1, 1), True),
    ((64, 2), (64, 1, 2), False), ((1, 64), (64,), False), ((64,), (65, 1, 1), False)])
def test_shapes_compare_as_llama_cpps_loader_compares_them(written, expected, fits):
    """check_tensor_dims: a dimension past the written ones is 1, so only trailing 1s may differ."""
    from graphir.model.tensors import TensorSpec

    why = TensorSpec("blk.0.x.weight", expected, kind="vector").problem(written, gguf.GGMLQuantizationType.F32)
    assert (why is None) == fits, why
