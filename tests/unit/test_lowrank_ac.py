"""Low-rank activation checkpointing: exact gradients, no replayed collectives, and the
measured saved-activation bytes and recompute FLOPs."""

from __future__ import annotations

import functools
import json
import types

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torchtitan.config.job_config import ActivationCheckpoint, Compile, Job, Training

from boost_titan.activation_memory import main
from boost_titan.bench.measure.activations import measure_layer
from boost_titan.boost_llama import flavor_args
from boost_titan.boost_llama.parallelize import parallelize_boost
from boost_titan.config import Boost
from boost_titan.parallelize.lowrank_ac import apply_lowrank_ac, lowrank_checkpoint
from boost_titan.runtime.saved_activations import (
    PeakSavedActivations,
    saved_activation_bytes,
)
from tests.helpers.lowrank_ac import BATCH, SEQ, assert_same, batch, build, grads, loss_of

ARCHS = {
    "cola": {"arch": "cola"},
    "svd": {"arch": "svd"},
    "lax": {"arch": "lax"},
    "lax-svd": {"arch": "lax", "lax_base": "svd"},
}


# ---- single process -----------------------------------------------------------------
@pytest.mark.parametrize("case", ARCHS)
def test_tp1_loss_and_grads_identical(case):
    results = []
    for ac in (False, True):
        model = build(**ARCHS[case])
        if ac:
            apply_lowrank_ac(model, rank=model.args.effective_rank, tp_degree=1)
        tokens, labels = batch()
        loss = loss_of(model(tokens), labels)
        loss.backward()
        results.append((loss.item(), grads(model)))
    assert results[0][0] == results[1][0]
    assert_same(results[0][1], results[1][1], rtol=0.0)


def test_microbatches_in_flight_like_pipeline_stages():
    """Two micro-batches forward before either backward (as a PP schedule runs a stage),
    LaX latents crossing the stage boundary as inputs that need grads."""
    results = []
    for ac in (False, True):
        model = build("lax", n_layers=3)
        if ac:
            apply_lowrank_ac(model, rank=model.args.effective_rank, tp_degree=1)
        stage = model.layers["1"], model.layers["2"]
        losses = []
        for seed in (1, 2):
            torch.manual_seed(seed)
            h = torch.randn(BATCH, SEQ, 64, requires_grad=True)
            latents = tuple(torch.randn(BATCH, SEQ, 16, requires_grad=True) for _ in range(7))
            for block in stage:
                h, latents = block(h, model.rope, latents)
            losses.append(h.square().mean() + sum(t.square().mean() for t in latents))
        for loss in reversed(losses):
            loss.backward()
        results.append(grads(model))
    assert_same(results[0], results[1], rtol=0.0)


def test_torch_compile_keeps_gradients():
    results = []
    for ac in (False, True):
        model = build("cola")
        if ac:
            apply_lowrank_ac(model, rank=model.args.effective_rank, tp_degree=1)
            for layer_id, block in model.layers.named_children():
                compiled = torch.compile(block, backend="aot_eager", fullgraph=True)
                model.layers.register_module(layer_id, compiled)
        tokens, labels = batch()
        loss_of(model(tokens), labels).backward()
        results.append(grads(model))
    assert_same(results[0], results[1])


class _LinearSavingAfter(torch.autograd.Function):
    """A linear that saves its input after its GEMM, as the column-parallel Functions do."""

    @staticmethod
    def forward(ctx, x, w):
        out = F.linear(x, w)
        ctx.save_for_backward(x, w)
        return out

    @staticmethod
    def backward(ctx, grad):
        x, w = ctx.saved_tensors
        return grad @ w, grad.flatten(0, -2).t() @ x.flatten(0, -2)


