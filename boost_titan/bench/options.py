"""The model, parallelism and batch options that `bench model`, `trace` and `memory` share,
their argument types, and the keywords of `perf.predict.sweep` they become."""

from __future__ import annotations

import argparse

from boost_titan.boost_llama.strategies import STRATEGIES
from boost_titan.config import AC_MODES, ARCHS, OVERLAP_CHUNKS
from boost_titan.parallelize.norm_modes import RMSNORM_MODES
from boost_titan.perf.gpus import GPUS
from boost_titan.perf.layout import DTYPE_ALIASES, DTYPE_BYTES


def csv(text: str) -> list[str]:
    """A comma list (empty items dropped)."""
    return [item for item in text.split(",") if item]


def int_csv(text: str) -> list[int]:
    """A comma list of integers."""
    try:
        return [int(item) for item in csv(text)]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}"
        ) from None


def dtype(text: str) -> str:
    """bf16 / fp32, or TorchTitan's bfloat16 / float32."""
    name = DTYPE_ALIASES.get(text, text)
    if name not in DTYPE_BYTES:
        spellings = [*DTYPE_BYTES, *DTYPE_ALIASES]
        raise argparse.ArgumentTypeError(f"{text!r} is not one of {', '.join(spellings)}")
    return name


def add_layout_args(parser: argparse.ArgumentParser) -> None:
    """Model, parallelism and batch options shared by the subcommands."""
    parser.add_argument("--flavor", type=csv, default=["7B"], help="flavor or comma list (sweep)")
    parser.add_argument(
        "--arch", default="cola", choices=ARCHS, help="low-rank arch; megatron always runs fullrank"
    )
    parser.add_argument(
        "--strategy",
        type=csv,
        default=list(STRATEGIES),
        help="comma list of megatron, vanilla, btp",
    )
    parser.add_argument(
        "--tp", type=int_csv, default=[4], help="tensor-parallel degree or comma list (sweep)"
    )
    parser.add_argument("--pp", type=int, default=1, help="pipeline stages (across nodes)")
    parser.add_argument("--seq-len", type=int, default=4096)
    parser.add_argument("--micro-batch", type=int, default=1, help="sequences per micro-batch")
    parser.add_argument(
        "--microbatches", type=int, default=4, help="micro-batches per step (accumulation / 1F1B)"
    )
    parser.add_argument(
        "--dtype",
        default="bf16",
        type=dtype,
        help="bf16 or fp32 (TorchTitan's bfloat16 / float32 also work)",
    )
    parser.add_argument("--ac", default="none", choices=AC_MODES, help="activation checkpointing")
    parser.add_argument("--rmsnorm", default="online", choices=RMSNORM_MODES, help="btp's RMSNorm")
    parser.add_argument(
        "--group-linears",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="group the q/k/v and gate/up down-projections",
    )
    parser.add_argument(
        "--overlap-chunks",
        type=int,
        default=1,
        choices=OVERLAP_CHUNKS,
        help="[boost] overlap_chunks: forward all-reduces in that many overlapped blocks",
    )
    parser.add_argument(
        "--gpu",
        type=csv,
        default=["a100", "h100"],
        help=f"comma list of {', '.join(GPUS)}; speedups use the first",
    )


def sweep_from_args(ns: argparse.Namespace) -> dict:
    """Keyword arguments of `predict.sweep` from the options of `add_layout_args`."""
    return dict(
        flavors=ns.flavor,
        arch=ns.arch,
        strategies=ns.strategy,
        tps=ns.tp,
        gpus=ns.gpu,
        pp=ns.pp,
        seq_len=ns.seq_len,
        micro_batch=ns.micro_batch,
        microbatches=ns.microbatches,
        dtype=ns.dtype,
        ac=ns.ac,
        rmsnorm=ns.rmsnorm,
        group_linears=ns.group_linears,
        overlap_chunks=ns.overlap_chunks,
    )
