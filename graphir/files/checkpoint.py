"""What a Hugging Face checkpoint's files declare, read without their data: a safetensors file's header (its
tensors' types, shapes and extents), checked as the safetensors library checks it, and its JSON files. Shared
by the converter (:mod:`graphir.convert`) and the config reader (:mod:`graphir.model.hf_config`), which
reads no weight."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

from gguf.utility import LocalTensor, LocalTensorRange

from graphir.errors import CheckpointError

_MAX_HEADER = 100 << 20  # the largest safetensors JSON header the safetensors library reads


def safetensors_header(path: Path) -> dict[str, LocalTensor]:
    """The tensors a safetensors file declares (data left unread), each checked as the safetensors library does:
    a dtype name, a shape of sizes, and data_offsets inside the file that overlap no other tensor's."""
    def corrupt(why: str) -> CheckpointError:
        return CheckpointError(f"{path}: corrupt safetensors header ({why})")

    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            n = struct.unpack("<Q", head)[0] if len(head) == 8 else -1
            if not 0 <= n <= min(size - 8, _MAX_HEADER):
                raise corrupt(f"a {size}-byte file cannot hold a {n}-byte header" if n >= 0 else "cut short")
            doc = json.loads(f.read(n).decode("utf-8"))
    except OSError as e:
        raise CheckpointError(f"{path}: cannot read ({e.strerror or e})") from None
    except (ValueError, RecursionError) as e:  # bad UTF-8 or JSON, or nested past Python's stack
        raise corrupt(f"not JSON: {reason(e)}") from None
    if not isinstance(doc, dict):
        raise corrupt("not a JSON object")
    start, tensors = 8 + n, {}
    for name, t in doc.items():
        if name == "__metadata__":
            continue
        t = t if isinstance(t, dict) else {}
        dtype, shape, offsets = t.get("dtype"), t.get("shape"), t.get("data_offsets")
        if not (isinstance(dtype, str) and isinstance(shape, list) and all(_is_size(d) for d in shape)
                and isinstance(offsets, list) and len(offsets) == 2 and all(_is_size(o) for o in offsets)):
            raise corrupt(f"tensor {name} is not {{dtype, shape, data_offsets}}: {clip(t)}")
        if not offsets[0] <= offsets[1] <= size - start:
            raise corrupt(f"tensor {name}'s data_offsets lie outside the file")
        tensors[name] = LocalTensor(dtype, tuple(shape), LocalTensorRange(path, start + offsets[0],
                                                                          offsets[1] - offsets[0]))
    spans = sorted((t.data_range.offset, t.data_range.size, name) for name, t in tensors.items())
    for (a, size_a, name_a), (b, _, name_b) in zip(spans, spans[1:]):
        if a + size_a > b:
            raise corrupt(f"tensors {name_a} and {name_b} overlap")
    return tensors


def _is_size(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def clip(v: Any, n: int = 80) -> str:
    """repr(v) cut to n characters: a malformed value quoted in a message stays one readable line."""
    r = repr(v)
    return r if len(r) <= n else r[:n - 3] + "..."


def reason(e: BaseException, n: int = 200) -> str:
    """An exception a parser raised, for a message: its type and text on one line, cut to n characters."""
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text if len(text) <= n else text[:n - 3] + '...'}"


def read_json(path: Path) -> Any:
    """A JSON file of a checkpoint (config, tokenizer, pooling module), or a one-line CheckpointError naming it."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        raise CheckpointError(f"{path}: not found") from None
    except IsADirectoryError:
        raise CheckpointError(f"{path}: is a directory, not a JSON file") from None
    except (OSError, ValueError, RecursionError) as e:  # bad JSON or UTF-8, or arrays nested past Python's stack
        raise CheckpointError(f"{path}: not readable JSON ({reason(e)})") from None
