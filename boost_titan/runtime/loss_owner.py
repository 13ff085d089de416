"""Which ranks of a parallel layout count the loss: the trainer's step loss and the held-out
loss (`runtime.held_out_loss`) are summed over these ranks only, then all-reduced."""

from __future__ import annotations

from torchtitan.distributed import ParallelDims


def owns_loss(parallel_dims: ParallelDims, pp_has_last_stage: bool | None) -> bool:
    """Whether this rank's loss is counted: the last PP stage holds it, TP ranks replicate it."""
    tp_mesh = parallel_dims.get_optional_mesh("tp")
    return (not parallel_dims.pp_enabled or bool(pp_has_last_stage)) and (
        tp_mesh is None or tp_mesh.get_local_rank() == 0
    )
