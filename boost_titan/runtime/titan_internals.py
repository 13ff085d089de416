"""Every use of TorchTitan's private API (0.2.2, pinned in pyproject.toml), behind named
functions: its underscore names and the module globals rebound at run time. An upgrade
starts here: `tests/unit/test_titan_internals.py` compares each signature relied on with
0.2.2's and names the one that changed; `tests/unit/test_architecture.py` keeps these names
out of every other module (the data room's dataset and loader subclasses aside: it cannot
import runtime).

TorchTitan is imported inside the functions: `runtime.device` calls `point_at_cpu` while
the worker's entry still prepares the process for TorchTitan's import.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from torch.distributed.device_mesh import DeviceMesh

# ---- module globals rebound -------------------------------------------------------------
_REPLACED: dict[str, Callable[..., Any]] = {}
"""TorchTitan's own functions, as first found, by the name of the global rebound."""


def replace_amp(context: Callable[..., Any]) -> Callable[..., Any]:
    """Make `Trainer.__init__` take its autocast context from `context` (it calls
    `torchtitan.distributed.utils.maybe_enable_amp` through the module); returns TorchTitan's
    own `maybe_enable_amp`."""
    import torchtitan.distributed.utils as titan_dist_utils

    titan_amp = _REPLACED.setdefault("maybe_enable_amp", titan_dist_utils.maybe_enable_amp)
    titan_dist_utils.maybe_enable_amp = context
    return titan_amp


def point_at_cpu(cpu_module: Any, peak_flops: Callable[..., float]) -> None:
    """Make every loaded TorchTitan module use `cpu_module` as its device module and "cpu"
    as its device type, and `peak_flops` for the MFU; modules imported later read
    `torchtitan.tools.utils` themselves."""
    import torchtitan.tools.utils as titan_utils

    old_type, old_module = titan_utils.device_type, titan_utils.device_module
    titan_utils.get_peak_flops = peak_flops
    for name, module in list(sys.modules.items()):
        if module is None or not (name == "torchtitan" or name.startswith("torchtitan.")):
            continue
        if getattr(module, "device_module", None) is old_module:
            module.device_module = cpu_module
        if getattr(module, "device_type", None) == old_type:
            module.device_type = "cpu"


# ---- CheckpointManager -------------------------------------------------------------------
def checkpoint_path(checkpointer: Any, step: int) -> str:
    """The folder of step `step`'s checkpoint (`step-N` under the checkpoint folder)."""
    return checkpointer._create_checkpoint_id(step)


def saves_at(checkpointer: Any, step: int, last_step: bool) -> bool:
    """Whether the checkpointer's own `save(step, last_step)` writes a checkpoint."""
    return checkpointer._should_save(step, last_step)


def wait_for_save(checkpointer: Any) -> None:
    """Wait for the checkpointer's pending asynchronous save (raises its failure)."""
    checkpointer._async_wait()


def save_now(checkpointer: Any, path: str) -> None:
    """Write the checkpoint to `path` synchronously (collective), then drop the stale ones
    beyond `checkpoint.keep_latest_k`."""
    from torchtitan.components.checkpoint import AsyncMode

    states = checkpointer._flattened_model_states_sd()
    checkpointer.dcp_save(states, path, AsyncMode.DISABLED, enable_garbage_collection=True)
    checkpointer._purge_stale_checkpoints()


def states_to_load(checkpointer: Any, model_only: bool) -> dict[str, Any]:
    """What the checkpointer's own `load` fills from a DCP checkpoint: the model's states
    alone (`model_only`), else every state but `checkpoint.exclude_from_loading`, the
    model's flattened in."""
    return checkpointer._states_to_load(model_only)


def finish_load(checkpointer: Any, states: dict[str, Any]) -> None:
    """What the checkpointer's own `dcp_load` does after DCP filled `states`: hand the
    model's flattened states to the model."""
    from torchtitan.components.checkpoint import MODEL

    if MODEL in checkpointer.states:
        checkpointer.states[MODEL].load_state_dict(states)


# ---- the pipeline schedule, converters ---------------------------------------------------
def schedule_loss(schedule: Any) -> Callable[..., Any]:
    """The loss function a pipeline schedule calls on its last stage."""
    return schedule._loss_fn


def replace_schedule_loss(schedule: Any, loss: Callable[..., Any]) -> None:
    """Make the pipeline schedule call `loss` (it reads its `_loss_fn` at each step)."""
    schedule._loss_fn = loss


def register_converter(name: str, converter: type) -> None:
    """Register `converter` as TorchTitan's model converter `name`, replacing any converter
    of that name (TorchTitan's `register_model_converter` refuses a second one)."""
    from torchtitan.protocols import model_converter

    model_converter._registry_model_converter_cls[name] = converter


# ---- ParallelDims, float8, activation checkpointing ---------------------------------------
def one_rank_mesh(parallel_dims: Any, names: list[str]) -> DeviceMesh:
    """The mesh `names` (a 1-rank "fsdp" dim, optionally after "dp_replicate"), read from the
    meshes ParallelDims built (`get_mesh` refuses size-1 dims), built first where nothing
    asked for a mesh before."""
    if not parallel_dims._meshes:
        parallel_dims.build_mesh()
    if len(names) > 1:
        return parallel_dims._global_meshes["dense"][tuple(names)]
    return parallel_dims._meshes[names[0]]


def validate_quantization(converter: Any, job_config: Any) -> None:
    """TorchTitan's own checks of a quantization converter's settings (`QuantizationConverter`,
    the base of `Float8LinearConverter`)."""
    converter._validate(job_config)


def selective_ac_saves() -> set:
    """The ops TorchTitan's op-level selective activation checkpointing saves."""
    from torchtitan.models.llama3.infra.parallelize import _op_sac_save_list

    return set(_op_sac_save_list)


__all__ = [
    "checkpoint_path",
    "finish_load",
    "one_rank_mesh",
    "point_at_cpu",
    "register_converter",
    "replace_amp",
    "replace_schedule_loss",
    "save_now",
    "saves_at",
    "schedule_loss",
    "selective_ac_saves",
    "states_to_load",
    "validate_quantization",
    "wait_for_save",
]
