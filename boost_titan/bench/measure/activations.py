"""Measured activation memory and recompute FLOPs of one block, on CPU.

`measure_layer` applies `runtime.saved_activations.saved_activation_bytes` to one
transformer block under an activation-checkpointing mode, on fake tensors (so a 1B-size
layer at seq 2048 costs nothing) with a fake process group emulating TP ranks, and counts
forward/backward FLOPs and backward collectives. `F.rms_norm` keeps what its fused CUDA
kernel keeps (input and fp32 rstd), not the two fp32 copies of CPU's decomposition
(`fake_group.fused_rms_norm_saves`), as in `bench trace`. The command line is
`python -m boost_titan.activation_memory`.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections import Counter
from collections.abc import Iterator

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import (
    TorchDispatchMode,
)
from torch.utils._pytree import tree_leaves
from torch.utils.flop_counter import FlopCounterMode

from boost_titan.bench.measure.fake_group import (
    default_dtype,
    fake_tp_mesh,
    fused_rms_norm_saves,
    shard,
)
from boost_titan.bench.measure.flops import CPU_SDPA_FLOPS
from boost_titan.boost_llama import (
    BoostModelArgs,
    BoostTransformer,
)
from boost_titan.boost_llama.parallelize import apply_ac_mode
from boost_titan.boost_llama.strategies import STRATEGIES
from boost_titan.config.errors import ConfigError
from boost_titan.runtime.saved_activations import saved_activation_bytes

LOW_RANK_STRATEGIES = tuple(name for name, s in STRATEGIES.items() if s.low_rank)


# ---- one layer under an AC mode --------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class LayerMeasurement:
    """One block's saved activations and FLOPs (per TP rank) under an AC mode."""

    mode: str
    tokens: int
    saved_bytes: int
    forward_flops: int
    backward_flops: int
    backward_collectives: dict[str, int]

    @property
    def bytes_per_token(self) -> float:
        return self.saved_bytes / self.tokens


_IGNORED_COMM = {"wait_tensor", "_wrap_tensor_autograd"}


class _CollectiveCount(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.counts: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if func.namespace == "_c10d_functional" and name not in _IGNORED_COMM:
            self.counts[name] += 1
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def _counting() -> Iterator[tuple[FlopCounterMode, _CollectiveCount]]:
    flops = FlopCounterMode(display=False, custom_mapping=CPU_SDPA_FLOPS)
    with flops, _CollectiveCount() as comm:
        yield flops, comm


def check_layer_args(args: BoostModelArgs, *, tp: int, seq_len: int, strategy: str) -> None:
    """Raise ConfigError (one line, with the fix) for a layer that cannot be measured."""
    args.validate()
    if not args.low_rank:
        raise ConfigError("activation memory is measured for low-rank archs; pick svd, cola or lax")
    if strategy not in LOW_RANK_STRATEGIES:
        raise ConfigError(
            f"unknown strategy {strategy!r}; choose {' or '.join(LOW_RANK_STRATEGIES)}"
        )
    if not 0 < seq_len <= args.max_seq_len:
        raise ConfigError(f"--seq-len must be in 1..{args.max_seq_len} for this flavor")
    divisors = {
        "n_heads": args.n_heads,
        "n_kv_heads": args.kv_heads,
        "dim": args.dim,
        "ffn_dim": args.ffn_dim,
    }
    if strategy == "vanilla":
        divisors["rank"] = args.effective_rank
    for name, value in divisors.items():
        if tp < 1 or value % tp:
            raise ConfigError(f"--tp {tp} does not divide {name} {value}; pick a divisor")


def measure_layer(
    args: BoostModelArgs,
    mode: str,
    *,
    seq_len: int,
    batch: int = 1,
    tp: int = 1,
    strategy: str = "btp",
    dtype: torch.dtype = torch.bfloat16,
    fake: bool = True,
) -> LayerMeasurement:
    """Saved bytes, FLOPs and backward collectives of one block (layer 1, so LaX crosses)
    on TP rank 0, for a micro-batch of `batch` x `seq_len` tokens, on fake tensors (or
    real ones with `fake=False`, for small shapes)."""
    check_layer_args(args, tp=tp, seq_len=seq_len, strategy=strategy)
    args = dataclasses.replace(args, n_layers=2, vocab_size=args.vocab_size or 128)
    tensors = FakeTensorMode() if fake else contextlib.nullcontext()
    mesh_or_none = fake_tp_mesh(tp) if tp > 1 else contextlib.nullcontext()
    with mesh_or_none as mesh, tensors, default_dtype(dtype), fused_rms_norm_saves():
        model = BoostTransformer(args)  # values are irrelevant: no init
        if mesh is not None:
            shard(model, mesh, strategy)
        apply_ac_mode(model, mode, tp_degree=tp)
        block = model.layers["1"]
        width = args.dim // tp if strategy == "btp" else args.dim
        x = torch.randn(batch, seq_len, width, requires_grad=True)
        rank = args.effective_rank
        prevs = [torch.randn(batch, seq_len, rank, requires_grad=True) for _ in range(7)]
        prevs = prevs if args.architecture.carries_latents else []

        def forward():
            return block(x, model.rope, prevs)

        runs = []

        def counted_forward():  # one forward: saved bytes, FLOPs, and the graph for backward
            with _counting() as (flops, _):
                runs.append((forward(), flops))
            return runs[-1][0]

        saved = saved_activation_bytes(counted_forward, exclude=model)
        out, flops = runs[0]
        outputs = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
        with _counting() as (backward_flops, comm):
            torch.autograd.backward(outputs, [torch.ones_like(t) for t in outputs])
    return LayerMeasurement(
        mode=mode,
        tokens=batch * seq_len,
        saved_bytes=saved,
        forward_flops=flops.get_total_flops(),
        backward_flops=backward_flops.get_total_flops(),
        backward_collectives=dict(comm.counts),
    )
