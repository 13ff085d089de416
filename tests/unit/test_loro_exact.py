"""LORO's exact step (`boost_titan.optim.loro_exact`) against an independent dense reference:
the rank-r truncated SVD of W - lr * P_T(D), with U, V from a dense SVD of W = B A and D the
W-space direction the factor directions stand for (the module docstring), built here from
pseudo-inverses, not from the QRs the step uses."""

from __future__ import annotations

import pytest
import torch

from boost_titan.optim.loro_exact import exact_step

D_OUT, D_IN, RANK = 24, 20, 5


def _pair(seed: int, dtype: torch.dtype = torch.float64) -> tuple[torch.Tensor, ...]:
    """Random B, A, D_B, D_A (the directions independent: not from one W-space matrix)."""
    g = torch.Generator().manual_seed(seed)
    shapes = [(D_OUT, RANK), (RANK, D_IN), (D_OUT, RANK), (RANK, D_IN)]
    return tuple(torch.randn(s, generator=g, dtype=torch.float64).to(dtype) for s in shapes)


def _projector(w: torch.Tensor, rank: int):
    """P_T at W: X -> U U^T X + X V V^T - U U^T X V V^T (U, V: W's top singular vectors)."""
    u, _, vh = torch.linalg.svd(w)
    pu, pv = u[:, :rank] @ u[:, :rank].T, vh[:rank].T @ vh[:rank]
    return lambda x: pu @ x + x @ pv - pu @ x @ pv


def _direction(b, a, d_b, d_a) -> torch.Tensor:
    """D = B^+T D_A + (I - B B^+) D_B A^+T."""
    b_pinv, a_pinv = torch.linalg.pinv(b), torch.linalg.pinv(a)
    return b_pinv.T @ d_a + (torch.eye(b.shape[0], dtype=b.dtype) - b @ b_pinv) @ d_b @ a_pinv.T


def _truncated(m: torch.Tensor, rank: int) -> torch.Tensor:
    u, s, vh = torch.linalg.svd(m)
    return u[:, :rank] * s[:rank] @ vh[:rank]


def _reference(b, a, d_b, d_a, lr: float) -> torch.Tensor:
    w = b @ a
    return _truncated(w - lr * _projector(w, RANK)(_direction(b, a, d_b, d_a)), RANK)


def _off_balance(b: torch.Tensor, a: torch.Tensor) -> float:
    """max |B^T B - A A^T| and the off-diagonal of B^T B: 0 for balanced factors."""
    gram = b.T @ b
    return max((gram - a @ a.T).abs().max(), (gram - torch.diag(gram.diagonal())).abs().max())


@pytest.mark.parametrize("lr", [0.05, 0.5, 3.0])
def test_the_exact_step_is_the_truncated_svd_of_the_tangent_step_in_fp64(lr):
    b, a, d_b, d_a = _pair(0)
    new_b, new_a = exact_step(b, a, d_b, d_a, lr)
    assert new_b.dtype == torch.float64
    assert (new_b @ new_a - _reference(b, a, d_b, d_a, lr)).abs().max() < 1e-10
    assert _off_balance(new_b, new_a) < 1e-10


def test_directions_of_one_w_space_gradient_give_its_tangent_projection():
    """D_B = G A^T, D_A = B^T G (true gradients): the step is the retraction of W - lr P_T(G)."""
    b, a, _, _ = _pair(1)
    g = torch.randn(D_OUT, D_IN, generator=torch.Generator().manual_seed(2), dtype=b.dtype)
    w = b @ a
    new_b, new_a = exact_step(b, a, g @ a.T, b.T @ g, 0.3)
    expected = _truncated(w - 0.3 * _projector(w, RANK)(g), RANK)
    assert (new_b @ new_a - expected).abs().max() < 1e-10


def test_the_direction_is_a_tangent_vector():
    b, a, d_b, d_a = _pair(3)
    d = _direction(b, a, d_b, d_a)
    assert (_projector(b @ a, RANK)(d) - d).abs().max() < 1e-12


