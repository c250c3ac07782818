"""The ``graphir`` command line: dump, diff, hash, check, archs, info, strip, run, convert.

Every user error (a :class:`~graphir.errors.GraphirError`, an unreadable or unwritable file, a bad option)
prints exactly one line ``graphir: error: <message>`` on stderr and exits 2; a traceback means a bug.
Output is byte-identical across runs: it holds no times and no paths but those the user typed. Output files
are written only once everything succeeded, through a temporary file renamed into place: a failed or
interrupted write leaves an existing file as it was.

Startup stays light: this module imports only the standard library and ``graphir.errors``; each command
imports what it needs (the model builder, the forms, the GGUF reader) when it runs.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from typing import Any, Callable, NoReturn, Sequence

from graphir.errors import GraphirError

PROG = "graphir"
log = logging.getLogger("graphir.cli")
PHASES = ("prefill", "decode", "encode")  # mirrors graphir.model.builder.PHASES
FORMATS = ("text", "json", "dot", "svg")
OUTTYPES = ("f32", "f16")  # mirrors graphir.convert.OUTTYPES
SVG_MAX_LAYERS = 8  # what Graphviz lays out in under a minute
CACHE_TYPES = ("f16", "f32")  # mirrors graphir.memory.kv.CACHE_DTYPES


class UsageError(Exception):
    """A bad command line, reported like any other user error."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # argparse would print usage and exit; we report one line
        raise UsageError(message)


# ---- output ------------------------------------------------------------------------------------------------


def _emit(text: str, path: str | None = None) -> None:
    """Write a command's whole output to stdout or, when given, to a file: all at once, through a temporary file
    renamed into place, so that a failed or interrupted write leaves the file as it was."""
    if path is None:
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    from graphir.files.atomic import write_atomic

    try:
        write_atomic(path, text)
    except OSError as e:
        raise GraphirError(f"{path}: cannot write ({e.strerror or e})") from None


def _float(v: float) -> str:
    import numpy as np

    return str(np.float32(v))  # the spelling the graph forms use: 1e-05, not 9.999999747378752e-06


def _value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return _float(v)
    return str(v)


def _json_value(v: Any) -> Any:
    return float(_float(v)) if isinstance(v, float) else v


def _table(rows: list[list[str]], right: frozenset[int] | set[int] = frozenset(), indent: str = "  ") -> list[str]:
    """Columns padded to their widest cell; columns in ``right`` are right-aligned (numbers)."""
    if not rows:
        return []
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    out = []
    for r in rows:
        cells = [c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))]
        out.append((indent + "  ".join(cells)).rstrip())
    return out


