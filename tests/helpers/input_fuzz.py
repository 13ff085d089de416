"""A seeded fuzzer over the inputs a job names besides checkpoints: a prepared folder (its
manifest, shards and held-out files), a Megatron-LM folder (`.idx` and `.bin`), a
tokenizer (a tiktoken file; a Hugging Face folder's files) and the job's TOML, run in one
child interpreter by `tests/unit/test_input_fuzz.py`:

    python -m tests.helpers.input_fuzz RESULTS.json --cases N --seed S [--guard-cases M]

It prepares one small folder with the product (`prepare_corpus`, a tiktoken tokenizer made
here), then for each case copies the inputs, mutates one (`MUTATIONS`: bytes flipped, cut,
spliced or repeated; the structure: keys dropped, values swapped for other types, numbers
for huge, negative, NaN or fractional ones, nesting, names that leave the folder; the file
itself swapped for a symlink outside, a FIFO, a device, a folder or a 4 GiB sparse file),
and reads it as the product does (`read_prepared`, `read_megatron`, `read_tokenizer`,
`read_toml`). A case passes when it reads, or ends in one ConfigError line that hides no
resource error; and it opens no file outside its folder (an audit hook), ends within its
alarm, and what it accepted is sound (the oracles: token ids below the vocabulary, a
Megatron stream equal to the sequences its index describes, blend shares equal to the exact
ones, numbers that torch's optimizer and int64 take, a dump folder the OS can
name). The process runs under `MEMORY_LIMIT` of address space.

Then, with `--guard-cases M`, for each guard of `_guards()` in turn: switch it off, fuzz
until the first failure that the same case with every guard on does not show (at most M
cases), switch it back on; RESULTS.json's `found` holds that failure per guard (None: the
fuzzer missed the hole).
"""

from __future__ import annotations

import argparse
import base64
import dataclasses
import importlib
import json
import math
import os
import random
import resource
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path
from typing import Any

from tests.helpers.fuzzing import OpenWatch, raise_timeout, read_outcome
from tests.helpers.megatron import from_prepared, index_fields

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

MEMORY_LIMIT = 3 << 30
"""Address space of the fuzzing process."""
CASE_SECONDS = 20.0
HIDDEN = ("MemoryError", "RecursionError", "CaseTimeout")
"""Failures a one-line refusal must not hide."""
SEQ_LEN = 16
TOML_BASE = """[job]
dump_folder = "{out}"

[model]
name = "boost_llama"
flavor = "debug"

[optimizer]
lr = 0.003
eps = 1e-8

[training]
local_batch_size = 2
seq_len = 64
steps = 10

[lr_scheduler]
warmup_steps = 2

[boost]
data_mix = "a={a}:0.7,b={b}:0.3"
"""


# ---- the inputs -----------------------------------------------------------------------------
def write_tiktoken(folder: Path) -> Path:
    """A tiktoken BPE file: the 256 bytes and a few merges."""
    folder.mkdir(parents=True)
    merges = [b"th", b"he", b"the", b" t", b"in", b"an", b"er", b"on", b" the"]
    tokens = [bytes([i]) for i in range(256)] + merges
    lines = [f"{base64.b64encode(t).decode()} {rank}" for rank, t in enumerate(tokens)]
    (folder / "x.tiktoken").write_text("\n".join(lines) + "\n")
    return folder


def write_hf(folder: Path) -> Path:
    from tokenizers import Tokenizer, models, pre_tokenizers

    folder.mkdir(parents=True)
    vocab = {w: i for i, w in enumerate(["<unk>", "<s>", "</s>", "the", "a", "fox"])}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(folder / "tokenizer.json"))
    config = {"bos_token": "<s>", "eos_token": "</s>", "add_bos_token": True}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


def write_prepared(out: Path, tokenizer: Path, corpus: Path) -> None:
    from boost_titan.data import prepare_corpus

    rng = random.Random(0)
    words = "the quick brown fox jumps over a lazy dog and then the end".split()
    corpus.mkdir()
    with open(corpus / "a.jsonl", "w") as f:
        for _ in range(120):
            text = " ".join(rng.choice(words) for _ in range(rng.randint(3, 30)))
            f.write(json.dumps({"text": text}) + "\n")
    plan = prepare_corpus.make_plan(
        [str(corpus)], str(tokenizer), chunk_mb=0.002, held_out_percent=10
    )
    prepare_corpus.prepare(plan, str(out), 1)


