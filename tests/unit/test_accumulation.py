"""Gradient accumulation under bf16 compute with fp32 master weights: each weight cast once
per optimizer step where nothing is sharded, gradients accumulated in fp32, and every path
equal, bit for bit, to FSDP2 resharding and reducing after every micro-batch.

One process, a 1-rank gloo group: the debug model (CoLA, every parameter randomised) at TP 1
in bf16, trained two steps of 4 micro-batches each with AdamW, then one held-out forward
after each step:
- "copies": as the trainer builds it (`runtime.compute_copies`: no FSDP2), with the
  micro-batch protocol the trainer reads from that layout (`protocol_for`);
- "fsdp_kept": FSDP2 on a 1-rank mesh with `runtime.accumulation`'s policy (what
  dp_replicate layouts still run);
- "every_microbatch": FSDP2 on a 1-rank mesh resharding and reducing after every
  micro-batch (what TorchTitan 0.2.2 does), the reference.
The second step catches a bf16 copy that outlives the optimizer step. `bench step` reads
casts from a profiler trace (`bench.measure.step_trace`): the same reading counts them here.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import weakref

import pytest
import torch
from torch.distributed.tensor import DTensor
from torch.profiler import ProfilerActivity, profile, record_function

from boost_titan.bench.measure.step_trace import MICROBATCH, STEP, step_counts
from boost_titan.runtime.accumulation import Accumulation, fsdp_modules
from boost_titan.runtime.microbatches import (
    FsdpSwitches,
    HeldCopies,
    MicrobatchProtocol,
    protocol_for,
)
from tests.helpers import DEBUG_TOML
from tests.helpers.distributed import randomize

MICROBATCHES = 4


@pytest.fixture(scope="module")
def one_rank_group():
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _model(fsdp: bool) -> tuple[torch.nn.Module, MicrobatchProtocol]:
    """The debug model at TP 1 with bf16 compute: as the trainer builds it, or (`fsdp`) with
    FSDP2 on a 1-rank mesh as `runtime.data_parallel` applies it where it still does;
    and the protocol the trainer reads from that layout."""
    from torchtitan.distributed import ParallelDims
    from torchtitan.models.llama3.infra.parallelize import apply_fsdp

    from boost_titan.boost_llama.model import BoostTransformer
    from boost_titan.boost_llama.spec import build_spec, job_args
    from boost_titan.config.cli import parse_job_config
    from boost_titan.runtime.device import force_sum_reductions, use_cpu_if_no_accelerator
    from boost_titan.runtime.titan_internals import one_rank_mesh

    use_cpu_if_no_accelerator()
    precision = "float32" if fsdp else "bfloat16"  # float32: parallelize_fn adds no wrapper
    job = parse_job_config(
        [
            "--job.config_file",
            str(DEBUG_TOML),
            "--training.seq_len",
            "16",
            "--parallelism.tensor_parallel_degree",
            "1",
            "--training.mixed_precision_param",
            precision,
        ]
    )
    dims = ParallelDims(dp_shard=1, dp_replicate=1, cp=1, tp=1, pp=1, ep=1, etp=1, world_size=1)
    with torch.device("meta"):
        model = BoostTransformer(job_args(job))
    model = build_spec().parallelize_fn(model, dims, job)
    if fsdp:
        mesh = one_rank_mesh(dims, ["fsdp"])
        apply_fsdp(
            model,
            mesh,
            torch.bfloat16,
            torch.float32,
            pp_enabled=False,
            reshard_after_forward_policy="never",
        )
        force_sum_reductions(model)
    model.to_empty(device="cpu")
    torch.manual_seed(0)
    with torch.no_grad():
        model.init_weights(buffer_device=None)
    # a 1-rank mesh: each DTensor parameter's local tensor is the whole of it
    randomize(_LocalView(model))
    return model, protocol_for([model], dims, job)


class _LocalView(torch.nn.Module):
    """The local tensors of a model's DTensor parameters, as parameters (for `randomize`)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.locals = [_local(p) for p in model.parameters()]

    def parameters(self, recurse: bool = True):
        return iter(self.locals)


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def _train(path: str, profiled_step: int) -> tuple[list[dict], dict, list[torch.Tensor]]:
    """Two steps of MICROBATCHES micro-batches on `path` (module docstring): each step's
    gradients, the profiler trace of step `profiled_step`, and the held-out logits after
    each step."""
    model, product = _model(fsdp=path != "copies")
    units = fsdp_modules([model])
    copies = path == "copies"
    assert isinstance(product, HeldCopies) == copies
    assert bool(units) != copies
    protocol = product if copies else FsdpSwitches(units, POLICIES[path])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    tokens = torch.randint(0, model.args.vocab_size, (2, MICROBATCHES, 17), generator=None)
    grads, trace, held_out, given_back = [], {}, [], []
    for step in range(2):
        optimizer.zero_grad()
        prof = profile(activities=[ProfilerActivity.CPU], record_shapes=step == profiled_step)
        with prof if step == profiled_step else contextlib.nullcontext(), record_function(STEP):
            protocol.start_step()  # FSDP2: reshards what the held-out forward unsharded
            for i in range(MICROBATCHES):
                protocol.before_microbatch(i, MICROBATCHES)
                with record_function(MICROBATCH):
                    batch = tokens[step, i : i + 1]
                    logits = model(batch[:, :-1]).float()
                    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch[0, 1:])
                    block_copies = [weakref.ref(p) for p in model.layers["0"].parameters()]
                    (loss / MICROBATCHES).backward()
            if copies:  # block 0's copies freed by the last backward
                freed = all(ref() is None for ref in block_copies)
                given_back.append(_blocks_hold_masters(model) and freed)
            protocol.end_step()
        grads.append({n: _local(p.grad).clone() for n, p in model.named_parameters()})
        optimizer.step()
        with torch.no_grad():  # outside a step: the copies are made for this forward only
            held_out.append(model(tokens[0, 0:1, :-1]))
        if step == profiled_step:
            with tempfile.TemporaryDirectory() as tmp:
                path_ = os.path.join(tmp, "trace.json")
                prof.export_chrome_trace(path_)
                with open(path_) as f:
                    trace = json.load(f)
    if copies:  # each block's copy was given back and freed after its backward
        assert given_back == [True, True]
    return grads, trace, held_out


