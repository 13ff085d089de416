"""Low-rank activation checkpointing: exact gradients, no replayed collectives, and the
measured saved-activation bytes and recompute FLOPs."""

from __future__ import annotations

import contextlib
import json
import types

import pytest
import torch
import torch.nn.functional as F
from distributed import randomize, run_on_ranks
from torch import nn
from torchtitan.config.job_config import ActivationCheckpoint, Compile, Training

from boost_titan.activation_memory import main, measure_layer
from boost_titan.boost_llama import BoostTransformer, flavor_args
from boost_titan.boost_llama.parallelize import parallelize_boost
from boost_titan.config import Boost
from boost_titan.parallelize.lowrank_ac import apply_lowrank_ac, lowrank_checkpoint
from boost_titan.runtime.saved_activations import (
    PeakSavedActivations,
    saved_activation_bytes,
)

VOCAB, BATCH, SEQ = 64, 2, 16
ARCHS = {
    "cola": {"arch": "cola"},
    "svd": {"arch": "svd"},
    "lax": {"arch": "lax"},
    "lax-svd": {"arch": "lax", "lax_base": "svd"},
}


def build(arch: str = "cola", *, n_layers: int = 3, **kw) -> BoostTransformer:
    """A small model with GQA (8 heads, 4 kv heads) and every parameter random."""
    torch.manual_seed(0)
    args = flavor_args(
        "debug",
        vocab_size=VOCAB,
        arch=arch,
        dim=64,
        n_heads=8,
        n_kv_heads=4,
        ffn_dim=128,
        n_layers=n_layers,
        **kw,
    )
    model = BoostTransformer(args)
    model.init_weights()
    randomize(model)
    return model


