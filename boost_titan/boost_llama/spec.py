"""The `boost_llama` TrainSpec: our model and plans on TorchTitan's trainer components.

Importing this module registers nothing: `register_spec()` does, once per process (the
training worker, and `check`, which looks the model's TrainSpec up by name). `validate_job`
checks a job's model and parallelism in one process, before any process group exists.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterator, Mapping

from torchtitan.components.loss import build_cross_entropy_loss
from torchtitan.components.lr_scheduler import build_lr_schedulers
from torchtitan.distributed.pipeline_parallel import pipeline_llm
from torchtitan.protocols.train_spec import TrainSpec, register_train_spec

from boost_titan.config.errors import ConfigError
from boost_titan.config.optimizer import LoroSettings
from boost_titan.data import build_dataloader, build_tokenizer
from boost_titan.data.held_out import validation_data
from boost_titan.data.prepared_check import check_prepared
from boost_titan.runtime.context_parallel import validate_context_parallel
from boost_titan.runtime.held_out_loss import BoostValidator
from boost_titan.runtime.job_float8 import install_converter, validate_float8
from boost_titan.runtime.optimizers import optimizers_builder

from .args import FLAVORS, BoostModelArgs, flavor_args
from .model import BoostTransformer
from .parallelize import parallelize_boost
from .shapes import flavor_shape, param_count
from .state_dict_adapter import BoostStateDictAdapter
from .strategies import resolve_strategy, sizes

SPEC_NAME = "boost_llama"


class _FreshFlavors(Mapping):
    """Flavor table that hands out copies: TorchTitan mutates the args it gets."""

    def __getitem__(self, flavor: str) -> BoostModelArgs:
        return flavor_args(flavor)

    def __iter__(self) -> Iterator[str]:
        return iter(FLAVORS)

    def __len__(self) -> int:
        return len(FLAVORS)


def job_args(job_config) -> BoostModelArgs:
    """The flavor's args updated from the job (arch, rank, vocab from the tokenizer...)."""
    args = flavor_args(job_config.model.flavor)
    args.update_from_config(job_config)
    return args


def _require_divisible(what: str, value: int, tp: int, strategy: str) -> None:
    if value % tp:
        raise ConfigError(
            f"{what} {value} is not divisible by tensor_parallel_degree {tp} "
            f"(needed by tp_strategy {strategy}); choose a TP degree that divides it"
        )


def validate_parallelism(args: BoostModelArgs, boost, parallelism) -> str:
    """Check the strategy against the arch and the shapes against the degrees; return the
    resolved strategy's name."""
    strategy = resolve_strategy(args.arch, boost.tp_strategy)
    tp = parallelism.tensor_parallel_degree
    if tp > 1:
        values = sizes(args)
        for size in strategy.divisible:
            _require_divisible(size, values[size], tp, strategy.name)
    pp = parallelism.pipeline_parallel_degree
    if pp > args.n_layers:
        raise ConfigError(
            f"pipeline_parallel_degree {pp} exceeds the model's {args.n_layers} layers; "
            "lower the PP degree"
        )
    if boost.lowrank_ac and not args.low_rank:
        raise ConfigError("[boost] lowrank_ac needs a low-rank arch; set arch or turn it off")
    return strategy.name


TOY_CORPUS_LIMIT = 10**9
"""Full-rank parameters from which a flavor needs real data (1B and larger)."""


