"""The run's precision: bf16 compute with fp32 master weights, optimizer state and gradient
reductions on every layout (`mixed_precision_param = "bfloat16"`), fp32 exactly as before
with "float32" (`tests/unit/test_precision.py`: the phrase saying which in `check` and the
trainer's log).

The 2-rank test builds models as the trainer does (meta device, the TrainSpec's parallelize
function, `to_empty`, `init_weights`, TorchTitan's optimizers) and runs one training step
under a dispatch mode that records the dtypes reaching every GEMM and every collective with
its group's size: TP2 bf16, TP2 fp32 and DDP-like dp_replicate 2 bf16 (HSDP with a 1-rank
shard dim), in one launch.
"""

from __future__ import annotations

import pytest
import torch
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import TorchDispatchMode

from tests.helpers import DEBUG_TOML
from tests.helpers.distributed import run_on_ranks

GEMMS = {
    "mm",
    "addmm",
    "bmm",
    "baddbmm",
    "_scaled_dot_product_flash_attention_for_cpu",
    "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_flash_attention",
}
"""aten ops doing a GEMM (and the fused attention kernels, whose inner GEMMs they run)."""


# ---- one training step on 2 ranks ---------------------------------------------------------
class _Log(TorchDispatchMode):
    """The tensor dtypes of every GEMM, and (kind, group size, dtype) of every collective."""

    def __init__(self) -> None:
        super().__init__()
        self.in_block = False  # set by hooks around block 0's forward
        self.gemms: list[tuple[str, tuple[torch.dtype, ...]]] = []
        self.block_gemms: list[tuple[str, tuple[torch.dtype, ...]]] = []
        self.collectives: list[tuple[str, int, torch.dtype]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        from torch.distributed.distributed_c10d import ProcessGroup, _resolve_process_group

        kwargs = kwargs or {}
        if any(issubclass(t, DTensor) for t in types):
            return NotImplemented  # see the plain-tensor ops it desugars into
        name = func._overloadpacket.__name__
        flat = [a for a in args if isinstance(a, torch.Tensor)]
        if name in GEMMS:
            self.gemms.append((name, tuple(a.dtype for a in flat[:3])))
            if self.in_block:
                self.block_gemms.append(self.gemms[-1])
        names = [a.name for a in func._schema.arguments]
        if getattr(func, "namespace", None) in ("c10d", "_c10d_functional") and (
            "group_name" in names or "process_group" in names
        ):
            if "group_name" in names:
                group = _resolve_process_group(args[names.index("group_name")])
            else:
                group = ProcessGroup.unbox(args[names.index("process_group")])
            tensor = args[0]
            while isinstance(tensor, (list, tuple)):
                tensor = tensor[0]
            self.collectives.append((name, group.size(), tensor.dtype))
        return func(*args, **kwargs)


def _step(layout: str, rank: int, world_size: int) -> dict:
    """Build the layout's model as the trainer does, run one step under `_Log`; report
    the dtypes seen and the parameters', gradients' and optimizer state's dtypes."""
    from torch.distributed.fsdp import FSDPModule
    from torchtitan.components.loss import build_cross_entropy_loss
    from torchtitan.components.optimizer import build_optimizers
    from torchtitan.distributed import ParallelDims
    from torchtitan.distributed import utils as dist_utils

    from boost_titan.boost_llama.model import BoostTransformer
    from boost_titan.boost_llama.spec import build_spec, job_args
    from boost_titan.config.cli import parse_job_config
    from boost_titan.runtime.device import use_cpu_if_no_accelerator
    from boost_titan.runtime.grad_norm import clip_grad_norm_exact_
    from boost_titan.runtime.microbatches import HeldCopies, protocol_for

    use_cpu_if_no_accelerator()
    tp, replicate = (1, world_size) if layout == "dp_replicate2-bf16" else (world_size, 1)
    param = "bfloat16" if layout.endswith("bf16") else "float32"
    args = ["--training.mixed_precision_param", param]
    job = parse_job_config(
        [
            "--job.config_file",
            str(DEBUG_TOML),
            "--training.seq_len",
            "32",
            "--parallelism.tensor_parallel_degree",
            str(tp),
            *args,
        ]
    )
    dims = ParallelDims(
        dp_shard=1, dp_replicate=replicate, cp=1, tp=tp, pp=1, ep=1, etp=1, world_size=world_size
    )
    with torch.device("meta"):
        model = BoostTransformer(job_args(job))
    model = build_spec().parallelize_fn(model, dims, job)
    model.to_empty(device="cpu")
    torch.manual_seed(0)
    with torch.no_grad():
        model.init_weights(buffer_device=None)
    optimizers = build_optimizers([model], job.optimizer, dims)
    loss_fn = build_cross_entropy_loss(job)
    gen = torch.Generator().manual_seed(rank if replicate > 1 else 0)  # DP ranks: other data
    tokens = torch.randint(0, model.args.vocab_size, (2, 33), generator=gen)
    log = _Log()
    block = model.layers["0"]
    block.register_forward_pre_hook(lambda *_: setattr(log, "in_block", True))
    block.register_forward_hook(lambda *_: setattr(log, "in_block", False))
    with log, dist_utils.get_train_context(tp > 1)():
        loss = loss_fn(model(tokens[:, :-1]), tokens[:, 1:]) / tokens[:, 1:].numel()
        loss.backward()
        clip_grad_norm_exact_(list(model.parameters()), 1.0)
    grads = {n: p.grad for n, p in model.named_parameters()}
    optimizers.step()
    state = [t for s in optimizers.optimizers[0].state.values() for t in s.values() if t.dim()]
    local = {n: (g.to_local() if isinstance(g, DTensor) else g) for n, g in grads.items()}
    return {
        "fsdp_modules": sum(isinstance(m, FSDPModule) for m in model.modules()),
        "compute_copies": isinstance(protocol_for([model], dims, job), HeldCopies),
        "gemms": log.gemms,
        "block_gemms": log.block_gemms,
        "collectives": log.collectives,
        "params": {p.dtype for p in model.parameters()},
        "grads": {g.dtype for g in local.values()},
        "grad_sums": {n: g.double().sum().item() for n, g in local.items()},
        "state": {t.dtype for t in state},
    }


def _worker(rank: int, world_size: int, layouts: list[str]) -> dict:
    return {layout: _step(layout, rank, world_size) for layout in layouts}


@pytest.fixture(scope="module")
def steps() -> list[dict]:
    return run_on_ranks(_worker, 2, layouts=["tp2-bf16", "tp2-fp32", "dp_replicate2-bf16"])


def _assert_master_state_fp32(step: dict) -> None:
    """Parameters (master weights), the gradients the optimizer gets and its state: fp32."""
    assert step["params"] == step["grads"] == step["state"] == {torch.float32}, step


def test_tp2_bf16_gemms_see_bf16_with_fp32_master_state(steps):
    """TP2 with mixed_precision_param bfloat16: every GEMM of the step (the blocks' BTP
    projections, attention, lm_head; forward and backward) gets bf16 inputs and weights;
    master weights, gradients and AdamW state are fp32, through the compute copies
    (`runtime.compute_copies`, no FSDP2), which issue no collective: TP2's collectives are
    fp32's, kind for kind."""
    for rank in steps:
        bf16, fp32 = rank["tp2-bf16"], rank["tp2-fp32"]
        dtypes = {d for _, ds in bf16["gemms"] for d in ds}
        print(
            f"tp2 bf16: {len(bf16['gemms'])} GEMMs ({len(bf16['block_gemms'])} in block 0's "
            f"forward), dtypes {dtypes}; {bf16['fsdp_modules']} FSDP modules"
        )
        assert bf16["block_gemms"] and dtypes == {torch.bfloat16}
        assert bf16["compute_copies"] and bf16["fsdp_modules"] == 0
        _assert_master_state_fp32(bf16)
        assert all(size > 1 for _, size, _ in bf16["collectives"]), bf16["collectives"]
        assert [c[:2] for c in bf16["collectives"]] == [c[:2] for c in fp32["collectives"]]


def test_tp2_fp32_is_unwrapped_fp32(steps):
    """mixed_precision_param float32: no FSDP2 wrapping or compute copies, every GEMM and
    all state fp32."""
    for rank in steps:
        fp32 = rank["tp2-fp32"]
        assert fp32["fsdp_modules"] == 0 and not fp32["compute_copies"]
        assert {d for _, ds in fp32["gemms"] for d in ds} == {torch.float32}
        # fp64: the exact gradient norm's scalars (`runtime.grad_norm`)
        assert {d for _, _, d in fp32["collectives"]} - {torch.float64} == {torch.float32}
        _assert_master_state_fp32(fp32)


def test_dp_replicate_bf16_reduces_in_fp32(steps):
    """dp_replicate 2 (no TP, no sharding), bf16: HSDP over a 1-rank shard dim computes in
    bf16, all-reduces every gradient over the 2 replicas in fp32 (and nothing else), and
    both ranks end with the same fp32 gradients from different data."""
    first, second = (rank["dp_replicate2-bf16"] for rank in steps)
    assert first["fsdp_modules"] > 0 and not first["compute_copies"]
    assert {d for _, ds in first["gemms"] for d in ds} == {torch.bfloat16}
    _assert_master_state_fp32(first)
    reduces = {(size, dtype) for _, size, dtype in first["collectives"]}
    assert reduces == {(2, torch.float32)}, first["collectives"]
    assert first["grad_sums"] == second["grad_sums"]
