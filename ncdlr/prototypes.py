"""Equiangular (simplex ETF) class prototypes, fixed for all classes (method.md §2).

The prototype matrix ``P ∈ R^{D×K}`` has unit-norm columns with pairwise cosine ``-1/(K-1)``:
the K vertices of a regular simplex, the most separated configuration of K unit vectors. It is
derived from a seed only, never trained, and stored in every checkpoint.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def simplex_etf(dim: int, num_classes: int, seed: int = 0) -> Tensor:
    """Simplex equiangular tight frame ``P = sqrt(K/(K-1)) · U · (I_K - 11ᵀ/K)``.

    ``U ∈ R^{D×K}`` has orthonormal columns from the QR decomposition of a seeded Gaussian matrix.
    When ``D = K - 1`` no ``D×K`` matrix has orthonormal columns; then ``U · (I - 11ᵀ/K)`` is replaced
    by ``U' Bᵀ`` with ``U' ∈ R^{D×(K-1)}`` orthonormal and ``B`` an orthonormal basis of ``1^⊥`` — the
    same Gram matrix, so the same geometry.

    Args:
        dim: feature dimension ``D``; must satisfy ``D >= K - 1``.
        num_classes: number of classes ``K >= 2``.
        seed: seed of the random rotation; the same seed gives the same prototypes on any machine.

    Returns:
        ``[D, K]`` float32 tensor; column ``k`` is the prototype ``p_k`` (unit norm).

    Raises:
        ValueError: if ``K < 2`` or ``D < K - 1`` (a simplex of K vertices needs K-1 dimensions).
    """
    if num_classes < 2:
        raise ValueError(f"simplex_etf needs num_classes >= 2, got {num_classes}")
    if dim < num_classes - 1:
        raise ValueError(
            f"simplex_etf needs dim >= num_classes - 1 (a K-simplex spans K-1 dimensions), "
            f"got dim={dim}, num_classes={num_classes}; widen the head (method.md §2)"
        )
    k = num_classes
    gen = torch.Generator().manual_seed(seed)
    centring = torch.eye(k, dtype=torch.float64) - 1.0 / k
    if dim >= k:
        gaussian = torch.randn(dim, k, generator=gen, dtype=torch.float64)
        u, _ = torch.linalg.qr(gaussian)  # [D, K], orthonormal columns
        frame = u @ centring
    else:
        gaussian = torch.randn(dim, k - 1, generator=gen, dtype=torch.float64)
        u, _ = torch.linalg.qr(gaussian)  # [D, K-1]
        basis, _ = torch.linalg.qr(centring[:, : k - 1])  # [K, K-1], orthonormal basis of 1^⊥
        frame = u @ basis.T
    return (math.sqrt(k / (k - 1)) * frame).to(torch.float32)
