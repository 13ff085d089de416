"""Train several parallel layouts from one seed checkpoint and compare their losses and
gradient norms step by step.

    python -m boost_titan.loss_compare --steps 5
    python -m boost_titan.loss_compare --steps 2000 --exact-steps 100 \\
        --tolerance 1e-4 --layouts tp1,tp2,vanilla-tp2,dp2-tp2,tp1-seed1,fullrank-tp2 \\
        --every 100 --validate --out outputs/convergence

One process writes a seed checkpoint; every layout (`LAYOUTS`, the first is the reference)
trains `--steps` steps from it with the same global batch, through torchrun, into
`OUT/LAYOUT/` (its `losses.jsonl` holds each step's global loss and exact (fp64) gradient
norm, `train.log` its rank-0 output). Layouts of three kinds:

* the reference's model under another parallelism: its losses must equal the reference's
  within `--tolerance` over the first `--exact-steps` steps (all by default) and its grad
  norms within `--grad-norm-tolerance`;
* `-seedN`: the same model from another seed checkpoint (other initial weights, same data):
  the yardstick for longer runs, where fp32 runs of different layouts drift apart
  chaotically. After `--exact-steps`, every layout of the first kind must stay closer to
  the reference (smoothed loss, `--smooth` steps, and the final validation loss with
  `--validate`) than the seed run does;
* another arch (`fullrank-tp2`): shown next to the others, never compared.

The report: per step (or per window of `--every` steps: the largest difference in it) the
reference's loss and grad norm and each layout's differences, `compare.json`, and a PNG
overlay of the curves (`compare.png`); exit 1 when a check fails (2 for bad input).

Every layout trains on the config's dataset in the global order (`[boost] data_order =
"global"`): each step's global batch is the same windows at any data-parallel degree, so
layouts must agree to fp32 rounding. With `--validate`, the held-out batch
(`--validation-batch`) is split over the data-parallel ranks likewise, so every layout is
scored on the same windows. `--config` and `--out` are paths from the working directory
(the default config is a checkout's `train_configs/debug.toml`).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from boost_titan.config.cli import OneLineParser, fail
from boost_titan.config.errors import ConfigError
from boost_titan.runtime.launch import pipeline_args, train


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
    "tp1-seed1": Layout(1, 1, (_TP, "1"), seed=1),
    "fullrank-tp2": Layout(2, 1, (_TP, "2"), arch="fullrank"),
}
"""The layouts one can name; global batch = local batch x dp."""


# ---- running ------------------------------------------------------------------------------
def read_log_rows(dump: Path) -> tuple[list[dict], list[dict]]:
    """The training rows (step, loss, grad_norm) and validation rows of a run's log."""
    from boost_titan.runtime.run_log import read_log

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


