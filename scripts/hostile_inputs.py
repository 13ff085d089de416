"""Issue 46's hostile prepared data, tokenizers and TOMLs, rebuilt by hand from a prepared
folder the product wrote (made with the default tokenizer), each run through
`python -m boost_titan.check` under `/usr/bin/time -v`: exit status, the `error:` line,
wall time and peak RSS. The table in docs/reliability.md comes from it.

    python -m boost_titan.prepare --tokenizer default --out /tmp/prep --held-out-percent 10 \\
        --shard-mb 0.01 CORPUS
    python scripts/hostile_inputs.py /tmp/prep /tmp/hostile [PREFIX]

PREFIX: only the cases whose name starts with it. `tests/unit/test_hostile_inputs.py` runs
every case through `check` in one child and asserts each one line.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as `python scripts/hostile_inputs.py`
    sys.path.insert(0, str(ROOT))

from tests.helpers.megatron import from_prepared, index_fields, pointers_of, rewrite_index  # noqa: E402

DEBUG = str(ROOT / "train_configs" / "debug.toml")
Case = Callable[[Path, Path], list[str]]
"""(a fresh copy of the prepared folder, a scratch folder) -> check's arguments after the
base ones (debug.toml, the dump folder)."""


# ---- prepared data ---------------------------------------------------------------------------
def _manifest(folder: Path) -> dict:
    return json.loads((folder / "manifest.json").read_text())


def _put(folder: Path, manifest: object) -> None:
    (folder / "manifest.json").write_text(json.dumps(manifest))


def _edit(change: Callable[[dict], object]) -> Case:
    """A case whose manifest is `change(manifest)` (or the manifest changed in place)."""

    def case(folder: Path, scratch: Path) -> list[str]:
        manifest = _manifest(folder)
        out = change(manifest)
        _put(folder, manifest if out is None else out)
        return _data(folder)

    return case


def _data(folder: Path, *more: str) -> list[str]:
    return ["--training.dataset_path", str(folder), "--training.seq_len", "64", *more]


def _first_shard(folder: Path) -> tuple[dict, dict]:
    manifest = _manifest(folder)
    return manifest, manifest["shards"][0]


def shard_outside(how: str) -> Case:
    """The first shard named by an absolute path or a `..` path to a copy of it outside."""

    def case(folder: Path, scratch: Path) -> list[str]:
        manifest, shard = _first_shard(folder)
        outside = scratch / "outside"
        outside.mkdir(exist_ok=True)
        shutil.copy(folder / f"{shard['name']}.bin", outside / "stolen.bin")
        name = str(outside / "stolen") if how == "absolute" else "../outside/stolen"
        shard["name"] = name
        _put(folder, manifest)
        return _data(folder)

    return case


def shard_symlink(folder: Path, scratch: Path) -> list[str]:
    """The first shard a symlink to /etc/group, its token count set to the file's size."""
    manifest, shard = _first_shard(folder)
    target = Path("/etc/group")
    path = folder / f"{shard['name']}.bin"
    path.unlink()
    path.symlink_to(target)
    shard["tokens"] = target.stat().st_size // 2
    _put(folder, manifest)
    return _data(folder)


def shard_fifo(folder: Path, scratch: Path) -> list[str]:
    manifest, shard = _first_shard(folder)
    path = folder / f"{shard['name']}.bin"
    path.unlink()
    os.mkfifo(path)
    return _data(folder)


def ids_past_vocab(folder: Path, scratch: Path) -> list[str]:
    """Token id 65535 written into the last shard (the vocabulary has 4096)."""
    manifest = _manifest(folder)
    path = folder / f"{manifest['shards'][-1]['name']}.bin"
    data = bytearray(path.read_bytes())
    data[-4:-2] = b"\xff\xff"
    path.write_bytes(bytes(data))
    return _data(folder)


def held_out_symlink(folder: Path, scratch: Path) -> list[str]:
    held_out = folder / "held_out"
    victim = sorted(held_out.iterdir())[0]
    victim.unlink()
    victim.symlink_to("/etc/group")
    return _data(folder, "--validation.enable")


def held_out_folder_symlink(folder: Path, scratch: Path) -> list[str]:
    elsewhere = scratch / "elsewhere"
    shutil.move(folder / "held_out", elsewhere)
    (folder / "held_out").symlink_to(elsewhere)
    return _data(folder, "--validation.enable")


