"""Held-out loss and perplexity of a trained model over a dataset: what `python -m
boost_titan.eval` runs, on one process or on every rank under torchrun.

`evaluate_trained` loads the model (`load_trained`: a DCP step folder or an export),
sharded with the training TP plan over `--tp` ranks when there are several, the other
ranks splitting the batches as data-parallel ranks; it cuts the data into the windows of
validation during training (`data.held_out`) and scores them with training's loop
(`runtime.held_out_loss.evaluate`), under loss parallelism as training's TP runs, with a
progress bar on rank 0's stderr.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torchtitan.components.loss import IGNORE_INDEX, cross_entropy_loss
from torchtitan.distributed.utils import get_train_context
from tqdm import tqdm

from boost_titan.boost_llama.load_trained import build, load_tokenizer_for, locate_from
from boost_titan.config.errors import ConfigError
from boost_titan.data.held_out import build_validation_batches, data_at
from boost_titan.runtime.device import CPU_MESH_WARNING
from boost_titan.runtime.held_out_loss import HeldOutLoss, evaluate


def _check_sizes(ns: argparse.Namespace, world: int) -> int:
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


def evaluate_trained(ns: argparse.Namespace) -> dict[str, Any]:
    """Evaluate as `ns` (`python -m boost_titan.eval`'s options) says; returns the result
    (the same on every rank); ConfigError for bad input."""
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
