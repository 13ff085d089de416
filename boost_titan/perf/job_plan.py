"""The model's plan for a training job's TOML: what `python -m boost_titan.train` would run.

    python -m boost_titan.bench model --config train_configs/7B.toml --nproc 4

Read without torch or torchtitan: the TOML's values, else TorchTitan 0.2.2's defaults
(`TITAN_DEFAULTS`, from `torchtitan/config/job_config.py`; tests/unit/test_step_model.py checks
them against TorchTitan's dataclasses) and our `[boost]` section's (`boost_titan.config`).
The layout comes from `boost_titan.config.world.resolve_world` (the process count, `--nproc`,
else the fewest the degrees allow), the precision from `config.precision.Precision`
(what the trainer applies), float8 from `model.converters` and `[quantize.linear.float8]`.
Anything the model does not price is a one-line ConfigError naming the key; a data-parallel
degree > 1 is priced per replica, with a notice (FSDP / DDP traffic is not modelled);
context parallelism is priced per rank (`TrainingLayout.cp`, `timing.ring_times`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields
from types import SimpleNamespace
from typing import Any

from boost_titan.boost_llama.shapes import ModelShape
from boost_titan.config import Boost
from boost_titan.config.cli import load_toml
from boost_titan.config.errors import ConfigError
from boost_titan.config.optimizer import LORO
from boost_titan.perf import float8_costs, memory
from boost_titan.perf.layout import DTYPE_ALIASES, TrainingLayout, check, trained_shape

TITAN_DEFAULTS: dict[str, dict[str, Any]] = {
    "model": {"name": "llama3", "flavor": "debugmodel", "converters": []},
    "training": {
        "local_batch_size": 8,
        "global_batch_size": -1,
        "seq_len": 2048,
        "steps": 10000,
        "dtype": "float32",
        "mixed_precision_param": "bfloat16",
        "mixed_precision_reduce": "float32",
    },
    "parallelism": {
        "data_parallel_replicate_degree": 1,
        "data_parallel_shard_degree": -1,
        "tensor_parallel_degree": 1,
        "pipeline_parallel_degree": 1,
        "context_parallel_degree": 1,
        "pipeline_parallel_microbatch_size": 1,
        "pipeline_parallel_schedule": "1F1B",
        "disable_loss_parallel": False,
    },
    "activation_checkpoint": {"mode": "selective", "selective_ac_option": "2"},
    "compile": {"enable": False, "components": ["model", "loss"]},
    "quantize.linear.float8": {"recipe_name": None, "filter_fqns": [], "emulate": False},
    "optimizer": {"name": "AdamW"},
}
"""The TorchTitan keys the model reads, with TorchTitan 0.2.2's defaults."""
BOOST_MODEL = "boost_llama"
SCHEDULE = "1F1B"
"""The pipeline schedule the model prices."""
AC = {"none": "none", "full": "full", "selective": "selective"}
"""TorchTitan's activation_checkpoint.mode -> the model's `ac` (selective: every 2nd block)."""


@dataclass(frozen=True)
class JobPlan:
    """A job as the model prices it."""

    flavor: str
    args: ModelShape
    plan: TrainingLayout
    summary: str
    """One line: processes, layout, batch and precision."""
    notices: tuple[str, ...]
    dp_shard: int = 1
    """FSDP's shard degree: the weights, gradients and optimizer state are split over it."""

    def peak_memory(self) -> memory.StageMemory:
        """The busiest rank's peak: the one memory model `plan`, `bench model --config`,
        `check` and the trainer's first step all use (FSDP sharding included)."""
        return memory.peak_memory(self.args, self.plan, dp_shard=self.dp_shard)


def _read(path: str) -> SimpleNamespace:
    """The TOML's sections over the defaults, as attributes (`job.training.seq_len`); each
    value read must have its default's type (a string where the default is None)."""
    if not os.path.isfile(path):
        raise ConfigError(f"config file {path} not found; pass an existing --config TOML")
    data = load_toml(path)
    sections = TITAN_DEFAULTS | {"boost": {f.name: getattr(Boost(), f.name) for f in fields(Boost)}}
    job = SimpleNamespace()
    for section, defaults in sections.items():
        table: Any = data
        for part in section.split("."):
            table = table.get(part, {}) if isinstance(table, dict) else None
        if not isinstance(table, dict):
            raise ConfigError(f"{section} in {path} must be a [{section}] table")
        values = defaults | {k: v for k, v in table.items() if k in defaults}
        for key, value in values.items():
            kind = type(defaults[key]) if defaults[key] is not None else str
            if value is not None and type(value) is not kind:
                raise ConfigError(
                    f"{section}.{key} = {value!r} in {path} must be of type "
                    f"{kind.__name__}; fix the TOML"
                )
        setattr(job, section.rpartition(".")[2], SimpleNamespace(**values))
    return job