class _ResidualTail(nn.Module):
    """relu(x W1^T) W2^T + h: the last up-projection feeding a residual add; with
    `reread`, the block also reads the sum (so its GEMM must be recomputed)."""

    def __init__(self, reread: bool) -> None:
        super().__init__()
        self.reread = reread
        self.w1, self.w2 = (nn.Parameter(torch.randn(16, 16) / 4) for _ in range(2))

    def forward(self, x, h):
        out = h + _LinearSavingAfter.apply(torch.relu(F.linear(x, self.w1)), self.w2)
        return (out, out.square()) if self.reread else out


@pytest.mark.parametrize("reread", [False, True])
def test_last_gemm_into_a_residual_add_is_not_recomputed(reread):
    """A GEMM whose output only feeds a residual add that leaves the block unread gets a
    placeholder (one GEMM fewer in backward); if the block reads the sum, it is recomputed
    and the gradients stay exact."""
    from torch.utils.flop_counter import FlopCounterMode

    results, flops = [], []
    for ac in (False, True):
        torch.manual_seed(0)
        block = _ResidualTail(reread)
        x, h = torch.randn(2, 8, 16, requires_grad=True), torch.randn(2, 8, 16, requires_grad=True)
        run = (
            functools.partial(lowrank_checkpoint, block, x, h, widths=frozenset())
            if ac
            else functools.partial(block, x, h)
        )
        with FlopCounterMode(display=False):  # the forward under the same mode as backward
            out = run()
        loss = sum(t.sin().sum() for t in out) if reread else out.sin().sum()
        with FlopCounterMode(display=False) as counter:
            loss.backward()
        flops.append(counter.get_total_flops())
        results.append(
            {"x": x.grad, "h": h.grad, **{n: p.grad for n, p in block.named_parameters()}}
        )
    assert_same(results[0], results[1], rtol=0.0)
    gemm = 2 * 2 * 8 * 16 * 16
    assert flops[1] - flops[0] == (
        2 * gemm if reread else gemm
    )  # recomputed: relu(x W1), +W2 if read


def test_parallelize_boost_applies_lowrank_ac():
    model = build("cola")
    job = types.SimpleNamespace(
        boost=Boost(arch="cola", lowrank_ac=True),
        activation_checkpoint=ActivationCheckpoint(mode="none"),
        compile=Compile(),
        training=Training(mixed_precision_param="float32"),
        job=Job(),
    )
    dims = types.SimpleNamespace(
        tp_enabled=False, cp_enabled=False, fsdp_enabled=False, dp_replicate_enabled=False, tp=1
    )
    parallelize_boost(model, dims, job)
    wrapped = [type(b).__name__ for b in model.layers.values()]
    assert wrapped == ["CheckpointWrapper"] * len(model.layers)
    assert "layers.0.attention.wq.down.weight" in model.state_dict()


def test_saved_activation_bytes_counts_each_storage_once():
    linear = nn.Linear(8, 8, bias=False)
    x = torch.randn(4, 8, requires_grad=True)

    def forward():
        y = linear(x)  # saves x (128 B) and the weight (excluded)
        return y.sin() * y.view(32).view(4, 8).cos()  # y saved twice, through views: 128 B

    assert saved_activation_bytes(forward, exclude=linear) == 128 + 128 + 2 * 128  # + sin, cos
    assert saved_activation_bytes(lambda: x * 2.0) == 0  # nothing saved, output not counted


@pytest.mark.parametrize("ac", [False, True])
def test_peak_saved_activations_of_training_forwards(ac):
    """The trainer's step counter agrees with saved_activation_bytes on one forward and
    follows forwards and backwards interleaved as in a pipeline schedule."""
    model = build("cola")
    if ac:
        apply_lowrank_ac(model, rank=model.args.effective_rank, tp_degree=1)
    (tokens, labels), (other, _) = batch(1), batch(2)
    one = saved_activation_bytes(lambda: model(tokens), exclude=model)

    def peak(*schedule: str) -> int:
        counter = PeakSavedActivations([model])
        with counter.watching():
            pending = []
            for op in schedule:  # "F": forward a micro-batch, "B": backward the oldest
                if op == "F":
                    micro = other if len(pending) % 2 else tokens  # the embedding saves it
                    pending.append(loss_of(model(micro), labels))
                else:
                    pending.pop(0).backward()
            with torch.no_grad():
                model(tokens)  # not a training forward: ignored
        assert "forward" not in model.__dict__
        return counter.peak

    assert one > 0
    assert peak("F", "B") == peak("F", "B", "F", "B") == one
    assert peak("F", "F", "B", "B") == 2 * one