def test_fp32_factors_step_in_fp32_within_1e_5_of_the_fp64_reference():
    b, a, d_b, d_a = _pair(4, torch.float32)
    new_b, new_a = exact_step(b, a, d_b, d_a, 0.5)
    assert new_b.dtype == torch.float32
    expected = _reference(*(t.double() for t in (b, a, d_b, d_a)), 0.5)
    error = (new_b.double() @ new_a.double() - expected).norm() / expected.norm()
    assert error < 1e-5


def test_lr_zero_keeps_the_product_and_balances_the_factors():
    b, a, d_b, d_a = _pair(5)
    b = b * torch.linspace(0.1, 10.0, RANK, dtype=b.dtype)  # unbalanced on purpose
    assert _off_balance(b, a) > 1.0
    new_b, new_a = exact_step(b, a, d_b, d_a, 0.0)
    assert (new_b @ new_a - b @ a).abs().max() < 1e-12
    assert _off_balance(new_b, new_a) < 1e-12


def test_the_step_over_lr_tends_to_minus_the_tangent_direction():
    """(B'A' - BA) / lr -> -P_T(D), the error shrinking linearly with lr (second order)."""
    b, a, d_b, d_a = _pair(6)
    w = b @ a
    tangent = _projector(w, RANK)(_direction(b, a, d_b, d_a))
    errors = []
    for lr in (1e-2, 1e-3, 1e-4):
        new_b, new_a = exact_step(b, a, d_b, d_a, lr)
        errors.append(((new_b @ new_a - w) / lr + tangent).norm().item())
    for big, small in zip(errors, errors[1:], strict=False):
        assert 5 < big / small < 20, errors
    assert errors[-1] < 1e-3 * tangent.norm()


def test_a_zero_direction_keeps_the_product():
    b, a, d_b, d_a = _pair(7)
    new_b, new_a = exact_step(b, a, torch.zeros_like(d_b), torch.zeros_like(d_a), 0.7)
    assert (new_b @ new_a - b @ a).abs().max() < 1e-12
    assert _off_balance(new_b, new_a) < 1e-12


def test_a_rank_deficient_direction_still_matches_the_reference():
    """A zero column of D_B and a rank-one D_A: the complements' Householder bases leave the
    factors' spaces where their R is zero, which must not reach the result."""
    b, a, d_b, d_a = _pair(8)
    d_b[:, 0] = 0
    d_a[1:] = d_a[:1]  # rank one
    new_b, new_a = exact_step(b, a, d_b, d_a, 0.5)
    assert (new_b @ new_a - _reference(b, a, d_b, d_a, 0.5)).abs().max() < 1e-10


def test_a_rank_deficient_factor_gives_finite_factors():
    b, a, d_b, d_a = _pair(9)
    b[:, 2] = 0  # B of rank r - 1
    d_a[2] = 0  # no gradient reaches A's row 2 through a zero column of B
    new_b, new_a = exact_step(b, a, d_b, d_a, 0.5)
    assert torch.isfinite(new_b).all() and torch.isfinite(new_a).all()
    # W has rank <= r, so the truncation moves at most as far as the step: 2 lr |D|
    spectral = [torch.linalg.matrix_norm(torch.linalg.pinv(t), ord=2) for t in (b, a)]
    bound = 2 * 0.5 * (spectral[0] * d_a.norm() + d_b.norm() * spectral[1])
    assert (new_b @ new_a - b @ a).norm() < bound
    same_b, same_a = exact_step(b, a, d_b, d_a, 0.0)
    assert (same_b @ same_a - b @ a).abs().max() < 1e-12
    assert _off_balance(same_b, same_a) < 1e-12


def test_wide_ranks_where_the_complements_are_narrower_than_r():
    """r > d/2: the complement of B's columns has d_out - r < r dimensions."""
    g = torch.Generator().manual_seed(10)
    b, a, d_b, d_a = (
        torch.randn(s, generator=g, dtype=torch.float64) for s in [(8, 6), (6, 7), (8, 6), (6, 7)]
    )
    w = b @ a
    new_b, new_a = exact_step(b, a, d_b, d_a, 0.4)
    expected = _truncated(w - 0.4 * _projector(w, 6)(_direction(b, a, d_b, d_a)), 6)
    assert (new_b @ new_a - expected).abs().max() < 1e-10