# ---- mutations ------------------------------------------------------------------------------
ODD_VALUES: list[Any] = [
    None, True, 0, -1, 7, 4.5, 2**31, 2**64, 1e308, "", "x", "4096", [], {}, [1, 2], {"a": 1},
    float("nan"), float("inf"), "../outside/stolen", "/etc/group", "shard-00000", "a\0b",
]  # fmt: skip
NUMBERS: list[Any] = [
    0, -1, 1, 2**31, 2**63, 2**64, 2**70, 10**8, 1e8, 1e308, -1e308, 5e-324, 0.5,
    float("nan"), float("inf"), float("-inf"), 1.7e308, 0.17e308, 3.0,
]  # fmt: skip
HUGE = [1.7e308, 0.17e308, 1e308, 9e307]
"""Blend weights whose sum overflows."""
SNIPPETS = [b"[", b"]", b"{", b"}", b'"', b",", b":", b"\\", b"\0", b"\n", b"=", b"[[", b'"""']
SNIPPETS += [b"\xff\xfe", b"NaN", b"1e999", b"-", b"99999999999999999999999", b" " * 50]


def mutate_bytes(rng: random.Random, data: bytes) -> tuple[bytes, str]:
    kind = rng.choice(["flip", "truncate", "splice", "cut", "repeat", "nest"])
    at = rng.randrange(len(data) + 1)
    if kind == "flip" and data:
        out = bytearray(data)
        for _ in range(rng.randint(1, 8)):
            out[rng.randrange(len(out))] ^= 1 << rng.randrange(8)
        return bytes(out), kind
    if kind == "truncate":
        return data[:at], kind
    if kind == "nest":
        depth = rng.choice([50, 5_000, 200_000])
        return data[:at] + b"[" * depth + b"]" * depth + data[at:], f"nest {depth}"
    end = min(len(data), at + rng.randint(1, 64))
    if kind == "cut":
        return data[:at] + data[end:], kind
    if kind == "repeat":
        return data[:end] + data[at:end] * rng.randint(1, 50) + data[end:], kind
    snippet = rng.choice(SNIPPETS) if rng.random() < 0.8 else rng.randbytes(rng.randint(1, 9))
    return data[:at] + snippet + data[at:], "splice"


def paths_in(value: Any, prefix: tuple = ()) -> list[tuple]:
    """Every key path of a JSON-like value (dict keys, list indices)."""
    found = [prefix] if prefix else []
    if isinstance(value, dict):
        for key, item in value.items():
            found += paths_in(item, (*prefix, key))
    elif isinstance(value, list):
        for i, item in enumerate(value[:8]):
            found += paths_in(item, (*prefix, i))
    return found


def mutate_structure(rng: random.Random, value: dict, numbers_only: bool = False) -> str:
    """Drop a key, or set a value to another type, a hostile number or a deep nesting."""
    paths = paths_in(value)
    if numbers_only:
        paths = [p for p in paths if isinstance(_get(value, p), (int, float))] or paths
    path = rng.choice(paths)
    parent = _get(value, path[:-1])
    kind = rng.choice(["number", "number", "odd", "odd", "drop", "deep", "wrap"])
    if kind == "drop" and isinstance(parent, dict):
        del parent[path[-1]]
    elif kind == "number":
        parent[path[-1]] = rng.choice(NUMBERS)
    elif kind == "deep":
        deep: Any = 1
        for _ in range(rng.choice([30, 3_000])):
            deep = [deep]
        parent[path[-1]] = deep
    elif kind == "wrap":
        parent[path[-1]] = [parent[path[-1]]]
    else:
        parent[path[-1]] = rng.choice(ODD_VALUES)
    return f"{kind} {'.'.join(map(str, path))}"


def _get(value: Any, path: tuple) -> Any:
    for part in path:
        value = value[part]
    return value


def swap_file(rng: random.Random, path: Path, outside: Path) -> str:
    """Replace `path` by a symlink outside or to a device, a FIFO, a folder or a sparse 4 GiB
    file."""
    kind = rng.choice(["symlink", "zero", "fifo", "folder", "sparse", "empty"])
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()
    if kind == "symlink":
        path.symlink_to(outside)
    elif kind == "zero":
        path.symlink_to("/dev/zero")
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "folder":
        path.mkdir()
    elif kind == "sparse":
        with open(path, "wb") as f:
            f.truncate(4 << 30)
    else:
        path.write_bytes(b"")
    return kind


