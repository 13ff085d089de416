"""`trace` (the real model and plan, one block, fake process group) against the analytic model."""

from __future__ import annotations

import json

import pytest

from boost_titan.bench import perfmodel as pm
from boost_titan.bench import trace
from boost_titan.bench.__main__ import main

GIB = 2**30
CONFIGS = [("fullrank", "megatron")] + [
    (arch, strategy) for arch in ("cola", "svd") for strategy in ("vanilla", "btp")
]


def traced(flavor: str, arch: str, strategy: str, **plan) -> tuple[trace.TraceRecord, list[str]]:
    args = pm.model_args(flavor, arch, strategy)
    p = pm.Plan(strategy=strategy, **plan)
    record = trace.trace(flavor, args, p)
    return record, trace.compare(record, pm.evaluate(flavor, args, p, ["a100"]), args, p)


@pytest.mark.parametrize("tp", [2, 4, 8])
@pytest.mark.parametrize("arch,strategy", CONFIGS)
@pytest.mark.parametrize("flavor", ["1B", "7B"])
def test_trace_agrees_with_model(flavor, arch, strategy, tp):
    record, mismatches = traced(flavor, arch, strategy, tp=tp, seq_len=256)
    assert mismatches == []
    assert record.collectives_per_layer_fwd == {"megatron": 2, "vanilla": 7, "btp": 4}[strategy]


def test_paper_7b_forward_payloads():
    """BOOST §3: 7B, micro-batch 4, seq 4096, bf16, TP4, forward payload per layer."""
    gib = {}
    for arch, strategy in (("fullrank", "megatron"), ("cola", "vanilla"), ("cola", "btp")):
        record, mismatches = traced("7B", arch, strategy, tp=4, seq_len=4096, micro_batch=4)
        assert mismatches == []
        gib[strategy] = record.comm_bytes_per_layer_fwd / GIB
    assert gib["megatron"] == 0.25
    assert gib["vanilla"] == pytest.approx(1.30, abs=0.005)
    assert gib["btp"] == pytest.approx(0.22, abs=0.005)


def test_compare_reports_disagreement():
    args = pm.model_args("1B", "cola", "btp")
    plan = pm.Plan(strategy="btp", tp=2, seq_len=128)
    record = trace.trace("1B", args, plan)
    modelled = pm.evaluate("1B", args, plan, ["a100"])
    modelled.comm_bytes_per_layer_fwd += 1
    modelled.flops_per_layer = int(modelled.flops_per_layer * 1.02)
    problems = trace.compare(record, modelled, args, plan)
    assert [p.split(":")[0] for p in problems] == ["comm_bytes_per_layer_fwd", "flops_per_layer"]


def test_cli_json_and_compare(capsys):
    argv = ["trace", "--flavor", "1B", "--strategy", "btp,megatron", "--tp", "2",
            "--seq-len", "128", "--compare", "--json", "-"]
    assert main(argv) == 0
    records = json.loads(capsys.readouterr().out)
    assert [r["strategy"] for r in records] == ["btp", "megatron"]
    model_fields = {
        "collectives_per_layer_fwd", "collectives_per_layer_bwd", "comm_bytes_per_layer_fwd",
        "comm_bytes_per_layer_bwd", "collectives_fwd", "collectives_bwd", "flops_per_layer",
        "params_per_rank", "activation_bytes_per_layer", "step_collectives_fwd",
    }
    assert model_fields <= set(records[0])
    assert all(r["model_mismatches"] == [] for r in records)
    assert main(["trace", "--flavor", "1B", "--tp", "2", "--seq-len", "128", "--ac", "full"]) == 2
    assert "--ac none" in capsys.readouterr().err
