"""Time to first step and memory on a raw JSON-lines corpus (docs/datasets.md's figures).

    python scripts/bench_raw_train.py [--mb 200] [--scratch DIR]

Writes about `--mb` MB of random-word JSON-lines documents (`bench_prepare.generate`, 8
files) and, with an empty `datasets` cache each time (HF_DATASETS_CACHE in the scratch
folder, as on a first run):
1. in a fresh interpreter: the seconds to build the loader and read its first batch, the
   process's peak RSS, and the bytes written to the cache;
2. `./run_train.sh` on one process for 2 steps: the seconds from launch to step 1's line.
Prints one line. The scratch folder (default: a temporary one) is removed unless given.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from scripts.bench_prepare import generate  # noqa: E402
from scripts.bench_prepared_train import train  # noqa: E402

FIRST_BATCH = """
import json, resource, sys, time
from torchtitan.config import ConfigManager
from boost_titan.data import build_dataloader
from boost_titan.data.tokenizer import load_tokenizer
config = ConfigManager().parse_args(["--job.custom_config_module=boost_titan.config",
    "--job.config_file", "train_configs/debug.toml", "--training.dataset_path", sys.argv[1]])
tokenizer = load_tokenizer("default")
start = time.perf_counter()
next(iter(build_dataloader(1, 0, tokenizer, config)))
print(json.dumps({"first_batch_s": time.perf_counter() - start,
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=200)
    parser.add_argument("--scratch")
    args = parser.parse_args()
    scratch = Path(args.scratch or tempfile.mkdtemp(prefix="bench-raw-train-"))
    corpus = scratch / "corpus"
    try:
        if not corpus.is_dir():
            generate(corpus, args.mb)
        cache = scratch / "hf-cache"
        shutil.rmtree(cache, ignore_errors=True)
        env = {**os.environ, "HF_DATASETS_CACHE": str(cache)}
        probe = subprocess.run(
            [sys.executable, "-c", FIRST_BATCH, str(corpus)],
            cwd=ROOT, env=env, check=True, capture_output=True, text=True,
        )  # fmt: skip
        loader = json.loads(probe.stdout.splitlines()[-1])
        cached = folder_bytes(cache) if cache.is_dir() else 0
        shutil.rmtree(cache, ignore_errors=True)
        os.environ["HF_DATASETS_CACHE"] = str(cache)
        start = time.perf_counter()
        first, _ = train(
            scratch / "run", "--training.dataset_path", str(corpus), "--training.steps", "2",
            "--checkpoint.no_enable",
        )  # fmt: skip
        total = time.perf_counter() - start
        print(
            f"{folder_bytes(corpus) / 1e6:.0f} MB raw JSON lines: loader built and first batch "
            f"read in {loader['first_batch_s']:.2f} s (peak RSS {loader['peak_rss_mb']:.0f} MB, "
            f"{cached / 1e6:.0f} MB written to the datasets cache); run_train.sh launch to "
            f"step 1: {first:.1f} s (whole 2-step run {total:.1f} s)",
            flush=True,
        )
    finally:
        if not args.scratch:
            shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
