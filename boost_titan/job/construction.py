"""What a training worker builds before its first step, built by `check` in its own process
without a process group, through the job's TrainSpec (ours, TorchTitan's, or one a user
registers with `[experimental] custom_import`): a job `check` accepts does not die while
the trainer is constructed.

`train_spec` finds the TrainSpec as the worker does (importing `custom_import` first, which
the parse allowed); `build_model` builds the flavor's model on the meta device as
TorchTitan's `Trainer` does (the flavor's args updated from the job, the default dtype,
the parameter and FLOP count) and requires what the trainer calls on it afterwards
(`init_weights`). `build_titan_data` builds a TorchTitan-data TrainSpec's tokenizer,
training dataloader and, with validation on, TorchTitan's validation dataloader: our own
families' data (`job.families`: ours) is checked by the family's `validate_job` and
`preflight.check_data` instead. What needs a process group (`parallelize_fn`, the meshes)
is not built here.
Every failure is one ConfigError line naming the option to change.
"""

from __future__ import annotations

import copy
import importlib
import warnings

import torch
from torch import nn

from boost_titan.config.errors import ConfigError


def _reason(error: BaseException) -> str:
    """An exception as one short line."""
    text = " ".join(str(error).split())[:300]
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def train_spec(job):
    """The job's TrainSpec, after importing `experimental.custom_import` as the worker does
    (a user's TrainSpec registers itself there); ConfigError for an unknown name."""
    from torchtitan.protocols.train_spec import get_train_spec

    from boost_titan.job.families import FAMILIES, register_families

    register_families()
    module = job.experimental.custom_import
    if module:
        try:
            importlib.import_module(module)
        except Exception as e:  # the user's module, as every worker would import it
            raise ConfigError(
                f"experimental.custom_import {module!r} does not import ({_reason(e)}); fix "
                "the module or drop the option"
            ) from None
    try:
        return get_train_spec(job.model.name)
    except ValueError:
        raise ConfigError(
            f"unknown model.name {job.model.name!r}; use one of {', '.join(FAMILIES)}, one of "
            "TorchTitan's "
            "models (e.g. llama3), or register yours in the module named by "
            "--experimental.custom_import"
        ) from None


def flavor_args(spec, job):
    """The flavor's args updated from the job, as the trainer takes them (a copy: TorchTitan
    mutates the table's entry)."""
    name, flavor = job.model.name, job.model.flavor
    if flavor not in spec.model_args:
        raise ConfigError(
            f"model.flavor {flavor!r}: {name} has no such flavor; choose one of "
            f"{', '.join(map(str, spec.model_args))}"
        )
    args = copy.deepcopy(spec.model_args[flavor])
    try:
        args.update_from_config(job)
    except Exception as e:  # the model's own checks of the job (TorchTitan raises several)
        raise ConfigError(f"{name} {flavor} does not accept this job: {_reason(e)}") from None
    return args


def build_model(spec, args, job) -> nn.Module:
    """The job's model (`args`: `flavor_args`) on the meta device, as the trainer builds it
    before `parallelize_fn`; ConfigError when it cannot be built or lacks what the trainer
    calls on it."""
    from torchtitan.config import TORCH_DTYPE_MAP
    from torchtitan.tools.utils import set_default_dtype

    name, flavor = job.model.name, job.model.flavor
    try:
        with torch.device("meta"), set_default_dtype(TORCH_DTYPE_MAP[job.training.dtype]):
            model = spec.model_cls(args)
        args.get_nparams_and_flops(model, job.training.seq_len)
    except Exception as e:
        raise ConfigError(f"model {name} {flavor} cannot be built: {_reason(e)}") from None
    if not callable(getattr(model, "init_weights", None)):
        raise ConfigError(
            f"model {name} {flavor}: {type(model).__name__} has no init_weights(buffer_device) "
            "method, which the trainer calls after parallelize_fn; give the model one"
        )
    return model


def build_titan_data(spec, args, job, data_parallel: int) -> None:
    """A TrainSpec's tokenizer (which must fit the vocabulary of `args`, the model's args:
    TorchTitan's models do not grow it, and an id past it is an IndexError in the
    embedding), rank 0's training dataloader and, with validation on and TorchTitan's
    validator, its validation dataloader, each built as the worker builds it
    (`data_parallel` ranks)."""
    from torchtitan.components.validate import build_validator
    from torchtitan.hf_datasets.text_datasets import build_text_validation_dataloader

    warnings.filterwarnings("ignore", message="'set_vital' is deprecated", category=UserWarning)
    name = job.model.name
    tokenizer = None
    if spec.build_tokenizer_fn is not None:
        try:
            tokenizer = spec.build_tokenizer_fn(job)
        except Exception as e:  # TorchTitan raises FileNotFoundError, ValueError, ...
            raise ConfigError(
                f"model.hf_assets_path {job.model.hf_assets_path!r}: {name} cannot load its "
                f"tokenizer: {_reason(e)}"
            ) from None
        _require_fit(tokenizer.get_vocab_size(), getattr(args, "vocab_size", None), job)
    if spec.build_dataloader_fn is not None:
        try:
            spec.build_dataloader_fn(
                dp_world_size=data_parallel, dp_rank=0, tokenizer=tokenizer, job_config=job
            )
        except ConfigError:
            raise
        except Exception as e:
            raise ConfigError(
                f"training.dataset {job.training.dataset!r}: {name}'s dataloader cannot be "
                f"built: {_reason(e)}; pass --training.dataset stdlib (the default corpus) or "
                "a dataset it reads"
            ) from None
    if job.validation.enable and spec.build_validator_fn is build_validator:
        try:
            build_text_validation_dataloader(
                job_config=job,
                dp_world_size=data_parallel,
                dp_rank=0,
                tokenizer=tokenizer,
                infinite=job.validation.steps != -1,
            )
        except Exception as e:
            raise ConfigError(
                f"validation.dataset {job.validation.dataset!r}: {name}'s validator (TorchTitan's) "
                f"cannot load it: {_reason(e)}; pass --validation.dataset stdlib_validation "
                "(the default corpus's held-out split), or --validation.no_enable"
            ) from None


def _require_fit(tokens: int, vocab: int | None, job) -> None:
    if vocab is not None and tokens > vocab:
        raise ConfigError(
            f"model.hf_assets_path {job.model.hf_assets_path!r}: the tokenizer has {tokens} "
            f"tokens but {job.model.name} {job.model.flavor} embeds {vocab}; use a tokenizer "
            "that fits, or a flavor with a larger vocabulary"
        )


__all__ = ["build_model", "build_titan_data", "flavor_args", "train_spec"]