def _dump_json(value: Any) -> bytes:
    try:
        return json.dumps(value).encode()
    except RecursionError:
        return b"[" * 100_000 + b"]" * 100_000


def mutate_manifest(rng: random.Random, case: Path) -> str:
    path = case / "prepared" / "manifest.json"
    kind = rng.choice(["bytes", "structure", "structure", "structure", "name", "swap"])
    if kind == "bytes":
        data, what = mutate_bytes(rng, path.read_bytes())
        path.write_bytes(data)
    elif kind == "swap":
        what = swap_file(rng, path, case / "outside" / "manifest.json")
    else:
        manifest = json.loads(path.read_text())
        if kind == "name":
            shard = rng.choice(manifest["shards"])
            names = [str(case / "outside" / "stolen"), "../outside/stolen", "sub/x", ".hidden"]
            shard["name"] = what = rng.choice([*names, "a" * 300, "x\0y", 7, None])
        else:
            what = mutate_structure(rng, manifest)
        path.write_bytes(_dump_json(manifest))
    return f"manifest {kind} {what}"


def mutate_shard(rng: random.Random, case: Path) -> str:
    folder = case / "prepared"
    shard = rng.choice(sorted(folder.glob("*.bin")))
    kind = rng.choice(["ids", "ids", "size", "swap"])
    if kind == "ids":
        data = bytearray(shard.read_bytes())
        at = rng.randrange(0, len(data) - 1, 2)
        data[at : at + 2] = rng.choice([4096, 65535, 300, 271]).to_bytes(2, "little")
        shard.write_bytes(bytes(data))
        return f"shard ids {shard.name}"
    if kind == "size":
        data = shard.read_bytes()
        shard.write_bytes(data[: rng.randrange(len(data))] if rng.random() < 0.5 else data * 2)
        return f"shard size {shard.name}"
    return f"shard swap {swap_file(rng, shard, case / 'outside' / 'stolen.bin')}"


def mutate_held_out(rng: random.Random, case: Path) -> str:
    held_out = case / "prepared" / "held_out"
    if rng.random() < 0.3:
        shutil.move(held_out, case / "elsewhere")
        held_out.symlink_to(case / "elsewhere")
        return "held_out folder symlink"
    victim = rng.choice(sorted(held_out.iterdir()))
    return f"held_out swap {swap_file(rng, victim, case / 'outside' / 'group.txt')}"


def mutate_tiktoken(rng: random.Random, case: Path) -> str:
    path = case / "tiktoken" / "x.tiktoken"
    kind = rng.choice(["bytes", "rank", "rank", "line", "swap"])
    if kind == "swap":
        return f"tiktoken swap {swap_file(rng, path, case / 'outside' / 'x.tiktoken')}"
    lines = path.read_bytes().splitlines()
    at = rng.randrange(len(lines))
    if kind == "bytes":
        data, what = mutate_bytes(rng, path.read_bytes())
        path.write_bytes(data)
        return f"tiktoken bytes {what}"
    if kind == "rank":
        rank = rng.choice([-1, 2**31, 2**32 + 5, 2**63, 2**64, 10**30, 100_000_001, 5, 0])
        lines[at] = lines[at].split()[0] + b" %d" % rank
        what = f"rank {rank}"
    else:
        lines[at] = rng.choice([b"", b"x", b"AA== 1 2", b"!!! 3", b"QUE= 1.5", b"QQ== 0x10"])
        what = f"line {lines[at]!r}"
    path.write_bytes(b"\n".join(lines) + b"\n")
    return f"tiktoken {what}"


def mutate_hf(rng: random.Random, case: Path) -> str:
    folder = case / "hf"
    name = rng.choice(["tokenizer_config.json", "tokenizer_config.json", "tokenizer.json"])
    path = folder / name
    if name == "tokenizer.json" or rng.random() < 0.3:
        return f"hf {name} swap {swap_file(rng, path, case / 'outside' / name)}"
    if rng.random() < 0.5:
        data, what = mutate_bytes(rng, path.read_bytes())
        path.write_bytes(data)
        return f"hf {name} bytes {what}"
    config = json.loads(path.read_text())
    what = mutate_structure(rng, config)
    path.write_bytes(_dump_json(config))
    return f"hf {name} structure {what}"


