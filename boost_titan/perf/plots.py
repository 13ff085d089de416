"""Figures of the performance model: a sweep (`model --plot`) and the model against the
authors' published measurements (`plot`, docs/perf_model.png)."""

from __future__ import annotations

from pathlib import Path

from boost_titan.boost_llama.strategies import STRATEGIES
from boost_titan.perf.records import (
    MIB,
    CommAblationRow,
    GemmAblationRow,
    PerfRecord,
    ValidationRow,
    config_name,
)

STYLE = dict(zip(STRATEGIES, ("tab:blue", "tab:red", "tab:green"), strict=True))
"""A colour per strategy of the registry (baseline first)."""
DASHES = ("-", "--", ":")
"""A line style per GPU of a sweep, in `--gpu` order (repeating past the third)."""
PART_COLOURS = {
    "gemm": "tab:blue",
    "memory": "tab:orange",
    "attention": "tab:purple",
    "optimizer": "tab:gray",
    "comm": "tab:red",
    "bubble": "tab:olive",
}
TOLERANCE_BAND = 0.15


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: str | Path) -> None:
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)


def write_plot(records: list[PerfRecord], path: str | Path) -> None:
    """Write a two-panel PNG from a flavor sweep holding megatron, vanilla and btp records:
    comm bytes per layer (fwd+bwd) per strategy, and btp's speedup on every GPU profile."""
    plt = _pyplot()
    by = {(r.flavor, r.strategy): r for r in records}
    flavors = list(dict.fromkeys(r.flavor for r in records))
    x = range(len(flavors))
    fig, (comm, speed) = plt.subplots(1, 2, figsize=(11, 4.2))
    for strategy, color in STYLE.items():
        volume = [
            (by[f, strategy].comm_bytes_per_layer_fwd + by[f, strategy].comm_bytes_per_layer_bwd)
            / MIB
            for f in flavors
        ]
        comm.plot(x, volume, "o-", color=color, label=strategy)
    comm.set(ylabel="MiB per layer per rank (fwd + bwd)", title="TP communication volume")
    _speedup_curves(speed, records, flavors)
    first = next(r for r in records if r.strategy == "btp")
    setup = f"{first.arch}, TP{first.tp}" + (f"xPP{first.pp}" if first.pp > 1 else "")
    setup += (
        f", seq {first.seq_len}, micro-batch {first.micro_batch} x {first.microbatches}, "
        f"{first.dtype}"
    )
    for ax in (comm, speed):
        ax.set_xticks(list(x), flavors)
        ax.set_xlabel("model size")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"Analytic performance model ({setup})", fontsize=10)
    _save(fig, path)
    plt.close(fig)


def _speedup_curves(ax, records: list[PerfRecord], flavors: list[str]) -> None:
    by = {(r.flavor, r.strategy): r for r in records}
    for i, gpu in enumerate(records[0].predicted_step_s):
        dash = DASHES[i % len(DASHES)]
        for other in (s for s in STYLE if s != "btp"):
            ratio = [
                by[f, other].predicted_step_s[gpu] / by[f, "btp"].predicted_step_s[gpu]
                for f in flavors
            ]
            ax.plot(
                range(len(flavors)),
                ratio,
                "o" + dash,
                color=STYLE[other],
                label=f"btp vs {other} ({gpu})",
            )
    ax.axhline(1.0, color="gray", lw=0.8)
    ax.set(ylabel="predicted step-time ratio", title="BTP speedup")


