"""The exact gradient norm (`runtime.grad_norm`): fp64 sums of squares, equal however the
gradients are sharded; multi-process layouts are compared in test_training_parity.py."""

from __future__ import annotations

import pytest
import torch

from boost_titan.runtime.grad_norm import clip_grad_norm_exact_, total_norm


def _grads(seed: int = 0) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [
        torch.randn(n, generator=generator) * scale
        for n, scale in ((1_000_003, 1e-3), (4096, 1.0), (7, 10.0))
    ]


def test_total_norm_is_the_fp64_norm():
    grads = _grads()
    want = torch.cat([g.double() for g in grads]).norm()
    assert total_norm(grads).dtype == torch.float64
    assert total_norm(grads).item() == pytest.approx(want.item(), rel=1e-15)


def test_total_norm_does_not_depend_on_the_sharding():
    """Splitting every gradient into shards (as TP does) leaves the exact norm unchanged to
    fp64 rounding."""
    grads = _grads()
    shards = [part for g in grads for part in g.chunk(4)]
    assert total_norm(shards).item() == pytest.approx(total_norm(grads).item(), rel=1e-14)


def test_clip_scales_by_the_exact_norm():
    params = [torch.nn.Parameter(torch.zeros_like(g)) for g in _grads()]
    for p, g in zip(params, _grads(), strict=True):
        p.grad = g.clone()
    norm = clip_grad_norm_exact_(params, max_norm=0.5)
    assert norm.item() == pytest.approx(torch.cat([g.double() for g in _grads()]).norm().item())
    clipped = torch.cat([p.grad.double() for p in params]).norm().item()
    assert clipped == pytest.approx(0.5, rel=1e-5)
    with pytest.raises(ValueError, match="2-norm"):
        clip_grad_norm_exact_(params, 1.0, norm_type=1.0)


def test_a_partial_gradient_is_reduced_before_the_norm():
    """A replicated weight used in a sharded region (TorchTitan's llama3 norms under
    sequence parallelism) has a Partial gradient: clipping reduces it (the optimizer then
    gets it reduced) instead of refusing the job."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Partial, Replicate

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))
        grad = _grads()[1]
        weight = torch.nn.Parameter(DTensor.from_local(torch.zeros_like(grad), mesh, [Replicate()]))
        weight.grad = DTensor.from_local(grad.clone(), mesh, [Partial()])
        norm = clip_grad_norm_exact_([weight], max_norm=1e9)
        assert weight.grad.placements == (Replicate(),)
        assert norm.item() == pytest.approx(grad.double().norm().item(), rel=1e-15)
    finally:
        dist.destroy_process_group()
