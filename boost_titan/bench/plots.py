"""Figure of the performance model: communication volume and BTP speedup vs model size."""

from __future__ import annotations

from pathlib import Path

from boost_titan.bench.records import MIB, PerfRecord

STYLE = {"megatron": "tab:blue", "vanilla": "tab:red", "btp": "tab:green"}


def write_plot(records: list[PerfRecord], path: str | Path) -> None:
    """Write a two-panel PNG from a flavor sweep holding megatron, vanilla and btp records:
    comm bytes per layer (fwd+bwd) per strategy, and btp's speedup on every GPU profile."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by = {(r.flavor, r.strategy): r for r in records}
    flavors = list(dict.fromkeys(r.flavor for r in records))
    x = range(len(flavors))
    fig, (comm, speed) = plt.subplots(1, 2, figsize=(11, 4.2))
    for strategy, color in STYLE.items():
        volume = [(by[f, strategy].comm_bytes_per_layer_fwd + by[f, strategy].comm_bytes_per_layer_bwd) / MIB
                  for f in flavors]
        comm.plot(x, volume, "o-", color=color, label=strategy)
    comm.set(ylabel="MiB per layer per rank (fwd + bwd)", title="TP communication volume")
    gpus = list(records[0].predicted_step_s)
    for gpu, dash in zip(gpus, ("-", "--", ":")):
        for other in (s for s in STYLE if s != "btp"):
            ratio = [by[f, other].predicted_step_s[gpu] / by[f, "btp"].predicted_step_s[gpu] for f in flavors]
            speed.plot(x, ratio, "o" + dash, color=STYLE[other], label=f"btp vs {other} ({gpu})")
    speed.axhline(1.0, color="gray", lw=0.8)
    speed.set(ylabel="predicted step-time ratio", title="BTP speedup")
    first = next(r for r in records if r.strategy == "btp")
    setup = f"{first.arch}, TP{first.tp}" + (f"xPP{first.pp}" if first.pp > 1 else "")
    setup += f", seq {first.seq_len}, micro-batch {first.micro_batch} x {first.microbatches}, {first.dtype}"
    for ax in (comm, speed):
        ax.set_xticks(list(x), flavors)
        ax.set_xlabel("model size")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"Analytic performance model ({setup})", fontsize=10)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
