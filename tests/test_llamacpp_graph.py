"""llama.cpp's own graph (``llama.cpp:SRC``), read without weights, against graphir's.

Every preset's real-size header is written by graphir (metadata and tensor table, no data), llama.cpp builds
its prompt and generation graphs from it with no weight memory, and the normal forms of its graphs and
graphir's must be equal; each difference that remains is pinned here as it is. llama.cpp answers once per
header and request in a session (graphir.llamacpp.reading), so the CLI tests reuse the family tests' reads.
"""

from __future__ import annotations

import ctypes
import subprocess
import sys
from pathlib import Path
from typing import Any

import gguf
import pytest

from graphir.errors import GraphirError
from graphir.graph.forms import to_text
from graphir.llamacpp import reading, reserve
from graphir.llamacpp.compare import agreement
from graphir.llamacpp.model import graphs
from graphir.llamacpp.normalize import compare_forms, normal_form
from graphir.model.meta import from_preset, open_model
from graphir.model.presets import all_presets
from graphir.source import load_graph
from graphir.testing import graph_text

pytestmark = [pytest.mark.oracle, pytest.mark.same_on_every_path]
pytest.importorskip("llama_cpp", reason="llama.cpp's graphs need llama-cpp-python (the test extra has it)")

SNAPSHOT_DIR = Path(__file__).resolve().parent.parent / "snapshots"
# a tower's graph is llama.cpp's libmtmd's, which llama_graph_reserve does not build (tests/test_towers.py holds the
# towers to mtmd's numbers instead)
PRESETS = {name: p for name, p in all_presets().items() if not p.arch.startswith("clip:")}



@pytest.fixture(scope="module")
def headers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Every preset's real-size header, as graphir writes it: metadata and tensor table, no tensor data."""
    d = tmp_path_factory.mktemp("headers")
    out = {}
    for name, preset in PRESETS.items():
        out[name] = d / f"{name}.gguf"
        reading.write_header(from_preset(name, preset), str(out[name]))
    return out


def verdict(header: Path) -> str:
    try:
        phases = agreement(open_model(str(header)))
    except GraphirError as e:
        return str(e).split(": ", 1)[1]
    differing = [(phase, first) for phase, first in phases.items() if first is not None]
    return f"differs in {differing[0][0]}: {differing[0][1]}" if differing else "agrees"


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_graphir_builds_the_graph_llama_cpp_builds(preset: str, headers: dict[str, Path]) -> None:
    assert verdict(headers[preset]) == "agrees"


def tiny_models() -> dict[str, Any]:
    """The tiny models the family tests make (sliding-window patterns and none, MLA and DeepSeek's legacy form,
    experts with and without gates, LongRoPE, T5's encoder and decoder), by the family tests' names; every
    family's own tiny model is a row of the conformance table, whose graph scenario compares it with llama.cpp's."""
    import importlib

    models: dict[str, Any] = {}
    for module in ("test_arch_gpt2_phi3", "test_arch_t5", "test_arch_gemma", "test_arch_deepseek2",
                   "test_arch_gpt_oss", "test_arch_moe"):
        family = importlib.import_module(module)
        models.update({f"{module[len('test_arch_'):]}-{name}": p
                       for name, p in getattr(family, "MODELS", getattr(family, "PRESETS", {})).items()})
    return models


TINY = tiny_models()


@pytest.mark.parametrize("name", sorted(TINY))
def test_graphir_builds_the_graph_llama_cpp_builds_of_each_tiny_model(name: str, tmp_path: Path) -> None:
    header = tmp_path / "tiny.gguf"
    reading.write_header(from_preset(name, TINY[name]), str(header))
    assert verdict(header) == "agrees"


