"""A job's predicted memory against a GPU's: the line `check` prints, and the prediction a
run's first step is compared with (`runtime.trainer`, through the `train` command).

Both price the job as `bench model --config` and `plan --auto` do (`JobPlan.peak_memory`,
`perf.memory`), from the parsed config with its overrides (`job.config_view`). Where the
job's GPU is unknown (no CUDA device here) `check` assumes `plan --auto`'s default profile
and says so.
"""

from __future__ import annotations

from typing import Any

from boost_titan.config.errors import ConfigError
from boost_titan.perf import loro, memory
from boost_titan.perf.job_plan import JobPlan, config_view, plan_of
from boost_titan.perf.layout_search import GPU_MEMORY_GIB, USABLE

DEFAULT_GPU = "a100"
"""The profile `plan --auto` plans for when no `--gpu` is given."""


NOT_FIT = "does NOT fit"
"""What the memory line says of a job that does not fit its GPU (`check` then exits 2)."""


def job_of(
    job_config: Any, world: int, vocab_size: int | None = None, where: str | None = None
) -> JobPlan:
    """The model's plan of a parsed job on `world` processes, with the tokenizer's
    `vocab_size` where known; ConfigError (one line) for what the model does not price,
    naming the job as `where` (default: its config file)."""
    where = where or job_config.job.config_file or "the job"
    return plan_of(config_view(job_config), world, where, vocab_size)


def fit_line(job: JobPlan, gpu: str, capacity_gib: float, assumed: bool) -> str:
    """`memory: predicted 27.8 GiB per GPU (busiest rank, vocab 32,000; boost_titan.perf) of
    the h100's 80 GiB: fits, ...` or `...: does NOT fit ...`; `assumed`: the GPU is a
    guess. The vocabulary is the tokenizer's where `check` knows it (`plan --auto` and
    `bench model` price the flavor's)."""
    peak = job.peak_memory().total / memory.GIB
    usable = USABLE * capacity_gib
    if assumed:
        of = f"an assumed {capacity_gib:g} GiB {gpu} (no CUDA device here: plan --auto's default)"
        elsewhere = "; or run check on the job's GPU, which it then compares with"
    else:
        of, elsewhere = f"the {gpu}'s {capacity_gib:.1f} GiB", ""
    head = (
        f"memory: predicted {peak:.1f} GiB per GPU (busiest rank, vocab "
        f"{job.args.vocab_size:,}; boost_titan.perf) of {of}"
    )
    head += _loro_clause(job)
    if peak <= usable:
        return f"{head}: fits, {usable - peak:.1f} GiB left of the {USABLE:.0%} usable"
    return (
        f"{head}: {NOT_FIT} the {USABLE:.0%} usable ({usable:.1f} GiB) by "
        f"{peak - usable:.1f} GiB; lower training.local_batch_size (raise "
        "[boost] gradient_accumulation_steps), add activation checkpointing, or use more TP, "
        f"PP or FSDP (python -m boost_titan.plan --auto){elsewhere}"
    )


def _loro_clause(job: JobPlan) -> str:
    """What LORO adds to the memory line: its state is AdamW's; its exact step's transient
    (`loro.transient_bytes`) at the optimizer step, and whether it sets the peak."""
    if not job.plan.loro_exact_every:
        return ""
    peak = job.peak_memory()
    layers = memory.stage_layers(job.args.n_layers, job.plan.pp)[peak.stage]
    shards = job.dp_shard * job.plan.cp
    transient = loro.transient_bytes(job.args, job.plan, layers, shards) / 2**20
    sets = "sets the peak" if peak.parts.get(loro.EXACT_STEP) else "below the peak"
    return (
        f", LORO: AdamW's two moments, its exact step {transient:,.0f} MiB more at the "
        f"optimizer step ({sets})"
    )


def check_line(
    job_config: Any,
    world: int,
    vocab_size: int | None,
    device: tuple[str, float] | None,
    where: str | None = None,
) -> str:
    """`check`'s memory line for a parsed job on `world` processes with the tokenizer's
    `vocab_size`; `device` is the CUDA GPU's (name, GiB), None without one (then
    `DEFAULT_GPU` is assumed); `where` names the job's source in messages."""
    try:
        job = job_of(job_config, world, vocab_size, where)
    except ConfigError as e:
        return f"memory: not predicted ({e})"
    if device is None:
        return fit_line(job, DEFAULT_GPU, GPU_MEMORY_GIB[DEFAULT_GPU], assumed=True)
    return fit_line(job, device[0], device[1], assumed=False)


def rank0_prediction(job_config: Any, world: int, vocab_size: int) -> tuple[int | None, str]:
    """(predicted peak bytes of rank 0, i.e. of the first pipeline stage, or None, and what
    the prediction covers or why there is none): what a run's first step is compared with."""
    try:
        job = job_of(job_config, world, vocab_size)
    except ConfigError as e:
        return None, f"not predicted: {e}"
    peak = memory.stage_memory(job.args, job.plan, 0, job.dp_shard)
    return peak.total, "boost_titan.perf.memory: weights, optimizer, gradients, activations"
