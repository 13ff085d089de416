"""`trace` (the real model and plan, one block, fake process group) against the analytic model."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from boost_titan.bench.__main__ import main
from boost_titan.bench.measure import trace
from boost_titan.bench.measure.fake_group import fused_rms_norm_saves
from boost_titan.perf import activations, layout, predict
from boost_titan.perf.layout import TrainingLayout

GIB = 2**30
CONFIGS = [("fullrank", "megatron")] + [
    (arch, strategy) for arch in ("cola", "svd") for strategy in ("vanilla", "btp")
]


def traced(flavor: str, arch: str, strategy: str, **plan) -> tuple[trace.TraceRecord, list[str]]:
    args = layout.trained_shape(flavor, arch, strategy)
    p = TrainingLayout(strategy=strategy, **plan)
    record = trace.trace(flavor, args, p)
    return record, trace.compare(record, predict.evaluate(flavor, args, p, ["a100"]), args, p)


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
    args = layout.trained_shape("1B", "cola", "btp")
    plan = TrainingLayout(strategy="btp", tp=2, seq_len=128)
    record = trace.trace("1B", args, plan)
    modelled = predict.evaluate("1B", args, plan, ["a100"])
    assert modelled.activation_bytes_per_layer == record.activation_bytes_per_layer
    modelled.comm_bytes_per_layer_fwd += 1
    modelled.flops_per_layer = int(modelled.flops_per_layer * 1.02)
    modelled.activation_bytes_per_layer = int(record.activation_bytes_per_layer * 1.06)
    problems = trace.compare(record, modelled, args, plan)
    assert [p.split(":")[0] for p in problems] == [
        "comm_bytes_per_layer_fwd",
        "flops_per_layer",
        "activation_bytes_per_layer",
    ]
    assert problems[-1].endswith("(+6.0%)")
    modelled.activation_bytes_per_layer = int(record.activation_bytes_per_layer * 0.96)
    assert [p.split(":")[0] for p in trace.compare(record, modelled, args, plan)][
        -1
    ] == "flops_per_layer"


@pytest.mark.parametrize(
    "arch,strategy,plan",
    [
        ("cola", "btp", {"rmsnorm": "sync"}),
        ("cola", "btp", {"group_linears": False}),
        ("cola", "btp", {"rmsnorm": "sync", "group_linears": False, "dtype": "fp32"}),
        ("fullrank", "megatron", {"group_linears": False}),
        ("cola", "vanilla", {"group_linears": False, "micro_batch": 2}),
    ],
    ids=[
        "btp-sync",
        "btp-ungrouped",
        "btp-sync-ungrouped-fp32",
        "megatron-ungrouped",
        "vanilla-ungrouped-mb2",
    ],
)
def test_activation_bytes_agree_off_the_defaults(arch, strategy, plan):
    """The model keeps the trace's byte count for the product's other switches too (sync
    RMSNorm's fp32 statistics are priced at the training dtype by the communication
    model, which `compare` reports; only activations are checked here)."""
    record, mismatches = traced("1B", arch, strategy, tp=2, seq_len=128, **plan)
    assert not [m for m in mismatches if m.startswith("activation")]
    args = layout.trained_shape("1B", arch, strategy)
    modelled = activations.activation_bytes(
        args, TrainingLayout(strategy=strategy, tp=2, seq_len=128, **plan)
    )
    assert record.activation_bytes_per_layer == modelled


def test_fused_rms_norm_saves_what_cuda_saves():
    """Inside `fused_rms_norm_saves`, F.rms_norm computes the same values and grads but
    keeps only the input (and weight) and the fp32 rstd, as CUDA's `_fused_rms_norm`."""
    x = torch.randn(3, 5, 16, dtype=torch.float64, requires_grad=True)
    w = torch.randn(16, dtype=torch.float64, requires_grad=True)
    expected = F.rms_norm(x, (16,), w, 1e-5)
    grads = torch.autograd.grad(expected.sin().sum(), (x, w))
    with fused_rms_norm_saves():
        saved = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
            out = F.rms_norm(x, (16,), w, 1e-5)
    assert F.rms_norm.__module__ == "torch.nn.functional"  # restored
    torch.testing.assert_close(out, expected)
    for got, want in zip(torch.autograd.grad(out.sin().sum(), (x, w)), grads, strict=True):
        torch.testing.assert_close(got, want)
    assert [tuple(t.shape) for t in saved] == [(3, 5, 16), (16,), (3, 5, 1)]
    assert saved[0] is x


def test_cli_json_and_compare(capsys):
    argv = [
        "trace",
        "--flavor",
        "1B",
        "--strategy",
        "btp,megatron",
        "--tp",
        "2",
        "--seq-len",
        "128",
        "--compare",
        "--json",
        "-",
    ]
    assert main(argv) == 0
    records = json.loads(capsys.readouterr().out)
    assert [r["strategy"] for r in records] == ["btp", "megatron"]
    model_fields = {
        "collectives_per_layer_fwd",
        "collectives_per_layer_bwd",
        "comm_bytes_per_layer_fwd",
        "comm_bytes_per_layer_bwd",
        "collectives_fwd",
        "collectives_bwd",
        "flops_per_layer",
        "params_per_rank",
        "activation_bytes_per_layer",
        "step_collectives_fwd",
    }
    assert model_fields <= set(records[0])
    assert all(r["model_mismatches"] == [] for r in records)
    assert main(["trace", "--flavor", "1B", "--tp", "2", "--seq-len", "128", "--ac", "full"]) == 2
    assert "--ac none" in capsys.readouterr().err
    assert main(["trace", "--flavor", "debug", "--tp", "2"]) == 2  # default seq 4096 > 2048
    assert capsys.readouterr().err.strip() == (
        "error: --seq-len 4096 exceeds the debug flavor's maximum 2048; pass --seq-len 2048 or less"
    )
