"""Low-rank activation checkpointing under tensor parallelism on gloo ranks: loss and every
gradient identical with and without it, and no collective replayed in backward (eager,
torch.compile and FSDP2). `tests/unit/test_lowrank_ac.py`: the one-process tests."""

from __future__ import annotations

import contextlib
import types

import pytest
from torchtitan.config.job_config import ActivationCheckpoint, Compile, Training

from boost_titan.boost_llama.parallelize import parallelize_boost
from boost_titan.config import Boost
from boost_titan.parallelize.lowrank_ac import apply_lowrank_ac
from tests.helpers.distributed import run_on_ranks
from tests.helpers.lowrank_ac import assert_same, batch, build, grads, loss_of

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
        cp_enabled=False,
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
