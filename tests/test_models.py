"""Graphs from files, header-only strips and presets agree; every preset builds a verified graph everywhere."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path
from typing import Callable

import gguf
import pytest
from conftest import graph_cases, write_model_gguf

from graphir.graph.dims import Sym
from graphir.errors import TensorError
from graphir.graph.forms import to_json, to_text
from graphir.files.gguf_file import strip
from graphir.graph.hashing import graph_hash
from graphir.model.meta import open_model
from graphir.model.presets import Preset
from graphir.graph.verify import verify

CONTEXTS = [("none", "prefill"), ("kv", "prefill"), ("kv", "decode")]
Q = gguf.GGMLQuantizationType


@pytest.mark.parametrize("preset,context,phase", graph_cases())
def test_every_preset_builds_a_verified_graph_in_every_context(preset: str, context: str, phase: str) -> None:
    model = open_model(preset)
    g = model.build_graph(context, phase)
    verify(g)
    hp = model.arch.hp
    n_out = 1 if phase == "decode" else Sym.named("n_outputs")
    if phase != "decode" and not any(n.op == "input" and n.name == "out_ids" for n in g.nodes):
        n_out = Sym.named("n_tokens")  # a graph that selects no output rows (CogVLM's, as llama.cpp's) keeps them all
    if model.arch.tower:  # an image's rows, of the text model's width (graphir/model/tower.py)
        assert g.outputs["embd"].shape[0] == model.arch.n_embd_out and len(g.outputs["embd"].shape) == 2
    elif "logits" in g.outputs:
        assert g.outputs["logits"].shape == (hp.n_vocab, n_out)
    else:  # encoders: embeddings, pooled per sequence as the model says
        assert g.outputs["embd"].shape == (hp.n_embd, n_out)
        assert ("pooled" in g.outputs) == (hp.pooling != "none")


_DUMP_ALL = """
import hashlib
from graphir.graph.forms import to_json, to_text
from graphir.graph.hashing import graph_hash
from graphir.model.meta import open_model
from conftest import graph_cases
for p, c, ph in graph_cases():
    g = open_model(p).build_graph(c, ph)
    blob = (to_text(g) + to_text(g, fold=False) + to_json(g) + graph_hash(g)).encode()
    print(p, c, ph, hashlib.sha256(blob).hexdigest())
"""


def test_dumps_are_identical_across_processes_and_hash_seeds() -> None:
    outs = []
    for seed in ("0", "12345"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        outs.append(subprocess.run([sys.executable, "-c", _DUMP_ALL], env=env, capture_output=True, text=True,
                                   check=True, cwd=Path(__file__).parent).stdout)
    assert outs[0] == outs[1]
    assert len(outs[0].splitlines()) == len(graph_cases())


@pytest.mark.parametrize("arch,dtype", [("llama", Q.F32), ("llama", Q.Q8_0), ("qwen2", Q.F16), ("qwen2", Q.Q4_0)])
def test_a_gguf_and_its_header_only_strip_give_identical_dumps(tmp_path: Path, tiny_preset: Callable[..., Preset],
                                                               arch: str, dtype: Q) -> None:
    full = write_model_gguf(tmp_path / "m.gguf", tiny_preset(arch), dtype)
    header = strip(full, tmp_path / "m.header.gguf")
    assert header.header_only
    for context, phase in CONTEXTS:
        a, b = open_model(str(full)).build_graph(context, phase), open_model(str(header.path)).build_graph(context, phase)
        assert to_text(a) == to_text(b) and to_json(a) == to_json(b)


def test_a_written_gguf_matches_the_preset_it_was_written_from(tmp_path: Path,
                                                              tiny_preset: Callable[..., Preset]) -> None:
    preset = tiny_preset("qwen2", tied=False)
    path = write_model_gguf(tmp_path / "m.gguf", preset)
    from graphir.model.meta import from_preset

    want = from_preset("tiny", preset).build_graph("kv", "prefill")
    assert graph_hash(open_model(str(path)).build_graph("kv", "prefill")) == graph_hash(want)


def test_a_wrong_tensor_shape_names_file_tensor_and_both_shapes(tmp_path: Path,
                                                               tiny_preset: Callable[..., Preset]) -> None:
    path = write_model_gguf(tmp_path / "bad.gguf", tiny_preset(), reshape={"blk.1.attn_k.weight": (64, 48)})
    with pytest.raises(TensorError) as e:
        open_model(str(path)).build_graph()
    assert str(e.value) == f"{path}: tensor 'blk.1.attn_k.weight' has shape [64, 48], expected [64, 32]"


def test_real_smollm2_gguf_gives_the_preset_graph(smollm2_gguf: Path, tmp_path: Path) -> None:
    model = open_model(str(smollm2_gguf))
    assert model.arch.check(model.tensors) == []
    header = strip(smollm2_gguf, tmp_path / "smol.header.gguf")
    for context, phase in CONTEXTS:
        want = to_text(open_model("SmolLM2-135M").build_graph(context, phase), fold=False)
        assert to_text(model.build_graph(context, phase), fold=False) == want
        assert to_text(open_model(str(header.path)).build_graph(context, phase), fold=False) == want


def test_building_a_graph_never_reads_tensor_data(tmp_path: Path, tiny_preset: Callable[..., Preset]) -> None:
    path = write_model_gguf(tmp_path / "m.gguf", tiny_preset())
    header = strip(path, tmp_path / "h.gguf")
    # Overwrite every tensor byte of the full file: the graph must not change.
    data = bytearray(path.read_bytes())
    data[header.data_start:] = b"\xff" * (len(data) - header.data_start)
    path.write_bytes(bytes(data))
    digest = hashlib.sha256(to_text(open_model(str(path)).build_graph()).encode()).hexdigest()
    assert digest == hashlib.sha256(to_text(open_model(str(header.path)).build_graph()).encode()).hexdigest()


def test_a_layer_with_neither_fused_nor_separate_qkv_names_both(tmp_path: Path,
                                                                 tiny_preset: Callable[..., Preset]) -> None:
    """BERT may have attn_qkv or attn_q/k/v: a file with neither (whole) is refused naming the missing ones."""
    path = write_model_gguf(tmp_path / "bert.gguf", tiny_preset("bert"), drop=("blk.1.attn_k.weight",))
    with pytest.raises(TensorError) as e:
        open_model(str(path)).build_graph()
    assert str(e.value) == (f"{path}: missing tensor 'blk.1.attn_qkv.weight' (or 'blk.1.attn_k.weight' of separate "
                            f"projections)")
