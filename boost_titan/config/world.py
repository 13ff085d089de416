"""The processes a job needs and the batch it trains: `--nproc`, the parallel degrees (the
data-parallel shard degree resolved), and the global batch checked against them. Read by
`check` (job.preflight) and priced by `bench model --config` (perf.job_plan)."""

from __future__ import annotations

import math
import os

from boost_titan.config import global_batch
from boost_titan.config.errors import ConfigError


def pop_nproc(args: list[str]) -> tuple[int | None, list[str]]:
    """Split `--nproc N` / `--nproc=N` off `args`; fall back to $NGPU."""
    rest: list[str] = []
    value: str | None = os.environ.get("NGPU") or None
    i = 0
    while i < len(args):
        key, eq, inline = args[i].partition("=")
        if key == "--nproc":
            if not eq and i + 1 >= len(args):
                raise ConfigError("--nproc needs a value; pass --nproc N (the number of processes)")
            value = inline if eq else args[i + 1]
            i += 1 if eq else 2
            continue
        rest.append(args[i])
        i += 1
    if value is None:
        return None, rest
    if not value.isdigit() or int(value) < 1:
        raise ConfigError(
            f"process count {value!r} is not a positive integer; pass --nproc N with N >= 1"
        )
    return int(value), rest


def parallel_degrees(job) -> dict[str, int]:
    """The non-data-shard degrees of `[parallelism]`, each checked to be >= 1."""
    p = job.parallelism
    degrees = {
        "dp_replicate": p.data_parallel_replicate_degree,
        "cp": p.context_parallel_degree,
        "tp": p.tensor_parallel_degree,
        "pp": p.pipeline_parallel_degree,
    }
    for name, degree in degrees.items():
        if degree < 1:
            raise ConfigError(f"[parallelism] {name} degree {degree} must be >= 1")
    return degrees


def resolve_world(job, nproc: int | None) -> tuple[int, dict[str, int]]:
    """World size and every degree (dp_shard -1 resolved); ConfigError on a mismatch."""
    degrees = parallel_degrees(job)
    others = 1
    for degree in degrees.values():
        others *= degree
    dp_shard = job.parallelism.data_parallel_shard_degree
    layout = " x ".join(f"{k} {v}" for k, v in degrees.items() if v > 1) or "no model parallelism"
    if dp_shard == -1:
        world = others if nproc is None else nproc
        if world % others:
            raise ConfigError(
                f"{world} process{'es' * (world > 1)} cannot hold {layout} ({others} per "
                f"data-parallel replica); use a multiple of {others} processes (--nproc / "
                f"NGPU){_fitting_degrees(degrees, world)}"
            )
        dp_shard = world // others
    elif dp_shard < 1:
        raise ConfigError(f"[parallelism] data_parallel_shard_degree {dp_shard} must be -1 or >= 1")
    else:
        world = others * dp_shard if nproc is None else nproc
        if others * dp_shard != world:
            raise ConfigError(
                f"the parallel degrees need {others * dp_shard} processes "
                f"(dp_shard {dp_shard} x {layout}) but {world} were requested; "
                f"set --nproc/NGPU to {others * dp_shard} or change [parallelism]"
            )
    return world, {"dp_shard": dp_shard, **degrees}


DEGREE_FLAGS = {
    "dp_replicate": "data_parallel_replicate_degree",
    "cp": "context_parallel_degree",
    "tp": "tensor_parallel_degree",
    "pp": "pipeline_parallel_degree",
}


def _fitting_degrees(degrees: dict[str, int], world: int) -> str:
    """ ", or fit the layout to N: --parallelism.X d ..." for a `world` smaller than the
    degrees' product (each degree cut to what the processes left allow), else ""."""
    left, flags = world, []
    for name in ("tp", "pp", "cp", "dp_replicate"):
        fitted = math.gcd(degrees[name], left)
        left //= fitted
        if fitted != degrees[name]:
            flags.append(f"--parallelism.{DEGREE_FLAGS[name]} {fitted}")
    others = math.prod(degrees.values())
    return f", or fit the layout to {world}: {' '.join(flags)}" if world < others else ""


def check_batch(job, degrees: dict[str, int]) -> int:
    """The global batch in sequences, checked to split into local batches over the
    data-parallel ranks (`boost_titan.config.global_batch`)."""
    t = job.training
    dp = degrees["dp_shard"] * degrees["dp_replicate"]
    for name, value, least, what in (
        ("local_batch_size", t.local_batch_size, 1, "sequences per rank and step"),
        ("seq_len", t.seq_len, 1, "tokens per sequence"),
        ("steps", t.steps, 0, "steps to train"),
    ):
        if value < least:
            raise ConfigError(
                f"training.{name} {value} must be >= {least} ({what}); set --training.{name} "
                f"to {least} or more"
            )
    batch = global_batch(t, job.boost, dp)
    micro = job.parallelism.pipeline_parallel_microbatch_size
    if degrees["pp"] > 1 and t.local_batch_size % micro:
        raise ConfigError(
            f"training.local_batch_size {t.local_batch_size} is not a multiple of "
            f"parallelism.pipeline_parallel_microbatch_size {micro}"
        )
    return batch
