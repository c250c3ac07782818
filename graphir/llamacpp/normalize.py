"""The normal form in which graphir's graph of a model and llama.cpp's are compared.

Two graphs of one model can differ in ways that change no value; the normal form removes exactly those, each
by a rule stated here (the README lists them with the differences that remain):

1. **Sizes.** graphir's graph leaves the batch and cache sizes open; llama.cpp's is built for one ubatch in one
   cache. graphir's symbols take llama.cpp's sizes, read off the inputs both graphs name alike (``tokens``,
   ``kq_mask``, ``blk.N.cache_k``, ...); the ones no input decides take the sizes llama.cpp reserved. A scale by
   a size (lightning attention's block length) is that size as ggml's float parameter.
2. **Layout.** Views, reshapes, permutations, transposes and copies into contiguous memory (the ops the
   catalogue marks layout-only) move no value: each is replaced by its operand, and shapes lose trailing 1s.
   A value of no element (llama.cpp's copies of states beyond the ubatch's, none with one sequence) is dropped.
3. **Cache writes.** ggml orders a cache write before the cache's read by scheduling, graphir by data flow: a
   read of a cache input after a ``set_rows`` into it reads that write. A write has its cache's shape, and the
   write's row ids are compared by type only: without flash attention llama.cpp keeps values transposed, one
   row per element, which only changes how many ids the same values take. A recurrent state is written by
   ggml as a copy into its cache's cells (``ggml.cpy``), by graphir as ``set_rows`` at ``rs_dst``: both are
   ``set_rows(cache, state)``, the cells left to the memory. A state ggml copies in parts into adjacent column
   ranges of its cells (kimi-linear's q, k and v conv columns, each part [columns, channels, sequences]) is
   written as one: the parts joined along their channels (``concat`` dim 1), as graphir builds the row. ggml's scans read their start states through ids
   (a seventh operand); graphir gathers them first: both are ``get_rows(states, ids)`` read by the scan.
   Inputs are compared by role, type and shape (what graphir notes about a mask, such as its window, is
   graphir's own); a V cache by its cells alone: llama.cpp's transposed one is as wide as the widest layer's
   where layers' V widths differ, and each layer's write and read say its own width.
4. **Names.** Each side names its nodes its own way, so names are made from structure alone: from the
   outputs (by role) and then every other node nothing uses, operands are visited in order, and each
   computing node is named ``<layer>.<op>.<k>`` (the k-th such op of its layer in that order; its layer is the
   highest of its operands'). Weights keep their GGUF names and inputs their role names. Two graphs that
   compute the same thing from the same weights and inputs in the same order get the same normal form.
   A value only a memory write or an output needs is kept; one nothing needs is not compared. Outputs are
   the values a caller reads (logits, embeddings); a memory write is compared as a write, not as an output.
5. **Fused and unfused ops.** ggml's GLU of one operand (``ggml.swiglu(x)``: gate and up are x's halves) is
   the catalogue's GLU of the two halves (views, so rule 2 leaves ``swiglu(x, x)``); a view of the first k
   entries of ``argsort_top_k`` (ggml sorts all, then views k) is ``argsort_top_k`` with that k; ggml's rope of
   a head's dims from an offset to its end (``ggml.rope``) is the head's first dims joined with the rope of the
   others (``concat``, as graphir builds it); graphir's
   ``moe_sum`` of k expert slots is the chain of k - 1 adds of views ggml builds. Floating-point addition and
   multiplication commute exactly, so the operands of an ``add`` or ``mul`` of two same-shaped values are put
   in one order (by what they compute). The rows ``ids`` picks from a plus those it picks from b are the rows
   it picks from a + b (llama.cpp's T5 decoder picks its output rows before its last residual add, graphir
   after). A ``fill`` is its shape and value alone (llama.cpp fills a new tensor, graphir a value of that
   shape). A value computed again from the same operands (llama.cpp's T5
   decoder gathers the shared relative-position bias in every layer, graphir once) is computed once.
"""