MEGATRON_NUMBERS = [0, 1, 2, 255, 2**31 - 1, 2**32, 2**40, 2**62, 2**63 - 1, 2**64 - 1]


def mutate_megatron(rng: random.Random, case: Path) -> str:
    """A pair of the Megatron folder: the `.idx`'s bytes, a header field, one entry of its
    lengths, pointers or document indices; the `.bin`'s size or ids; either file swapped."""
    from tests.helpers.megatron import index_bytes

    prefix = rng.choice(sorted((case / "megatron").glob("*.idx"))).with_suffix("")
    idx, data = Path(f"{prefix}.idx"), Path(f"{prefix}.bin")
    kind = rng.choice(["bytes", "header", "header", "header", "entry", "entry", "bin", "swap"])
    if kind == "bytes":
        mutated, what = mutate_bytes(rng, idx.read_bytes())
        idx.write_bytes(mutated)
    elif kind == "header":
        fields = index_fields(prefix)
        key = rng.choice(["code", "version", "sequences", "sequences", "documents", "documents"])
        value = rng.choice([*MEGATRON_NUMBERS, len(fields["lengths"]) + rng.choice([-1, 1])])
        if key == "code":
            fields["code"] = value = rng.choice([0, 6, 7, 9, 255, 1, 2, 4, 5])
        elif key == "version":
            fields["version"] = value
        else:
            counts = [len(fields["lengths"]), len(fields["document_indices"])]
            counts[key == "documents"] = value
            fields["counts"] = tuple(counts)
        idx.write_bytes(index_bytes(**fields))
        what = f"{key} {value}"
    elif kind == "entry":
        fields = index_fields(prefix)
        key = rng.choice(["lengths", "pointers", "document_indices"])
        at = rng.randrange(len(fields[key]))
        top = 2**31 - 1 if key == "lengths" else 2**63 - 1
        fields[key][at] = value = rng.choice([-1, 0, 1, 3, 2**31 - 1, 2**40, top, -(2**31)])
        fields[key][at] = max(-top - 1, min(top, fields[key][at]))
        idx.write_bytes(index_bytes(**fields))
        what = f"{key}[{at}] {value}"
    elif kind == "bin":
        raw = bytearray(data.read_bytes())
        if rng.random() < 0.5 and len(raw) > 1:
            at = rng.randrange(0, len(raw) - 1, 2)
            raw[at : at + 2] = rng.choice([4096, 65535, 300, 271]).to_bytes(2, "little")
            what = "ids"
        else:
            raw = raw[: rng.randrange(len(raw))] if rng.random() < 0.5 else raw + raw[:6]
            what = "size"
        data.write_bytes(bytes(raw))
    else:
        victim = rng.choice([idx, data])
        what = f"{victim.suffix} {swap_file(rng, victim, case / 'outside' / victim.name)}"
    return f"megatron {kind} {what}"


@dataclasses.dataclass(frozen=True)
class Deep:
    """A TOML array nested `depth` deep (written as text: too deep to build)."""

    depth: int


def toml_text(value: Any) -> str:
    """A TOML value (inline tables and arrays, NaN and inf included)."""
    if isinstance(value, Deep):
        return "[" * value.depth + "]" * value.depth
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return (
            "nan"
            if math.isnan(value)
            else "inf"
            if value == math.inf
            else "-inf"
            if value == -math.inf
            else repr(value)
        )  # noqa: E501
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return json.dumps(value).replace("\\u0000", "\\u0000")
    if isinstance(value, list):
        return "[" + ", ".join(toml_text(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(k)} = {toml_text(v)}" for k, v in value.items()) + "}"
    return '"None"'


def write_toml(path: Path, data: dict) -> None:
    try:
        lines = []
        for section, table in data.items():
            if not isinstance(table, dict):
                lines.insert(0, f"{section} = {toml_text(table)}")
                continue
            lines.append(f"[{section}]")
            lines += [f"{key} = {toml_text(value)}" for key, value in table.items()]
    except RecursionError:  # nested deeper than this writer goes: as deep as the reader's
        lines = ["[training]", "steps = " + "[" * 100_000 + "]" * 100_000]
    path.write_text("\n".join(lines) + "\n")