@pytest.mark.parametrize("tp", [1, 2])
def test_fake_measurement_matches_real_tensors(tp):
    args = flavor_args("debug", arch="lax", dim=64, n_heads=4, ffn_dim=96, vocab_size=64)
    for mode in ("none", "full", "selective", "lowrank"):
        fake = measure_layer(args, mode, seq_len=32, batch=2, tp=tp)
        real = measure_layer(args, mode, seq_len=32, batch=2, tp=tp, fake=False)
        assert fake == real, mode


def test_cli_1b_layer_tp1(capsys):
    """1B layer, seq 2048, micro-batch 1: low-rank AC keeps x + 7r per token."""
    assert main(["--flavor", "1B", "--seq-len", "2048", "--json"]) == 0
    rows = {r["mode"]: r for r in json.loads(capsys.readouterr().out)["layers"]}
    d, r, bf16 = 2048, 512, 2
    assert rows["lowrank"]["bytes_per_token"] == (d + 7 * r) * bf16
    assert rows["full"]["bytes_per_token"] == d * bf16
    assert rows["lowrank"]["saved_vs_none"] <= 0.45
    assert rows["lowrank"]["recompute_flops"] < 0.7 * rows["full"]["recompute_flops"]
    assert rows["selective"]["saved_bytes"] > rows["lowrank"]["saved_bytes"]


def test_1b_layer_tp4_btp_comm_free():
    """Under BTP, rank 0 of 4 keeps x/4 + the all-reduced [3r+1], [r], [2r+1], [r]."""
    args = flavor_args("1B", arch="cola")
    modes = ("none", "full", "lowrank")
    m = {mode: measure_layer(args, mode, seq_len=2048, tp=4) for mode in modes}
    d, r, tokens = 2048, 512, 2048
    assert m["lowrank"].saved_bytes == (d // 4 + 7 * r + 2) * 2 * tokens
    assert m["lowrank"].saved_bytes <= 0.45 * m["none"].saved_bytes
    assert m["lowrank"].backward_collectives == m["none"].backward_collectives == {"all_reduce": 4}
    assert m["full"].backward_collectives == {"all_reduce": 8}  # full AC replays them
    recompute = {k: v.backward_flops - m["none"].backward_flops for k, v in m.items()}
    assert recompute["lowrank"] < 0.7 * recompute["full"]
    from boost_titan.perf import activations, block, layout
    from boost_titan.perf.layout import TrainingLayout

    # attention and every up-projection but B_down, whose output only feeds the residual
    # add that leaves the block
    shape = layout.trained_shape("1B", "cola", "btp")
    gemms = {
        g.name: g.flops
        for g in block.layer_gemms(shape, TrainingLayout(strategy="btp", tp=4, seq_len=2048))
    }
    ups = sum(f for name, f in gemms.items() if name.endswith(".B") and name != "down.B")
    assert recompute["lowrank"] == ups + block.attention_flops(
        shape, TrainingLayout(strategy="btp", tp=4, seq_len=2048)
    )
    # the performance model's accounting is this measurement's, to the byte
    for mode in modes:
        plan = TrainingLayout(strategy="btp", tp=4, seq_len=2048, ac=mode)
        assert m[mode].saved_bytes == activations.activation_bytes(shape, plan), mode


def test_cli_rejects_bad_tp(capsys):
    assert main(["--flavor", "1B", "--tp", "3"]) == 2
    assert "does not divide" in capsys.readouterr().err
