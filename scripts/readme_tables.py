"""Regenerate the documentation's tables of measured and modelled figures from the project's tools.

Each table lives between two marker comments in one page, README.md or docs/*.md::

    <!-- table:NAME -->
    ...generated text...
    <!-- /table -->

and is replaced by what `TABLES[NAME]` prints (the same text as the command it names, less
anything that changes from run to run: the trace's own wall-clock seconds). A figure quoted
in prose is marked the same way on one line, `<!-- figure:NAME -->0.765 s<!-- /figure -->`
(markdown shows the text alone), and is what `TABLES[NAME]` (`inline=True`) prints. The pages are
scanned for the markers, so a table moves to another page without a change here; a marker
found on no page, twice, or with an unknown name is an error. Everything here is
deterministic: counts, bytes, FLOPs, activation bytes, the analytic model's seconds. The
wall-clock tables (`bench cpu`, command start-up) are measurements of one machine at one
time and are not regenerated.

    python scripts/readme_tables.py                 # rewrite the pages in place
    python scripts/readme_tables.py --check         # exit 1 with a diff if a page differs
    python scripts/readme_tables.py --only params,validate --check
    python scripts/readme_tables.py --list

`trace-sweep` runs the full trace sweep (45 configurations, about 40 s of one core); the
others take a few seconds each. tests/unit/test_readme_tables.py runs `--check` for every table
but `trace-sweep`, and re-traces a subset of that one's rows.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import io
import json
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

TRACE_FLAVORS = ("1B", "3B", "7B", "13B", "30B")
TRACE_STRATEGIES = ("megatron", "vanilla", "btp")
TRACE_TPS = (2, 4, 8)
TRACE_COMMAND = (
    "python -m boost_titan.bench trace --flavor 1B,3B,7B,13B,30B "
    "--strategy megatron,vanilla,btp --tp 2,4,8 --compare"
)
QUALITY_RESULTS = "docs/quality.json"
"""What `bench quality --results` writes by default."""
AC_FLAVOR, AC_SEQ, AC_TPS = "1B", 2048, (1, 4)
DEFAULT_CONFIGS = ",".join(
    f"train_configs/{size}.toml" for size in ("1B", "3B", "7B", "13B", "30B", "7B_32k")
)


@dataclass(frozen=True)
class Table:
    command: str
    """The command whose output the table reproduces (documentation)."""
    generate: Callable[[], str]
    slow: bool = False
    inline: bool = False
    """A figure inside a line of prose (`<!-- figure:NAME -->`), not a block."""


def _stdout(fn: Callable[[], object]) -> str:
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        fn()
    return buffer.getvalue().rstrip("\n")


def _fenced(text: str) -> str:
    return f"```\n{text}\n```"


# ---- the tables -------------------------------------------------------------------------
def params_table() -> str:
    from boost_titan.boost_llama.__main__ import main

    return _stdout(main)


def bench_output(*argv: str, fenced: bool = True) -> Callable[[], str]:
    """What `python -m boost_titan.bench ARGV` prints, in a code block unless it is a
    markdown table (`fenced=False`)."""

    def generate() -> str:
        from boost_titan.bench.__main__ import main

        code: list[int] = []
        with contextlib.chdir(ROOT):  # the argv's paths are the repository's
            text = _stdout(lambda: code.append(main(list(argv))))
        if code != [0]:
            raise RuntimeError(f"bench {' '.join(argv)} exited {code}")
        return _fenced(text) if fenced else text

    return generate


def trace_rows(configs: list[tuple[str, str, int]]) -> list[str]:
    """Lines of `bench trace --compare` (without the wall-clock column) for (flavor,
    strategy, tp) configurations at the command's defaults (cola, micro-batch 1, seq 4096)."""
    from boost_titan.bench.measure import trace
    from boost_titan.perf.layout import TrainingLayout, trained_shape

    records = [
        trace.trace_compared(
            flavor,
            trained_shape(flavor, "cola", strategy),
            TrainingLayout(strategy=strategy, tp=tp),
            "a100",
        )
        for flavor, strategy, tp in configs
    ]
    return trace.format_traces(records, timing=False).splitlines()


def trace_configs() -> list[tuple[str, str, int]]:
    return [(f, s, tp) for f in TRACE_FLAVORS for tp in TRACE_TPS for s in TRACE_STRATEGIES]


