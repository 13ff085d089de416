"""The trainer's micro-batch protocol is read from the layout a TrainSpec's `parallelize_fn`
built (`runtime.microbatches.protocol_for`), never from an attribute of the model: models
that know nothing of boost-titan (plain modules, TorchTitan's llama3 through its own
`parallelize_llama`) get the protocol of their layout, and a step runs inside it.

One process, a 1-rank gloo group. `tests/unit/test_accumulation.py`: our model's protocols
compute the same bits as FSDP2 resharding and reducing every micro-batch;
`tests/distributed/test_titan_models.py`: TorchTitan's llama3 trained by `boost_titan.train`.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from boost_titan.runtime import microbatches
from boost_titan.runtime.accumulation import Accumulation
from boost_titan.runtime.compute_copies import apply_compute_copies
from boost_titan.runtime.microbatches import (
    FsdpSwitches,
    HeldCopies,
    MicrobatchProtocol,
    protocol_for,
)


@pytest.fixture(scope="module")
def one_rank_group():
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _job(reshard: str = "default", cuda_graphs: bool = False) -> SimpleNamespace:
    return SimpleNamespace(
        boost=SimpleNamespace(cuda_graphs=cuda_graphs),
        parallelism=SimpleNamespace(fsdp_reshard_after_forward=reshard),
    )


def _dims(pp: bool = False, sharded: bool = False) -> SimpleNamespace:
    return SimpleNamespace(pp_enabled=pp, fsdp_enabled=sharded)


def _plain() -> nn.Module:
    """A model with none of our attributes."""
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 4))


def _fsdp(model: nn.Module) -> nn.Module:
    mesh = init_device_mesh("cpu", (1,))
    for block in model:
        if isinstance(block, nn.Linear):
            fully_shard(block, mesh=mesh)
    return fully_shard(model, mesh=mesh)


KEEP_ALL = Accumulation(keep_weights=True, defer_reduction=True)
KEEP_WEIGHTS = Accumulation(keep_weights=True, defer_reduction=False)
EVERY_MICROBATCH = Accumulation(keep_weights=False, defer_reduction=False)


@pytest.mark.parametrize(
    ("pp", "sharded", "reshard", "graphs_on_cuda", "expected"),
    [
        (False, False, "default", False, KEEP_ALL),
        (False, True, "never", False, KEEP_WEIGHTS),
        (False, True, "default", False, EVERY_MICROBATCH),
        (False, False, "default", True, EVERY_MICROBATCH),
        (True, False, "default", False, None),
    ],
)
def test_fsdp_protocol_of_each_layout(
    one_rank_group, monkeypatch, pp, sharded, reshard, graphs_on_cuda, expected
):
    """A model with FSDP2 modules (the table in `runtime.microbatches`): the layout's
    switches over every FSDP2 module, none kept under CUDA graphs on CUDA, no protocol on a
    pipeline stage."""
    monkeypatch.setattr(
        microbatches, "graphs_on_cuda", lambda job: job.boost.cuda_graphs and graphs_on_cuda
    )
    model = _fsdp(_plain())
    protocol = protocol_for([model], _dims(pp, sharded), _job(reshard, cuda_graphs=True))
    if expected is None:
        assert type(protocol) is MicrobatchProtocol
    else:
        assert isinstance(protocol, FsdpSwitches) and protocol.accumulation == expected
        assert protocol.modules == [model, model[0], model[2]]


def test_compute_copies_and_bare_layouts():
    """Compute copies give `HeldCopies` over those copies; a model without data parallelism
    (or under DDP) gets no protocol."""
    model = _plain()
    copies = apply_compute_copies(model, torch.bfloat16, [model[0], model[2]])
    protocol = protocol_for([model], _dims(), _job())
    assert isinstance(protocol, HeldCopies) and protocol.copies is copies
    assert type(protocol_for([_plain()], _dims(), _job())) is MicrobatchProtocol


def _titan_llama3(fsdp: bool) -> nn.Module:
    """TorchTitan's llama3 debugmodel at 1 rank, parallelized by TorchTitan's own
    `parallelize_llama` (which applies no data parallelism there), or (`fsdp`) with
    TorchTitan's `apply_fsdp` on a 1-rank mesh on top, fp32; seeded weights."""
    from torchtitan.config import JobConfig
    from torchtitan.distributed import ParallelDims
    from torchtitan.models.llama3 import get_train_spec
    from torchtitan.models.llama3.infra.parallelize import apply_fsdp

    from boost_titan.runtime.device import force_sum_reductions, use_cpu_if_no_accelerator
    from boost_titan.runtime.titan_internals import one_rank_mesh

    use_cpu_if_no_accelerator()
    spec = get_train_spec()
    dims = ParallelDims(dp_shard=1, dp_replicate=1, cp=1, tp=1, pp=1, ep=1, etp=1, world_size=1)
    with torch.device("meta"):
        model = spec.model_cls(spec.model_args["debugmodel"])
    model = spec.parallelize_fn(model, dims, JobConfig())
    if fsdp:
        mesh = one_rank_mesh(dims, ["fsdp"])
        apply_fsdp(model, mesh, torch.float32, torch.float32, pp_enabled=False)
        force_sum_reductions(model)
    model.to_empty(device="cpu")
    torch.manual_seed(0)
    with torch.no_grad():
        model.init_weights(buffer_device=None)
    return model