def _precision(job: SimpleNamespace, fsdp: bool, path: str) -> tuple[str, bool]:
    """(GEMM dtype, master weights) of the run, as `config.precision.Precision` decides."""
    from boost_titan.config.precision import Precision

    t = job.training
    for key in ("dtype", "mixed_precision_param"):
        if getattr(t, key) not in DTYPE_ALIASES:
            raise ConfigError(
                f"training.{key} = {getattr(t, key)!r} in {path} is not modelled; "
                f"use one of {', '.join(DTYPE_ALIASES)}"
            )
    precision = Precision.of(t)
    if precision.weights == "float32":
        return DTYPE_ALIASES[precision.compute], True
    compute = precision.compute if fsdp else precision.weights
    if compute != precision.weights:
        raise ConfigError(
            f"bf16 weights computed in {compute} (FSDP upcast) are not modelled; "
            'set training.mixed_precision_param = "bfloat16"'
        )
    return "bf16", False


def _float8(job: SimpleNamespace, path: str) -> tuple[str | None, tuple[str, ...]]:
    converters = job.model.converters
    unknown = [c for c in converters if c != float8_costs.CONVERTER]
    if unknown:
        raise ConfigError(
            f"model.converters {unknown[0]!r} in {path} is not modelled; the model "
            f"prices {float8_costs.CONVERTER} only"
        )
    if not converters:
        return None, ()
    f8 = job.float8
    if f8.emulate:
        raise ConfigError(
            f"[quantize.linear.float8] emulate in {path} dequantises every GEMM "
            "(a CPU test mode); the model prices real float8 GEMMs: drop emulate"
        )
    recipe = f8.recipe_name or "tensorwise"  # TorchTitan: no recipe_name = tensorwise
    return recipe, tuple(f8.filter_fqns)


def _ac(job: SimpleNamespace, path: str) -> str:
    mode, option = job.activation_checkpoint.mode, job.activation_checkpoint.selective_ac_option
    if mode not in AC:
        raise ConfigError(
            f"activation_checkpoint.mode {mode!r} in {path} is not modelled; "
            f"use one of {', '.join(AC)}"
        )
    if mode == "selective" and str(option) != "2":
        raise ConfigError(
            f"activation_checkpoint.selective_ac_option {option!r} in {path} is not "
            'modelled; the model prices "2" (every 2nd block)'
        )
    if mode == "none" and job.boost.lowrank_ac:
        return "lowrank"
    return AC[mode]


def loro_exact_every(job: SimpleNamespace) -> int:
    """K of a LORO job (`[boost] loro_exact_every`, `perf.loro` prices its exact step), 0
    for any other optimizer (Adam's step costs AdamW's)."""
    return job.boost.loro_exact_every if job.optimizer.name == LORO else 0


def job_plan(path: str, nproc: int | None = None) -> JobPlan:
    """The model's plan of the job in TOML `path` on `nproc` processes (None: the fewest
    its degrees allow); ConfigError (one line) for what the model cannot price."""
    return plan_of(_read(path), nproc, path)


def config_view(job_config: Any) -> SimpleNamespace:
    """A parsed TorchTitan JobConfig (overrides applied) seen as `_read` sees a TOML: the
    sections the model reads, by their last name (`quantize.linear.float8` -> `float8`)."""
    job = SimpleNamespace()
    for section in (*TITAN_DEFAULTS, "boost"):
        value = job_config
        for part in section.split("."):
            value = getattr(value, part)
        setattr(job, section.rpartition(".")[2], value)
    return job