def trace_table() -> str:
    lines = trace_rows(trace_configs())
    rows = lines[1:-1]  # between the header and the activation summary
    agree = sum(line.endswith("  agrees") for line in rows)
    summary = f"{len(rows)} configurations, {agree} agree"
    body = _fenced("\n".join(lines))
    return f"<details><summary>output ({summary})</summary>\n\n{body}\n</details>"


def lowrank_ac_table() -> str:
    """The TP1 / TP4 table of `python -m boost_titan.activation_memory --flavor 1B
    --seq-len 2048 [--tp 4]`, and what the low-rank recompute contains."""
    from boost_titan.bench.measure.activations import measure_layer
    from boost_titan.boost_llama import flavor_args
    from boost_titan.config import AC_MODES
    from boost_titan.perf import block
    from boost_titan.perf.layout import TrainingLayout, trained_shape

    args = flavor_args(AC_FLAVOR, arch="cola")
    runs = {
        tp: {m: measure_layer(args, m, seq_len=AC_SEQ, tp=tp) for m in AC_MODES} for tp in AC_TPS
    }
    names = {
        "none": "none",
        "full": "TorchTitan `full`",
        "selective": "TorchTitan `selective` (op)",
        "lowrank": "**`lowrank_ac`**",
    }
    header = ["mode"]
    for tp in AC_TPS:
        label = "TP1" if tp == 1 else f"TP{tp} btp"
        header += [f"{label}: MiB/layer", "vs none", "recompute GFLOP"]
    header.append(f"TP{max(AC_TPS)} backward collectives")
    rows = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for mode in AC_MODES:
        cells = [names[mode]]
        for tp in AC_TPS:
            m, none = runs[tp][mode], runs[tp]["none"]
            recompute = (m.backward_flops - none.backward_flops) / 1e9
            cells += [
                f"{m.saved_bytes / 2**20:.1f}",
                f"{100 * m.saved_bytes / none.saved_bytes:.1f}%",
                f"{recompute:.1f}" if mode != "none" else "0",
            ]
        comm = runs[max(AC_TPS)][mode].backward_collectives.get("all_reduce", 0)
        replay = {"none": "all-reduces", "full": "(forward replayed)"}.get(mode, "(none replayed)")
        cells.append(f"{comm} {replay}" if mode != "none" else f"{comm} all-reduces")
        if mode == "lowrank":
            cells = [c if c.startswith("**") else f"**{c}**" for c in cells]
        rows.append("| " + " | ".join(cells) + " |")

    lines = []
    for tp in AC_TPS:
        run = runs[tp]
        full = run["full"].backward_flops - run["none"].backward_flops
        low = run["lowrank"].backward_flops - run["none"].backward_flops
        plan = TrainingLayout(strategy="btp", tp=tp, seq_len=AC_SEQ)
        shape = trained_shape(AC_FLAVOR, "cola", "btp")
        ups = {g.name: g.flops for g in block.layer_gemms(shape, plan) if g.name.endswith(".B")}
        attention = block.attention_flops(shape, plan)
        without_down = sum(ups.values()) - ups["down.B"] + attention
        verdict = {
            without_down: "every up-projection but B_down",
            without_down + ups["down.B"]: f"every up-projection including B_down "
            f"({ups['down.B'] / 1e9:.1f} GFLOP)",
        }.get(low, "other work")
        label = "TP1" if tp == 1 else f"TP{tp}"
        lines.append(
            f"{label}: forward {run['none'].forward_flops / 1e9:.1f} GFLOP per layer and rank; "
            f"low-rank AC recomputes {low / 1e9:.1f} GFLOP ({100 * low / full:.0f}% of full AC's "
            f"{full / 1e9:.1f}): attention and {verdict}."
        )
    return "\n".join(rows) + "\n\n" + "\n".join(f"- {line}" for line in lines)


def paper_7b_figures() -> str:
    """The paper's 7B TP4 seconds per iteration (a100-hgx4): the model's GPU work, as `bench
    validate` prints it, then the published ones."""
    from boost_titan.perf import paper

    row = next(r for r in paper.validation_rows() if (r.flavor, r.tp) == ("7B", 4))
    m, p = row.predicted_s, row.paper_s
    return (
        f"BTP {m['btp']:.2f} s, full-rank TP {m['megatron']:.2f} s, vanilla "
        f"{m['vanilla']:.2f} s predicted; they measured {p['btp']:.2f} / {p['megatron']:.2f} / "
        f"{p['vanilla']:.2f} s"
    )


