"""Train the debug model on prepared datasets (docs/datasets.md's figures).

    python scripts/bench_prepared_train.py [--scratch DIR]

On one process (tensor_parallel_degree 1, `./run_train.sh` with NGPU=1):
1. scale: a prepared dataset of 10 million tokens and one of 10 billion (uint16 shards of
   4 Mi tokens, as `prepare` writes them; the shards past the first are sparse files, so
   no 20 GB are written; the first shard holds the same real tokens in both). For each:
   the loader's first batch and RSS in a fresh interpreter (build the loader, read 20
   batches), and the wall time from launching `run_train.sh` to its first step's log line;
2. exact resume: 10 steps (checkpoints at 5 and 10), then a copy of the run holding only
   the step-5 checkpoint resumed to step 10: its losses of steps 6-10 against the
   uninterrupted run's, compared as floats;
3. blending: `--boost.data_mix web=...:0.7,code=...:0.3` for 10 steps, twice: the share
   line of the summary, and whether the two runs' losses are equal.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from scripts.bench_prepare import generate  # noqa: E402

SHARD_TOKENS = 4 << 20
TRAIN = ["--parallelism.tensor_parallel_degree", "1", "--validation.no_enable"]
FIRST_BATCH = """
import json, resource, sys, time
start = time.perf_counter()
from torchtitan.config import ConfigManager
from boost_titan.data import build_dataloader
from boost_titan.data.tokenizer import load_tokenizer
config = ConfigManager().parse_args(["--job.custom_config_module=boost_titan.config",
    "--job.config_file", "train_configs/debug.toml", "--training.dataset_path", sys.argv[1]])
rss = lambda: int(open("/proc/self/statm").read().split()[1]) * 4096
tokenizer = load_tokenizer("default")
before, built = rss(), time.perf_counter()
loader = build_dataloader(1, 0, tokenizer, config)
it = iter(loader)
next(it)
first = time.perf_counter()
for _ in range(19):
    next(it)
print(json.dumps({"first_batch_s": first - start, "loader_s": first - built,
                  "loader_rss_mb": (rss() - before) / 2**20, "rss_mb": rss() / 2**20}))
"""


def prepare(corpus: Path, out: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "boost_titan.prepare", "--tokenizer", "default", "--out", str(out),
         "--workers", "2", str(corpus)],
        cwd=ROOT, check=True, stderr=subprocess.DEVNULL,
    )  # fmt: skip


def scaled(real: Path, out: Path, tokens: int) -> None:
    """A prepared folder of `tokens` tokens: `real`'s first shard's tokens at the start of
    shard 0, the rest zeros in sparse files."""
    manifest = json.loads((real / "manifest.json").read_text())
    data = (real / "shard-00000.bin").read_bytes()[: SHARD_TOKENS * 2]
    out.mkdir(parents=True)
    shards = []
    for i in range(-(-tokens // SHARD_TOKENS)):
        n = min(SHARD_TOKENS, tokens - i * SHARD_TOKENS)
        name = f"shard-{i:05d}"
        with open(out / f"{name}.bin", "wb") as f:
            f.truncate(n * 2)
            if i == 0:
                f.write(data[: n * 2])
        with open(out / f"{name}.idx", "wb") as f:
            f.truncate(8)
        shards.append({"name": name, "tokens": n, "documents": 1, "held_out_documents": 0})
    manifest.update(shards=shards, tokens=tokens, documents=len(shards), held_out_documents=0)
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1))


def train(dump: Path, *args: str) -> tuple[float | None, str]:
    """Run `run_train.sh` on one process; (seconds from launch to step 1's line, output)."""
    env = {**os.environ, "NGPU": "1"}
    start = time.perf_counter()
    child = subprocess.Popen(
        ["./run_train.sh", "--job.dump_folder", str(dump), *TRAIN, *args],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    first, lines = None, []
    for line in child.stdout:
        lines.append(line)
        if first is None and re.search(r"step:\s+1\s", line):
            first = time.perf_counter() - start
    if child.wait():
        raise SystemExit("".join(lines[-30:]))
    return first, "".join(lines)


def losses(dump: Path) -> dict[int, float]:
    rows = [json.loads(x) for x in (dump / "losses.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in rows if "loss" in r}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scratch")
    parser.add_argument("--parts", default="scale,resume,mix", help="which of scale,resume,mix")
    parser.add_argument("--repeats", type=int, default=2, help="scale runs per size, alternated")
    args = parser.parse_args()
    parts = args.parts.split(",")
    scratch = Path(args.scratch or tempfile.mkdtemp(prefix="bench-prepared-train-"))
    try:
        for name, seed in (("web", 0), ("code", 1)):
            if not (scratch / name / "manifest.json").is_file():
                generate(scratch / f"{name}_corpus", 12, files=2, seed=seed)
                prepare(scratch / f"{name}_corpus", scratch / name)
        web, code = scratch / "web", scratch / "code"

        sizes = (("10M", 10_000_000), ("10B", 10_000_000_000))
        for (label, tokens), repeat in ((s, r) for r in range(args.repeats) for s in sizes):
            if "scale" not in parts:
                break
            folder = scratch / f"scaled{label}"
            if not (folder / "manifest.json").is_file():
                scaled(web, folder, tokens)
            probe = subprocess.run(
                [sys.executable, "-c", FIRST_BATCH, str(folder)],
                cwd=ROOT, check=True, capture_output=True, text=True,
            )  # fmt: skip
            loader = json.loads(probe.stdout.splitlines()[-1])
            first, _ = train(
                scratch / f"run{label}-{repeat}", "--training.dataset_path", str(folder),
                "--training.steps", "3", "--checkpoint.no_enable",
            )  # fmt: skip
            print(
                f"{label} tokens ({len(list(folder.glob('*.bin')))} shards): loader built and "
                f"first batch read in {loader['loader_s'] * 1e3:.1f} ms "
                f"({loader['first_batch_s']:.2f} s after interpreter start), loader RSS "
                f"+{loader['loader_rss_mb']:.1f} MB (process {loader['rss_mb']:.0f} MB); "
                f"run_train.sh launch to step 1: {first:.1f} s",
                flush=True,
            )

        if "resume" in parts:
            run = ["--training.dataset_path", str(web), "--training.steps", "10"]
            whole = scratch / "whole"
            train(whole, *run, "--checkpoint.interval", "5", "--checkpoint.keep_latest_k", "0")
            resumed = scratch / "resumed"
            shutil.copytree(
                whole, resumed, ignore=shutil.ignore_patterns("step-10", "losses.jsonl")
            )
            train(resumed, *run, "--checkpoint.interval", "5", "--checkpoint.keep_latest_k", "0")
            a, b = losses(whole), losses(resumed)
            same = all(a[s] == b[s] for s in range(6, 11)) and sorted(b) == list(range(6, 11))
            print(f"resume at step 5 of 10: losses of steps 6-10 bit-identical: {same} ({b})")
        if "mix" in parts:
            mix = ["--boost.data_mix", f"web={web}:0.7,code={code}:0.3", "--training.steps", "10"]
            outputs = [
                train(scratch / f"mix{i}", *mix, "--checkpoint.no_enable")[1] for i in (0, 1)
            ]
            share = re.search(r"data mix: .*", outputs[0]).group(0)
            same = losses(scratch / "mix0") == losses(scratch / "mix1")
            print(f"0.7/0.3 mix: {share}; rerun losses bit-identical: {same}")
    finally:
        if not args.scratch:
            shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