def write_validation_plot(
    rows: list[ValidationRow],
    gemm: list[GemmAblationRow],
    comm: list[CommAblationRow],
    sweep: list[PerfRecord],
    path: str | Path,
) -> None:
    """Six panels, model (filled) against the published measurements (open markers / hatched
    bars): iteration seconds and BTP speedups of the four published configurations (with the
    +-15 % band), the predicted split of each step, the two ablations, and the predicted
    speedup over model sizes with the published points at their sizes."""
    plt = _pyplot()
    fig, axes = plt.subplots(2, 3, figsize=(17, 9))
    names = [
        config_name(r.flavor, r.tp, r.pp) + f"\n{r.micro_batch}x{r.microbatches}" for r in rows
    ]
    x = range(len(rows))

    ax = axes[0, 0]
    for s, c in STYLE.items():
        ax.plot(x, [r.predicted_s[s] for r in rows], "-", color=c, marker="o", label=f"{s} (model)")
        ax.plot(
            x, [r.paper_s[s] for r in rows], "s", color=c, mfc="none", ms=9, label=f"{s} (paper)"
        )
    ax.set(ylabel="seconds per iteration", title="Iteration time: model vs published")

    ax = axes[0, 1]
    for key, other in (("btp_vs_megatron", "megatron"), ("btp_vs_vanilla", "vanilla")):
        paper = [r.paper_speedup[key] for r in rows]
        ax.fill_between(
            x,
            [p * (1 - TOLERANCE_BAND) for p in paper],
            [p * (1 + TOLERANCE_BAND) for p in paper],
            color=STYLE[other],
            alpha=0.12,
        )
        ax.plot(
            x,
            [r.predicted_speedup[key] for r in rows],
            "-o",
            color=STYLE[other],
            label=f"btp vs {other} (model)",
        )
        ax.plot(
            x,
            paper,
            "s",
            color=STYLE[other],
            mfc="none",
            ms=9,
            label=f"btp vs {other} (paper, +-15 %)",
        )
    ax.axhline(1.0, color="gray", lw=0.8)
    ax.set(ylabel="speedup (other / BTP)", title="BTP speedup: model vs published")

    ax = axes[0, 2]
    bars, labels = [], []
    for r, name in zip(rows, names, strict=True):
        for s in STYLE:
            bars.append(r.predicted_breakdown_s[s])
            labels.append(f"{name.split(chr(10))[0]}\n{s}")
    bottom = [0.0] * len(bars)
    for part, colour in PART_COLOURS.items():
        heights = [b[part] for b in bars]
        ax.bar(range(len(bars)), heights, bottom=bottom, color=colour, label=part)
        bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
    ax.set_xticks(range(len(bars)), labels, fontsize=6, rotation=90)
    ax.set(ylabel="seconds per iteration", title="Where the predicted time goes")

    ax = axes[1, 0]
    width = 0.38
    for i, r in enumerate(comm):
        ax.bar(
            i - width / 2,
            r.predicted_s * 1e3,
            width,
            color=STYLE[r.strategy],
            label="model" * (i == 0),
        )
        ax.bar(
            i + width / 2,
            r.paper_s * 1e3,
            width,
            color="white",
            edgecolor=STYLE[r.strategy],
            hatch="//",
            label="paper" * (i == 0),
        )
    ax.set_xticks(range(len(comm)), [r.strategy for r in comm])
    ax.set(
        ylabel="ms per layer (forward)",
        title="Communication ablation, 7B, batch 4, TP4 (model | paper)",
    )

    ax = axes[1, 1]
    for i, r in enumerate(gemm):
        ax.bar(
            i - width / 2,
            100 * r.predicted_utilisation,
            width,
            color=STYLE[r.strategy],
            label="model" * (i == 0),
        )
        ax.bar(
            i + width / 2,
            100 * r.paper_utilisation,
            width,
            color="white",
            edgecolor=STYLE[r.strategy],
            hatch="//",
            label="paper" * (i == 0),
        )
    ax.set_xticks(range(len(gemm)), [f"{r.strategy}\n{r.part}" for r in gemm], fontsize=8)
    ax.set(
        ylabel="GEMM utilisation, % of peak",
        title="GEMM ablation, 7B, batch 4, TP4 (model | paper)",
    )

    ax = axes[1, 2]
    flavors = list(dict.fromkeys(r.flavor for r in sweep))
    _speedup_curves(ax, sweep, flavors)
    base = sweep[0]
    for r in rows:
        same = (r.tp, r.pp, r.micro_batch, r.microbatches) == (
            base.tp,
            base.pp,
            base.micro_batch,
            base.microbatches,
        )
        if r.flavor in flavors and same:
            for key, other in (("btp_vs_megatron", "megatron"), ("btp_vs_vanilla", "vanilla")):
                ax.plot(
                    flavors.index(r.flavor),
                    r.paper_speedup[key],
                    "s",
                    color=STYLE[other],
                    mfc="none",
                    ms=9,
                )
    ax.set_xticks(range(len(flavors)), flavors)
    ax.set_title(
        f"BTP speedup by size, TP{base.tp}, {base.micro_batch}x{base.microbatches} (squares: paper)"
    )

    for ax in (axes[0, 0], axes[0, 1]):
        ax.set_xticks(list(x), names, fontsize=8)
    for ax in axes.flat:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    gpu = next(iter(sweep[0].predicted_step_s))
    fig.suptitle(
        f"Performance model vs the BOOST authors' measurements (CoLA, seq 4096, GPU profile {gpu})",
        fontsize=11,
    )
    _save(fig, path)
    plt.close(fig)
