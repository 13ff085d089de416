"""Measure `python -m boost_titan.prepare` on a generated corpus (docs/datasets.md's table).

    python scripts/bench_prepare.py [--mb 200] [--tiny-files N] [--long-line-mb M]
        [--scratch DIR] [--tokenizer default]

Writes a corpus of about `--mb` MB of random-word JSON-lines documents (8 files, seeded)
under the scratch folder, then prepares it (`--mb 0`: skipped):
1. with every core (`--workers` = os.cpu_count()) and with one worker: wall time, tokens/s
   and peak RSS (the largest of the command's processes) of each, and whether the two
   folders are byte-identical;
2. once more with every core, interrupted by SIGINT when half of the shards are written,
   then rerun: whether the finished folder is byte-identical to (1).
`--tiny-files N`: N files of one short document each, prepared with every core and with one
worker (shards/s: a task's cost must not grow with the file count). `--long-line-mb M`: one
JSON line of M MB, prepared with the default `--max-document-mb`: exit status, its line,
peak RSS. Prints one line per result. The scratch folder (default: a temporary one) is
removed at the end unless given.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def generate(folder: Path, megabytes: float, files: int = 8, seed: int = 0) -> int:
    """Random-word documents (a Zipf-like vocabulary of 20k made-up words); bytes written."""
    rng = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyz"
    words = ["".join(rng.choices(letters, k=rng.randint(2, 9))) for _ in range(20_000)]
    weights = [1 / (i + 1) for i in range(len(words))]
    folder.mkdir(parents=True, exist_ok=True)
    per_file, written = int(megabytes * 1e6 / files), 0
    for i in range(files):
        with open(folder / f"part-{i:02d}.jsonl", "w") as f:
            size = 0
            while size < per_file:
                text = " ".join(rng.choices(words, weights, k=rng.randint(50, 2000)))
                line = json.dumps({"text": text}) + "\n"
                f.write(line)
                size += len(line)
            written += size
    return written


def digest(folder: Path) -> str:
    h = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        h.update(str(path.relative_to(folder)).encode() + b"\0" + path.read_bytes())
    return h.hexdigest()


def command(corpus: Path, out: Path, workers: int, tokenizer: str) -> list[str]:
    return [
        sys.executable, "-m", "boost_titan.prepare", "--tokenizer", tokenizer,
        "--out", str(out), "--workers", str(workers), str(corpus),
    ]  # fmt: skip


def measured(argv: list[str]) -> tuple[int, float, float, str]:
    """(exit status, wall seconds with interpreter start, peak RSS in MB of the largest of
    its processes, stderr) of one command."""
    start = time.perf_counter()
    child = subprocess.Popen(argv, cwd=ROOT, stderr=subprocess.PIPE, text=True)
    stderr = child.stderr.read()
    _, status, usage = os.wait4(child.pid, 0)
    child.returncode = os.waitstatus_to_exitcode(status)
    return child.returncode, time.perf_counter() - start, usage.ru_maxrss / 1024, stderr


def timed(corpus: Path, out: Path, workers: int, tokenizer: str) -> tuple[float, int, float]:
    """Wall seconds of one preparation (interpreter start included), its token count and
    peak RSS (MB)."""
    code, seconds, rss, stderr = measured(command(corpus, out, workers, tokenizer))
    if code:
        raise SystemExit(f"prepare failed ({code}): {stderr}")
    return seconds, json.loads((out / "manifest.json").read_text())["tokens"], rss


def tiny_files(scratch: Path, count: int, tokenizer: str) -> None:
    """`count` one-document files at every core and at one worker: shards/s."""
    corpus = scratch / "tiny"
    corpus.mkdir(parents=True)
    for i in range(count):
        (corpus / f"{i:06d}.jsonl").write_text(json.dumps({"text": f"document {i} of many"}))
    for workers in dict.fromkeys((os.cpu_count() or 1, 1)):
        seconds, _, rss = timed(corpus, scratch / f"tiny{workers}", workers, tokenizer)
        print(
            f"{count:,} tiny files, workers {workers}: {seconds:.1f} s, "
            f"{count / seconds:.0f} shards/s, peak RSS {rss:.0f} MB",
            flush=True,
        )


def long_line(scratch: Path, megabytes: float, tokenizer: str) -> None:
    """One JSON line of `megabytes` MB prepared with the default --max-document-mb."""
    path = scratch / "long" / "line.jsonl"
    path.parent.mkdir(parents=True)
    block = "foxes jump over shards " * 45_590  # about 1 MB
    with open(path, "w") as f:
        f.write('{"text": "')
        for _ in range(int(megabytes)):
            f.write(block)
        f.write('"}\n')
    code, seconds, rss, stderr = measured(command(path, scratch / "long-out", 1, tokenizer))
    line = stderr.strip().splitlines()[-1] if stderr.strip() else ""
    print(
        f"a {path.stat().st_size / 1e6:.0f} MB line: exit {code} in {seconds:.1f} s, peak RSS "
        f"{rss:.0f} MB: {line}",
        flush=True,
    )


def interrupted(corpus: Path, out: Path, workers: int, tokenizer: str) -> tuple[int, int]:
    """SIGINT once half of the shards are written, then rerun; (exit status of the
    interrupted run, shards written before the rerun)."""
    child = subprocess.Popen(command(corpus, out, workers, tokenizer), cwd=ROOT)
    while not (out / "plan.json").is_file():
        time.sleep(0.05)
    chunks = len(json.loads((out / "plan.json").read_text())["chunks"])
    while len(list(out.glob("shard-*.json"))) < chunks // 2 and child.poll() is None:
        time.sleep(0.05)
    child.send_signal(signal.SIGINT)
    status = child.wait()
    done = len(list(out.glob("shard-*.json")))
    subprocess.run(command(corpus, out, workers, tokenizer), cwd=ROOT, check=True)
    return status, done


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=200)
    parser.add_argument("--tiny-files", type=int, default=0)
    parser.add_argument("--long-line-mb", type=float, default=0)
    parser.add_argument("--scratch")
    parser.add_argument("--tokenizer", default="default")
    args = parser.parse_args()
    scratch = Path(args.scratch or tempfile.mkdtemp(prefix="bench-prepare-"))
    try:
        if args.long_line_mb:
            long_line(scratch, args.long_line_mb, args.tokenizer)
        if args.tiny_files:
            tiny_files(scratch, args.tiny_files, args.tokenizer)
        if args.mb:
            corpus_runs(scratch, args.mb, args.tokenizer)
    finally:
        if not args.scratch:
            shutil.rmtree(scratch, ignore_errors=True)


def corpus_runs(scratch: Path, megabytes: float, tokenizer: str) -> None:
    """Steps 1 and 2 of the module doc on a generated corpus of `megabytes` MB."""
    corpus = scratch / "corpus"
    size = generate(corpus, megabytes)
    print(f"corpus: {size / 1e6:.1f} MB in 8 JSON-lines files under {corpus}", flush=True)
    cores = os.cpu_count() or 1
    runs = {}
    for workers in dict.fromkeys((cores, 1)):
        out = scratch / f"workers{workers}"
        seconds, tokens, rss = timed(corpus, out, workers, tokenizer)
        runs[workers] = digest(out)
        print(
            f"workers {workers}: {tokens:,} tokens in {seconds:.1f} s, "
            f"{tokens / seconds / 1e6:.2f}M tokens/s ({size / 1e6 / seconds:.2f} MB/s), "
            f"peak RSS {rss:.0f} MB",
            flush=True,
        )
    print(f"byte-identical across worker counts {list(runs)}: {len(set(runs.values())) == 1}")
    status, done = interrupted(corpus, scratch / "interrupted", cores, tokenizer)
    same = digest(scratch / "interrupted") == runs[cores]
    print(
        f"SIGINT at half: exit {status} with {done} shards written; rerun finished "
        f"byte-identical to the uninterrupted run: {same}"
    )


if __name__ == "__main__":
    main()