def _size(nbytes: int) -> str:
    """Bytes in binary units, as llama.cpp prints its buffers (MiB)."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.2f} {unit}"
    return f"{nbytes} B"


def _count(n: int) -> str:
    """A count in thousands, millions or billions (llama.cpp's model params line: 134.52 M)."""
    for unit, scale in (("B", 10**9), ("M", 10**6), ("K", 10**3)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return str(n)


def _n(count: int, word: str) -> str:
    return f"{count} {word}" + ("" if count == 1 else "s")


# ---- commands ----------------------------------------------------------------------------------------------


def cmd_dump(args: argparse.Namespace) -> int:
    from graphir.source import load_graph

    if args.layers is not None and args.format not in ("dot", "svg"):
        raise UsageError(f"--layers applies only to --format dot and svg (not {args.format})")
    if args.full and args.format != "text":
        raise UsageError(f"--full applies only to --format text (not {args.format})")
    g = load_graph(args.src, args.context, args.phase)
    if args.format == "text":
        from graphir.graph.forms import to_text

        out = to_text(g, fold=not args.full)
    elif args.format == "json":
        from graphir.graph.forms import to_json

        out = to_json(g)
    else:
        from graphir.graph.dot import parse_layers, to_dot, to_svg

        layers = None
        if args.layers is not None:
            try:
                layers = parse_layers(args.layers, g.n_layer)
            except ValueError as e:
                raise UsageError(f"bad --layers '{args.layers}': {e}") from None
        drawn = g.n_layer if layers is None else layers[1] - layers[0]
        if args.format == "svg" and drawn > SVG_MAX_LAYERS:  # before Graphviz spends minutes on it
            raise UsageError(f"--format svg of {_n(drawn, 'layer')}: Graphviz's layout time grows fast with the "
                             f"layers (8: about 40 s, 16: over 5 minutes); draw at most {SVG_MAX_LAYERS} with "
                             f"--layers, e.g. --layers 0:2 (layers 0 and 1), or write --format dot")
        out = to_dot(g, layers)
        if args.format == "svg":
            out = to_svg(out)
    if not out.endswith("\n"):
        out += "\n"
    _emit(out, args.output)
    return 0


def _load_pair(a: str, b: str, context: str | None, phase: str | None) -> tuple[Any, Any]:
    """Both graphs of a diff, built for the same (context, phase).

    Unless told otherwise, a model compared with a saved graph is built for the saved graph's context and
    phase, so ``graphir diff golden.txt SmolLM2-135M`` compares like with like.
    """
    from graphir.graph.ir import Graph
    from graphir.llamacpp import strip_prefix
    from graphir.source import load_graph, open_source

    if strip_prefix(a) is not None or strip_prefix(b) is not None:
        return _load_llamacpp_pair(a, b, context, phase)
    srcs = [open_source(a), open_source(b)]
    saved = next((s for s in srcs if isinstance(s, Graph)), None)
    model_context, model_phase = context, phase  # None: each model's default
    if saved is not None:
        model_context = context or saved.meta.get("context")
        model_phase = phase or saved.meta.get("phase")
    graphs = []
    for label, s in zip((a, b), srcs):
        if isinstance(s, Graph):
            graphs.append(load_graph(label, context, phase))  # checks explicit context/phase against the saved
        else:
            graphs.append(s.build_graph(model_context, model_phase))
    return graphs[0], graphs[1]


def _load_llamacpp_pair(a: str, b: str, context: str | None, phase: str | None) -> tuple[Any, Any]:
    """graphir's graph of a model (or a saved graph) against llama.cpp's, both in the normal form
    (graphir.llamacpp.normalize), the model's built for the memory llama.cpp gave it and its context's cells
    (Phi-3's LongRoPE picks its factors by them); two llama.cpp graphs as they are."""
    from graphir.graph.ir import Graph
    from graphir.llamacpp import strip_prefix
    from graphir.llamacpp.normalize import compare_forms
    from graphir.llamacpp.reading import N_CTX
    from graphir.source import DEFAULT_PHASE, load_graph, open_source

    llama_first = strip_prefix(a) is not None
    if llama_first and strip_prefix(b) is not None:
        return load_graph(a, context, phase), load_graph(b, context, phase)
    ours_src, theirs_src = (b, a) if llama_first else (a, b)
    ours_obj = open_source(ours_src)
    if isinstance(ours_obj, Graph):
        ours = load_graph(ours_src, context, phase)  # checks an explicit context or phase against the saved ones
        theirs = load_graph(theirs_src, context, phase or ours.meta.get("phase"))
    else:
        theirs = load_graph(theirs_src, context, phase)
        ours = ours_obj.build_graph(theirs.meta["context"], phase or DEFAULT_PHASE, n_ctx_seq=N_CTX)
    normal_ours, normal_theirs = compare_forms(ours, theirs)
    return (normal_theirs, normal_ours) if llama_first else (normal_ours, normal_theirs)


def cmd_diff(args: argparse.Namespace) -> int:
    from graphir.graph.diff import diff_graphs

    ga, gb = _load_pair(args.a, args.b, args.context, args.phase)
    d = diff_graphs(ga, gb, args.a, args.b)
    where = None
    if "origin" in ga.meta:  # graphs in llama.cpp's normal form: say the first difference's own names too
        from graphir.llamacpp.compare import origins

        where = origins(d.first, ga, gb)
    if args.json:
        doc = d.as_dict()
        if where is not None:
            doc["first_named"] = {"a": where[0], "b": where[1]}
        out = json.dumps(doc, indent=2, ensure_ascii=False) + "\n"
    else:
        out = d.render()
        if where is not None:
            line = f"first mismatch: {d.first}"
            out = out.replace(line, f"{line}\n  named %{where[0]} in {args.a}, %{where[1]} in {args.b}", 1)
        if out and not out.endswith("\n"):
            out += "\n"
    _emit(out)
    return 0 if d.same else 1


def cmd_hash(args: argparse.Namespace) -> int:
    from graphir.graph.hashing import graph_hash
    from graphir.source import load_graph

    _emit(graph_hash(load_graph(args.src, args.context, args.phase)) + "\n")
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    from graphir.source import open_model

    m = open_model(args.model, "check")
    problems = m.arch.check(m.tensors)
    name = m.arch.name
    if not problems:
        _emit(f"ok: {_n(len(m.tensors), 'tensor')} match {name}\n")
        return 0
    _emit("\n".join(problems) + f"\n{_n(len(problems), 'problem')}: {args.model} does not match {name} "
          f"({_n(len(m.tensors), 'tensor')} declared)\n")
    return 1


def cmd_archs(args: argparse.Namespace) -> int:
    if args.census:
        return _census()
    from gguf import Keys

    from graphir import arch as archs
    from graphir.model import presets

    from graphir.model.tower import FILE_ARCH, projector_of

    towers = archs.towers()
    lines = ["architectures:"]
    lines += _table([[n, f"rope={archs.get(n).rope_mode}"] for n in archs.names()])
    lines.append("towers (mmproj files):")
    lines += _table([[n, f"projector={projector_of(n)}", archs.get(n).modality] for n in towers])
    lines.append("presets:")
    rows = []
    for name, p in presets.all_presets().items():
        stack = f"{FILE_ARCH}.{archs.get(p.arch).modality}" if p.arch in towers else p.arch
        n_layer = p.metadata().get(Keys.LLM.BLOCK_COUNT.format(arch=stack))
        rows.append([name, p.arch, _n(int(n_layer), "layer") if n_layer is not None else "?"])
    lines += _table(rows)
    _emit("\n".join(lines) + "\n")
    return 0


def _census() -> int:
    from graphir.llamacpp.census import census

    entries = census()
    rows = [[e.arch, "graphir" if e.graphir else "-", e.preset or "", e.verdict] for e in entries]
    ours = [e for e in entries if e.graphir]
    agree = sum(1 for e in ours if e.verdict.startswith("agrees"))
    lines = [f"llama.cpp knows {_n(len(entries), 'architecture')}; graphir has {len(ours)}, and on {agree} of them "
             f"builds the graph llama.cpp builds"]
    _emit("\n".join(lines + _table(rows)) + "\n")
    return 0


def _tensor_rows(src_obj: Any) -> tuple[str, list[dict[str, Any]]]:
    """(kind, tensors) of a model or saved graph: name, type, shape, params, bytes and (GGUF only) offset."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    from graphir.graph.ir import Graph

    def nbytes(dtype: GGMLQuantizationType, shape: tuple[int, ...]) -> int | None:
        block, size = GGML_QUANT_SIZES[dtype]
        n = 1
        for d in shape:
            n *= d
        return n // block * size if (not shape or shape[0] % block == 0) else None

    rows = []
    if isinstance(src_obj, Graph):
        for w in src_obj.weights:
            shape = tuple(w.shape)
            dtype = GGMLQuantizationType[w.dtype.upper()]
            n = 1
            for d in shape:
                n *= d
            rows.append({"name": w.name, "type": w.dtype, "shape": list(shape), "params": n,
                         "bytes": nbytes(dtype, shape)})
        return "graph", rows
    for t in src_obj.tensors.values():
        row: dict[str, Any] = {"name": t.name, "type": t.dtype.name.lower(), "shape": list(t.shape),
                               "params": t.n_elements, "bytes": nbytes(t.dtype, tuple(t.shape))}
        if src_obj.header is not None:
            row["offset"] = t.offset
        rows.append(row)
    from graphir.model.presets import all_presets

    kind = "gguf" if src_obj.header is not None else "preset" if src_obj.label in all_presets() else "hf-config"
    return kind, rows


def cmd_info(args: argparse.Namespace) -> int:
    from graphir.graph.ir import Graph
    from graphir.source import open_source

    s = open_source(args.src)
    kind, tensors = _tensor_rows(s)
    info: dict[str, Any] = {"source": args.src, "kind": kind}
    if isinstance(s, Graph):
        arch_name = s.meta.get("arch")
        hparams = dict(s.meta.get("hparams", {}))
        info["context"], info["phase"] = s.meta.get("context"), s.meta.get("phase")
        rope = None
        if isinstance(arch_name, str):
            from graphir import arch as archs

            if arch_name in archs.names():
                rope = archs.get(arch_name).rope_mode
    else:
        a = s.arch
        arch_name, rope, hparams = a.name, a.rope_mode, a.hp.as_dict()
        if s.header is not None:
            h = s.header
            info["gguf"] = {"version": h.version, "metadata_keys": len(h.metadata), "header_bytes": h.header_end,
                            "data_start": h.data_start, "file_bytes": h.file_size, "header_only": h.header_only}
    if not isinstance(s, Graph):
        info["memory"] = _memory_info(s, args)
    info["arch"] = arch_name
    info["rope_mode"] = rope
    info["hparams"] = {k: _json_value(v) for k, v in hparams.items()}
    info["tensors"] = tensors
    info["n_tensors"] = len(tensors)
    info["total_params"] = sum(t["params"] for t in tensors)
    n_expert, n_used = hparams.get("n_expert", 0), hparams.get("n_expert_used", 0)
    active = _active_params(hparams, tensors)
    if active is not None:
        info["active_params"] = active
    known = [t["bytes"] for t in tensors if t["bytes"] is not None]
    info["total_bytes"] = sum(known)
    from graphir.running.backend import get

    num = get().numerics()
    info["numerics"] = {"path": num.path.name, "host": num.host, "exact": num.exact, "chosen_by": num.chosen_by}

    if args.json:
        _emit(json.dumps(info, indent=2, ensure_ascii=False) + "\n")
        return 0

    lines = [f"source   {args.src} ({kind})"]
    if "gguf" in info:
        gi = info["gguf"]
        lines.append(f"gguf     v{gi['version']}, {_n(gi['metadata_keys'], 'metadata key')}, header "
                     f"{gi['header_bytes']} bytes, file {gi['file_bytes']} bytes"
                     + (" (header only)" if gi["header_only"] else ""))
    if kind == "graph":
        lines.append(f"graph    context {info['context']}, phase {info['phase']}")
    lines.append(f"arch     {arch_name}" + (f" (rope {rope})" if rope else ""))
    lines.append(f"numerics {num.describe()}")
    lines.append("hparams")
    lines += _table([[k, _value(v)] for k, v in hparams.items() if k != "arch"])
    lines.append(f"tensors  {len(tensors)}")
    header = ["name", "type", "shape", "params", "bytes"]
    gguf_file = kind == "gguf"
    if gguf_file:
        header.append("offset")
    rows = [header]
    for t in tensors:
        row = [t["name"], t["type"], "[" + ", ".join(map(str, t["shape"])) + "]", str(t["params"]),
               "?" if t["bytes"] is None else str(t["bytes"])]
        if gguf_file:
            row.append(str(t["offset"]))
        rows.append(row)
    lines += _table(rows, right={3, 4, 5})
    lines.append(f"total    {info['total_params']} parameters, {info['total_bytes']} bytes "
                 f"in {_n(len(tensors), 'tensor')}")
    if "active_params" in info:
        lines.append(f"active   {info['active_params']} parameters per token ({n_used} of {n_expert} experts)")
    if "memory" in info:
        m = info["memory"]
        lines.append(f"memory   {m['kind']} at n_ctx {m['n_ctx']}, n_seq_max {m['n_seq_max']}, n_ubatch {m['n_ubatch']}"
                     + (", swa_full" if m["swa_full"] else "") + f": {m['bytes']} bytes")
        rows = [["size", "cells", "buffers", "bytes"]]
        rows += [[dim, str(p["cells"]), str(p["buffers"]), str(p["bytes"])] for dim, p in m["parts"].items()]
        lines += _table(rows, right={1, 2, 3})
    _emit("\n".join(lines) + "\n")
    return 0


def _active_params(hparams: dict[str, Any], tensors: list[dict[str, Any]]) -> int | None:
    """The parameters a token runs in a mixture of experts (None for a dense model): a token runs n_used of each
    layer's n_expert stacked experts (``*_exps``: matrices [n_embd, n_ff, n_expert] and, in gpt-oss, their biases
    [n_ff, n_expert]), and every other tensor (the router and shared experts included)."""
    n_expert, n_used = hparams.get("n_expert", 0), hparams.get("n_expert_used", 0)
    if not n_expert:
        return None
    routed = sum(t["params"] for t in tensors if "_exps." in t["name"] and t["shape"][-1] == n_expert)
    return sum(t["params"] for t in tensors) - routed + routed // n_expert * n_used


def cmd_stats(args: argparse.Namespace) -> int:
    from graphir.graph.cost import flops, substitute
    from graphir.source import open_model

    m = open_model(args.src, "stats")
    _, tensors = _tensor_rows(m)
    hparams = m.arch.hp.as_dict()
    by_type: dict[str, dict[str, int]] = {}
    for t in tensors:
        row = by_type.setdefault(t["type"], {"tensors": 0, "params": 0, "bytes": 0})
        row["tensors"] += 1
        row["params"] += t["params"]
        row["bytes"] += t["bytes"] or 0
    memory = _memory_info(m, argparse.Namespace(n_ctx=args.n_ctx, n_seq_max=1, n_ubatch=512, swa_full=False,
                                                 cache_type_k=args.cache_type_k, cache_type_v=args.cache_type_v))
    for part in memory["parts"].values():
        part["bytes_per_cell"] = part["bytes"] // part["cells"] if part["cells"] else 0
    cost = {}
    for context, phase in m.graph_kinds():
        if context == memory["kind"]:  # a decode step is one token and one output
            f = flops(m.build_graph(context, phase))
            cost[phase] = str(substitute(f, {"n_tokens": 1, "n_outputs": 1}) if phase == "decode" else f)
    stats = {"source": args.src, "arch": m.arch.name, "params": sum(t["params"] for t in tensors),
             "active_params": _active_params(hparams, tensors), "weight_bytes": sum(r["bytes"] for r in by_type.values()),
             "weights": dict(sorted(by_type.items())), "memory": memory, "flops": cost}
    if args.json:
        _emit(json.dumps(stats, indent=2) + "\n")
        return 0
    weights, mem = stats["weight_bytes"], memory["bytes"]
    lines = [f"source   {args.src}", f"arch     {m.arch.name}",
             f"params   {_count(stats['params'])} ({stats['params']})"
             + (f", {_count(stats['active_params'])} per token ({stats['active_params']})"
                if stats["active_params"] is not None else ""),
             f"weights  {_size(weights)} ({weights} bytes)"]
    lines += _table([[k, _n(r["tensors"], "tensor"), f"{_count(r['params'])} params", _size(r["bytes"])]
                     for k, r in stats["weights"].items()], right={3})
    cache = f", cache {args.cache_type_k}/{args.cache_type_v}" if memory["kind"] != "none" else ""
    lines.append(f"memory   {memory['kind']}, n_ctx {memory['n_ctx']}{cache}: {_size(mem)} ({mem} bytes)")
    lines += _table([[dim, f"{p['cells']} cells", f"{_size(p['bytes_per_cell'])} per cell", _size(p["bytes"])]
                     for dim, p in memory["parts"].items()], right={3})
    lines.append(f"total    {_size(weights + mem)} ({weights + mem} bytes) of weights and memory; a running "
                 f"process holds more (README: What a run holds)")
    lines.append("flops    of the matrix products, in the graph's sizes (decode: one token)")
    lines += _table([[phase, f] for phase, f in cost.items()])
    _emit("\n".join(lines) + "\n")
    return 0


def _memory_info(meta: Any, args: argparse.Namespace) -> dict[str, Any]:
    """What the model's memory holds in a context of the given sizes (default kind and cache types), read off
    the decode graph and the memory's own sizing; nothing is allocated."""
    from graphir.memory.kinds import KINDS, assemble, footprint
    from graphir.memory.layers import ContextParams

    arch = meta.arch
    kind = arch.contexts[0]
    n_ctx = min(arch.hp.n_ctx_train, 4096) if args.n_ctx is None else args.n_ctx or arch.hp.n_ctx_train
    types = (getattr(args, "cache_type_k", "f16"), getattr(args, "cache_type_v", "f16"))  # info: the defaults
    params = ContextParams(n_ctx, args.n_seq_max, args.n_ubatch, *types, swa_full=args.swa_full, buffers=False)
    phase = "decode" if "decode" in KINDS[kind].phases else meta.default_phase
    parts = footprint(meta.build_graph(kind, phase), assemble(kind, arch.needs, params))
    return {"kind": kind, "n_ctx": n_ctx, "n_seq_max": args.n_seq_max, "n_ubatch": args.n_ubatch,
            "swa_full": args.swa_full, "bytes": sum(b for _, _, b in parts.values()),
            "parts": {dim: {"cells": c, "buffers": k, "bytes": b} for dim, (c, k, b) in parts.items()}}


def cmd_strip(args: argparse.Namespace) -> int:
    from graphir.files.gguf_file import read_header, strip

    src_size = read_header(args.model).file_size  # fails (one line) before anything is written
    h = strip(args.model, args.output)
    pct = 100.0 * h.file_size / src_size if src_size else 100.0
    _emit(f"wrote {args.output}: {h.file_size} of {src_size} bytes kept ({pct:.2f}%): header only, "
          f"{_n(len(h.metadata), 'metadata key')}, {_n(len(h.tensors), 'tensor')}\n")
    return 0


def _warm_up(model: Any, quiet: bool) -> None:
    """Compile (a first run, with a progress line on a terminal) or load the kernels of the prompt and the
    generation, and prepare the weights, before anything is timed."""
    from graphir.progress import stream
    from graphir.running.warm_up import warm_up

    warm_up(model, stream(quiet))


def _model_path(args: argparse.Namespace) -> str:
    """The model, given as llama.cpp's ``-m FILE`` or as the first argument."""
    if args.model and args.model_option and args.model != args.model_option:
        raise UsageError(f"two models given: {args.model} and -m {args.model_option}")
    path = args.model or args.model_option
    if not path:
        raise UsageError("the model is missing: give MODEL.gguf or -m MODEL.gguf")
    return path


def _prompt_text(args: argparse.Namespace) -> str:
    """The prompt of ``-p TEXT`` or ``-f FILE`` (one of the two)."""
    if (args.prompt is None) == (args.file is None):
        raise UsageError("give the prompt with -p TEXT or -f FILE (one of the two)")
    if args.prompt is not None:
        return str(args.prompt)
    try:
        with open(args.file, encoding="utf-8") as f:
            return f.read()
    except OSError as e:
        raise GraphirError(f"{args.file}: cannot read ({e.strerror or e})") from None
    except UnicodeDecodeError as e:
        raise GraphirError(f"{args.file}: not UTF-8 text ({e.reason} at byte {e.start})") from None


def _load_for_generation(args: argparse.Namespace, temp: float) -> tuple[Any, Any, float]:
    """The model, warmed up, and a generation in a context sized by the options; the seconds all that took."""
    import time

    from graphir.running.backend import get
    from graphir.running.runtime import load

    t0 = time.perf_counter()
    if args.threads is not None:
        get(args.backend).set_threads(args.threads)
    model = load(_model_path(args), None if args.isa == "auto" else args.isa, args.backend)
    log.info("numerics: %s", model.numerics.describe())
    n_ctx = args.ctx_size if args.ctx_size is not None else min(model.hparams.n_ctx_train, 4096)
    mmproj = getattr(args, "mmproj", None)
    ctx = model.new_context(n_ctx=n_ctx or model.hparams.n_ctx_train, n_batch=args.batch_size,
                            n_ubatch=args.ubatch_size, type_k=args.cache_type_k, type_v=args.cache_type_v,
                            **({"mmproj": mmproj} if mmproj else {}))
    media, ctx = (ctx, ctx.text) if mmproj else (None, ctx)
    log.info("context: %d cells, batch %d, ubatch %d, cache %s/%s", ctx.n_ctx, ctx.n_batch,
             getattr(ctx, "n_ubatch", args.ubatch_size), args.cache_type_k, args.cache_type_v)
    generation = _generation(model, ctx, args, temp)  # refused for an embedding model, before compiling
    generation.media = media  # the tower beside the context, for a prompt with pictures (run --mmproj)
    _warm_up(model, args.quiet)  # before timing the prompt
    return model, generation, time.perf_counter() - t0


def _generation(model: Any, ctx: Any, args: argparse.Namespace, temp: float) -> Any:
    from graphir.running.sampling import Sampling

    sampling = Sampling(temperature=temp, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p,
                        repeat_penalty=args.repeat_penalty, seed=None if args.seed == -1 else args.seed)
    n_keep = args.keep if args.keep >= 0 else ctx.n_ctx  # -1: all of the first text
    return model.generation(ctx, sampling, n_keep + (model.vocab.bos is not None and model.vocab.add_bos),
                            shift=not args.no_context_shift)


class Timings:
    """What llama.cpp's tools print when they end: load, prompt and generation, tokens and speed (on stderr)."""

    def __init__(self, load_s: float):
        self.load_s, self.prompt_tokens, self.prompt_s, self.gen_tokens, self.gen_s = load_s, 0, 0.0, 0, 0.0

    def add(self, stats: dict[str, Any]) -> None:
        self.prompt_tokens += int(stats.get("prompt_tokens", 0))
        self.prompt_s += float(stats.get("prompt_s", 0.0))
        self.gen_tokens += int(stats.get("gen_tokens", 0))
        self.gen_s += float(stats.get("gen_s", 0.0))

    def line(self) -> str:
        return (f"load: {self.load_s:.2f} s; prompt: {self.prompt_tokens} tokens, "
                f"{_rate(self.prompt_tokens, self.prompt_s)}; generation: {self.gen_tokens} tokens, "
                f"{_rate(self.gen_tokens, self.gen_s)}\n")


def _feed(generation: Any, ids: list[int], args: argparse.Namespace, stats: dict[str, Any]) -> None:
    """Decode a text into the context, drawing a bar of its tokens on a terminal when it takes several batches."""
    import time

    from graphir.progress import counting, stream

    out = stream(args.quiet) if len(ids) > generation.ctx.n_batch else None
    bar = counting(out, len(ids), "prompt")
    t0 = time.perf_counter()
    try:
        generation.feed(ids, bar.update)
    finally:
        bar.close()
        stats.update(prompt_tokens=stats.get("prompt_tokens", 0) + len(ids),
                     prompt_s=stats.get("prompt_s", 0.0) + time.perf_counter() - t0)


def _feed_chunks(generation: Any, media: Any, chunks: list[Any], stats: dict[str, Any]) -> None:
    """Decode a prompt with pictures: its text and its images' rows (counted as prompt positions)."""
    import time

    t0 = time.perf_counter()
    generation.feed_chunks(media, chunks)
    stats.update(prompt_tokens=stats.get("prompt_tokens", 0) + sum(len(c) for c in chunks),
                 prompt_s=stats.get("prompt_s", 0.0) + time.perf_counter() - t0)


def _stream_reply(generation: Any, max_tokens: int | None, stats: dict[str, Any], bar: Any = None,
                  pieces: list[str] | None = None) -> None:
    """Write the reply to stdout as it comes, its pieces also into ``pieces``."""
    pieces = [] if pieces is None else pieces
    reply = generation.reply(max_tokens, stats)
    try:
        for piece in reply:
            pieces.append(piece)
            sys.stdout.write(piece)
            sys.stdout.flush()
            if bar is not None:
                bar.update(1)  # one piece per token that completed a character: exact once the run ends
    finally:
        reply.close()


def _context_full(generation: Any) -> None:
    if generation.full:
        log.warning("%s: generation stopped; a larger -c/--ctx-size holds more", generation.full)


def cmd_run(args: argparse.Namespace) -> int:
    """llama.cpp's completion: the prompt echoed, its continuation streamed, the timings on stderr at the end,
    however it ends (Ctrl-C included: then exit 130)."""
    from graphir.progress import counting, stream

    text = _prompt_text(args)
    if args.image and not args.mmproj:
        raise UsageError("--image needs --mmproj MMPROJ.gguf (the file of the model's vision tower)")
    if args.audio and not args.mmproj:
        raise UsageError("--audio needs --mmproj MMPROJ.gguf (the file of the model's audio tower)")
    model, generation, load_s = _load_for_generation(args, args.temp)
    media, chunks = generation.media, []
    if media is not None:
        from graphir.running.multimodal import MARKER

        files = args.image + args.audio  # the tower reads each as its kind of media
        if MARKER not in text:  # llama.cpp's mtmd-cli: a marker before the prompt for each picture
            text = MARKER * len(files) + text
        chunks = media.tokenize(text, files)
        ids = [t for c in chunks if c.rows is None for t in c.tokens]
    else:
        ids = model.tokenize(text, add_special=True, parse_special=True)
    if not ids:
        raise GraphirError("the prompt has no tokens")
    timings, stats = Timings(load_s), {}
    n = None if args.n_predict == -1 else args.n_predict
    # the text streaming to a terminal shows the generation's progress; text going to a file or a pipe does not,
    # so then a bar of the tokens generated is drawn on stderr (when that is a terminal)
    bar = counting(None if sys.stdout.isatty() else stream(args.quiet), n, "generating")
    try:
        if args.display_prompt:
            sys.stdout.write(text)
            sys.stdout.flush()
        if media is not None:
            _feed_chunks(generation, media, chunks, stats)
        else:
            _feed(generation, ids, args, stats)
        _stream_reply(generation, n, stats, bar)
    finally:
        bar.close()
        sys.stdout.write("\n")
        sys.stdout.flush()
        timings.add(stats)
        sys.stderr.write(timings.line())
    _context_full(generation)
    return 0


def _template_source(path: str | None) -> str | None:
    """The text of a --chat-template FILE."""
    if path is None:
        return None
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError as e:
        raise GraphirError(f"{path}: cannot read ({e.strerror or e})") from None


def cmd_chat(args: argparse.Namespace) -> int:
    """A conversation on stdin: each line is the user's next message; each reply streams to stdout, then a blank
    line. The context holds the conversation as llama.cpp's chat does: each message adds only its own tokens, a
    full context shifts (or, where it cannot, the chat ends with a message), a reply stops at -n tokens, Ctrl-C
    stops the reply being written (another Ctrl-C, at the prompt, ends the chat)."""
    template_source = _template_source(args.chat_template)
    from graphir.running.conversation import Conversation

    from graphir.running.generation import ContextFull

    model, generation, load_s = _load_for_generation(args, args.temp)
    template = model.chat_template(template_source)  # a model without one fails here, before the first message
    conversation, timings = Conversation(generation, template, args.system), Timings(load_s)
    n = None if args.n_predict == -1 else args.n_predict
    tty = sys.stdin.isatty()
    try:
        while True:
            if tty:
                sys.stderr.write("> ")
                sys.stderr.flush()
            line = sys.stdin.readline()
            if not line:
                return 0
            if not line.strip():
                continue
            stats: dict[str, Any] = {}
            pieces: list[str] = []
            try:
                conversation.ask(line.rstrip("\n"), lambda ids: _feed(generation, ids, args, stats))
                try:
                    _stream_reply(generation, n, stats, pieces=pieces)
                finally:
                    conversation.answer("".join(pieces))
            except KeyboardInterrupt:  # the reply stops; the conversation goes on
                pass
            except ContextFull as e:
                log.warning("%s: the chat ends here (a larger -c/--ctx-size holds more)", e)
                return 0
            finally:
                timings.add(stats)
                sys.stdout.write("\n\n")
                sys.stdout.flush()
            if generation.full:
                _context_full(generation)
                return 0
    finally:
        sys.stderr.write(timings.line())


def cmd_serve(args: argparse.Namespace) -> int:
    """llama-server's OpenAI-compatible endpoints over one context of --parallel sequences, decoded together."""
    from graphir.running.backend import get
    from graphir.running.runtime import load
    from graphir.serving import server

    if args.threads is not None:
        get(args.backend).set_threads(args.threads)
    model = load(_model_path(args), None if args.isa == "auto" else args.isa, args.backend)
    log.info("numerics: %s", model.numerics.describe())
    n_ctx = args.ctx_size if args.ctx_size is not None else min(model.hparams.n_ctx_train, 4096)
    svc = server.service(model, n_ctx or model.hparams.n_ctx_train, args.parallel, args.batch_size,
                         args.ubatch_size, args.cache_type_k, args.cache_type_v, args.queue_size, args.alias,
                         _template_source(args.chat_template), args.pooling)

    def announce(url: str) -> None:
        sys.stderr.write(f"graphir: serving {svc.name} on {url} ({args.parallel} slots of {svc.n_ctx_seq} "
                         f"cells each)\n")
        sys.stderr.flush()

    server.run(svc, args.host, args.port, announce,  # kernels compiled and first run on the scheduler's thread
               None if svc.embedding else lambda: _warm_up(model, args.quiet))
    return 0


def cmd_embed(args: argparse.Namespace) -> int:
    import numpy as np

    from graphir.progress import stream
    from graphir.batch import Batch
    from graphir.running.runtime import load

    model = load(args.model, None if args.isa == "auto" else args.isa, args.backend)
    log.info("numerics: %s", model.numerics.describe())
    encoder = "encoder" if model.arch.encoder_stack is not None else None  # an encoder-decoder: its encoder's output
    ctx = model.new_context(kind=encoder, n_ctx=args.ctx_size or None, pooling=args.pooling, embeddings=True,
                            n_seq_max=len(args.prompt))
    tokens = [model.tokenize(text, add_special=True, parse_special=True) for text in args.prompt]
    for text, ids in zip(args.prompt, tokens):
        if len(ids) > ctx.n_ctx:
            raise GraphirError(f"prompt {text[:40]!r} has {len(ids)} tokens, more than the context's {ctx.n_ctx} "
                               f"positions (n_ctx)")
    rows = []
    with model.backend.compiling(stream(args.quiet)):
        for s, ids in enumerate(tokens):  # one sequence per prompt, each in its own batch
            ctx.decode(Batch(np.asarray(ids), np.arange(len(ids)), [(s,)] * len(ids), np.ones(len(ids), bool)))
            rows.append(ctx.embeddings_seq(s) if ctx.pooling != "none" else ctx.embeddings()[-1])
    for v in rows:
        if args.normalize:
            v = v / max(float(np.linalg.norm(v.astype(np.float64))), 1e-12)
        _emit(" ".join(f"{x:.6f}" for x in v) + "\n")
    return 0


def cmd_convert(args: argparse.Namespace) -> int:
    from graphir.convert import convert_bert
    from graphir.files.gguf_file import read_header
    from graphir.progress import stream

    h = read_header(convert_bert(args.src, args.output, args.outtype, progress=stream(args.quiet)))
    _emit(f"wrote {args.output}: {h.architecture}, {_n(len(h.tensors), 'tensor')}, {h.file_size} bytes, "
          f"matrices {args.outtype}\n")
    return 0


def _rate(n: float, seconds: float) -> str:
    return f"{n / seconds:.1f} tokens/s" if seconds > 0 and n else "- tokens/s"


# ---- parser ------------------------------------------------------------------------------------------------


def _whole(least: int) -> Callable[[str], int]:
    """An argparse type: a whole number of at least ``least`` (argparse names the option in the error)."""
    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"takes a whole number, not {text!r}") from None
        if v < least:
            raise argparse.ArgumentTypeError(f"must be at least {least}, not {v}")
        return v
    return parse


