"""Analytic performance model: hand-computed small cases of every term, the eager kernel
counts measured on the product's code, the paper's 7B payloads, validation, the CLI."""

from __future__ import annotations

import dataclasses
import functools
import json

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from boost_titan.bench.__main__ import main
from boost_titan.bench.measure.fake_group import fake_tp_mesh
from boost_titan.boost_llama.layers import apply_rope, rope_table
from boost_titan.boost_llama.shapes import ModelShape, param_count
from boost_titan.boost_llama.strategies import STRATEGIES
from boost_titan.config.errors import ConfigError
from boost_titan.parallelize.norms import sync_rmsnorm
from boost_titan.perf import (
    activations,
    block,
    costs,
    float8_costs,
    host,
    layout,
    paper,
    predict,
    streams,
    timing,
)
from boost_titan.perf.gpus import GPUS, NCCL, GpuProfile, gpu_profile
from boost_titan.perf.layout import BF16_WEIGHTS, TrainingLayout
from boost_titan.perf.records import PerfRecord
from boost_titan.perf.work import Collective, Gemm, Stream
from tests.helpers import ROOT

# d=8, r=2, d_ff=16, 2 heads of 4; one micro-batch of T = 3 tokens (seq 3), bf16, TP2.
TINY = ModelShape(dim=8, n_layers=2, n_heads=2, ffn_dim=16, rank=2, vocab_size=10, arch="cola")
TINY_FULL = dataclasses.replace(TINY, arch="fullrank")
BYTES_PER_ELEMENT = 3 * 2  # tokens * bf16


def plan(strategy: str, **kw) -> TrainingLayout:
    return TrainingLayout(strategy=strategy, **{"tp": 2, "seq_len": 3, **kw})


def args_for(strategy: str) -> ModelShape:
    return TINY_FULL if strategy == "megatron" else TINY


def sizes(collectives: list[Collective]) -> list[tuple[str, int]]:
    return [(c.name, c.elements_per_token) for c in collectives]


def test_tiny_collectives_grouped_online():
    fwd, bwd = block.layer_collectives(TINY, plan("btp"))
    assert sizes(fwd) == [
        ("qkv.A", 7),
        ("o.A", 2),
        ("gate_up.A", 5),
        ("down.A", 2),
    ]  # 3r+1, r, 2r+1, r
    assert sizes(bwd) == [("down.B", 2), ("gate_up.B", 4), ("o.B", 2), ("qkv.B", 6)]
    assert [c.bytes(3, 2) for c in fwd] == [42, 12, 30, 12]
    assert {c.kind for c in fwd + bwd} == {"all_reduce"}

    fwd, bwd = block.layer_collectives(TINY, plan("vanilla"))
    assert [n for _, n in sizes(fwd)] == [8, 8, 8, 8, 16, 16, 8]  # q k v o gate up down at d_out
    assert sizes(bwd) == [("down.A", 16), ("gate_up.A", 8), ("o.A", 8), ("qkv.A", 8)]
    assert sum(c.bytes(3, 2) for c in fwd) == 72 * BYTES_PER_ELEMENT

    fwd, bwd = block.layer_collectives(TINY_FULL, plan("megatron"))
    assert sizes(fwd) == [("o", 8), ("down", 8)]
    assert sizes(bwd) == [("gate_up", 8), ("qkv", 8)]


@pytest.mark.parametrize("grouped", [True, False], ids=["grouped", "ungrouped"])
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_backward_all_reduces_hide_behind_weight_grads(strategy, grouped):
    """Each backward input-grad all-reduce names the GEMMs whose weight grads it runs
    behind: grouped, the one GEMM of the group; ungrouped, each member's; forward ones none."""
    p = plan(strategy, group_linears=grouped)
    fwd, bwd = block.layer_collectives(args_for(strategy), p)
    names = {g.name for g in block.layer_gemms(args_for(strategy), p)}
    assert all(not c.behind for c in fwd)
    assert all(c.behind and set(c.behind) <= names for c in bwd)
    behind = {c.name: c.behind for c in bwd}
    if strategy == "btp":
        assert behind["qkv.B" if grouped else "q.B"] == (
            ("q.B", "k.B", "v.B") if grouped else ("q.B",)
        )
    elif strategy == "vanilla":
        assert behind["qkv.A"] == (("qkv.A",) if grouped else ("q.A", "k.A", "v.A"))
        assert behind["down.A"] == ("down.A",)
    else:
        assert behind["gate_up"] == (("gate_up",) if grouped else ("gate", "up"))
    _, step_bwd = block.step_collectives(args_for(strategy), p)
    assert [c.behind for c in step_bwd] == ([(), ()] if strategy == "btp" else [("lm_head",)])


def test_tiny_collectives_sync_and_ungrouped():
    fwd, bwd = block.layer_collectives(TINY, plan("btp", rmsnorm="sync"))
    assert [n for _, n in sizes(fwd)] == [1, 6, 2, 1, 4, 2]
    assert sorted(n for _, n in sizes(bwd)) == [1, 1, 2, 2, 4, 6]
    fwd, bwd = block.layer_collectives(TINY, plan("btp", group_linears=False))
    assert [n for _, n in sizes(fwd)] == [3, 2, 2, 2, 3, 2, 2]  # statistic rides on q and gate
    assert [n for _, n in sizes(bwd)] == [2] * 7
    fwd, bwd = block.layer_collectives(TINY, plan("btp", group_linears=False, rmsnorm="sync"))
    assert (len(fwd), len(bwd)) == (9, 9)
    _, bwd = block.layer_collectives(TINY, plan("vanilla", group_linears=False))
    assert sizes(bwd) == [("down.A", 16), ("gate_up.A", 8), ("o.A", 8), ("qkv.A", 8)]  # per input
    assert block.layer_collectives(TINY, plan("btp", tp=1)) == ([], [])


def test_tiny_step_collectives():
    fwd, bwd = block.step_collectives(TINY, plan("btp"))
    assert [(c.kind, c.elements_per_token) for c in fwd] == [
        ("all_reduce", 1),
        ("all_gather", 4),
        ("all_reduce", 1),
        ("all_reduce", 1),
        ("all_reduce", 1),
    ]
    assert [(c.kind, c.elements_per_token) for c in bwd] == [
        ("reduce_scatter", 8),
        ("all_reduce", 1),
    ]
    fwd, bwd = block.step_collectives(TINY_FULL, plan("megatron"))
    assert [c.elements_per_token for c in fwd] == [1, 1, 1]
    assert sizes(bwd) == [("lm_head", 8)]