def manifest_deep(folder: Path, scratch: Path) -> list[str]:
    (folder / "manifest.json").write_text("[" * 200_000 + "]" * 200_000)
    return _data(folder)


def manifest_huge(folder: Path, scratch: Path) -> list[str]:
    """A manifest of 100 MB (a JSON string padded with spaces)."""
    text = json.dumps(_manifest(folder))[:-1] + ', "pad": "' + " " * 100_000_000 + '"}'
    (folder / "manifest.json").write_text(text)
    return _data(folder)


def manifest_fifo(folder: Path, scratch: Path) -> list[str]:
    (folder / "manifest.json").unlink()
    os.mkfifo(folder / "manifest.json")
    return _data(folder)


def _walk(m: object, key: str) -> tuple[object, str | int]:
    """The container holding `key` (dotted, list indices as numbers) and its last part."""
    *path, last = key.split(".")
    for part in path:
        m = m[int(part)] if isinstance(m, list) else m[part]
    return m, int(last) if isinstance(m, list) else last


def _drop(key: str) -> Callable[[dict], None]:
    def change(m: dict) -> None:
        target, last = _walk(m, key)
        del target[last]

    return change


def _set(key: str, value: object) -> Callable[[dict], None]:
    def change(m: dict) -> None:
        target, last = _walk(m, key)
        target[last] = value

    return change


def _float_tokens(m: dict) -> None:
    for shard in m["shards"]:
        shard["tokens"] = float(shard["tokens"])


def mix_overflow(folder: Path, scratch: Path) -> list[str]:
    """Weights 1.7e308 and 0.17e308 (sum past the float maximum): legitimate, trains 10:1."""
    other = scratch / "other"
    shutil.copytree(folder, other)
    spec = f"big={folder}:1.7e308,small={other}:0.17e308"
    return ["--boost.data_mix", spec, "--training.seq_len", "64"]


# ---- tokenizers ------------------------------------------------------------------------------
def _tiktoken(folder: Path, ranks: list[int]) -> Path:
    folder.mkdir(exist_ok=True)
    lines = [f"{base64.b64encode(bytes([i])).decode()} {i}" for i in range(256)]
    lines += [f"{base64.b64encode(b'ab%d' % i).decode()} {rank}" for i, rank in enumerate(ranks)]
    (folder / "x.tiktoken").write_text("\n".join(lines) + "\n")
    return folder


def tiktoken_rank(rank: int) -> Case:
    def case(folder: Path, scratch: Path) -> list[str]:
        return ["--model.hf_assets_path", str(_tiktoken(scratch / "tok", [rank]))]

    return case


def tiktoken_special(kind: str) -> Case:
    """A `*.tiktoken` that is a symlink to /dev/zero, or a FIFO."""

    def case(folder: Path, scratch: Path) -> list[str]:
        tok = scratch / "tok"
        tok.mkdir()
        if kind == "fifo":
            os.mkfifo(tok / "x.tiktoken")
        else:
            (tok / "x.tiktoken").symlink_to("/dev/zero")
        return ["--model.hf_assets_path", str(tok)]

    return case


def hf_config_zero(folder: Path, scratch: Path) -> list[str]:
    """A Hugging Face folder whose tokenizer_config.json is a symlink to /dev/zero."""
    from boost_titan.data.tokenizer import prepare_default_assets

    tok = scratch / "tok"
    tok.mkdir()
    shutil.copy(prepare_default_assets() / "tokenizer.json", tok / "tokenizer.json")
    (tok / "tokenizer_config.json").symlink_to("/dev/zero")
    return ["--model.hf_assets_path", str(tok)]


# ---- Megatron-LM datasets (`boost_titan.data.megatron_indexed`) -------------------------------
def megatron(change: Callable[[Path], None] | None = None) -> Case:
    """The prepared folder's shards as a Megatron folder of pairs, the first pair (its
    prefix) changed by `change`."""

    def case(folder: Path, scratch: Path) -> list[str]:
        out = from_prepared(folder, scratch / "megatron")
        if change is not None:
            change(out / "shard-00000")
        return _data(out)

    return case


def _pointer_past_end(prefix: Path) -> None:
    pointers = pointers_of(index_fields(prefix)["lengths"], 2)
    rewrite_index(prefix, pointers=pointers[:-1] + [1 << 40])


