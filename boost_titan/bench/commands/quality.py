"""`bench quality`: full-rank AdamW and the low-rank methods (SVD-style with AdamW and with
LORO, CoLA, LaX) trained on the same data, token budget and LR schedule from several seeds;
their final held-out losses (a table and `--results`, which scripts/readme_tables.py renders
into docs/models.md) and the loss curves (`--plot`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from boost_titan.bench.measure import quality as harness
from boost_titan.bench.measure.loss_curves import smooth
from boost_titan.bench.measure.quality import METHODS, QualityRuns, table
from boost_titan.bench.options import csv, int_csv
from boost_titan.bench.report import write_json

HELP = "held-out loss of full rank, SVD (AdamW, LORO), CoLA and LaX over seeds (trains)"


def add_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--methods", type=csv, default=list(METHODS), help=f"comma list of {', '.join(METHODS)}"
    )
    parser.add_argument("--seeds", type=int_csv, default=[0, 1, 2], help="comma list of seeds")
    parser.add_argument("--steps", type=int, default=250)
    parser.add_argument("--batch", type=int, default=8, help="sequences per step")
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument(
        "--validation-steps", type=int, default=8, help="held-out batches per validation"
    )
    parser.add_argument("--validate-every", type=int, default=50, help="must divide --steps")
    parser.add_argument("--loro-exact-every", type=int, default=40)
    parser.add_argument("--parallel", type=int, default=2, help="runs at a time (1 process each)")
    parser.add_argument("--config", default="train_configs/debug.toml")
    parser.add_argument(
        "--out", default="outputs/quality", help="the runs' folder; finished runs are reused"
    )
    parser.add_argument("--results", default="docs/quality.json", help="the summary (JSON)")
    parser.add_argument("--plot", default="docs/quality.png", help="the curves (PNG)")
    parser.add_argument(
        "--smooth", type=int, default=20, help="moving-average window of the plotted losses"
    )
    parser.set_defaults(trainer_args=[])


def run(ns: argparse.Namespace) -> int:
    runs = QualityRuns(
        methods=ns.methods,
        seeds=ns.seeds,
        out=Path(ns.out),
        config=ns.config,
        steps=ns.steps,
        batch=ns.batch,
        seq_len=ns.seq_len,
        validation_steps=ns.validation_steps,
        validate_every=ns.validate_every,
        loro_exact_every=ns.loro_exact_every,
        parallel=ns.parallel,
    )
    summary = harness.run(runs, ns.trainer_args)
    print(table(summary))
    Path(ns.results).parent.mkdir(parents=True, exist_ok=True)
    write_json(summary, ns.results)
    plot(summary, Path(ns.plot), max(1, ns.smooth))
    print(
        f"\nwrote {ns.results} and {ns.plot}; the runs are in {ns.out}; the docs' table: "
        "python scripts/readme_tables.py --only quality"
    )
    return 0


def _band(per_seed: list[list[float]]) -> tuple[list[float], list[float], list[float]]:
    """Per position: the mean, min and max over the seeds."""
    columns = list(zip(*per_seed, strict=True))
    return (
        [sum(c) / len(c) for c in columns],
        [min(c) for c in columns],
        [max(c) for c in columns],
    )


def plot(summary: dict, path: Path, window: int) -> None:
    """Training loss (a `window`-step moving average) and held-out loss per method: the mean
    over the seeds as a line, their min-max shaded; LORO's exact steps dotted."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (train, held_out) = plt.subplots(1, 2, figsize=(12, 4.5))
    for i, method in enumerate(summary["methods"].values()):
        runs, colour = method["runs"], f"C{i}"
        for ax, x, per_seed in (
            (train, runs[0]["steps"], [smooth(r["loss"], window) for r in runs]),
            (held_out, runs[0]["validation_steps"], [r["validation_loss"] for r in runs]),
        ):
            mean, low, high = _band(per_seed)
            ax.plot(
                x,
                mean,
                label=method["label"],
                lw=1,
                color=colour,
                marker="." if ax is held_out else None,
            )
            ax.fill_between(x, low, high, color=colour, alpha=0.2, lw=0)
    settings = summary["settings"]
    if any(METHODS[name].loro for name in summary["methods"]):
        every = settings["loro_exact_every"]
        for step in range(every, settings["steps"] + 1, every):
            train.axvline(step, color="grey", lw=0.5, ls=":")
    seeds = len(settings["seeds"])
    train.set(xlabel="step", ylabel="loss", title=f"training loss ({window}-step mean)")
    held_out.set(xlabel="step", ylabel="loss", title="held-out loss")
    for ax in (train, held_out):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, title=f"mean of {seeds} seed(s), min-max shaded", title_fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
