"""llama.cpp's graph, as the records of :mod:`graphir.llamacpp.reserve` give it, in graphir's IR.

Each ggml op becomes the catalogue's op of the same meaning (``ROPE`` -> ``rope``, a ``GLU`` of kind ``SWIGLU`` ->
``swiglu``, ...) with its op parameters decoded into the catalogue's attributes; an op the catalogue lacks keeps
ggml's name, lowercased, under ``ggml.`` with its raw parameters (``ggml.cpy``; also a ``ROPE`` that starts at an
offset into the head, ``ggml.rope``, which the catalogue's rope does not). Weights keep their GGUF names; inputs
are named by their role as graphir names them (``inp_pos`` -> ``pos``, ``cache_k_l3`` -> ``blk.3.cache_k``); other
names move their layer in front (``attn_norm-3`` -> ``blk.3.attn_norm``), ggml's own suffixes become dotted
(``Kcur-0 (view)`` -> ``blk.0.Kcur.view``), a name used again gets its op appended, and an unnamed node is named by
its op in the layer of its operands. Shapes are ggml's ``ne`` without trailing 1s (the recurrent scans' results as
the one run of elements the catalogue says they are), and the sizes are those llama.cpp reserved: the graph has no
open dimensions.
"""

from __future__ import annotations

import itertools
import math
import re
import struct
from typing import Any

from graphir.graph.ir import Graph, Node

_FLAG_INPUT, _FLAG_OUTPUT = 1, 2

# The names llama.cpp gives its graph inputs (llama-graph.cpp), by the role graphir gives the same input. A
# sliding-window cache's inputs have the other cache's names; they are told apart by creation (_second_inputs).
INPUT_ROLES = {"inp_tokens": "tokens", "inp_embd": "embd", "inp_pos": "pos", "out_ids": "out_ids",
               "attn_inp_k_idxs": "k_idxs", "attn_inp_v_idxs": "v_idxs", "attn_inp_kq_mask": "kq_mask",
               "self_kq_mask": "kq_mask", "rs_s_copy": "rs_src", "mean": "inp_mean", "cls": "inp_cls",
               "pos_bucket_dec": "pos_bucket", "pos_bucket_enc": "pos_bucket", "cross_embd": "cross_embd",
               "inp_attn_scale": "attn_scale", "attn_inp_k_rot": "k_rot"}
CACHE_ROLES = {"k": "cache_k", "v": "cache_v", "r": "rs_r", "s": "rs_s"}
# A layer's cache a model's graph names through its callback (renaming the buffer), by its role
RENAMED_CACHES = {"conv_states_all": "rs_r"}  # kimi-linear's rolling state
OUTPUT_ROLES = {"result_output": "logits", "result_norm": "embd", "result_embd": "embd", "final_norm_out": "embd",
                "result_embd_pooled": "pooled"}

_CACHE = re.compile(r"^cache_([kvrs])_l(\d+)((?: \(\w+\))*)$")
_SCOPED = re.compile(r"^(.+?)-(\d+)((?: \(\w+\))*)$")
_SUFFIX = re.compile(r" \((\w+)\)")

# ggml ops (by ggml_op_name, or ggml_op_desc for UNARY and GLU) that are the catalogue's op of this name.
_SAME = {"GET_ROWS": "get_rows", "MUL_MAT": "mul_mat", "MUL_MAT_ID": "mul_mat_id", "SUM_ROWS": "sum_rows",
         "MEAN": "mean", "SQRT": "sqrt",
         "ADD": "add", "SUB": "sub", "MUL": "mul", "DIV": "div", "SQR": "sqr", "SILU": "silu", "GELU": "gelu",
         "RELU": "relu", "NEG": "neg", "EXP": "exp", "TANH": "tanh", "SIGMOID": "sigmoid", "SOFTPLUS": "softplus",
         "XIELU": "xielu",
         "SWIGLU": "swiglu", "GEGLU": "geglu", "REGLU": "reglu", "ADD_ID": "add_id", "RESHAPE": "reshape",
         "PERMUTE": "permute",
         "TRANSPOSE": "transpose", "CONT": "cont", "CONCAT": "concat", "PAD": "pad", "REPEAT": "repeat", "SSM_CONV": "ssm_conv",
         "RWKV_WKV6": "rwkv_wkv6", "RWKV_WKV7": "rwkv_wkv7", "GATED_DELTA_NET": "gated_delta_net",
         "SET_ROWS": "set_rows", "VIEW": "view", "GATED_LINEAR_ATTN": "gated_linear_attn",
         "LIGHTNING_INDEXER": "lightning_indexer",
         "ROPE": "rope", "SOFT_MAX": "soft_max", "RMS_NORM": "rms_norm", "NORM": "norm", "L2_NORM": "l2_norm",
         "SCALE": "scale",
         "CLAMP": "clamp", "FILL": "fill", "SWIGLU_OAI": "swiglu_oai", "SWIGLU_CLAMP": "swiglu_clamp", "SSM_SCAN": "ssm_scan",
         "ARGSORT": "argsort_top_k", "TOP_K": "argsort_top_k"}