def precision_7b_figure(column: str) -> Callable[[], str]:
    """`bench precision`'s 7B TP4 a100-hgx4 step in `column` (fp32, bf16), `5.933 s`."""

    def generate() -> str:
        from boost_titan.perf import precision_table

        rows = precision_table.precision_rows(("a100-hgx4",))
        row = next(r for r in rows if r.config == "7B TP4")
        return f"{row.seconds[column]:.3f} s"

    return generate


MODEL_7B = ("model", "--flavor", "7B", "--tp", "4", "--gpu", "a100-hgx4", "--strategy", "btp")


def model_7b_figure() -> str:
    """`bench model`'s BTP 7B TP4 step on a100-hgx4 (its defaults: compiled, micro-batch 1
    x 4): the GPU's work plus this code's host term."""
    import json

    (record,) = json.loads(bench_output(*MODEL_7B, "--json", "-", fenced=False)())
    return f"{record['predicted_step_s']['a100-hgx4']:.3f} s"


F8_7B = ("model", "--flavor", "7B", "--strategy", "btp", "--tp", "4", "--gpu", "h100")
F8_13B = ("model", "--flavor", "13B", "--strategy", "megatron", "--tp", "4", "--micro-batch", "4")
F8_13B = (*F8_13B, "--gpu", "h100")
FUSED = ("--float8", "tensorwise", "--float8-casts", "fused")


def model_record(*argv: str) -> dict:
    """The one record `bench model ARGV --json -` prints."""
    import json

    (record,) = json.loads(bench_output(*argv, "--json", "-", fenced=False)())
    return record


def _split(record: dict) -> dict[str, float]:
    """A record's predicted step split on its one GPU, with the step itself."""
    (gpu,) = record["predicted_step_s"]
    return {**record["time_breakdown_s"][gpu], "step": record["predicted_step_s"][gpu]}


def float8_7b(kind: str) -> Callable[[], str]:
    """docs/precision.md's 7B TP4 H100 figures: bf16, float8 with fused casts, eager."""

    def generate() -> str:
        bf16 = _split(model_record(*F8_7B))
        if kind == "bf16":
            gemm, host = bf16["gemm"], bf16["host"]
            return (
                f"{bf16['step']:.3f} s, of which GEMMs {gemm:.3f} s and host launches {host:.3f} s"
            )
        if kind == "eager":
            eager = _split(model_record(*F8_7B, "--float8", "tensorwise", "--no-compile"))
            return f"{eager['step']:.3f} s"
        f8 = _split(model_record(*F8_7B, *FUSED))
        casts = f8["memory"] - bf16["memory"]
        return (
            f"GEMMs {f8['gemm']:.3f} s, casts {casts:.3f} s of memory-bound work, exposed "
            f"communication {bf16['comm']:.3f} -> {f8['comm']:.3f} s: {f8['step']:.3f} s"
        )

    return generate


def float8_13b() -> str:
    """docs/precision.md's full-rank 13B TP4 H100 figures, bf16 and float8 fused."""
    bf16, f8 = _split(model_record(*F8_13B)), _split(model_record(*F8_13B, *FUSED))
    casts = f8["memory"] - bf16["memory"]
    return (
        f"{bf16['step']:.3f} s bf16 (GEMMs {bf16['gemm']:.3f} s) and {f8['step']:.3f} s float8 "
        f"with fused casts (GEMMs {f8['gemm']:.3f} s; casts add {casts:.3f} s)"
    )


def float8_13b_memory() -> str:
    return f"{model_record(*F8_13B)['memory_bytes_per_rank']['total'] / 2**30:.0f} GiB"


CP_7B_32K = ("model", "--config", "train_configs/7B_32k.toml", "--nproc", "8", "--gpu", "h100")


def cp_7b_32k_memory() -> str:
    """`bench model`'s memory per GPU for train_configs/7B_32k.toml on 8 H100s, `36.7 GiB`
    (also quoted in that file's header: tests/unit/test_readme_tables.py)."""
    return f"{model_record(*CP_7B_32K)['memory_bytes_per_rank']['total'] / 2**30:.1f} GiB"


