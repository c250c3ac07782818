"""Benchmark: build and dump the Llama-3.1-405B (126 layers) and DeepSeek-V3 (61 layers of MLA, 256 experts in 58)
preset graphs without any weights.

Targets (issue "weightless graphs"): build + dump <= 100 ms in-process; `graphir dump` as a whole process
<= 1 s with peak RSS <= 200 MB; a diff of two 405B graphs <= 1 s. llama.cpp's own graph of the 405B header (`graphir dump llama.cpp:...`, graphir's
process and llama.cpp's child together) <= 2 s of processor time. There is no llama.cpp counterpart to these jobs,
so figures are printed against those targets. Run: python bench/bench_graph.py
"""

from __future__ import annotations

import resource
import subprocess
import sys
import time

PRESETS = ("Llama-3.1-405B", "DeepSeek-V3")


def best_ms(fn, repeat: int = 7) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times) * 1000


def main() -> None:
    from graphir.graph.diff import diff_graphs
    from graphir.graph.forms import from_text, to_json, to_text
    from graphir.model.meta import open_model

    print(f"{'job':52} {'figure':>12} {'target':>10} {'ratio':>7}")

    def row(job: str, value: float, target: float, unit: str) -> None:
        print(f"{job:52} {value:>9.1f} {unit:<2} {target:>7.0f} {unit:<2} {value / target:>6.2f}x")

    for preset in PRESETS:
        kinds = open_model(preset).graph_kinds()
        for context, phase in kinds:
            n = len(open_model(preset).build_graph(context, phase).nodes)
            row(f"build+text {preset} {context}/{phase} ({n} nodes)",
                best_ms(lambda: to_text(open_model(preset).build_graph(context, phase))), 100, "ms")
        context = kinds[0][0]
        row(f"build+json {preset} {context}/prefill", best_ms(lambda: to_json(open_model(preset).build_graph())), 100,
            "ms")
        row(f"build+full text {preset} {context}/prefill",
            best_ms(lambda: to_text(open_model(preset).build_graph(), fold=False)), 100, "ms")

        cmd = [sys.executable, "-m", "graphir", "dump", preset, "-o", "/dev/null"]
        wall = best_ms(lambda: subprocess.run(cmd, check=True), repeat=5)
        rss_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024  # the largest child so far
        row(f"process: graphir dump {preset} (wall)", wall, 1000, "ms")
        row(f"process: graphir dump {preset} (peak RSS)", rss_mb, 200, "MB")

    a = open_model("Llama-3.1-405B").build_graph("kv", "prefill")
    b = from_text(to_text(a, fold=False).replace("rms_norm(%blk.59.l_out) {eps=1e-05}",
                                                  "rms_norm(%blk.59.l_out) {eps=1e-06}"))
    row("diff: 405B against itself with one layer's eps edited", best_ms(lambda: diff_graphs(a, b)), 1000, "ms")
    row("processes: graphir dump llama.cpp:Llama-3.1-405B (cpu)", llama_cpp_dump_cpu_ms("Llama-3.1-405B"), 2000, "ms")


def llama_cpp_dump_cpu_ms(preset: str, repeat: int = 5) -> float:
    """Processor time of graphir's process and llama.cpp's child, each run measured from a fresh parent (whose
    only children they are), best of `repeat`."""
    probe = ("import resource, subprocess, sys; "
             f"subprocess.run([sys.executable, '-m', 'graphir', 'dump', 'llama.cpp:{preset}', '-o', '/dev/null'], "
             "check=True); r = resource.getrusage(resource.RUSAGE_CHILDREN); print(r.ru_utime + r.ru_stime)")
    return min(float(subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                                    check=True).stdout) for _ in range(repeat)) * 1000


if __name__ == "__main__":
    main()