def test_tiny_flops_and_gemms():
    # low-rank GEMMs: 2T * sum r(d_in + d_out) / tp = 6 * 272 / 2; attention 4*T*seq*d/tp = 144
    assert block.layer_flops(TINY, plan("btp")) == 816 + 144
    assert block.layer_flops(TINY, plan("vanilla")) == 816 + 288  # attention replicated
    assert block.layer_flops(TINY_FULL, plan("megatron")) == 6 * 640 // 2 + 144
    megatron = {g.name: (g.m, g.n, g.k) for g in block.layer_gemms(TINY_FULL, plan("megatron"))}
    assert megatron == {"qkv": (3, 12, 8), "o": (3, 8, 4), "gate_up": (3, 16, 8), "down": (3, 8, 8)}
    ungrouped = block.layer_gemms(TINY_FULL, plan("megatron", group_linears=False))
    assert [g.name for g in ungrouped] == ["q", "k", "v", "o", "gate", "up", "down"]
    # without TP the model runs one GEMM per projection, grouped or not
    assert [g.name for g in block.layer_gemms(TINY, plan("btp", tp=1))][:3] == [
        "q.A",
        "q.B",
        "k.A",
    ]
    btp = {g.name: (g.m, g.n, g.k) for g in block.layer_gemms(TINY, plan("btp"))}
    assert btp["qkv.A"] == (3, 6, 4) and btp["q.B"] == (3, 4, 2) and btp["down.A"] == (3, 2, 8)
    vanilla = {g.name: (g.m, g.n, g.k) for g in block.layer_gemms(TINY, plan("vanilla"))}
    assert (
        vanilla["qkv.A"] == (3, 3, 8)
        and vanilla["q.B"] == (3, 8, 1)
        and vanilla["down.A"] == (3, 1, 16)
    )
    dx, dw = Gemm("x", 3, 4, 2).backward()
    assert (dx.m, dx.n, dx.k, dw.m, dw.n, dw.k) == (3, 2, 4, 2, 4, 3)
    assert Gemm("x", 2, 2, 2).intensity(2) == 16 / 24
    assert block.recompute_flops(TINY, plan("btp", ac="full")) == 960
    # lowrank recomputes the B GEMMs (2T r sum(d_out) / tp) and attention
    assert block.recompute_flops(TINY, plan("btp", ac="lowrank")) == 6 * 2 * 72 // 2 + 144


def test_tiny_memory():
    assert block.layer_params(TINY, plan("btp")) == 136 + 8  # r(d_in+d_out)/tp + sharded norms
    assert block.layer_params(TINY, plan("vanilla")) == 136 + 16
    assert block.layer_params(TINY_FULL, plan("megatron")) == 320 + 16
    for strategy in STRATEGIES:
        args = args_for(strategy)
        assert block.params_per_rank(args, plan(strategy, tp=1)) == param_count(args)
    mem = predict.memory_per_rank(TINY, plan("btp"))  # 4 micro-batches: later ones hold every grad
    assert mem["grads"] == mem["weights"] == 4 * block.params_per_rank(TINY, plan("btp"))
    assert mem["activations"] == 2 * activations.activation_bytes(TINY, plan("btp"))
    assert mem["optimizer"] == 2 * mem["weights"]  # AdamW's two fp32 moments per master weight
    assert mem["total"] == sum(v for k, v in mem.items() if k != "total")


def test_tiny_saved_activations_hand_computed():
    """Bytes one block keeps for backward, T = 3 tokens, bf16 (2 bytes), TP2: TINY has
    d 8, r 2, d_ff 16 and 2 heads of 4, so per rank btp holds residual 4, q = k = v 4,
    ffn 8, latents 2 and one head; the rstd and log-sum-exp are fp32 (4 bytes)."""
    btp = activations.saved_activations(TINY, plan("btp"))
    assert btp == {
        "attention_norm.input": 3 * 4 * 2,
        "attention_norm.statistic": 3 * 2,
        "qkv.concat_weights": (3 * 2) * 4 * 2,  # the three A shards [3r, d/tp]
        "ffn_norm.input": 24,
        "ffn_norm.statistic": 6,
        "gate_up.concat_weights": (2 * 2) * 4 * 2,
        "attention.q": 24,
        "attention.k": 24,
        "attention.v": 24,
        "attention.out": 24,
        "attention.lse": 3 * 1 * 4,
        "mlp.gate": 3 * 8 * 2,
        "mlp.up": 48,
        "mlp.product": 48,  # CoLA: no SiLU on the gate
        "pairs.latents": 7 * 3 * 2 * 2,
        "pairs.silu": 84,
    }
    assert sum(btp.values()) == 560
    # megatron: replicated norms keep input, fp32 rstd and output (8 wide); q/k/v are views
    # of one [12] GEMM output that v keeps; the MLP keeps gate/up [16], SiLU(gate), product
    megatron = activations.saved_activations(TINY_FULL, plan("megatron"))
    assert megatron["attention_norm.input"] == megatron["attention_norm.output"] == 48
    assert megatron["attention_norm.rstd"] == 3 * 4
    assert (
        megatron["qkv.concat_weights"] == 12 * 8 * 2
        and megatron["gate_up.concat_weights"] == 16 * 8 * 2
    )
    assert megatron["attention.qkv"] == 3 * 12 * 2 and "attention.v" not in megatron
    assert (megatron["mlp.gate_up"], megatron["mlp.silu_gate"], megatron["mlp.product"]) == (
        96,
        48,
        48,
    )
    assert sum(megatron.values()) == 2 * 108 + 192 + 256 + (24 + 24 + 72 + 24 + 12) + 192 == 1012
    # vanilla: replicated activations, all heads (lse 2 per token), latents r/tp = 1
    vanilla = activations.saved_activations(TINY, plan("vanilla"))
    assert vanilla["qkv.concat_weights"] == 3 * 8 * 2 and vanilla["attention.lse"] == 3 * 2 * 4
    assert vanilla["pairs.latents"] == vanilla["pairs.silu"] == 7 * 3 * 1 * 2
    assert sum(vanilla.values()) == 216 + 80 + 216 + 288 + 84 == 884
    # sync RMSNorm (eager): two fp32 upcasts, fp32 rstd, the normalised product, the output
    sync = activations.saved_activations(TINY, plan("btp", rmsnorm="sync"))
    assert (sync["attention_norm.upcast"], sync["attention_norm.rstd"]) == (2 * 3 * 4 * 4, 12)
    assert sync["attention_norm.normalised"] == sync["attention_norm.output"] == 24
    fp32 = activations.saved_activations(TINY, plan("btp", rmsnorm="sync", dtype="fp32"))
    assert fp32["attention_norm.upcast"] == 3 * 4 * 4  # the upcast is the input itself
    # ungrouped, the online norm also keeps each consumer's latent; no weights concatenated
    ungrouped = activations.saved_activations(TINY, plan("btp", group_linears=False))
    assert (
        ungrouped["attention_norm.latents"] == 3 * 3 * 2 * 2 and ungrouped["ffn_norm.latents"] == 24
    )
    assert not any(k.endswith("concat_weights") for k in ungrouped)
    # SVD: one latent per pair (no SiLU), and a SiLU on the MLP gate
    svd = activations.saved_activations(dataclasses.replace(TINY, arch="svd"), plan("btp"))
    assert "pairs.silu" not in svd and svd["mlp.silu_gate"] == 48
    # GQA (one kv head of 4 on 2 heads): bf16 flash attention takes k and v un-repeated;
    # fp32 on a GPU runs another kernel, which takes them repeated to q's width
    gqa_shape = dataclasses.replace(TINY_FULL, n_heads=2, n_kv_heads=1)
    gqa = activations.saved_activations(gqa_shape, plan("megatron", tp=1))
    assert gqa["attention.k"] == gqa["attention.v"] == 3 * 4 * 2 and gqa["attention.q"] == 48
    gqa = activations.saved_activations(gqa_shape, plan("megatron", tp=1, dtype="fp32"))
    assert gqa["attention.k"] == gqa["attention.v"] == gqa["attention.q"] == 3 * 8 * 4


def test_tiny_activation_bytes_under_ac():
    """full: the block input; selective: the mean of none and full; lowrank: the input and
    the forward collectives' outputs (btp 7r + 2 statistics; vanilla the B outputs at d_out;
    without TP the down-projection outputs)."""
    expected = {
        ("btp", "none"): 560,
        ("btp", "full"): 3 * 4 * 2,
        ("btp", "selective"): 292,
        ("btp", "lowrank"): 3 * (4 + 7 * 2 + 2) * 2,
        ("vanilla", "lowrank"): 3 * (8 + 8 * 5 + 2 * 16) * 2,
        ("megatron", "full"): 48,
    }
    for (strategy, ac), nbytes in expected.items():
        assert activations.activation_bytes(args_for(strategy), plan(strategy, ac=ac)) == nbytes
    assert (
        activations.activation_bytes(TINY, plan("btp", ac="lowrank", rmsnorm="sync"))
        == 3 * (4 + 14) * 2 + 2 * 3 * 4
    )
    assert activations.activation_bytes(TINY, plan("btp", ac="lowrank", tp=1)) == 3 * (8 + 14) * 2


