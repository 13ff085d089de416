"""`bench compile`: torch.compile against eager per strategy x AC mode x TP degree."""

from __future__ import annotations

import json

import pytest

from boost_titan.bench.__main__ import main
from boost_titan.bench.compiled import CompileRow, cells_of, format_rows


@pytest.mark.slow
def test_compiled_lowrank_ac_at_tp2_equals_eager(tmp_path, capsys):
    """One cell end to end: no graph break, eager's loss and gradients, eager's collectives."""
    out = tmp_path / "rows.json"
    assert main(["compile", "--tp", "2", "--strategy", "btp", "--ac", "lowrank", "--repeats", "1",
                 "--json", str(out)]) == 0
    (row,) = json.loads(out.read_text())
    assert (row["strategy"], row["ac"], row["tp"], row["error"]) == ("btp", "lowrank", 2, None)
    assert row["graph_breaks"] == 0 and row["max_rel_error"] <= 1e-5
    assert row["compiled_collectives"] == row["eager_collectives"]
    assert row["eager_collectives"]["all_reduce"] > 0
    assert "every cell compiles" in capsys.readouterr().out
    assert row["compiled_collectives"] == {"all_gather": 1, "all_reduce": 21, "reduce_scatter": 1}


def test_cells_skip_lowrank_ac_on_the_fullrank_model():
    assert cells_of(["megatron", "btp"], ["none", "lowrank"]) == [
        ("megatron", "none"), ("btp", "none"), ("btp", "lowrank")]


def test_rows_show_differences_and_errors():
    base = dict(arch="cola", strategy="btp", ac="full", tp=2, backend="aot_eager", graph_breaks=0,
                max_rel_error=0.0, compile_s=1.0, step_ratio=1.0)
    rows = [CompileRow(**base, eager_collectives={"all_reduce": 8}, compiled_collectives={"all_reduce": 12}),
            CompileRow(**base, eager_collectives={"all_reduce": 8}, compiled_collectives={"all_reduce": 6}),
            CompileRow(**{**base, "graph_breaks": None}, eager_collectives={}, compiled_collectives={},
                       error="Unsupported: graph break")]
    text = format_rows(rows)
    assert "DIFFER: all_reduce x8 / all_reduce x12" in text
    assert "fewer: all_reduce x8 / all_reduce x6" in text
    assert "| btp | full | 2 | Unsupported: graph break |" in text


@pytest.mark.parametrize("args, message", [
    (["--ac", "recompute"], "unknown AC mode recompute"),
    (["--tp", "3"], "--tp 3 does not divide"),
    (["--tp", "two"], "--tp takes comma-separated integers"),
])
def test_bad_input_is_one_line(args, message, capsys):
    assert main(["compile", *args]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
