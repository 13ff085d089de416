"""Check a sharded model against an unsharded copy of itself on one small step.

`verify_plan(model, reference)` runs the same random tokens through both, backpropagates
the same random projection of the outputs, and compares the outputs and every parameter
gradient. It catches what neither `resolve_plan` nor the first-forward check can see:
code that is wrong on sharded tensors (a mean over the hidden dim of the BTP residual
stream, an attention that fixes its head count in a view, a norm whose formula is not
``x / rms(x) * weight``, a vanilla latent activation that mixes features), and latents
used outside autograd's sight. It costs one unsharded copy of the model on every rank.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.tensor import DTensor

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

    The reference first takes the sharded model's weights (gathered), so both start
    equal. `example_input`: default random token ids [2, 16] within the first
    nn.Embedding's vocabulary. Both run in eval mode (no dropout); gradients are cleared
    afterwards. Returns the largest relative error; raises `PlanError` naming the first
    output or gradient whose error exceeds `rtol`.
    """
    state = {k: _full(v.detach()) for k, v in model.state_dict().items()}
    reference.load_state_dict(state)
    generator = torch.Generator().manual_seed(0)
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
