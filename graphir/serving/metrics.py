"""``/metrics`` in Prometheus' text format: requests by endpoint and status, tokens, the queue, the slots in use
and how much of the context the running requests hold."""

from __future__ import annotations

from typing import Any

PREFIX = "graphir_"


def prometheus(service: Any) -> str:
    sched = service.scheduler
    c = sched.counters
    ctx = sched.ctx
    lines: list[str] = []

    def metric(name: str, kind: str, help: str, samples: list[tuple[str, float]]) -> None:
        lines.append(f"# HELP {PREFIX}{name} {help}")
        lines.append(f"# TYPE {PREFIX}{name} {kind}")
        lines.extend(f"{PREFIX}{name}{labels} {value:g}" if isinstance(value, float) else
                     f"{PREFIX}{name}{labels} {value}" for labels, value in samples)

    metric("http_responses_total", "counter", "HTTP responses sent, by endpoint and status.",
           [(f'{{path="{path}",status="{status}"}}', n) for (path, status), n in sorted(service.responses.items())])
    metric("requests_total", "counter", "Requests (prompts) that joined the queue.", [("", c["requests"])])
    metric("prompt_tokens_total", "counter", "Prompt tokens decoded.", [("", c["prompt_tokens"])])
    metric("prompt_tokens_cached_total", "counter", "Prompt tokens copied from another sequence instead of decoded.",
           [("", c["cached_tokens"])])
    metric("generated_tokens_total", "counter", "Tokens generated.", [("", c["generated_tokens"])])
    metric("decode_steps_total", "counter", "Batches decoded.", [("", c["steps"])])
    metric("decode_steps_failed_total", "counter", "Batches whose decode failed (their requests ended).",
           [("", c["failed_steps"])])
    metric("decode_seconds_total", "counter", "Time spent decoding batches.", [("", float(c["decode_s"]))])
    metric("requests_processing", "gauge", "Requests holding a slot.", [("", sched.busy())])
    metric("requests_waiting", "gauge", "Requests waiting for a slot.", [("", len(sched.waiting))])
    metric("slots", "gauge", "Slots (sequences of the context): --parallel.", [("", ctx.n_seq_max)])
    metric("kv_cells_used", "gauge", "Context cells the running requests hold.", [("", sched.cells_used())])
    metric("kv_cells", "gauge", "Context cells: -c/--ctx-size.", [("", ctx.n_ctx)])
    return "\n".join(lines) + "\n"