def test_the_census_lists_every_architecture_llama_cpp_knows(capsys: pytest.CaptureFixture[str]) -> None:
    """Read from the library, not a list of graphir's; graphir's families with their agreement (the presets'
    headers were read above, so llama.cpp answers from the session's cache)."""
    from graphir import arch
    from graphir.cli import main

    known = reading.known_archs()
    assert len(known) == len(set(known)) > 100 and {"llama", "clip", "mamba", "t5"} <= set(known)
    assert main(["archs", "--census"]) == 0
    lines = capsys.readouterr().out.splitlines()
    n = len(arch.names())
    assert lines[0] == (f"llama.cpp knows {len(known)} architectures; graphir has {n}, and on {n} of them builds "
                        f"the graph llama.cpp builds")
    rows = {line.split()[0]: line.split(None, 1)[1] for line in lines[1:]}
    assert list(rows) == known
    assert {a for a, row in rows.items() if row.startswith("graphir")} == set(arch.names())
    assert rows["llama"].split() == ["graphir", "SmolLM2-135M", "agrees", "(prefill,", "decode)"]
    assert rows["bert"].split() == ["graphir", "BERT-base", "agrees", "(prefill)"]
    assert rows["qwen35"].split() == ["graphir", "Qwen3.5-0.8B", "agrees", "(prefill,", "decode)"]
    assert rows["t5encoder"].split() == ["graphir", "T5-v1.1-XXL-encoder", "agrees", "(prefill)"]
    assert rows["clip"] == "-"  # llama.cpp's quantize-only stub: no graph of its own


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "graphir", *args], capture_output=True, text=True)


@pytest.mark.parametrize("phase", ["prefill", "decode"])
def test_graphir_diff_of_a_header_and_its_llama_cpp_graph_exits_0(phase: str, headers: dict[str, Path]) -> None:
    h = str(headers["Llama-3.1-8B"])
    p = run("diff", h, f"llama.cpp:{h}", "--phase", phase)
    assert (p.returncode, p.stderr) == (0, "") and p.stdout.startswith("graphs are identical")


def test_either_side_may_be_llama_cpp_s_and_the_other_a_saved_graphir_graph() -> None:
    golden = SNAPSHOT_DIR / "test_graphs" / "test_graph[Gemma-3-1B-iswa-decode].graph.txt"
    for args in (("llama.cpp:Gemma-3-1B", "Gemma-3-1B", "--phase", "decode"), (str(golden), "llama.cpp:Gemma-3-1B")):
        p = run("diff", *args)
        assert (p.returncode, p.stderr) == (0, "") and p.stdout.startswith("graphs are identical"), args


def test_a_real_difference_is_reported_as_the_first_mismatch(tmp_path: Path) -> None:
    """The normal form hides no value: a header whose RoPE base differs differs at the first rope."""
    preset = PRESETS["SmolLM2-135M"]
    changed = from_preset("changed", preset)
    changed.metadata[gguf.Keys.Rope.FREQ_BASE.format(arch="llama")] = 10000.0
    ours, theirs = tmp_path / "ours.gguf", tmp_path / "theirs.gguf"
    reading.write_header(from_preset("SmolLM2-135M", preset), str(ours))
    reading.write_header(changed, str(theirs))
    p = run("diff", str(ours), f"llama.cpp:{theirs}", "--phase", "decode")
    assert p.returncode == 1, p.stderr
    lines = p.stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("first mismatch: "))
    assert lines[at].startswith("first mismatch: blk.0.rope.") and "attr freq_base: 100000.0 -> 10000.0" in lines[at]
    assert lines[at + 1] == f"  named %blk.0.Kcur.rope in {ours}, %blk.0.Kcur.rope in llama.cpp:{theirs}"


def test_the_dump_is_llama_cpp_s_ops_names_and_shapes() -> None:
    g = load_graph("llama.cpp:SmolLM2-135M", phase="decode")
    assert g.meta["context"] == "kv" and g.meta["hparams"] == {"n_layer": 30, "n_ctx": reading.N_CTX,
                                                                "n_tokens": 1, "n_outputs": 1}
    text = to_text(g)
    for line in ("%blk.0.attn_norm = mul(%blk.0.norm, %blk.0.attn_norm.weight) : f32[576]",
                 "input %blk.0.cache_k : f16[192, 1024] {role=cache_k}",
                 "%blk.0.kq_soft_max = soft_max(%blk.0.kq, %kq_mask) {scale=0.125, max_bias=0.0} : f32[1024, 1, 9]",
                 "weight %token_embd.weight : q8_0[576, 49152]", "output logits = %result_output",
                 "... blk.2-27 like blk.1"):
        assert line in text.splitlines(), line
    assert len({n.name for n in g.nodes}) == len(g.nodes)