def refuse_toy_corpus(job_config) -> None:
    """A flavor of 1B parameters or more (full-rank count) may not train on the built-in
    toy corpus or tokenizer unless `[boost] allow_toy_corpus`: one line naming the options."""
    from boost_titan.data.corpus import STDLIB, resolve_dataset
    from boost_titan.data.tokenizer import locate_tokenizer

    flavor = job_config.model.flavor
    training = job_config.training
    full_rank = dataclasses.replace(flavor_shape(flavor), arch="fullrank")
    if job_config.boost.allow_toy_corpus or param_count(full_rank) < TOY_CORPUS_LIMIT:
        return
    toy = []
    own = job_config.boost.data_mix  # prepared datasets
    if not own and resolve_dataset(training.dataset, training.dataset_path)[0] == STDLIB:
        toy.append(("the built-in toy corpus", "--training.dataset_path (your corpus)"))
    if locate_tokenizer(job_config.model.hf_assets_path)[0] == "default":
        toy.append(
            (
                "the built-in 4096-token tokenizer",
                "--model.hf_assets_path (a tokenizer folder, e.g. Llama 3's original/)",
            )
        )
    if toy:
        raise ConfigError(
            f"the {flavor} model would train with {' and '.join(w for w, _ in toy)}; pass "
            f"{' and '.join(o for _, o in toy)} (docs/gpus.md), or --boost.allow_toy_corpus "
            "to go ahead anyway"
        )


def validate_validation(job_config, args: BoostModelArgs) -> None:
    """Check an enabled `[validation]` section: its sizes and its documents' path."""
    validation = job_config.validation
    if not validation.enable:
        return
    if validation.freq < 1 or validation.local_batch_size < 1 or validation.seq_len < 1:
        raise ConfigError(
            "validation.freq, local_batch_size and seq_len must be >= 1; "
            "fix the [validation] section"
        )
    if validation.seq_len > args.max_seq_len:
        raise ConfigError(
            f"validation.seq_len {validation.seq_len} exceeds the {job_config.model.flavor} "
            f"flavor's maximum {args.max_seq_len}; lower --validation.seq_len or raise "
            "--boost.max_seq_len"
        )
    validation_data(job_config)


def validate_job(job_config, world_size: int) -> None:
    """Raise ConfigError for a model, parallelism or validation setting that cannot work."""
    if job_config.model.name != SPEC_NAME:
        return
    refuse_toy_corpus(job_config)
    args = job_args(job_config)
    validate_parallelism(args, job_config.boost, job_config.parallelism)
    validate_context_parallel(job_config)
    validate_validation(job_config, args)
    validate_float8(job_config)
    if job_config.boost.lowrank_ac and job_config.activation_checkpoint.mode != "none":
        raise ConfigError(
            "[boost] lowrank_ac and [activation_checkpoint] mode = "
            f"{job_config.activation_checkpoint.mode!r} both checkpoint activations; keep one"
        )


def _build_dataloader(dp_world_size: int, dp_rank: int, tokenizer, job_config):
    refuse_toy_corpus(job_config)  # also for a worker started without `check`
    check_prepared(job_config, None)
    return build_dataloader(dp_world_size, dp_rank, tokenizer, job_config)


def _parallelize(model, parallel_dims, job_config):
    validate_parallelism(model.args, job_config.boost, job_config.parallelism)
    validate_context_parallel(job_config)
    return parallelize_boost(model, parallel_dims, job_config)


def _loro_of(part) -> tuple[int, LoroSettings]:
    """A model part's (PP: stage's) hidden size and the job's LORO settings."""
    return part.args.dim, part.args.loro


def build_spec() -> TrainSpec:
    return TrainSpec(
        model_cls=BoostTransformer,
        model_args=_FreshFlavors(),
        parallelize_fn=_parallelize,
        pipelining_fn=pipeline_llm,
        build_optimizers_fn=optimizers_builder(_loro_of),  # LORO, else TorchTitan's
        build_lr_schedulers_fn=build_lr_schedulers,
        build_dataloader_fn=_build_dataloader,
        build_tokenizer_fn=build_tokenizer,
        build_loss_fn=build_cross_entropy_loss,
        build_validator_fn=BoostValidator,
        state_dict_adapter=BoostStateDictAdapter,  # --checkpoint.initial_load_in_hf: exports
    )


@functools.cache
def register_spec() -> None:
    """Register the `boost_llama` TrainSpec with TorchTitan, and its float8 converter (models
    of this spec get `quantize.linear.float8` from `parallelize_boost`); once per process."""
    register_train_spec(SPEC_NAME, build_spec())
    install_converter(SPEC_NAME)


__all__ = ["SPEC_NAME", "job_args", "register_spec", "validate_job"]