# Ops whose result the catalogue lists as one run of elements (outputs, then final states) where ggml gives it
# two dimensions: the same elements in the same order.
_FLAT = frozenset({"ssm_scan", "ssm_scan_heads", "gated_delta_net"})
_ROPE_MODES = {0: "norm", 2: "neox", 8: "mrope", 24: "vision", 40: "imrope"}
_ROPE_FLOATS = ("freq_base", "freq_scale", "ext_factor", "attn_factor", "beta_fast", "beta_slow")

# A record of the reserve child: [name, op, desc, type, ne, nb, op_params, sources, flags, view_offs, address]
Record = list[Any]


def _f32(bits: int) -> float:
    return struct.unpack("<f", struct.pack("<i", bits))[0]


def rope_attrs(p: list[int]) -> dict[str, Any]:
    """The catalogue's RoPE attributes in ggml's op parameters (a rope_multi's sections aside)."""
    attrs: dict[str, Any] = {"n_dims": p[1], "mode": _ROPE_MODES.get(p[2], str(p[2])), "n_ctx_orig": p[4]}
    attrs.update({k: _f32(v) for k, v in zip(_ROPE_FLOATS, p[5:11])})
    return attrs


def shape_of(ne: list[int]) -> tuple[int, ...]:
    """ggml's four sizes without the trailing 1s (a scalar keeps one)."""
    n = len(ne)
    while n > 1 and ne[n - 1] == 1:
        n -= 1
    return tuple(ne[:n])