# ---- the normal form, rule by rule (graphir.llamacpp.normalize) ---------------------------------------------

def ops(g: Any) -> set[str]:
    return {n.op for n in g.nodes}


def test_layout_ops_are_dropped_and_cache_reads_read_the_write() -> None:
    theirs = load_graph("llama.cpp:SmolLM2-135M", phase="decode")
    kq = next(n for n in theirs.nodes if n.name == "blk.0.kq")
    assert kq.inputs[0].op == "permute" and kq.inputs[0].inputs[0].inputs[0].name == "blk.0.cache_k"  # the cache
    normal = normal_form(theirs)
    assert not ops(normal) & {"view", "reshape", "permute", "transpose", "cont"}
    kq = next(n for n in normal.nodes if n.op == "mul_mat" and n.inputs[0].op == "set_rows")
    assert kq.inputs[0].inputs[0].name == "blk.0.cache_k"  # ... reads the write into it


def test_fused_ops_meet_graphir_s_unfused_ones() -> None:
    phi3 = load_graph("llama.cpp:Phi-3-mini-4k", phase="decode")
    assert "ggml.swiglu" in ops(phi3) and "ggml.swiglu" not in ops(normal_form(phi3))
    mixtral = load_graph("llama.cpp:Mixtral-8x7B", phase="decode")
    topk = [n.attrs["k"] for n in mixtral.nodes if n.op == "argsort_top_k"]
    assert set(topk) == {8} and {n.attrs["k"] for n in normal_form(mixtral).nodes if n.op == "argsort_top_k"} == {2}
    ours, _ = compare_forms(load_graph("Mixtral-8x7B", phase="decode"), mixtral)
    assert "moe_sum" in ops(load_graph("Mixtral-8x7B", phase="decode")) and "moe_sum" not in ops(ours)


def test_recurrent_states_are_written_as_graphir_writes_them() -> None:
    mamba = load_graph("llama.cpp:Mamba-130M", phase="decode")
    assert "ggml.cpy" in ops(mamba) and any(0 in n.shape for n in mamba.nodes)  # the copies beyond the ubatch's
    normal = normal_form(mamba)
    writes = [n for n in normal.nodes if n.op == "set_rows"]
    assert "ggml.cpy" not in ops(normal) and not any(0 in n.shape for n in normal.nodes)
    assert sorted(w.inputs[0].name for w in writes) == sorted(f"blk.{i}.rs_{x}" for i in range(24) for x in "rs")


def test_rows_picked_from_two_values_and_added_are_the_rows_of_their_sum() -> None:
    """llama.cpp's T5 decoder picks the output rows of its last residual and of its cross-attention and adds them;
    graphir adds, then picks: get_rows(a, ids) + get_rows(b, ids) is get_rows(a + b, ids), element for element."""
    theirs = load_graph("llama.cpp:T5-small", phase="decode")
    picked_then_added = [n for n in theirs.nodes if n.op == "add" and
                         all(x.op == "get_rows" and x.inputs[1].name == "out_ids" for x in n.inputs)]
    assert len(picked_then_added) == 1
    ours = load_graph("T5-small", context="cross", phase="decode")
    assert [n.inputs[0].op for n in ours.nodes if n.op == "get_rows" and n.inputs[1].name == "out_ids"] == ["add"]
    a, b = compare_forms(ours, theirs)
    assert to_text(a) == to_text(b)


def test_commuting_operands_are_ordered_by_what_they_compute() -> None:
    theirs = load_graph("llama.cpp:Phi-3-mini-4k", phase="decode")
    ours = load_graph("Phi-3-mini-4k", phase="decode")
    a, b = compare_forms(ours, theirs)
    assert to_text(a) == to_text(b)
    assert [x.name for x in theirs["blk.0.l_out"].inputs] == ["blk.0.add", "blk.0.ffn_out"]  # residual first
    assert [x.name for x in ours["blk.0.l_out"].inputs] == ["blk.0.ffn_out", "blk.0.ffn_inp"]  # residual second