def _real(low: float, high: float | None = None, low_open: bool = False) -> Callable[[str], float]:
    """An argparse type: a number from ``low`` (excluded with ``low_open``) to ``high`` (argparse names the option in the error)."""
    import math

    def parse(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"takes a number, not {text!r}") from None
        if math.isnan(v) or v < low or (low_open and v == low) or (high is not None and v > high):
            span = (f"in {'(' if low_open else '['}{low:g}, {high:g}]" if high is not None
                    else f"{'above' if low_open else 'at least'} {low:g}")
            raise argparse.ArgumentTypeError(f"must be {span}, not {text}")
        return v
    return parse


def _sampling_options(p: argparse.ArgumentParser, temp: float) -> None:
    p.add_argument("--temp", type=_real(0), default=temp,
                   help=f"sampling temperature; 0 is greedy (default: {temp})")
    p.add_argument("--top-k", type=_whole(0), default=40,
                   help="keep the k most likely tokens; 0: all (default: 40)")
    p.add_argument("--top-p", type=_real(0, 1, low_open=True), default=0.95,
                   help="keep the smallest set with this mass (default: 0.95)")
    p.add_argument("--min-p", type=_real(0, 1), default=0.05,
                   help="keep tokens at least this fraction as likely as the best (default: 0.05)")
    p.add_argument("--repeat-penalty", type=_real(0, low_open=True), default=1.0,
                   help="divide the logits of the last 64 tokens by this (default: 1, none)")
    p.add_argument("-s", "--seed", type=_whole(-1), default=-1,
                   help="sampling seed: the same seed, the same text; -1: a new one each run (default: -1)")


