"""The README's tables of deterministic figures are what the project's tools print now.

`scripts/readme_tables.py --check` regenerates every marked table and diffs it against
README.md. Here: every table in full except `trace-sweep`, whose 45 traces take about a
minute; of that one, the rows of every strategy at the sweep's two extremes (1B TP2 and
30B TP8) are re-traced and must be the committed lines, and every committed row must
report agreement with the model. `python scripts/readme_tables.py --check` checks all
of it.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SPEC = importlib.util.spec_from_file_location(
    "readme_tables", ROOT / "scripts" / "readme_tables.py"
)
readme_tables = importlib.util.module_from_spec(SPEC)
sys.modules["readme_tables"] = readme_tables  # dataclasses look their module up
SPEC.loader.exec_module(readme_tables)

README = (ROOT / "README.md").read_text()
FAST = [name for name, table in readme_tables.TABLES.items() if not table.slow]
RETRACED = [
    (flavor, strategy, tp)
    for flavor, tp in (("1B", 2), ("30B", 8))
    for strategy in readme_tables.TRACE_STRATEGIES
]


def test_every_table_is_marked_once():
    assert set(readme_tables.blocks(README)) == set(readme_tables.TABLES)
    assert [name for name, t in readme_tables.TABLES.items() if t.slow] == ["trace-sweep"]


@pytest.mark.parametrize("name", FAST)
def test_committed_table_is_what_the_command_prints(name):
    diff = readme_tables.check(README, readme_tables.regenerate([name]))
    assert diff == "", f"README table {name!r} is stale; run scripts/readme_tables.py\n{diff}"


def test_trace_sweep_rows_retraced():
    committed = readme_tables.blocks(README)["trace-sweep"]
    lines = re.search(r"```\n(.*)\n```", committed, re.S).group(1).splitlines()
    header, rows, summary = lines[0], lines[1:-1], lines[-1]
    configs = readme_tables.trace_configs()
    assert len(rows) == len(configs) == 45
    assert all(row.endswith("  agrees") for row in rows)
    assert summary.startswith("activation bytes, largest |model - trace| / trace: megatron 0.00%")
    assert "45 configurations, 45 agree" in committed
    fresh = readme_tables.trace_rows(RETRACED)
    assert fresh[0] == header
    by_config = dict(zip(configs, rows, strict=True))
    for config, line in zip(RETRACED, fresh[1:], strict=True):
        assert line == by_config[config], config


def test_check_reports_a_stale_table(tmp_path, capsys):
    """--check exits 1 and prints a diff; without it the file is rewritten in place."""
    readme = tmp_path / "README.md"
    stale = README.replace(
        "| 1B | 24 | 32 | 2048 | 5472 | 512 |", "| 1B | 24 | 32 | 2048 | 5472 | 999 |"
    )
    assert stale != README
    readme.write_text(stale)
    assert readme_tables.main(["--check", "--only", "params", "--readme", str(readme)]) == 1
    out = capsys.readouterr().out
    assert (
        "-| 1B | 24 | 32 | 2048 | 5472 | 999 |" in out
        and "+| 1B | 24 | 32 | 2048 | 5472 | 512 |" in out
    )
    assert readme_tables.main(["--only", "params", "--readme", str(readme)]) == 0
    assert readme.read_text() == README
    assert readme_tables.main(["--check", "--only", "params", "--readme", str(readme)]) == 0
    assert readme_tables.main(["--only", "nope", "--readme", str(readme)]) == 2
