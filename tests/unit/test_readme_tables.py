"""The documentation's tables of deterministic figures are what the project's tools print now.

`scripts/readme_tables.py --check` regenerates every marked table, on whichever page
(README.md or docs/*.md) holds it, and diffs it against that page. Here: every table in
full except `trace-sweep`, whose 45 traces take about a minute; of that one, the rows of
every strategy at the sweep's two extremes (1B TP2 and 30B TP8) are re-traced and must be
the committed lines, and every committed row must report agreement with the model.
`python scripts/readme_tables.py --check` checks all of it.
"""

from __future__ import annotations

import re

import pytest

from scripts.readme_tables import (
    ROOT,
    TABLES,
    TRACE_STRATEGIES,
    blocks,
    check,
    cp_7b_32k_memory,
    locate,
    main,
    regenerate,
    trace_configs,
    trace_rows,
)

WHERE = locate()
FAST = [name for name, table in TABLES.items() if not table.slow]
RETRACED = [
    (flavor, strategy, tp)
    for flavor, tp in (("1B", 2), ("30B", 8))
    for strategy in TRACE_STRATEGIES
]


def test_every_table_is_marked_once():
    assert set(WHERE) == set(TABLES)
    slow = [name for name, t in TABLES.items() if t.slow]
    assert slow == ["trace-sweep", "memory-check", "planner"]


@pytest.mark.parametrize("name", FAST)
def test_committed_table_is_what_the_command_prints(name):
    page = WHERE[name]
    label = page.relative_to(ROOT).as_posix()
    diff = check(page.read_text(), regenerate([name]), label)
    assert diff == "", f"{label}: table {name!r} is stale; run scripts/readme_tables.py\n{diff}"


def test_trace_sweep_rows_retraced():
    committed = blocks(WHERE["trace-sweep"].read_text())["trace-sweep"]
    lines = re.search(r"```\n(.*)\n```", committed, re.S).group(1).splitlines()
    header, rows, summary = lines[0], lines[1:-1], lines[-1]
    configs = trace_configs()
    assert len(rows) == len(configs) == 45
    assert all(row.endswith("  agrees") for row in rows)
    assert summary.startswith("activation bytes, largest |model - trace| / trace: megatron 0.00%")
    assert "45 configurations, 45 agree" in committed
    fresh = trace_rows(RETRACED)
    assert fresh[0] == header
    by_config = dict(zip(configs, rows, strict=True))
    for config, line in zip(RETRACED, fresh[1:-1], strict=True):  # less the summary line
        assert line == by_config[config], config


def _tree(tmp_path, pages: dict[str, str]):
    """A root with README.md and docs/ holding `pages` (path -> text)."""
    (tmp_path / "docs").mkdir(parents=True)
    (tmp_path / "README.md").write_text("# empty\n")
    for path, text in pages.items():
        (tmp_path / path).write_text(text)
    return tmp_path


def test_check_reports_a_stale_table_on_its_page(tmp_path, capsys):
    """--check exits 1 and prints a diff naming the page; without it the page is rewritten
    in place, wherever in docs/ it sits."""
    committed = WHERE["params"].read_text()
    stale = committed.replace(
        "| 1B | 24 | 32 | 2048 | 5472 | 512 |", "| 1B | 24 | 32 | 2048 | 5472 | 999 |"
    )
    assert stale != committed
    root = _tree(tmp_path, {"docs/sizes.md": stale})
    args = ["--only", "params", "--root", str(root)]
    assert main(["--check", *args]) == 1
    out = capsys.readouterr().out
    assert "--- docs/sizes.md (committed)" in out
    assert (
        "-| 1B | 24 | 32 | 2048 | 5472 | 999 |" in out
        and "+| 1B | 24 | 32 | 2048 | 5472 | 512 |" in out
    )
    assert main(args) == 0
    assert (root / "docs/sizes.md").read_text() == committed
    assert main(["--check", *args]) == 0
    assert main(["--only", "nope", "--root", str(root)]) == 2


