"""A norm group applies its consumers' shared SiLU once, on its contiguous output
(`GroupInstance.shared_activation`, `GroupActivation`): the loss and every gradient are
bit for bit those of the former path (each pair's SiLU on its strided columns, switched
back on here by turning the shared activation off), with fewer SiLU calls.

One process on a fake process group (`fake_tp_mesh`): at TP > 1 its collectives return
this rank's own partial sums, so both paths compute the same function on rank 0 and must
agree to the bit. Latent widths per rank are multiples of 32 floats (rank 64: BTP's whole
latents, vanilla's TP2 halves): there ATen runs SiLU
vectorised on strided columns as on the contiguous tensor (narrower columns went through
its scalar loop, within one fp32 ulp of the vectorised one).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from boost_titan.bench.measure.fake_group import fake_tp_mesh
from boost_titan.boost_llama import BoostTransformer, flavor_args
from boost_titan.boost_llama.strategies import build_plan
from boost_titan.parallelize import PlanError, apply_plan
from boost_titan.parallelize.groups import GroupInstance
from boost_titan.parallelize.low_rank import LowRankLinear
from boost_titan.parallelize.styles import local
from tests.helpers.distributed import randomize

VOCAB, BATCH, SEQ, LAYERS = 64, 2, 16, 2
SILU = (torch.ops.aten.silu.default, torch.ops.aten.silu_backward.default)


class CountSilu(TorchDispatchMode):
    """Counts SiLU forward and backward calls."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: Counter = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in SILU:
            self.calls[func] += 1
        return func(*args, **(kwargs or {}))


def _model(arch: str) -> BoostTransformer:
    torch.manual_seed(0)
    shape = dict(dim=64, n_heads=4, ffn_dim=128, n_layers=LAYERS, rank=64, max_seq_len=SEQ)
    model = BoostTransformer(flavor_args("debug", vocab_size=VOCAB, arch=arch, **shape))
    model.init_weights()
    randomize(model)
    return model


def _run(
    arch: str, strategy: str, tp: int, edit: Callable[[nn.Module], None] = lambda m: None
) -> tuple[torch.Tensor, dict, Counter]:
    """Loss, local gradients and SiLU calls of one forward and backward under the plan,
    on the model as `edit` leaves it."""
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=generator)
    with fake_tp_mesh(tp) as mesh:
        model = _model(arch)
        edit(model)
        apply_plan(model, mesh, build_plan(strategy, model.args, loss_parallel=False))
        with CountSilu() as count:
            logits = model(ids[:, :-1])
            loss = F.cross_entropy(logits.flatten(0, 1).float(), ids[:, 1:].flatten())
            loss.backward()
        grads = {n: local(p.grad) for n, p in model.named_parameters()}
    return loss.detach(), grads, count.calls


# SiLU forward calls per block: CoLA's 7 pairs, q/k/v and gate/up as one each
FUSED = {"cola": 4, "svd": 1}
SEPARATE = {"cola": 7, "svd": 1}


CASES = [
    ("cola", "btp", 1),
    ("cola", "btp", 4),
    ("cola", "vanilla", 2),
    ("lax", "btp", 4),
    ("lax", "vanilla", 2),
    ("svd", "btp", 2),
]


@pytest.mark.parametrize("arch,strategy,tp", CASES, ids=lambda c: str(c))
def test_group_silu_is_bit_equal_to_silu_per_pair(arch, strategy, tp, monkeypatch):
    loss, grads, calls = _run(arch, strategy, tp)
    monkeypatch.setattr(GroupInstance, "shared_activation", lambda self: None)
    loss_before, grads_before, calls_before = _run(arch, strategy, tp)
    assert torch.equal(loss, loss_before)
    assert grads.keys() == grads_before.keys()
    unequal = [n for n in grads if not torch.equal(grads[n], grads_before[n])]
    assert unequal == []
    # LaX (cola base): the first block's groups share SiLU; later blocks cross first
    fused = {"lax": FUSED["cola"] + SEPARATE["cola"] * (LAYERS - 1)}.get(arch)
    separate = SEPARATE["cola"] * LAYERS if arch == "lax" else SEPARATE[arch] * LAYERS
    want = fused if fused is not None else FUSED[arch] * LAYERS
    assert calls[SILU[0]] == calls[SILU[1]] == want
    assert calls_before[SILU[0]] == calls_before[SILU[1]] == separate


def _share_q_activation_with_o(model: nn.Module) -> None:
    attention = model.layers["1"].attention
    attention.wo.act = attention.wq.act


def test_an_activation_module_held_twice_keeps_activating(monkeypatch):
    """Block 1's wq and wo share one SiLU module: the attention group leaves its SiLUs to
    the pairs (passing that module through would drop wo's SiLU)."""
    loss, grads, calls = _run("cola", "btp", 2, _share_q_activation_with_o)
    monkeypatch.setattr(GroupInstance, "shared_activation", lambda self: None)
    loss_before, grads_before, _ = _run("cola", "btp", 2, _share_q_activation_with_o)
    assert torch.equal(loss, loss_before)
    assert all(torch.equal(grads[n], grads_before[n]) for n in grads)
    assert calls[SILU[0]] == FUSED["cola"] * LAYERS + 2  # block 1's q/k/v: 3 instead of 1


class ScaledLatent(LowRankLinear):
    """Applies its activation to twice its down's output, while `down_activation` says
    the activation runs straight on it."""

    def forward(self, x, prev=None):
        return self.up(self.act(2 * self.down(x)))


def test_activation_on_another_tensor_is_refused():
    model = _model("cola")
    model.layers["1"].attention.wk.__class__ = ScaledLatent
    with fake_tp_mesh(2) as mesh:
        apply_plan(model, mesh, build_plan("btp", model.args, loss_parallel=False))
        with pytest.raises(PlanError) as e:
            model(torch.zeros(1, SEQ, dtype=torch.long))
    assert str(e.value).splitlines() == [
        "layers.1.attention.wk's activation was called on another tensor than its down's "
        "output, but its down_activation says it runs straight on it (the group applies "
        "it once for all consumers); fix down_activation"
    ]
