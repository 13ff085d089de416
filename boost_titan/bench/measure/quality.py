"""Train the low-rank methods and their full-rank twin on the same data, token budget and LR
schedule, several seeds each, and summarise their held-out losses: what `bench quality`
measures.

`METHODS` names the methods (arch and optimizer). `run` trains every (method, seed) pair as
one process at TP 1 (`job.launch.launch_training`, `parallel` runs at a time) into
`OUT/METHOD-seedS/` unless a finished run with the same arguments is there, reads each
run's `losses.jsonl` and returns the summary (`summarize`: a JSON-able dict), which `table`
renders. Each run's initial weights come from `--debug.seed S` of its own arch: the two
SVD-style methods start from the same weights (`same_start` checks their step-1 losses);
the other archs draw theirs from the same seed through their own module tree (no SVD of a
full-rank checkpoint).
"""

from __future__ import annotations

import json
import shutil
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from boost_titan.bench.measure.loss_curves import read_log_rows
from boost_titan.config import Boost
from boost_titan.config.errors import ConfigError
from boost_titan.job.launch import launch_training


@dataclass(frozen=True)
class Method:
    """One compared method: the model's arch and whether LORO replaces AdamW."""

    arch: str
    label: str
    loro: bool = False


METHODS = {
    "fullrank": Method("fullrank", "full-rank, AdamW"),
    "svd": Method("svd", "SVD-style, AdamW"),
    "svd-loro": Method("svd", "SVD-style, LORO", loro=True),
    "cola": Method("cola", "CoLA, AdamW"),
    "lax": Method("lax", "LaX, AdamW"),
}
"""The methods one can name, in the order the table lists them."""


@dataclass(frozen=True)
class QualityRuns:
    """What `run` trains: each of `methods` (names of `METHODS`) from each seed of `seeds`,
    from the job TOML `config`, `steps` steps of `batch` x `seq_len` tokens, the held-out
    loss on `validation_steps` batches of `batch` x `seq_len` tokens every `validate_every`
    steps (the last one after the final step), LORO's exact step every `loro_exact_every`
    steps; `parallel` runs at a time, into `out`."""

    methods: list[str]
    seeds: list[int]
    out: Path
    config: str
    steps: int
    batch: int
    seq_len: int
    validation_steps: int
    validate_every: int
    loro_exact_every: int
    parallel: int


def loro_available() -> bool:
    """Whether this checkout's `[boost]` section has LORO's exact-step period."""
    return "loro_exact_every" in {f.name for f in fields(Boost)}


def check(runs: QualityRuns) -> None:
    """ConfigError (one line) for settings that cannot run or compare."""
    unknown = [m for m in runs.methods if m not in METHODS]
    if unknown or not runs.methods:
        raise ConfigError(
            f"--methods takes a comma list of {', '.join(METHODS)}"
            + (f"; unknown: {', '.join(unknown)}" if unknown else "")
        )
    if len(set(runs.methods)) < len(runs.methods) or len(set(runs.seeds)) < len(runs.seeds):
        raise ConfigError("--methods and --seeds must not repeat an item")
    if not runs.seeds:
        raise ConfigError("--seeds needs at least one seed")
    numbers = {
        "--steps": runs.steps,
        "--batch": runs.batch,
        "--seq-len": runs.seq_len,
        "--validation-steps": runs.validation_steps,
        "--validate-every": runs.validate_every,
        "--loro-exact-every": runs.loro_exact_every,
        "--parallel": runs.parallel,
    }
    small = [f"{option} {value}" for option, value in numbers.items() if value < 1]
    if small:
        raise ConfigError(f"{', '.join(small)}: each must be >= 1")
    if runs.steps % runs.validate_every:
        raise ConfigError(
            f"--validate-every {runs.validate_every} must divide --steps {runs.steps} "
            "(the final held-out loss is taken after the last step)"
        )
    loro = [m for m in runs.methods if METHODS[m].loro]
    if loro and not loro_available():
        raise ConfigError(
            f"method {loro[0]} needs the LORO optimizer ([boost] loro_exact_every, issue 48), "
            f"which this checkout lacks; leave it out: --methods "
            + ",".join(m for m in runs.methods if not METHODS[m].loro)
        )


