"""`bench precision`: the predicted step of the paper's configurations in each precision.

The four BOOST configurations (1B on one GPU, 3B TP2, 7B TP4, 13B TP4 x PP2; CoLA, BTP,
as `paper.PAPER_ROWS`) in one batch layout, micro-batch 1 x 4 micro-batches of 4096
tokens (BOOST's layout; the published 3B / 13B rows ran 4 x 1), priced in fp32, bf16 (fp32
master weights) and float8 (torchao tensorwise on every GEMM the runtime selects: eager
casts in an eager model, casts fused by torch.compile, and fused with TorchTitan's
`auto_filter_small_kn`), every column but the eager one compiled as the GPU configs are.
A GPU without float8 tensor cores gets "n/a" there.
"""

from __future__ import annotations

from dataclasses import dataclass

from boost_titan.perf import layout, predict
from boost_titan.perf.gpus import gpu_profile
from boost_titan.perf.job_plan import job_plan
from boost_titan.perf.layout import TrainingLayout
from boost_titan.perf.paper import PAPER_GPU, PAPER_ROWS
from boost_titan.perf.records import config_name

GPUS = (PAPER_GPU, "h100")
BATCH = {"seq_len": 4096, "micro_batch": 1, "microbatches": 4}
AUTO_FILTER = ("auto_filter_small_kn",)
PRECISIONS: dict[str, dict] = {
    "fp32": {"dtype": "fp32", "compiled": True},
    "bf16": {"dtype": "bf16", "compiled": True},
    "float8 eager casts": {"float8": "tensorwise"},
    "float8 compiled casts": {"float8": "tensorwise", "float8_casts": "fused", "compiled": True},
    "float8 compiled + auto filter": {
        "float8": "tensorwise",
        "float8_casts": "fused",
        "float8_filter": AUTO_FILTER,
        "compiled": True,
    },
}
"""Column name -> TrainingLayout fields (over bf16 with master weights)."""


@dataclass(frozen=True)
class PrecisionRow:
    config: str
    gpu: str
    seconds: dict[str, float | None]
    """Predicted seconds per step by PRECISIONS column; None: the GPU has no float8."""
    float8_gemms: dict[str, dict[str, int]]
    """Per float8 column: {float8, total} forward GEMMs per rank."""


def precision_rows(gpus: tuple[str, ...] = GPUS) -> list[PrecisionRow]:
    rows = []
    for paper in PAPER_ROWS:
        args = layout.trained_shape(paper.flavor, "cola", "btp")
        for gpu in gpus:
            seconds: dict[str, float | None] = {}
            counts = {}
            for column, fields in PRECISIONS.items():
                if "float8" in fields and not gpu_profile(gpu).has_float8:
                    seconds[column] = None
                    continue
                plan = TrainingLayout(strategy="btp", tp=paper.tp, pp=paper.pp, **BATCH, **fields)
                record = predict.evaluate(paper.flavor, args, plan, [gpu])
                seconds[column] = record.predicted_step_s[gpu]
                if record.float8_gemms:
                    counts[column] = record.float8_gemms
            name = config_name(paper.flavor, paper.tp, paper.pp)
            rows.append(PrecisionRow(name, gpu, seconds, counts))
    return rows


def format_precision_rows(rows: list[PrecisionRow]) -> str:
    """A markdown table: seconds per step, float8 cells with their share of float8 GEMMs."""
    header = ["config", "GPU", *PRECISIONS]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in rows:
        cells = [r.config, r.gpu]
        for column, seconds in r.seconds.items():
            if seconds is None:
                cells.append("n/a (no float8)")
                continue
            count = r.float8_gemms.get(column)
            cells.append(
                f"{seconds:.3f}"
                + (
                    f" ({count['float8']}/{count['total']} GEMMs)"
                    if count and count["float8"] < count["total"]
                    else ""
                )
            )
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def format_jobs(paths: list[str], gpus: tuple[str, ...] = ("a100", "h100")) -> str:
    """A markdown table of training jobs as `bench model --config` prices them (each on
    the fewest processes its degrees allow): layout, precision, predicted step per GPU."""
    header = ["config", "processes", "layout", "batch", "precision", *[f"step s {g}" for g in gpus]]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for path in paths:
        job = job_plan(path)
        p = job.plan
        degrees = [f"{p.strategy} TP{p.tp}"] * (p.tp > 1) + [f"CP{p.cp}"] * (p.cp > 1)
        layout = " x ".join(degrees + [f"PP{p.pp}"] * (p.pp > 1))
        steps = predict.evaluate(job.flavor, job.args, p, list(gpus)).predicted_step_s
        batch = f"{p.micro_batch} x {p.microbatches} x {p.seq_len}"
        cells = [f"`{path}`", str(p.tp * p.cp * p.pp), layout or "one device", batch, p.precision]
        lines.append("| " + " | ".join([*cells, *[f"{steps[g]:.3f}" for g in gpus]]) + " |")
    return "\n".join(lines)