def test_a_marker_on_no_page_twice_or_unknown_is_an_error(tmp_path, capsys):
    params = WHERE["params"].read_text()
    block = re.search(r"<!-- table:params -->\n.*?\n<!-- /table -->", params, re.S).group(0)
    cases = {
        "nowhere": ({}, "no page (README.md, docs/*.md) marks table(s) params"),
        "two pages": (
            {"docs/a.md": block, "docs/b.md": block},
            "table 'params' is marked in a.md and b.md",
        ),
        "twice on a page": ({"docs/a.md": f"{block}\n\n{block}"}, "a.md: table 'params' is"),
        "unknown": (
            {"docs/a.md": block.replace("table:params", "table:parms")},
            "a.md: unknown table 'parms'",
        ),
    }
    for case, (pages, message) in cases.items():
        root = _tree(tmp_path / case.replace(" ", "-"), pages)
        assert main(["--check", "--only", "params", "--root", str(root)]) == 2, case
        err = capsys.readouterr().err
        assert err.startswith("error: ") and message in err and err.count("\n") == 1, (case, err)


def test_a_stale_figure_in_prose_fails_the_check(tmp_path, capsys):
    """README's 7B TP4 figures are the model's (`bench validate`, `bench model`): a figure
    typed by hand and left behind by a model change (README said BTP 0.74 s after the model
    moved to 0.76 / 0.765) fails --check; the regenerated line is what `bench validate`
    prints for that row."""
    readme = (ROOT / "README.md").read_text()
    line = next(line for line in readme.splitlines() if "<!-- figure:paper-7b -->" in line)
    stale = re.sub(r"BTP [0-9.]+ s", "BTP 0.74 s", line)
    assert stale != line
    root = _tree(tmp_path, {"README.md": readme.replace(line, stale)})
    assert main(["--check", "--only", "paper-7b,model-7b", "--root", str(root)]) == 1
    out = capsys.readouterr().out
    assert f"-{stale}" in out and f"+{line}" in out
    from boost_titan.bench.__main__ import main as bench

    assert bench(["validate"]) == 0
    seven = next(r for r in capsys.readouterr().out.splitlines() if r.split()[:2] == ["7B", "TP4"])
    btp, megatron, vanilla = (
        float(x)
        for x in re.findall(
            r"BTP ([0-9.]+) s, full-rank TP ([0-9.]+) s, vanilla ([0-9.]+) s", line
        )[0]
    )
    assert f"{megatron:.2f}/{vanilla:.2f}/{btp:.2f}" in seven, seven


def test_a_figure_must_be_marked_inline(tmp_path, capsys):
    """A figure marked as a table block (or a table as a figure) is one error line."""
    cases = {
        "figure as block": "<!-- table:paper-7b -->\nBTP\n<!-- /table -->\n",
        "table as figure": "see <!-- figure:params -->x<!-- /figure -->\n",
    }
    for case, text in cases.items():
        root = _tree(tmp_path / case.replace(" ", "-"), {"docs/a.md": text})
        assert main(["--check", "--only", "paper-7b", "--root", str(root)]) == 2, case
        err = capsys.readouterr().err
        assert err.startswith("error: a.md: ") and "must be marked as" in err, (case, err)


def test_the_7b_32k_config_quotes_the_models_memory():
    """train_configs/7B_32k.toml's header quotes the memory per GPU that `bench model`
    predicts for it (and docs/parallelism.md's `cp-7b-32k` figure): it said 35.7 GiB while
    the model gave 36.7."""
    header = (ROOT / "train_configs" / "7B_32k.toml").read_text()
    quoted = re.search(r"\(([0-9.]+ GiB)\s*#\s*per GPU predicted on H100s", header)
    assert quoted, "the header no longer quotes the memory per GPU"
    assert quoted[1] == cp_7b_32k_memory(), f"{quoted[1]} in the header; run bench model"
