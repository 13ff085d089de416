"""Single-device building blocks: the one low-rank pair, with and without crossing."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from boost_titan.parallelize import LowRankLinear

RANK = 4


@pytest.mark.parametrize("activation", ["silu", None])
def test_low_rank_projection(activation):
    torch.manual_seed(0)
    p = LowRankLinear(8, 12, RANK, activation=activation)
    x = torch.randn(2, 3, 8)
    z = x @ p.down.weight.t()
    h = F.silu(z) if activation == "silu" else z
    y, latent = p.project(x)
    torch.testing.assert_close(latent, h)
    torch.testing.assert_close(y, h @ p.up.weight.t())
    torch.testing.assert_close(p(x), y)


def test_crossing_mixes_the_previous_latent():
    torch.manual_seed(0)
    p = LowRankLinear(8, 12, RANK, activation="silu", crossing=True)
    x, prev = torch.randn(5, 8), torch.randn(5, RANK)
    z = x @ p.down.weight.t() + prev @ p.cross.weight.t()
    want = F.silu(F.layer_norm(z, (RANK,), p.latent_norm.weight, p.latent_norm.bias))
    torch.testing.assert_close(p.project(x, prev)[1], want)
    with pytest.raises(ValueError, match="previous block's latent"):
        p(x)
