"""`LORO`: AdamW on every parameter, with LORO's steps on the low-rank pairs (Mo et al.,
ICLR 2025; docs/models.md).

Step t (counted from 1; the count is every parameter's `state["step"]`, a scalar tensor as
AdamW's, so DCP's `get_optimizer_state_dict` / `set_optimizer_state_dict` save and reshard it):

- Every parameter updates its AdamW moments with its gradient (no gradient: no update).
- A parameter of no pair takes AdamW's step (decoupled weight decay, bias correction): bit
  for bit `torch.optim.AdamW(foreach=False)`'s.
- A pair's factors, when t % exact_every != 0 (the approximate step): the same step with the
  direction scaled, B -= lr * scale * D_B and A -= lr * scale * D_A, D = m_hat /
  (sqrt(v_hat) + eps), scale = approx_scale or r / hidden_size; weight decay as AdamW's
  (p *= 1 - lr * weight_decay, the unscaled lr).
- When t % exact_every == 0 (the exact step): every pair moves to the rank-r truncated SVD
  of W - lr * D (`loro_exact`, sharded by `loro_sharded`) with the lr unscaled and no weight
  decay, after the other parameters' AdamW steps; then every moment of every parameter is
  zeroed and Adam's bias correction starts again: its step count is the number of steps
  since the last exact step, t - exact_every * ((t - 1) // exact_every).
- The re-warm: the j-th step after an exact step (j = 1 .. rewarm_steps) multiplies the
  learning rate of every parameter by j / (rewarm_steps + 1) (1/6, 2/6, .., 5/6 for the
  default 5); later steps use it whole. An exact step inside a re-warm gets its factor too.

The learning rate is each param group's "lr" (TorchTitan's scheduler sets it); betas, eps and
weight decay are the group's too. The state is created for every parameter at construction
(so DCP never takes the step with zero gradients it uses to build a lazy optimizer's state).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import torch
from torch import Tensor

from .loro_sharded import PairStep, exact_steps


def rewarm_factor(step: int, exact_every: int, rewarm_steps: int) -> float:
    """The learning-rate multiplier of optimizer step `step` (counted from 1)."""
    since = adam_step(step, exact_every)
    if step <= exact_every or since > rewarm_steps:
        return 1.0
    return since / (rewarm_steps + 1)


def adam_step(step: int, exact_every: int) -> int:
    """Adam's bias-correction count at optimizer step `step`: steps since the last exact one."""
    return step - exact_every * ((step - 1) // exact_every)


class LORO(torch.optim.Optimizer):
    """AdamW with LORO's approximate and exact steps on `pairs` (the module docstring).

    `pairs`: (B, A) per low-rank pair, B = up.weight [d_out x r], A = down.weight [r x d_in],
    both among `params`, in one param group; `hidden_size`: the model's d of the r / d scale.
    """

    def __init__(
        self,
        params: Iterable[Tensor] | Iterable[dict[str, Any]],
        *,
        pairs: Sequence[tuple[Tensor, Tensor]],
        hidden_size: int,
        lr: float,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        exact_every: int,
        rewarm_steps: int = 5,
        approx_scale: float | None = None,
    ) -> None:
        if exact_every < 1 or rewarm_steps < 0 or hidden_size < 1:
            raise ValueError("LORO: exact_every >= 1, rewarm_steps >= 0, hidden_size >= 1")
        if approx_scale is not None and not approx_scale > 0:
            raise ValueError("LORO: approx_scale must be > 0 (or None: r / hidden_size)")
        defaults = {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay}
        super().__init__(params, defaults)
        self.exact_every = exact_every
        self.rewarm_steps = rewarm_steps
        group_of = {id(p): i for i, g in enumerate(self.param_groups) for p in g["params"]}
        self.pairs = [(b, a) for b, a in pairs]
        self.scales: dict[int, float] = {}
        for b, a in self.pairs:
            _check_pair(b, a, group_of)
            scale = approx_scale if approx_scale is not None else b.shape[1] / hidden_size
            self.scales[id(b)] = self.scales[id(a)] = scale
        if len(self.scales) != 2 * len(self.pairs):
            raise ValueError("LORO: a parameter is in two pairs")
        for group in self.param_groups:
            for p in group["params"]:
                self.state[p] = {
                    "step": torch.tensor(0.0),
                    "exp_avg": torch.zeros_like(p, memory_format=torch.preserve_format),
                    "exp_avg_sq": torch.zeros_like(p, memory_format=torch.preserve_format),
                }

    @torch.no_grad()
    def step(self, closure=None):  # noqa: ANN001, ANN201 (torch.optim.Optimizer's signature)
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        params = [p for group in self.param_groups for p in group["params"]]
        step = int(self.state[params[0]]["step"]) + 1 if params else 1
        exact = step % self.exact_every == 0
        factor = rewarm_factor(step, self.exact_every, self.rewarm_steps)
        count = adam_step(step, self.exact_every)
        directions: dict[int, Tensor] = {}
        for group in self.param_groups:
            lr = group["lr"] * factor
            for p in group["params"]:
                self.state[p]["step"].fill_(step)
                if p.grad is None:
                    continue
                direction = _adam_update(p, self.state[p], group, lr, count, self.scales, exact)
                if direction is not None:
                    directions[id(p)] = direction
        if exact:
            exact_steps(self._pair_steps(directions, factor))
            for state in self.state.values():
                state["exp_avg"].zero_()
                state["exp_avg_sq"].zero_()
        return loss

    def _pair_steps(self, directions: dict[int, Tensor], factor: float) -> list[PairStep]:
        """Each pair's exact step: its directions (zeros for a factor without a gradient)
        and its group's lr times the re-warm factor."""
        lr_of = {id(p): g["lr"] * factor for g in self.param_groups for p in g["params"]}
        steps = []
        for b, a in self.pairs:
            d_b, d_a = (directions.get(id(t), torch.zeros_like(t)) for t in (b, a))
            steps.append((b, a, d_b, d_a, lr_of[id(b)]))
        return steps


def _check_pair(b: Tensor, a: Tensor, group_of: dict[int, int]) -> None:
    if b.dim() != 2 or a.dim() != 2 or b.shape[1] != a.shape[0]:
        raise ValueError("LORO: a pair is (B [d_out x r], A [r x d_in])")
    if b.dtype != a.dtype:
        raise ValueError("LORO: a pair's factors must share a dtype")
    if id(b) not in group_of or id(a) not in group_of or group_of[id(b)] != group_of[id(a)]:
        raise ValueError("LORO: both factors of a pair must be in params, in one group")


def _adam_update(
    p: Tensor,
    state: dict[str, Tensor],
    group: dict[str, Any],
    lr: float,
    count: int,
    scales: dict[int, float],
    exact: bool,
) -> Tensor | None:
    """Update p's moments, then take its AdamW or approximate step; for a pair's factor at
    an exact step, take none and return its direction D = m_hat / (sqrt(v_hat) + eps).
    The operations and their order are torch.optim.adam's `_single_tensor_adam`."""
    beta1, beta2 = group["betas"]
    exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
    pair = id(p) in scales
    if group["weight_decay"] != 0 and not (pair and exact):
        p.mul_(1 - lr * group["weight_decay"])
    exp_avg.lerp_(p.grad, 1 - beta1)
    exp_avg_sq.mul_(beta2).addcmul_(p.grad, p.grad, value=1 - beta2)
    bias_correction1 = 1 - beta1**count
    bias_correction2_sqrt = (1 - beta2**count) ** 0.5
    denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(group["eps"])
    if pair and exact:
        return exp_avg / bias_correction1 / denom
    step_size = (lr * scales[id(p)] if pair else lr) / bias_correction1
    p.addcdiv_(exp_avg, denom, value=-step_size)
    return None