from __future__ import annotations

import hashlib
from typing import Any

from graphir.graph.dims import Dim, Sym
from graphir.graph.forms import node_line
from graphir.graph.ir import Graph, Node
from graphir.graph.ops import VIEWS
from graphir.llamacpp.convert import rope_attrs, shape_of


def bind_sizes(ours: Graph, theirs: Graph) -> dict[str, int]:
    """Each of ``ours``'s open sizes, as ``theirs`` (llama.cpp's graph) has it (rule 1): read off the inputs both
    name alike (not the row ids, whose count depends on the value cache's layout); the sizes no input decides
    are those llama.cpp reserved (one sequence, a full cache: n_kv is n_ctx)."""
    hp = theirs.meta.get("hparams", {})
    n_tokens, n_ctx = hp.get("n_tokens", 1), hp.get("n_ctx", 1)
    env = {"n_tokens": n_tokens, "n_outputs": hp.get("n_outputs", 1), "n_ctx": n_ctx, "n_kv": n_ctx,
           "n_seqs": 1, "n_seq_tokens": n_tokens, "n_rs": 1}
    by_name = {n.name: n for n in theirs.inputs}
    bound: set[str] = set()
    for n in ours.inputs:
        other = by_name.get(n.name)
        if other is None or "idxs" in n.attrs["role"]:
            continue
        for d, v in zip(n.shape, other.shape):
            name = str(d)
            if isinstance(d, Sym) and d == Sym.named(name) and name not in bound:  # a size that is one symbol
                env[name] = v
                bound.add(name)
    env.setdefault("n_kv_swa", env.get("n_ctx_swa", n_ctx))
    for d in ours.dims:  # a size capped by a number (an indexer's top_k): the full cache's, at most the cap
        if d.name not in env and isinstance(d.max, int):
            env[d.name] = min(n_ctx, d.max)
    return env


def _size(d: Dim, env: dict[str, int]) -> int:
    return d.eval(env) if isinstance(d, Sym) else d


def _attr(v: Any, env: dict[str, int]) -> Any:
    if isinstance(v, Sym):
        return v.eval(env)
    if isinstance(v, tuple):
        return tuple(_attr(x, env) for x in v)
    return v


_HALVES = {"ggml.swiglu": "swiglu", "ggml.geglu": "geglu", "ggml.reglu": "reglu"}  # ggml's GLU of one operand (its two halves)
_COMMUTING = frozenset({"add", "mul"})
_SCANS = frozenset({"ssm_scan", "ssm_scan_heads"})
_WRITES = frozenset({"set_rows", "ggml.cpy"})  # memory writes: kept though nothing in the graph reads them


