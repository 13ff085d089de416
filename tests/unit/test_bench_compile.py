"""`bench compile`: its cells, rows and one-line errors (`tests/distributed/test_bench_compile.py`:
the BTP low-rank cell at TP 2 on gloo ranks)."""

from __future__ import annotations

import pytest

from boost_titan.bench.__main__ import main
from boost_titan.bench.measure.compiled import (
    CompileRow,
    PassResult,
    cells_of,
    format_rows,
)


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