def cp_7b_32k_figure() -> str:
    """docs/parallelism.md's step time and memory of train_configs/7B_32k.toml."""
    seconds = model_record(*CP_7B_32K)["predicted_step_s"]["h100"]
    return f"{seconds:.3f} s per step on H100s, {cp_7b_32k_memory()} per GPU"


def quality_table() -> str:
    """docs/models.md's quality table, from the summary `bench quality` wrote (its runs take
    minutes; the table is its printed one)."""
    from boost_titan.bench.measure.quality import table

    return table(json.loads((ROOT / QUALITY_RESULTS).read_text()))


TABLES: dict[str, Table] = {
    "params": Table("python -m boost_titan.boost_llama", params_table),
    "lowrank-ac": Table(
        "python -m boost_titan.activation_memory --flavor 1B --seq-len 2048 [--tp 4]",
        lowrank_ac_table,
    ),
    "trace-sweep": Table(TRACE_COMMAND, trace_table, slow=True),
    "model-breakdown": Table(
        "python -m boost_titan.bench model --flavor 7B --tp 4 --gpu a100-hgx4 --breakdown",
        bench_output("model", "--flavor", "7B", "--tp", "4", "--gpu", "a100-hgx4", "--breakdown"),
    ),
    "validate": Table("python -m boost_titan.bench validate", bench_output("validate")),
    "precision": Table(
        "python -m boost_titan.bench precision", bench_output("precision", fenced=False)
    ),
    "default-configs": Table(
        f"python -m boost_titan.bench precision --config {DEFAULT_CONFIGS}",
        bench_output("precision", "--config", DEFAULT_CONFIGS, fenced=False),
    ),
    "hf-refusals": Table(  # the render function lives in boost_titan.hf_refusals
        "python -m boost_titan.hf_refusals",
        lambda: __import__("boost_titan.hf_refusals", fromlist=["_"]).refusal_table(),
    ),
    "memory-check": Table(  # render function: boost_titan.bench.measure.memtrack (minutes)
        "python -m boost_titan.bench memory --check",
        lambda: __import__("boost_titan.bench.measure.memtrack", fromlist=["_"]).check_table(),
        slow=True,
    ),
    "paper-7b": Table("python -m boost_titan.bench validate", paper_7b_figures, inline=True),
    "model-7b": Table(
        f"python -m boost_titan.bench {' '.join(MODEL_7B)}", model_7b_figure, inline=True
    ),
    "precision-7b-fp32": Table(
        "python -m boost_titan.bench precision", precision_7b_figure("fp32"), inline=True
    ),
    "precision-7b-bf16": Table(
        "python -m boost_titan.bench precision", precision_7b_figure("bf16"), inline=True
    ),
    "float8-7b-bf16": Table(
        f"python -m boost_titan.bench {' '.join(F8_7B)} --breakdown", float8_7b("bf16"), inline=True
    ),
    "float8-7b-fused": Table(
        f"python -m boost_titan.bench {' '.join(F8_7B + FUSED)} --breakdown",
        float8_7b("fused"),
        inline=True,
    ),
    "float8-7b-eager": Table(
        f"python -m boost_titan.bench {' '.join(F8_7B)} --float8 tensorwise --no-compile",
        float8_7b("eager"),
        inline=True,
    ),
    "float8-13b": Table(
        f"python -m boost_titan.bench {' '.join(F8_13B)} --breakdown [{' '.join(FUSED)}]",
        float8_13b,
        inline=True,
    ),
    "float8-13b-memory": Table(
        f"python -m boost_titan.bench {' '.join(F8_13B)}", float8_13b_memory, inline=True
    ),
    "cp-7b-32k": Table(
        f"python -m boost_titan.bench {' '.join(CP_7B_32K)} --json -", cp_7b_32k_figure, inline=True
    ),
    "quality": Table("python -m boost_titan.bench quality", quality_table),
    "planner": Table(  # render function: boost_titan.perf.layout_search
        "python -m boost_titan.plan --auto --flavor F --gpus N --gpu G --global-batch B",
        lambda: __import__("boost_titan.perf.layout_search", fromlist=["_"]).docs_tables(),
        slow=True,
    ),
}


# ---- the pages ------------------------------------------------------------------------
BLOCK = re.compile(r"(<!-- table:(?P<name>[\w-]+) -->\n)(?P<body>.*?)(\n<!-- /table -->)", re.S)
FIGURE = re.compile(r"(<!-- figure:(?P<name>[\w-]+) -->)(?P<body>[^<\n]*)(<!-- /figure -->)")
"""A figure in a line of prose; its text cannot hold `<` or a line break."""