def test_paper_7b_forward_payloads():
    p = TrainingLayout(strategy="btp", tp=4, seq_len=4096, micro_batch=4)
    gib = {}
    for strategy in STRATEGIES:
        args = layout.trained_shape("7B", "cola", strategy)
        fwd, _ = block.layer_collectives(args, dataclasses.replace(p, strategy=strategy))
        gib[strategy] = sum(c.bytes(p.tokens, 2) for c in fwd) / 2**30
    assert gib["megatron"] == 0.25
    assert gib["vanilla"] == pytest.approx(1.30, abs=0.005)
    assert gib["btp"] == pytest.approx(0.22, abs=0.005)


def test_btp_keeps_gemm_intensity():
    p = TrainingLayout(strategy="btp", tp=4)
    btp = block.layer_gemms(layout.trained_shape("7B", "cola", "btp"), p)
    vanilla_plan = dataclasses.replace(p, strategy="vanilla")
    vanilla = block.layer_gemms(layout.trained_shape("7B", "cola", "vanilla"), vanilla_plan)
    assert min(g.intensity(2) for g in btp) > min(g.intensity(2) for g in vanilla)


def test_check_rejects():
    with pytest.raises(ConfigError):
        layout.check(TINY_FULL, plan("btp"))
    with pytest.raises(ConfigError):
        layout.check(TINY, plan("btp", tp=3))
    with pytest.raises(ConfigError):
        layout.check(TINY_FULL, plan("megatron", ac="lowrank"))
    with pytest.raises(ConfigError):
        layout.check(dataclasses.replace(TINY, arch="lax"), plan("btp"))


def test_record_fields_and_speedups():
    records = predict.sweep(["1B"], "cola", list(STRATEGIES), [2], ["a100", "h100"])
    fields = {f.name for f in dataclasses.fields(PerfRecord)}
    required = {
        "flavor",
        "arch",
        "strategy",
        "tp",
        "pp",
        "seq_len",
        "micro_batch",
        "dtype",
        "collectives_per_layer_fwd",
        "collectives_per_layer_bwd",
        "comm_bytes_per_layer_fwd",
        "comm_bytes_per_layer_bwd",
        "flops_per_layer",
        "activation_bytes_per_layer",
        "params_per_rank",
        "predicted_step_s",
        "predicted_speedup",
        "collectives_fwd",
        "collectives_bwd",
    }
    assert required <= fields
    by = {r.strategy: r for r in records}
    assert by["megatron"].arch == "fullrank" and by["btp"].arch == "cola"
    assert set(by["btp"].predicted_step_s) == {"a100", "h100"}
    assert by["btp"].predicted_speedup["megatron"] == pytest.approx(
        by["megatron"].predicted_step_s["a100"] / by["btp"].predicted_step_s["a100"]
    )
    entry = by["btp"].collectives_fwd[0]
    assert set(entry) == {"kind", "name", "elements_per_token", "bytes", "behind"}
    assert sum(c["bytes"] for c in by["btp"].collectives_fwd) == by["btp"].comm_bytes_per_layer_fwd
    for parts, step in zip(
        by["btp"].time_breakdown_s.values(), by["btp"].predicted_step_s.values(), strict=True
    ):
        assert set(parts) == set(timing.TIME_PARTS)
        assert sum(parts.values()) == pytest.approx(step)


# ---- pricing: hand-computed small cases --------------------------------------------------
TOY = GpuProfile(
    name="toy",
    peak_flops={"bf16": 1e12, "fp32": 1e11},
    mamf_flops=0.5e12,
    mamf_shape=(512, 512, 1024),
    sm_count=2,
    hbm_bw=1e12,
    hbm_efficiency=0.5,
    epilogue_overlapped=True,
    attention_fwd_efficiency=0.5,
    attention_bwd_efficiency=0.25,
    gpus_per_node=4,
    nvlink_links=12,
    nvlink_link_bw=10e9,
    nvswitch=False,
    nccl_bus_cap=100e9,
    net_bw=10e9,
    launch_s=1e-6,
)
"""Two SMs, no epilogue cost: the 512x512 calibration shape fills whole waves, so the main
loop runs at exactly 0.5 of peak; HBM sustains 0.5 TB/s; pairs of GPUs share 4 links."""


def test_gemm_schedule_hand_computed():
    assert costs.mainloop_efficiency(TOY) == pytest.approx(0.5)
    # [256, 1024] x [1024, 128]: best is two 128x128 tiles, one wave on the two SMs, each
    # block 2*128*128*1024 FLOPs at 1e12 * 0.5 / 2 per SM (split-K would add a reduction)
    g = Gemm("g", 256, 128, 1024)
    block = 2 * 128 * 128 * 1024 / 2.5e11
    assert costs.gemm_time(g, "bf16", 2, TOY) == pytest.approx(block + 1e-6)
    assert costs.gemm_utilisation(g, "bf16", 2, TOY) == pytest.approx(
        g.flops / ((block + 1e-6) * 1e12)
    )
    # three 128-tiles on two SMs: two waves, the second half empty (wave quantisation; k
    # too short to split, and the 256-row tile computes padding in the same time)
    short = 2 * 128 * 128 * 256 / 2.5e11
    assert costs.schedule_time(Gemm("g", 384, 128, 256), "bf16", 2, TOY, 0.5) == pytest.approx(
        2 * short
    )
    # a tiny GEMM still occupies a whole 128x128 tile (tile quantisation) ...
    tiny = Gemm("tiny", 16, 16, 16)
    assert costs.gemm_time(tiny, "bf16", 2, TOY) == pytest.approx(
        2 * 128 * 128 * 16 / 2.5e11 + 1e-6
    )
    # ... unless moving its operands takes longer (roofline)
    slow = dataclasses.replace(TOY, name="toy, slow HBM", hbm_bw=1e9)
    assert costs.gemm_time(tiny, "bf16", 2, slow) == pytest.approx(tiny.bytes(2) / 0.5e9 + 1e-6)


def test_split_k_pays_an_fp32_reduction():
    # [128, 8192] x [8192, 128]: one tile would leave an SM idle; two k-halves fill both and
    # add the partial tiles' fp32 reduction (2 * 4 + 2 bytes per output element)
    g = Gemm("g", 128, 128, 8192)
    half = 2 * 128 * 128 * 4096 / 2.5e11
    reduction = (2 * 4 + 2) * 128 * 128 / 0.5e12
    assert costs.schedule_time(g, "bf16", 2, TOY, 0.5) == pytest.approx(half + reduction)


