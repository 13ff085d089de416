"""Fused online-RMSNorm kernels: the Triton path (under TRITON_INTERPRET on CPU, compiled on
CUDA when present) equals the torch reference, and the product's online RMSNorm built on
them (`parallelize.norms.online_rmsnorm_down`) matches torch autograd of the plain norm +
projections.

Tolerances: fp32 outputs within fp32 summation-order error (rtol 1e-5); bf16 outputs
within one bf16 ulp (rtol 2**-7), since the interpreter's fp32->bf16 casts truncate where
torch (and the compiled kernel) round to nearest even.
"""

from __future__ import annotations

import sys

import pytest
import torch
import torch.nn.functional as F

from boost_titan.kernels import (
    partial_backward_reference,
    partial_stats_reference,
    rmsnorm_partial_backward,
    rmsnorm_partial_stats,
)

TRITON_MODULE = "boost_titan.kernels._rmsnorm_triton"
# 3-D with d not a power of 2; two backward row groups (256 + 44 rows) and two column
# chunks (512 + 88, masked); a power of 2; d = 1.
SHAPES = [(2, 3, 40), (300, 600), (7, 64), (5, 1)]
DTYPES = [torch.float32, torch.bfloat16]
TOL = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.bfloat16: dict(rtol=2**-7, atol=1e-5)}


@pytest.fixture
def triton_interpret(monkeypatch: pytest.MonkeyPatch):
    """Force the Triton path on CPU through the interpreter. `triton.jit` reads
    TRITON_INTERPRET when it decorates, so the kernel module is imported afresh here and
    dropped afterwards (a later import compiles for the GPU again). Not on a CUDA machine:
    there triton.language's own helpers were decorated for the GPU when triton was first
    imported, and the interpreter refuses them (triton 3.6: "Cannot call @triton.jit'd
    outside of the scope of a kernel"); the same kernels compile and run on the GPU there
    (`test_compiled_triton_matches_reference`)."""
    if torch.cuda.is_available():
        pytest.skip("CUDA machine: the kernels are tested compiled for the GPU instead")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setenv("BOOST_TITAN_TRITON", "1")
    sys.modules.pop(TRITON_MODULE, None)
    yield
    sys.modules.pop(TRITON_MODULE, None)


def _inputs(shape: tuple[int, ...], dtype: torch.dtype, device: str) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(0)
    x, gsx = (torch.randn(shape, generator=gen).to(device, dtype) for _ in range(2))
    weight = torch.randn(shape[-1], generator=gen).to(device, dtype)
    coef = torch.randn(*shape[:-1], 1, generator=gen).to(device)
    return x, weight, gsx, coef


def _check_against_reference(shape: tuple[int, ...], dtype: torch.dtype, device: str) -> None:
    x, weight, gsx, coef = _inputs(shape, dtype, device)
    scaled, sum_sq = rmsnorm_partial_stats(x, weight)
    ref_scaled, ref_sum_sq = partial_stats_reference(x, weight)
    assert scaled.dtype == dtype and sum_sq.dtype == torch.float32
    assert sum_sq.shape == (*shape[:-1], 1)
    torch.testing.assert_close(scaled, ref_scaled, rtol=TOL[dtype]["rtol"], atol=0)
    torch.testing.assert_close(sum_sq, ref_sum_sq, rtol=1e-5, atol=1e-6)

    grad_x, grad_weight = rmsnorm_partial_backward(x, weight, gsx, coef)
    ref_grad_x, ref_grad_weight = partial_backward_reference(x, weight, gsx, coef)
    assert grad_x.dtype == dtype and grad_weight.dtype == dtype
    torch.testing.assert_close(grad_x, ref_grad_x, **TOL[dtype])
    torch.testing.assert_close(grad_weight, ref_grad_weight, rtol=TOL[dtype]["rtol"], atol=1e-4)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_interpreted_triton_matches_reference(triton_interpret, shape, dtype):
    _check_against_reference(shape, dtype, "cpu")
    kernel = sys.modules[TRITON_MODULE]._stats_kernel
    assert type(kernel).__name__ == "InterpretedFunction"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_compiled_triton_matches_reference(shape, dtype):
    _check_against_reference(shape, dtype, "cuda")


@pytest.fixture(scope="module")
def one_rank_group():
    """A 1-process gloo group: the product's online RMSNorm runs as under TP, its
    all-reduce being an identity."""
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield dist.group.WORLD
    dist.destroy_process_group()


