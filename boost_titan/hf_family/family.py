"""The `hf` family's hooks for the checks before launch (`runtime.family.ModelFamily`)."""

from __future__ import annotations

from boost_titan.runtime.family import ModelFamily, spec_hooks

NAME = "hf"


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
    **spec_hooks(f"{__package__}.spec"),
    describe=_describe,
    layout=_layout,
    saved_with="the model.hf_assets_path and [boost] arch and rank it was saved with",
)
