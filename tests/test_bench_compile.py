"""`bench compile`: torch.compile against eager per strategy x AC mode x TP degree."""

from __future__ import annotations

import json

import pytest

from boost_titan.bench.__main__ import main
from boost_titan.bench.compiled import (
    CompileRow,
    PassResult,
    cells_of,
    format_rows,
)


@pytest.mark.slow
def test_btp_lowrank_cell_at_tp2_equals_eager_on_a_cold_and_a_warm_cache(tmp_path, capsys):
    """BTP with low-rank AC at TP 2 with Inductor, in a cold pass (empty cache folder) and a
    warm pass (new processes, same folder): no graph break, eager's loss and gradients,
    eager's collectives, and the warm pass read the cache (the compiled loss, which ranks
    used to take from each other). The whole matrix is `bench compile --tp 2` (README)."""
    out = tmp_path / "rows.json"
    argv = [
        "compile",
        "--strategy",
        "btp",
        "--ac",
        "lowrank",
        "--tp",
        "2",
        "--repeats",
        "1",
        "--cache-dir",
        str(tmp_path / "cache"),
        "--json",
        str(out),
    ]
    assert main(argv) == 0
    (row,) = json.loads(out.read_text())
    assert (row["strategy"], row["ac"], row["tp"]) == ("btp", "lowrank", 2)
    for name in ("cold", "warm"):
        result = row[name]
        assert result["error"] is None and result["graph_breaks"] == 0, (row, name)
        assert result["max_rel_error"] <= 1e-5, (row, name)
        assert (
            result["compiled_collectives"]
            == result["eager_collectives"]
            == {"all_gather": 1, "all_reduce": 21, "reduce_scatter": 1}
        ), (row, name)
    assert row["cold"]["cache_hits"] == 0 and row["warm"]["cache_hits"] >= 1, row
    assert "every cell compiles" in capsys.readouterr().out


def test_cells_skip_lowrank_ac_on_the_fullrank_model():
    assert cells_of(["megatron", "btp"], ["none", "lowrank"]) == [
        ("megatron", "none"),
        ("btp", "none"),
        ("btp", "lowrank"),
    ]


def test_rows_show_differences_and_errors():
    base = dict(arch="cola", strategy="btp", ac="full", tp=2, backend="inductor")
    result = dict(graph_breaks=0, max_rel_error=0.0, cache_hits=1, compile_s=1.0, step_ratio=1.0)

    def row(compiled: dict[str, int], warm_error: float = 0.0, **fields) -> CompileRow:
        cold = PassResult(
            **result, eager_collectives={"all_reduce": 8}, compiled_collectives=compiled
        )
        warm = PassResult(
            **{**result, "max_rel_error": warm_error, **fields},
            eager_collectives={"all_reduce": 8},
            compiled_collectives=compiled,
        )
        return CompileRow(**base, cold=cold, warm=warm)

    more, fewer, wrong = (
        row({"all_reduce": 12}),
        row({"all_reduce": 6}),
        row({"all_reduce": 8}, 2.0),
    )
    broken = CompileRow(
        **base, cold=PassResult(error="Unsupported: graph break"), warm=PassResult()
    )
    text = format_rows([more, fewer, wrong, broken])
    assert "DIFFER: all_reduce x8 / all_reduce x12" in text
    assert "fewer: all_reduce x8 / all_reduce x6" in text
    assert "| 0.0e+00 / 2.0e+00 | 1 |" in text
    assert "| btp | full | 2 | Unsupported: graph break |" in text
    assert [r.ok() for r in (more, fewer, wrong, broken)] == [False, True, False, False]
    assert not row(
        {"all_reduce": 8}, cache_hits=0
    ).ok()  # an Inductor warm pass must read the cache


@pytest.mark.parametrize(
    "args, message",
    [
        (["--ac", "recompute"], "unknown AC mode recompute"),
        (["--tp", "3"], "--tp 3 does not divide"),
        (["--tp", "two"], "--tp takes comma-separated integers"),
    ],
)
def test_bad_input_is_one_line(args, message, capsys):
    assert main(["compile", *args]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