def _model_options(p: argparse.ArgumentParser, model_help: str) -> None:
    """The options of the commands that run a model, spelled as llama.cpp's tools spell them."""
    p.add_argument("model", metavar="MODEL.gguf", nargs="?", default=None, help=model_help)
    p.add_argument("-m", "--model", dest="model_option", metavar="MODEL.gguf", default=None,
                   help="the model, as llama.cpp's -m (instead of MODEL.gguf)")
    p.add_argument("-c", "--ctx-size", type=_whole(0), default=None,
                   help="the context's cells; 0: the model's trained context (default: min(trained, 4096))")
    p.add_argument("-b", "--batch-size", type=_whole(1), default=512,
                   help="logical batch size: prompt tokens decoded at once (default: 512)")
    p.add_argument("-ub", "--ubatch-size", type=_whole(1), default=512,
                   help="physical batch size (default: 512)")
    p.add_argument("-ctk", "--cache-type-k", choices=CACHE_TYPES, default="f16",
                   help="KV cache type of K (default: f16)")
    p.add_argument("-ctv", "--cache-type-v", choices=CACHE_TYPES, default="f16",
                   help="KV cache type of V (default: f16)")
    p.add_argument("-t", "--threads", type=_whole(1), default=None,
                   help="threads the kernels run on (default: numba's, the host's cores)")
    _quiet_option(p)
    _verbose_option(p)
    _isa_option(p)


