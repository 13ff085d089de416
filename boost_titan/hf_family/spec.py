"""The `hf` TrainSpec: a Hugging Face causal LM (`model`) on our data, validator and
optimizers (TorchTitan's, or LORO: `runtime.optimizers`), sharded by the library's plans
on `hf_layout`.

The layouts it trains: tensor parallelism (`btp` for a low-rank arch, `megatron` for
fullrank, or `[boost] tp_strategy` btp / megatron / vanilla), FSDP2
(`data_parallel_shard_degree`), data parallelism by replication (DDP), fp32 or bf16
compute through `runtime.data_parallel`. What it does not (yet) is refused in one line by
`validate_job`, before any worker starts: PP, CP, compile, activation checkpointing and
float8.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping

from torchtitan.protocols.train_spec import TrainSpec, register_train_spec
from torchtitan.tools.logging import logger

from boost_titan.config.errors import ConfigError
from boost_titan.config.optimizer import check_loro_pairs
from boost_titan.config.precision import Precision
from boost_titan.data import build_dataloader, tokenizer_vocab_size
from boost_titan.parallelize import apply_plan, btp_plan, megatron_plan, vanilla_plan
from boost_titan.parallelize.styles import PlanError
from boost_titan.runtime.data_parallel import FsdpUnits, apply_data_parallel
from boost_titan.runtime.train_spec import recipe_spec

from .args import HfModelArgs
from .model import build_hf_model, family_layout

SPEC_NAME = "hf"
PLANS = {"btp": btp_plan, "megatron": megatron_plan, "vanilla": vanilla_plan}
"""`[boost] tp_strategy` -> the library's plan for this family (auto: btp when low-rank)."""


class _AnyFlavor(Mapping):
    """Every `model.flavor` names the folder's model (config.json is the shape): a fresh
    `HfModelArgs` for any key, as TorchTitan mutates the args it gets."""

    def __getitem__(self, flavor: str) -> HfModelArgs:
        return HfModelArgs()

    def __contains__(self, flavor: object) -> bool:
        return isinstance(flavor, str)

    def __iter__(self) -> Iterator[str]:
        return iter(("any: the folder's config.json",))

    def __len__(self) -> int:
        return 1


def job_args(job_config) -> HfModelArgs:
    """The job's model args (the folder's config, arch, rank)."""
    args = HfModelArgs()
    args.update_from_config(job_config)
    return args


def strategy_of(job_config, args: HfModelArgs) -> str:
    """The TP plan's name: `[boost] tp_strategy`, auto -> btp (low-rank) or megatron."""
    strategy = job_config.boost.tp_strategy
    if strategy == "auto":
        return "btp" if args.low_rank else "megatron"
    if strategy == "btp" and not args.low_rank:
        raise ConfigError("tp_strategy btp needs a low-rank arch; use auto or megatron")
    return strategy


def _refused(job_config) -> dict[str, bool]:
    """What this family does not train yet (module docstring), by the option that asks."""
    p, training = job_config.parallelism, job_config.training
    casts = Precision.of(training).casts_for_compute
    return {
        "pipeline_parallel_degree > 1": p.pipeline_parallel_degree > 1,
        "context_parallel_degree > 1": p.context_parallel_degree > 1,
        "compile.enable": job_config.compile.enable,
        f"activation_checkpoint.mode {job_config.activation_checkpoint.mode}": (
            job_config.activation_checkpoint.mode != "none"
        ),
        "[boost] lowrank_ac": job_config.boost.lowrank_ac,
        "[boost] cuda_graphs": job_config.boost.cuda_graphs,
        f"model.converters {job_config.model.converters}": bool(job_config.model.converters),
        "bf16 compute with dp_replicate > 1 or CPU offload": casts
        and (p.data_parallel_replicate_degree > 1 or training.enable_cpu_offload),
        "checkpoint.initial_load_in_hf": job_config.checkpoint.initial_load_in_hf,
    }


def validate_job(job_config, world_size: int) -> None:
    """ConfigError (one line) for a job this family cannot train (module docstring)."""
    refused = [what for what, on in _refused(job_config).items() if on]
    if refused:
        raise ConfigError(
            f"model.name hf does not support {refused[0]} yet; turn it off (TP, FSDP2, DDP and "
            "fp32 / bf16 compute train: docs/huggingface.md)"
        )
    args = job_args(job_config)
    strategy_of(job_config, args)
    between = args.activation is not None or args.crossing  # SiLU, or LaX's crossing
    check_loro_pairs(job_config.optimizer, args.arch, args.low_rank, between)
    tokens = tokenizer_vocab_size(job_config)
    if tokens > args.vocab_size:
        raise ConfigError(
            f"model.hf_assets_path {args.folder!r}: the tokenizer has {tokens} tokens but the "
            f"model embeds {args.vocab_size}; use the model's own tokenizer.json"
        )


def parallelize_hf(model, parallel_dims, job_config):
    """TP by the job's plan on `family_layout`, then FSDP2, DDP or compute copies
    (`runtime.data_parallel`; FSDP2's units: the embedding, each block, norm and head)."""
    validate_job(job_config, parallel_dims.world_size)
    args = model.boost_args
    if parallel_dims.tp_enabled:
        strategy = strategy_of(job_config, args)
        loss_parallel = not job_config.parallelism.disable_loss_parallel
        try:
            plan = PLANS[strategy](family_layout(model, args), loss_parallel=loss_parallel)
            apply_plan(model, parallel_dims.get_mesh("tp"), plan)
        except PlanError as e:
            raise ConfigError(f"model.name hf at TP {parallel_dims.tp}: {e}") from None
        logger.info(f"Applied {strategy} tensor parallelism (TP={parallel_dims.tp}) to {args.arch}")
    blocks = list(model.model.layers)
    units = FsdpUnits(model.model.embed_tokens, blocks, [model.model.norm, model.lm_head])
    apply_data_parallel(model, blocks, parallel_dims, job_config, False, units)
    return model


def build_spec() -> TrainSpec:
    return recipe_spec(
        model_cls=build_hf_model,
        model_args=_AnyFlavor(),
        parallelize_fn=parallelize_hf,
        loro_of=lambda part: (part.boost_args.hidden_size, part.boost_args.loro),
        build_dataloader_fn=build_dataloader,
    )


@functools.cache
def register_spec() -> None:
    """Register the `hf` TrainSpec with TorchTitan, once per process."""
    register_train_spec(SPEC_NAME, build_spec())


__all__ = ["SPEC_NAME", "job_args", "register_spec", "strategy_of", "validate_job"]