def normal_form(g: Graph, env: dict[str, int] | None = None) -> Graph:
    """``g`` in the normal form (rules 2-5), its open sizes taken from ``env`` (rule 1)."""
    env = env or {}
    alias: dict[int, Node] = {}  # id of an original node -> its normal node
    written: dict[int, Node] = {}  # id of a normal cache input -> the normal write into it
    made: list[Node] = []
    digest: dict[int, str] = {}  # id of a normal node -> a digest of what it computes, names aside
    computed: dict[str, Node] = {}  # digest -> the first normal node computing it
    parts: dict[int, tuple[int, int]] = {}  # id of a normal state write -> (its first part's offset, its row's end)

    for n in g.nodes:
        if n.op in VIEWS:
            x = alias[id(n.inputs[0])]
            if x.op == "argsort_top_k" and n.op == "view" and n.attrs["offset"] == 0:  # rule 5: the first k
                k = _size(n.shape[0], env)
                x = Node(x.name, x.op, x.inputs, {"k": k}, x.dtype, (k,) + x.shape[1:])
                digest[id(x)] = _digest(x, digest)
                x = computed.setdefault(digest[id(x)], x)  # two such views of one sort: computed once
            alias[id(n)] = x
            continue
        operands = []
        for slot, x in enumerate(n.inputs):
            y = alias[id(x)]
            if not (n.op == "set_rows" and slot == 0):
                y = written.get(id(y), y)
            operands.append(y)
        shape = shape_of([_size(d, env) for d in n.shape])
        name, empty = n.name, 0 in shape
        continued = None  # the span of the earlier parts a state's part continues
        op, attrs = n.op, {k: _attr(v, env) for k, v in n.attrs.items()}
        if n.op == "scale":  # a scale by a size (rule 1) is ggml's float parameter
            attrs["s"] = float(attrs["s"])
        if "shape" in attrs:  # repeat's target: a shape like any other (rule 2)
            attrs["shape"] = shape_of(list(attrs["shape"]))
        if n.op == "set_rows":
            shape = operands[0].shape
        elif n.op == "input":
            attrs = {"role": n.attrs["role"]}
            if "idxs" in n.attrs["role"]:
                shape = ()
            elif n.attrs["role"] == "cache_v":  # rule 3: a V cache by its cells (llama.cpp's transposed one is as
                shape = shape[1:]  # wide as the widest layer's where widths differ; each layer reads its own)
        elif n.op == "fill":  # rule 5: a fill is its shape and value; what it was made from is not read
            operands, name = [], f"fill.{attrs['c']}." + "x".join(map(str, shape))
        elif n.op in _HALVES and len(operands) == 1:  # rule 5: a GLU of one operand's halves
            op, attrs, operands = _HALVES[n.op], {}, operands * 2
        elif n.op == "ggml.rope" and _rope_at_the_end(n, shape):  # rule 5: a rope of a head's last dims
            attrs = rope_attrs(list(n.attrs["params"]) + [0] * 16)
            part = (attrs["n_dims"],) + shape[1:]
            rope = _made(Node(n.name + ".part", "rope", tuple(operands), attrs, n.dtype, part), digest, made)
            op, attrs, operands = "concat", {"dim": 0}, [operands[0], rope]
        elif n.op == "moe_sum":  # rule 5: graphir's sum of a token's expert slots is llama.cpp's chain of adds
            slots = _size(n.inputs[0].shape[1], env) if len(n.inputs[0].shape) > 1 else 1  # a view's, where it is one
            alias[id(n)] = _chain_of_adds(operands[0], shape, made, digest, slots)
            continue
        elif n.op == "ggml.cpy" and operands[1].op == "input":  # rule 3: a state copied into its cache's cells
            op, attrs, operands, shape = "set_rows", {}, [operands[1], operands[0]], operands[1].shape
        elif n.op == "ggml.cpy" and _next_part(n, operands[1], parts, env):  # rule 3: the next part of a state
            earlier = operands[1]
            part_shape = shape_of([_size(d, env) for d in n.inputs[0].shape])
            continued = first, end = parts[id(earlier)]
            joined = shape_of([part_shape[0], (end - first) // part_shape[0] + part_shape[1], *part_shape[2:]])
            state = _made(Node(n.name + ".parts", "concat", (earlier.inputs[1], operands[0]), {"dim": 1}, n.dtype,
                               joined), digest, made)
            made.remove(earlier)
            op, attrs, operands, shape = "set_rows", {}, [earlier.inputs[0], state], earlier.shape
        elif n.op in _SCANS and len(operands) == 7:  # rule 3: a scan from the states at ids reads them first
            s, ids = operands[0], operands[6]
            start = Node(s.name + ".read", "get_rows", (s, ids), {}, s.dtype, shape_of([s.shape[0], ids.shape[0]]))
            digest[id(start)] = _digest(start, digest)
            operands = [start] + operands[1:6]
        if op == "set_rows" and operands[0].attrs.get("role") == "cache_v" and operands[1].op == "pad":
            operands[1] = operands[1].inputs[0]  # rule 3: llama.cpp pads a layer's V rows to its wider cache's
        if op == "set_rows" and operands[0].attrs.get("role", "").startswith("rs_"):
            operands = operands[:2]  # rule 3: which cells a state goes to is the memory's business
        picked = _rows_of_a_sum(op, operands)
        if picked is not None:  # rule 5: get_rows(a, ids) + get_rows(b, ids) is get_rows(a + b, ids)
            a, b, ids = picked
            total = _made(Node(n.name + ".sum", "add", _ordered([a, b], digest), {}, n.dtype, a.shape), digest, made)
            op, operands = "get_rows", [total, ids]
        if op in _COMMUTING and len({x.shape for x in operands}) == 1:  # rule 5: a + b is b + a, bit for bit
            operands = _ordered(operands, digest)
        node = Node(name, op, tuple(operands), attrs, n.dtype, shape)
        digest[id(node)] = _digest(node, digest)
        if op not in _WRITES and op != "input" and digest[id(node)] in computed:  # rule 5: computed once
            alias[id(n)] = computed[digest[id(node)]]
            continue
        computed.setdefault(digest[id(node)], node)
        if op == "set_rows" and not empty:
            written[id(operands[0])] = node
            if n.op == "ggml.cpy":
                parts[id(node)] = _part_span(n, env, continued)
        alias[id(n)] = node
        if not empty:  # rule 2: a value of no element is nothing to compare
            made.append(node)
    outputs = {role: alias[id(n)] for role, n in sorted(g.outputs.items()) if alias[id(n)].op not in _WRITES}
    writes = sorted((m for m in made if m.op in _WRITES), key=lambda m: (m.inputs[0].name, digest[id(m)]))
    roots = list(outputs.values()) + writes
    return _renamed(g, roots, outputs)


def _part_span(cpy: Node, env: dict[str, int], before: tuple[int, int] | None) -> tuple[int, int]:
    """Where in a cell's row a ``ggml.cpy`` of a state (a part) writes: (its offset, the end of one sequence's
    part); continuing the parts ``before`` spans, the span of them all."""
    dst = cpy.inputs[1]
    offset = _size(dst.attrs["offset"], env) if dst.op == "view" else 0
    sizes = [_size(d, env) for d in cpy.inputs[0].shape]
    end = offset + (sizes[0] * sizes[1] if len(sizes) > 1 else sizes[0])
    return (before[0], end) if before is not None else (offset, end)


def _next_part(cpy: Node, dst: Node, parts: dict[int, tuple[int, int]], env: dict[str, int]) -> bool:
    """Whether ``cpy`` copies the part of a state that follows, in its cells' rows, the part the write ``dst``
    already copied."""
    if dst.op != "set_rows" or id(dst) not in parts or cpy.inputs[1].op != "view":
        return False
    return _size(cpy.inputs[1].attrs["offset"], env) == parts[id(dst)][1]


def _rope_at_the_end(n: Node, shape: tuple[int, ...]) -> bool:
    """Whether ``n`` is ggml's rope of the dims from an offset to the end of each head (DeepSeek's legacy form
    ropes a query's last dims in place)."""
    p = list(n.attrs["params"]) + [0] * 16
    return bool(p[15]) and p[15] + p[1] == shape[0]


def _rows_of_a_sum(op: str, operands: list[Node]) -> tuple[Node, Node, Node] | None:
    """(a, b, ids) when ``op`` adds the rows ``ids`` picks from a and from b (same-shaped a and b), else None."""
    if op != "add" or not all(x.op == "get_rows" for x in operands):
        return None
    (a, ids), (b, other) = (x.inputs for x in operands)
    return (a, b, ids) if ids is other and a.shape == b.shape else None


def _ordered(operands: list[Node], digest: dict[int, str]) -> list[Node]:
    return sorted(operands, key=lambda x: digest[id(x)])


def _made(node: Node, digest: dict[int, str], made: list[Node]) -> Node:
    digest[id(node)] = _digest(node, digest)
    made.append(node)
    return node


def _digest(n: Node, digest: dict[int, str]) -> str:
    """What a normal node computes, from its op, attributes (as printed: a float32 eps read from a GGUF and one
    read from ggml are the same number), type and operands' digests (leaves: their names)."""
    signature = node_line(Node("", n.op, (), n.attrs, n.dtype, n.shape))  # op, attributes and type, as printed
    parts = [signature] + [digest[id(x)] for x in n.inputs]
    if not n.inputs:
        parts.append(n.name)
    return hashlib.sha1("\x00".join(parts).encode()).hexdigest()


def _chain_of_adds(x: Node, shape: tuple[int, ...], made: list[Node], digest: dict[int, str], slots: int) -> Node:
    """x's first ``slots`` slots (ne1) summed as ``add(add(slot 0, slot 1), slot 2)...``, the slots being views of
    x."""
    out = x
    for _ in range(1, slots):
        out = _made(Node(x.name + ".sum", "add", (out, x), {}, "f32", shape), digest, made)
    return out


def _finish_order(roots: list[Node]) -> list[Node]:
    """The nodes reachable from ``roots``, each after its operands, operands visited in order."""
    done: set[int] = set()
    order: list[Node] = []
    for root in roots:
        stack: list[tuple[Node, bool]] = [(root, False)]
        while stack:
            n, expanded = stack.pop()
            if id(n) in done:
                continue
            if expanded:
                done.add(id(n))
                order.append(n)
                continue
            stack.append((n, True))
            stack.extend((x, False) for x in reversed(n.inputs) if id(x) not in done)
    return order


def _renamed(g: Graph, roots: list[Node], outputs: dict[str, Node]) -> Graph:
    """The nodes reachable from ``roots``, named by structure (rule 4). They are listed by depth (the longest
    chain of computations above the inputs; then in the order the walk from the roots finished them), each leaf
    just before its first user, so that the listing reads from the first layer to the last."""
    finished = _finish_order(roots)
    rank = {id(n): i for i, n in enumerate(finished)}
    depth: dict[int, int] = {}
    for n in finished:
        depth[id(n)] = 0 if not n.inputs else 1 + max(depth[id(x)] for x in n.inputs)
    computing = sorted((n for n in finished if n.inputs), key=lambda n: (depth[id(n)], rank[id(n)]))
    names: dict[int, Node] = {}
    counts: dict[str, int] = {}
    order: list[Node] = []
    origin: dict[str, str] = {}  # normal name -> the name the node had in g (for reading a difference)

    def emit(n: Node) -> None:
        operands = tuple(names[id(x)] for x in n.inputs)
        name = n.name
        if n.inputs:
            layers = [x.layer for x in operands if x.layer is not None]
            scope = f"blk.{max(layers)}" if layers else "top"
            k = counts.get(f"{scope}.{n.op}", 0)
            counts[f"{scope}.{n.op}"] = k + 1
            name = f"{scope}.{n.op}.{k}"
        m = Node(name, n.op, operands, n.attrs, n.dtype, n.shape)
        names[id(n)] = m
        order.append(m)
        origin[name] = n.name

    for n in computing:
        for x in n.inputs:
            if id(x) not in names:
                emit(x)
        emit(n)
    meta: dict[str, Any] = {k: g.meta[k] for k in ("arch", "context", "phase") if k in g.meta}
    meta["origin"] = origin  # not part of the header: neither printed nor compared
    return Graph(meta, (), order, {role: names[id(n)] for role, n in outputs.items()})


def compare_forms(ours: Graph, theirs: Graph) -> tuple[Graph, Graph]:
    """Both graphs in the normal form, ``ours`` (graphir's) at the sizes of ``theirs`` (llama.cpp's)."""
    return normal_form(ours, bind_sizes(ours, theirs)), normal_form(theirs)