# ---- snapshots and the plugin -------------------------------------------------------------------------------

SNAPSHOTS = [("SmolLM2-135M", "decode"), ("Mamba-130M", "decode"), ("Gemma-3-270M", "decode"),
             ("Mixtral-8x7B", "prefill")]


class GraphText(graph_text()):  # type: ignore[misc,valid-type]
    @classmethod
    def dirname(cls, *, test_location: Any) -> str:
        return str(SNAPSHOT_DIR / test_location.basename)


@pytest.mark.parametrize("preset,phase", SNAPSHOTS, ids=[f"{p}-{ph}" for p, ph in SNAPSHOTS])
def test_llama_cpp_golden_graph(preset: str, phase: str, snapshot: Any) -> None:
    """llama.cpp's own graphs of a few presets: a change of llama.cpp's builders shows here."""
    assert to_text(load_graph(f"llama.cpp:{preset}", phase=phase)) == snapshot.use_extension(GraphText)


pytest_plugins = ["pytester"]


def test_a_downstream_project_snapshots_llama_cpp_s_graph(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_model_graph='''
def test_llama_cpp_graph(graphir_snapshot):
    graphir_snapshot("llama.cpp:model.gguf", phase="decode")
''')
    reading.write_header(from_preset("SmolLM2-135M", PRESETS["SmolLM2-135M"]), str(pytester.path / "model.gguf"))
    pytester.runpytest("--snapshot-update").assert_outcomes(passed=1)
    stored = (pytester.path / "__snapshots__" / "test_model_graph" / "test_llama_cpp_graph.graph.txt").read_text()
    assert "%blk.0.kq_soft_max = soft_max(%blk.0.kq, %kq_mask)" in stored
    pytester.runpytest().assert_outcomes(passed=1)


# ---- size and speed ---------------------------------------------------------------------------------------

def test_the_405b_graph_is_read_without_weight_memory() -> None:
    """`graphir dump llama.cpp:Llama-3.1-405B` as a whole (graphir and llama.cpp's child process) keeps far less
    memory than the 405B weights' 811 GB. Its processor time (target 2 s) is bench/bench_graph.py's to measure."""
    # measured from a process of its own, whose only children are graphir's and llama.cpp's (a test process's
    # largest child so far would be counted otherwise)
    probe = ("import resource, subprocess, sys; "
             "p = subprocess.run([sys.executable, '-m', 'graphir', 'dump', 'llama.cpp:Llama-3.1-405B'], "
             "capture_output=True, text=True); r = resource.getrusage(resource.RUSAGE_CHILDREN); "
             "print(p.returncode, r.ru_maxrss, p.stdout.count(chr(10)), repr(p.stderr[-300:]))")
    code, maxrss, lines, stderr = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                                                 check=True).stdout.split(" ", 3)
    assert code == "0", stderr
    assert int(lines) > 126  # the whole graph was printed: more lines than the model has layers
    assert int(maxrss) < 512 * 1024  # KiB: the largest process stays under 512 MB


# ---- bad input ----------------------------------------------------------------------------------------------

def write(path: Path, arch: str, changes: dict[str, Any], preset: str = "SmolLM2-135M") -> Path:
    meta = from_preset(preset, PRESETS[preset])
    meta.metadata.update(changes)
    meta.metadata["general.architecture"] = arch
    reading.write_header(meta, str(path))
    return path


def one_line_error(p: subprocess.CompletedProcess[str]) -> str:
    assert p.returncode == 2 and p.stdout == "" and len(p.stderr.splitlines()) == 1, p.stderr
    return p.stderr.strip()


def test_an_architecture_llama_cpp_does_not_know_is_one_line(tmp_path: Path) -> None:
    h = write(tmp_path / "foo.gguf", "foo", {f"foo.{k.split('.', 1)[1]}": v for k, v in
                                            PRESETS["SmolLM2-135M"].metadata().items() if k.startswith("llama.")})
    assert one_line_error(run("dump", f"llama.cpp:{h}")).endswith("unknown model architecture: 'foo'")


