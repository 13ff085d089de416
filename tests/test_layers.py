"""Single-device building blocks: grouped latents equal per-projection latents (to the
last-bit differences of vectorised vs scalar activation kernels)."""

from __future__ import annotations

import pytest
import torch

from boost_titan.models.layers import LowRankLinear, group_latents

RANK = 4


@pytest.mark.parametrize("activation", ["silu", "identity"])
def test_group_latents_one_activation_call(activation):
    torch.manual_seed(0)
    projections = [LowRankLinear(8, 12, RANK, activation), LowRankLinear(8, 6, RANK, activation)]
    z = torch.randn(2, 3, 2 * RANK)
    h, hs = group_latents(projections, z, [None, None])
    expected = [p.latent(z_p) for p, z_p in zip(projections, z.split(RANK, dim=-1))]
    for a, b in zip(hs, expected):
        torch.testing.assert_close(a, b)
    torch.testing.assert_close(h, torch.cat(expected, dim=-1))
    assert all(h_p.untyped_storage().data_ptr() == h.untyped_storage().data_ptr() for h_p in hs)


def test_group_latents_with_crossing_use_each_projection():
    torch.manual_seed(0)
    projections = [LowRankLinear(8, 12, RANK, "silu", crossing=True) for _ in range(3)]
    z, prevs = torch.randn(5, 3 * RANK), [torch.randn(5, RANK) for _ in range(3)]
    h, hs = group_latents(projections, z, prevs)
    chunks = z.split(RANK, dim=-1)
    expected = [p.latent(c, prev) for p, c, prev in zip(projections, chunks, prevs)]
    assert all(torch.equal(a, b) for a, b in zip(hs, expected))
    assert torch.equal(h, torch.cat(expected, dim=-1))
    with pytest.raises(ValueError, match="previous block's latent"):
        group_latents(projections, z, [None] * 3)
