"""Crash recovery under `torchrun --max-restarts`: a launcher check, a resume report and a
fault injector to test them.

- torchrun's c10d and static rendezvous hand every restart attempt the same TCPStore (the
  agent's, "shared"), and the process-group keys of the crashed attempt are still in it:
  gloo's full-mesh setup then reads a dead peer's address and fails with `Connection
  refused` or waits forever, depending on which side of each pair connects (PyTorch issue
  135712). `TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1` in torchrun's environment gives every
  attempt a fresh store; `run_train.sh` sets it. `shared_store_warning()` says so when a
  worker finds restarts enabled over a shared store.
- `incomplete_checkpoints()` names the step folders newer than the newest complete one (no
  DCP `.metadata`: a save that was interrupted), which TorchTitan skips; the trainer logs
  them when it resumes.
- Fault injection, off unless `BOOST_TITAN_FAULT_STEP` is set: in the first attempt only
  (`TORCHELASTIC_RESTART_COUNT` 0 or unset), rank `BOOST_TITAN_FAULT_RANK` (default: the
  last rank) SIGKILLs itself at step `BOOST_TITAN_FAULT_STEP` (or at the first of a
  comma-separated list): after the step
  (`BOOST_TITAN_FAULT_POINT=step`, the default) or while that step's checkpoint is being
  saved, once its own shard files are written and before DCP's `.metadata` exists
  (`BOOST_TITAN_FAULT_POINT=save`). `BOOST_TITAN_FAULT_POINT=nan` makes that rank's loss of
  each listed step NaN instead (it counts on a rank that holds a share of the global loss: under
  TP the first rank of its group), `inf` one of its gradients infinite
  (`boost_titan.runtime.nonfinite` must then keep the step from the optimizer);
  `sigterm` sends SIGTERM to torchrun's process group (the launcher's: torchrun passes it on
  to the workers) during the step, before its stop flags are all-reduced, as a scheduler
  does (a signal during the last step: `runtime.stopping`).
"""

from __future__ import annotations

import os
import signal
import sys
from typing import TYPE_CHECKING, Protocol

from boost_titan.checkpoint.files import is_complete_checkpoint, step_folders
from boost_titan.config.errors import ConfigError
from boost_titan.runtime.torch_internals import replace_dcp_write

if TYPE_CHECKING:
    from collections.abc import Callable

    import torch


class FaultTarget(Protocol):
    """What `Fault.install` wraps: the trainer's step methods (`runtime.trainer`)."""

    step: int
    train_step: Callable[..., None]
    clip_gradients: Callable[[], torch.Tensor]
    local_loss: Callable[[list[torch.Tensor]], torch.Tensor]

    def local_grads(self) -> list[torch.Tensor]: ...


def shared_store_warning(env=os.environ) -> str | None:
    """A one-line warning when this torchrun worker may be restarted over a shared store."""
    if env.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    if int(env.get("TORCHELASTIC_MAX_RESTARTS") or 0) == 0:
        return None
    return (
        "warning: torchrun --max-restarts with its shared TCPStore: a restarted attempt finds the "
        "crashed attempt's process-group keys and may fail to connect or hang; launch torchrun "
        "with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 and --rdzv_backend c10d (run_train.sh does)"
    )


def incomplete_checkpoints(folder: str) -> list[str]:
    """Step folders under `folder` newer than the newest complete one, oldest first."""
    steps = step_folders(folder)
    complete = [step for step, path in steps if is_complete_checkpoint(path)]
    newest = complete[-1] if complete else -1
    return [path for step, path in steps if step > newest]


def _die() -> None:
    rank = os.environ.get("RANK")
    print(f"fault injection: rank {rank} SIGKILLs itself", file=sys.stderr, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


FAULT_POINTS = ("step", "save", "nan", "inf", "sigterm")
"""Values of BOOST_TITAN_FAULT_POINT (see the module docstring)."""


class Fault:
    """The injected crash configured by the environment (see the module docstring)."""

    def __init__(self, steps: tuple[int, ...], point: str):
        self.steps, self.point = steps, point

    @classmethod
    def from_env(cls, rank: int, world_size: int, env=os.environ) -> Fault | None:
        """The fault this rank must inject in this attempt, if any; installs the save hook."""
        if not env.get("BOOST_TITAN_FAULT_STEP"):
            return None
        try:
            steps = tuple(int(step) for step in env["BOOST_TITAN_FAULT_STEP"].split(","))
            target = int(env.get("BOOST_TITAN_FAULT_RANK") or world_size - 1)
        except ValueError:
            raise ConfigError(
                "BOOST_TITAN_FAULT_STEP (comma-separated) and BOOST_TITAN_FAULT_RANK must be "
                "integers"
            ) from None
        point = env.get("BOOST_TITAN_FAULT_POINT") or "step"
        if point not in FAULT_POINTS:
            raise ConfigError(
                f"BOOST_TITAN_FAULT_POINT {point!r} is not one of {', '.join(FAULT_POINTS)}"
            )
        if rank != target or int(env.get("TORCHELASTIC_RESTART_COUNT") or 0) > 0:
            return None
        fault = cls(steps, point)
        if point == "save":
            fault._hook_checkpoint_write()
        return fault

    def install(self, trainer: FaultTarget) -> None:
        """Wrap `trainer`'s step methods on the instance, once at construction, so that a
        run without a fault has no check of its own in the step: the loss poisoned by
        `poison_loss`, the gradients by `poison_grads` before clipping, and `after_step`
        once the step is recorded."""
        train_step, clip_gradients, local_loss = (
            trainer.train_step,
            trainer.clip_gradients,
            trainer.local_loss,
        )

        def faulty_train_step(data_iterator):
            train_step(data_iterator)
            self.after_step(trainer.step)

        def faulty_clip_gradients():
            self.poison_grads(trainer.step, trainer.local_grads())
            return clip_gradients()

        def faulty_local_loss(losses):
            return self.poison_loss(trainer.step, local_loss(losses))

        trainer.train_step = faulty_train_step
        trainer.clip_gradients = faulty_clip_gradients
        trainer.local_loss = faulty_local_loss

    def after_step(self, step: int) -> None:
        if self.point == "step" and step in self.steps:
            _die()

    def poison_loss(self, step: int, loss: torch.Tensor) -> torch.Tensor:
        """The step's loss as recorded: NaN at the `nan` fault's step."""
        return loss * float("nan") if self.point == "nan" and step in self.steps else loss

    def poison_grads(self, step: int, grads: list[torch.Tensor]) -> None:
        """At the `inf` fault's step, make one gradient entry of this rank infinite; at the
        `sigterm` fault's, signal the job (both before the step's stop flags are summed)."""
        if self.point == "inf" and step in self.steps and grads:
            grads[0].view(-1)[0] = float("inf")
        if self.point == "sigterm" and step in self.steps:
            os.killpg(os.getpgid(os.getppid()), signal.SIGTERM)  # the parent is torchrun

    def _hook_checkpoint_write(self) -> None:
        # DCP: every rank writes its shards (write_data), then the coordinator gathers the
        # results and writes .metadata; dying in between leaves a folder without .metadata.
        write_data = None
        folders = {f"step-{step}" for step in self.steps}

        def write_data_then_die(writer, plan, planner):
            written = write_data(writer, plan, planner)
            if os.path.basename(os.fspath(writer.path)) in folders:
                written.wait()
                _die()
            return written

        write_data = replace_dcp_write(write_data_then_die)