def _generation_options(p: argparse.ArgumentParser, model_help: str) -> None:
    """The options run and chat share: the model's, and what a full context does."""
    _model_options(p, model_help)
    p.add_argument("--keep", type=_whole(-1), default=0,
                   help="tokens of the start (after BOS) a context shift keeps; -1: all of the first text "
                        "(default: 0)")
    p.add_argument("--no-context-shift", action="store_true",
                   help="stop when the context is full instead of forgetting the oldest half after --keep")


def _n_ctx_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--n-ctx", type=_whole(0), default=None, help="context size for the memory figures; "
                   "0: the trained context, as llama.cpp's -c 0 (default: min(trained context, 4096))")


def _verbose_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("-v", "--verbose", action="store_true",
                   help="say more on stderr: the numerics path that runs, the context's sizes")


def _graph_options(p: argparse.ArgumentParser) -> None:
    from graphir.memory.kinds import KINDS  # here, not at import: `import graphir.cli` stays light

    p.add_argument("--context", choices=tuple(KINDS), default=None,
                   help="memory kind the graph is built for (default: the architecture's, kv for decoders; a saved graph keeps its own)")
    p.add_argument("--phase", choices=PHASES, default=None,
                   help="prefill (n_tokens open), decode (one token) or encode (an encoder-decoder's encoder) "
                        "(default: prefill; a saved graph keeps its own)")


