"""LORO's exact step on plain tensors (Mo et al., "LORO: Low-Rank Riemannian Optimization
for LLMs", ICLR 2025): one pair W = B A (B: d_out x r, A: r x d_in) moved to the rank-r
truncated SVD of W - lr * xi without forming a d_out x d_in matrix.

The direction. The optimizer hands per-factor directions D_B (d_out x r) and D_A (r x d_in):
Adam's m_hat / (sqrt(v_hat) + eps), not gradients, so no single W-space matrix G need give
D_B = G A^T and D_A = B^T G. They stand for the W-space direction

    D = B^+T D_A + (I - B B^+) D_B A^+T       (^+: pseudo-inverse, ^+T: its transpose),

the row-space part from A's direction (B^T D = D_A) and the rest of the column part from
B's (D A^T = D_B off B's column space). D is a tangent vector of the rank-r manifold at W
(P_T(D) = D, with P_T(X) = U U^T X + X V V^T - U U^T X V V^T for W = U S V^T), and when the
directions come from one G (D_B = G A^T, D_A = B^T G) it is exactly P_T(G). This is the
official code's choice (its K0 = R_B^-T D_A Q_A takes the A side); tests/unit/test_loro_exact.py
checks it against a dense SVD of W - lr * P_T(D).

The computation (Householder QR throughout: exact at any condition number, and at a zero or
rank-deficient direction, where a Gram matrix is singular):

    B = Q_B R_B, A^T = Q_A R_A;   Z_B = D_B R_A^+ (= D Q_A),   Z_A = D_A^T R_B^+ (= D^T Q_B)
    K0 = Z_A^T Q_A                 (= Q_B^T D Q_A, r x r)
    QR([Q_A, Z_A]) -> Q_1 K_1      (the part of Z_A off Q_A; Q_1 orthogonal to Q_A at any rank)
    QR([Q_B, Z_B]) -> Q_2 K_2      (the part of Z_B off Q_B)
    W - lr D = [Q_B, Q_2] [[R_B R_A^T - lr K0, -lr K_1^T], [-lr K_2, 0]] [Q_A, Q_1]^T
    core = U S V^T (its rank-r part); B <- [Q_B, Q_2] U S^1/2, A <- S^1/2 V^T [Q_A, Q_1]^T

so that B^T B = A A^T = S afterwards. The pseudo-inverses of the r x r triangles drop the
directions of a rank-deficient factor below its dtype's rounding (`torch.linalg.pinv`'s
default cutoff), where the tangent space of W is not defined.
"""

from __future__ import annotations

import torch
from torch import Tensor


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The exact step's precision: fp64 for fp64 factors, fp32 for every other dtype."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _complement(basis: Tensor, z: Tensor) -> tuple[Tensor, Tensor]:
    """An orthonormal Q orthogonal to `basis` (orthonormal columns) and K with
    (I - basis basis^T) z = Q K, from one Householder QR of [basis, z]."""
    q, r = torch.linalg.qr(torch.cat([basis, z], dim=1))
    k = basis.shape[1]
    return q[:, k:], r[k:, k:]


def exact_step(b: Tensor, a: Tensor, d_b: Tensor, d_a: Tensor, lr: float) -> tuple[Tensor, Tensor]:
    """The new (B, A) of one pair after LORO's exact step of size `lr` along the directions
    (the module docstring), in fp32 (fp64 for fp64 factors); the inputs are not changed."""
    dtype = compute_dtype(b.dtype)
    b, a, d_b, d_a = (t.detach().to(dtype) for t in (b, a, d_b, d_a))
    rank = b.shape[1]
    q_b, r_b = torch.linalg.qr(b)
    q_a, r_a = torch.linalg.qr(a.T)
    z_b = d_b @ torch.linalg.pinv(r_a)
    z_a = d_a.T @ torch.linalg.pinv(r_b)
    k0 = z_a.T @ q_a
    q_1, k_1 = _complement(q_a, z_a)
    q_2, k_2 = _complement(q_b, z_b)
    top = torch.cat([r_b @ r_a.T - lr * k0, -lr * k_1.T], dim=1)
    bottom = torch.cat([-lr * k_2, k_2.new_zeros(k_2.shape[0], k_1.shape[0])], dim=1)
    u, s, vh = torch.linalg.svd(torch.cat([top, bottom], dim=0), full_matrices=False)
    root = s[:rank].sqrt()
    new_b = torch.cat([q_b, q_2], dim=1) @ (u[:, :rank] * root)
    new_a = (root[:, None] * vh[:rank]) @ torch.cat([q_a, q_1], dim=1).T
    return new_b, new_a