def test_metadata_llama_cpp_aborts_on_is_one_line(tmp_path: Path) -> None:
    """llama.cpp asserts (and so aborts its process) when more experts are used than there are: the child dies,
    graphir says why."""
    h = write(tmp_path / "experts.gguf", "llama", {"llama.expert_count": 4, "llama.expert_used_count": 8})
    assert one_line_error(run("dump", f"llama.cpp:{h}")).endswith(
        "llama.cpp: aborted at llama-model.cpp:1362: GGML_ASSERT(n_expert_used_max <= hparams.n_expert) failed")


def test_a_file_llama_cpp_refuses_is_one_line(tmp_path: Path) -> None:
    h = write(tmp_path / "rot.gguf", "llama", {"llama.rope.dimension_count": 7})
    assert one_line_error(run("dump", f"llama.cpp:{h}")).endswith("invalid n_rot: 7, expected 64")


def test_metadata_llama_cpp_crashes_on_is_one_line(tmp_path: Path) -> None:
    """A Phi-3 without its LongRoPE factors and fused attention weights: llama.cpp dereferences a missing tensor."""
    from conftest import make_tiny_preset

    h = tmp_path / "phi3.gguf"
    reading.write_header(from_preset("phi3", make_tiny_preset("phi3")), str(h))
    assert one_line_error(run("dump", f"llama.cpp:{h}")).endswith("llama.cpp: crashed (SIGSEGV)")


def test_a_saved_graph_is_no_llama_cpp_source(tmp_path: Path) -> None:
    saved = tmp_path / "g.txt"
    saved.write_text(to_text(load_graph("SmolLM2-135M")))
    assert "is a saved graph" in one_line_error(run("dump", f"llama.cpp:{saved}"))


def test_without_llama_cpp_python_one_line_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llama_cpp" else real(name, *a))
    with pytest.raises(GraphirError, match=r"^llama.cpp's graphs need llama-cpp-python .*pip install"):
        load_graph("llama.cpp:SmolLM2-135M")


def test_a_llama_cpp_without_the_symbols_is_named() -> None:
    with pytest.raises(reserve.Unusable, match="lacks llama_graph_reserve"):
        reserve._symbol(ctypes.CDLL(None), "llama_graph_reserve")


def test_commands_that_need_a_model_say_llama_cpp_s_graph_is_none() -> None:
    assert one_line_error(run("check", "llama.cpp:SmolLM2-135M")).endswith(
        "llama.cpp:SmolLM2-135M: is llama.cpp's graph; check needs a GGUF file or a preset")
    p = run("info", "llama.cpp:SmolLM2-135M")
    assert p.returncode == 0 and p.stdout.splitlines()[:2] == ["source   llama.cpp:SmolLM2-135M (graph)",
                                                               "graph    context kv, phase prefill"]


def test_a_ggml_whose_tensor_struct_moved_is_named() -> None:
    """The struct is read by layout; one node is checked against ggml's accessors, which here disagree."""
    from types import SimpleNamespace

    t = reserve.GGMLTensor(name=b"x", ne=(2, 3, 1, 1))
    agreeing = SimpleNamespace(ggml_get_name=lambda p: b"x", ggml_nelements=lambda p: 6)
    reserve._check_layout(agreeing, ctypes.addressof(t))  # type: ignore[arg-type]
    moved = SimpleNamespace(ggml_get_name=lambda p: b"x", ggml_nelements=lambda p: 7)
    with pytest.raises(reserve.Unusable, match="lays out its tensors otherwise"):
        reserve._check_layout(moved, ctypes.addressof(t))  # type: ignore[arg-type]


def test_context_and_phase_are_checked() -> None:
    with pytest.raises(GraphirError, match=r"own memory \(kv\), not 'none'"):
        graphs(open_model("SmolLM2-135M"), ("prefill",), "none")
    with pytest.raises(GraphirError, match="phase prefill or decode, not 'encode'"):
        graphs(open_model("SmolLM2-135M"), ("encode",))
