"""Check a sharded model against an unsharded copy of itself on one small step.

`verify_plan(model, reference)` runs the same random tokens through both, backpropagates
the same random projection of the outputs, and compares the outputs and every parameter
gradient. It catches what neither `resolve_plan` nor the first-forward check can see:
code that is wrong on sharded tensors (a mean over the hidden dim of the BTP residual
stream, an attention that fixes its head count in a view, a norm whose formula is not
``x / rms(x) * weight``, a vanilla latent activation that mixes features), and latents
used outside autograd's sight. It costs one unsharded copy of the model on every rank.

For the step, every 1-D parameter (norm weights, biases) is moved off its value
(``p * U(0.5, 1.5) + U(-0.05, 0.05)``, the same on every rank) and restored afterwards:
freshly initialised norm weights of 1 and biases of 0 would hide a norm-weight factor or
a bias term that a sharded backward drops.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.tensor import DTensor, distribute_tensor

from .styles import PlanError


def _full(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if isinstance(t, DTensor) else t


def _logits(output) -> torch.Tensor:
    """The tensor a model returns: itself, the first of a tuple, or `.logits`."""
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, (tuple, list)) and output and isinstance(output[0], torch.Tensor):
        return output[0]
    logits = getattr(output, "logits", None)
    if isinstance(logits, torch.Tensor):
        return logits
    raise PlanError(f"verify: cannot find the output tensor in a {type(output).__name__}")


def _vocab(model: nn.Module) -> int:
    for module in model.modules():
        if isinstance(module, nn.Embedding):
            return module.num_embeddings
    raise PlanError("verify: the model has no nn.Embedding; pass example_input to verify_plan")


def _shaped_like(full: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
    """`full` laid out as `param` (its local shard for a DTensor; no communication)."""
    if isinstance(param, DTensor):
        return distribute_tensor(full, param.device_mesh, param.placements, src_data_rank=None)
    return full


@torch.no_grad()
def _perturb_vectors(model: nn.Module, generator: torch.Generator) -> dict[str, torch.Tensor]:
    """Move every 1-D parameter off its value (see the module docstring); return the
    original values, for `_restore`."""
    saved = {}
    for name, param in model.named_parameters():
        if param.dim() != 1:
            continue
        scale = 0.5 + torch.rand(param.shape, generator=generator, dtype=param.dtype)
        shift = 0.1 * (torch.rand(param.shape, generator=generator, dtype=param.dtype) - 0.5)
        saved[name] = param.detach().clone()
        param.mul_(_shaped_like(scale.to(param.device), param))
        param.add_(_shaped_like(shift.to(param.device), param))
    return saved


@torch.no_grad()
def _restore(model: nn.Module, saved: dict[str, torch.Tensor]) -> None:
    for name, param in model.named_parameters():
        if name in saved:
            param.copy_(saved[name])


def _relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    scale = want.abs().max().clamp_min(torch.finfo(want.dtype).tiny)
    return ((got.double() - want.double()).abs().max() / scale).item()


def verify_plan(
    model: nn.Module,
    reference: nn.Module,
    example_input: torch.Tensor | None = None,
    *,
    rtol: float = 1e-3,
) -> float:
    """Compare sharded `model` with unsharded `reference` on one forward and backward.

    The reference first takes the sharded model's weights (gathered, 1-D ones moved off
    their values), so both start equal; the model's own values are restored afterwards.
    Both run in eval mode (no dropout); gradients are cleared afterwards. `apply_plan`
    calls it with ``verify=True``.

    Args:
        model (nn.Module): the model after `apply_plan`.
        reference (nn.Module): an unsharded model of the same structure (its weights are
            overwritten), e.g. a copy of `model` taken before the plan was applied.
        example_input (torch.Tensor | None): the model's input. Default: random token ids
            [2, 16] within the first nn.Embedding's vocabulary.
        rtol (float): the largest relative error allowed (max abs error over max abs
            value) for the output and each gradient. Default: 1e-3.

    Returns:
        float: the largest relative error.

    Raises:
        PlanError: naming the output or gradient with the largest error, when it exceeds
            `rtol`; or the two cannot be compared (outputs of other shapes, a gradient in
            one model only, no `example_input` and no nn.Embedding).

    Example::

        >>> import torch.distributed as dist
        >>> from torch.distributed.device_mesh import init_device_mesh
        >>> from boost_titan.examples.own_model import LAYOUT, Decoder
        >>> from boost_titan.parallelize import apply_plan, btp_plan, verify_plan
        >>> dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        >>> mesh = init_device_mesh("cpu", (1,))  # under torchrun: ("cuda", (tp,))
        >>> model = apply_plan(Decoder(), mesh, btp_plan(LAYOUT, loss_parallel=False))
        >>> verify_plan(model, Decoder()) < 1e-5
        True
        >>> dist.destroy_process_group()
    """
    generator = torch.Generator().manual_seed(0)
    saved = _perturb_vectors(model, generator)
    state = {k: _full(v.detach()) for k, v in model.state_dict().items()}
    reference.load_state_dict(state)
    if example_input is None:
        example_input = torch.randint(0, _vocab(model), (2, 16), generator=generator)
    modes = model.training, reference.training
    model.eval()
    reference.eval()
    try:
        want = _logits(reference(example_input))
        probe = torch.randn(want.shape, generator=generator, dtype=torch.float32)
        (want.float() * probe).sum().backward()
        got = _full(_logits(model(example_input)))
        if got.shape != want.shape:
            raise PlanError(
                f"verify: the sharded model returns shape {tuple(got.shape)}, the unsharded "
                f"{tuple(want.shape)}; gather the head's output (loss_parallel=False)"
            )
        (got.float() * probe).sum().backward()
        errors = {"output": _relative_error(got.detach(), want.detach())}
        grads = dict(reference.named_parameters())
        for name, param in model.named_parameters():
            want_grad = grads[name].grad
            if param.grad is None or want_grad is None:
                if (param.grad is None) != (want_grad is None):
                    raise PlanError(f"verify: {name} has a gradient in only one of the two models")
                continue
            errors[f"{name} gradient"] = _relative_error(_full(param.grad), want_grad)
    finally:
        _restore(model, saved)
        model.train(modes[0])
        reference.train(modes[1])
        model.zero_grad(set_to_none=True)
    name, worst = max(errors.items(), key=lambda item: item[1])
    if worst > rtol:
        raise PlanError(
            f"verify: {name} differs from the unsharded model by {worst:.1e} (relative, "
            f"tolerance {rtol:.0e}); the model's code does something the plan does not "
            "allow (see parallelize.plans)"
        )
    return worst
