"""Wall-clock start-up time of the command-line tools, as a markdown table.

    python scripts/time_cli.py [--runs 3] [--root DIR] [--rerun]

Each command runs `--runs` times as a fresh `python -m ...` process from `--root` (default:
this checkout; `PYTHONPATH=ROOT`, so an unpacked older commit can be timed the same way);
the table shows the median and the range in seconds. `--rerun` also times `./run_train.sh`
on a finished job (a 1-step run made first, in a temporary folder): the time until it says
that there is nothing to train.

To time an older commit the same way (README's "before" column):

    git archive 1036184 | tar -x -C /tmp/before && ln -s "$PWD/.venv" /tmp/before/.venv
    python scripts/time_cli.py --rerun --root /tmp/before
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEBUG = "train_configs/debug.toml"
TINY = (
    "--training.steps",
    "1",
    "--training.seq_len",
    "32",
    "--training.local_batch_size",
    "2",
    "--metrics.no_enable_tensorboard",
)


def commands(dump: str) -> dict[str, list[str]]:
    """Label -> argv (run from the root) of each timed command."""
    python = [sys.executable, "-m"]
    return {
        "bench --help": [*python, "boost_titan.bench", "--help"],
        "bench model": [*python, "boost_titan.bench", "model"],
        "export --help": [*python, "boost_titan.export", "--help"],
        "check --help": [*python, "boost_titan.check", "--help"],
        "plan --help": [*python, "boost_titan.plan", "--help"],
        "check debug.toml": [
            *python,
            "boost_titan.check",
            "--nproc",
            "2",
            "--job.config_file",
            DEBUG,
            "--job.dump_folder",
            dump,
        ],
    }


def seconds(argv: list[str], root: Path, env: dict[str, str]) -> float:
    """Wall time of one run; exits with its output if it fails."""
    start = time.perf_counter()
    result = subprocess.run(argv, cwd=root, env=env, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if result.returncode != 0:
        sys.exit(f"{' '.join(argv)} failed ({result.returncode}):\n{result.stderr[-2000:]}")
    return elapsed


def rerun_command(root: Path, env: dict[str, str], dump: str) -> list[str]:
    """Train one step into `dump` (untimed) and return the command that reruns it."""
    argv = ["./run_train.sh", "--job.dump_folder", dump, *TINY]
    result = subprocess.run(argv, cwd=root, env=env, capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"the 1-step run failed ({result.returncode}):\n{result.stderr[-2000:]}")
    return argv


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--root", type=Path, default=ROOT, help="checkout to time")
    parser.add_argument(
        "--rerun", action="store_true", help="also time run_train.sh on a finished job"
    )
    ns = parser.parse_args()
    root = ns.root.resolve()
    env = os.environ | {"PYTHONPATH": str(root), "NGPU": "2"}
    with tempfile.TemporaryDirectory() as tmp:
        timed = commands(os.path.join(tmp, "check"))
        if ns.rerun:
            timed["run_train.sh (finished job)"] = rerun_command(
                root, env, os.path.join(tmp, "run")
            )
        print(f"| command | median s | min-max s ({ns.runs} runs) |\n|---|---|---|")
        for label, argv in timed.items():
            runs = [seconds(argv, root, env) for _ in range(ns.runs)]
            print(
                f"| `{label}` | {statistics.median(runs):.2f} | {min(runs):.2f}-{max(runs):.2f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