def _megatron_id_past_vocab(prefix: Path) -> None:
    data = bytearray(Path(f"{prefix}.bin").read_bytes())
    data[20:22] = (4096).to_bytes(2, "little")
    Path(f"{prefix}.bin").write_bytes(bytes(data))


# ---- TOMLs -------------------------------------------------------------------------------------
def toml(text: str) -> Case:
    """debug.toml with `text` appended (a key given twice is a TOML error: replace it)."""

    def case(folder: Path, scratch: Path) -> list[str]:
        base = Path(DEBUG).read_text()
        for line in text.splitlines():
            key = line.split(" ", 1)[1].split("=")[0].strip()
            base = re.sub(rf"(?m)^{re.escape(key)}\s*=.*$", "", base)
        path = scratch / "job.toml"
        path.write_text(_into_sections(base, text))
        return ["--job.config_file", str(path)]

    return case


def _into_sections(base: str, text: str) -> str:
    """`base` with each `[section] key = value` line of `text` put under its section."""
    for line in text.splitlines():
        section, assignment = line.split(" ", 1)
        if section in base:
            base = base.replace(section + "\n", f"{section}\n{assignment}\n", 1)
        else:
            base += f"\n{section}\n{assignment}\n"
    return base


def toml_deep(folder: Path, scratch: Path) -> list[str]:
    path = scratch / "job.toml"
    path.write_text("[training]\nsteps = " + "[" * 100_000 + "]" * 100_000 + "\n")
    return ["--job.config_file", str(path)]


def toml_fifo(folder: Path, scratch: Path) -> list[str]:
    os.mkfifo(scratch / "job.toml")
    return ["--job.config_file", str(scratch / "job.toml")]


CASES: dict[str, tuple[Case, str]] = {
    "00 clean prepared folder": (lambda f, s: _data(f), ""),
    "01 shard name absolute": (shard_outside("absolute"), "not a plain file name"),
    "02 shard name with ..": (shard_outside("dotdot"), "not a plain file name"),
    "03 shard a symlink to /etc/group": (shard_symlink, "is a symlink"),
    "04 shard a FIFO": (shard_fifo, "not a regular file"),
    "05 token id past the vocabulary": (ids_past_vocab, "past the manifest's vocab_size"),
    "06 held_out file a symlink": (held_out_symlink, "symlink"),
    "07 held_out folder a symlink": (held_out_folder_symlink, "symlink"),
    "08 manifest without dtype": (_edit(_drop("dtype")), "dtype"),
    "09 manifest dtype float64": (_edit(_set("dtype", "float64")), "dtype"),
    "10 manifest without tokenizer": (_edit(_drop("tokenizer")), "tokenizer"),
    "11 manifest shards = 7": (_edit(_set("shards", 7)), "shards is not a list"),
    "12 shard without a name": (_edit(_drop("shards.0.name")), "shard 0 has no name"),
    "13 manifest a list": (_edit(lambda m: [m]), "not an object"),
    "14 manifest 200k-deep JSON": (manifest_deep, "nested too deep"),
    "15 vocab_size a string": (_edit(_set("tokenizer.vocab_size", "4096")), "vocab_size"),
    "16 float token counts": (_edit(_float_tokens), "whole token"),
    "17 manifest 100 MB": (manifest_huge, "over the"),
    "18 manifest a FIFO": (manifest_fifo, "not a regular file"),
    "19 data_mix 1.7e308 : 0.17e308": (mix_overflow, ""),
    "20 tiktoken symlink to /dev/zero": (tiktoken_special("zero"), "not a regular file"),
    "21 tiktoken a FIFO": (tiktoken_special("fifo"), "not a regular file"),
    "22 tiktoken rank past int64": (tiktoken_rank(1 << 64), "outside 0.."),
    "23 tiktoken rank past uint32": (tiktoken_rank((1 << 32) + 5), "outside 0.."),
    "24 tokenizer_config.json to /dev/zero": (hf_config_zero, "not a regular file"),
    "25 vocab 100,000,004 (memory)": (tiktoken_rank(100_000_001), "does NOT fit"),
    "26 TOML 100k-deep array": (toml_deep, "nested too deep"),
    "27 TOML NUL in dump_folder": (toml('[job] dump_folder = "/tmp/a\\u0000b"'), "NUL"),
    "28 TOML lr = nan": (toml("[optimizer] lr = nan"), "optimizer.lr nan"),
    "29 TOML steps = 2^70": (toml(f"[training] steps = {1 << 70}"), "training.steps"),
    "30 TOML local_batch_size = 1e8": (
        toml("[training] local_batch_size = 100000000"),
        "training.local_batch_size",
    ),
    "31 TOML a FIFO": (toml_fifo, "not a regular file"),
    "32 Megatron folder (clean)": (megatron(), ""),
    "33 Megatron .idx counts 2^60": (
        megatron(lambda p: rewrite_index(p, counts=(1 << 60, 1 << 60))),
        "document indices need",
    ),
    "34 Megatron pointer past the .bin": (megatron(_pointer_past_end), "pointer is"),
    "35 Megatron dtype code 7 (float32)": (
        megatron(lambda p: rewrite_index(p, code=7)),
        "float32 values, not token ids",
    ),
    "36 Megatron token id past the vocabulary": (
        megatron(_megatron_id_past_vocab),
        "token id 4096, outside the vocabulary",
    ),
}
"""Name -> (builder, a fragment of the expected error line; "" for a job `check` accepts)."""


