"""Held-out loss and perplexity of a trained model over a dataset.

    python -m boost_titan.eval --checkpoint DIR [--arch A] [--dataset-path P] [--json OUT]
    torchrun --nproc_per_node=N -m boost_titan.eval --checkpoint DIR [--tp T] ...

DIR is a DCP step folder (any parallelism; the shapes give the model, `--arch` and friends
what they cannot, as for `boost_titan.export`) or an export. The data default to the
default corpus's held-out split; `--dataset-path` takes the training formats. The windows
and the loss are those of validation during training (`boost_titan.data.held_out`,
`boost_titan.runtime.held_out_loss.evaluate`): the same checkpoint, data, seq_len, batch size
and steps give the same number as the run's `validate` line. Under torchrun the model is
sharded with the training TP plan over `--tp` ranks (default: all of them), the rest
split the batches as data-parallel ranks. Rank 0 shows a progress bar on stderr and prints
the result as one JSON line on stdout (also written to `--json`). Bad input: one `error:`
line, exit 2.
"""

from __future__ import annotations

import json
import os
import sys
import time
import warnings
from typing import Any

import datasets
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torchtitan.components.loss import IGNORE_INDEX, cross_entropy_loss
from torchtitan.distributed.utils import get_train_context
from tqdm import tqdm

from boost_titan.boost_llama.load_trained import (
    add_model_options,
    build,
    fail_worker,
    load_tokenizer_for,
    locate_from,
)
from boost_titan.boost_llama.strategies import strategy_names
from boost_titan.config.cli import OneLineParser
from boost_titan.config.errors import ConfigError
from boost_titan.data.held_out import build_validation_batches, data_at
from boost_titan.parallelize.teardown import run_to_end
from boost_titan.runtime.held_out_loss import HeldOutLoss, evaluate

CPU_MESH_WARNING = r"DTensor .* may not have complete support on cpu device mesh"


def parser() -> OneLineParser:
    p = OneLineParser(
        prog="python -m boost_titan.eval",
        description=(
            "Loss and perplexity of a DCP checkpoint or an export over a dataset (default: "
            "the held-out split of the default corpus), on one process or under torchrun "
            "with tensor parallelism. Prints one JSON line."
        ),
    )
    add_model_options(p)
    p.add_argument(
        "--dataset-path",
        metavar="PATH",
        help="a .jsonl/.json/.parquet/.txt file or folder (as --training.dataset_path); "
        "default: the default corpus's held-out split",
    )
    p.add_argument(
        "--seq-len",
        type=int,
        default=256,
        metavar="N",
        help="tokens per sequence (default 256, debug.toml's; use the run's "
        "validation.seq_len to reproduce its validation)",
    )
    p.add_argument(
        "--batch-size",
        type=int,
        default=8,
        metavar="N",
        help="sequences per data-parallel rank and batch (default 8)",
    )
    p.add_argument(
        "--steps",
        type=int,
        default=-1,
        metavar="N",
        help="evaluate the first N global batches (default -1: every sequence)",
    )
    p.add_argument(
        "--tp",
        type=int,
        metavar="N",
        help="tensor-parallel degree under torchrun (default: the world size)",
    )
    p.add_argument(
        "--tp-strategy",
        default="auto",
        choices=strategy_names(auto=True),
        help="TP plan (default auto: btp for low-rank archs, megatron for fullrank)",
    )
    p.add_argument("--json", metavar="FILE", help="also write the result to FILE")
    return p


def _check_sizes(ns, world: int) -> int:
    """The TP degree; ConfigError for sizes that cannot work."""
    for name in ("seq_len", "batch_size"):
        if getattr(ns, name) < 1:
            raise ConfigError(f"--{name.replace('_', '-')} {getattr(ns, name)} must be >= 1")
    if ns.steps == 0 or ns.steps < -1:
        raise ConfigError(f"--steps {ns.steps} must be >= 1, or -1 for every sequence")
    tp = ns.tp or world
    if tp < 1 or world % tp:
        raise ConfigError(f"--tp {tp} does not divide the {world} processes; pick a divisor")
    return tp


def _device() -> torch.device:
    if torch.cuda.is_available():
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
        return device
    return torch.device("cpu")


def run(ns) -> dict[str, Any]:
    """Evaluate as `ns` says; returns the result (the same on every rank)."""
    world = int(os.environ.get("WORLD_SIZE", 1))
    tp = _check_sizes(ns, world)
    source = locate_from(ns)
    if ns.seq_len > source.args.max_seq_len:
        raise ConfigError(
            f"--seq-len {ns.seq_len} exceeds the model's maximum "
            f"{source.args.max_seq_len}; lower it"
        )
    tokenizer = load_tokenizer_for(ns.tokenizer, source.args)
    data = data_at(ns.dataset_path, "--dataset-path")
    device = _device()
    rank, dp_rank, tp_mesh = 0, 0, None
    if world > 1:
        warnings.filterwarnings("ignore", message=CPU_MESH_WARNING, category=UserWarning)
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
        rank = dist.get_rank()
        mesh = init_device_mesh(device.type, (world // tp, tp), mesh_dim_names=("dp", "tp"))
        dp_rank, tp_mesh = mesh["dp"].get_local_rank(), mesh["tp"]
    batches = build_validation_batches(
        data, tokenizer, ns.seq_len, ns.batch_size, ns.steps, dp_rank=dp_rank, dp_degree=world // tp
    )
    model = build(source, device, tp_mesh, ns.tp_strategy)
    context = get_train_context(tp > 1)  # loss parallel, as training's TP runs

    def batch_loss(input_dict, labels):
        with context():
            loss = cross_entropy_loss(model(input_dict["input"]), labels)
        return loss, (labels != IGNORE_INDEX).sum()

    start = time.perf_counter()
    progress = tqdm(batches, desc="eval", unit="batch", disable=rank != 0, file=sys.stderr)
    owner = tp_mesh is None or tp_mesh.get_local_rank() == 0
    result: HeldOutLoss = evaluate(progress, batch_loss, owner, device)
    return {
        "checkpoint": source.path,
        "kind": source.kind,
        "data": data.describe(),
        "loss": result.loss,
        "perplexity": result.perplexity,
        "tokens": result.tokens,
        "seq_len": ns.seq_len,
        "batch_size": ns.batch_size,
        "steps": ns.steps,
        "tp": tp,
        "world_size": world,
        "seconds": round(time.perf_counter() - start, 3),
    }


def main(argv: list[str] | None = None) -> None:
    """CLI entry: one `error:` line and exit 2 on bad input; one JSON line on success."""
    ns = parser().parse_args(sys.argv[1:] if argv is None else argv)
    datasets.disable_progress_bars()  # "Generating train split": our bar is the one to watch
    try:
        result = run(ns)
        if int(os.environ.get("RANK", 0)) == 0:
            write_result(result, ns.json)
    except ConfigError as e:
        fail_worker(str(e))


def write_result(result: dict[str, Any], path: str | None) -> None:
    """Print `result` as one JSON line, and write it to `path` if given."""
    line = json.dumps(result)
    if path:
        try:
            with open(path, "w") as f:
                f.write(line + "\n")
        except OSError as e:
            raise ConfigError(
                f"cannot write --json {path} ({e.strerror}); choose a writable path"
            ) from None
    print(line, flush=True)


if __name__ == "__main__":
    run_to_end(main)  # under torchrun: the ranks meet, the groups end, no finalization
