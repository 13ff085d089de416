"""`bench compile`: torch.compile against eager per strategy x AC mode x TP degree, here its
BTP low-rank cell at TP 2 on a cold and a warm cache (`tests/unit/test_bench_compile.py`:
cells, rows and errors in one process)."""

from __future__ import annotations

import json

from boost_titan.bench.__main__ import main


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
