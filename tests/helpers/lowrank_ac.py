"""The small random model, batch, loss and gradient comparison of the low-rank AC tests
(one process and gloo ranks)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from boost_titan.boost_llama import BoostTransformer, flavor_args
from tests.helpers.distributed import randomize

VOCAB, BATCH, SEQ = 64, 2, 16


def build(arch: str = "cola", *, n_layers: int = 3, **kw) -> BoostTransformer:
    """A small model with GQA (8 heads, 4 kv heads) and every parameter random."""
    torch.manual_seed(0)
    args = flavor_args(
        "debug",
        vocab_size=VOCAB,
        arch=arch,
        dim=64,
        n_heads=8,
        n_kv_heads=4,
        ffn_dim=128,
        n_layers=n_layers,
        **kw,
    )
    model = BoostTransformer(args)
    model.init_weights()
    randomize(model)
    return model


def batch(seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(seed)
    return torch.randint(0, VOCAB, (BATCH, SEQ)), torch.randint(0, VOCAB, (BATCH, SEQ))


def loss_of(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(0, 1))


def grads(model: nn.Module) -> dict[str, torch.Tensor]:
    """Full gradients by the unwrapped parameter name (AC and compile add prefixes)."""
    out = {}
    for name, p in model.named_parameters():
        if p.grad is None:
            continue
        g = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
        name = name.replace("_checkpoint_wrapped_module.", "").replace("_orig_mod.", "")
        out[name] = g.detach().clone()
    return out


def assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], rtol: float = 1e-6):
    assert a.keys() == b.keys()
    for name in a:
        scale = a[name].abs().max().clamp_min(1e-30)
        assert ((a[name] - b[name]).abs().max() / scale).item() <= rtol, name