def test_epilogue_makes_thin_reductions_slower_on_a100():
    a100 = GPUS["a100"]
    e = costs.mainloop_efficiency(a100)
    assert costs.epilogue_k(a100, "bf16", 2, e) == pytest.approx(
        2 * 312e12 * e / (2 * 2.039e12 * 1355 / 1555)
    )
    assert costs.epilogue_k(GPUS["h100"], "bf16", 2, 0.8) == 0.0  # overlapped on Hopper
    # calibration: at the measured maximum-achievable-matmul (MAMF) shape, the model runs at
    # the measured rate
    m, n, k = a100.mamf_shape
    probe = Gemm("mamf", m, n, k)
    assert probe.flops / costs.schedule_time(probe, "bf16", 2, a100, e) == pytest.approx(271.2e12)
    # same FLOPs, reduction dim 256 (vanilla TP4's up) vs 1024 (BTP's): the thin one is slower
    util = {
        k: costs.gemm_utilisation(Gemm("g", 16384, 2**22 // k, k), "bf16", 2, a100)
        for k in (256, 1024)
    }
    assert util[256] < 0.62 < 0.70 < util[1024]


def test_memory_bound_kernels_and_launches():
    kernels = [Stream("a", 10.0), Stream("b", 6.0, launches=3)]
    assert costs.stream_time(kernels, TOY, tokens=100) == pytest.approx(1600 / 0.5e12 + 4e-6)
    assert costs.hbm_time(1e9, TOY) == pytest.approx(2e-3)


def test_attention_hand_computed():
    flops = 4 * 10**12  # counted with the causal mask not halved: executes half
    assert costs.attention_time(flops, "bf16", TOY) == pytest.approx(2.0 / 0.5 + 1e-6)
    assert costs.attention_time(flops, "bf16", TOY, backward=True) == pytest.approx(
        2.5 * 2.0 / 0.25 + 3e-6
    )


def test_collectives_on_nccl_ring_model():
    # no switch: a pair of GPUs shares 12 / 3 = 4 links (40 GB/s); four GPUs use all 12,
    # capped at 100
    assert TOY.bus_bw(2) == 40e9 and TOY.bus_bw(4) == 100e9
    assert GPUS["a100"].bus_bw(2) == GPUS["a100"].bus_bw(8) == 235e9  # NVSwitch
    assert GPUS["a100-hgx4"].bus_bw(2) == 80e9 and GPUS["a100-hgx4"].bus_bw(4) == 235e9
    big = 10**8  # Simple protocol: base + 6 hops + 2 * 3/4 of the buffer over the bus
    expected = NCCL.base_s + 6 * NCCL.hop_s + 1.5 * big / 100e9
    assert costs.collective_time("all_reduce", big, 4, TOY) == pytest.approx(expected)
    tiny = 1024  # LL protocol: lower latency, a quarter of the bandwidth
    expected = NCCL.ll_base_s + 6 * NCCL.ll_hop_s + 1.5 * tiny / 25e9
    assert costs.collective_time("all_reduce", tiny, 4, TOY) == pytest.approx(expected)
    # all-gather: p - 1 steps over the gathered buffer (4 inputs); reduce-scatter over its input
    expected = NCCL.base_s + 3 * NCCL.hop_s + 0.75 * 4 * big / 100e9
    assert costs.collective_time("all_gather", big, 4, TOY) == pytest.approx(expected)
    expected = NCCL.base_s + 3 * NCCL.hop_s + 0.75 * big / 100e9
    assert costs.collective_time("reduce_scatter", big, 4, TOY) == pytest.approx(expected)
    assert costs.collective_time("all_reduce", big, 1, TOY) == 0.0
    assert costs.send_time(10**9, TOY) == pytest.approx(NCCL.base_s + NCCL.net_hop_s + 0.1)


def test_overlap_hides_only_what_weight_grads_cover():
    p = TrainingLayout(strategy="btp", tp=4, seq_len=1000)
    ar = Collective("all_reduce", "x", 10**4, behind=("a", "b"))
    cost = costs.collective_time("all_reduce", 10**4 * 1000 * 2, 4, TOY)
    assert timing.overlapped([ar], {"a": cost / 4, "b": cost / 4}, p, TOY) == pytest.approx(
        (cost / 2, cost / 2)
    )
    assert timing.overlapped([ar], {"a": cost, "b": cost}, p, TOY) == pytest.approx((0.0, cost))
    exposed = dataclasses.replace(ar, behind=())
    assert timing.overlapped([exposed], {}, p, TOY) == pytest.approx((cost, 0.0))


# ---- memory-bound inventory --------------------------------------------------------------
def test_tiny_block_streams_hand_computed():
    """megatron, TP2, bf16: residual 8, q = kv = 4, ffn 8 per rank, grouped."""
    w = block.layer_widths(TINY_FULL, plan("megatron"))
    fwd, bwd = streams.block_streams(w, "replicated", 2)
    by = {s.name: s.bytes for s in fwd}
    assert (
        by["rope"] == (4 + 4) * 20
        and by["gate_mul"] == 3 * 8 * 2
        and by["attention_norm"] == 2 * 8 * 2
    )
    # norm 32, rope 160, add 48, norm 32, silu(gate) 32, product 48, add 48
    assert sum(s.bytes for s in fwd) == 400
    # the grouped q/k/v output's grads (12 wide) concatenated: read 12, write 12
    grads = {s.name: s for s in bwd}["attention_norm.cat_grads"]
    assert (grads.bytes, grads.launches) == (2 * 12 * 2, 1)
    # and the gate/up output's (16 wide): read 16, write 16
    assert {s.name: s for s in bwd}["ffn_norm.cat_grads"].bytes == 2 * 16 * 2
    assert sum(s.bytes for s in bwd) == 656  # rope.bwd (4 + 4) x 20
    # ungrouped: the consumers' input grads are summed instead (2 adds of the residual)
    w = block.layer_widths(TINY_FULL, plan("megatron", group_linears=False))
    _, bwd = streams.block_streams(w, "replicated", 2)
    assert {s.name: s.bytes for s in bwd}["attention_norm.sum_grads"] == 2 * 3 * 8 * 2


def test_btp_online_norm_streams():
    w = block.layer_widths(TINY, plan("btp"))  # residual 4, latents 2 (whole), q/k/v 3 x 2
    assert (w.residual, w.latent, w.q, w.ffn) == (4, 2, 4, 8)
    fwd, bwd = streams.block_streams(w, "online", 2)
    by = {s.name: s.bytes for s in fwd}
    assert by["attention_norm.stats"] == 2 * 4 * 2
    assert by["attention_norm.append_statistic"] == 2 * (6 + 1) * 2  # 3r + the statistic
    assert by["attention_norm.rescale"] == 2 * 6 * 2
    assert by["qkv.silu"] == 3 * 2 * 2 * 2 and "gate.silu" not in by  # CoLA: SiLU on latents only
    back = {s.name: s.bytes for s in bwd}
    assert back["attention_norm.bwd"] == 5 * 4 * 2  # dx and the weight grad read x and dy
    assert back["attention_norm.grad_rescale"] == 2 * 6 * 2
    assert back["attention_norm.grad_dot_out"] == 4 * 6 * 2  # product (3) and row sum (1)
    sync_fwd, _ = streams.block_streams(w, "sync", 2)
    assert {s.name: s.bytes for s in sync_fwd}["attention_norm"] == 4 * 42
    vanilla = block.layer_widths(TINY, plan("vanilla"))  # replicated activations, latents split
    assert (vanilla.residual, vanilla.q, vanilla.ffn, vanilla.latent) == (8, 8, 16, 1)


@pytest.mark.parametrize(
    "strategy,options,shared",
    [
        ("btp", {}, True),
        ("btp", {"group_linears": False}, True),  # BTP's group output is one tensor anyway
        ("vanilla", {}, True),
        ("vanilla", {"group_linears": False}, False),  # each down runs its own GEMM
        ("btp", {"tp": 1}, False),  # no plan: the model runs as written
    ],
)
def test_latent_silu_once_per_group_under_a_plan(strategy, options, shared):
    """CoLA's latent SiLU: one launch per norm group where the group applies it, else one
    per latent; the same bytes either way."""
    w = block.layer_widths(TINY, plan(strategy, **options))
    fwd, bwd = streams.block_streams(w, "replicated", 2)
    want = {"qkv": 1, "gate_up": 1} if shared else {"qkv": 3, "gate_up": 2}
    for phase, suffix, per in ((fwd, ".silu", 2), (bwd, ".silu.bwd", 3)):
        by = {s.name: s for s in phase}
        assert {g: by[g + suffix].launches for g in want} == want
        assert by["qkv" + suffix].bytes == 3 * w.latent * per * 2


class _KernelLog(TorchDispatchMode):
    """The non-view kernels dispatched, each with the (numel, bytes) of its inputs and outputs."""

    VIEWS = {
        "view",
        "view_as_complex",
        "view_as_real",
        "_conj",
        "_unsafe_view",
        "select",
        "slice",
        "expand",
        "t",
        "alias",
        "unsqueeze",
        "detach",
        "narrow",
        "unbind",
        "all_reduce",
        "wait_tensor",
        "_wrap_tensor_autograd",
        "randn_like",
        "ones_like",
    }

    def __init__(self) -> None:
        super().__init__()
        self.kernels: list[tuple[str, list[tuple[int, int]]]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.__name__.split(".")[0]
        if name not in self.VIEWS:
            tensors = [
                t for t in tree_flatten((args, kwargs, out))[0] if isinstance(t, torch.Tensor)
            ]
            self.kernels.append(
                (name, [(t.numel(), t.numel() * t.element_size()) for t in tensors])
            )
        return out

    def nbytes(self, min_numel: int = 0) -> int:
        """Bytes of the tensors of at least `min_numel` elements (leaves out per-row
        statistics, norm weights and RoPE's cos/sin table)."""
        return sum(b for _, tensors in self.kernels for n, b in tensors if n >= min_numel)


def _measure(forward, *inputs) -> tuple[_KernelLog, _KernelLog]:
    with _KernelLog() as fwd:
        out = forward(*inputs)
    grad = torch.ones_like(out)
    with _KernelLog() as bwd:
        out.backward(grad)
    return fwd, bwd


def test_rope_eager_cost_measured_on_the_product():
    """`apply_rope` in bf16: the kernels and bytes the model prices, counted from its aten
    ops (the fp32 cos/sin table, [seq, head_dim/2], left out)."""
    b, s, h, hd = 2, 16, 4, 8
    table = rope_table(hd, s, 10000.0)
    x = torch.randn(b, s, h, hd, dtype=torch.bfloat16, requires_grad=True)
    fwd, bwd = _measure(lambda t: apply_rope(t, table), x)
    n = x.numel()
    assert fwd.nbytes(n // 4) == n * streams.ROPE_FORWARD.bytes(2)
    assert bwd.nbytes(n // 4) == n * streams.ROPE_BACKWARD.bytes(2)
    assert (len(fwd.kernels), len(bwd.kernels)) == (
        streams.ROPE_FORWARD.launches(2),
        streams.ROPE_BACKWARD.launches(2),
    )


def test_sync_rmsnorm_eager_cost_measured_on_the_product():
    tokens, width = 64, 32
    with fake_tp_mesh(2) as mesh:
        x = torch.randn(tokens, width, dtype=torch.bfloat16, requires_grad=True)
        g = torch.randn(width, dtype=torch.bfloat16, requires_grad=True)
        fwd, bwd = _measure(lambda t: sync_rmsnorm(t, g, 2 * width, 1e-5, mesh.get_group()), x)
    n = tokens * width
    assert fwd.nbytes(n // 4) == n * streams.SYNC_NORM_FORWARD.bytes(2)
    assert bwd.nbytes(n // 4) == n * streams.SYNC_NORM_BACKWARD.bytes(2)
    assert len(fwd.kernels) == streams.SYNC_NORM_FORWARD.launches(2)
    assert len(bwd.kernels) == streams.SYNC_NORM_BACKWARD.launches(2)


def test_grouped_output_grads_measured():
    """Three consumers taking their parts of one split group output (as
    `GroupInstance.hand_out` / `take` do): the split's backward concatenates their grads."""
    w = block.layer_widths(TINY, plan("btp"))
    tokens, widths = 16, (w.latent,) * 3
    out = torch.randn(tokens, sum(widths), dtype=torch.bfloat16, requires_grad=True)
    ys = [part.view_as(part) for part in out.split(widths, dim=-1)]
    with _KernelLog() as log:
        torch.autograd.backward(ys, [torch.ones_like(y) for y in ys])
    _, bwd = streams.block_streams(w, "online", 2)
    model = {s.name: s for s in bwd}["attention_norm.cat_grads"]
    assert log.nbytes() == tokens * model.bytes and len(log.kernels) == model.launches


# ---- step composition ---------------------------------------------------------------------
def test_step_parts_add_up_and_the_pipeline_bubble():
    args = layout.trained_shape("1B", "cola", "btp")
    one = TrainingLayout(strategy="btp", tp=2, seq_len=512, microbatches=4)
    stages = timing.stage_times(args, one, TOY)
    step = timing.step_time(args, one, TOY)
    assert sum(step[k] for k in timing.TIME_PARTS) == pytest.approx(step["step"])
    per_mb = sum(v for k, v in stages[0].items() if k != "comm_hidden")
    assert step["bubble"] == 0.0
    params = block.params_per_rank(args, one)
    # the compute copies: each weight cast once per step (read fp32, write bf16) and each
    # micro-batch's gradients cast back (read bf16, write fp32)
    casts = host.weight_casts(args, one)
    assert casts.bytes == (1 + 4) * (4 + 2) * params
    accumulate = costs.stream_time([Stream("acc", 3 * 3 * params * 2), casts], TOY)
    optimizer = params * (28 + 3 * 2) / 0.5e12 + 4e-6
    assert step["optimizer"] == pytest.approx(optimizer)
    # the optimizer's few launches hide behind its GPU time: the step's host share is the
    # micro-batches'
    assert step["host"] == pytest.approx(4 * stages[0]["host"])
    assert step["step"] == pytest.approx(4 * per_mb + accumulate + optimizer)
    # two stages, one micro-batch: the stages run one after the other, the faster one is bubble
    two = dataclasses.replace(one, pp=2, microbatches=1)
    stages = [
        sum(v for k, v in s.items() if k != "comm_hidden")
        for s in timing.stage_times(args, two, TOY)
    ]
    step = timing.step_time(args, two, TOY)
    assert step["bubble"] == pytest.approx(min(stages))
    casts = host.weight_casts(args, two)  # under PP FSDP2's: read fp32, write + copy bf16
    assert casts.bytes == (4 + 2 * 2 + 2 * 2) * block.params_per_rank(args, two)
    casts = costs.stream_time([casts], TOY)
    assert step["step"] - step["optimizer"] - casts == pytest.approx(sum(stages))
    # the first stage: half the blocks' exposed communication plus receiving the grads of its
    # output (btp sends its d/tp shard), over the network
    send = costs.send_time(two.tokens * args.dim // 2 * 2, TOY)
    one_block = timing.block_time(args, two, TOY)
    assert timing.stage_times(args, two, TOY)[0]["comm"] == pytest.approx(
        12 * one_block["comm"] + send
    )


def test_memory_kernels_add_up_to_the_blocks_memory_time():
    args, p = (
        layout.trained_shape("1B", "cola", "btp"),
        TrainingLayout(strategy="btp", tp=2, seq_len=512),
    )
    kernels = timing.memory_kernels(args, p, TOY)
    assert sum(kernels.values()) == pytest.approx(
        24 * 4 * timing.block_time(args, p, TOY)["memory"]
    )
    assert list(kernels.values()) == sorted(kernels.values(), reverse=True)


def test_tp_stays_inside_a_node():
    with pytest.raises(ConfigError, match="4 GPUs per node"):
        predict.evaluate(
            "7B",
            layout.trained_shape("7B", "cola", "btp"),
            TrainingLayout(strategy="btp", tp=8),
            ["a100-hgx4"],
        )


# ---- validation against the published measurements ----------------------------------------
def test_validation_within_tolerance_of_every_paper_row():
    """Both published speedups (BTP vs full-rank TP, BTP vs vanilla) of all four published
    configurations within +-15 %, except the documented KNOWN_GAPS, which must still be
    outside (so a fix retires them)."""
    rows = paper.validation_rows()
    assert [(r.flavor, r.tp, r.pp) for r in rows] == [
        (r.flavor, r.tp, r.pp) for r in paper.PAPER_ROWS
    ]
    for row in rows:
        for ratio, ok in paper.within_tolerance(row).items():
            assert ok != ((row.flavor, ratio) in paper.KNOWN_GAPS), (
                row.flavor,
                ratio,
                row.predicted_speedup,
            )
    assert rows[2].paper_speedup["btp_vs_vanilla"] == pytest.approx(1.64 / 0.72)
    # in each row's published batch layout the seconds themselves land within 25 %
    for row in rows:
        for strategy, seconds in row.paper_s.items():
            assert abs(row.predicted_s[strategy] / seconds - 1) <= 0.25, (row.flavor, strategy)


def test_ablations_against_the_published_ones():
    comm = {r.strategy: r for r in paper.comm_ablation()}
    for r in comm.values():
        assert abs(r.predicted_s / r.paper_s - 1) <= 0.20, r
        assert r.predicted_bytes == pytest.approx(r.paper_bytes, rel=1e-3), (
            r
        )  # + BTP's 2 statistics
    gemm = {(r.strategy, r.part): r.predicted_utilisation for r in paper.gemm_ablation()}
    for part in ("attention", "mlp"):
        assert gemm["vanilla", part] < gemm["btp", part]
    switches = paper.switch_rows()
    assert {r.switch for r in switches} == set(paper.SWITCHES)
    assert all(r.speedup > 1 for r in switches if r.switch.startswith("online"))


# ---- command line -------------------------------------------------------------------------
def test_cli_json(capsys):
    argv = [
        "model",
        "--flavor",
        "7B",
        "--strategy",
        "megatron,vanilla,btp",
        "--tp",
        "4",
        "--micro-batch",
        "4",
        "--json",
        "-",
    ]
    assert main(argv) == 0
    records = json.loads(capsys.readouterr().out)
    assert isinstance(records, list) and len(records) == 3
    assert {r["strategy"] for r in records} == set(STRATEGIES)
    assert records[0]["comm_bytes_per_layer_fwd"] == 2**28


def test_cli_breakdown_validate_plot_and_errors(capsys, tmp_path):
    assert main(["model", "--flavor", "1B,7B", "--tp", "2,4", "--gpu", "a100", "--breakdown"]) == 0
    out = capsys.readouterr().out
    assert "Predicted step split" in out and "bubble" in out and "hidden comm s" in out
    assert "rope" in out  # the largest memory-bound kernel of every strategy here
    assert main(["validate"]) == 0
    out = capsys.readouterr().out
    for title in (
        "13B TP4xPP2",
        "GEMM ablation",
        "Communication ablation",
        "online vs sync RMSNorm",
    ):
        assert title in out
    assert main(["validate", "--json", "-"]) == 0
    tables = {r["table"] for r in json.loads(capsys.readouterr().out)}
    assert tables == {"constant", "iteration", "gemm_ablation", "comm_ablation", "switch", "host"}
    png = tmp_path / "perf.png"
    assert main(["plot", "--out", str(png)]) == 0
    assert png.read_bytes()[:4] == b"\x89PNG"
    assert main(["model", "--flavor", "7B", "--tp", "3"]) == 2
    assert "not divisible by tp 3" in capsys.readouterr().err
    assert main(["model", "--flavor", "7B", "--tp", "8", "--gpu", "a100-hgx4"]) == 2
    assert "GPUs per node" in capsys.readouterr().err


def test_cli_dtype_takes_torchtitans_spelling(capsys):
    """--dtype float32 / bfloat16 (TorchTitan's names) are fp32 / bf16; others are refused."""
    runs = {}
    for dtype in ("fp32", "float32", "bf16", "bfloat16"):
        assert main(["model", "--flavor", "1B", "--dtype", dtype, "--json", "-"]) == 0
        runs[dtype] = json.loads(capsys.readouterr().out)
    assert runs["float32"] == runs["fp32"] != runs["bf16"] == runs["bfloat16"]
    assert {r["dtype"] for r in runs["bfloat16"]} == {"bf16"}
    with pytest.raises(SystemExit) as exit_info:
        main(["model", "--dtype", "float16"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1  # one line, no usage dump
    assert err.startswith(
        "error: argument --dtype: 'float16' is not one of bf16, fp32, bfloat16, float32"
    )


def test_overlap_chunks_pipeline_hand_computed():
    """k row blocks of a GEMM and its all-reduce form a two-stage pipeline: exposed =
    (k - 1)(max(g, a) - g) + a, with g = GEMM / k and a the all-reduce of T / k tokens."""
    gpu = gpu_profile("a100-hgx4")
    c = Collective("all_reduce", "o.A", 256)
    one = TrainingLayout(strategy="btp", tp=4, seq_len=4096, micro_batch=4)
    two = dataclasses.replace(one, overlap_chunks=2)
    full = costs.collective_time("all_reduce", c.bytes(one.tokens, 2), 4, gpu)
    half = costs.collective_time("all_reduce", c.bytes(one.tokens, 2) / 2, 4, gpu)
    assert timing.chunked_exposed(1.0, c, one, gpu) == full  # one block: all of it exposed
    assert timing.chunked_exposed(1.0, c, two, gpu) == pytest.approx(
        half
    )  # GEMM-bound: the last block
    assert timing.chunked_exposed(0.0, c, two, gpu) == pytest.approx(
        2 * half
    )  # nothing to hide behind
    g = half / 2  # each GEMM block hides half of an all-reduce block
    assert timing.chunked_exposed(2 * g, c, two, gpu) == pytest.approx(half - g + half)
    # the block model uses it for every forward all-reduce a GEMM produces
    args = layout.trained_shape("7B", "cola", "btp")
    steps = [
        timing.block_time(args, dataclasses.replace(one, overlap_chunks=k), gpu)["comm"]
        for k in (1, 2)
    ]
    assert steps[1] < steps[0]


# ---- precision: float8, and what a job's TOML trains in ------------------------------------
H100 = GPUS["h100"]


def _fp8_delta(g: Gemm, gemms: int) -> float:
    """Seconds float8 saves on the first `gemms` of g's forward, input-grad, weight-grad GEMMs."""
    trio = (g, *g.backward())[:gemms]
    return sum(
        costs.gemm_time(x, "fp8", 2, H100) - costs.gemm_time(x, "bf16", 2, H100) for x in trio
    )


@pytest.mark.parametrize("recipe, gemms", [("tensorwise", 3), ("rowwise_with_gw_hp", 2)])
def test_float8_reprices_only_the_selected_gemms(recipe, gemms):
    """Selecting one GEMM moves the block's GEMM time by exactly that GEMM's float8 saving
    (its weight grad stays bf16 under rowwise_with_gw_hp) and its memory-bound time by its
    casts; nothing else changes."""
    args = layout.trained_shape("7B", "cola", "btp")
    plan = TrainingLayout(strategy="btp", tp=4, float8=recipe)
    base = timing.block_time(args, plan, H100)
    assert base == timing.block_time(args, dataclasses.replace(plan, float8=None), H100)
    g = {g.name: g for g in block.layer_gemms(args, plan)}["gate_up.A"]
    one = timing.block_time(args, plan, H100, frozenset({g.name}))
    assert one["gemm"] - base["gemm"] == pytest.approx(_fp8_delta(g, gemms))
    assert one["gemm"] < base["gemm"]
    fwd, bwd = float8_costs.cast_streams(g, recipe, "eager", 2)
    assert one["memory"] - base["memory"] == pytest.approx(costs.stream_time(fwd + bwd, H100))
    # forward x and W, input grad dY and W (+ weight grad dY and x), 33 bytes per element each
    x, w, dy = g.m * g.k, g.n * g.k, g.m * g.n
    casts = (x, w, dy, w) + (dy, x) * (gemms == 3)
    assert sum(s.bytes for s in fwd + bwd) == 33 * sum(casts)
    assert {k: one[k] for k in ("attention", "comm", "comm_hidden")} == {
        k: base[k] for k in ("attention", "comm", "comm_hidden")
    }


def test_float8_selection_is_the_runtimes():
    """Each per-rank GEMM is judged by `parallelize.float8` on the module FQNs of the real
    model; at TP1 (one GEMM per module) every GEMM's [N, K] is its module's weight shape."""
    from boost_titan.boost_llama import BoostTransformer
    from boost_titan.parallelize.float8 import gemm_skip_reason, group_skip_reason

    args = layout.trained_shape("1B", "cola", "btp")
    with torch.device("meta"):
        model = BoostTransformer(args)
    modules = dict(model.named_modules())
    tp1 = TrainingLayout(strategy="btp", tp=1, float8="tensorwise")
    for g in block.layer_gemms(args, tp1):
        base, _, factor = g.name.partition(".")
        (fqn,) = float8_costs.module_fqns(3, (base,), factor)
        assert tuple(modules[fqn].weight.shape) == (g.n, g.k), g.name
    for filters in (("auto_filter_small_kn",), ("layers.1.",)):
        plan = dataclasses.replace(tp1, tp=4, float8_filter=filters)
        for layer in (0, 1):
            reasons = float8_costs.float8_selection(args, plan, layer)
            assert set(reasons) == {g.name for g in block.layer_gemms(args, plan)}
            for g in block.layer_gemms(args, plan):
                base, _, factor = g.name.partition(".")
                fqns = float8_costs.module_fqns(
                    layer, block.GROUP_MEMBERS.get(base, (base,)), factor
                )
                judge = (
                    group_skip_reason(g.n, g.k, fqns, "tensorwise", list(filters))
                    if len(fqns) > 1
                    else gemm_skip_reason(g.n, g.k, fqns[0], "tensorwise", list(filters))
                )
                assert reasons[g.name] == judge, (filters, layer, g.name)
    assert all(float8_costs.float8_selection(args, plan, 1).values())  # layers.1. is filtered whole
    first = float8_costs.float8_selection(args, plan, 0)  # d_ff / 4 = 1368 is no multiple of 16
    assert {name for name, why in first.items() if why} == {"gate.B", "up.B", "down.A"}
    record = predict.evaluate("1B", args, plan, ["h100"])
    assert record.float8_gemms == {"float8": 23 * (len(first) - 3), "total": 24 * len(first)}


def test_float8_cast_traffic_measured_on_the_product():
    """`kernels/float8.py`'s three GEMMs in each recipe and dtype: two casts per float8
    GEMM, each `streams.FLOAT8_CAST` bytes per element and launches (+ the power-of-two
    rounding of the rowwise recipes), counted from their aten ops (scales left out)."""
    from boost_titan.kernels import float8 as k8

    m, k, n = 96, 64, 48
    for dtype in (torch.bfloat16, torch.float32):
        b = torch.tensor([], dtype=dtype).element_size()
        x, w, dy = (torch.randn(*shape, dtype=dtype) for shape in ((m, k), (n, k), (m, n)))
        for recipe in k8.RECIPES:
            f8 = k8.float8_recipe(recipe)
            gemms, pow2 = float8_costs.recipe_shape(recipe)
            launches = streams.FLOAT8_CAST.launches(b) + streams.FLOAT8_POW2_KERNELS * pow2
            gemm_runs = (
                (functools.partial(k8.forward, x, w, f8), m * k + n * k),
                (functools.partial(k8.input_grad, dy, w, f8), m * n + n * k),
                (functools.partial(k8.weight_grad, dy, x, f8), m * n + m * k),
            )
            for i, (run, operands) in enumerate(gemm_runs):
                with _KernelLog() as log:
                    run()
                casts = [kernel for kernel in log.kernels if kernel[0] != "mm"]
                in_float8 = i < gemms
                cast_bytes = sum(
                    nb for _, tensors in casts for numel, nb in tensors if numel >= 1024
                )
                expected = in_float8 * operands * streams.FLOAT8_CAST.bytes(b)
                assert cast_bytes == expected, (dtype, recipe, i)
                assert len(casts) == in_float8 * 2 * launches, (dtype, recipe, i)


def test_fp32_bf16_float8_ordering():
    """GEMM rates: fp32 < bf16 < float8 (with 1-byte operands on the roofline); steps:
    fp32 > bf16 everywhere; float8 beats bf16 where GEMMs dominate (full-rank 13B, micro-batch
    4) and loses on the low-rank 7B TP4, whose GEMMs are a quarter of the step."""
    g = Gemm("g", 8192, 8192, 8192)
    fp32, bf16, fp8 = (
        costs.gemm_time(g, d, b, H100) for d, b in (("fp32", 4), ("bf16", 2), ("fp8", 2))
    )
    assert fp32 > bf16 > fp8 and bf16 / fp8 == pytest.approx(2, rel=0.02)
    slow = dataclasses.replace(
        TOY, name="toy, slow HBM", hbm_bw=1e9, peak_flops={**TOY.peak_flops, "fp8": 2e12}
    )
    tiny = Gemm("tiny", 16, 16, 16)
    assert costs.gemm_time(tiny, "fp8", 2, slow) == pytest.approx(tiny.bytes(2, 1) / 0.5e9 + 1e-6)

    def step(flavor: str, strategy: str, **kw) -> float:  # the GPU's work: the dtypes' cost
        plan = TrainingLayout(strategy=strategy, tp=4, **kw)
        args = layout.trained_shape(flavor, "cola", strategy)
        record = predict.evaluate(flavor, args, plan, ["h100"], gpu_work_only=True)
        return record.predicted_step_s["h100"]

    fused = {"float8": "tensorwise", "float8_casts": "fused"}
    full = [step("13B", "megatron", micro_batch=4, **kw) for kw in ({"dtype": "fp32"}, {}, fused)]
    assert full[0] > full[1] > full[2]
    low = [
        step("7B", "btp", **kw) for kw in ({"dtype": "fp32"}, {}, fused, {"float8": "tensorwise"})
    ]
    assert low[0] > low[3] > low[2] > low[1]


def _job(tmp_path, text: str, base: str = "7B") -> str:
    """train_configs/<base>.toml with `text` appended to its sections (TOML allows a
    section's keys only once, so each override replaces the line it names)."""
    lines = (ROOT / "train_configs" / f"{base}.toml").read_text().splitlines()
    for override in text.strip().splitlines():
        section, _, assignment = override.partition(" ")
        key = assignment.split("=")[0].strip()
        start = lines.index(f"[{section}]") if f"[{section}]" in lines else None
        if start is None:
            lines += [f"[{section}]", assignment]
            continue
        end = next(
            (i for i in range(start + 1, len(lines)) if lines[i].startswith("[")), len(lines)
        )
        kept = [line for line in lines[start + 1 : end] if line.split("=")[0].strip() != key]
        lines[start + 1 : end] = [assignment, *kept]
    path = tmp_path / "job.toml"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_job_toml_is_priced_in_the_runs_precision(tmp_path, capsys):
    """A job's TOML gives the plan the trainer runs: its layout and batch, fp32 when
    mixed_precision_param is float32, bf16 weights without master copy with training.dtype
    bfloat16, float8 from model.converters (casts fused when the model is compiled)."""
    from boost_titan.perf.job_plan import job_plan

    default = job_plan(str(ROOT / "train_configs" / "7B.toml"), 4).plan
    compiled = {"compiled": True, "float8_casts": "fused"}  # [compile] enable
    assert default == TrainingLayout(
        strategy="btp", tp=4, seq_len=4096, micro_batch=4, microbatches=1, **compiled
    )
    fp32 = job_plan(_job(tmp_path, 'training mixed_precision_param = "float32"'), 4).plan
    assert fp32 == dataclasses.replace(default, dtype="fp32")
    assert (
        main(
            [
                "model",
                "--config",
                _job(tmp_path, 'training mixed_precision_param = "float32"'),
                "--nproc",
                "4",
                "--gpu",
                "a100-hgx4",
                "--json",
                "-",
            ]
        )
        == 0
    )
    step = json.loads(capsys.readouterr().out)[0]["predicted_step_s"]["a100-hgx4"]
    job = job_plan(_job(tmp_path, 'training mixed_precision_param = "float32"'), 4)
    assert step == timing.step_time(job.args, fp32, gpu_profile("a100-hgx4"))["step"]
    pure = job_plan(_job(tmp_path, 'training dtype = "bfloat16"'), 4).plan
    assert pure == dataclasses.replace(default, master_weights=False)
    f8 = job_plan(
        _job(
            tmp_path,
            'model converters = ["quantize.linear.float8"]\n'
            'quantize.linear.float8 filter_fqns = ["output"]\n'
            "compile enable = true",
        ),
        4,
    ).plan
    assert f8 == dataclasses.replace(
        default,
        float8="tensorwise",
        float8_filter=("output",),
        float8_casts="fused",
        compiled=True,
    )
    pp = job_plan(str(ROOT / "train_configs" / "13B.toml")).plan
    assert (pp.tp, pp.pp, pp.micro_batch, pp.microbatches) == (4, 2, 2, 2)
    assert main(["model", "--config", str(ROOT / "train_configs" / "7B.toml"), "--nproc", "8"]) == 0
    out, err = capsys.readouterr()
    assert "8 processes (dp_shard 2 x tp 4)" in out
    assert err.startswith("notice:") and err.count("\n") == 1


def test_job_precision_agrees_with_the_trainers():
    """The model's (dtype, master weights) for every [training] combination is what
    `config.precision.Precision` makes the trainer run (and says it runs)."""
    from types import SimpleNamespace

    from boost_titan.config.precision import Precision
    from boost_titan.perf.job_plan import _precision

    for weights in ("float32", "bfloat16"):
        for compute in ("float32", "bfloat16"):
            training = SimpleNamespace(
                dtype=weights, mixed_precision_param=compute, mixed_precision_reduce="float32"
            )
            precision = Precision.of(training)
            dtype, master = _precision(SimpleNamespace(training=training), False, "job.toml")
            state = TrainingLayout(strategy="btp", dtype=dtype, master_weights=master).state
            expected = (
                "bf16"
                if precision.casts_for_compute
                else BF16_WEIGHTS
                if precision.weights == "bfloat16"
                else "fp32"
            )
            said = precision.describe(fsdp=False)
            assert state == expected and (dtype == "bf16") == ("bf16" in said), said


def test_torchtitan_defaults_are_torchtitans():
    from torchtitan.config import JobConfig

    from boost_titan.perf.job_plan import TITAN_DEFAULTS

    titan = JobConfig()
    for section, defaults in TITAN_DEFAULTS.items():
        table = titan
        for part in section.split("."):
            table = getattr(table, part)
        assert {key: getattr(table, key) for key in defaults} == defaults, section


FLOAT8_ON = 'model converters = ["quantize.linear.float8"]'
BAD_JOBS = {
    "training mixed_precision_param = 16": "must be of type str",
    'training mixed_precision_param = "float16"': "is not modelled",
    'model converters = ["quantize.linear.mx"]': "is not modelled",
    FLOAT8_ON + "\nquantize.linear.float8 emulate = true": "drop emulate",
    FLOAT8_ON + '\nquantize.linear.float8 recipe_name = "blockwise"': "unknown float8 recipe",
    FLOAT8_ON: "no float8 tensor cores",
    "parallelism tensor_parallel_degree = 3": "not divisible by tp 3",
    "parallelism context_parallel_degree = 3": "not divisible by 2 x cp 3",
    "parallelism pipeline_parallel_degree = 2\n"
    'parallelism pipeline_parallel_schedule = "GPipe"': "GPipe",
    'activation_checkpoint mode = "selective"\n'
    'activation_checkpoint selective_ac_option = "op"': "selective_ac_option",
    "training local_batch_size = 0": "local_batch_size 0 must be >= 1",
    'model name = "llama3"': "model.name",
}


@pytest.mark.parametrize("override", BAD_JOBS)
def test_job_bad_input_is_one_line(tmp_path, capsys, override):
    gpu = "a100,h100" if "no float8 tensor cores" in BAD_JOBS[override] else "h100"
    assert main(["model", "--config", _job(tmp_path, override), "--gpu", gpu]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and BAD_JOBS[override] in err, err


def test_cli_bad_precision_options_are_one_line(capsys):
    for argv, message in (
        (["--config", "no/such.toml"], "not found"),
        (["--config", "train_configs/7B.toml", "--tp", "2"], "--tp is set by --config"),
        (["--nproc", "4"], "--nproc needs --config"),
        (["--float8", "tensorwise", "--gpu", "a100"], "no float8 tensor cores"),
    ):
        assert main(["model", *argv]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and err.count("\n") == 1 and message in err, err


def test_weight_launches_of_each_path():
    """Per micro-batch, by phase: the compute copies cast each weight once per step (in its
    block's first forward) and, in every backward, cast each gradient back and add it from
    the second micro-batch on; FSDP2's kept path (PP) casts and copies once per step and
    adds each gradient; 18fc3d3 cast and copied twice per micro-batch."""
    from boost_titan.perf import host

    copies = host.weight_launches(18, 3, 24, 4, "copies")
    assert (copies.block_forward, copies.block_backward) == (18 / 4, 18 * 1.75)
    assert copies.ends == 3 / 4 + 3 * 1.75
    fsdp = host.weight_launches(18, 3, 24, 4, "product")
    assert (fsdp.block_forward, fsdp.block_backward) == (2 * 18 / 4, 18 + 2 / 4)
    legacy = host.weight_launches(18, 3, 24, 4, "legacy")
    assert legacy.block_forward == 2 * 18
    one = host.weight_launches(18, 3, 24, 1, "copies")  # no accumulation: a cast each
    assert (one.block_forward, one.block_backward) == (18, 18)
    plan = TrainingLayout(strategy="btp", tp=2)
    assert host.launch_kind(plan) == "copies"
    assert host.launch_kind(dataclasses.replace(plan, pp=2)) == "product"
    assert host.launch_kind(dataclasses.replace(plan, cuda_graphs=True)) == "graphs"
