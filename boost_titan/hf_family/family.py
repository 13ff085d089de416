"""The `hf` family's hooks for the checks before launch (`runtime.family.ModelFamily`)."""

from __future__ import annotations

from boost_titan.runtime.family import ModelFamily

NAME = "hf"


def _register() -> None:
    from .spec import register_spec

    register_spec()


def _validate(job, world: int) -> None:
    from .spec import validate_job

    validate_job(job, world)


def _vocab(job) -> int:
    from .spec import job_args

    return job_args(job).vocab_size


def _describe(job) -> str:
    from .spec import job_args

    args = job_args(job)
    return f"{args.folder}, arch {args.arch}, rank {args.rank}, vocab {args.vocab_size}"


def _layout(job) -> str:
    from .spec import job_args, strategy_of

    args = job_args(job)
    strategy = strategy_of(job, args)
    return f" ({args.folder}, {args.arch}, tp_strategy {job.boost.tp_strategy} -> {strategy})"


FAMILY = ModelFamily(
    name=NAME,
    register=_register,
    validate_job=_validate,
    vocab_size=_vocab,
    describe=_describe,
    layout=_layout,
    saved_with="the model.hf_assets_path and [boost] arch and rank it was saved with",
)
