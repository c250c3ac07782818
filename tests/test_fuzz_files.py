"""Specification: no GGUF file makes graphir crash, hang, or allocate what the file's size cannot justify.

A malformed header is a GraphirError naming the file and what is wrong where (``graphir dump``, ``info`` and
``hash`` print it as one line and exit 2; ``graphir.load`` raises it); counts and lengths are checked against
the bytes that remain before anything is allocated. A complete file whose tensor data is cut short, overlaps,
runs past the end or breaks the alignment is refused by ``graphir.load`` naming the tensor, and a process that
tries to run such a file ends normally (no SIGBUS or SIGSEGV from the memory map).

``test_mutated_files_end_in_success_or_a_graphir_error`` runs 2,003 cases of bench/fuzz_files.py's input classes
(bit flips, string edits, truncation, huge counts and lengths, bad value and tensor type ids, wrong shapes,
extreme hyperparameters, splices, bad offsets, damaged data) over the real SmolLM2, Gemma-3-270M and
all-MiniLM-L6-v2 headers (vocabularies cut to 256 tokens) and tiny models of every family: deterministic
(master seed 0), about 30 s. ``python3 bench/fuzz_files.py`` runs 100,000 and more on demand.
"""

from __future__ import annotations

import collections
import importlib.util
import struct
import subprocess
import sys
import tracemalloc
from pathlib import Path
from typing import Any, Callable

import gguf
import pytest

import graphir
import graphir.files.atomic as atomic
from graphir.cli import main
from graphir.errors import GGUFError, TensorError
from graphir.files.gguf_file import read_header, strip

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("fuzz_files", ROOT / "bench" / "fuzz_files.py")
fuzz = importlib.util.module_from_spec(_spec)  # type: ignore[arg-type]
sys.modules["fuzz_files"] = fuzz
_spec.loader.exec_module(fuzz)  # type: ignore[union-attr]

VT = gguf.GGUFValueType
QT = gguf.GGMLQuantizationType
HEADER_CLASSES = [k for k, (_, full) in fuzz.MUTATORS.items() if not full]
DATA_CLASSES = [k for k, (_, full) in fuzz.MUTATORS.items() if full]


