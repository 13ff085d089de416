"""The `LORO` optimizer (`boost_titan.optim.loro`) on one process: AdamW's step to the bit
where it should be, the approximate step's r / d scale, the exact step and the zeroed state
after it, the re-warm, and the step counter through DCP's optimizer state dict."""

from __future__ import annotations

import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_optimizer_state_dict,
    set_optimizer_state_dict,
)

from boost_titan.optim import LORO
from boost_titan.optim.loro import rewarm_factor
from boost_titan.optim.loro_exact import exact_step

HIDDEN, RANK, LR = 16, 4, 1e-2


class Toy(nn.Module):
    """A full linear and one low-rank pair W = up.weight @ down.weight (no activation)."""

    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.full = nn.Linear(6, 5)
        self.down = nn.Linear(6, RANK, bias=False)
        self.up = nn.Linear(RANK, 5, bias=False)


def _loro(model: Toy, **kwargs) -> LORO:
    groups = [
        {"params": [model.full.weight, model.full.bias], "weight_decay": 0.1},
        {"params": [model.down.weight, model.up.weight], "weight_decay": 0.0},
    ]
    options = {"hidden_size": HIDDEN, "lr": LR, "exact_every": 4, **kwargs}
    return LORO(groups, pairs=[(model.up.weight, model.down.weight)], **options)


def _grads(model: nn.Module, seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(p.shape, generator=g) for p in model.parameters()]


def _set(params, grads) -> None:
    for p, grad in zip(params, grads, strict=True):
        p.grad = grad.clone()


def _clones(params) -> list[torch.Tensor]:
    return [p.detach().clone().requires_grad_() for p in params]


def test_plain_parameters_and_the_approximate_step_are_adamw_to_the_bit():
    """Before the first exact step: the full linear is AdamW (weight decay 0.1), each factor
    is AdamW at lr * r / d (the approximate step's scale)."""
    model = Toy()
    loro = _loro(model)
    full, pair = _clones(model.full.parameters()), _clones([model.down.weight, model.up.weight])
    adamw = torch.optim.AdamW(full, lr=LR, weight_decay=0.1, foreach=False)
    scaled = torch.optim.AdamW(pair, lr=LR * RANK / HIDDEN, weight_decay=0.0, foreach=False)
    for step in range(3):
        grads = _grads(model, step)
        _set(model.parameters(), grads)
        _set([*full, *pair], grads)
        loro.step()
        adamw.step()
        scaled.step()
    for mine, theirs in zip(model.parameters(), [*full, *pair], strict=True):
        assert torch.equal(mine, theirs)


def test_an_explicit_approx_scale_replaces_r_over_d():
    model = Toy()
    loro = _loro(model, approx_scale=0.5)
    pair = _clones([model.down.weight, model.up.weight])
    scaled = torch.optim.AdamW(pair, lr=LR * 0.5, weight_decay=0.0, foreach=False)
    grads = _grads(model, 0)
    _set(model.parameters(), grads)
    _set(pair, grads[2:])
    loro.step()
    scaled.step()
    assert torch.equal(model.down.weight, pair[0]) and torch.equal(model.up.weight, pair[1])


def _moments_direction(grads_seq, beta1=0.9, beta2=0.999, eps=1e-8) -> torch.Tensor:
    m = v = 0
    for g in grads_seq:
        m = beta1 * m + (1 - beta1) * g
        v = beta2 * v + (1 - beta2) * g * g
    t = len(grads_seq)
    return (m / (1 - beta1**t)) / ((v / (1 - beta2**t)).sqrt() + eps)


def test_the_exact_step_then_zeroed_state_and_the_rewarm():
    """Step 4 of exact_every = 4: the pair moves by the exact step (Adam's directions,
    lr unscaled), every moment is zeroed; step 5 is a fresh AdamW step at lr / 6 on the full
    linear (re-warm 1 of 5) and the scaled step at lr / 6 on the factors."""
    model = Toy()
    loro = _loro(model)
    history = []
    for step in range(3):
        history.append(_grads(model, step))
        _set(model.parameters(), history[-1])
        loro.step()
    history.append(_grads(model, 3))
    b, a = model.up.weight.detach().clone(), model.down.weight.detach().clone()
    d_b, d_a = (_moments_direction([g[i] for g in history]) for i in (3, 2))
    _set(model.parameters(), history[-1])
    loro.step()
    expected_b, expected_a = exact_step(b, a, d_b, d_a, LR)
    assert (model.up.weight - expected_b).abs().max() < 1e-6
    assert (model.down.weight - expected_a).abs().max() < 1e-6
    for p in model.parameters():
        state = loro.state[p]
        assert state["exp_avg"].count_nonzero() == 0 and state["exp_avg_sq"].count_nonzero() == 0
        assert state["step"] == 4

    full, pair = _clones(model.full.parameters()), _clones([model.down.weight, model.up.weight])
    adamw = torch.optim.AdamW(full, lr=LR / 6, weight_decay=0.1, foreach=False)
    scaled = torch.optim.AdamW(pair, lr=LR / 6 * RANK / HIDDEN, foreach=False, weight_decay=0.0)
    grads = _grads(model, 4)
    _set(model.parameters(), grads)
    _set([*full, *pair], grads)
    loro.step()
    adamw.step()
    scaled.step()
    for mine, theirs in zip(model.parameters(), [*full, *pair], strict=True):
        assert torch.equal(mine, theirs)


def test_the_rewarm_factors():
    factors = [rewarm_factor(t, 4, 2) for t in range(1, 14)]
    assert factors == [1, 1, 1, 1, 1 / 3, 2 / 3, 1, 1, 1 / 3, 2 / 3, 1, 1, 1 / 3]
    assert [rewarm_factor(t, 1, 5) for t in (1, 2, 3)] == [1, 1 / 6, 1 / 6]
    assert [rewarm_factor(t, 3, 0) for t in range(1, 8)] == [1] * 7


def test_the_step_counter_survives_dcp_state_dict_save_and_load(tmp_path):
    """Three steps, a DCP checkpoint of the flattened optimizer state dict, a fresh model
    and optimizer loading it: the fourth step is exact on both, to the bit."""
    options = StateDictOptions(flatten_optimizer_state_dict=True)
    model = Toy()
    loro = _loro(model)
    for step in range(3):
        _set(model.parameters(), _grads(model, step))
        loro.step()
    saved = get_optimizer_state_dict(model, loro, options=options)
    assert saved["state.up.weight.step"] == 3
    dcp.save(saved, checkpoint_id=str(tmp_path))

    resumed = Toy(seed=1)
    resumed.load_state_dict(model.state_dict())
    fresh = _loro(resumed)
    loaded = get_optimizer_state_dict(resumed, fresh, options=options)
    assert loaded["state.up.weight.step"] == 0
    dcp.load(loaded, checkpoint_id=str(tmp_path))
    set_optimizer_state_dict(resumed, fresh, loaded, options=options)
    for m in (model, resumed):
        _set(m.parameters(), _grads(m, 3))
    loro.step()
    fresh.step()
    b, a = model.up.weight, model.down.weight
    assert torch.dist(b.T @ b, a @ a.T) < 1e-6  # step 4 was the exact step: balanced
    for mine, theirs in zip(model.parameters(), resumed.parameters(), strict=True):
        assert torch.equal(mine, theirs)
