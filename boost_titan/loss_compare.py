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

import json
import sys
from dataclasses import asdict
from pathlib import Path

from boost_titan.bench.measure.loss_curves import LAYOUTS, Comparison, LossRuns, run, smooth
from boost_titan.config.cli import OneLineParser, fail
from boost_titan.config.errors import ConfigError


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
        runs = LossRuns(
            layouts=[n for n in ns.layouts.split(",") if n],
            out=Path(ns.out),
            config=ns.config,
            steps=ns.steps,
            arch=ns.arch,
            global_batch=ns.global_batch,
            validation_batch=ns.validation_batch,
            log_freq=ns.log_freq,
            validate=ns.validate,
            exact_steps=ns.exact_steps,
            smooth=ns.smooth,
        )
        c = run(runs, extra)
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