# ---- reporting ----------------------------------------------------------------------------
def table(c: Comparison, every: int = 1) -> str:
    """Per window of `every` steps (its last step): the reference's loss and grad norm,
    then, per layout of the reference's model, the largest |loss difference| and relative
    grad-norm difference in the window; other layouts' own loss at the window's end."""
    header = ["steps", f"{c.reference} loss", f"{c.reference} grad_norm"]
    for n in c.layouts[1:]:
        header.append(f"{n} loss" if c.kind(n) == "other" else f"{n} max abs dloss / rel dnorm")
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for start in range(0, len(c.steps), every):
        end = min(start + every, len(c.steps))
        steps = f"{c.steps[start]}" if end - start == 1 else f"{c.steps[start]}-{c.steps[end - 1]}"
        cells = [
            steps,
            f"{c.losses[c.reference][end - 1]:.6f}",
            f"{c.grad_norms[c.reference][end - 1]:.6f}",
        ]
        for n in c.layouts[1:]:
            if c.kind(n) == "other":
                cells.append(f"{c.losses[n][end - 1]:.6f}")
            else:
                loss, grad = max(c.loss_diff(n)[start:end]), max(c.grad_norm_diff(n)[start:end])
                cells.append(f"{loss:.1e} / {grad:.1e}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def drift_table(c: Comparison) -> str:
    """After the exact steps: each layout's largest smoothed loss gap from the reference
    and its final validation-loss difference."""
    lines = [
        f"| layout | max abs smoothed dloss after step {c.exact_steps} ({c.smooth}-step mean) "
        "| final validation loss | difference |",
        "|---|---|---|---|",
    ]
    for n in c.layouts:
        val = c.validation.get(n)
        ref = c.validation.get(c.reference)
        gap = "-" if n == c.reference else f"{c.smoothed_gap(n):.2e}"
        vals = (
            ("-", "-")
            if val is None
            else (f"{val:.5f}", "-" if n == c.reference else f"{val - ref:+.2e}")
        )
        lines.append(f"| {n} | {gap} | {vals[0]} | {vals[1]} |")
    return "\n".join(lines)


def plot(c: Comparison, path: Path) -> None:
    """Smoothed loss curves of every layout, and the per-step loss and grad-norm
    differences from the reference (a zero is drawn at 1e-12)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (losses, loss_diffs, norm_diffs) = plt.subplots(1, 3, figsize=(16, 4.5))
    window = c.smooth if len(c.steps) > 4 * c.smooth else 1
    colour = {name: f"C{i}" for i, name in enumerate(c.layouts)}
    for name in c.layouts:
        losses.plot(c.steps, smooth(c.losses[name], window), label=name, lw=1, color=colour[name])
    title = "training loss" + (f" ({window}-step mean)" if window > 1 else "")
    losses.set(xlabel="step", ylabel="loss", title=title)
    for name in c.layouts[1:]:
        if c.kind(name) != "other":
            for ax, diff in ((loss_diffs, c.loss_diff(name)), (norm_diffs, c.grad_norm_diff(name))):
                ax.semilogy(
                    c.steps, [max(d, 1e-12) for d in diff], label=name, lw=0.6, color=colour[name]
                )
    loss_diffs.set(xlabel="step", ylabel=f"|loss - {c.reference} loss|", title="loss differences")
    norm_diffs.set(xlabel="step", ylabel="relative difference", title="grad-norm differences")
    for ax in (losses, loss_diffs, norm_diffs):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


# ---- command line -------------------------------------------------------------------------
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
        train(1, config, folder, args)
    return folder / "checkpoint" / "step-0"


def run(ns: argparse.Namespace, extra: list[str]) -> Comparison:
    names = [n for n in ns.layouts.split(",") if n]
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
            ("--global-batch", ns.global_batch),
            ("--validation-batch", ns.validation_batch),
        ):
            if batch % LAYOUTS[name].dp:
                raise ConfigError(
                    f"{option} {batch} does not divide over {name}'s data parallelism"
                )
    out = Path(ns.out)
    out.mkdir(parents=True, exist_ok=True)
    common = [
        "--training.steps",
        str(ns.steps),
        "--metrics.log_freq",
        str(ns.log_freq),
        "--boost.arch",
        ns.arch,
        "--boost.data_order",
        "global",
        *extra,
    ]
    if ns.validate:
        common += ["--validation.enable", "--validation.freq", str(ns.steps)]
    else:
        common += ["--validation.no_enable"]
    rows, validations = {}, {}
    for name in names:
        layout, dump = LAYOUTS[name], out / name
        if not (dump / "losses.jsonl").exists():
            seed = _seed_checkpoint(out, common, layout.arch, layout.seed, ns.config)
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
                str(ns.global_batch // layout.dp),
                "--validation.local_batch_size",
                str(ns.validation_batch // layout.dp),
            ]
            print(f"{name}: {layout.nproc} processes -> {dump}", flush=True)
            output = train(
                layout.nproc, ns.config, dump, [*common, *load, *layout.args, *arch, *batch]
            )
            (dump / "train.log").write_text(output)
        rows[name], validations[name] = read_log_rows(dump)
    return compare(rows, validations, ns.exact_steps or ns.steps, ns.smooth)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    parser = OneLineParser(
        prog="python -m boost_titan.loss_compare",
        description=__doc__.split("\n\n")[0],
        epilog="Arguments after -- go to every training run.",
    )
    parser.add_argument(
        "--layouts",
        default="tp1,tp2,dp2-tp2,pp2-tp2",
        help=f"comma-separated, the first is the reference; from {', '.join(LAYOUTS)}",
    )
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--arch", default="cola")
    parser.add_argument("--global-batch", type=int, default=4)
    parser.add_argument(
        "--validation-batch",
        type=int,
        default=8,
        help="held-out windows per validation step, over all data-parallel ranks",
    )
    parser.add_argument("--config", default="train_configs/debug.toml")
    parser.add_argument("--tolerance", type=float, default=1e-5, help="largest |loss difference|")
    parser.add_argument(
        "--grad-norm-tolerance",
        type=float,
        default=1e-6,
        help="largest relative grad-norm difference",
    )
    parser.add_argument(
        "--exact-steps",
        type=int,
        default=0,
        help="steps over which the tolerances hold (default: all)",
    )
    parser.add_argument(
        "--smooth", type=int, default=50, help="moving-average window after the exact steps"
    )
    parser.add_argument("--validate", action="store_true", help="held-out loss after the last step")
    parser.add_argument("--every", type=int, default=1, help="one table row per N steps")
    parser.add_argument("--log-freq", type=int, default=1, help="console log frequency of the runs")
    parser.add_argument(
        "--out",
        default="outputs/loss_compare",
        help="folder for the runs and the report; finished runs in it are reused",
    )
    ns = parser.parse_args(argv)
    if ns.steps < 1 or ns.every < 1 or ns.smooth < 1 or ns.exact_steps < 0:
        fail("--steps, --every and --smooth must be >= 1 and --exact-steps >= 0")
    try:
        c = run(ns, extra)
    except ConfigError as e:
        fail(str(e))
    print(table(c, ns.every))
    loss, grad = c.exact()
    drift = c.drift_failures()
    if c.exact_steps < len(c.steps):
        print("\n" + drift_table(c))
    ok = loss <= ns.tolerance and grad <= ns.grad_norm_tolerance and not drift
    report = {
        "comparison": asdict(c),
        "max_loss_diff": loss,
        "max_grad_norm_rel_diff": grad,
        "tolerance": ns.tolerance,
        "grad_norm_tolerance": ns.grad_norm_tolerance,
        "drift_beyond_seed": drift,
        "ok": ok,
    }
    Path(ns.out, "compare.json").write_text(json.dumps(report, indent=1))
    plot(c, Path(ns.out, "compare.png"))
    print(
        f"\nlayouts {'agree' if ok else 'DIFFER'}: over steps 1-{c.exact_steps} max |dloss| "
        f"{loss:.2e} (tolerance {ns.tolerance:.0e}), max relative grad-norm difference {grad:.2e} "
        f"(tolerance {ns.grad_norm_tolerance:.0e})"
        + (f"; further from the reference than the seed run: {', '.join(drift)}" if drift else "")
        + f"; report in {ns.out}"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
