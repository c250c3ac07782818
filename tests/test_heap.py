"""The numba backend keeps freed buffers for the next graph run (backends.numba.heap): given a process that
compiled a graph, a 64 MB block freed and allocated again comes back without fresh pages; a process whose
environment sets glibc's thresholds is left as it set them. Each case runs in a process of its own (the setting
is the process's)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

MB64 = 64 << 20
# what a process does before the measure: nothing, the backend's setting, or a graph compiled and run
SETUPS = {
    "nothing": "",
    "keep_freed_memory": "from graphir.backends.numba.heap import keep_freed_memory\nprint(keep_freed_memory())",
    "a tiny model's decode": """
from conftest import make_tiny_preset, process_folder, write_model_gguf
from graphir.batch import Batch
from graphir.running.runtime import load
m = load(str(write_model_gguf(process_folder("heap-") / "llama.gguf", make_tiny_preset("llama"))))
m.new_context(n_ctx=16).decode(Batch.from_tokens([1, 2, 3], 0))
print(True)""",
}
MEASURE = f"""
import resource
import numpy as np
a = np.ones({MB64} // 8)
del a
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
b = np.ones({MB64} // 8)
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def faults_after(setup: str, **env: str) -> tuple[str, int]:
    """What the setup printed and the page faults of the second 64 MB allocation, in a fresh process."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    tests = os.path.dirname(__file__)
    out = subprocess.run([sys.executable, "-c", SETUPS[setup] + "\n" + MEASURE], capture_output=True, text=True,
                         env={**clean, **env, "PYTHONPATH": os.pathsep.join([tests, clean.get("PYTHONPATH", "")])},
                         cwd=tests, timeout=600, check=True).stdout.split()
    return " ".join(out[:-1]), int(out[-1])


# fresh pages fault at least once per 2 MB (numpy asks for transparent huge pages), up to once per 4 KB
FRESH = MB64 >> 21


def test_without_the_setting_a_freed_block_comes_back_as_fresh_pages():
    assert faults_after("nothing")[1] >= FRESH


@pytest.mark.parametrize("setup", ["keep_freed_memory", "a tiny model's decode"])
def test_with_it_a_freed_block_is_allocated_again_without_faults(setup):
    said, faults = faults_after(setup)
    assert said == "True" and faults < FRESH


@pytest.mark.parametrize("env", [{"MALLOC_MMAP_THRESHOLD_": "131072"},
                                 {"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=131072"}],
                         ids=["MALLOC_MMAP_THRESHOLD_", "GLIBC_TUNABLES"])
def test_a_process_that_set_glibcs_thresholds_is_left_as_it_set_them(env):
    said, faults = faults_after("keep_freed_memory", **env)
    assert said == "False" and faults >= FRESH
