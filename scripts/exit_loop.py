"""Run each multi-process command N times and count how its runs ended.

    python scripts/exit_loop.py [N] [--out DIR] [--only NAME,...]    (default 20 runs each)

Per iteration, on 2 CPU processes: a short `run_train.sh` (2 steps, a checkpoint of step 2),
`eval` under TP 2 (torchrun) on that checkpoint, `bench cpu` (the shape issue 32
reproduced a SIGABRT with), `bench compile` (one cell, Inductor, cold and warm pass),
`examples.own_model` and `examples.hf_llama` (torchrun); eval reads the checkpoint of its
iteration's training run (`--only eval...` needs `run_train.sh` too). A run counts as an
abort when its output says so (`terminate called`, `SIGABRT`, exit code -6 in torchrun's
report); every run's output is kept under DIR. Prints a markdown table (runs,
non-zero exits, aborts, median seconds per command) and exits 1 if any run failed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from boost_titan.job.launch import torchrun_command

ROOT = Path(__file__).resolve().parent.parent
ABORTS = ("terminate called", "SIGABRT", "exitcode  : -6")


def _torchrun(module: str, *args: str) -> list[str]:
    """`python -m module *args` on 2 processes, every rank's output kept."""
    return torchrun_command(2, module, args, rank0_only=False)


def commands(run: Path) -> dict[str, list[str]]:
    """Each command of one iteration; `run` is its folder (the training run's dump)."""
    return {
        "run_train.sh": [
            "./run_train.sh",
            "--job.dump_folder",
            str(run / "dump"),
            "--training.steps",
            "2",
            "--training.seq_len",
            "64",
            "--checkpoint.interval",
            "2",
            "--validation.no_enable",
            "--metrics.no_enable_tensorboard",
        ],
        "eval (TP 2)": _torchrun(
            "boost_titan.eval",
            "--checkpoint",
            str(run / "dump" / "checkpoint" / "step-2"),
            "--arch",
            "cola",
            "--tp",
            "2",
            "--steps",
            "2",
            "--seq-len",
            "64",
        ),
        "bench cpu": [
            sys.executable,
            "-m",
            "boost_titan.bench",
            "cpu",
            *"--strategy btp --arch cola --layers 1 --dim 256 --rank 64 --heads 4".split(),
            *"--ffn-dim 704 --seq-len 64 --micro-batch 1 --tp 2".split(),
        ],
        "bench compile": [
            sys.executable,
            "-m",
            "boost_titan.bench",
            "compile",
            *"--strategy btp --ac none --tp 2 --repeats 1".split(),
        ],
        "examples.own_model": _torchrun("boost_titan.examples.own_model"),
        "examples.hf_llama": _torchrun("boost_titan.examples.hf_llama"),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("n", nargs="?", type=int, default=20, help="runs of each command")
    parser.add_argument("--out", default="/tmp/exit_loop", help="folder of every run's output")
    parser.add_argument("--only", help="comma list of command names (default: all)")
    ns = parser.parse_args()
    out = Path(ns.out)
    out.mkdir(parents=True, exist_ok=True)
    names = list(commands(out))
    if ns.only:
        names = [n for n in names if n in ns.only.split(",")]
    env = os.environ | {"NGPU": "2", "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    results: dict[str, list[tuple[int, bool, float]]] = {name: [] for name in names}
    for i in range(1, ns.n + 1):
        run = out / f"run{i}"
        for name, command in commands(run).items():
            if name not in results:
                continue
            run.mkdir(parents=True, exist_ok=True)
            start = time.monotonic()
            done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
            seconds = time.monotonic() - start
            output = done.stdout + done.stderr
            slug = "".join(c if c.isalnum() or c in "._" else "-" for c in name)
            (run / f"{slug}.log").write_text(output)
            aborted = any(mark in output for mark in ABORTS)
            results[name].append((done.returncode, aborted, seconds))
            mark = " ABORT" if aborted else ""
            print(f"{i} {name}: exit {done.returncode}{mark} {seconds:.0f} s", flush=True)
    print("\n| command | runs | non-zero exits | aborts | median s |")
    print("|---|---|---|---|---|")
    failed = 0
    for name, rows in results.items():
        bad = sum(code != 0 for code, _, _ in rows)
        aborts = sum(aborted for _, aborted, _ in rows)
        failed += bad + aborts
        median = statistics.median(s for _, _, s in rows)
        print(f"| {name} | {len(rows)} | {bad} | {aborts} | {median:.0f} |")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
