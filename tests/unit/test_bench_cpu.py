"""The `cpu` subcommand's one-line errors (`tests/distributed/test_bench_cpu.py`: its JSON on
a tiny config, on gloo ranks)."""

from __future__ import annotations

from boost_titan.bench.__main__ import main


def test_cpu_rejects_bad_config(capsys):
    assert main(["cpu", "--dim", "30", "--heads", "3", "--rank", "6"]) == 2
    assert "not divisible by tp 2" in capsys.readouterr().err
    assert main(["cpu", "--profile", "-1"]) == 2
    assert "--profile >= 0" in capsys.readouterr().err