def timed(argv: list[str]) -> tuple[int, str, float, float, float]:
    """(exit status, the output's first `error:` line or its last line, wall s, CPU s (user
    + system: what the case costs, whatever else the machine runs), peak RSS MiB) of
    `python -m boost_titan.check ARGV` under /usr/bin/time -v (300 s at most)."""
    command = ["/usr/bin/time", "-v", sys.executable, "-m", "boost_titan.check", *argv]
    env = {k: v for k, v in os.environ.items() if k not in ("NGPU", "WORLD_SIZE", "RANK")}
    env["PYTHONPATH"] = str(ROOT)
    try:
        done = subprocess.run(
            command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
        )
    except subprocess.TimeoutExpired:
        return -1, "TIMEOUT after 300 s", 300.0, 0.0, 0.0
    stats, _, _ = done.stderr.rpartition("\tCommand being timed")[2].partition("\n\n")
    output = done.stdout + done.stderr.partition("\tCommand being timed")[0]
    lines = [line for line in output.splitlines() if line.strip()]
    shown = next((line for line in lines if line.startswith("error:")), lines[-1] if lines else "")
    if "Traceback" in output:
        shown = "TRACEBACK: " + lines[-1]
    wall = re.search(
        r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): (?:(\d+):)?(\d+):([\d.]+)", done.stderr
    )
    hours, minutes, seconds = (float(g or 0) for g in wall.groups())
    rss = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", done.stderr).group(1))
    cpu = sum(
        float(t) for t in re.findall(r"(?:User|System) time \(seconds\): ([\d.]+)", done.stderr)
    )
    return done.returncode, shown, 3600 * hours + 60 * minutes + seconds, cpu, rss / 1024


def build(name: str, prepared: Path, scratch: Path) -> list[str]:
    """Case `name` built under `scratch` from a copy of `prepared`: check's whole argv."""
    case_dir = scratch / re.sub(r"\W+", "-", name)
    shutil.rmtree(case_dir, ignore_errors=True)
    case_dir.mkdir(parents=True)
    folder = case_dir / "prepared"
    shutil.copytree(prepared, folder)
    extra = CASES[name][0](folder, case_dir)
    config = [] if "--job.config_file" in extra else ["--job.config_file", DEBUG]
    return [*config, "--job.dump_folder", str(case_dir / "out"), *extra]


def main() -> None:
    prepared, scratch = Path(sys.argv[1]), Path(sys.argv[2])
    prefix = sys.argv[3] if len(sys.argv) > 3 else ""
    print(f"load average at the start: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores\n")
    print("| case | exit | wall s | CPU s | peak RSS MiB | output |")
    print("|---|---|---|---|---|---|")
    for name in (n for n in CASES if n.startswith(prefix)):
        status, line, wall, cpu, rss = timed(build(name, prepared, scratch))
        line = line.replace(str(scratch), "…").replace("|", "\\|")
        line = line if len(line) <= 150 else line[:147] + "..."
        print(f"| {name} | {status} | {wall:.1f} | {cpu:.1f} | {rss:.0f} | `{line}` |", flush=True)


if __name__ == "__main__":
    main()
