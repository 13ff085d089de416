"""Train parallel layouts from one seed checkpoint and line up their logged losses and
gradient norms step by step: what `python -m boost_titan.loss_compare` measures.

`LAYOUTS` names the layouts one can train (processes, data-parallel degree, trainer
arguments, and for a yardstick or shown-only layout the seed or arch of its own seed
checkpoint). `run` writes the seed checkpoints, trains each layout through torchrun
(`job.launch.launch_training`) into `OUT/LAYOUT/` unless a finished run is there, reads the
logs (`read_log_rows`) and returns a `Comparison`: the exact differences over the first
steps (`Comparison.exact`) and the layouts that drift further from the reference than a
run from other initial weights (`Comparison.drift_failures`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from boost_titan.config.errors import ConfigError
from boost_titan.job.launch import launch_training, pipeline_args
from boost_titan.runtime.run_log import read_log


@dataclass(frozen=True)
class Layout:
    """A parallel layout: processes, data-parallel degree, trainer arguments, and (for the
    yardstick and shown-only kinds) the seed or arch of its own seed checkpoint."""

    nproc: int
    dp: int
    args: tuple[str, ...]
    seed: int = 0
    arch: str | None = None


_TP = "--parallelism.tensor_parallel_degree"
_DP = "--parallelism.data_parallel_shard_degree"
_CP = "--parallelism.context_parallel_degree"
LAYOUTS = {
    "tp1": Layout(1, 1, (_TP, "1")),
    "tp2": Layout(2, 1, (_TP, "2")),
    "tp2-bf16": Layout(2, 1, (_TP, "2", "--training.mixed_precision_param", "bfloat16")),
    "tp2-float8": Layout(
        2,
        1,
        (
            _TP,
            "2",
            "--training.mixed_precision_param",
            "bfloat16",
            "--model.converters",
            "quantize.linear.float8",
        ),
    ),
    "tp4": Layout(4, 1, (_TP, "4")),
    "vanilla-tp2": Layout(2, 1, (_TP, "2", "--boost.tp_strategy", "vanilla")),
    "dp2": Layout(2, 2, (_TP, "1", _DP, "2")),
    "dp2-tp2": Layout(4, 2, (_TP, "2", _DP, "2")),
    "pp2-tp2": Layout(4, 1, (_TP, "2", *pipeline_args())),
    "dp2-tp2-pp2": Layout(8, 2, (_TP, "2", _DP, "2", *pipeline_args(microbatch=1))),
    "cp2": Layout(2, 1, (_TP, "1", _CP, "2")),
    "cp2-tp2": Layout(4, 1, (_TP, "2", _CP, "2")),
    "tp1-seed1": Layout(1, 1, (_TP, "1"), seed=1),
    "fullrank-tp2": Layout(2, 1, (_TP, "2"), arch="fullrank"),
}
"""The layouts one can name; global batch = local batch x dp."""


# ---- reading the logs ---------------------------------------------------------------------
def read_log_rows(dump: Path) -> tuple[list[dict], list[dict]]:
    """The training rows (step, loss, grad_norm) and validation rows of a run's log."""
    return read_log(str(dump / "losses.jsonl"))


# ---- comparing ----------------------------------------------------------------------------
def smooth(values: list[float], window: int) -> list[float]:
    """Trailing moving average over `window` values (fewer at the start)."""
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v - (values[i - window] if i >= window else 0.0)
        out.append(total / min(i + 1, window))
    return out


@dataclass
class Comparison:
    """Per step: every layout's loss and grad norm; the checks' settings."""

    layouts: list[str]
    steps: list[int]
    losses: dict[str, list[float]]
    grad_norms: dict[str, list[float]]
    validation: dict[str, float] = field(default_factory=dict)
    """Final held-out loss per layout (with --validate)."""
    exact_steps: int = 0
    smooth: int = 50

    @property
    def reference(self) -> str:
        return self.layouts[0]

    def kind(self, name: str) -> str:
        """'same' (the reference's model), 'seed' (the yardstick) or 'other' (shown only)."""
        layout = LAYOUTS[name]
        return "other" if layout.arch else "seed" if layout.seed else "same"

    def loss_diff(self, name: str) -> list[float]:
        ref = self.losses[self.reference]
        return [abs(a - b) for a, b in zip(self.losses[name], ref, strict=True)]

    def grad_norm_diff(self, name: str) -> list[float]:
        ref = self.grad_norms[self.reference]
        return [
            abs(a - b) / abs(b) if b else abs(a)
            for a, b in zip(self.grad_norms[name], ref, strict=True)
        ]

    def smoothed_gap(self, name: str) -> float:
        """Largest |smoothed loss difference| from the reference after `exact_steps`."""
        a = smooth(self.losses[name], self.smooth)
        b = smooth(self.losses[self.reference], self.smooth)
        return max(
            (abs(x - y) for x, y in zip(a[self.exact_steps :], b[self.exact_steps :], strict=True)),
            default=0.0,
        )

    def exact(self) -> tuple[float, float]:
        """(largest |loss difference|, largest relative grad-norm difference) of the
        reference's model under other layouts over the first `exact_steps` steps."""
        same = [n for n in self.layouts[1:] if self.kind(n) == "same"]
        n = self.exact_steps
        loss = max((d for s in same for d in self.loss_diff(s)[:n]), default=0.0)
        grad = max((d for s in same for d in self.grad_norm_diff(s)[:n]), default=0.0)
        return loss, grad

    def drift_failures(self) -> list[str]:
        """Layouts of the reference's model that, after `exact_steps`, stray from the
        reference further than the seed yardstick (smoothed loss, final validation loss)."""
        seeds = [n for n in self.layouts if self.kind(n) == "seed"]
        if not seeds or self.exact_steps >= len(self.steps):
            return []
        seed_gap = min(self.smoothed_gap(s) for s in seeds)
        failures = [
            n
            for n in self.layouts[1:]
            if self.kind(n) == "same" and self.smoothed_gap(n) >= seed_gap
        ]
        if self.validation:
            ref = self.validation[self.reference]
            seed_val = min(abs(self.validation[s] - ref) for s in seeds)
            failures += [
                n
                for n in self.layouts[1:]
                if self.kind(n) == "same"
                and abs(self.validation[n] - ref) >= seed_val
                and n not in failures
            ]
        return failures


