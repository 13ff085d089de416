"""The `cpu` subcommand's JSON on a tiny config (no timing assertions)."""

from __future__ import annotations

import json

import pytest

from boost_titan.bench.__main__ import main


def test_cpu_json_schema(capsys):
    tiny = [
        "--dim",
        "32",
        "--rank",
        "8",
        "--heads",
        "2",
        "--ffn-dim",
        "64",
        "--vocab-size",
        "32",
        "--seq-len",
        "8",
        "--micro-batch",
        "1",
    ]
    argv = [
        "cpu",
        *tiny,
        "--repeats",
        "1",
        "--warmup",
        "0",
        "--profile",
        "1",
        "--overlap-chunks",
        "2",
        "--json",
        "-",
    ]
    assert main(argv) == 0
    records = json.loads(capsys.readouterr().out)
    assert [(r["strategy"], r["arch"]) for r in records] == [
        ("megatron", "fullrank"),
        ("vanilla", "cola"),
        ("btp", "cola"),
    ]
    for r in records:
        assert {
            "step_ms_median",
            "step_ms_min",
            "step_ms_max",
            "repeats",
            "tp",
            "seq_len",
            "micro_batch",
            "ratio_to_btp",
            "ratio_to_btp_paired",
        } <= set(r)
        assert r["repeats"] == len(r["step_ms"]) == 1 and r["tp"] == 2
        assert r["step_ms_min"] <= r["step_ms_median"] <= r["step_ms_max"]
        split = r["profile_ms"]
        assert set(split) == {"step", "gemm", "attention", "comm", "other"}
        assert split["gemm"] > 0 and split["attention"] > 0 and split["comm"] > 0
        assert sum(v for k, v in split.items() if k != "step") == pytest.approx(split["step"])
        # the same strategy with its all-reduces in 2 overlapped blocks, timed alongside
        assert r["overlap_chunks"] == 2 and len(r["overlap_step_ms"]) == 1
        assert r["overlap_profile_ms"]["comm"] > 0 and r["overlap_to_one_paired"] > 0
    assert records[-1]["ratio_to_btp"] == 1.0
    # the full-rank baseline runs TorchTitan's ungrouped layout; low-rank ones group
    assert [r["group_linears"] for r in records] == [False, True, True]