def mutate_toml(rng: random.Random, case: Path) -> str:
    path = case / "job.toml"
    kinds = ["bytes", "structure", "numbers", "numbers", "mix", "mix", "nul", "nul", "deep"]
    kind = rng.choice(kinds)
    kind = "swap" if rng.random() < 0.12 else kind
    if kind == "swap":
        return f"toml swap {swap_file(rng, path, case / 'outside' / 'job.toml')}"
    if kind == "bytes":
        data, what = mutate_bytes(rng, path.read_bytes())
        path.write_bytes(data)
        return f"toml bytes {what}"
    data = tomllib.loads(path.read_text())
    if kind == "mix":
        pool = HUGE if rng.random() < 0.5 else NUMBERS
        weights = [rng.choice(pool) for _ in range(2)]
        a, b = (str(case / "prepared"), str(case / "prepared"))
        data["boost"]["data_mix"] = f"a={a}:{weights[0]!r},b={b}:{weights[1]!r}"
        what = f"weights {weights}"
    elif kind == "deep":
        section = rng.choice(sorted(data))
        key = rng.choice(sorted(data[section]))
        data[section][key] = Deep(rng.choice([500, 100_000]))
        what = f"{section}.{key} {data[section][key].depth}"
    elif kind == "nul":
        keys = [("job", "dump_folder"), ("job", "dump_folder"), ("model", "flavor")]
        section, key = rng.choice(keys)
        at = rng.randrange(len(data[section][key]) + 1)
        data[section][key] = data[section][key][:at] + "\0" + data[section][key][at:]
        what = f"{section}.{key}"
    else:
        what = mutate_structure(rng, data, numbers_only=kind == "numbers")
    write_toml(path, data)
    return f"toml {kind} {what}"


MUTATIONS: list[tuple[float, Callable[[random.Random, Path], str]]] = [
    (0.25, mutate_manifest),
    (0.12, mutate_shard),
    (0.08, mutate_held_out),
    (0.2, mutate_tiktoken),
    (0.1, mutate_hf),
    (0.25, mutate_toml),
    (0.12, mutate_megatron),
]


# ---- the readers and their oracles ----------------------------------------------------------
class Base:
    """What the clean inputs are (read once, before any guard is switched off)."""

    def __init__(self, work: Path) -> None:
        from boost_titan.data.prepared import tokenizer_fingerprint
        from boost_titan.data.tokenizer import load_tokenizer, tokenizer_files

        self.tiktoken = write_tiktoken(work / "clean" / "tiktoken")
        self.hf = write_hf(work / "clean" / "hf")
        write_prepared(work / "clean" / "prepared", self.tiktoken, work / "corpus")
        from_prepared(work / "clean" / "prepared", work / "clean" / "megatron")
        (work / "clean" / "outside").mkdir()
        self.fingerprint = tokenizer_fingerprint(tokenizer_files(str(self.tiktoken)))
        self.vocab = load_tokenizer(str(self.tiktoken)).get_vocab_size()


def _job(case: Path, mix: str = "", data: str = "prepared") -> Any:
    from types import SimpleNamespace as NS

    folder = str(case / data)
    return NS(
        training=NS(dataset="c4", dataset_path="" if mix else folder, seq_len=SEQ_LEN),
        validation=NS(dataset="c4_validation", dataset_path=""),
        boost=NS(data_mix=mix),
    )


def read_prepared(case: Path, base: Base) -> str:
    """As `check` and the loader read a prepared folder: manifest, shard sizes, the
    tokenizer's fingerprint and vocabulary, every shard's windows; then the held-out split
    as validation reads it. Oracle: every id of every window is below the vocabulary."""
    from boost_titan.data.held_out import validation_data
    from boost_titan.data.mix import MixedWindows, open_sources, training_sources

    sources = training_sources(_job(case).training, _job(case).boost)
    datasets = open_sources(sources)
    for dataset in datasets:
        dataset.check_tokenizer(base.fingerprint, str(base.tiktoken), base.vocab, base.vocab)
    windows = MixedWindows(sources, datasets, SEQ_LEN)
    for _, (inputs, labels) in zip(range(sum(windows.windows)), windows, strict=False):
        top = max(int(inputs["input"].max()), int(labels.max()))
        assert top < base.vocab, f"token id {top} past the vocabulary {base.vocab} was trained on"
    data = validation_data(_job(case))
    if data is not None:
        for _ in zip(range(1000), data.texts(), strict=False):
            pass
    return "ok"