def plan_of(
    job: SimpleNamespace, nproc: int | None, path: str, vocab_size: int | None = None
) -> JobPlan:
    """`job_plan` of a job already read (`_read`, `config_view`); `path` names it in
    messages; `vocab_size`: the tokenizer's, where known (else the flavor's)."""
    from boost_titan.boost_llama.shapes import flavor_shape
    from boost_titan.boost_llama.strategies import resolve_strategy
    from boost_titan.config.world import check_batch, resolve_world

    if job.model.name != BOOST_MODEL:
        raise ConfigError(
            f"model.name {job.model.name!r} in {path}: not priced, the perf model prices "
            f"family {BOOST_MODEL} only"
        )
    world, degrees = resolve_world(job, nproc)
    global_batch = check_batch(job, degrees)
    p, t = job.parallelism, job.training
    if degrees["pp"] > 1 and p.pipeline_parallel_schedule != SCHEDULE:
        raise ConfigError(
            f"pipeline_parallel_schedule {p.pipeline_parallel_schedule!r} is not "
            f"modelled; the model prices {SCHEDULE}"
        )
    if p.disable_loss_parallel:
        raise ConfigError(
            "disable_loss_parallel is not modelled; the model prices loss parallelism"
        )
    dp = degrees["dp_shard"] * degrees["dp_replicate"]
    local, seq = t.local_batch_size, t.seq_len
    accumulation = global_batch // (local * dp)
    micro, microbatches = local, accumulation
    if degrees["pp"] > 1:
        micro = p.pipeline_parallel_microbatch_size
        if accumulation > 1:
            raise ConfigError(
                "with pipeline parallelism the model prices one schedule per step: "
                "set global_batch_size = local_batch_size x data-parallel degree "
                "(gradient_accumulation_steps 0 or 1)"
            )
        microbatches = local // micro
    strategy = resolve_strategy(job.boost.arch, job.boost.tp_strategy).name
    dtype, master = _precision(job, degrees["dp_shard"] > 1 or degrees["cp"] > 1, path)
    recipe, filters = _float8(job, path)
    compiled = job.compile.enable and "model" in job.compile.components
    plan = TrainingLayout(
        strategy=strategy,
        tp=degrees["tp"],
        pp=degrees["pp"],
        cp=degrees["cp"],
        seq_len=seq,
        micro_batch=micro,
        microbatches=microbatches,
        dtype=dtype,
        ac=_ac(job, path),
        rmsnorm=job.boost.rmsnorm,
        group_linears=job.boost.group_linears,
        overlap_chunks=job.boost.overlap_chunks,
        master_weights=master,
        float8=recipe,
        float8_filter=filters,
        float8_casts="fused" if compiled else "eager",
        compiled=compiled,
        cuda_graphs=job.boost.cuda_graphs,
        loro_exact_every=loro_exact_every(job),
    )
    flavor = job.model.flavor
    args = trained_shape(flavor, job.boost.arch, strategy)
    vocab = vocab_size or args.vocab_size
    if job.boost.rank or job.boost.lax_base != args.lax_base or vocab != args.vocab_size:
        args = flavor_shape(
            flavor,
            arch=args.arch,
            rank=job.boost.rank,
            lax_base=job.boost.lax_base,
            vocab_size=vocab,
        )
        args.validate()
    check(args, plan)
    layout = " x ".join(f"{k} {v}" for k, v in degrees.items() if v > 1) or "one device"
    summary = (
        f"{path}: {flavor} {args.arch}, {strategy}, {world} process{'es' * (world > 1)} "
        f"({layout}), micro-batch {micro} x {microbatches}, seq {seq}, {plan.precision}"
    )
    if plan.loro_exact_every:
        summary += f", LORO exact step every {plan.loro_exact_every}"
    notices = ()
    if dp > 1:
        notices = (
            f"notice: priced per data-parallel replica; the data-parallel traffic over "
            f"{dp} replicas is not modelled",
        )
    if degrees["cp"] > 1:
        notices += (
            f"notice: FSDP2 shards the weights over cp {degrees['cp']} too; its traffic "
            "is not modelled here (plan --auto prices it)",
        )
    return JobPlan(flavor, args, plan, summary, notices, dp_shard=degrees["dp_shard"])


def process_count(nproc: str | None) -> int | None:
    """The processes a job runs on: `nproc` if given, else $NGPU, else None (the fewest its
    degrees allow); ConfigError for anything but a positive integer."""
    nproc = nproc if nproc is not None else os.environ.get("NGPU")
    if nproc is not None and (not str(nproc).isdigit() or int(nproc) < 1):
        raise ConfigError(
            f"process count {nproc!r} is not a positive integer; pass --nproc N with N >= 1"
        )
    return None if nproc is None else int(nproc)
