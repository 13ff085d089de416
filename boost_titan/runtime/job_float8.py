"""TorchTitan's float8 switch for a TrainSpec whose parallelize function applies float8 itself
(`boost_llama`'s): `--model.converters quantize.linear.float8`
with `[quantize.linear.float8]` (`recipe_name`, `filter_fqns`, `emulate`).

TorchTitan's `Float8LinearConverter` swaps nn.Linear for torchao's `Float8Linear` before
the TrainSpec's parallelize function runs, judging its filters on the full weights; our
TP styles then replace each module's forward with their own GEMMs, so the swap would be
bypassed. Here the conversion happens inside `parallelize_boost`, right after the plan is
applied (`apply_job_float8`): every plan's styles run the selected GEMMs through
`kernels.float8`, selected on the per-rank shapes (`parallelize.float8`).

The registry entry `quantize.linear.float8` keeps its name and is pointed at
`BoostFloat8Converter` (`install_converter`): TorchTitan's `register_model_converter`
asserts on a second registration and has no way to replace one, so the entry is
overwritten once, at spec import. For `boost_llama` the converter only checks the job
(one-line `ConfigError`s) and leaves the model alone; for any other model it is
TorchTitan's converter unchanged.
"""

from __future__ import annotations

import torch
from torch import nn
from torchtitan.components.quantization.float8 import Float8LinearConverter
from torchtitan.tools.logging import logger

from boost_titan.config.errors import ConfigError
from boost_titan.kernels.float8 import RECIPES, float8_recipe
from boost_titan.parallelize.float8 import AUTO_FILTER_FLAG, apply_float8, gemm_skip_reason
from boost_titan.runtime.titan_internals import register_converter, validate_quantization
from boost_titan.runtime.torch_internals import emulate_precision_casts

CONVERTER = "quantize.linear.float8"


def float8_enabled(job_config) -> bool:
    """The job lists the converter (a partial job without `[model]`, as `bench compile`
    and tests build for `parallelize_boost`, has none)."""
    model = getattr(job_config, "model", None)
    return model is not None and CONVERTER in model.converters


def recipe_of(job_config) -> str:
    """The job's recipe name (TorchTitan's default without `recipe_name`: tensorwise)."""
    return job_config.quantize.linear.float8.recipe_name or "tensorwise"


def validate_float8(job_config) -> None:
    """Raise ConfigError for a float8 setting this machine or our plans cannot run."""
    if not float8_enabled(job_config):
        return
    settings = job_config.quantize.linear.float8
    recipe = recipe_of(job_config)
    if recipe not in RECIPES:
        raise ConfigError(
            f"unknown [quantize.linear.float8] recipe_name {recipe!r}; "
            f"choose one of {', '.join(RECIPES)}"
        )
    try:
        gemm_skip_reason(16, 16, "", recipe, settings.filter_fqns)
    except ValueError as e:
        raise ConfigError(f"[quantize.linear.float8] {e}") from None
    if torch.cuda.is_available() and not settings.emulate:
        major, minor = torch.cuda.get_device_capability()
        if (major, minor) < (8, 9):
            raise ConfigError(
                f"float8 needs a GPU with compute capability 8.9+ (this one is {major}.{minor}); "
                f"drop {CONVERTER} from model.converters, or set "
                "[quantize.linear.float8] emulate = true to test it emulated"
            )
    if settings.enable_fsdp_float8_all_gather:
        raise ConfigError(
            "[quantize.linear.float8] enable_fsdp_float8_all_gather is not supported by "
            "our TP styles (they cast the local shards); set it to false"
        )


def apply_job_float8(model: nn.Module, job_config) -> None:
    """Turn float8 on for `model` (after the TP plan, before AC and compile) when the job
    asks for it; log what runs in float8 and why the rest does not. Raises ConfigError
    when no projection qualifies: the job asked for float8 and would get none."""
    if not float8_enabled(job_config):
        return
    validate_float8(job_config)
    settings = job_config.quantize.linear.float8
    f8 = float8_recipe(recipe_of(job_config), settings.emulate)
    if f8.recipe == "rowwise":  # as TorchTitan's converter (pytorch/pytorch#150859)
        emulate_precision_casts()
    selection = apply_float8(model, f8, settings.filter_fqns)
    if not selection.chosen:
        raise ConfigError(
            f"float8: none of the {selection.projections[1]} projections qualifies on its "
            f"per-rank GEMM ({selection.reasons()}), so float8 would change nothing; relax "
            f"[quantize.linear.float8] filter_fqns ({AUTO_FILTER_FLAG}), use a rank or TP "
            f"degree that keeps per-rank dims multiples of 16, or drop {CONVERTER}"
        )
    logger.info(selection.summary())


class BoostFloat8Converter(Float8LinearConverter):
    """`quantize.linear.float8` for every model: for ours (`spec_name`) it checks the job
    and leaves the conversion to `parallelize_boost`; otherwise TorchTitan's converter."""

    spec_name = ""

    def __init__(self, job_config, parallel_dims) -> None:
        self.ours = job_config.model.name == self.spec_name
        if not self.ours:
            super().__init__(job_config, parallel_dims)
            return
        validate_quantization(self, job_config)
        validate_float8(job_config)
        self.enabled = False  # post_optimizer_hook: no precomputed FSDP scales
        self.precompute_scale = False

    def convert(self, model: nn.Module) -> None:
        if not self.ours:
            super().convert(model)


def install_converter(spec_name: str) -> None:
    """Point the `quantize.linear.float8` registry entry at `BoostFloat8Converter`, which
    leaves models of TrainSpec `spec_name` to `parallelize_boost`."""
    BoostFloat8Converter.spec_name = spec_name
    register_converter(CONVERTER, BoostFloat8Converter)