def read_megatron(case: Path, base: Base) -> str:
    """As `check` and the loader read a Megatron folder: its pairs' indexes, the vocabulary,
    every window. Oracles: every id is below the vocabulary, and the stream is the pairs'
    sequences as Megatron reads them (each at its pointer, its length long)."""
    import numpy as np

    from boost_titan.data.mix import MixedWindows, open_sources, training_sources

    job = _job(case, data="megatron")
    sources = training_sources(job.training, job.boost)
    datasets = open_sources(sources, base.vocab)
    datasets[0].check_tokenizer("", str(base.tiktoken), base.vocab, base.vocab)
    windows = MixedWindows(sources, datasets, SEQ_LEN)
    for _, (inputs, labels) in zip(range(windows.windows[0]), windows, strict=False):
        top = max(int(inputs["input"].max()), int(labels.max()))
        assert top < base.vocab, f"token id {top} past the vocabulary {base.vocab} was trained on"
    expected = []
    for idx in sorted((case / "megatron").glob("*.idx")):
        fields, raw = index_fields(idx.with_suffix("")), idx.with_suffix(".bin").read_bytes()
        for pointer, length in zip(fields["pointers"], fields["lengths"], strict=True):
            expected.append(np.frombuffer(raw, "<u2", length, pointer))
    stream = np.concatenate(expected) if expected else np.empty(0, np.int64)
    read = datasets[0].read(0, datasets[0].tokens)
    assert np.array_equal(read, stream), "the stream is not the sequences the index describes"
    return "ok"


def read_tokenizer(case: Path, kind: str) -> str:
    """As `check` and the workers load a tokenizer: its files' fingerprint, the tokenizer,
    an encoding. Oracle: the ids are below its vocabulary."""
    from boost_titan.data.prepared import tokenizer_fingerprint
    from boost_titan.data.tokenizer import load_tokenizer, tokenizer_files

    assets = str(case / kind)
    tokenizer_fingerprint(tokenizer_files(assets))
    tokenizer = load_tokenizer(assets)
    ids = tokenizer.encode("the quick fox and the end", add_bos=True, add_eos=True)
    vocab = tokenizer.get_vocab_size()
    assert all(0 <= i < vocab for i in ids if i is not None), f"id past vocabulary {vocab}"
    return "ok"


def read_toml(case: Path) -> str:
    """As `check` parses a job: the TOML, its types and bounds, the blend. Oracles: torch's
    optimizer takes the numbers, int64 holds the counts, the dump folder can be named, the
    blend's shares are the exact ones."""
    import torch

    from boost_titan.config import bounds
    from boost_titan.config.cli import parse_job_config
    from boost_titan.data import mix

    job = parse_job_config(["--job.config_file", str(case / "job.toml")])
    bounds.check_bounds(job)
    o, t = job.optimizer, job.training
    param = torch.zeros(1, requires_grad=True)
    torch.optim.AdamW(
        [param], lr=o.lr, betas=(o.beta1, o.beta2), eps=o.eps, weight_decay=o.weight_decay
    )
    counts = [t.steps, t.local_batch_size * t.seq_len, job.lr_scheduler.warmup_steps]
    torch.tensor(counts, dtype=torch.int64)
    try:
        os.stat(job.job.dump_folder)
    except OSError:
        pass
    if job.boost.data_mix:
        sources = mix.parse_mix(job.boost.data_mix)
        shares = mix.normalized([s.weight for s in sources])
        exact = [Fraction(s.weight) / sum(Fraction(x.weight) for x in sources) for s in sources]
        assert all(abs(a - float(b)) <= 1e-12 for a, b in zip(shares, exact, strict=True)), (
            f"blend shares {shares} for weights {[s.weight for s in sources]}"
        )
    return "ok"


def read_case(case: Path, kind: str, base: Base) -> str:
    target = kind.split(" ")[0]
    if target in ("manifest", "shard", "held_out"):
        return read_prepared(case, base)
    if target in ("tiktoken", "hf"):
        return read_tokenizer(case, target)
    if target == "megatron":
        return read_megatron(case, base)
    return read_toml(case)