def _op(r: Record, srcs: list[Node]) -> tuple[str, dict[str, Any]]:
    """The catalogue's op and attributes for one ggml node (``ggml.<op>`` with its raw parameters if none)."""
    name, op, desc, dtype, ne, nb, p = r[:7]
    if op == "CPY" and len(srcs) == 1 and {srcs[0].dtype, dtype} == {"f32", "i32"}:  # ggml_cast
        return "cast", {"type": dtype}
    kind = _SAME.get(desc if op in ("UNARY", "GLU") else op)
    if kind is None or op == "GLU" and len(srcs) != 2 or op == "ROPE" and p[15] \
            or op == "PAD" and (any(p[0:8:2]) or p[8]):
        n = len(p)
        while n and p[n - 1] == 0:
            n -= 1
        return f"ggml.{(desc if op in ('UNARY', 'GLU') else op).lower()}", {"params": tuple(p[:n])}
    if kind in ("rms_norm", "norm", "l2_norm"):
        return kind, {"eps": _f32(p[0])}
    if kind == "scale":  # ggml_scale_bias is a SCALE with a bias
        return ("scale_bias", {"s": _f32(p[0]), "b": _f32(p[1])}) if p[1] else (kind, {"s": _f32(p[0])})
    if kind == "gated_linear_attn":
        return kind, {"scale": _f32(p[0])}
    if kind == "soft_max":
        return kind, {"scale": _f32(p[0]), "max_bias": _f32(p[1])}
    if kind == "clamp":
        return kind, {"min": _f32(p[0]), "max": _f32(p[1])}
    if kind == "fill":
        return kind, {"c": _f32(p[0])}
    if kind == "swiglu_oai":
        return kind, {"alpha": _f32(p[2]), "limit": _f32(p[3])}
    if kind == "xielu":
        return kind, {k: _f32(v) for k, v in zip(("alpha_n", "alpha_p", "beta", "eps"), p[1:5])}
    if kind == "swiglu_clamp":
        return kind, {"limit": _f32(p[3])}
    if kind == "concat":
        return kind, {"dim": p[0]}
    if kind == "pad":  # ggml_pad_ext's (before, after) per dim, with nothing before: the catalogue's pad
        return kind, {"pad": tuple(p[1:8:2])}
    if kind == "argsort_top_k":
        return kind, {"k": ne[0]}
    if kind == "rope":
        if p[2] & 8:
            return "rope_multi", {**rope_attrs(p), "sections": tuple(p[11:15])}
        return kind, rope_attrs(p)
    if kind in ("reshape", "repeat"):
        return kind, {"shape": shape_of(ne)}
    if kind == "permute":
        return kind, {"axes": tuple(p[:4])}
    if kind == "view":
        elem = nb[0] or 1
        shape = shape_of(ne)
        return kind, {"shape": shape, "strides": tuple(s // elem for s in nb[:len(shape)]), "offset": r[9] // elem}
    if kind == "ssm_scan" and srcs[3].shape[0] == 1:  # A holds one decay per head: Mamba-2's scan
        return "ssm_scan_heads", {}
    return kind, {}


def _operands(kind: str, srcs: list[Node]) -> list[Node]:
    """ggml's sources in the catalogue's operand order (set_rows writes into its last source)."""
    if kind == "set_rows":
        return [srcs[2], srcs[0], srcs[1]] if len(srcs) == 3 else srcs
    return srcs


class _Names:
    """graphir's names for llama.cpp's, each used once."""

    def __init__(self) -> None:
        self.used: set[str] = set()
        self.weights: dict[str, Node] = {}  # llama.cpp loads a tied matrix twice under one name: one node

    def take(self, base: str, op: str) -> str:
        """``base``, else ``base.<op>``, else ``base.<op>1``, ``base.<op>2``, ...: the first one still free."""
        tail = op.removeprefix("ggml.")
        tries = itertools.chain((base, f"{base}.{tail}"), (f"{base}.{tail}{k}" for k in itertools.count(1)))
        name = next(t for t in tries if t not in self.used)
        self.used.add(name)
        return name


# the inputs of one KV cache, as llama.cpp names them (a sliding-window cache's are named alike)
_CACHE_INPUTS = ("attn_inp_k_idxs", "attn_inp_v_idxs", "attn_inp_kq_mask")


def _root(records: list[Record], i: int) -> int:
    """The record a tensor's rows come from: record i followed back through ops that only move rows."""
    while records[i][1] in _MOVES and records[i][7]:
        i = records[i][7][0]
    return i


def _second_inputs(records: list[Record], n_ctx: int) -> set[int]:
    """The addresses of the inputs (and caches) created second under a name already given (a sliding-window
    cache's inputs, or an indexer cache's inputs and per-layer caches beside a latent cache's), or, where the graph
    reads one cache only, its inputs when its mask spans fewer cells than the context (llama.cpp sizes only a
    window's cache below n_ctx: every attention layer slides, as in LFM2 with a window). An indexer's are the ones
    its graph feeds the indexer with (_indexer_side): the two caches sit in separately allocated buffers, whose
    addresses come in no fixed order."""
    by_name: dict[str, set[int]] = {}
    for r in records:
        if r[1] == "NONE" and (r[8] & _FLAG_INPUT or _CACHE.match(r[0])):
            by_name.setdefault(r[0], set()).add(r[10])
    indexer = _indexer_side(records)
    second = {a for addresses in by_name.values() if len(addresses) == 2
              for a in (addresses & indexer if indexer else sorted(addresses)[1:])}
    masks = [r for r in records if r[1] == "NONE" and r[8] & _FLAG_INPUT and r[0] == _CACHE_INPUTS[-1]]
    if len(masks) == 1 and masks[0][4][0] < n_ctx:
        second |= {a for name in _CACHE_INPUTS for a in by_name.get(name, ())}
    return second


def _indexer_side(records: list[Record]) -> set[int]:
    """The addresses of the leaves a sparse-attention indexer reads (its cache through views, its mask), with the
    row ids that write that cache (ggml's set_rows: sources values, row ids, destination): empty where the graph has
    no indexer."""
    caches = {_root(records, i) for r in records if r[1] == "LIGHTNING_INDEXER" for i in r[7]}
    ids = {r[7][1] for r in records if r[1] == "SET_ROWS" and len(r[7]) == 3 and _root(records, r[7][2]) in caches}
    return {records[i][10] for i in caches | ids if records[i][1] == "NONE"}


def _second_tail(records: list[Record]) -> str:
    """What the second cache's names end in: ``_lid`` for a sparse-attention indexer's, else ``_swa``."""
    return "_lid" if any(r[1] == "LIGHTNING_INDEXER" for r in records) else "_swa"


# ggml ops that move a tensor's rows without computing: what a recurrent state passes through between its cache
# and the op that reads it
_MOVES = frozenset({"RESHAPE", "VIEW", "PERMUTE", "TRANSPOSE", "CONT", "GET_ROWS"})


def _renamed_states(records: list[Record], weights: frozenset[str]) -> dict[int, tuple[str, str]]:
    """Recurrent states whose cache lost its ``cache_r_l``/``cache_s_l`` name (a builder's cb() renames the cache
    tensor itself, as PLaMo 2's does), by what they are, at their record's index: (layer, role). A state is a leaf
    that is neither a weight nor a graph input, whose rows are picked by the recurrent memory's row ids
    (``rs_s_copy``); its rows roll (``rs_r``: a convolution's last inputs) when they are joined to the ubatch's
    new columns (a ``CONCAT``), else it is the scan's state (``rs_s``). Its layer is the one cb() named it in."""
    users: dict[int, list[int]] = {}
    for j, r in enumerate(records):
        for i in r[7]:
            users.setdefault(i, []).append(j)

    ids = {i for i, r in enumerate(records) if r[1] == "NONE" and r[8] & _FLAG_INPUT and r[0] == "rs_s_copy"}
    out: dict[int, tuple[str, str]] = {}
    for i, r in enumerate(records):
        scoped = _SCOPED.match(r[0])
        if r[1] != "NONE" or r[8] & _FLAG_INPUT or r[0] in weights or _CACHE.match(r[0]) or not scoped:
            continue
        reached, todo = set(), [i]
        while todo:
            for j in users.get(todo.pop(), []):
                if j not in reached:
                    reached.add(j)
                    if records[j][1] in _MOVES and records[j][7][0] in reached | {i}:
                        todo.append(j)
        if any(_root(records, k) in ids for j in reached for k in records[j][7]):
            joined = any(records[j][1] == "CONCAT" for j in reached)
            out[i] = (scoped.group(2), CACHE_ROLES["r" if joined else "s"])
    return out


def _leaf(r: Record, weights: frozenset[str], names: _Names, second: set[int], tail: str,
          state: tuple[str, str] | None = None) -> Node:
    name, dtype, shape = r[0], r[3], shape_of(r[4])
    m = _CACHE.match(name)
    if m and not m.group(3):
        role = CACHE_ROLES[m.group(1)] + (tail if r[10] in second else "")
        return Node(names.take(f"blk.{m.group(2)}.{role}", "input"), "input", (), {"role": role}, dtype, shape)
    m = _SCOPED.match(name)
    if m and m.group(1) in RENAMED_CACHES and not m.group(3):
        state = m.group(2), RENAMED_CACHES[m.group(1)]
    if state is not None:
        layer, role = state
        return Node(names.take(f"blk.{layer}.{role}", "input"), "input", (), {"role": role}, dtype, shape)
    if name in weights:
        names.used.add(name)
        return names.weights.setdefault(name, Node(name, "weight", (), {"tensor": name}, dtype, shape))
    role = INPUT_ROLES.get(name, name) + (tail if r[10] in second else "")
    return Node(names.take(role, "input"), "input", (), {"role": role}, dtype, shape)


def _base_name(name: str, op: str, srcs: list[Node]) -> str:
    """A node's graphir name before de-duplication."""
    m = _CACHE.match(name) or _SCOPED.match(name)
    if m:
        stem = CACHE_ROLES[m.group(1)] if m.re is _CACHE else m.group(1)
        return f"blk.{m.group(2)}.{stem}" + "".join("." + s for s in _SUFFIX.findall(m.group(3)))
    if not name or re.fullmatch(r"(node|leaf)_\d+", name):  # ggml's names for the unnamed
        layers = [x.layer for x in srcs if x.layer is not None]
        kind = op.removeprefix("ggml.")
        return f"blk.{max(layers)}.{kind}" if layers else kind
    plain = _SUFFIX.sub(lambda s: "." + s.group(1), name)
    return re.sub(r"\s+", "_", plain)


def to_graph(records: list[Record], weights: frozenset[str], meta: dict[str, Any], n_ctx: int) -> Graph:
    """The graph of one reserve's records in a context of ``n_ctx`` cells; ``weights`` are the GGUF's tensor
    names."""
    names = _Names()
    of_record: list[Node] = []  # the node of each record (a tied matrix's two records share one)
    nodes: list[Node] = []
    emitted: set[int] = set()
    outputs: dict[str, Node] = {}
    second, tail = _second_inputs(records, n_ctx), _second_tail(records)
    states = _renamed_states(records, weights)
    tokens: Node | None = None
    for index, r in enumerate(records):
        srcs = [of_record[i] for i in r[7]]
        if r[1] == "NONE" and tokens is not None and _more_tokens(r, tokens):
            node = tokens
        elif r[1] == "NONE":
            node = _leaf(r, weights, names, second, tail, states.get(index))
            tokens = node if node.op == "input" and node.attrs["role"] == "tokens" else tokens
        else:
            kind, attrs = _op(r, srcs)
            operands = _operands(kind, srcs)
            shape = shape_of(r[4])
            if kind in _FLAT:
                shape = (math.prod(shape),)
            node = Node(names.take(_base_name(r[0], kind, operands), kind), kind, tuple(operands), attrs, r[3],
                        shape)
            if r[8] & _FLAG_OUTPUT and r[0] in OUTPUT_ROLES:  # others are kept for llama.cpp's own readers
                outputs[OUTPUT_ROLES[r[0]]] = node
        if id(node) not in emitted:
            emitted.add(id(node))
            nodes.append(node)
        of_record.append(node)
    _name_cross_mask(nodes)
    _name_encoder_swa_mask(nodes)
    return Graph(meta, (), nodes, outputs or _unnamed_outputs(records, of_record))


def _more_tokens(r: Record, tokens: Node) -> bool:
    """Whether a leaf is another input of the ubatch's tokens: llama.cpp fills every token tensor of its
    ``llm_graph_input_embd`` with them, and leaves one made after ``inp_tokens`` unnamed (Gemma 3n's
    per-layer embeddings read their rows with it), an i32 input of the token input's shape."""
    return bool(r[8] & _FLAG_INPUT) and re.fullmatch(r"leaf_\d+", r[0]) is not None and r[3] == "i32" \
        and shape_of(r[4]) == tokens.shape


def _unnamed_outputs(records: list[Record], of_record: list[Node]) -> dict[str, Node]:
    """The outputs of a graph whose builder names neither (PLaMo 3's): llama.cpp expands the graph from its logits,
    so they are the last output-flagged product, and the final embedding the output-flagged tensor it multiplies."""
    flagged = [i for i, r in enumerate(records) if r[8] & _FLAG_OUTPUT and r[1] != "NONE"]
    if not flagged or records[flagged[-1]][1] != "MUL_MAT":
        return {}
    logits = flagged[-1]
    embd = [i for i in records[logits][7] if i in flagged]
    return {"logits": of_record[logits], **({"embd": of_record[embd[0]]} if embd else {})}


def _unnamed_masks(nodes: list[Node]) -> list[Node]:
    """The inputs softmaxes use as their masks that llama.cpp left unnamed, in order of use."""
    masks = [n.inputs[1] for n in nodes if n.op == "soft_max" and len(n.inputs) > 1]
    return list(dict.fromkeys(m for m in masks if m.op == "input" and m.name.startswith("leaf_")))


def _name_encoder_swa_mask(nodes: list[Node]) -> None:
    """llama.cpp leaves the sliding-window mask of attention without a cache unnamed (build_attn_inp_no_cache): it
    is the unnamed input a softmax uses as its mask where no cache is read (EmbeddingGemma's local layers)."""
    if any(n.op == "input" and n.attrs.get("role") in CACHE_ROLES.values() for n in nodes):
        return
    for mask in _unnamed_masks(nodes):
        mask.name, mask.attrs = "kq_mask_swa", {"role": "kq_mask_swa"}


def _name_cross_mask(nodes: list[Node]) -> None:
    """llama.cpp leaves the mask of attention over an encoder's output unnamed: it is the input a softmax uses
    as its mask beside the encoder's output (``cross_embd``)."""
    masks = _unnamed_masks(nodes)
    if masks and any(n.op == "input" and n.name == "cross_embd" for n in nodes):
        masks[0].name, masks[0].attrs = "cross_mask", {"role": "cross_mask"}