def _quiet_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("-q", "--quiet", action="store_true", help="draw no progress on stderr (drawn only on a terminal)")


def _isa_option(p: argparse.ArgumentParser) -> None:
    from graphir.running.backend import DEFAULT, get

    p.add_argument("--isa", choices=("auto", *get().paths), default="auto",
                   help="the llama.cpp CPU path whose numbers to reproduce (default: auto, GRAPHIR_ISA or the host's)")
    p.add_argument("--backend", default=DEFAULT,
                   help=f"the installed backend that runs the model (default: {DEFAULT}; reference: numpy, slow)")


SRC_HELP = ("a GGUF file (full or header-only), a Hugging Face model directory or its config.json (as "
            "convert_hf_to_gguf would convert it), a preset name (see `graphir archs`) or a saved graph (text or JSON); "
            "llama.cpp:SRC is the graph llama.cpp itself builds for SRC (needs llama-cpp-python)")


def build_parser() -> argparse.ArgumentParser:
    from graphir import __version__

    parser = _Parser(
        prog=PROG,
        description="LLM architectures as symbolic compute graphs, built from GGUF metadata alone (never weights).",
        epilog="Exit status: 0 success, 1 a difference or problem was found (diff, check), 2 user error.",
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    def add(name: str, func: Callable[[argparse.Namespace], int], help: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help, description=help)
        p.set_defaults(func=func)
        return p

    p = add("dump", cmd_dump, "print the graph of a model or saved graph")
    p.add_argument("src", metavar="SRC", help=SRC_HELP)
    _graph_options(p)
    p.add_argument("--format", choices=FORMATS, default="text", help="output form (default: text)")
    p.add_argument("--layers", metavar="A:B", default=None, help="with --format dot or svg: only draw layers A to B-1, as a Python slice (0:2: layers 0 and 1; "
                        "N: layer N alone; -1: the last)")
    p.add_argument("--full", action="store_true", help="text: print every layer instead of folding identical ones")
    p.add_argument("-o", "--output", metavar="FILE", default=None, help="write to FILE instead of stdout")

    p = add("diff", cmd_diff, "compare two graphs (exit 0 same, 1 different)")
    p.add_argument("a", metavar="A", help=SRC_HELP)
    p.add_argument("b", metavar="B", help="the same kinds of source as A")
    _graph_options(p)
    p.add_argument("--json", action="store_true", help="print the difference as JSON")

    p = add("hash", cmd_hash, "print the structural hash of a graph")
    p.add_argument("src", metavar="SRC", help=SRC_HELP)
    _graph_options(p)

    p = add("check", cmd_check, "compare the tensors a GGUF declares with those its architecture expects")
    p.add_argument("model", metavar="MODEL.gguf", help="a GGUF file (full or header-only) or a preset")

    p = add("archs", cmd_archs, "list the registered architectures and the presets")
    p.add_argument("--census", action="store_true",
                   help="list every architecture the installed llama.cpp knows, whether graphir has it, and whether "
                        "graphir's graph of its first preset is llama.cpp's (needs llama-cpp-python)")

    p = add("info", cmd_info, "print architecture, hparams, tensor table and what a context's memory holds")
    p.add_argument("src", metavar="SRC", help=SRC_HELP)
    p.add_argument("--json", action="store_true", help="print as JSON")
    _n_ctx_option(p)
    p.add_argument("--n-seq-max", type=_whole(1), default=1,
                   help="sequences the context holds (default 1)")
    p.add_argument("--n-ubatch", type=_whole(1), default=512,
                   help="ubatch size, which sizes a sliding-window cache")
    p.add_argument("--swa-full", action="store_true", help="sliding-window layers keep every cell")

    p = add("stats", cmd_stats, "print what a model costs: parameters, weight bytes per type, memory per part, "
                                "FLOPs per token")
    p.add_argument("src", metavar="SRC", help="a GGUF file (full or header-only), a Hugging Face model directory "
                   "or its config.json, or a preset name")
    p.add_argument("--json", action="store_true", help="print as JSON")
    _n_ctx_option(p)
    p.add_argument("-ctk", "--cache-type-k", choices=CACHE_TYPES, default="f16",
                   help="KV cache type of K (default: f16)")
    p.add_argument("-ctv", "--cache-type-v", choices=CACHE_TYPES, default="f16",
                   help="KV cache type of V (default: f16)")

    p = add("strip", cmd_strip, "write a header-only copy of a GGUF (metadata and tensor infos, no data)")
    p.add_argument("model", metavar="MODEL.gguf", help="the GGUF file to strip")
    p.add_argument("-o", "--output", metavar="HEADER.gguf", required=True, help="where to write the header-only GGUF")

    p = add("run", cmd_run, "generate text from a prompt with a backend (numba unless --backend), as llama.cpp's "
                            "llama-completion does: the prompt, its continuation, then the timings on stderr")
    _generation_options(p, "a GGUF file with weights")
    p.add_argument("-p", "--prompt", default=None, help="the prompt text (special tokens are parsed)")
    p.add_argument("-f", "--file", default=None, help="read the prompt from this file")
    p.add_argument("-n", "--n-predict", type=_whole(-1), default=64,
                   help="tokens to generate; -1: until the model ends the text (default: 64)")
    p.add_argument("--no-display-prompt", dest="display_prompt", action="store_false",
                   help="print only the generated text, not the prompt before it")
    p.add_argument("--mmproj", metavar="MMPROJ.gguf", default=None,
                   help="the file of the model's vision or audio tower (llama.cpp's mmproj), for --image or --audio")
    p.add_argument("--image", metavar="FILE", action="append", default=[],
                   help="a picture for the prompt, where it says <__media__> (else before it); repeat for several")
    p.add_argument("--audio", metavar="FILE", action="append", default=[],
                   help="an audio file (WAV PCM at the tower's rate) for the prompt, as --image; repeat for several")
    _sampling_options(p, 0.0)

    p = add("chat", cmd_chat, "chat on stdin with a model's own chat template; replies stream to stdout")
    _generation_options(p, "a GGUF file with weights and a chat template")
    p.add_argument("-sys", "--system-prompt", "--system", dest="system", default=None,
                   help="a system message to start the conversation with")
    p.add_argument("-n", "--n-predict", type=_whole(-1), default=-1,
                   help="at most this many tokens per reply; -1: until the model ends its turn (default: -1)")
    p.add_argument("--chat-template", metavar="FILE", default=None,
                   help="a jinja2 chat template to use instead of the model's (tokenizer.chat_template)")
    _sampling_options(p, 0.2)

    p = add("serve", cmd_serve, "serve a model over HTTP as llama.cpp's llama-server does: OpenAI-compatible "
                                "endpoints, --parallel requests decoded together")
    _model_options(p, "a GGUF file with weights")
    p.add_argument("--host", default="127.0.0.1", help="the address to listen on (default: 127.0.0.1)")
    p.add_argument("--port", type=_whole(0), default=8080, help="the port; 0: any free one (default: 8080)")
    p.add_argument("-np", "--parallel", type=_whole(1), default=4,
                   help="requests decoded together, each a sequence of -c/P cells (default: 4)")
    p.add_argument("--queue-size", type=_whole(0), default=64,
                   help="requests that may wait for a slot; more get 503 (default: 64)")
    p.add_argument("-a", "--alias", default=None, help="the model's name in the API (default: the file's stem)")
    p.add_argument("--chat-template", metavar="FILE", default=None,
                   help="a jinja2 chat template to use instead of the model's (tokenizer.chat_template)")
    p.add_argument("--pooling", choices=("mean", "cls", "last"), default=None,
                   help="an embedding model's pooling (default: the model's)")

    p = add("embed", cmd_embed, "print the embedding of each prompt (pooled as the model says), one line each")
    p.add_argument("model", metavar="MODEL.gguf", help="a GGUF file with weights (e.g. a converted BERT)")
    p.add_argument("-p", "--prompt", required=True, action="append", help="a text to embed; repeat for several")
    _verbose_option(p)
    p.add_argument("--normalize", action="store_true", help="scale each embedding to unit Euclidean length")
    p.add_argument("--pooling", choices=("none", "mean", "cls", "last", "rank"), default=None,
                   help="how tokens are reduced (default: the model's; none prints the last token's embedding)")
    p.add_argument("-c", "--ctx-size", type=_whole(0), default=0,
                   help="context size (default: the trained one, at most 4096)")
    _quiet_option(p)
    _isa_option(p)

    p = add("convert", cmd_convert, "convert a Hugging Face BERT checkpoint (safetensors) to a GGUF llama.cpp loads")
    p.add_argument("src", metavar="HF_DIR", help="the model directory: config.json, model.safetensors, tokenizer files")
    p.add_argument("-o", "--output", metavar="OUT.gguf", required=True, help="where to write the GGUF")
    p.add_argument("--outtype", choices=OUTTYPES, default="f16",
                   help="type of the weight matrices; norms, biases and position tables stay f32 (default: f16)")
    _quiet_option(p)
    return parser


def _fail(message: str) -> int:
    message = " ".join(str(message).split()) or "unknown error"  # exactly one line
    try:
        sys.stderr.write(f"{PROG}: error: {message}\n")
        sys.stderr.flush()
    except OSError:
        pass
    return 2


class _Diagnostics(logging.Formatter):
    """Diagnostics on stderr, one line each: warnings as ``graphir: warning: ...``, the rest (``-v``) as they are."""

    def format(self, record: logging.LogRecord) -> str:
        text = " ".join(record.getMessage().split())
        return f"{PROG}: warning: {text}" if record.levelno >= logging.WARNING else text


def _diagnostics(verbose: bool) -> Callable[[], None]:
    """Route the package's log and Python warnings to stderr, one line each (quiet but for warnings unless
    ``verbose``); the function that undoes it."""
    import warnings

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_Diagnostics())
    root = logging.getLogger("graphir")
    level, propagate = root.level, root.propagate
    root.addHandler(handler)
    root.setLevel(logging.INFO if verbose else logging.WARNING)
    root.propagate = False
    show = warnings.showwarning
    warnings.showwarning = lambda message, *_, **__: log.warning("%s", message)

    def undo() -> None:
        root.removeHandler(handler)
        root.setLevel(level)
        root.propagate = propagate
        warnings.showwarning = show
    return undo


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    undo = None
    try:
        args = parser.parse_args(argv)
        if getattr(args, "func", None) is None:
            sys.stdout.write(parser.format_help())
            return 0
        undo = _diagnostics(getattr(args, "verbose", False))
        return args.func(args)
    except SystemExit as e:  # --help / --version
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 2)
    except UsageError as e:
        return _fail(str(e))
    except GraphirError as e:
        return _fail(str(e))
    except BrokenPipeError:  # e.g. `graphir dump X | head`: not an error worth a message
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        except (OSError, ValueError, AttributeError):
            pass
        return 1
    except (FileNotFoundError, IsADirectoryError, PermissionError) as e:
        where = f"{e.filename}: " if getattr(e, "filename", None) else ""
        return _fail(f"{where}{e.strerror or e}")
    except KeyboardInterrupt:
        return _fail("interrupted") + 128
    finally:
        if undo is not None:
            undo()
