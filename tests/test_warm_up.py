"""A model's warm-up: on a first run (an empty numba cache) a second process compiles the generation step's
kernels while this one compiles the prompt's, and this process's step then compiles none of them; a warm cache
starts no second process and compiles nothing; after the warm-up, a generation compiles nothing more."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from conftest import make_tiny_preset, write_model_gguf

# Run in a process of its own: numba reads its cache directory when it is imported.
SCRIPT = """
import json, subprocess, sys
from numba.core import event
from graphir.running import warm_up as w
from graphir.running.runtime import load

phase, compiled, helpers = ["load"], {}, []
depth = [0]

class Recorder(event.Listener):
    def on_start(self, ev):
        depth[0] += 1
        if depth[0] == 1:
            compiled.setdefault(phase[0], []).append(ev.data["dispatcher"].py_func.__qualname__)

    def on_end(self, ev):
        depth[0] -= 1

class Step(w.Batch):
    @classmethod
    def one(cls, *args, **kwargs):
        phase[0] = "step"
        return super().one(*args, **kwargs)

class Popen(subprocess.Popen):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if w.__name__ in args[0]:
            helpers.append(self)

w.Batch, w.subprocess.Popen = Step, Popen
event.register("numba:compile", Recorder())
model = load(sys.argv[1])
phase[0] = "prompt"
w.warm_up(model, None)
phase[0] = "generate"
text = "".join(model.generate("hello", max_tokens=3))
print(json.dumps({"compiled": compiled, "helpers": [h.returncode for h in helpers]}))
"""


def _warm_up(model: Path, cache: Path) -> dict[str, object]:
    env = {**os.environ, "NUMBA_CACHE_DIR": str(cache)}
    p = subprocess.run([sys.executable, "-c", SCRIPT, str(model)], capture_output=True, text=True, env=env,
                       timeout=900)
    assert p.returncode == 0, p.stderr
    result: dict[str, object] = json.loads(p.stdout.splitlines()[-1])
    return result


def test_a_first_run_compiles_the_step_in_a_second_process_and_a_warm_run_compiles_nothing(tmp_path: Path) -> None:
    model = write_model_gguf(tmp_path / "tiny.gguf", make_tiny_preset("llama"))
    cold = _warm_up(model, tmp_path / "numba-cache")
    compiled = cold["compiled"]
    assert isinstance(compiled, dict)
    assert cold["helpers"] == [0]                  # one second process, which succeeded
    assert compiled.get("prompt")                  # this process compiled the prompt's kernels ...
    assert "step" not in compiled                  # ... and found the step's in the cache the helper filled
    assert "generate" not in compiled              # the warm-up's kernels are the generation's
    assert _warm_up(model, tmp_path / "numba-cache") == {"compiled": {}, "helpers": []}