def run_args(runs: QualityRuns, method: str, seed: int, extra: list[str]) -> list[str]:
    """The trainer's arguments of one (method, seed) run; `extra` last, for every run."""
    m = METHODS[method]
    args = [
        "--parallelism.tensor_parallel_degree",
        "1",
        "--training.steps",
        str(runs.steps),
        "--training.local_batch_size",
        str(runs.batch),
        "--training.seq_len",
        str(runs.seq_len),
        "--validation.enable",
        "--validation.freq",
        str(runs.validate_every),
        "--validation.steps",
        str(runs.validation_steps),
        "--validation.local_batch_size",
        str(runs.batch),
        "--validation.seq_len",
        str(runs.seq_len),
        "--checkpoint.no_enable",
        "--metrics.no_enable_tensorboard",
        "--metrics.log_freq",
        str(max(1, runs.steps // 10)),
        "--boost.arch",
        m.arch,
        "--debug.seed",
        str(seed),
    ]
    if m.loro:
        args += ["--optimizer.name", "LORO", "--boost.loro_exact_every", str(runs.loro_exact_every)]
    return [*args, *extra]


# ---- training -----------------------------------------------------------------------------
RECORD = "quality_run.json"
"""Written into a run's folder once it finished: its arguments and wall seconds."""


def _finished(folder: Path, args: list[str]) -> bool:
    record = folder / RECORD
    return record.exists() and json.loads(record.read_text())["args"] == args


def _train(config: str, folder: Path, args: list[str]) -> None:
    """One run into `folder` (emptied first: a partial or other run is not resumed)."""
    shutil.rmtree(folder, ignore_errors=True)
    print(f"{folder.name}: training", flush=True)
    start = time.perf_counter()
    output = launch_training(1, config, folder, args)
    seconds = time.perf_counter() - start
    (folder / "train.log").write_text(output)
    (folder / RECORD).write_text(json.dumps({"args": args, "wall_s": seconds}, indent=1))
    print(f"{folder.name}: done in {seconds:.0f} s", flush=True)


def run(runs: QualityRuns, extra: list[str]) -> dict:
    """Train every (method, seed) of `runs` not already finished in `runs.out` (`extra`
    going to each run), then `summarize` them; ConfigError for bad settings or a failed run
    (the runs under way finish first, the queued ones are dropped)."""
    check(runs)
    runs.out.mkdir(parents=True, exist_ok=True)
    jobs = {
        (m, s): (runs.out / f"{m}-seed{s}", run_args(runs, m, s, extra))
        for m in runs.methods
        for s in runs.seeds
    }
    todo = [(folder, args) for folder, args in jobs.values() if not _finished(folder, args)]
    with ThreadPoolExecutor(max_workers=runs.parallel) as pool:
        futures = [pool.submit(_train, runs.config, folder, args) for folder, args in todo]
        for future in futures:
            error = future.exception()
            if error is not None:
                pool.shutdown(cancel_futures=True)
                raise error
    return summarize(runs, extra, {key: folder for key, (folder, _) in jobs.items()})


# ---- the summary --------------------------------------------------------------------------
def summarize(runs: QualityRuns, extra: list[str], folders: dict[tuple[str, int], Path]) -> dict:
    """Per method: each seed's training losses, held-out losses and wall seconds, read
    from the runs' folders; the settings they ran with."""
    settings = asdict(runs) | {"out": str(runs.out), "extra": extra}
    methods = {}
    for name in runs.methods:
        per_seed = []
        for seed in runs.seeds:
            folder = folders[(name, seed)]
            rows, validation = read_log_rows(folder)
            if not validation or validation[-1]["step"] != runs.steps:
                raise ConfigError(f"{folder} holds no held-out loss after step {runs.steps}")
            per_seed.append(
                {
                    "seed": seed,
                    "steps": [r["step"] for r in rows],
                    "loss": [r["loss"] for r in rows],
                    "validation_steps": [r["step"] for r in validation],
                    "validation_loss": [r["validation_loss"] for r in validation],
                    "wall_s": json.loads((folder / RECORD).read_text())["wall_s"],
                }
            )
        methods[name] = {"label": METHODS[name].label, "runs": per_seed}
    same_start(methods)
    return {"settings": settings, "methods": methods}


SAME_START = 1e-6
"""Largest step-1 loss difference between two methods of one arch and seed."""


def same_start(methods: dict[str, dict]) -> None:
    """ConfigError unless the methods of one arch log the same step-1 loss per seed (the
    same initial weights and first batch: they differ in the optimizer only)."""
    first: dict[tuple[str, int], tuple[str, float]] = {}
    for name, method in methods.items():
        for r in method["runs"]:
            key, loss = (METHODS[name].arch, r["seed"]), r["loss"][0]
            other, expected = first.setdefault(key, (name, loss))
            if abs(loss - expected) > SAME_START:
                raise ConfigError(
                    f"{name} and {other} (seed {r['seed']}) start from other weights: "
                    f"step-1 loss {loss} vs {expected}"
                )


def final_losses(method: dict) -> list[float]:
    """A method's final held-out loss per seed."""
    return [r["validation_loss"][-1] for r in method["runs"]]


def table(summary: dict) -> str:
    """A markdown table: per method, the final held-out loss's mean over the seeds, its
    min-max and sample standard deviation, each seed's value and the mean wall seconds per
    run; then one line of the settings."""
    s = summary["settings"]
    seeds = ", ".join(str(seed) for seed in s["seeds"])
    lines = [
        f"| method | final held-out loss, mean | min - max | std | seeds {seeds} | s per run |",
        "|---|---|---|---|---|---|",
    ]
    for method in summary["methods"].values():
        final = final_losses(method)
        std = f"{statistics.stdev(final):.4f}" if len(final) > 1 else "-"
        wall = statistics.fmean(r["wall_s"] for r in method["runs"])
        lines.append(
            f"| {method['label']} | {statistics.fmean(final):.4f} | {min(final):.4f} - "
            f"{max(final):.4f} | {std} | {' / '.join(f'{v:.4f}' for v in final)} | {wall:.0f} |"
        )
    tokens = s["steps"] * s["batch"] * s["seq_len"]
    held_out = s["validation_steps"] * s["batch"] * s["seq_len"]
    notes = [
        f"{len(s['seeds'])} seed{'s' if len(s['seeds']) > 1 else ''}",
        f"{s['steps']} steps of {s['batch']} x {s['seq_len']} tokens ({tokens:,} tokens) "
        f"from {s['config']}, TP 1",
        f"held-out loss over {held_out:,} tokens",
    ]
    if any(METHODS[name].loro for name in summary["methods"]):
        notes.append(f"LORO's exact step every {s['loro_exact_every']} steps")
    if s["extra"]:
        notes.append(f"trainer arguments {' '.join(s['extra'])}")
    lines.append("\n" + "; ".join(notes) + ".")
    return "\n".join(lines)
