"""What a newcomer does first, replayed: the ``graphir`` command in a process of its own, as typed in a shell, with
the real SmolLM2-135M (and all-MiniLM-L6-v2) where the case was found with them.

Each test names the reproduction it replays: an embedding model given to ``run``, a chat whose replies outgrow the
context, a completion in a 16-cell context, a picture of too many layers, numbers out of range, llama.cpp's option
spellings, memory figures people can read, and diagnostics that stay out of the way.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import make_tiny_preset, write_model_gguf

from graphir.cli import main

TIMINGS = re.compile(r"^load: [\d.]+ s; prompt: (\d+) tokens, [^;]+; generation: (\d+) tokens, ", re.M)


def graphir(*argv: object, stdin: str | None = None, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "graphir", *map(str, argv)], input=stdin, capture_output=True,
                          text=True, timeout=timeout)


def timings(err: str) -> tuple[int, int]:
    """(prompt tokens, generated tokens) of the timings line, which every generation ends with."""
    found = TIMINGS.findall(err)
    assert len(found) == 1, err
    return int(found[0][0]), int(found[0][1])


def no_traceback(p: subprocess.CompletedProcess[str]) -> None:
    assert "Traceback" not in p.stderr and "File \"" not in p.stderr, p.stderr


@pytest.fixture(scope="module")
def smol(smollm2_gguf: Path) -> Path:
    return smollm2_gguf


@pytest.fixture(scope="module")
def chat_prompt(smol: Path) -> str:
    """SmolLM2's chat template around a question it answers in a few tokens, then ends its turn."""
    from graphir.running.runtime import load

    return load(str(smol)).chat_template().render([{"role": "user", "content": "What is 2+2?"}])


# ---- 1. an embedding model given to run ----------------------------------------------------------------------

def test_run_of_an_embedding_model_says_to_use_embed(minilm_dir: Path, tmp_path: Path) -> None:
    model = tmp_path / "m.gguf"
    assert graphir("convert", minilm_dir, "-o", model, "-q").returncode == 0
    for command in (["run", model, "-p", "hi", "-n", "4"], ["chat", model]):
        p = graphir(*command, stdin="hi\n")
        no_traceback(p)
        assert p.returncode == 2 and p.stdout == ""
        assert p.stderr.count("\n") == 1 and "is an embedding model" in p.stderr and "graphir embed" in p.stderr


# ---- 3. a chat whose replies outgrow the context, a reply cap, Ctrl-C ----------------------------------------

def test_a_chat_longer_than_its_context_shifts_and_answers_every_line(smol: Path) -> None:
    p = graphir("chat", smol, "-c", "64", "-n", "48", "--temp", "0",
                stdin="What is the capital of France?\nAnd of Germany?\n")
    no_traceback(p)
    assert p.returncode == 0, p.stderr
    assert "full" not in p.stderr and p.stdout.endswith("\n\n")
    assert timings(p.stderr)[1] == 96  # both replies ran to their cap of 48 through the 64 cells


def test_a_chat_reply_ends_with_the_models_turn_and_the_cap_holds(smol: Path) -> None:
    p = graphir("chat", smol, "--temp", "0", stdin="What is 2+2?\n")
    assert p.returncode == 0 and p.stdout == "The answer to this classic math problem is 4.\n\n", p.stdout + p.stderr
    p = graphir("chat", smol, "--temp", "0", "-n", "3", stdin="What is 2+2?\n")
    assert p.returncode == 0 and timings(p.stderr)[1] == 3