class MarkerError(ValueError):
    """A table marker that is unknown, on two pages, or twice on one."""


def pages(root: Path = ROOT) -> list[Path]:
    """The pages that may hold tables: README.md and docs/*.md."""
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def blocks(text: str, page: str = "README.md") -> dict[str, str]:
    """NAME -> current text between the markers of one page."""
    found: dict[str, str] = {}
    for match in (*BLOCK.finditer(text), *FIGURE.finditer(text)):
        if match["name"] in found:
            raise MarkerError(f"{page}: table {match['name']!r} is marked twice")
        found[match["name"]] = match["body"]
    return found


def locate(root: Path = ROOT) -> dict[str, Path]:
    """NAME -> the page that holds its table, for every marker on every page."""
    where: dict[str, Path] = {}
    for page in pages(root):
        for name in blocks(page.read_text(), page.name):
            if name not in TABLES:
                raise MarkerError(f"{page.name}: unknown table {name!r}; --list shows them")
            inline = any(m["name"] == name for m in FIGURE.finditer(page.read_text()))
            if inline != TABLES[name].inline:
                want = "<!-- figure:NAME --> in a line" if TABLES[name].inline else "a table block"
                raise MarkerError(f"{page.name}: {name!r} must be marked as {want}")
            if name in where:
                raise MarkerError(f"table {name!r} is marked in {where[name].name} and {page.name}")
            where[name] = page
    return where


def render(text: str, generated: dict[str, str]) -> str:
    for marker in (BLOCK, FIGURE):
        text = marker.sub(
            lambda m: m.group(1) + generated.get(m["name"], m["body"]) + m.group(4), text
        )
    return text


def regenerate(names: list[str]) -> dict[str, str]:
    generated = {name: TABLES[name].generate() for name in names}
    for name, text in generated.items():
        if TABLES[name].inline and ("\n" in text or "<" in text):
            raise ValueError(f"figure {name!r} must be one line without '<': {text!r}")
    return generated


def check(text: str, generated: dict[str, str], path: str = "README.md") -> str:
    """A unified diff of one page's committed tables against the generated ones ('' if equal)."""
    new = render(text, generated)
    return "".join(
        difflib.unified_diff(
            text.splitlines(keepends=True),
            new.splitlines(keepends=True),
            fromfile=f"{path} (committed)",
            tofile=f"{path} (generated)",
        )
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--check",
        action="store_true",
        help="do not write; exit 1 and print a diff if a page differs",
    )
    parser.add_argument("--only", help=f"comma list of tables ({', '.join(TABLES)})")
    parser.add_argument(
        "--root", type=Path, default=ROOT, help="the tree whose README.md and docs/ to scan"
    )
    parser.add_argument("--list", action="store_true", help="list the tables and their commands")
    ns = parser.parse_args(argv)
    if ns.list:
        for name, table in TABLES.items():
            print(f"{name:16s} {table.command}")
        return 0
    names = ns.only.split(",") if ns.only else list(TABLES)
    unknown = [n for n in names if n not in TABLES]
    if unknown:
        print(f"error: unknown table(s) {', '.join(unknown)}; --list shows them", file=sys.stderr)
        return 2
    try:
        where = locate(ns.root)
    except MarkerError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    missing = [n for n in names if n not in where]
    if missing:
        print(
            f"error: no page (README.md, docs/*.md) marks table(s) {', '.join(missing)}",
            file=sys.stderr,
        )
        return 2
    generated = regenerate(names)
    by_page: dict[Path, list[str]] = {}
    for name in names:
        by_page.setdefault(where[name], []).append(name)
    stale = []
    for page, page_names in by_page.items():
        label = page.relative_to(ns.root).as_posix()
        mine = {n: generated[n] for n in page_names}
        if ns.check:
            diff = check(page.read_text(), mine, label)
            if diff:
                print(diff, end="")
                stale.append(label)
            else:
                print(f"{label}: {', '.join(page_names)} up to date")
        else:
            page.write_text(render(page.read_text(), mine))  # read late: others may edit
            print(f"{label}: regenerated {', '.join(page_names)}")
    if stale:
        print(
            f"\n{', '.join(stale)} differ from what the tools print: run scripts/readme_tables.py",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