def batch(seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(seed)
    return torch.randint(0, VOCAB, (BATCH, SEQ)), torch.randint(0, VOCAB, (BATCH, SEQ))


def loss_of(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(0, 1))


def grads(model: nn.Module) -> dict[str, torch.Tensor]:
    """Full gradients by the unwrapped parameter name (AC and compile add prefixes)."""
    out = {}
    for name, p in model.named_parameters():
        if p.grad is None:
            continue
        g = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
        name = name.replace("_checkpoint_wrapped_module.", "").replace("_orig_mod.", "")
        out[name] = g.detach().clone()
    return out


def assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], rtol: float = 1e-6):
    assert a.keys() == b.keys()
    for name in a:
        scale = a[name].abs().max().clamp_min(1e-30)
        assert ((a[name] - b[name]).abs().max() / scale).item() <= rtol, name


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
            (lambda: lowrank_checkpoint(block, x, h, widths=frozenset()))
            if ac
            else (lambda: block(x, h))
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
    )
    dims = types.SimpleNamespace(
        tp_enabled=False, fsdp_enabled=False, dp_replicate_enabled=False, tp=1
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
    from boost_titan.bench import perfmodel as pm

    # attention and every up-projection but B_down, whose output only feeds the residual
    # add that leaves the block
    shape = pm.model_args("1B", "cola", "btp")
    gemms = {
        g.name: g.flops for g in pm.layer_gemms(shape, pm.Plan(strategy="btp", tp=4, seq_len=2048))
    }
    ups = sum(f for name, f in gemms.items() if name.endswith(".B") and name != "down.B")
    assert recompute["lowrank"] == ups + pm.attention_flops(
        shape, pm.Plan(strategy="btp", tp=4, seq_len=2048)
    )
    # the performance model's accounting is this measurement's, to the byte
    for mode in modes:
        plan = pm.Plan(strategy="btp", tp=4, seq_len=2048, ac=mode)
        assert m[mode].saved_bytes == pm.activation_bytes(shape, plan), mode


def test_cli_rejects_bad_tp(capsys):
    assert main(["--flavor", "1B", "--tp", "3"]) == 2
    assert "does not divide" in capsys.readouterr().err


# ---- tensor parallel on gloo ranks ------------------------------------------------------
TP_CASES = [
    ("cola", "btp", {}),
    ("svd", "btp", {}),
    ("lax", "btp", {}),
    ("cola-sync", "btp", {"plan": {"rmsnorm": "sync"}}),
    ("cola-ungrouped", "btp", {"plan": {"group_linears": False}}),
    ("cola-vanilla", "vanilla", {}),
    ("lax-vanilla", "vanilla", {}),
]


def _parallelize_compiled(model, mesh, ac: str) -> None:
    """The trainer's path: TP, then AC, then torch.compile per block (fullgraph: no graph
    break), as `parallelize_boost` applies them for `[compile] enable = true`."""
    modes = {"lowrank": ("none", "op"), "selective": ("selective", "op"), "full": ("full", "op")}
    mode, option = modes[ac]
    job = types.SimpleNamespace(
        boost=Boost(arch="cola", lowrank_ac=ac == "lowrank"),
        parallelism=types.SimpleNamespace(disable_loss_parallel=False),
        activation_checkpoint=ActivationCheckpoint(mode=mode, selective_ac_option=option),
        compile=Compile(enable=True, backend="aot_eager"),
        job=types.SimpleNamespace(dump_folder=""),
        training=Training(mixed_precision_param="float32"),
    )
    dims = types.SimpleNamespace(
        tp_enabled=True,
        tp=mesh.size(),
        world_size=mesh.size(),
        get_mesh=lambda name: mesh,
        get_all_one_dimensional_meshes=lambda: {"tp": mesh},
        fsdp_enabled=False,
        dp_replicate_enabled=False,
    )
    parallelize_boost(model, dims, job)


def _tp_step(model, mesh, strategy, plan_kw, lowrank_ac, fsdp_mesh=None, compiled_ac=None):
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.debug import CommDebugMode
    from torch.distributed.tensor.parallel import loss_parallel

    from boost_titan.boost_llama.strategies import build_plan
    from boost_titan.parallelize import apply_plan

    if compiled_ac:
        _parallelize_compiled(model, mesh, compiled_ac)
    else:
        apply_plan(model, mesh, build_plan(strategy, model.args, **plan_kw))
    if lowrank_ac and not compiled_ac:
        apply_lowrank_ac(model, rank=model.args.effective_rank, tp_degree=mesh.size())
    if fsdp_mesh is not None:
        from torch.distributed.fsdp import FSDPModule, fully_shard

        for block in model.layers.values():
            fully_shard(block, mesh=fsdp_mesh)
        fully_shard(model, mesh=fsdp_mesh)
        for module in model.modules():
            if isinstance(module, FSDPModule):
                module.set_force_sum_reduction_for_comms(True)
    tokens, labels = batch()
    # one CommDebugMode over both passes: its module tracker must see the forward of the
    # blocks that backward recomputes (its module hooks would break a fullgraph compile)
    counting = contextlib.nullcontext(None) if compiled_ac else CommDebugMode()
    with counting as comm, loss_parallel():
        if comm is None:
            loss = loss_of(model(tokens), labels)
            loss.backward()
            return loss.full_tensor().item(), grads(model), None
        loss = loss_of(model(tokens), labels)
        forward = {str(k): v for k, v in comm.get_comm_counts().items()}
        loss.backward()
        total = {str(k): v for k, v in comm.get_comm_counts().items()}
    backward = {k: v - forward.get(k, 0) for k, v in total.items() if v - forward.get(k, 0)}
    loss = loss.full_tensor() if isinstance(loss, DTensor) else loss
    return loss.item(), grads(model), (forward, backward)


def _tp_worker(rank: int, world_size: int, cases, fsdp: bool):
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (world_size,))
    out = {}
    for name, strategy, kw in cases:
        arch = name.split("-")[0]
        out[name] = [
            _tp_step(build(arch), mesh, strategy, kw.get("plan", {}), ac) for ac in (False, True)
        ]
    if world_size == 2:  # torch.compile over the checkpointed blocks, vs eager without AC
        for ac in ("lowrank", "selective", "full"):  # layer-selective wraps blocks as full does
            out[f"cola-compiled-{ac}"] = [
                out["cola"][0],
                _tp_step(build("cola"), mesh, "btp", {}, True, compiled_ac=ac),
            ]
    if fsdp:  # dp_shard 2 x tp 2
        mesh2d = init_device_mesh("cpu", (2, world_size // 2), mesh_dim_names=("dp", "tp"))
        out["cola-fsdp"] = [
            _tp_step(build("cola"), mesh2d["tp"], "btp", {}, ac, mesh2d["dp"])
            for ac in (False, True)
        ]
    return out


@pytest.mark.slow
@pytest.mark.parametrize("world_size", [2, 4])
def test_tp_identical_and_no_replayed_collectives(world_size):
    # TP 2 runs every case; TP 4 the btp archs plus FSDP2 (dp_shard 2 x tp 2)
    cases = TP_CASES if world_size == 2 else TP_CASES[:3]
    results = run_on_ranks(_tp_worker, world_size, cases=cases, fsdp=world_size == 4)
    for rank_result in results:
        for name, (off, on) in rank_result.items():
            rtol = 1e-5 if "compiled" in name else 1e-6
            assert abs(off[0] - on[0]) <= rtol * abs(off[0]), name
            assert_same(off[1], on[1], rtol=rtol)
            if on[2] is not None:
                assert on[2] == off[2], f"{name}: collectives {on[2]} with AC, {off[2]} without"
    assert ("cola-fsdp" in results[0]) == (world_size == 4)
    assert ("cola-compiled-lowrank" in results[0]) == (world_size == 2)