@pytest.fixture(scope="module")
def seeds(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Every seed of the fuzzer: the real headers installed (vocabularies cut to 256 tokens), tiny models of
    every family, header-only and complete."""
    d = tmp_path_factory.mktemp("seeds")
    return fuzz.load_seeds(fuzz.write_seeds(d, fuzz.real_models(d), vocab=256))


def _sample(seeds: dict[str, Any]) -> list[Any]:
    """Per header class 195 cases on tiny headers, 12 on the real ones and 8 on complete tiny models (which
    load and decode); per data class 34 on complete tiny models: 2,003 cases."""
    tiny = sorted(n for n, s in seeds.items() if n.startswith("tiny-") and not s.full)
    real = sorted(n for n in seeds if not n.startswith("tiny-"))
    full = sorted(n for n, s in seeds.items() if s.full)
    out = []
    for k in HEADER_CLASSES:
        out += [*fuzz.cases(tiny, k, 195), *fuzz.cases(real, k, 12), *fuzz.cases(full, k, 8)]
    for k in DATA_CLASSES:
        out += fuzz.cases(full, k, 34)
    return out


def test_mutated_files_end_in_success_or_a_graphir_error(seeds: dict[str, Any], tmp_path: Path) -> None:
    """Each case ends in success or GraphirErrors: no other exception, no hang (30 s per case, in-process
    watchdog). Warnings (numpy's overflow in a kernel fed garbage weights) are counted, not failed."""
    assert {"smollm2", "gemma3", "minilm"} <= set(seeds), "the real models are installed (README's test command)"
    path = tmp_path / "case.gguf"
    tally: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    problems, dumped = [], 0
    sample = _sample(seeds)
    for case in sample:
        path.write_bytes(case.build(seeds, 0))
        out = fuzz.run_case(str(path), timeout=30)
        tally[case.klass][out.kind] += 1
        dumped += not out.detail.startswith("dump: ")  # the graph was built (a header-only file stops at load)
        if out.kind in ("wrong", "crash", "hang"):
            problems.append(f"{case}: {out.kind}: {out.detail}")
    assert len(sample) == 2003
    assert not problems, "\n".join(problems)
    assert dumped > 200, tally  # a tenth of the cases get as far as a graph: the mutations are not all fatal


# ---- explicit cases -------------------------------------------------------------------------------------------


def _field(seed: Any, kind: str, owner: str = "", i: int = 0) -> Any:
    return [f for f in seed.layout.fields[kind] if not owner or f.owner == owner][i]


def _with(seed: Any, kind: str, owner: str, value: int, i: int = 0) -> bytes:
    return fuzz._put_int(seed.data, _field(seed, kind, owner, i), value)


def _dump(path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    rc = main(["dump", str(path)])
    return rc, capsys.readouterr().err


def _read_error(path: Path) -> tuple[str, int]:
    """read_header's message (path stripped) and the peak of Python allocations while it failed."""
    tracemalloc.start()
    try:
        with pytest.raises(GGUFError) as e:
            read_header(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert str(e.value).startswith(f"{path}: ")
    return str(e.value)[len(f"{path}: "):], peak


def _key_index(seed: Any, key: str) -> str:
    keys = [f.owner for f in seed.layout.fields["vtype"]]
    return f"key {keys.index(key) + 1} of {len(keys)}"


@pytest.mark.parametrize("what", ["n_tensors", "key_len", "arch_len", "tokens", "token_len", "token_types"])
def test_a_count_or_length_beyond_the_file_fails_at_once_in_constant_memory(seeds: dict[str, Any], tmp_path: Path,
                                                                            what: str) -> None:
    """On the real SmolLM2 header: 2^40 tensor infos, a 2^62-byte key, architecture name or token, 2^62 tokens
    or token types. Nothing is allocated from a count or length: the reader fails where the bytes end, having
    held no more than the file."""
    smol = seeds["smollm2"]
    TOK, TT = gguf.Keys.Tokenizer.LIST, gguf.Keys.Tokenizer.TOKEN_TYPE
    edits = {
        "n_tensors": (("n_tensors", "", 2**40), "truncated inside tensor infos (tensor 273 of 1099511627776)"),
        "key_len": (("key_len", "", 2**62), f"truncated inside metadata (key 1 of {len(smol.layout.kv_starts) - 1})"),
        "arch_len": (("str_len", "general.architecture", 2**62),
                     f"truncated inside metadata ({_key_index(smol, 'general.architecture')}, 'general.architecture')"),
        "tokens": (("arr_count", TOK, 2**62), f"truncated inside metadata ({_key_index(smol, TOK)}, '{TOK}')"),
        "token_len": (("elem_len", TOK, 2**62), f"truncated inside metadata ({_key_index(smol, TOK)}, '{TOK}')"),
        "token_types": (("arr_count", TT, 2**62), f"truncated inside metadata ({_key_index(smol, TT)}, '{TT}')"),
    }
    (kind, owner, value), message = edits[what]
    p = tmp_path / f"{what}.gguf"
    p.write_bytes(_with(smol, kind, owner, value))
    got, peak = _read_error(p)
    assert got == message
    assert peak < 2 * len(smol.data) + (1 << 20), peak


def test_a_header_claiming_2_to_the_40_keys_or_tensors_holds_nothing(tmp_path: Path) -> None:
    """The fixed header alone, claiming 2^40 keys (or no key and 2^40 tensors): refused at the first record."""
    p = tmp_path / "counts.gguf"
    p.write_bytes(struct.pack("<4sIQQ", b"GGUF", 3, 0, 2**40))
    assert _read_error(p)[0] == "truncated inside metadata (key 1 of 1099511627776)"
    p.write_bytes(struct.pack("<4sIQQ", b"GGUF", 3, 2**40, 0))
    assert _read_error(p)[0] == "truncated inside tensor infos (tensor 1 of 1099511627776)"


def test_bad_type_ids_and_dimensions_name_the_key_or_tensor(seeds: dict[str, Any], tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    """Unknown value types, unknown or misfitting ggml types, and more than 4 dimensions, in the real SmolLM2
    header: one line naming the key or tensor, exit 2."""
    smol = seeds["smollm2"]
    unknown = next(i for i in range(64) if i not in {int(t) for t in QT})
    (tmp_path / "smol.gguf").write_bytes(smol.data)
    tensors = read_header(tmp_path / "smol.gguf").tensors
    q = tensors["blk.0.attn_q.weight"]  # Q4_1: as Q8_0 it would need more bytes than it has before the next tensor
    after_q = min((t for t in tensors.values() if t.offset > q.offset), key=lambda t: t.offset)
    cases = [
        (("vtype", "llama.block_count", 13), "unknown value type id 13 for key 'llama.block_count'"),
        (("arr_type", gguf.Keys.Tokenizer.LIST, 2**32 - 1),
         f"unknown value type id 4294967295 for the elements of '{gguf.Keys.Tokenizer.LIST}'"),
        (("ttype", "token_embd.weight", unknown), f"tensor 'token_embd.weight' has unknown ggml type id {unknown}"),
        (("ttype", "blk.0.attn_q.weight", QT.Q4_K),
         "tensor 'blk.0.attn_q.weight' has ne0=576, not a multiple of the Q4_K block size 256"),
        (("ttype", "output_norm.weight", QT.I32), "tensor 'output_norm.weight' has type i32, expected f32"),
        (("ttype", q.name, QT.Q8_0), f"tensor '{after_q.name}' at offset {after_q.offset} overlaps tensor '{q.name}' "
                                     f"(offset {q.offset}, {576 * 576 // 32 * 34} bytes)"),
        (("n_dims", "token_embd.weight", 5), "tensor 'token_embd.weight' has 5 dimensions (at most 4)"),
        (("n_dims", "token_embd.weight", 2**32 - 1),
         "tensor 'token_embd.weight' has 4294967295 dimensions (at most 4)"),
    ]
    for i, ((kind, owner, value), message) in enumerate(cases):
        p = tmp_path / f"{i}.gguf"
        p.write_bytes(_with(smol, kind, owner, value))
        assert _dump(p, capsys) == (2, f"graphir: error: {p}: {message}\n")


def test_a_file_cut_in_any_section_is_an_error_or_a_header(seeds: dict[str, Any], tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """The real Gemma-3-270M header cut inside its fixed header, metadata and tensor infos is refused as
    truncated there; cut inside the padding before the data, it is a whole header (and dumps)."""
    g = seeds["gemma3"]
    names = [g.data[f.start:f.end].decode() for f in g.layout.fields["name"]]
    n_kv, n_ti = len(g.layout.kv_starts) - 1, len(names)
    last = g.layout.ti_starts[-2]
    cuts = {
        10: "truncated inside the file header (10 of 24 bytes)",
        g.layout.kv_starts[1] + 3: f"truncated inside metadata (key 2 of {n_kv})",
        last + 8 + len(names[-1]) + 2: f"truncated inside tensor infos (tensor {n_ti} of {n_ti}, '{names[-1]}')",
    }
    for cut, message in cuts.items():
        p = tmp_path / f"cut{cut}.gguf"
        p.write_bytes(g.data[:cut])
        assert _dump(p, capsys) == (2, f"graphir: error: {p}: {message}\n")
    p = tmp_path / "padding.gguf"
    p.write_bytes(g.data + bytes(g.layout.data_start - len(g.data) - 1))
    assert _dump(p, capsys)[0] == 0


@pytest.mark.parametrize("projection", ["q", "k", "v"])
def test_bert_attention_names_bit_flipped_name_the_missing_projection(seeds: dict[str, Any], tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str],
                                                                      projection: str) -> None:
    """The issue's case: all-MiniLM-L6-v2 (BERT) with an attention projection's name bit-flipped
    (``attn_q`` -> ``attn_p``) once ended in an AttributeError; it names the tensor the graph needs."""
    m = seeds["minilm"]
    name = f"blk.0.attn_{projection}.weight"
    f = next(f for f in m.layout.fields["name"] if m.data[f.start:f.end] == name.encode())
    p = tmp_path / "flipped.gguf"
    i = f.start + len("blk.0.attn_")
    p.write_bytes(fuzz._put(m.data, i, i + 1, bytes([m.data[i] ^ 1])))
    assert _dump(p, capsys) == (2, f"graphir: error: {p}: missing tensor 'blk.0.attn_qkv.weight' (or '{name}' of "
                                   f"separate projections)\n")


def test_hyperparameters_out_of_range_are_refused_before_anything_is_built(seeds: dict[str, Any], tmp_path: Path,
                                                                           capsys: pytest.CaptureFixture[str]) -> None:
    """A layer count of 2^32-1 (which would loop for hours), sizes of 0, heads that do not divide, a Mamba
    state 2^31 wide (which a graph dump once allocated, 1 TiB): one line naming the key."""
    smol, mamba, t5 = seeds["smollm2"], seeds["tiny-mamba"], seeds["tiny-t5"]
    heads = ("attends with 9 query heads, 0 KV heads and heads of 64 (K) and 64 (V) values: attention needs at least "
             "one head of each, a positive head size and a whole number of query heads per KV head (keys "
             "'llama.attention.head_count', 'llama.attention.head_count_kv')")
    cases = [
        (smol, "llama.block_count", 2**32 - 1, "key 'llama.block_count' is 4294967295: it must be at most 512"),
        (smol, "llama.embedding_length", 0, "key 'llama.embedding_length' is 0: it must be at least 1"),
        (smol, "llama.attention.head_count_kv", 0, f"layer 0 {heads}"),
        (t5, "t5.attention.relative_buckets_count", 2, "key 't5.attention.relative_buckets_count' is 2: it must be "
                                                       "at least 4"),
        (mamba, "mamba.ssm.conv_kernel", 0, "key 'mamba.ssm.conv_kernel' is 0: it must be at least 1"),
        (mamba, "mamba.ssm.state_size", 2**31, "tensor 'blk.0.ssm_x.weight' has shape [128, 36], expected "
                                                "[128, 4294967300]"),
    ]
    for i, (seed, key, value, message) in enumerate(cases):
        p = tmp_path / f"{i}.gguf"
        p.write_bytes(_with(seed, "value", key, value))
        tracemalloc.start()
        try:
            assert _dump(p, capsys) == (2, f"graphir: error: {p}: {message}\n")
            assert tracemalloc.get_traced_memory()[1] < 64 << 20
        finally:
            tracemalloc.stop()


def test_a_float64_beyond_float32_reads_as_infinity(seeds: dict[str, Any], tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """A FLOAT64 RMS-norm epsilon of 1e300 (rounding it to float32 once raised OverflowError): float32's
    infinity, as C's cast gives, and the graph says so."""
    llama = seeds["tiny-llama"]
    key = "llama.attention.layer_norm_rms_epsilon"
    i = [f.owner for f in llama.layout.fields["vtype"]].index(key)
    start, end = llama.layout.kv_starts[i], llama.layout.kv_starts[i + 1]
    record = struct.pack("<Q", len(key)) + key.encode() + struct.pack("<Id", VT.FLOAT64, 1e300)
    p = tmp_path / "f64.gguf"
    p.write_bytes(llama.data[:start] + record + llama.data[end:])
    assert main(["dump", str(p)]) == 0
    assert "norm_rms_eps=inf" in capsys.readouterr().out


def test_a_splice_of_two_families_names_what_is_missing(seeds: dict[str, Any], tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """A llama's metadata with a BERT's tensor infos (counts made to agree): a readable GGUF whose tensors are
    not the architecture's."""
    llama, bert = seeds["tiny-llama"], seeds["tiny-bert"]
    data = llama.data[:llama.layout.kv_starts[-1]] + bert.data[bert.layout.ti_starts[0]:]
    p = tmp_path / "splice.gguf"
    p.write_bytes(data[:8] + struct.pack("<Q", len(bert.layout.ti_starts) - 1) + data[16:])
    assert _dump(p, capsys) == (2, f"graphir: error: {p}: missing tensor 'blk.0.attn_norm.weight'\n")


# ---- tensor data ---------------------------------------------------------------------------------------------

_RUN = """
import sys, graphir
for path in sys.argv[1:]:
    try:
        model = graphir.load(path)
        if path.endswith('shrinks.gguf'):
            open(path, 'r+b').truncate(model.meta.header.data_start + 100)
        model.new_context().prompt([1, 2, 3])
        print('ok')
    except graphir.errors.GraphirError as e:
        print(f'{type(e).__name__}: {e}')
"""


def test_bad_tensor_data_is_refused_naming_the_tensor_in_a_process_that_survives(seeds: dict[str, Any],
                                                                                  tmp_path: Path) -> None:
    """A complete tiny Llama with its data cut short, two tensors overlapping, one past the end, one off the
    alignment, and the file cut after load (the data is mapped at first use, and checked then): each is
    loaded and decoded in a child process, which reports a GraphirError and exits 0 (no SIGBUS, no SIGSEGV)."""
    full = seeds["tiny-llama.full"]
    lay, size = full.layout, len(full.data)
    names = [full.data[f.start:f.end].decode() for f in lay.fields["name"]]
    offsets = [int.from_bytes(full.data[f.start:f.end], "little") for f in lay.fields["offset"]]
    data_bytes = size - lay.data_start
    assert data_bytes % lay.alignment == 0  # so that an offset at the very end breaks no alignment
    intact = tmp_path / "intact.gguf"
    intact.write_bytes(full.data)
    second = read_header(intact).tensors[names[1]]
    files = {
        "cut.gguf": (full.data[:size - 1000],
                     f"GGUFError: {{p}}: tensor data truncated: '{names[-1]}' ends at byte {size} but the file has "
                     f"{size - 1000} bytes"),
        "overlap.gguf": (_with(full, "offset", names[2], offsets[1]),
                         f"GGUFError: {{p}}: tensor '{names[2]}' at offset {offsets[1]} overlaps tensor '{names[1]}' "
                         f"(offset {offsets[1]}, {second.n_bytes} bytes)"),
        "past.gguf": (_with(full, "offset", names[3], data_bytes),
                      f"GGUFError: {{p}}: tensor '{names[3]}' has offset {data_bytes}, past the end of the file's "
                      f"{data_bytes} bytes of tensor data"),
        "unaligned.gguf": (_with(full, "offset", names[3], offsets[3] + 4),
                           f"GGUFError: {{p}}: tensor '{names[3]}' has offset {offsets[3] + 4}, not a multiple of "
                           f"the alignment 32"),
        "shrinks.gguf": (full.data, f"TensorError: {{p}}: the file changed since its header was read "
                                    f"({lay.data_start + 100} bytes, was {size})"),
    }
    for name, (data, _) in files.items():
        (tmp_path / name).write_bytes(data)
    paths = [str(tmp_path / name) for name in files]
    r = subprocess.run([sys.executable, "-c", _RUN, *paths], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [msg.format(p=p) for p, (_, msg) in zip(paths, files.values())]


# ---- strip writes atomically ---------------------------------------------------------------------------------


def _failing_open(after: int, exc: BaseException) -> Callable[..., Any]:
    """``open`` whose files raise ``exc`` once ``after`` bytes have been written (a full disk, an interrupt)."""
    def opener(file: Any, mode: str = "r", *args: Any, **kw: Any) -> Any:
        f = open(file, mode, *args, **kw)
        write = f.write

        def failing(data: bytes) -> int:
            write(data[:after])
            raise exc
        f.write = failing
        return f
    return opener


@pytest.mark.parametrize("exc", [OSError(28, "No space left on device"), KeyboardInterrupt()],
                         ids=["enospc", "interrupt"])
def test_strip_that_fails_midway_leaves_the_destination_as_it_was(seeds: dict[str, Any], tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch,
                                                                  exc: BaseException) -> None:
    src, dst = tmp_path / "model.gguf", tmp_path / "out.gguf"
    src.write_bytes(seeds["tiny-llama.full"].data)
    dst.write_bytes(b"the old output")
    monkeypatch.setattr(atomic, "open", _failing_open(100, exc), raising=False)
    if isinstance(exc, OSError):
        with pytest.raises(GGUFError, match=rf"^{dst}: cannot write \(No space left on device\)$"):
            strip(src, dst)
    else:
        with pytest.raises(KeyboardInterrupt):
            strip(src, dst)
    assert dst.read_bytes() == b"the old output"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.gguf", "out.gguf"]  # no temporary file left
    monkeypatch.undo()
    assert strip(src, dst).header_only and dst.stat().st_size == read_header(src).header_end


def test_a_weight_type_the_backend_cannot_run_is_a_tensor_error(seeds: dict[str, Any], tmp_path: Path) -> None:
    """A complete tiny Llama whose first layer's attention output matrix is Q8_1 (a GGUF type the numba backend
    does not run; 36 bytes per 32 values, so its extent shrinks and overlaps nothing): graphir.load raises a
    TensorError naming the tensor and its type, before any context is made."""
    p = tmp_path / "q8_1.gguf"
    p.write_bytes(_with(seeds["tiny-llama.full"], "ttype", "blk.0.attn_output.weight", QT.Q8_1))
    with pytest.raises(TensorError, match=rf"^{p}: tensor 'blk.0.attn_output.weight' is Q8_1, a type the numba "
                                          rf"backend does not multiply \(it runs BF16, F16, F32, IQ1_M, IQ1_S, "
                                          rf"IQ2_S, IQ2_XS, IQ2_XXS, IQ3_S, IQ3_XXS, IQ4_NL, IQ4_XS, MXFP4, Q2_K, Q3_K, "
                                          rf"Q4_0, Q4_1, Q4_K, Q5_0, Q5_1, Q5_K, Q6_K, Q8_0, TQ1_0, TQ2_0\)$"):
        graphir.load(str(p))


def test_an_expert_stack_of_a_type_the_backend_cannot_run_is_a_tensor_error(seeds: dict[str, Any],
                                                                             tmp_path: Path) -> None:
    """A stack of experts (3-D, so not a matrix the load-time check reads) retyped to Q8_1: the first decode
    raises a TensorError naming it, where the backend would have raised NotImplementedError."""
    p = tmp_path / "q8_1.gguf"
    p.write_bytes(_with(seeds["tiny-qwen3moe.full"], "ttype", "blk.0.ffn_gate_exps.weight", QT.Q8_1))
    with pytest.raises(TensorError, match=rf"^{p}: tensor 'blk.0.ffn_gate_exps.weight' is Q8_1, a type the backend "
                                          rf"does not multiply$"):
        graphir.load(str(p)).new_context(n_ctx=16).prompt([1, 2, 3])


def test_hparams_that_disagree_with_a_tensor_are_refused_at_load_before_any_memory_is_sized(
        seeds: dict[str, Any], tmp_path: Path) -> None:
    """A Mamba whose conv kernel width says 16777221 while its conv weights hold 4 columns: refused by
    graphir.load naming the tensor, not by a context allocating states of 2^31 values (the fuzzer's find)."""
    p = tmp_path / "conv.gguf"
    p.write_bytes(_with(seeds["tiny-mamba.full"], "value", "mamba.ssm.conv_kernel", 16777221))
    with pytest.raises(TensorError, match=rf"^{p}: tensor 'blk.0.ssm_conv1d.weight' has shape \[4, 128\], expected "
                                          rf"\[16777221, 128\] \(and 1 more: graphir check lists them\)$"):
        graphir.load(str(p))
