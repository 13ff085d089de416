"""The optimizers of a family's TrainSpec (`build_optimizers_fn`): TorchTitan's builder for
its own names, and for `[optimizer] name = "LORO"` TorchTitan's `OptimizersContainer` of
one `boost_titan.optim.LORO` per model part (a PP stage each), whose pairs are that part's
low-rank pairs, found by structure: every module with `down` and `up` `nn.Linear`
children (`parallelize.LowRankLinear`), B = up.weight, A = down.weight. The container's
`state_dict` / `load_state_dict` are TorchTitan's (DCP's flattened optimizer state), so
checkpoints hold LORO's state as they hold AdamW's, reshardable.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor, nn
from torch.distributed.tensor import DTensor
from torchtitan.components.optimizer import OptimizersContainer, build_optimizers

from boost_titan.config.errors import ConfigError
from boost_titan.config.optimizer import LORO, LoroSettings
from boost_titan.optim.loro import LORO as LoroOptimizer

Pair = tuple[Tensor, Tensor]
"""(B, A) = (up.weight [d_out x r], down.weight [r x d_in])."""
LoroOf = Callable[[nn.Module], tuple[int, LoroSettings]]
"""A model part -> (the model's hidden size, the job's LORO settings): the family's."""


def low_rank_pairs(module: nn.Module) -> list[Pair]:
    """(up.weight, down.weight) of every submodule of `module` with `down` and `up`
    `nn.Linear` children, in module order (the order every rank sees)."""
    pairs = []
    for m in module.modules():
        up, down = getattr(m, "up", None), getattr(m, "down", None)
        if isinstance(up, nn.Linear) and isinstance(down, nn.Linear):
            pairs.append((up.weight, down.weight))
    return pairs


def _spans_replicas(factor: Tensor) -> bool:
    """A factor whose DTensor mesh holds the data-parallel replicas (FSDP2's HSDP)."""
    mesh = factor.device_mesh if isinstance(factor, DTensor) else None
    return mesh is not None and "dp_replicate" in (mesh.mesh_dim_names or ())


def build_loro(
    model_parts: list[nn.Module], optimizer_config, loro_of: LoroOf, replicated: bool = False
):
    """TorchTitan's container of one LORO per model part, with TorchTitan's settings (lr,
    betas, eps, weight decay) and the job's LORO settings. `replicated`: data-parallel
    replicas (dp_replicate > 1) whose factors' meshes must hold them, so that each pair's
    exact step is computed once for all of them (under DDP every replica would compute
    its own, and replicas could part ways)."""
    if optimizer_config.early_step_in_backward:
        raise ConfigError("optimizer.name LORO cannot run with optimizer.early_step_in_backward")
    hidden_size, settings = loro_of(model_parts[0])
    pairs = [pair for part in model_parts for pair in low_rank_pairs(part)]
    if not pairs:
        raise ConfigError("optimizer.name LORO found no low-rank pairs (down/up) in the model")
    if replicated and not all(_spans_replicas(b) for b, _ in pairs):
        raise ConfigError(
            "optimizer.name LORO cannot run under DDP (data_parallel_replicate_degree > 1 "
            "with fp32 compute): each replica would compute its own exact step; shard instead "
            "(data_parallel_shard_degree) or use bf16 compute (HSDP)"
        )

    def per_part(params: list[Tensor], **kwargs) -> LoroOptimizer:
        """The part's LORO: the pairs whose factors are among its parameters."""
        own = {id(p) for p in params}
        mine = [(b, a) for b, a in pairs if id(b) in own and id(a) in own]
        return LoroOptimizer(params, pairs=mine, **kwargs)

    kwargs = {
        "lr": optimizer_config.lr,
        "betas": (optimizer_config.beta1, optimizer_config.beta2),
        "eps": optimizer_config.eps,
        "weight_decay": optimizer_config.weight_decay,
        "hidden_size": hidden_size,
        "exact_every": settings.exact_every,
        "rewarm_steps": settings.rewarm_steps,
        "approx_scale": settings.approx_scale,
    }
    return OptimizersContainer(model_parts, per_part, kwargs)


def optimizers_builder(loro_of: LoroOf):
    """The family's `build_optimizers_fn`: LORO by `build_loro`, other names TorchTitan's."""

    def build(model_parts: list[nn.Module], optimizer_config, parallel_dims, ft_manager=None):
        if optimizer_config.name == LORO:
            replicated = parallel_dims is not None and parallel_dims.dp_replicate_enabled
            return build_loro(model_parts, optimizer_config, loro_of, replicated)
        return build_optimizers(model_parts, optimizer_config, parallel_dims, ft_manager)

    return build


__all__ = ["build_loro", "low_rank_pairs", "optimizers_builder"]