def interruptible() -> None:
    """In the child, before Python starts: Ctrl-C acts as at a terminal even where the suite itself runs with SIGINT
    ignored (a shell's background job), which a child inherits and Python then leaves ignored."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_stops_the_reply_and_the_chat_goes_on(smol: Path) -> None:
    with subprocess.Popen([sys.executable, "-m", "graphir", "chat", str(smol), "--temp", "0", "-n", "200"],
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          preexec_fn=interruptible) as chat:
        assert chat.stdin is not None and chat.stdout is not None
        chat.stdin.write("What is the capital of France?\n")
        chat.stdin.flush()
        first = chat.stdout.read(1)  # the reply has begun
        chat.send_signal(signal.SIGINT)
        out, err = chat.communicate("What is 2+2?\n", timeout=600)
    assert chat.returncode == 0, err
    assert "interrupted" not in err
    first_reply, rest = (first + out).split("\n\n", 1)
    assert len(first_reply) < 100 and rest.strip()  # the first reply cut short, the second written
    assert timings(err)[1] < 400


# ---- 4. a completion in a 16-cell context -------------------------------------------------------------------

def test_a_completion_longer_than_its_context_shifts_as_llama_cpp_does(smol: Path) -> None:
    p = graphir("run", smol, "-p", "The capital of France is", "-n", "64", "-c", "16")
    no_traceback(p)
    assert p.returncode == 0 and p.stdout.startswith("The capital of France is Paris.") and p.stdout.endswith("\n")
    assert timings(p.stderr) == (5, 64)


def test_a_memory_that_cannot_shift_stops_cleanly_with_a_message(tmp_path: Path) -> None:
    model = write_model_gguf(tmp_path / "tiny-mamba.gguf", make_tiny_preset("mamba"))
    p = graphir("run", model, "-p", "hello", "-n", "64", "-c", "8", "--temp", "0")
    no_traceback(p)
    assert p.returncode == 0 and p.stdout.endswith("\n")
    warning = [line for line in p.stderr.splitlines() if line.startswith("graphir: warning:")]
    assert warning == ["graphir: warning: the context is full (8 cells) and a recurrent memory cannot forget part "
                       "of a sequence: generation stopped; a larger -c/--ctx-size holds more"], p.stderr
    assert timings(p.stderr)[1] < 64
    stopped = graphir("run", model, "-p", "hello", "-n", "64", "-c", "8", "--no-context-shift", "--temp", "0")
    assert stopped.stdout == p.stdout and "the context shift is off (--no-context-shift)" in stopped.stderr


# ---- 5. a picture of too many layers, and what --layers means -----------------------------------------------

def test_an_svg_of_many_layers_is_refused_before_graphviz_runs() -> None:
    t0 = time.perf_counter()
    p = graphir("dump", "Llama-3.1-8B", "--format", "svg", "-o", os.devnull)
    assert p.returncode == 2 and time.perf_counter() - t0 < 60
    assert p.stderr.startswith("graphir: error: --format svg of 32 layers: ") and "--layers 0:2" in p.stderr
    help_text = graphir("dump", "--help").stdout
    assert "layers A to B-1" in " ".join(help_text.split())


def test_layers_a_to_b_is_a_python_slice(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["dump", "SmolLM2-135M", "--format", "dot", "--layers", "0:2"]) == 0
    dot = capsys.readouterr().out
    assert "blk.1." in dot and "blk.2.attn" not in dot


# ---- 6. numbers out of range --------------------------------------------------------------------------------

@pytest.mark.parametrize("argv, message", [
    (["stats", "SmolLM2-135M", "--n-ctx", "-5"], "argument --n-ctx: must be at least 0, not -5"),
    (["info", "SmolLM2-135M", "--n-ctx", "-1"], "argument --n-ctx: must be at least 0, not -1"),
    (["info", "SmolLM2-135M", "--n-seq-max", "0"], "argument --n-seq-max: must be at least 1, not 0"),
    (["run", "m.gguf", "-p", "x", "-n", "-2"], "argument -n/--n-predict: must be at least -1, not -2"),
    (["run", "m.gguf", "-p", "x", "-c", "-1"], "argument -c/--ctx-size: must be at least 0, not -1"),
    (["run", "m.gguf", "-p", "x", "-b", "0"], "argument -b/--batch-size: must be at least 1, not 0"),
    (["run", "m.gguf", "-p", "x", "-ub", "0"], "argument -ub/--ubatch-size: must be at least 1, not 0"),
    (["run", "m.gguf", "-p", "x", "-t", "0"], "argument -t/--threads: must be at least 1, not 0"),
    (["run", "m.gguf", "-p", "x", "--keep", "-3"], "argument --keep: must be at least -1, not -3"),
    (["run", "m.gguf", "-p", "x", "--temp", "-1"], "argument --temp: must be at least 0, not -1"),
    (["run", "m.gguf", "-p", "x", "--top-k", "-1"], "argument --top-k: must be at least 0, not -1"),
    (["run", "m.gguf", "-p", "x", "--top-p", "0"], "argument --top-p: must be in (0, 1], not 0"),
    (["run", "m.gguf", "-p", "x", "--min-p", "1.5"], "argument --min-p: must be in [0, 1], not 1.5"),
    (["run", "m.gguf", "-p", "x", "--repeat-penalty", "0"], "argument --repeat-penalty: must be above 0, not 0"),
    (["chat", "m.gguf", "--temp", "nan"], "argument --temp: must be at least 0, not nan"),
    (["chat", "m.gguf", "-s", "x"], "argument -s/--seed: takes a whole number, not 'x'"),
    (["embed", "m.gguf", "-p", "x", "-c", "-4"], "argument -c/--ctx-size: must be at least 0, not -4"),
    (["run", "m.gguf", "-p", "x", "-ctk", "q4_0"], "argument -ctk/--cache-type-k: invalid choice: 'q4_0'"),
])
def test_every_number_out_of_range_is_one_line_naming_its_option(argv: list[str], message: str) -> None:
    p = graphir(*argv)
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr.startswith(f"graphir: error: {message}") and p.stderr.count("\n") == 1, p.stderr


def test_n_ctx_0_is_the_trained_context_as_in_llama_cpp(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["stats", "Llama-3.1-8B", "--n-ctx", "0"]) == 0
    assert "memory   kv, n_ctx 131072, cache f16/f16: 16.00 GiB (17179869184 bytes)\n" in capsys.readouterr().out


def test_n_minus_1_generates_until_the_end_of_the_text(smol: Path, chat_prompt: str) -> None:
    p = graphir("run", smol, "-p", chat_prompt, "-n", "-1", "--no-display-prompt")
    assert p.returncode == 0 and p.stdout == "The answer to this classic math problem is 4.\n"
    assert timings(p.stderr)[1] == 11


# ---- 8. memory in units people read, with its cache types ---------------------------------------------------

def test_stats_prints_human_units_totals_and_cache_types(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["stats", "Llama-3.1-8B", "--n-ctx", "131072"]) == 0
    out = capsys.readouterr().out
    assert "\nparams   8.03 B (8030261312)\nweights  14.96 GiB (16061055232 bytes)\n" in out
    assert "\nmemory   kv, n_ctx 131072, cache f16/f16: 16.00 GiB (17179869184 bytes)\n" in out
    assert "\ntotal    30.96 GiB (33240924416 bytes) of weights and memory" in out
    assert main(["stats", "Llama-3.1-8B", "--n-ctx", "131072", "-ctk", "f32", "--cache-type-v", "f32"]) == 0
    assert "cache f32/f32: 32.00 GiB (34359738368 bytes)\n" in capsys.readouterr().out



# the process's resident memory beyond stats' weights and memory (README, "What a run holds"): the interpreter
# with numpy, numba and llvmlite, the vocabulary, the weights prepared for the kernels beside their mapped pages,
# the kernels; measured 2026-12 at 154 MiB (336 MiB resident) for SmolLM2-135M at 4096 cells on x86-64 Linux
RESIDENT_BEYOND_STATS = 200 * 2**20


def test_stats_bounds_the_resident_memory_of_a_run(smol: Path, capsys: pytest.CaptureFixture[str],
                                                    tmp_path: Path) -> None:
    assert main(["stats", str(smol), "--json"]) == 0
    import json

    doc = json.loads(capsys.readouterr().out)
    stated = doc["weight_bytes"] + doc["memory"]["bytes"]
    # the peak of the run's own address space (VmHWM): Linux carries a parent's peak across fork and exec into the
    # child's ru_maxrss, so after the whole suite that read the test process's 2.5 GB, not the run's
    code = ("import sys\nfrom graphir.cli import main\n"
            f"main(['run', {str(smol)!r}, '-p', 'The capital of France is', '-n', '8', '-c', '4096', '-q'])\n"
            "peak = next(line for line in open('/proc/self/status') if line.startswith('VmHWM:'))\n"
            "print(int(peak.split()[1]) * 1024, file=sys.stderr)\n")
    # a run that compiles kernels peaks with LLVM's heap, which is not the run's: the first run fills a numba cache of
    # this test's own, and the second loads every kernel from it
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "numba-cache")}
    runs = [subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, env=env)
            for _ in "12"]
    resident = int(runs[-1].stderr.strip().splitlines()[-1])
    assert stated <= resident <= stated + RESIDENT_BEYOND_STATS, (stated, resident)


# ---- 9. llama.cpp's habits -----------------------------------------------------------------------------------

def test_llama_cpp_spellings_run_and_the_prompt_is_echoed(smol: Path, tmp_path: Path) -> None:
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("The capital of France is")
    p = graphir("run", "-m", smol, "-f", prompt, "-n", "8", "-c", "256", "-b", "64", "-ub", "32", "-t", "1",
                "-ctk", "f32", "-ctv", "f16", "--temp", "0.7", "--top-k", "20", "--top-p", "0.9", "--min-p", "0.1",
                "--repeat-penalty", "1.1", "-s", "7", "--keep", "-1", "-v")
    no_traceback(p)
    assert p.returncode == 0 and p.stdout.startswith("The capital of France is") and len(p.stdout) > 25
    assert "context: 256 cells, batch 64, ubatch 32, cache f32/f16\n" in p.stderr
    again = graphir("run", "-m", smol, "-f", prompt, "-n", "8", "--temp", "0.7", "-s", "7", "--top-k", "20",
                    "--top-p", "0.9", "--min-p", "0.1", "--repeat-penalty", "1.1")
    assert again.stdout == p.stdout  # the same seed, the same text, whatever the threads, batches and cache types


def test_threads_set_the_kernels_thread_count(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import numba

    model = write_model_gguf(tmp_path / "tiny.gguf", make_tiny_preset("llama"))
    before = numba.get_num_threads()
    try:
        assert main(["run", str(model), "-p", "hello", "-n", "2", "-t", "1", "-q"]) == 0
        assert numba.get_num_threads() == 1
    finally:
        numba.set_num_threads(before)


def test_a_long_prompt_draws_its_progress_on_a_terminal(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    model = write_model_gguf(tmp_path / "tiny.gguf", make_tiny_preset("llama"))
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    assert main(["run", str(model), "-p", "hello " * 40, "-n", "1", "-b", "16", "-c", "256"]) == 0
    err = capsys.readouterr().err
    n_prompt = timings(err)[0]
    assert n_prompt > 16 and "prompt: 100%" in err and f"{n_prompt}/{n_prompt}" in err


def test_ctrl_c_ends_the_text_line_and_prints_the_timings(smol: Path) -> None:
    run = subprocess.Popen([sys.executable, "-m", "graphir", "run", str(smol), "-p", "Once upon a time", "-n", "-1"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=interruptible)
    assert run.stdout is not None
    run.stdout.read(len("Once upon a time") + 1)  # the prompt, and the first piece of the text
    run.send_signal(signal.SIGINT)
    out, err = run.communicate(timeout=600)
    assert run.returncode == 130 and out.endswith("\n")
    assert err.endswith("graphir: error: interrupted\n") and timings(err)[1] >= 1


# ---- 10. diagnostics -----------------------------------------------------------------------------------------

def test_diagnostics_are_quiet_by_default_and_one_line_each(tmp_path: Path) -> None:
    model = write_model_gguf(tmp_path / "tiny.gguf", make_tiny_preset("llama"))
    quiet = graphir("run", model, "-p", "hello", "-n", "2")
    assert quiet.returncode == 0 and "numerics" not in quiet.stderr and len(quiet.stderr.splitlines()) == 1
    verbose = graphir("run", model, "-p", "hello", "-n", "2", "-v")
    assert verbose.stderr.startswith("numerics: ")
    beyond = graphir("run", model, "-p", "hello", "-n", "2", "-c", "100000")
    lines = beyond.stderr.splitlines()
    assert beyond.returncode == 0 and len(lines) == 2 and TIMINGS.match(lines[1]), beyond.stderr
    assert lines[0].startswith("graphir: warning: context #1") and "more than the" in lines[0]
    assert ".py" not in lines[0]
