"""The contract between the core and a backend (graphir.running.backend): both installed backends keep it, and the
core asks nothing of a backend, its numerics or its programs beyond it."""

from __future__ import annotations

import inspect
from typing import Any, Callable

import numpy as np
import pytest
from conftest import TinyModels, make_tiny_preset

import graphir.running.backend as contract
import graphir.running.runtime as runtime
from graphir.cli import main
from graphir.running.backend import Backend, Numerics, Program, get
from graphir.batch import Batch


def members(protocol: type) -> set[str]:
    """What a protocol declares: its attributes and methods."""
    return {n for n in (*vars(protocol), *getattr(protocol, "__annotations__", {}))
            if not n.startswith("_")} - {"__protocol_attrs__"}


def parameters(fn: Callable[..., Any]) -> list[str]:
    return [p for p in inspect.signature(fn).parameters if p != "self"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> TinyModels:
    return TinyModels(tmp_path_factory.mktemp("contract"), {"llama": make_tiny_preset("llama")})


@pytest.mark.parametrize("name", ["numba", "reference"])
def test_both_backends_keep_the_contract(tiny: TinyModels, name: str) -> None:
    backend = get(name)
    for member in members(Backend):
        assert hasattr(backend, member), member
        if callable(getattr(Backend, member, None)):
            assert parameters(getattr(backend, member)) == parameters(getattr(Backend, member)), member
    numerics = backend.numerics()
    assert members(Numerics) <= set(dir(numerics)) and backend.numerics(numerics.path.name).path == numerics.path
    model = runtime.load(str(tiny.path("llama")), backend=name)
    ctx = model.new_context(n_ctx=32)
    program = ctx.program
    assert members(Program) <= set(dir(program)) and program.profile is None
    assert parameters(program.run) == parameters(Program.run)
    program.profile = {}
    ctx.decode(Batch.from_tokens([1, 2, 3], 0))
    assert program.profile and all(seconds >= 0 and count >= 1 for seconds, count in program.profile.values())
    program.profile = None


class Spy:
    """A backend, numerics or program seen through a proxy that notes each attribute the core reads or sets, and
    wraps what compile and numerics give so that those are seen too."""

    def __init__(self, target: Any, seen: dict[str, set[str]], kind: str):
        object.__setattr__(self, "_target", target)
        object.__setattr__(self, "_seen", seen)
        object.__setattr__(self, "_kind", kind)

    def __getattr__(self, name: str) -> Any:
        self._seen[self._kind].add(name)
        value = getattr(self._target, name)
        if name == "numerics":
            return lambda *a, **k: Spy(value(*a, **k), self._seen, "numerics")
        if name == "compile":
            return lambda graph, weight, numerics: Spy(value(graph, weight, numerics._target), self._seen, "program")
        return value

    def __setattr__(self, name: str, value: Any) -> None:
        self._seen[self._kind].add(name)
        setattr(self._target, name, value)


def test_the_core_asks_nothing_beyond_the_contract(tiny: TinyModels, monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """Loading, contexts (prompt, generation, taps, a K-shift), generation and the commands that load a model go
    through a spying backend: every attribute asked of it, its numerics and its programs is one the contract
    declares."""
    seen: dict[str, set[str]] = {"backend": set(), "numerics": set(), "program": set()}
    spy = Spy(get("numba"), seen, "backend")
    monkeypatch.setattr(runtime, "get_backend", lambda name: spy)
    monkeypatch.setattr(contract, "get", lambda name="numba": spy)
    path = str(tiny.path("llama"))
    model = runtime.load(path)
    "".join(model.generate("hello", max_tokens=3))
    ctx = model.new_context(n_ctx=16)
    ctx.decode(Batch.from_tokens(list(range(1, 15)), 0), taps={})
    ctx.memory.seq_rm(0, 0, 4)
    ctx.memory.seq_add(0, 4, -1, -4)       # a K-shift, run at the next decode
    ctx.decode(Batch.one(3, 10))
    assert np.isfinite(ctx.logits()).all()
    assert main(["run", path, "-p", "hi", "-n", "2", "-q"]) == 0
    assert main(["info", path]) == 0
    capsys.readouterr()
    assert seen["backend"] and seen["program"] and seen["numerics"]
    assert seen["backend"] <= members(Backend)
    assert seen["numerics"] <= members(Numerics)
    assert seen["program"] <= members(Program)