def _blocks_hold_masters(model: torch.nn.Module) -> bool:
    """Every block holds its fp32 masters again (the tied ends keep copies till the end)."""
    blocks = [p for block in model.layers.values() for p in block.parameters()]
    return all(p.is_leaf and p.dtype == torch.float32 for p in blocks) and not all(
        p.is_leaf for p in model.parameters()
    )


POLICIES = {
    "fsdp_kept": Accumulation.for_layout(shards_weights=False, reshard_policy="default"),
    "every_microbatch": Accumulation(keep_weights=False, defer_reduction=False),
}
PATHS = ("copies", "fsdp_kept", "every_microbatch")


@pytest.fixture(scope="module")
def runs(one_rank_group) -> dict:
    results = {}
    for path in PATHS:
        torch.manual_seed(1)
        results[path] = _train(path, profiled_step=1)
    return results


def test_policy_of_each_layout():
    """Unsharded layouts keep the copy and defer the reduction; FSDP keeps it only with
    fsdp_reshard_after_forward "never" and always reduces after each micro-batch."""
    assert Accumulation.for_layout(shards_weights=False, reshard_policy="default") == (
        Accumulation(keep_weights=True, defer_reduction=True)
    )
    keep = Accumulation.for_layout(shards_weights=True, reshard_policy="never")
    assert keep == Accumulation(keep_weights=True, defer_reduction=False)
    assert not Accumulation.for_layout(shards_weights=True, reshard_policy="default").active


@pytest.mark.parametrize("path", ["copies", "fsdp_kept"])
def test_gradients_equal_reducing_every_microbatch(runs, path):
    """Both steps' fp32 gradients and the held-out logits after each step equal, bit for
    bit, those of resharding and reducing after every micro-batch: the same bf16 weights
    and block inputs, the same fp32 sums in the same order."""
    (product, _, held_out), (reference, _, reference_held_out) = runs[path], runs[PATHS[2]]
    for step in range(2):
        assert product[step].keys() == reference[step].keys()
        for name, grad in product[step].items():
            assert grad.dtype == torch.float32, name
            assert torch.equal(grad, reference[step][name]), (step, name)
        assert held_out[step].dtype == torch.bfloat16
        assert torch.equal(held_out[step], reference_held_out[step]), step


@pytest.mark.parametrize("path", ["copies", "fsdp_kept"])
def test_each_weight_cast_once_per_step(runs, path):
    """Both paths cast each parameter once per step; resharding after every micro-batch
    casts it once per micro-batch (TorchTitan 0.2.2 also before every backward)."""
    (_, trace, _), (_, reference_trace, _) = runs[path], runs[PATHS[2]]
    params = len(runs[path][0][0])
    product = step_counts(trace, "bfloat16", cuda=False)
    reference = step_counts(reference_trace, "bfloat16", cuda=False)
    print(
        f"{path}: {params} parameters; casts per step: {product.casts_per_step}, "
        f"every micro-batch {reference.casts_per_step}; launches per micro-batch "
        f"{product.launches_per_microbatch:.0f} vs {reference.launches_per_microbatch:.0f}"
    )
    assert product.microbatches == MICROBATCHES
    assert product.casts_per_step == params
    assert reference.casts_per_step == MICROBATCHES * params
