"""Measured activation memory and recompute FLOPs of one block, on CPU.

`measure_layer` applies `runtime.saved_activations.saved_activation_bytes` to one
transformer block under an activation-checkpointing mode, on fake tensors (so a 1B-size
layer at seq 2048 costs nothing) with a fake process group emulating TP ranks, and counts
forward/backward FLOPs and backward collectives. `F.rms_norm` keeps what its fused CUDA
kernel keeps (input and fp32 rstd), not the two fp32 copies of CPU's decomposition
(`bench.measure.trace.fused_rms_norm_saves`), as in `bench trace`.

    python -m boost_titan.activation_memory --flavor 1B --seq-len 2048 [--tp 4] [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import sys
from collections import Counter
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import (
    TorchDispatchMode,
)
from torch.utils._pytree import tree_leaves
from torch.utils.flop_counter import FlopCounterMode

from boost_titan.bench.measure.flops import CPU_SDPA_FLOPS
from boost_titan.boost_llama import (
    FLAVORS,
    BoostModelArgs,
    BoostTransformer,
    flavor_args,
)
from boost_titan.boost_llama.strategies import STRATEGIES
from boost_titan.config.errors import ConfigError
from boost_titan.parallelize.teardown import end_process_groups
from boost_titan.runtime.saved_activations import saved_activation_bytes

LOW_RANK_STRATEGIES = tuple(name for name, s in STRATEGIES.items() if s.low_rank)

MODES = ("none", "full", "selective", "lowrank")
"""No AC; TorchTitan's full and op-level selective AC; BOOST's low-rank AC."""

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


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


@contextlib.contextmanager
def _fake_tp_mesh(tp: int) -> Iterator[Any]:
    """A 1-D TP mesh on a fake process group: one process plays rank 0 of `tp`."""
    if tp == 1:
        yield None
        return
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        raise ConfigError("measure_layer needs its own fake process group; call it outside a job")
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=tp)
    try:
        yield init_device_mesh("cpu", (tp,))
    finally:
        end_process_groups(finished=False)


def apply_ac_mode(model: nn.Module, mode: str, *, tp_degree: int) -> None:
    """Wrap `model.layers` as the trainer would for `mode` (see MODES). TorchTitan's
    op-level selective AC uses our trainer's save list (which includes the CPU
    flash-attention op, so attention is saved as it is on GPU)."""
    from torchtitan.config.job_config import ActivationCheckpoint
    from torchtitan.distributed.activation_checkpoint import apply_ac

    from boost_titan.boost_llama.parallelize import _SAC_SAVE
    from boost_titan.parallelize.lowrank_ac import apply_lowrank_ac

    if mode == "full":
        apply_ac(model, ActivationCheckpoint(mode="full"))
    elif mode == "selective":
        config = ActivationCheckpoint(mode="selective", selective_ac_option="op")
        apply_ac(model, config, op_sac_save_list=_SAC_SAVE)
    elif mode == "lowrank":
        apply_lowrank_ac(model, rank=model.args.effective_rank, tp_degree=tp_degree)
    elif mode != "none":
        raise ConfigError(f"unknown AC mode {mode!r}; choose one of {', '.join(MODES)}")


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
    from boost_titan.bench.measure.trace import default_dtype, fused_rms_norm_saves

    tensors = FakeTensorMode() if fake else contextlib.nullcontext()
    with _fake_tp_mesh(tp) as mesh, tensors, default_dtype(dtype), fused_rms_norm_saves():
        model = BoostTransformer(args)  # values are irrelevant: no init
        if mesh is not None:
            from boost_titan.boost_llama.strategies import build_plan
            from boost_titan.parallelize import apply_plan

            apply_plan(model, mesh, build_plan(strategy, args), src_data_rank=None)
        apply_ac_mode(model, mode, tp_degree=tp)
        block = model.layers["1"]
        width = args.dim // tp if strategy == "btp" else args.dim
        x = torch.randn(batch, seq_len, width, requires_grad=True)
        rank = args.effective_rank
        prevs = [torch.randn(batch, seq_len, rank, requires_grad=True) for _ in range(7)]
        prevs = prevs if args.arch == "lax" else []

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


# ---- command line -----------------------------------------------------------------------
def _rows(results: list[LayerMeasurement]) -> list[dict[str, Any]]:
    by_mode = {r.mode: r for r in results}
    plain = by_mode.get("none")
    rows = []
    for r in results:
        recompute = r.backward_flops - plain.backward_flops if plain else None
        rows.append(
            {
                **dataclasses.asdict(r),
                "bytes_per_token": r.bytes_per_token,
                "saved_vs_none": r.saved_bytes / plain.saved_bytes if plain else None,
                "recompute_flops": recompute,
            }
        )
    return rows


def _table(rows: list[dict[str, Any]], title: str) -> str:
    header = (
        f"{'mode':10s} {'MiB/layer':>10s} {'B/token':>9s} {'vs none':>8s} "
        f"{'fwd GFLOP':>10s} {'recompute GFLOP':>16s}  bwd collectives"
    )
    lines = [title, header]
    for r in rows:
        share = r["saved_vs_none"]
        ratio = f"{100 * share:7.1f}%" if share is not None else f"{'-':>8s}"
        recompute = r["recompute_flops"]
        recompute = f"{recompute / 1e9:16.1f}" if recompute is not None else f"{'-':>16s}"
        comm = ", ".join(f"{k} x{v}" for k, v in sorted(r["backward_collectives"].items())) or "-"
        lines.append(
            f"{r['mode']:10s} {r['saved_bytes'] / 2**20:10.1f} {r['bytes_per_token']:9.0f} "
            f"{ratio} {r['forward_flops'] / 1e9:10.1f} {recompute}  {comm}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m boost_titan.activation_memory",
        description="Saved activation bytes and recompute FLOPs of one layer per AC mode "
        "(fake tensors; per TP rank).",
    )
    parser.add_argument("--flavor", default="1B", choices=list(FLAVORS))
    parser.add_argument("--arch", default="cola", choices=["svd", "cola", "lax"])
    parser.add_argument("--strategy", default="btp", choices=LOW_RANK_STRATEGIES)
    parser.add_argument("--tp", type=int, default=1)
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--batch", type=int, default=1, help="micro-batch size")
    parser.add_argument("--dtype", default="bf16", choices=list(DTYPES))
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    ns = parser.parse_args(argv)
    args = flavor_args(ns.flavor, arch=ns.arch)
    try:
        check_layer_args(args, tp=ns.tp, seq_len=ns.seq_len, strategy=ns.strategy)
        results = [
            measure_layer(
                args,
                mode,
                seq_len=ns.seq_len,
                batch=ns.batch,
                tp=ns.tp,
                strategy=ns.strategy,
                dtype=DTYPES[ns.dtype],
            )
            for mode in ns.modes
        ]
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    rows = _rows(results)
    setup = {
        "flavor": ns.flavor,
        "arch": ns.arch,
        "strategy": ns.strategy,
        "tp": ns.tp,
        "seq_len": ns.seq_len,
        "batch": ns.batch,
        "dtype": ns.dtype,
    }
    if ns.json:
        print(json.dumps({**setup, "layers": rows}, indent=2))
    else:
        title = ", ".join(f"{k} {v}" for k, v in setup.items()) + " (one layer, per TP rank)"
        print(_table(rows, title))
    return 0


if __name__ == "__main__":
    sys.exit(main())