def test_titan_llama3_steps_inside_its_protocol(one_rank_group):
    """TorchTitan's llama3 (no attribute of ours): as TorchTitan builds it at 1 rank, no
    protocol; with FSDP2 on a 1-rank mesh, the switches that keep weights and defer the
    reduction. A step of two micro-batches inside each gives the same gradients, bit for
    bit."""
    tokens = torch.randint(0, 2048, (2, 1, 17), generator=torch.Generator().manual_seed(0))
    grads = []
    for fsdp in (False, True):
        model = _titan_llama3(fsdp)
        assert not hasattr(model, "microbatch_protocol")
        protocol = protocol_for([model], _dims(), _job())
        if fsdp:
            assert isinstance(protocol, FsdpSwitches) and protocol.accumulation == KEEP_ALL
        else:
            assert type(protocol) is MicrobatchProtocol
        protocol.start_step()
        for i in range(2):
            protocol.before_microbatch(i, 2)
            logits = model(tokens[i, :, :-1])
            loss = nn.functional.cross_entropy(logits.flatten(0, 1), tokens[i, 0, 1:])
            (loss / 2).backward()
        protocol.end_step()
        grads.append({n: _full(p.grad) for n, p in model.named_parameters()})
    assert grads[0].keys() == grads[1].keys() and len(grads[0]) > 10
    for name, grad in grads[0].items():
        assert torch.equal(grad, grads[1][name]), name


def _full(tensor: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor.clone()


@pytest.mark.parametrize(
    ("layout", "compute", "autocast"),
    [("plain", "bfloat16", True), ("plain", "float32", False), ("copies", "bfloat16", False)],
)
def test_autocast_only_where_the_layout_casts_nothing(layout, compute, autocast):
    """bf16 compute on a model whose layout casts nothing (TorchTitan's llama3 on one device)
    gets TorchTitan's autocast, as TorchTitan gives it; where the compute copies (or FSDP2)
    cast, and in fp32, there is none (every layout of our model)."""
    from torchtitan.config import JobConfig
    from torchtitan.distributed import ParallelDims
    from torchtitan.distributed.utils import maybe_enable_amp

    from boost_titan.runtime.trainer import BoostTrainer

    model = _plain()
    if layout == "copies":
        apply_compute_copies(model, torch.bfloat16, [model[0], model[2]])
    job = JobConfig()
    job.training.mixed_precision_param = compute
    trainer = SimpleNamespace(model_parts=[model], job_config=job, titan_amp=maybe_enable_amp)
    dims = ParallelDims(dp_shard=1, dp_replicate=1, cp=1, tp=1, pp=1, ep=1, etp=1, world_size=1)
    context = BoostTrainer.autocast_for_layout(trainer, dims, compute, "cpu")
    assert isinstance(context, torch.autocast) == autocast
    if autocast:
        with context:
            assert torch.get_autocast_dtype("cpu") == torch.bfloat16 and torch.is_autocast_enabled(
                "cpu"
            )
