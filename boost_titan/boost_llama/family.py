"""`boost_llama`'s hooks for the checks before launch (`runtime.family.ModelFamily`)."""

from __future__ import annotations

from boost_titan.runtime.family import ModelFamily, spec_hooks

NAME = "boost_llama"


def _describe(job) -> str:
    from .spec import job_args

    args = job_args(job)
    return (
        f"{job.model.flavor}, arch {job.boost.arch}, rank {args.effective_rank}, vocab "
        f"{args.vocab_size}"
    )


def _layout(job) -> str:
    from .strategies import resolve_strategy

    strategy = resolve_strategy(job.boost.arch, job.boost.tp_strategy).name
    return f" ({job.boost.arch}, tp_strategy {job.boost.tp_strategy} -> {strategy})"


def _export_folder(path: str) -> None:
    from .state_dict_adapter import check_export_files

    check_export_files(path)


def _initial_export(job) -> None:
    from .spec import job_args
    from .state_dict_adapter import check_export

    check_export(job.checkpoint.initial_load_path, job_args(job))


FAMILY = ModelFamily(
    name=NAME,
    **spec_hooks(f"{__package__}.spec"),
    describe=_describe,
    layout=_layout,
    saved_with="the model.flavor, [boost] arch and rank, and tokenizer it was saved with",
    check_export_folder=_export_folder,
    check_initial_export=_initial_export,
)
