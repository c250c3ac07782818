"""Benchmark: build and dump the Llama-3.1-405B preset graph (126 layers) without any weights.

Targets (issue "weightless graphs"): build + dump <= 100 ms in-process; `graphir dump` as a whole process
<= 1 s with peak RSS <= 200 MB. There is no llama.cpp counterpart to this job, so figures are printed
against those targets. Run: python bench/bench_graph.py
"""

from __future__ import annotations

import resource
import subprocess
import sys
import time

PRESET = "Llama-3.1-405B"


def best_ms(fn, repeat: int = 7) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times) * 1000


def main() -> None:
    from graphir.graph.forms import to_json, to_text
    from graphir.model.meta import open_model

    print(f"{'job':52} {'figure':>12} {'target':>10} {'ratio':>7}")

    def row(job: str, value: float, target: float, unit: str) -> None:
        print(f"{job:52} {value:>9.1f} {unit:<2} {target:>7.0f} {unit:<2} {value / target:>6.2f}x")

    for context, phase in [("kv", "prefill"), ("kv", "decode"), ("none", "prefill")]:
        n = len(open_model(PRESET).build_graph(context, phase).nodes)
        row(f"build+text {PRESET} {context}/{phase} ({n} nodes)",
            best_ms(lambda: to_text(open_model(PRESET).build_graph(context, phase))), 100, "ms")
    row(f"build+json {PRESET} kv/prefill", best_ms(lambda: to_json(open_model(PRESET).build_graph())), 100, "ms")
    row(f"build+full text {PRESET} kv/prefill",
        best_ms(lambda: to_text(open_model(PRESET).build_graph(), fold=False)), 100, "ms")

    cmd = [sys.executable, "-m", "graphir", "dump", PRESET, "-o", "/dev/null"]
    wall = best_ms(lambda: subprocess.run(cmd, check=True), repeat=5)
    rss_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    row("process: graphir dump (wall)", wall, 1000, "ms")
    row("process: graphir dump (peak RSS)", rss_mb, 200, "MB")


if __name__ == "__main__":
    main()