@pytest.mark.parametrize("chunks", [1, 3], ids=["one-block", "3-blocks"])
@pytest.mark.parametrize("scale", [1.0, 1e-3], ids=["unit-scale", "eps-scale"])
@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_online_rmsnorm_down_matches_torch(request, one_rank_group, backend, scale, chunks):
    """The product's `online_rmsnorm_down` (one rank) equals F.rms_norm + F.linear for
    two down-projections, forward and every gradient, with a random norm weight far from 1;
    at `eps-scale` the mean square is comparable to eps, so a wrong eps shows. With 3
    overlapped row blocks of its 10 tokens (4 + 3 + 3) too."""
    from boost_titan.parallelize.norms import online_rmsnorm_down

    if backend == "triton":
        request.getfixturevalue("triton_interpret")
    gen = torch.Generator().manual_seed(0)
    d, eps = 48, 1e-6
    x = scale * torch.randn(2, 5, d, generator=gen)
    weight = 0.5 + torch.rand(d, generator=gen)
    downs = [torch.randn(r, d, generator=gen) / 7 for r in (12, 8)]
    grads = [torch.randn(2, 5, r, generator=gen) for r in (12, 8)]
    leaves = [t.clone().requires_grad_() for t in (x, weight, *downs)]
    outs = online_rmsnorm_down(leaves[0], leaves[1], leaves[2:], d, eps, one_rank_group, chunks)
    torch.autograd.backward(outs, grads)
    ref = [t.clone().requires_grad_() for t in (x, weight, *downs)]
    normed = F.rms_norm(ref[0], (d,), ref[1], eps)
    ref_outs = [F.linear(normed, down) for down in ref[2:]]
    torch.autograd.backward(ref_outs, grads)
    for out, ref_out in zip(outs, ref_outs, strict=True):
        torch.testing.assert_close(out, ref_out, rtol=1e-5, atol=1e-6)
    for leaf, want in zip(leaves, ref, strict=True):
        torch.testing.assert_close(
            leaf.grad, want.grad, rtol=1e-4, atol=1e-5 * want.grad.abs().max().item()
        )


@pytest.mark.parametrize("chunks", [2, 4])
def test_overlapped_linears_match_torch(one_rank_group, chunks):
    """Row- and column-parallel linears with their all-reduces in row blocks (one rank):
    batch 1 (the blocks cut the sequence) and 7 tokens (uneven blocks), every gradient."""
    from boost_titan.parallelize import comm

    gen = torch.Generator().manual_seed(0)
    x = torch.randn(1, 7, 12, generator=gen)
    weights = [torch.randn(5, 12, generator=gen), torch.randn(3, 12, generator=gen)]
    grads = [torch.randn(1, 7, 5, generator=gen), torch.randn(1, 7, 3, generator=gen)]
    leaves = [t.clone().requires_grad_() for t in (x, *weights)]
    outs = [
        comm.row_linear(leaves[0], leaves[1], one_rank_group, chunks),
        *comm.column_linears(leaves[0], leaves[1:], one_rank_group, chunks=chunks),
    ]
    torch.autograd.backward(outs, [grads[0], grads[0], grads[1]])
    ref = [t.clone().requires_grad_() for t in (x, *weights)]
    ref_outs = [F.linear(ref[0], ref[1]), F.linear(ref[0], ref[1]), F.linear(ref[0], ref[2])]
    torch.autograd.backward(ref_outs, [grads[0], grads[0], grads[1]])
    for out, want in zip(outs, ref_outs, strict=True):
        torch.testing.assert_close(out, want, rtol=1e-6, atol=1e-6)
    for leaf, want in zip(leaves, ref, strict=True):
        torch.testing.assert_close(leaf.grad, want.grad, rtol=1e-6, atol=1e-6)


def test_compiled_callers_get_inductors_fusion(triton_interpret):
    """Under torch.compile the kernels' callers trace the torch references (Inductor fuses
    them; a Triton launch would break the graph), with no graph break, even where eager
    takes the Triton path."""
    x, weight, gsx, coef = _inputs((4, 40), torch.float32, "cpu")

    def both(x, weight, gsx, coef):
        return (*rmsnorm_partial_stats(x, weight), *rmsnorm_partial_backward(x, weight, gsx, coef))

    compiled = torch.compile(both, backend="aot_eager", fullgraph=True)
    want = (*partial_stats_reference(x, weight), *partial_backward_reference(x, weight, gsx, coef))
    for got, ref in zip(compiled(x, weight, gsx, coef), want, strict=True):
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
