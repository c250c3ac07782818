"""Canonical forms of a graph: versioned JSON (primary, machine-read) and text (one line per node).

Both are byte-identical across runs, processes, hash seeds and machines: nodes come in emission order,
names are semantic, floats print as their shortest float32 spelling, and nothing records paths, ids or
times. The text form folds runs of layers that are identical up to their layer number into one ``...``
line, so a 126-layer graph reads like a 2-layer one and a deviating layer stands out; ``fold=False``
prints every layer. Both forms parse back into a verified :class:`~graphir.graph.ir.Graph`.
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from typing import Any, Iterable

import numpy as np

from graphir.graph.dims import Dim, DimDecl, Sym, parse_dim
from graphir.errors import GraphError
from graphir.graph.floats import f32
from graphir.graph.ir import Graph, Node, layer_of
from graphir.graph.ops import LEAVES

TEXT_MAGIC = "graphir graph"
FORMAT_VERSION = 1

# ---- values ----------------------------------------------------------------------------------------------

_BARE = re.compile(r"^[A-Za-z_][\w.]*$")


@lru_cache(maxsize=4096)
def _float(v: float) -> str:
    return str(np.float32(v))


def _attr(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return _float(v)
    if isinstance(v, (int, Sym)):
        return str(v)
    if isinstance(v, tuple):  # sizes, or per-layer values (floats as float32 prints them)
        return "[" + ", ".join(_float(x) if isinstance(x, float) else str(x) for x in v) + "]"
    if isinstance(v, str) and _BARE.match(v) and v not in ("true", "false", "inf", "nan"):
        return v
    return json.dumps(v)


_FLOAT = r"-?(\d+\.\d*(e[-+]?\d+)?|\d+e[-+]?\d+|inf|nan)"


def _parse_attr(s: str) -> Any:
    if s in ("true", "false"):
        return s == "true"
    if s.startswith("["):
        inner = s[1:-1].strip()
        return tuple(_parse_item(p.strip()) for p in inner.split(",")) if inner else ()
    if s.startswith('"'):
        return json.loads(s)
    if re.fullmatch(r"-?\d+", s):
        return int(s)
    if re.fullmatch(_FLOAT, s):
        return f32(float(s))
    if _BARE.match(s):
        return s
    return parse_dim(s)


def _parse_item(s: str) -> Any:
    """An element of a bracketed list: a float (a per-layer value) or a size."""
    return f32(float(s)) if re.fullmatch(_FLOAT, s) else parse_dim(s)


def _split_top(s: str) -> list[str]:
    """Split on commas outside brackets and quotes."""
    out, depth, cur, quoted = [], 0, [], False
    for ch in s:
        if ch == '"':
            quoted = not quoted
        elif not quoted and ch == "[":
            depth += 1
        elif not quoted and ch == "]":
            depth -= 1
        if ch == "," and depth == 0 and not quoted:
            out.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
    if "".join(cur).strip():
        out.append("".join(cur).strip())
    return out


def _type(n: Node) -> str:
    return f"{n.dtype}[{', '.join(map(str, n.shape))}]"


def _parse_type(s: str) -> tuple[str, tuple[Dim, ...]]:
    m = re.fullmatch(r"(\w+)\[(.*)\]", s.strip())
    if not m:
        raise ValueError(f"bad type {s!r}")
    inner = m.group(2).strip()
    return m.group(1), tuple(parse_dim(p.strip()) for p in inner.split(",")) if inner else ()


# ---- text ------------------------------------------------------------------------------------------------

def _attrs_text(attrs: dict[str, Any]) -> str:
    return " {" + ", ".join(f"{k}={_attr(v)}" for k, v in attrs.items()) + "}" if attrs else ""


def node_line(n: Node) -> str:
    if n.op == "weight":
        return f"weight %{n.name} : {_type(n)}"
    if n.op == "input":
        return f"input %{n.name} : {_type(n)}{_attrs_text(n.attrs)}"
    args = ", ".join("%" + i.name for i in n.inputs)
    return f"%{n.name} = {n.op}({args}){_attrs_text(n.attrs)} : {_type(n)}"


def _hparam(v: Any) -> str:
    """An hparams entry: a per-layer array prints without spaces, since entries are separated by them."""
    return "[" + ",".join(map(str, v)) + "]" if isinstance(v, tuple) else _attr(v)


def _header(g: Graph) -> list[str]:
    lines = [f"{TEXT_MAGIC} v{FORMAT_VERSION}"]
    for k in ("arch", "context", "phase"):
        if k in g.meta:
            lines.append(f"{k} {g.meta[k]}")
    if g.meta.get("hparams"):
        lines.append("hparams " + " ".join(f"{k}={_hparam(v)}" for k, v in g.meta["hparams"].items()))
    lines += [f"dim {d}" for d in g.dims]
    lines += [f"output {role} = %{n.name}" for role, n in g.outputs.items()]
    return lines


_BLK = re.compile(r"blk\.(\d+)\.")


def _generic(lines: list[str], il: int) -> str:
    """A layer's text with its own number as {i} and the previous layer's as {i-1}."""
    def sub(m: re.Match[str]) -> str:
        n = int(m.group(1))
        return "blk.{i}." if n == il else "blk.{i-1}." if n == il - 1 else m.group(0)

    return "\n".join(_BLK.sub(sub, line) for line in lines)


def to_text(g: Graph, fold: bool = True) -> str:
    out = _header(g)
    body: list[Node] = []
    for n in g.nodes:
        if n.op in LEAVES and n.layer is None:
            out.append(node_line(n))
        else:
            body.append(n)
    blocks: list[tuple[int | None, list[str]]] = []
    for n in body:
        il = n.layer
        if not blocks or blocks[-1][0] != il:
            blocks.append((il, []))
        blocks[-1][1].append(node_line(n))
    # A layer folds into "like blk.K" when its text equals layer K's with the layer numbers substituted;
    # K is the first printed layer of that shape, so one deviating layer leaves the rest folded.
    n_blocks: dict[int | None, int] = {}
    for il, _ in blocks:
        n_blocks[il] = n_blocks.get(il, 0) + 1
    printed: dict[str, int] = {}  # generic text -> first layer printed with it
    run: list[tuple[int, int]] = []  # (layer, like) of the current fold run

    def flush() -> None:
        if run:
            out.append(f"... blk.{run[0][0]}-{run[-1][0]} like blk.{run[0][1]}")
            run.clear()

    for il, lines in blocks:
        like = None
        if fold and il is not None and n_blocks[il] == 1:
            gen = _generic(lines, il)
            like = printed.get(gen)
            if like is None:
                printed[gen] = il
        if like is None:
            flush()
            out += lines
        else:
            if run and (run[-1][0] != il - 1 or run[-1][1] != like):
                flush()
            run.append((il, like))
    flush()
    return "\n".join(out) + "\n"


_FOLD = re.compile(r"^\.\.\. blk\.(\d+)-(\d+) like blk\.(\d+)$")
_OP_LINE = re.compile(r"^%(\S+) = (\w+)\((.*?)\)( \{.*\})? : (\S+\[.*\])$")
_LEAF_LINE = re.compile(r"^(input|weight) %(\S+) : (\S+\[[^\]]*\])( \{.*\})?$")


def from_text(text: str) -> Graph:
    """Parse the text form (folded or not) back into a verified graph."""
    try:
        return _from_text(text)
    except (ValueError, TypeError, KeyError, IndexError) as e:
        raise GraphError(f"malformed graph text ({type(e).__name__}: {e})") from None


def _from_text(text: str) -> Graph:
    lines = text.splitlines()
    if not lines or not lines[0].startswith(TEXT_MAGIC + " v"):
        raise GraphError(f"not a graphir text graph (first line {lines[0][:40]!r})" if lines else "empty graph text")
    version = lines[0][len(TEXT_MAGIC) + 2:]
    if version != str(FORMAT_VERSION):
        raise GraphError(f"graph text version {version} is not supported (this graphir reads v{FORMAT_VERSION})")
    meta: dict[str, Any] = {}
    dims: list[DimDecl] = []
    outputs: dict[str, str] = {}
    nodes: dict[str, Node] = {}
    by_layer: dict[int, list[str]] = {}

    def add(line: str, lineno: int) -> None:
        try:
            n = _parse_node(line, nodes)
        except (ValueError, KeyError) as e:
            raise GraphError(f"line {lineno}: {e}: {line[:120]}") from None
        if n.name in nodes:
            raise GraphError(f"line {lineno}: duplicate name %{n.name}")
        nodes[n.name] = n
        il = layer_of(n.name)
        if il is not None:
            by_layer.setdefault(il, []).append(line)

    for lineno, line in enumerate(lines[1:], 2):
        if not line or line.startswith("#"):
            continue
        word, _, rest = line.partition(" ")
        if word in ("arch", "context", "phase"):
            meta[word] = rest
        elif word == "hparams":
            bad = [kv for kv in rest.split() if "=" not in kv]
            if bad:
                raise GraphError(f"line {lineno}: bad hparams entry {bad[0]!r}")
            meta["hparams"] = {k: _parse_attr(v) for k, v in (kv.split("=", 1) for kv in rest.split())}
        elif word == "dim":
            m = re.fullmatch(r"(\w+) in \[(.+), (.+)\]", rest)
            if not m:
                raise GraphError(f"line {lineno}: bad dim line: {line}")
            dims.append(DimDecl(m.group(1), parse_dim(m.group(2)),
                                None if m.group(3) == "inf" else parse_dim(m.group(3))))
        elif word == "output":
            role, _, ref = rest.partition(" = %")
            outputs[role] = ref
        elif word == "...":
            m = _FOLD.match(line)
            if not m:
                raise GraphError(f"line {lineno}: bad fold line: {line}")
            first, last, like = map(int, m.groups())
            if like not in by_layer:
                raise GraphError(f"line {lineno}: fold refers to blk.{like}, which was not printed")
            gen = _generic(by_layer[like], like)
            for il in range(first, last + 1):
                for gl in gen.split("\n"):
                    add(gl.replace("{i}", str(il)).replace("{i-1}", str(il - 1)), lineno)
        else:
            add(line, lineno)
    return _finish(meta, dims, list(nodes.values()), outputs)


def _parse_node(line: str, nodes: dict[str, Node]) -> Node:
    m = _LEAF_LINE.match(line)
    if m:
        kind, name, typ, attrs = m.groups()
        dtype, shape = _parse_type(typ)
        a = {"tensor": name} if kind == "weight" else _parse_attrs(attrs)
        return Node(name, kind, (), a, dtype, shape)
    m = _OP_LINE.match(line)
    if not m:
        raise ValueError("not a node line")
    name, op, args, attrs, typ = m.groups()
    refs = [a.strip()[1:] for a in args.split(",")] if args.strip() else []
    undefined = [r for r in refs if r not in nodes]
    if undefined:
        raise ValueError(f"operand %{undefined[0]} is not defined before use")
    inputs = tuple(nodes[r] for r in refs)
    dtype, shape = _parse_type(typ)
    return Node(name, op, inputs, _parse_attrs(attrs), dtype, shape)


# Scalar attributes that are sizes: a bare name there is a dim (``offset=n_seq_tokens``), not a string.
_DIM_ATTRS = frozenset({"offset", "k", "s"})  # attributes that may be a size: a view's offset, a top-k's k, a scale


def _as_dim(k: str, v: Any) -> Any:
    return parse_dim(v) if k in _DIM_ATTRS and isinstance(v, str) else v


def _parse_attrs(s: str | None) -> dict[str, Any]:
    if not s:
        return {}
    out = {}
    for kv in _split_top(s.strip()[1:-1]):
        k, _, v = kv.partition("=")
        out[k.strip()] = _as_dim(k.strip(), _parse_attr(v.strip()))
    return out


def _finish(meta: dict[str, Any], dims: Iterable[DimDecl], nodes: list[Node], outputs: dict[str, str]) -> Graph:
    from graphir.graph.verify import verify

    by_name = {n.name: n for n in nodes}
    missing = [r for r in outputs.values() if r not in by_name]
    if missing:
        raise GraphError(f"output refers to unknown node %{missing[0]}")
    g = Graph(meta, tuple(dims), nodes, {k: by_name[v] for k, v in outputs.items()})
    verify(g)
    return g


# ---- JSON ------------------------------------------------------------------------------------------------

JSON_FORMAT = "graphir-graph"


def _jv(v: Any) -> Any:
    if isinstance(v, float):
        return float(_float(v))
    if isinstance(v, Sym):
        return str(v)
    if isinstance(v, tuple):
        return [_jv(x) for x in v]
    return v


def _dim_json(d: Dim) -> Any:
    return d if isinstance(d, int) else str(d)


def to_json(g: Graph) -> str:
    head = {
        "format": JSON_FORMAT,
        "version": FORMAT_VERSION,
        "meta": {k: ({kk: _jv(vv) for kk, vv in v.items()} if isinstance(v, dict) else v) for k, v in g.meta.items()},
        "dims": [{"name": d.name, "min": _dim_json(d.min), "max": None if d.max is None else _dim_json(d.max)}
                 for d in g.dims],
        "outputs": {k: n.name for k, n in g.outputs.items()},
    }
    rows = []
    for n in g.nodes:
        row: dict[str, Any] = {"name": n.name, "op": n.op}
        if n.inputs:
            row["inputs"] = [i.name for i in n.inputs]
        if n.attrs:
            row["attrs"] = {k: _jv(v) for k, v in n.attrs.items()}
        row["dtype"] = n.dtype
        row["shape"] = [_dim_json(d) for d in n.shape]
        rows.append(json.dumps(row))
    text = json.dumps(head, indent=1)
    return text[:-2] + ',\n "nodes": [\n  ' + ",\n  ".join(rows) + "\n ]\n}\n"


def _from_jv(v: Any) -> Any:
    if isinstance(v, float):
        return f32(v)
    if isinstance(v, list):
        return tuple(parse_dim(x) if isinstance(x, str) else x for x in v)
    return v


def from_json(text: str) -> Graph:
    """Parse the JSON form back into a verified graph."""
    try:
        return _from_json(text)
    except (ValueError, TypeError, KeyError, IndexError, AttributeError) as e:
        raise GraphError(f"malformed graph JSON ({type(e).__name__}: {e})") from None


def _from_json(text: str) -> Graph:
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise GraphError(f"not JSON: {e}") from None
    if not isinstance(doc, dict) or doc.get("format") != JSON_FORMAT:
        raise GraphError(f"not a graphir JSON graph (format {doc.get('format') if isinstance(doc, dict) else None!r})")
    if doc.get("version") != FORMAT_VERSION:
        raise GraphError(f"graph JSON version {doc.get('version')} is not supported "
                         f"(this graphir reads v{FORMAT_VERSION})")
    nodes: dict[str, Node] = {}
    try:
        for row in doc["nodes"]:
            inputs = tuple(nodes[i] for i in row.get("inputs", ()))
            attrs = {k: _as_dim(k, _from_jv(v)) for k, v in row.get("attrs", {}).items()}
            shape = tuple(parse_dim(d) if isinstance(d, str) else d for d in row["shape"])
            nodes[row["name"]] = Node(row["name"], row["op"], inputs, attrs, row["dtype"], shape)
        dims = [DimDecl(d["name"], parse_dim(str(d["min"])), None if d["max"] is None else parse_dim(str(d["max"])))
                for d in doc["dims"]]
    except KeyError as e:
        raise GraphError(f"graph JSON refers to unknown node or field {e}") from None
    meta = dict(doc.get("meta", {}))
    if "hparams" in meta:
        meta["hparams"] = {k: _from_jv(v) for k, v in meta["hparams"].items()}
    return _finish(meta, dims, list(nodes.values()), doc.get("outputs", {}))
