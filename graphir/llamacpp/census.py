"""The census: every architecture the installed llama.cpp knows, whether graphir has it, and whether the two
build the same graph of it (on a header generated from graphir's first preset of that architecture)."""

from __future__ import annotations

from dataclasses import dataclass

from graphir.errors import GraphirError


@dataclass(frozen=True)
class Entry:
    arch: str
    graphir: bool
    preset: str | None  # the preset whose header was compared (None: graphir has no preset of it)
    verdict: str  # "agrees (prefill, decode)", "differs in decode: <first difference>", "llama.cpp: <cause>", ""


def _verdict(preset: str) -> str:
    from graphir.llamacpp.compare import agreement
    from graphir.model.meta import from_preset
    from graphir.model.presets import all_presets

    try:
        phases = agreement(from_preset(preset, all_presets()[preset]))
    except GraphirError as e:
        return str(e)
    differing = [(phase, first) for phase, first in phases.items() if first is not None]
    if not differing:
        return f"agrees ({', '.join(phases)})"
    phase, first = differing[0]
    return f"differs in {phase}: {first}"


def census() -> list[Entry]:
    from graphir import arch as archs
    from graphir.llamacpp.reading import known_archs
    from graphir.model import presets

    presets.all_presets()  # every family's presets registered
    ours = set(archs.names())
    entries = []
    for name in known_archs():
        if name not in ours:
            entries.append(Entry(name, False, None, ""))
            continue
        preset = next((p for p, spec in presets.PRESETS.items() if spec.arch == name), None)  # as declared
        entries.append(Entry(name, True, preset, _verdict(preset) if preset else "no preset to generate a header from"))
    return entries
