"""`bench step` on this checkout and on an earlier commit, interleaved, in one run.

    python scripts/compare_step.py --commit 18fc3d3 --repeats 3 [--json OUT] \\
        [--vary training.mixed_precision_param=bfloat16,float32] \\
        -- --job.config_file train_configs/debug.toml --training.seq_len 32 ...

The commit is checked out in a temporary git worktree (removed at the end) with the
measurement modules of this checkout copied in (`bench.measure.step*`, `bench.commands.step`,
`bench.report`, `job.launch`, `runtime.compute_copies` for its range's name), so both
sides are measured alike; `boost_titan.parallelize` / `.kernels` are linked in as
`pyproject.toml` maps them. `--vary KEY=A,B` measures every side with each value of a
trainer option. Every repeat runs each (value, side) once, old side first, so drifting load
on the machine hits all alike. Printed: per value and side the median over repeats of each
report's median step time and host time per micro-batch, the launches and weight casts,
and each side's step time over the first value's on the same side.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COPIED = (
    "boost_titan/bench/report.py",
    "boost_titan/bench/commands/__init__.py",
    "boost_titan/bench/commands/step.py",
    "boost_titan/bench/measure/step.py",
    "boost_titan/bench/measure/step_trace.py",
    "boost_titan/bench/measure/step_worker.py",
    "boost_titan/job/launch.py",
    "boost_titan/runtime/compute_copies.py",  # step_trace reads its range's name
)

RUN_STEP = (
    "import argparse, sys\n"
    "from boost_titan.bench.commands import step\n"
    "parser = argparse.ArgumentParser(prog='bench step')\n"
    "step.add_args(parser)\n"
    "ns, trainer_args = parser.parse_known_args()\n"
    "ns.trainer_args = trainer_args\n"
    "sys.exit(step.run(ns))\n"
)
"""`bench step` without the bench CLI, which the older commit may lack."""


_EARLIER_HOMES = {
    "job/entry.py": ("runtime/entry.py", "train.py"),
    "job/preflight.py": ("runtime/preflight.py", "check.py"),
    "config/precision.py": ("runtime/precision.py",),
}
"""Modules that moved (the job room's, precision) -> where an earlier commit kept them,
newest first (the oldest commits kept them in the commands themselves)."""


def _worktree(commit: str, where: Path) -> Path:
    tree = where / "tree"
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), commit],
        check=True,
        capture_output=True,
    )
    source = tree / "boost_titan"
    (source / "job").mkdir(exist_ok=True)  # a commit from before the job's own room
    (source / "job" / "__init__.py").touch()
    for name in COPIED:
        (tree / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, tree / name)
    for now, olders in _EARLIER_HOMES.items():
        if not (source / now).exists():
            older = next(o for o in olders if (source / o).exists())
            shutil.copy(source / older, source / now)
    for package in ("parallelize", "kernels"):
        (tree / "boost_titan" / package).symlink_to(tree / package)
    return tree


def _measure(tree: Path, bench_args: list[str]) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        env = dict(os.environ, PYTHONPATH=str(tree))
        command = [sys.executable, "-c", RUN_STEP, "--json", out.name]
        result = subprocess.run(
            [*command, *bench_args], cwd=tree, env=env, capture_output=True, text=True
        )
        if result.returncode:
            sys.exit(f"error: bench step in {tree} failed: {result.stderr.strip()[-500:]}")
        return json.loads(Path(out.name).read_text())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commit", required=True)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--vary", metavar="KEY=A,B", help="a trainer option's values to measure")
    parser.add_argument("--json", help="write every report, by value and side")
    ns, rest = parser.parse_known_args()
    bench_args = [a for a in rest if a != "--"]
    key, _, values = (ns.vary or "=").partition("=")
    variants = {v: [f"--{key}", v] for v in values.split(",")} if key else {"": []}
    sides = (ns.commit, "this checkout")
    reports: dict[str, dict[str, list[dict]]] = {v: {s: [] for s in sides} for v in variants}
    with tempfile.TemporaryDirectory(prefix="compare-step-") as tmp:
        old = _worktree(ns.commit, Path(tmp))
        try:
            for _ in range(ns.repeats):
                for value, extra in variants.items():
                    for side, tree in zip(sides, (old, ROOT), strict=True):
                        reports[value][side].append(_measure(tree, [*bench_args, *extra]))
        finally:
            subprocess.run(
                ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(old)],
                capture_output=True,
            )
    if ns.json:
        Path(ns.json).write_text(json.dumps(reports, indent=1))
    print(f"bench step {' '.join(bench_args)}  ({ns.repeats} runs each, interleaved)")
    print(f"{key or '':>26} {'side':>14} {'step ms':>9} {'min':>7} {'max':>7} "
          f"{'x first':>7} {'host ms/mb':>10} {'launches/mb':>11} {'casts/step':>10} "
          f"{'params':>6}")  # fmt: skip
    first = next(iter(variants))
    for value, by_side in reports.items():
        for side, runs in by_side.items():
            steps = [r["step_ms"] for r in runs]
            base = statistics.median(r["step_ms"] for r in reports[first][side])
            host = statistics.median(r["host_ms_per_microbatch"] for r in runs)
            last = runs[-1]
            print(
                f"{value:>26} {side:>14} {statistics.median(steps):>9.1f} {min(steps):>7.1f} "
                f"{max(steps):>7.1f} {statistics.median(steps) / base:>7.2f} {host:>10.2f} "
                f"{last['launches_per_microbatch']:>11.0f} {last['casts_per_step']:>10} "
                f"{last['param_tensors']:>6}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