def compare(
    rows: dict[str, list[dict]], validations: dict[str, list[dict]], exact_steps: int, window: int
) -> Comparison:
    """Line the layouts' rows up by step; ConfigError if they did not run the same steps."""
    names = list(rows)
    steps = [r["step"] for r in rows[names[0]]]
    for name in names:
        if [r["step"] for r in rows[name]] != steps:
            raise ConfigError(f"layout {name} logged other steps than {names[0]}; rerun it")
        if any("grad_norm" not in r for r in rows[name]):
            raise ConfigError(f"layout {name} logged no grad_norm; run it with this version")
    final = {n: v[-1]["validation_loss"] for n, v in validations.items() if v}
    return Comparison(
        names,
        steps,
        {n: [r["loss"] for r in rows[n]] for n in names},
        {n: [r["grad_norm"] for r in rows[n]] for n in names},
        final if len(final) == len(names) else {},
        min(exact_steps, len(steps)),
        window,
    )


# ---- training the layouts -----------------------------------------------------------------
def _seed_checkpoint(out: Path, common: list[str], arch: str, seed: int, config: str) -> Path:
    """The seed checkpoint of (arch, seed), written on first use."""
    folder = out / ("seed" if (arch, seed) == (None, 0) else f"seed-{arch or 'ref'}-{seed}")
    if not (folder / "checkpoint" / "step-0").exists():
        print(f"seed checkpoint -> {folder}", flush=True)
        args = [
            *common,
            _TP,
            "1",
            "--checkpoint.enable",
            "--checkpoint.create_seed_checkpoint",
            "--debug.seed",
            str(seed),
        ]
        if arch:
            args += ["--boost.arch", arch]
        launch_training(1, config, folder, args)
    return folder / "checkpoint" / "step-0"


@dataclass(frozen=True)
class LossRuns:
    """What `run` trains: the `layouts` (names of `LAYOUTS`, the first the reference),
    each from the job TOML `config` for `steps` steps of the `arch` model, with
    `global_batch` sequences per step and `validation_batch` held-out windows per
    validation step (`validate`: one after the last step), logging every `log_freq` steps,
    into `out`/LAYOUT. The comparison is exact over the first `exact_steps` (0: all) and a
    moving average of `smooth` steps after them."""

    layouts: list[str]
    out: Path
    config: str
    steps: int
    arch: str
    global_batch: int
    validation_batch: int
    log_freq: int
    validate: bool
    exact_steps: int
    smooth: int


def run(runs: LossRuns, extra: list[str]) -> Comparison:
    """Train every layout of `runs` (reusing finished runs in `runs.out`, `extra` going to
    each run) and line their logs up; ConfigError for layouts or batches that cannot work."""
    names = runs.layouts
    unknown = [n for n in names if n not in LAYOUTS]
    if unknown or len(names) < 2:
        raise ConfigError(
            f"--layouts needs two or more of {', '.join(LAYOUTS)}"
            + (f"; unknown: {', '.join(unknown)}" if unknown else "")
        )
    if LAYOUTS[names[0]].seed or LAYOUTS[names[0]].arch:
        raise ConfigError(f"the reference layout {names[0]} must be one of the reference model's")
    for name in names:
        for option, batch in (
            ("--global-batch", runs.global_batch),
            ("--validation-batch", runs.validation_batch),
        ):
            if batch % LAYOUTS[name].dp:
                raise ConfigError(
                    f"{option} {batch} does not divide over {name}'s data parallelism"
                )
    out = runs.out
    out.mkdir(parents=True, exist_ok=True)
    common = [
        "--training.steps",
        str(runs.steps),
        "--metrics.log_freq",
        str(runs.log_freq),
        "--boost.arch",
        runs.arch,
        "--boost.data_order",
        "global",
        *extra,
    ]
    if runs.validate:
        common += ["--validation.enable", "--validation.freq", str(runs.steps)]
    else:
        common += ["--validation.no_enable"]
    rows, validations = {}, {}
    for name in names:
        layout, dump = LAYOUTS[name], out / name
        if not (dump / "losses.jsonl").exists():
            seed = _seed_checkpoint(out, common, layout.arch, layout.seed, runs.config)
            load = [
                "--checkpoint.enable",
                "--checkpoint.initial_load_path",
                str(seed),
                "--checkpoint.interval",
                str(10**9),
            ]
            arch = ["--boost.arch", layout.arch] if layout.arch else []
            batch = [
                "--training.local_batch_size",
                str(runs.global_batch // layout.dp),
                "--validation.local_batch_size",
                str(runs.validation_batch // layout.dp),
            ]
            print(f"{name}: {layout.nproc} processes -> {dump}", flush=True)
            output = launch_training(
                layout.nproc, runs.config, dump, [*common, *load, *layout.args, *arch, *batch]
            )
            (dump / "train.log").write_text(output)
        rows[name], validations[name] = read_log_rows(dump)
    return compare(rows, validations, runs.exact_steps or runs.steps, runs.smooth)