# ---- guards, switched off on purpose ----------------------------------------------------------
def _guards() -> dict[str, Callable[[], None]]:
    """Each guard's switch: replaces it by what the code did without it."""
    from boost_titan.config import bounds, cli
    from boost_titan.data import held_out, megatron_indexed, mix, prepared, tokenizer
    from boost_titan.data.megatron_indexed import MegatronDataset
    from boost_titan.data.prepared import PreparedDataset

    def plain_read(path: Path, what: str, limit: int) -> bytes:
        return Path(path).read_bytes()

    def naive(weights: list[float]) -> list[float]:
        return [w / sum(weights) for w in weights]

    def off(module: Any, name: str, value: Any) -> Callable[[], None]:
        return lambda: setattr(module, name, value)

    def each(*switches: Callable[[], None]) -> Callable[[], None]:
        return lambda: [switch() for switch in switches] and None

    nothing = lambda *args, **kwargs: None  # noqa: E731
    return {
        "confinement": off(
            prepared, "inside", lambda folder, name, suffix, what: folder / f"{name}{suffix}"
        ),
        "held-out confinement": off(held_out, "check_held_out", nothing),
        "special files and size caps": each(
            off(prepared, "read_capped", plain_read),
            off(tokenizer, "read_capped", plain_read),
            off(tokenizer, "regular_size", nothing),
            off(cli, "read_capped", plain_read),
        ),
        "manifest shape": off(prepared, "_manifest_problem", nothing),
        "manifest depth": off(prepared, "_parse_json", json.loads),
        "token ids": off(PreparedDataset, "check_block", nothing),
        "shard sizes (old)": off(PreparedDataset, "check_shards", nothing),
        "tiktoken ranks": off(tokenizer, "rank_problem", nothing),
        "toml depth": off(cli, "_parse_toml", lambda data: tomllib.loads(data.decode())),
        "toml types (old)": off(cli, "_check_fields", nothing),
        "toml NUL": off(cli, "_refuse_nul", nothing),
        "number bounds": off(bounds, "check_bounds", nothing),
        "blend weights": off(mix, "normalized", naive),
        "Megatron index size": off(megatron_indexed, "_check_size", nothing),
        "Megatron index arrays": off(
            megatron_indexed, "_check_arrays", lambda *a: a[-1] // a[2].itemsize
        ),
        "Megatron token ids": off(MegatronDataset, "check_block", nothing),
    }


def guard_names() -> list[str]:
    """The guards the fuzzer switches off, one at a time."""
    return list(_guards())


# ---- one case ----------------------------------------------------------------------------------
def run_case(
    case: Path, kind: str, base: Base, watch: OpenWatch, seconds: float
) -> tuple[str, str]:
    """(outcome, detail): "ok", "refused" or "FAIL"."""
    target = kind.split(" ")[0]
    own = {"manifest": "prepared", "shard": "prepared", "held_out": "prepared"}.get(target, "")
    own = {"tiktoken": "tiktoken", "hf": "hf", "megatron": "megatron"}.get(target, own)
    watch.folder, watch.outside = os.path.realpath(case / own), []
    outcome, detail, _ = read_outcome(lambda: read_case(case, kind, base), seconds, HIDDEN, watch)
    if watch.outside:
        outcome, detail = "FAIL", f"opened {watch.outside[0]} outside the folder ({detail})"
    return outcome, detail


def fresh_case(work: Path) -> Path:
    case = work / "case"
    if case.exists():
        for fifo in case.rglob("*"):  # rmtree would not follow a symlinked folder anyway
            if fifo.is_fifo():
                fifo.unlink()
        shutil.rmtree(case)
    shutil.copytree(work / "clean", case, symlinks=True)
    toml = TOML_BASE.format(out=case / "out", a=case / "prepared", b=case / "prepared")
    (case / "job.toml").write_text(toml)
    return case


def fuzz(
    work: Path,
    base: Base,
    watch: OpenWatch,
    ns: argparse.Namespace,
    results: dict,
    guard: str = "",
    clean: dict | None = None,
) -> dict | None:
    """Run `ns.cases` cases; failures go to `results`. With `guard` (switched off): stop at
    the first failure that the same case with every guard on does not show, and return it
    (a failure it does show is the product's own, recorded as one); `clean`: the guards
    on (`_snapshot`)."""
    for number in range(ns.cases):
        seed = f"{ns.seed}-{guard}-{number}"
        outcome, detail, kind = one_case(work, base, watch, ns, results, seed, number)
        if outcome != "FAIL":
            continue
        failure = {"case": number, "kind": kind, "detail": detail}
        if not guard:
            results["failures"].append(failure)
            continue
        switched = _snapshot()
        _restore(clean)
        again = one_case(work, base, watch, ns, results, seed, number)[0]
        _restore(switched)
        if again != "FAIL":
            return failure
        results["failures"].append(failure)
    return None


