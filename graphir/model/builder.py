"""The graph-building interface architectures call, after llama.cpp's ``llm_graph_context``.

An architecture asks for inputs, weights and blocks (``build_norm``, ``build_ffn``, ``build_attn``, ...);
the builder records typed, named nodes and never touches weight data. What attention meets is decided by the
context's memory: the builder asks it for each layer's inputs (K/V views and a mask, position buckets, the
encoder output, recurrent state buffers; :mod:`graphir.memory.inputs`) and does the maths over them, as
llama.cpp's ``build_attn_inp_*`` and ``build_attn`` split it. An architecture never names a cache kind.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from enum import Enum
from typing import Any, Iterator, Mapping, Protocol

from gguf import MODEL_TENSOR

from graphir.graph.dims import Dim, DimDecl, Sym
from graphir.errors import GraphError, TensorError
from graphir.graph.floats import f32, inv_sqrt
from graphir.model.hparams import HParams
from graphir.graph.emit import Emitter
from graphir.graph.ir import Graph, Node
from graphir.graph.ops import OPS, ShapeError, infer
from graphir.memory.inputs import (CrossMask, CrossRows, IndexerInputs, IndexerRotation, IndexerRows, LatentRows,
                                   PosBuckets, R, RecurrentState, Request, SelfAttention)
from graphir.model.temperature import ROLE as TEMPERATURE
from graphir.model.temperature import Temperature
from graphir.model.tensors import TensorDecl, TensorSpec, dtype_name, same_shape, tensor_name

PHASES = ("prefill", "decode", "encode")  # encode: the encoder of an encoder-decoder, one whole batch


class Norm(Enum):
    RMS = "rms_norm"
    LAYER = "norm"


class Act(Enum):
    SILU = "silu"
    GELU = "gelu"
    GELU_QUICK = "gelu_quick"  # x * sigmoid(1.702 x): a vision tower's FFN where its file names no activation
    GELU_ERF = "gelu_erf"  # x (1 + erf(x / sqrt 2)) / 2: Whisper's encoder (llama.cpp's FFN_GELU_ERF)
    RELU = "relu"
    RELU_SQR = "relu_sqr"  # relu, then squared (llama.cpp's LLM_FFN_RELU_SQR)
    SWIGLU_OAI = "swiglu_oai"  # gated only: gpt-oss's clamped SwiGLU (llama.cpp's LLM_FFN_SWIGLU_OAI_MOE)


class Gate(Enum):
    PAR = "par"  # gate and up both read x (classic gated MLP)
    SEQ = "seq"  # gate reads up's output


_GLU = {Act.SILU: "swiglu", Act.GELU: "geglu", Act.RELU: "reglu"}


class Gating(Enum):
    """How a router's logits become expert weights (llama.cpp's ``expert_gating_func``)."""
    SOFTMAX = "softmax"  # probabilities over every expert; the top k keep theirs
    SIGMOID = "sigmoid"  # an independent probability per expert
    SOFTMAX_WEIGHT = "softmax_weight"  # the top k logits, then a softmax over those k


class Select(Enum):
    """What a router ranks its experts by when it chooses a token's best ones (llama.cpp's build_moe_ffn)."""
    PROBS = "probs"  # the gating's probabilities (plus a selection bias where there is one)
    LOGITS = "logits"  # the router's logits (Llama 4, whose gating applies after the choice)
    SIGMOID = "sigmoid"  # the logits' sigmoid, whatever the gating (GroveMoE)


MOE_WEIGHT_SUM_MIN = 6.103515625e-05  # the normalising sum is clamped here (the smallest normal f16), as llama.cpp
SWIGLU_LIMIT_MIN = 1e-6  # a swiglu_clamp_exp at most this leaves the SwiGLU unclamped, as llama.cpp
SWIGLU_OAI_ALPHA, SWIGLU_OAI_LIMIT = f32(1.702), 7.0  # llama.cpp's fixed constants of gpt-oss's clamped SwiGLU


def yarn_attn_factor(freq_scale: float, attn_factor: float, log_mul: float = 0.0) -> float:
    """The attn_factor llama.cpp gives a YaRN rope (its context's yarn_attn_factor): YaRN's magnitude
    0.1 ln(s) + 1 for s = 1 / freq_scale (over 0.1 log_mul ln(s) + 1, the magnitude of all dimensions, where the
    file gives ``rope.scaling.yarn_log_multiplier`` as it is read raw), divided by the same (ggml's rope
    multiplies it in itself), times rope.scaling.attn_factor; in float32 steps, as llama.cpp computes it (1.0 for
    s = 32)."""
    s = f32(1.0 / freq_scale)
    grow = f32(f32(0.1) * f32(math.log(s))) if s > 0 else 0.0
    mscale = f32(grow + 1.0) if s > 1.0 else 1.0
    if log_mul and s > 1.0:
        mscale = f32(mscale / f32(f32(f32(f32(0.1) * log_mul) * f32(math.log(s))) + 1.0))
    return f32(f32(mscale * f32(1.0 / f32(1.0 + grow))) * attn_factor)


class ArchView(Protocol):
    """What the builder reads of an architecture (graphir.model.architecture.Architecture has it): the builder
    sits below the architectures, which call it, so it names no architecture class."""

    name: str
    hp: HParams
    specs: Mapping[str, TensorSpec]
    rope_mode: str
    rank_softmax: bool
    rank_pooling: str
    classifier_act: str


class MemoryView(Protocol):
    """What the builder asks of the context's memory (graphir.memory.Memory implements it): how ubatches are
    sized, and each layer's inputs for each of its needs (by layer index), which it declares through the
    builder as an :class:`~graphir.graph.emit.Emitter` and returns as data."""

    split: str

    def ubatch_dims(self) -> tuple[Dim, Dim | None, list[DimDecl]]: ...

    def dims(self) -> list[DimDecl]: ...

    def input_for(self, e: Emitter, il: int, request: Request[R]) -> R: ...


class GraphBuilder:
    """Records the graph of one (model, context, phase). ``n_tokens``/``n_outputs`` are the ubatch sizes."""

    def __init__(self, arch: ArchView, label: str, tensors: Mapping[str, TensorDecl], memory: MemoryView,
                 phase: str, n_ctx_seq: int = 0, rows: bool = False):
        self.arch, self.hp, self.label, self.tensors, self.memory = arch, arch.hp, label, tensors, memory
        self.phase = phase
        self.rows = rows  # the ubatch carries embedding rows in place of token ids (llama.cpp's ubatch.embd)
        self._token_table: Node | None = None  # the token embedding the rows stand in for
        self.n_ctx_seq = n_ctx_seq  # cells per sequence of the context (0: unspecified); see Architecture.variant
        self.nodes: list[Node] = []
        self.outputs: dict[str, Node] = {}
        self._names: dict[str, Node] = {}
        self._pos_bias: dict[str, Node] = {}  # per relative-bias table: the bias of every score (one per graph)
        self._scope = ""
        self.il: int | None = None  # the layer being built (inside ``with b.layer(il)``)
        self.n_layer = arch.hp.n_layer  # the layers of the stack being built (see :meth:`layers`)
        # n_seq_tokens is set when the memory splits ubatches equally (n_tokens = n_seq_tokens * n_seqs).
        self.n_seq_tokens: Dim | None
        if phase == "decode":
            self.n_tokens: Dim = 1
            self.n_outputs: Dim = 1
            self.n_seqs: Dim = 1
            self.n_seq_tokens = 1 if memory.split != "simple" else None
            self.dims: list[DimDecl] = []
        else:
            self.n_tokens, self.n_seq_tokens, self.dims = memory.ubatch_dims()
            self.n_outputs = Sym.named("n_outputs")
            self.n_seqs = Sym.named("n_seqs")
            self.dims.append(DimDecl("n_outputs", 1, self.n_tokens, "tokens whose output is requested"))
            if all(d.name != "n_seqs" for d in self.dims):
                self.dims.append(DimDecl("n_seqs", 1, self.n_tokens, "sequences in the ubatch"))
        self.dims += memory.dims()

    # ---- nodes -------------------------------------------------------------------------------------------

    def _fresh(self, tag: str) -> str:
        name = self._scope + tag
        if name in self._names:
            i = 1
            while f"{name}.{i}" in self._names:
                i += 1
            name = f"{name}.{i}"
        return name

    def _add(self, node: Node) -> Node:
        self.nodes.append(node)
        self._names[node.name] = node
        return node

    def op(self, op: str, *inputs: Node, name: str | None = None, **attrs: Any) -> Node:
        """Append one node; attributes are taken in the catalogue's order and the type is inferred."""
        d = OPS.get(op)
        if d is None:
            raise GraphError(f"unknown op {op!r} (for node {self._scope}{name or op}): not in graphir.graph.ops.OPS")
        try:
            ordered = {k: attrs[k] for k in d.attrs}
        except KeyError as e:
            raise GraphError(f"{op} needs attribute {e.args[0]!r}") from None
        node_name = self._fresh(name or op)
        try:
            dtype, shape = infer(op, list(inputs), ordered)
        except ShapeError as e:
            raise GraphError(f"node {node_name} ({op}): {e}") from None
        return self._add(Node(node_name, op, inputs, ordered, dtype, shape))

    @contextmanager
    def layer(self, il: int) -> Iterator[None]:
        """Scope node names to ``blk.<il>.`` so a change inside one layer renames nothing outside it."""
        outer, self._scope, outer_il, self.il = self._scope, f"blk.{il}.", self.il, il
        try:
            yield
        finally:
            self._scope, self.il = outer, outer_il

    def layers(self, n_layer: int | None = None) -> Iterator[int]:
        """Every layer index in turn, each inside its scope (:meth:`layer`): a family's layer loop. The rows
        whose output is requested are declared first, as every graph lists them before its layers.
        ``n_layer``: the stack's layer count where it is not the model's (an encoder-decoder's decoder)."""
        self.build_inp_out_ids()
        self.n_layer = self.hp.n_layer if n_layer is None else n_layer
        for il in range(self.n_layer):
            with self.layer(il):
                yield il

    def last_layer_rows(self, *values: tuple[Node, str]) -> tuple[Node, ...]:
        """In the last layer only the rows whose output is requested go on (llama.cpp's ``inp_out_ids``): each
        value's rows there, named by its tag; in every other layer the values as they are."""
        if self.il != self.n_layer - 1:
            return tuple(v for v, _ in values)
        out_ids = self.build_inp_out_ids()
        return tuple(self.op("get_rows", v, out_ids, name=tag) for v, tag in values)

    def input(self, role: str, dtype: str, shape: tuple[Dim, ...], scoped: bool = False, **facts: Any) -> Node:
        """A runtime-fed tensor, declared once per name; ``scoped`` inputs belong to the current layer."""
        name = (self._scope if scoped else "") + role
        if name in self._names:
            return self._names[name]
        return self._add(Node(name, "input", (), {"role": role, **facts}, dtype, shape))

    def w(self, t: MODEL_TENSOR, il: int | None = None, suffix: str = "weight") -> Node:
        """A weight the graph cannot do without (or the one it is tied to); an optional one is read with
        :meth:`w_opt`, so that a family says which of its weights a file may lack."""
        name = tensor_name(t, il, suffix)
        node = self.weight(name)
        if node is None:
            raise GraphError(f"{self.arch.name} reads the optional tensor '{name}' as required: use w_opt")
        return node

    def w_opt(self, t: MODEL_TENSOR, il: int | None = None, suffix: str = "weight") -> Node | None:
        """A weight the file may lack (None then): optional in the family's table, or in some of its variants."""
        return self.weight(tensor_name(t, il, suffix))

    def norm(self, x: Node, t: MODEL_TENSOR, il: int | None = None, kind: Norm = Norm.RMS, *, name: str) -> Node:
        """x normalised with tensor ``t``'s weight and, where the family declares one and the file has it, its bias."""
        bias = tensor_name(t, il, "bias")
        return self.build_norm(x, self.w(t, il), self.weight(bias) if bias in self.arch.specs else None, kind,
                               name=name)

    def made(self, name: str) -> Node | None:
        """A node already made, by its full name (a layer reusing what an earlier one computed)."""
        return self._names.get(name)

    def weight(self, name: str) -> Node | None:
        if name in self._names:
            return self._names[name]
        spec = self.arch.specs.get(name)
        if spec is None:
            raise GraphError(f"{self.arch.name} uses tensor '{name}' without declaring it")
        decl = self.tensors.get(name)
        if decl is None:
            if spec.tied_to:
                return self.weight(spec.tied_to)
            if spec.optional:
                return None
            raise TensorError(f"{self.label}: missing tensor '{name}'")
        why = spec.problem(tuple(decl.shape), decl.dtype)
        if why:
            raise TensorError(f"{self.label}: tensor '{name}' {why}")
        # the family's shape (its other one where the file has that): a file may leave out trailing dimensions of 1
        # (problem() compared them as equal)
        shape = spec.also if spec.also and same_shape(tuple(decl.shape), spec.also) else spec.shape
        return self._add(Node(name, "weight", (), {"tensor": name}, dtype_name(decl.dtype), shape))

    # ---- small op helpers (names are tags inside the current scope) -------------------------------------

    def mm(self, w: Node, x: Node, s: Node | None = None, *, name: str) -> Node:
        """w @ x, times w's per-tensor scale ``s`` when the file has one (llama.cpp's ``build_lora_mm``)."""
        y = self.op("mul_mat", w, x, name=name)
        return y if s is None else self.op("mul", y, s, name=f"{name}.s")

    def linear(self, x: Node, w: Node, b: Node | None = None, *, name: str, s: Node | None = None) -> Node:
        """x through w (times its scale ``s``, :meth:`mm`), plus the bias b."""
        y = self.mm(w, x, s, name=name)
        return self.op("add", y, b, name=f"{name}.b") if b is not None else y

    def scale(self, t: MODEL_TENSOR, il: int | None = None) -> Node | None:
        """The per-tensor scale of tensor ``t`` (graphir.model.scales), where the family declares one and the file
        has it."""
        name = tensor_name(t, il, "scale")
        return self.weight(name) if name in self.arch.specs else None

    def reshape(self, x: Node, shape: tuple[Dim, ...], *, name: str) -> Node:
        return self.op("reshape", x, shape=shape, name=name)

    # ---- inputs ------------------------------------------------------------------------------------------

    def build_inp_embd(self, tok_embd: Node) -> Node:
        """The ubatch's input embeddings: its tokens' rows of ``tok_embd``, or the rows it carries (``embd``,
        n_embd_inp wide: a deepstack model's rows hold its early layers' additions after the first n_embd), as
        llama.cpp's build_inp_embd selects one of its two inputs by the ubatch's contents. A token ubatch of a
        model taking wider rows pads its token rows with zeros to that width (the later columns read as 0)."""
        E, E_inp = self.hp.n_embd, self.arch.n_embd_inp
        if self.rows:
            self._token_table = tok_embd
            x = self.input("embd", "f32", (E_inp, self.n_tokens))
        else:
            tokens = self.input("tokens", "i32", (self.n_tokens,))
            x = self.op("get_rows", tok_embd, tokens, name="inp_embd")
            if E_inp != E:
                x = self.op("pad", x, pad=(E_inp - E, 0, 0, 0), name="inp_embd.pad")
        self.input_embeddings = x  # all n_embd_inp columns: a deepstack model's layers add their slices
        if E_inp != E:
            x = self.op("view", x, shape=(E, self.n_tokens), strides=(1, E_inp), offset=0, name="inp_embd.text")
        return x

    def build_inp_pos(self) -> Node:
        """The ubatch's positions: one a token, or the several its RoPE mode turns by (M-RoPE's four,
        section-major), as llama.cpp's inp_pos."""
        return self.input("pos", "i32", (self.arch.positions_per_token * self.n_tokens,))

    def build_inp_attn_scale(self, rule: Temperature) -> Node:
        """Each token's attention temperature [1, 1, n_tokens], which the context fills by ``rule`` from its
        position (llama.cpp's inp_attn_scale)."""
        return self.input(TEMPERATURE, "f32", (1, 1, self.n_tokens), **rule.facts())

    def build_inp_out_ids(self) -> Node:
        """Rows whose output is wanted; always present so the topology does not depend on n_outputs."""
        return self.input("out_ids", "i32", (self.n_outputs,))

    # ---- blocks ------------------------------------------------------------------------------------------

    def build_norm(self, x: Node, w: Node | None, b: Node | None = None, kind: Norm = Norm.RMS, *,
                   name: str) -> Node:
        eps = self.hp.norm_rms_eps if kind is Norm.RMS else self.hp.norm_eps
        y = self.op(kind.value, x, eps=eps, name=f"{name}.{kind.value}" if w or b else name)
        if w is not None:
            y = self.op("mul", y, w, name=name if b is None else f"{name}.w")
        if b is not None:
            y = self.op("add", y, b, name=name)
        return y

    def build_ffn(self, x: Node, *, up: Node, gate: Node | None, down: Node, up_b: Node | None = None,
                  gate_b: Node | None = None, down_b: Node | None = None, act: Act = Act.SILU,
                  gate_mode: Gate = Gate.PAR, name: str = "ffn_out", up_s: Node | None = None,
                  gate_s: Node | None = None, down_s: Node | None = None, act_scales: Node | None = None,
                  swiglu_limit: float = 0.0, clamp_apart: bool = False) -> Node:
        """The FFN of x; each matrix's per-tensor scale ``*_s`` multiplies its output after its bias (as
        llama.cpp's ``build_ffn``); ``act_scales``: a GELU's output divided by them (AWQ's ScaleActivation, MPT);
        ``swiglu_limit``, ``clamp_apart``: a SwiGLU clamped at that limit (:meth:`_swiglu_limited`)."""
        t = self._scaled(self.linear(x, up, up_b, name="ffn_up"), up_s, name="ffn_up_s")
        if gate is not None:
            g = self._scaled(self.linear(t if gate_mode is Gate.SEQ else x, gate, gate_b, name="ffn_gate"), gate_s,
                             name="ffn_gate_s")
            if gate_mode is Gate.PAR and act is Act.SILU and swiglu_limit > SWIGLU_LIMIT_MIN:
                h = self._swiglu_limited(g, t, swiglu_limit, clamp_apart, prefix="ffn")
            elif gate_mode is Gate.PAR and act in _GLU:
                h = self.op(_GLU[act], g, t, name=f"ffn_{_GLU[act]}")
            else:
                h = self._activation(g, act, act_scales)
                if gate_mode is Gate.PAR:
                    h = self.op("mul", h, t, name="ffn_gate_par")
        else:
            h = self._activation(t, act, act_scales)
        return self._scaled(self.linear(h, down, down_b, name=name), down_s, name=f"{name}_s")

    def build_ffn_fused_swiglu(self, x: Node, il: int, up: MODEL_TENSOR = MODEL_TENSOR.FFN_UP,
                               down: MODEL_TENSOR = MODEL_TENSOR.FFN_DOWN, name: str = "ffn_out", act: Act = Act.SILU,
                               up_b: Node | None = None, down_b: Node | None = None) -> Node:
        """Layer il's SwiGLU over the two halves of one projection up = [gate; up]: silu(gate rows) * up rows
        (llama.cpp's ``ggml_swiglu`` of a single tensor: Phi-3, ChatGLM, Granite's fused shared expert), then down;
        ``act`` GELU: the same with ``ggml_geglu`` (jina-bert-v2), each projection with its bias where given."""
        gu = self.linear(x, self.w(up, il), up_b, name="ffn_up")
        F, n = gu.shape[0] // 2, gu.shape[1]
        gate, rest = (self.op("view", gu, shape=(F, n), strides=(1, 2 * F), offset=off, name=tag)
                      for tag, off in (("ffn_gate", 0), ("ffn_up.half", F)))
        return self.linear(self.op(_GLU[act], gate, rest, name=f"ffn_{_GLU[act]}"), self.w(down, il), down_b, name=name)

    def _swiglu_limited(self, gate: Node, up: Node, limit: float, apart: bool, *, prefix: str) -> Node:
        """silu(gate) * up clamped at ``limit`` (a layer's ``swiglu_clamp_exp`` or ``_shexp``): ggml's swiglu_clamp
        (gate capped at the limit, up clamped to it), or, ``apart``, as separate ops: up clamped to [-limit, limit]
        and silu(gate) capped at the limit before their product (llama.cpp's form where its fused op is not used)."""
        if not apart:
            return self.op("swiglu_clamp", gate, up, limit=limit, name=f"{prefix}_swiglu_limited")
        up = self.op("clamp", up, min=-limit, max=limit, name=f"{prefix}_up_clamped")
        act = self.op("silu", gate, name=f"{prefix}_silu")
        act = self.op("clamp", act, min=float("-inf"), max=limit, name=f"{prefix}_silu_clamped")
        return self.op("mul", act, up, name=f"{prefix}_swiglu_limited")

    def _activation(self, x: Node, act: Act, act_scales: Node | None = None) -> Node:
        if act is Act.RELU_SQR:
            return self.op("sqr", self.op("relu", x, name="ffn_relu"), name="ffn_sqr(relu)")
        y = self.op(act.value, x, name=f"ffn_{act.value}")
        return self.op("div", y, act_scales, name="ffn_act") if act_scales is not None and act is Act.GELU else y

    def _scaled(self, y: Node, s: Node | None, *, name: str) -> Node:
        return y if s is None else self.op("mul", y, s, name=name)

    def build_moe_ffn(self, x: Node, *, gate_inp: Node | None, up_exps: Node | None, gate_exps: Node | None,
                      down_exps: Node,
                      n_expert: int, n_expert_used: int, gating: Gating = Gating.SOFTMAX, norm_w: bool = False,
                      w_scale: float = 0.0, probs_b: Node | None = None, act: Act = Act.SILU,
                      gate_inp_b: Node | None = None, up_exps_b: Node | None = None, gate_exps_b: Node | None = None,
                      down_exps_b: Node | None = None, up_exps_s: Node | None = None,
                      gate_exps_s: Node | None = None, down_exps_s: Node | None = None, n_groups: int = 0,
                      n_group_used: int = 0, gate_up_exps: Node | None = None, weight_before: bool = False,
                      select: Select = Select.PROBS, logits: Node | None = None, swiglu_limit: float = 0.0,
                      group_experts: int = 0, clamp_apart: bool = False, name: str = "ffn_moe_out") -> Node:
        """A mixture of experts over x [n_embd, T] (llama.cpp's ``build_moe_ffn``): the router ``gate_inp``
        scores the experts, each token takes the ``n_expert_used`` best (by probability, plus ``probs_b`` for
        choosing only), runs the FFN of each through ``mul_mat_id`` (stacked ``*_exps`` [n_embd, n_ff,
        n_expert]) and sums their outputs weighted by its probabilities, normalised to sum 1 (``norm_w``) and
        scaled by ``w_scale`` (0 or 1: not scaled). ``gate_inp_b`` biases the router's logits; ``*_exps_b``
        [n_ff or n_embd, n_expert] add to each expert's product the bias of that expert (``add_id``, gpt-oss);
        ``*_exps_s`` [n_expert] multiply it by that expert's scale first (llama.cpp's per-expert ``.scale``; the
        joined stack's is ``up_exps_s``, as there).
        ``n_groups`` > 1: the experts form that many groups and a token chooses among the ``n_group_used`` best
        groups only (:meth:`_moe_best_groups`, DeepSeek-V3). ``gate_up_exps`` [n_embd, 2 n_ff, n_expert]: the gate
        and up stacks as one, each expert's gate rows before its up rows (in place of ``gate_exps``/``up_exps``).
        ``weight_before``: each token's input is weighted per chosen expert before that expert's FFN, not its
        output after (Llama 4). ``select``: what the experts are chosen by (:class:`Select`). ``logits``: the
        router's logits computed elsewhere (SmallThinker routes from the layer's input; GroveMoE shares them between
        two mixtures), in place of ``gate_inp``'s product. ``group_experts`` > 0: the chosen ids among the logits'
        experts are divided by it (through f32, truncated, as ggml's casts) into ids of this mixture's ``n_expert``
        experts, one per group (GroveMoE's adjugate experts), their weights the chosen groups' first experts'.
        ``swiglu_limit``: a SwiGLU's gate capped and its up clamped at that limit (ggml's swiglu_clamp, the layer's
        ``swiglu_clamp_exp``; at most 1e-6: not clamped), as separate ops where ``clamp_apart``
        (:meth:`_swiglu_limited`)."""
        n_embd, n_tok = x.shape
        if logits is None:
            logits = self.op("mul_mat", gate_inp, x, name="ffn_moe_logits")  # type: ignore[arg-type]
        if gate_inp_b is not None:
            logits = self.op("add", logits, gate_inp_b, name="ffn_moe_logits_biased")
        if gating is Gating.SOFTMAX:
            probs = self.op("soft_max", logits, scale=1.0, max_bias=0.0, name="ffn_moe_probs")
        elif gating is Gating.SIGMOID:
            probs = self.op("sigmoid", logits, name="ffn_moe_probs")
        else:
            probs = logits
        choice = probs if probs_b is None else self.op("add", probs, probs_b, name="ffn_moe_probs_biased")
        if select is Select.LOGITS:
            choice = logits
        elif select is Select.SIGMOID:
            choice = self.op("sigmoid", logits, name="ffn_moe_probs_biased")
        if n_groups > 1:
            choice = self._moe_best_groups(choice, n_expert, n_groups, n_group_used)
        selected = self.op("argsort_top_k", choice, k=n_expert_used, name="ffn_moe_topk")
        if group_experts:
            ids = self.op("cast", selected, type="f32", name="ffn_moe_topk.f32")
            ids = self.op("scale", ids, s=f32(1.0 / group_experts), name="ffn_moe_topk.groups")
            selected = self.op("cast", ids, type="i32", name="ffn_moe_topk.group_ids")
        weights = self.op("get_rows", self.reshape(probs, (1, probs.shape[0], n_tok), name="ffn_moe_probs.3d"),
                          selected, name="ffn_moe_weights")
        if gating is Gating.SOFTMAX_WEIGHT:
            w = self.reshape(weights, (n_expert_used, n_tok), name="ffn_moe_weights.2d")
            weights = self.reshape(self.op("soft_max", w, scale=1.0, max_bias=0.0, name="ffn_moe_weights_softmax"),
                                   (1, n_expert_used, n_tok), name="ffn_moe_weights_softmax.3d")
        if norm_w:
            w = self.reshape(weights, (n_expert_used, n_tok), name="ffn_moe_weights.rows")
            total = self.op("clamp", self.op("sum_rows", w, name="ffn_moe_weights_sum"), min=MOE_WEIGHT_SUM_MIN,
                            max=float("inf"), name="ffn_moe_weights_sum_clamped")
            weights = self.reshape(self.op("div", w, total, name="ffn_moe_weights_norm"), (1, n_expert_used, n_tok),
                                   name="ffn_moe_weights_norm.3d")
        if w_scale not in (0.0, 1.0):
            weights = self.op("scale", weights, s=w_scale, name="ffn_moe_weights_scaled")
        cur = self.reshape(x, (n_embd, 1, n_tok), name="ffn_moe_in")
        if weight_before:
            cur = self.op("mul", self.op("repeat", cur, shape=(n_embd, n_expert_used, n_tok), name="ffn_moe_in.repeat"),
                          weights, name="ffn_moe_weighted")
        gate: Node | None
        if gate_up_exps is not None:
            both = self._expert_mm(gate_up_exps, None, up_exps_s, cur, selected, name="ffn_moe_gate_up")
            rows = both.shape[0]
            gate, up = (self.op("view", both, shape=(rows // 2, n_expert_used, n_tok),
                                strides=(1, rows, rows * n_expert_used), offset=offset, name=tag)
                        for offset, tag in ((0, "ffn_moe_gate"), (rows // 2, "ffn_moe_up")))
        else:
            up = self._expert_mm(up_exps, up_exps_b, up_exps_s, cur, selected, name="ffn_moe_up")  # type: ignore[arg-type]
            gate = None if gate_exps is None else self._expert_mm(gate_exps, gate_exps_b, gate_exps_s, cur,
                                                                  selected, name="ffn_moe_gate")
        if gate is not None:
            if act is Act.SILU and swiglu_limit > SWIGLU_LIMIT_MIN:
                h = self._swiglu_limited(gate, up, swiglu_limit, clamp_apart, prefix="ffn_moe")
            elif act is Act.SWIGLU_OAI:
                h = self.op("swiglu_oai", gate, up, alpha=SWIGLU_OAI_ALPHA, limit=SWIGLU_OAI_LIMIT,
                            name="ffn_moe_swiglu_oai")
            else:
                h = self.op(_GLU[act], gate, up, name=f"ffn_moe_{_GLU[act]}")
        elif act is Act.RELU_SQR:  # ungated experts' squared ReLU (Nemotron-H's)
            h = self.op("sqr", self.op("relu", up, name="ffn_moe_relu"), name="ffn_moe_relu_sqr")
        else:
            h = self.op(act.value, up, name=f"ffn_moe_{act.value}")
        experts = self._expert_mm(down_exps, down_exps_b, down_exps_s, h, selected, name="ffn_moe_down")
        if not weight_before:
            experts = self.op("mul", experts, weights, name="ffn_moe_weighted")
        summed = self._experts_summed(n_expert_used)
        if summed < n_expert_used:  # a layer of fewer used experts sums its first ones only
            experts = self.op("view", experts, shape=(n_embd, summed, n_tok),
                              strides=(1, n_embd, n_embd * n_expert_used), offset=0, name="ffn_moe_summed")
        return self.op("moe_sum", experts, name=name)

    def _experts_summed(self, n_chosen: int) -> int:
        """How many of the chosen experts' outputs the current layer sums: its own expert_used_count where the file
        gives one per layer (llama.cpp's hparams.n_expert_used(il)), else all ``n_chosen``."""
        per_layer = dict(self.hp.family).get("n_expert_used_layers", ())
        return per_layer[self.il] if per_layer and self.il is not None else n_chosen

    def _moe_best_groups(self, choice: Node, n_expert: int, n_groups: int, n_group_used: int) -> Node:
        """Group-limited routing, as llama.cpp's build_moe_ffn: a group scores the sum of its two best selection
        scores; per token the ``n_group_used`` best groups keep their scores and the others' become -inf."""
        n_tok = choice.shape[1]
        per = n_expert // n_groups
        groups = self.reshape(choice, (per, n_groups, n_tok), name="ffn_moe_groups")
        top2 = self.op("argsort_top_k", groups, k=2, name="ffn_moe_group_top2")
        best = self.op("get_rows", self.reshape(groups, (1, per, n_groups, n_tok), name="ffn_moe_groups.4d"), top2,
                       name="ffn_moe_group_top2_scores")
        score = self.op("sum_rows", self.reshape(best, (2, n_groups, n_tok), name="ffn_moe_group_top2_scores.3d"),
                        name="ffn_moe_group_scores")
        kept = self.op("argsort_top_k", self.reshape(score, (n_groups, n_tok), name="ffn_moe_group_scores.2d"),
                       k=n_group_used, name="ffn_moe_group_topk")
        rows = self.op("get_rows", groups, kept, name="ffn_moe_group_kept")
        masked = self.op("set_rows", self.op("fill", groups, c=float("-inf"), name="ffn_moe_groups_masked_all"),
                         rows, kept, name="ffn_moe_groups_masked")
        return self.reshape(masked, (n_expert, n_tok), name="ffn_moe_probs_masked")

    def _expert_mm(self, w: Node, b: Node | None, s: Node | None, x: Node, selected: Node, *, name: str) -> Node:
        """Each token's rows through its selected experts of the stack ``w``, times each expert's scale ``s``
        (its entry, repeated over the tokens and picked by the selection, as llama.cpp's build_lora_mm_id), plus
        each expert's bias ``b``."""
        y = self.op("mul_mat_id", w, x, selected, name=name)
        if s is not None:
            n_expert, n_tok = s.shape[0], selected.shape[1]
            per_token = self.op("repeat", self.reshape(s, (1, n_expert, 1), name=f"{name}_s.3d"),
                                shape=(1, n_expert, n_tok), name=f"{name}_s.tokens")
            y = self.op("mul", y, self.op("get_rows", per_token, selected, name=f"{name}_s.rows"),
                        name=f"{name}_scaled")
        return y if b is None else self.op("add_id", y, b, selected, name=f"{name}_biased")

    def rope(self, x: Node, pos: Node, freq_factors: Node | None = None, *, name: str,
             freq_base: float | None = None, freq_scale: float | None = None,
             sections: tuple[int, ...] | None = None, attn_factor: float | None = None,
             ext_factor: float | None = None, beta_fast: float = 32.0, beta_slow: float = 1.0,
             n_dims: int | None = None, n_ctx_orig: int | None = None, mode: str | None = None) -> Node:
        """RoPE with the model's parameters; ``freq_base``/``freq_scale`` override them for one layer (e.g.
        the sliding layers of Gemma 3, llama.cpp's ``get_rope_freq_base``); ``sections``: the rotated pairs
        fall into position sections (llama.cpp's ``ggml_rope_multi``, Qwen3.5's interleaved M-RoPE);
        ``attn_factor`` replaces the magnitude factor (DeepSeek-V2's YaRN, which llama.cpp's context sets apart);
        ``ext_factor``, ``beta_fast``, ``beta_slow``: YaRN's parameters where the file gives them (Grok, Ministral 3);
        ``n_dims``: the rotated dims where a layer's differ from the model's (rope.dimension_count_swa);
        ``n_ctx_orig``: YaRN's original context where a layer's differs (Laguna's sliding layers: the trained one);
        ``mode``: a layout other than the model's (DeepSeek-V3.2's indexer turns NeoX halves)."""
        hp = self.hp
        ops = (x, pos) if freq_factors is None else (x, pos, freq_factors)
        yarn = hp.rope_scaling == "yarn"
        attn = yarn_attn_factor(hp.rope_freq_scale, hp.rope_attn_factor) if yarn else hp.rope_attn_factor
        attn = attn if attn_factor is None else attn_factor
        attrs = dict(n_dims=hp.n_rot if n_dims is None else n_dims, mode=self.arch.rope_mode if mode is None else mode,
                     n_ctx_orig=hp.n_ctx_orig_yarn if n_ctx_orig is None else n_ctx_orig,
                     freq_base=hp.rope_freq_base if freq_base is None else freq_base,
                     freq_scale=hp.rope_freq_scale if freq_scale is None else freq_scale,
                     ext_factor=(1.0 if yarn else 0.0) if ext_factor is None else ext_factor, attn_factor=attn,
                     beta_fast=beta_fast, beta_slow=beta_slow)
        if sections is not None:
            return self.op("rope_multi", *ops, name=name, sections=sections, **attrs)
        return self.op("rope", *ops, name=name, **attrs)

    def softcap(self, x: Node, cap: float, *, name: str, inner: float = 1.0) -> Node:
        """cap * tanh(inner * x / cap): Gemma's soft capping of attention scores and logits (f32, as ggml computes
        it); ``inner`` scales the scores first (Grok's attention output multiplier)."""
        y = self.op("scale", x, s=f32(inner / cap), name=f"{name}.scaled")
        return self.op("scale", self.op("tanh", y, name=f"{name}.tanh"), s=cap, name=name)

    def kq_scale(self) -> float:
        return self.hp.attn_scale or inv_sqrt(self.hp.n_embd_head_k)

    def build_qkv(self, x: Node, il: int, heads: bool = True, clamp: float = 0.0) -> tuple[Node, Node, Node]:
        """Q, K, V as [d, heads, tokens] from layer il's fused ``attn_qkv`` (strided views of one product) or
        its three projections, each with its bias when the file has one (llama.cpp's ``build_qkv``); ``heads``
        False: each whole [width, tokens] (llama.cpp's ``reshape`` false, for a family that normalises Q and K
        across all their heads at once); ``clamp`` > 0: the products (with their biases) clamped to [-clamp, clamp]
        before the split into heads (llama.cpp's ``clamp_kqv``, DBRX)."""
        hp, T_ = self.hp, self.n_tokens
        d, dv, H, Hkv = hp.n_embd_head_k, hp.n_embd_head_v, hp.head_count(il), hp.head_count_kv(il)

        def clamped(y: Node, tag: str) -> Node:
            return self.op("clamp", y, min=-clamp, max=clamp, name=f"{tag}_clamped") if clamp > 0 and heads else y

        fused = self._declared(MODEL_TENSOR.ATTN_QKV, il)
        if fused is None:
            q, k, v = (clamped(self._projection(x, t, il, tag), tag) for t, tag in (
                (MODEL_TENSOR.ATTN_Q, "Qcur"), (MODEL_TENSOR.ATTN_K, "Kcur"), (MODEL_TENSOR.ATTN_V, "Vcur")))
            if not heads:
                return q, k, v
            return (self.reshape(q, (d, H, T_), name="Qcur.heads"), self.reshape(k, (d, Hkv, T_), name="Kcur.heads"),
                    self.reshape(v, (dv, Hkv, T_), name="Vcur.heads"))
        bias = self._declared(MODEL_TENSOR.ATTN_QKV, il, "bias")
        if bias is None:  # a fused weight may come with separate q/k/v biases: llama.cpp joins all three, if all are
            names = [tensor_name(t, il, "bias") for t in (MODEL_TENSOR.ATTN_Q, MODEL_TENSOR.ATTN_K, MODEL_TENSOR.ATTN_V)]
            if all(n in self.arch.specs and n in self.tensors for n in names):
                q_b, k_b, v_b = (self.weight(n) for n in names)
                qk_b = self.op("concat", q_b, k_b, dim=0, name="qk_b")  # type: ignore[arg-type]
                bias = self.op("concat", qk_b, v_b, dim=0, name="qkv_b")  # type: ignore[arg-type]
        qkv = clamped(self.linear(x, fused, bias, name="wqkv", s=self.scale(MODEL_TENSOR.ATTN_QKV, il)), "wqkv")
        q_w, k_w = d * H, d * Hkv
        row = q_w + k_w + dv * Hkv
        if not heads:
            return tuple(self.op("cont", self.op("view", qkv, shape=(w, T_), strides=(1, row), offset=off,  # type: ignore[return-value]
                                                 name=f"{tag}.view"), name=tag)
                         for tag, w, off in (("Qcur", q_w, 0), ("Kcur", k_w, q_w), ("Vcur", dv * Hkv, q_w + k_w)))
        return tuple(self.op("view", qkv, shape=(w, h, T_), strides=(1, w, row), offset=off, name=tag)  # type: ignore[return-value]
                     for tag, w, h, off in (("Qcur", d, H, 0), ("Kcur", d, Hkv, q_w), ("Vcur", dv, Hkv, q_w + k_w)))

    def _projection(self, x: Node, t: MODEL_TENSOR, il: int, tag: str) -> Node:
        w = self._declared(t, il)
        if w is None:  # a family where the fused and the separate form are both optional: neither is in the file
            raise TensorError(f"{self.label}: missing tensor '{tensor_name(MODEL_TENSOR.ATTN_QKV, il)}' (or "
                              f"'{tensor_name(t, il)}' of separate projections)")
        return self.linear(x, w, self._declared(t, il, "bias"), name=tag, s=self.scale(t, il))

    def _declared(self, t: MODEL_TENSOR, il: int, suffix: str = "weight") -> Node | None:
        """A tensor of the shared attention blocks, which families declare required, optional or not at all."""
        name = tensor_name(t, il, suffix)
        return self.weight(name) if name in self.arch.specs else None

    def build_attn(self, q: Node, k: Node, v: Node, *, wo: Node | None, wo_b: Node | None = None,
                   wo_s: Node | None = None, kq_scale: float, softcap: float = 0.0, kq_b: Node | None = None,
                   sinks: Node | None = None, softcap_in: float = 1.0) -> Node:
        """Attention of q [d, n_head, T] over k/v [d, n_head_kv, T] and what the memory keeps, then W_o (times
        its scale ``wo_s``, plus ``wo_b``; ``wo`` None: the heads' output [d * n_head, T], for a family that gates
        it before projecting);
        ``softcap``: scores are soft-capped (:meth:`softcap`, their multiplier inside the tanh ``softcap_in``) before
        the mask and softmax (Gemma 2; Grok);
        ``kq_b``: a bias added to the scores (:meth:`build_pos_bias`); ``sinks`` [n_head]: one more logit per
        head that joins each softmax's denominator and attends to nothing (gpt-oss's attention sinks); ``wo_s``:
        W_o's per-tensor scale."""
        inp = self._inputs("build_attn", SelfAttention(k, v))
        out = self.attn_mha(q, inp.k, inp.v, inp.mask, kq_scale, softcap, kq_b, sinks=sinks, softcap_in=softcap_in)
        return out if wo is None else self.linear(out, wo, wo_b, name="attn_out", s=wo_s)

    def build_attn_mla(self, q: Node, k: Node, v: Node, *, wo: Node | None, v_mla: Node, kq_scale: float,
                       wo_s: Node | None = None, selected: Node | None = None) -> Node:
        """Multi-head latent attention (absorbed MLA): q [d_latent, n_head, T] over one shared head k
        [d_latent, 1, T] whose first ``v``'s width values are V (``v`` [kv_lora_rank, 1, T] is that view); each
        head's output is decompressed through its slice of ``v_mla`` [kv_lora_rank, d_v, n_head], then W_o (times
        its scale ``wo_s``; ``wo`` None: the heads' outputs [d_v * n_head, T], for the family to finish). Only a
        memory that keeps latent rows serves it. ``selected`` [n_top, T]: the cells each token may attend to
        (sparse attention, :meth:`selected_mask`)."""
        inp = self._inputs("build_attn_mla", LatentRows(k, v))
        mask = inp.mask if selected is None else self.selected_mask(inp.mask, selected)
        out = self.attn_mha(q, inp.k, inp.v, mask, kq_scale, v_mla=v_mla)
        return out if wo is None else self.linear(out, wo, name="attn_out", s=wo_s)

    def selected_mask(self, mask: Node, selected: Node) -> Node:
        """The mask [n_kv, T] with every cell masked but those ``selected`` [n_top, T] per token, plus the mask
        itself (llama.cpp's sparse attention: zeros written into an all -inf mask at the selected rows)."""
        n_kv, n_tok = mask.shape
        n_top = selected.shape[0]
        hidden = self.op("fill", mask, c=float("-inf"), name="kq_mask_all")
        hidden = self.op("view", hidden, shape=(1, n_kv, n_tok), strides=(1, 1, n_kv), offset=0,
                         name="kq_mask_all.rows")
        zeros = self.op("fill", self.reshape(selected, (1, n_top, n_tok), name="top_k.rows"), c=0.0,
                        name="kq_mask_zeros")
        shown = self.op("set_rows", hidden, zeros, selected, name="kq_mask_top_k.rows")
        shown = self.op("view", shown, shape=(n_kv, n_tok), strides=(1, n_kv), offset=0, name="kq_mask_top_k.view")
        return self.op("add", shown, mask, name="kq_mask_top_k")

    def build_indexer_rotation(self) -> Node:
        """The rotation the indexer's queries and keys go through before they are scored (the memory's)."""
        return self._inputs("build_indexer_rotation", IndexerRotation())

    def build_indexer_keys(self, k: Node) -> tuple[Node, Node, Dim]:
        """Keep the layer's indexer keys k [d, 1, T]; every cached key [d, 1, n_kv], the indexer's mask and how
        many keys a token keeps."""
        inp: IndexerInputs = self._inputs("build_indexer_keys", IndexerRows(k))
        return inp.k, inp.mask, inp.n_top

    def build_pos_bias(self, rel_b: Node) -> Node:
        """T5's relative position bias of every score [n_kv, n_tokens, n_head]: the row of ``rel_b``
        [n_head, n_buckets] for the bucket of each key-query distance, the buckets being the memory's input
        (its keys are its cells, or the ubatch without cache). Layers sharing a table share the bias."""
        if rel_b.name not in self._pos_bias:
            bucket = self._inputs("build_pos_bias", PosBuckets())
            n_kv, n_tok = bucket.shape
            rows = self.op("get_rows", rel_b, self.reshape(bucket, (n_kv * n_tok,), name="pos_bucket_1d"),
                           name="pos_bias.rows")
            rows = self.reshape(rows, (rel_b.shape[0], n_kv, n_tok), name="pos_bias.rows_3d")
            bias = self.op("permute", rows, axes=(2, 0, 1, 3), name="pos_bias.heads")
            self._pos_bias[rel_b.name] = self.op("cont", bias, name="pos_bias")
        return self._pos_bias[rel_b.name]

    def build_inp_cross(self) -> Node:
        """The encoder output this layer cross-attends to, [n_embd, n_enc], kept by the memory."""
        return self._inputs("build_inp_cross", CrossRows())

    def build_cross_attn(self, q: Node, k: Node, v: Node, *, wo: Node, kq_scale: float) -> Node:
        """Attention of q [d, n_head, T] over k/v [d, n_head_kv, n_enc] made from the encoder output, each
        token seeing the encoder outputs of its sequences (the memory's mask), then W_o."""
        mask = self._inputs("build_cross_attn", CrossMask())
        return self.linear(self.attn_mha(q, k, v, mask, kq_scale, tag="cross."), wo, name="cross_out")

    def build_rs(self, which: str) -> Node:
        """This layer's recurrent state of the ubatch's sequences: ``r`` (rolling: conv columns, token shifts)
        ``[n_embd_r, n_seqs]`` or ``s`` (SSM / WKV state) ``[n_embd_s, n_seqs]``, gathered from their cells."""
        state = self._inputs("build_rs", RecurrentState(which))
        return self.op("get_rows", state.buffer, state.cells, name=f"rs_{which}.read")

    def store_rs(self, which: str, states: Node) -> None:
        """Write this layer's new states (same shape as :meth:`build_rs` returns) to their sequences' cells;
        the write is a graph output (e.g. ``blk.3.rs_s``), so snapshots and hashes cover it."""
        state = self._inputs("store_rs", RecurrentState(which, write=True))
        node = self.op("set_rows", state.buffer, states, state.cells, name=f"rs_{which}.write")
        self.outputs[node.name.removesuffix(".write")] = node

    def _inputs(self, what: str, request: Request[R]) -> R:
        """The current layer's inputs for one request, from the memory."""
        if self.il is None:
            raise GraphError(f"{what} is a layer's request: call it inside `with b.layer(il)`")
        return self.memory.input_for(self, self.il, request)

    def attn_mha(self, q: Node, k: Node, v: Node, mask: Node | None, kq_scale: float, softcap: float = 0.0,
                 kq_b: Node | None = None, tag: str = "", sinks: Node | None = None,
                 v_mla: Node | None = None, softcap_in: float = 1.0) -> Node:
        """softmax(K^T Q * scale + mask) V per head; query head h reads kv head h // (n_head / n_head_kv).
        Soft capping, then the bias ``kq_b``, change the scores before the softmax, in llama.cpp's order;
        ``sinks`` [n_head] join the softmax's denominators, one logit per head. With ALiBi (hparams
        max_alibi_bias) the softmax scales the mask's distances by each head's slope. No mask (a vision tower's
        patches): every query sees every key, and there are no sinks.
        ``tag`` prefixes the node names (a layer's second attention: cross-attention)."""
        if mask is None and sinks is not None:
            raise GraphError("attention sinks ride on a mask; attention without one has none")
        q = self.op("permute", q, axes=(0, 2, 1, 3), name=f"{tag}q")
        k = self.op("permute", k, axes=(0, 2, 1, 3), name=f"{tag}k")
        kq = self.op("mul_mat", k, q, name=f"{tag}kq")
        if softcap:
            kq = self.softcap(kq, softcap, name=f"{tag}kq.softcap", inner=softcap_in)
        if kq_b is not None:
            kq = self.op("add", kq, kq_b, name=f"{tag}kq.biased")
        kq = self.op("soft_max", kq, *(() if mask is None else (mask,)), *(() if sinks is None else (sinks,)),
                     scale=kq_scale, max_bias=self.hp.max_alibi_bias, name=f"{tag}kq_soft_max")
        v = self.op("cont", self.op("permute", v, axes=(1, 2, 0, 3), name=f"{tag}v"), name=f"{tag}v.cont")
        kqv = self.op("mul_mat", v, kq, name=f"{tag}kqv")
        if v_mla is not None:  # MLA: each head's latent output decompressed by its slice [d_v, d_out, n_head]
            kqv = self.op("mul_mat", v_mla, kqv, name=f"{tag}kqv_mla")
        out = self.op("cont", self.op("permute", kqv, axes=(0, 2, 1, 3), name=f"{tag}kqv.heads"), name=f"{tag}kqv.cont")
        d, n_head, n_tok = out.shape
        return self.reshape(out, (d * n_head, n_tok), name=f"{tag}kqv_out")

    def build_output(self, x: Node, head: Node | None = None, bias: Node | None = None, softcap: float = 0.0) -> None:
        """Record the final embedding and, for models with an LM head, the logits as the graph's outputs
        (soft-capped when ``softcap`` is set: Gemma's final logit capping)."""
        self.outputs["embd"] = x
        if head is not None:
            logits = self.linear(x, head, bias, name="result_output" if not softcap else "result_output.raw")
            self.outputs["logits"] = self.softcap(logits, softcap, name="result_output") if softcap else logits

    def build_pooling(self, pooling: str) -> None:
        """Reduce the final embeddings per sequence of the ubatch (llama.cpp's pooling types).

        mean: average over the sequence's tokens; cls / last: the token with the smallest / largest position;
        rank: the cls token (the last, when the model is causal; the mean where the family pools so first) through
        the model's classifier head (``cls``, its activation and ``cls.norm``, then ``cls.output``, each where the
        file has it; a softmax over the scores where the family says so), one score per label.
        The context feeds ``inp_mean`` [n_outputs, n_seqs] or ``inp_cls`` [n_seqs] (:mod:`graphir.running.pooling`);
        it asks for every token's output when it pools, so the rows are the ubatch's tokens.
        """
        embd = self.outputs["embd"]
        if pooling == "mean" or pooling == "rank" and self.arch.rank_pooling == "mean":
            mean = self.input("inp_mean", "f32", (self.n_outputs, self.n_seqs))  # pooled contexts output all rows
            rows = self.op("cont", self.op("transpose", embd, name="embd.t"), name="embd.t.cont")
            pooled = self.op("mul_mat", rows, mean, name="result_pooled")
            self.outputs["pooled"] = self._classifier(pooled) if pooling == "rank" else pooled
        elif pooling in ("cls", "last", "rank"):
            last = pooling == "last" or pooling == "rank" and self.hp.causal  # a causal reranker reads the end
            ids = self.input("inp_cls", "i32", (self.n_seqs,), pick="last" if last else "cls")
            pooled = self.op("get_rows", embd, ids, name="result_pooled")
            self.outputs["pooled"] = self._classifier(pooled) if pooling == "rank" else pooled
        elif pooling != "none":
            raise GraphError(f"pooling '{pooling}' is not supported (none, mean, cls, last, rank)")

    def _classifier(self, x: Node) -> Node:
        """A reranker's head over the pooled rows (llama.cpp's rank pooling)."""
        cls, cls_b, out, out_b = (self.weight(n) if n in self.arch.specs else None for n in (
            tensor_name(MODEL_TENSOR.CLS), tensor_name(MODEL_TENSOR.CLS, suffix="bias"),
            tensor_name(MODEL_TENSOR.CLS_OUT), tensor_name(MODEL_TENSOR.CLS_OUT, suffix="bias")))
        if cls is None and out is None:
            raise GraphError(f"pooling 'rank' needs a classifier head (tensor {tensor_name(MODEL_TENSOR.CLS)} or "
                             f"{tensor_name(MODEL_TENSOR.CLS_OUT)}), which this {self.arch.name} model does not have")
        if cls is not None:
            act = self.arch.classifier_act
            x = self.op(act, self.linear(x, cls, cls_b, name="result_cls"), name=f"result_cls.{act}")
            norm = tensor_name(MODEL_TENSOR.CLS_NORM)
            if norm in self.arch.specs and self.weight(norm) is not None:  # ModernBERT's head norm
                x = self.build_norm(x, self.weight(norm), None, Norm.LAYER, name="result_cls_norm")
        if out is not None:
            x = self.linear(x, out, out_b, name="result_cls_out")
        return self.op("soft_max", x, scale=1.0, max_bias=0.0, name="result_rank") if self.arch.rank_softmax else x

    def graph(self, meta: dict[str, Any]) -> Graph:
        # Canonical order: leaves outside any layer first (as every form prints them), then emission order.
        nodes = self.nodes
        if self._token_table is not None and not any(self._token_table in n.inputs for n in nodes):
            nodes = [n for n in nodes if n is not self._token_table]  # a graph of rows reads no token
        head = [n for n in nodes if n.op in ("input", "weight") and n.layer is None]
        body = [n for n in nodes if not (n.op in ("input", "weight") and n.layer is None)]
        return Graph(meta, tuple(_used_dims(self.dims, nodes)), head + body, self.outputs)


def _used_dims(dims: list[DimDecl], nodes: list[Node]) -> list[DimDecl]:
    """The declared dims some shape or attribute names, with those their bounds name (declaration order)."""
    used: set[str] = set()

    def visit(v: Any) -> None:
        if isinstance(v, Sym):
            used.update(v.symbols)
        elif isinstance(v, tuple):
            for x in v:
                visit(x)

    seen: set[Any] = set()  # shapes and attributes repeat layer after layer: each distinct one is visited once
    for n in nodes:
        for v in (n.shape, *n.attrs.values()):
            if isinstance(v, (Sym, tuple)):
                try:
                    if v in seen:
                        continue
                    seen.add(v)
                except TypeError:  # a tuple holding something unhashable: visited every time
                    pass
                visit(v)
    while True:
        before = len(used)
        for d in dims:
            if d.name in used:
                visit(d.min)
                visit(d.max)
        if len(used) == before:
            break
    return [d for d in dims if d.name in used]

