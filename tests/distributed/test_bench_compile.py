"""`bench compile`: torch.compile against eager per strategy x AC mode x TP degree, here its
BTP low-rank cell at TP 2 in a cold and a warm pass (`tests/unit/test_bench_compile.py`:
cells, rows and errors in one process)."""

from __future__ import annotations

import json

from boost_titan.bench.__main__ import main


def test_btp_lowrank_cell_at_tp2_equals_eager_on_a_cold_and_a_warm_cache(tmp_path, capsys):
    """The harness end to end: BTP with low-rank AC at TP 2 (aot_eager, seconds instead of
    Inductor's minutes), a cold pass and a warm pass in new processes against one cache
    folder: no graph break, eager's loss and gradients, eager's collectives. That a warm
    Inductor pass reads the cache and still equals eager is
    `tests/distributed/test_compile_cache.py`'s job (through the trainer) and `bench compile
    --tp 2`'s (every cell, docs/compile.md); `CompileRow.ok` requiring warm cache hits is
    tested in `tests/unit/test_bench_compile.py`."""
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
        "--backend",
        "aot_eager",
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
    assert row["backend"] == "aot_eager", row
    assert "every cell compiles" in capsys.readouterr().out