def one_case(
    work: Path,
    base: Base,
    watch: OpenWatch,
    ns: argparse.Namespace,
    results: dict,
    seed: str,
    number: int,
) -> tuple[str, str, str]:
    """(outcome, detail, mutation) of the case `seed`."""
    rng = random.Random(seed)
    case = fresh_case(work)
    kind = rng.choices([m for _, m in MUTATIONS], [w for w, _ in MUTATIONS])[0](rng, case)
    results["started"] = {"case": number, "kind": kind}
    _write(ns.results, results)
    outcome, detail = run_case(case, kind, base, watch, ns.case_seconds)
    results["outcomes"][outcome] = results["outcomes"].get(outcome, 0) + 1
    family = kind.split(" ")[0]
    results["kinds"][family] = results["kinds"].get(family, 0) + 1
    return outcome, detail, kind


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("results")
    parser.add_argument("--cases", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--guard-cases", type=int, default=0)
    parser.add_argument("--case-seconds", type=float, default=CASE_SECONDS)
    ns = parser.parse_args(argv)
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))
    signal.signal(signal.SIGALRM, raise_timeout)
    work = Path(tempfile.mkdtemp(prefix="input-fuzz-", dir=Path(ns.results).parent))
    results: dict[str, Any] = {"failures": [], "outcomes": {}, "kinds": {}, "found": {}}
    os.environ["BOOST_TITAN_CACHE"] = str(work / "cache")
    begun = time.monotonic()
    try:
        base = Base(work)
        results["setup_seconds"] = round(time.monotonic() - begun, 1)
        (work / "clean" / "outside" / "group.txt").write_text("root:x:0:\n")
        shutil.copy(
            next((work / "clean" / "prepared").glob("*.bin")),
            work / "clean" / "outside" / "stolen.bin",
        )
        watch = OpenWatch(work, ("/dev/", "/proc/", "/etc/"))
        start = time.monotonic()
        fuzz(work, base, watch, ns, results)
        results["seconds"] = round(time.monotonic() - start, 1)
        results["clean_outcomes"] = dict(results["outcomes"])
        results["clean_peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
        clean = _snapshot()
        ns.cases = ns.guard_cases
        for guard, switch in _guards().items():
            switch()
            results["found"][guard] = fuzz(work, base, watch, ns, results, guard, clean)
            _restore(clean)
        results["started"] = None
        results["guard_seconds"] = round(time.monotonic() - start - results["seconds"], 1)
        results["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
        _write(ns.results, results)
    finally:
        shutil.rmtree(work, ignore_errors=True)


SWITCHED = (
    "config.bounds",
    "config.cli",
    "data.held_out",
    "data.megatron_indexed",
    "data.mix",
    "data.prepared",
    "data.tokenizer",
)


def _snapshot() -> dict[str, dict[str, Any]]:
    """The globals of every module a switch touches, and the datasets' methods."""
    from boost_titan.data.megatron_indexed import MegatronDataset
    from boost_titan.data.prepared import PreparedDataset

    saved = {name: dict(vars(importlib.import_module(f"boost_titan.{name}"))) for name in SWITCHED}
    saved["PreparedDataset"] = dict(vars(PreparedDataset))
    saved["MegatronDataset"] = dict(vars(MegatronDataset))
    return saved


def _restore(saved: dict[str, dict[str, Any]]) -> None:
    from boost_titan.data.megatron_indexed import MegatronDataset
    from boost_titan.data.prepared import PreparedDataset

    for name in SWITCHED:
        vars(sys.modules[f"boost_titan.{name}"]).update(saved[name])
    for key in ("check_block", "check_shards"):
        setattr(PreparedDataset, key, saved["PreparedDataset"][key])
    MegatronDataset.check_block = saved["MegatronDataset"]["check_block"]


def _write(path: str, results: dict) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(results, f)
    os.replace(tmp, path)


if __name__ == "__main__":
    main()
