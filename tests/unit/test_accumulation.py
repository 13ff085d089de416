"""Gradient accumulation under bf16 compute with fp32 master weights (`runtime.accumulation`):
each weight cast once per optimizer step where nothing is sharded, gradients accumulated in
fp32 and equal, bit for bit, to reducing after every micro-batch.

One process, a 1-rank gloo group: the debug model (CoLA, every parameter randomised) built as
the trainer builds it at TP 1 in bf16 (FSDP2 as one unit on a 1-rank mesh), trained two
steps of 4 micro-batches each with AdamW, once with the product's policy and once resharding
and reducing after every micro-batch (what TorchTitan 0.2.2 does). The second step catches a
bf16 copy that outlives the optimizer step. `bench step` reads casts from a profiler trace
(`bench.measure.step_trace`): the same reading counts them here.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile

import pytest
import torch
from torch.profiler import ProfilerActivity, profile, record_function

from boost_titan.bench.measure.step_trace import MICROBATCH, STEP, step_counts
from boost_titan.runtime.accumulation import Accumulation, fsdp_modules
from tests.helpers import DEBUG_TOML
from tests.helpers.distributed import randomize

MICROBATCHES = 4


@pytest.fixture(scope="module")
def one_rank_group():
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _model():
    """The debug model as the trainer builds it at TP 1 with bf16 compute."""
    from torchtitan.distributed import ParallelDims

    from boost_titan.boost_llama.model import BoostTransformer
    from boost_titan.boost_llama.spec import build_spec, model_args_for
    from boost_titan.config.cli import parse_job_config
    from boost_titan.runtime.device import use_cpu_if_no_accelerator

    use_cpu_if_no_accelerator()
    job = parse_job_config(
        [
            "--job.config_file",
            str(DEBUG_TOML),
            "--training.seq_len",
            "16",
            "--parallelism.tensor_parallel_degree",
            "1",
            "--training.mixed_precision_param",
            "bfloat16",
        ]
    )
    dims = ParallelDims(dp_shard=1, dp_replicate=1, cp=1, tp=1, pp=1, ep=1, etp=1, world_size=1)
    with torch.device("meta"):
        model = BoostTransformer(model_args_for(job))
    model = build_spec().parallelize_fn(model, dims, job)
    model.to_empty(device="cpu")
    torch.manual_seed(0)
    with torch.no_grad():
        model.init_weights(buffer_device=None)
    # a 1-rank mesh: each DTensor parameter's local tensor is the whole of it
    randomize(_LocalView(model))
    return model


class _LocalView(torch.nn.Module):
    """The local tensors of a model's DTensor parameters, as parameters (for `randomize`)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.locals = [p.to_local() for p in model.parameters()]

    def parameters(self, recurse: bool = True):
        return iter(self.locals)


def _train(policy: Accumulation, profiled_step: int) -> tuple[list[dict], dict]:
    """Two steps of MICROBATCHES micro-batches under `policy`: each step's gradients, and the
    profiler trace of step `profiled_step`."""
    model = _model()
    units = fsdp_modules([model])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    tokens = torch.randint(0, model.args.vocab_size, (2, MICROBATCHES, 17), generator=None)
    grads, trace = [], {}
    for step in range(2):
        optimizer.zero_grad()
        prof = profile(activities=[ProfilerActivity.CPU], record_shapes=step == profiled_step)
        with prof if step == profiled_step else contextlib.nullcontext(), record_function(STEP):
            for i in range(MICROBATCHES):
                policy.before_microbatch(units, i, MICROBATCHES)
                with record_function(MICROBATCH):
                    batch = tokens[step, i : i + 1]
                    logits = model(batch[:, :-1]).float()
                    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch[0, 1:])
                    (loss / MICROBATCHES).backward()
        grads.append({n: p.grad.to_local().clone() for n, p in model.named_parameters()})
        optimizer.step()
        if step == profiled_step:
            with tempfile.TemporaryDirectory() as tmp:
                path = os.path.join(tmp, "trace.json")
                prof.export_chrome_trace(path)
                with open(path) as f:
                    trace = json.load(f)
    return grads, trace


@pytest.fixture(scope="module")
def runs(one_rank_group) -> dict:
    torch.manual_seed(1)
    every_microbatch = Accumulation(keep_weights=False, defer_reduction=False)
    product = Accumulation.for_layout(shards_weights=False, reshard_policy="default")
    return {
        "product": _train(product, profiled_step=1),
        "every_microbatch": _train(every_microbatch, profiled_step=1),
    }


def test_policy_of_each_layout():
    """Unsharded layouts keep the copy and defer the reduction; FSDP keeps it only with
    fsdp_reshard_after_forward "never" and always reduces after each micro-batch."""
    assert Accumulation.for_layout(shards_weights=False, reshard_policy="default") == (
        Accumulation(keep_weights=True, defer_reduction=True)
    )
    keep = Accumulation.for_layout(shards_weights=True, reshard_policy="never")
    assert keep == Accumulation(keep_weights=True, defer_reduction=False)
    assert not Accumulation.for_layout(shards_weights=True, reshard_policy="default").active


def test_gradients_equal_reducing_every_microbatch(runs):
    """Both steps' fp32 gradients equal, bit for bit, those of resharding and reducing after
    every micro-batch: the same bf16 weights, the same fp32 sums in the same order."""
    (product, _), (reference, _) = runs["product"], runs["every_microbatch"]
    for step in range(2):
        assert product[step].keys() == reference[step].keys()
        for name, grad in product[step].items():
            assert grad.dtype == torch.float32, name
            assert torch.equal(grad, reference[step][name]), (step, name)


def test_each_weight_cast_once_per_step(runs):
    """The product casts each parameter once per step; resharding after every micro-batch
    casts it once per micro-batch (TorchTitan 0.2.2 also before every backward)."""
    (_, trace), (_, reference_trace) = runs["product"], runs["every_microbatch"]
    params = len(runs["product"][0][0])
    product = step_counts(trace, "bfloat16", cuda=False)
    reference = step_counts(reference_trace, "bfloat16", cuda=False)
    print(
        f"{params} parameters; casts per step: product {product.casts_per_step}, "
        f"every micro-batch {reference.casts_per_step}; launches per micro-batch "
        f"{product.launches_per_microbatch:.0f} vs {reference.launches_per_microbatch:.0f}"
    )
    assert product.microbatches == MICROBATCHES
    assert product.casts_per_step == params
    assert reference.casts_per_step == MICROBATCHES * params
