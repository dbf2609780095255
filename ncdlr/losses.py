"""Losses against fixed prototypes (method.md §3)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor


def _soft_targets(targets: Tensor, num_classes: int, n: int) -> Tensor:
    if targets.ndim == 1:
        if targets.shape[0] != n:
            raise ValueError(f"targets [N] must match z's N={n}, got {targets.shape[0]}")
        if targets.numel() and (targets.min() < 0 or targets.max() >= num_classes):
            raise ValueError(f"hard targets must lie in [0, {num_classes}), got range [{int(targets.min())}, {int(targets.max())}]")
        return F.one_hot(targets.long(), num_classes).float()
    if targets.shape != (n, num_classes):
        raise ValueError(f"soft targets must be [N, K] = [{n}, {num_classes}], got {tuple(targets.shape)}")
    return targets


def _row_mean(per_row: Tensor, weights: Tensor | None) -> Tensor:
    """``mean_i l_i``, or with ``weights [N]`` (≥ 0) the weighted mean ``Σ_i w_i l_i / Σ_i w_i``."""
    if weights is None:
        return per_row.mean()
    if weights.shape != per_row.shape:
        raise ValueError(f"weights must be [N] = [{per_row.shape[0]}], got {tuple(weights.shape)}")
    weights = weights.to(per_row.dtype)
    return (weights * per_row).sum() / weights.sum()


def prototype_mse(z: Tensor, prototypes: Tensor, targets: Tensor, weights: Tensor | None = None) -> Tensor:
    """``mean_i Σ_k q_ik ‖z_i - p_k‖²`` (for unit ``z``: ``mean_i Σ_k q_ik (2 - 2 z_i·p_k)``).

    Args:
        z: ``[N, D]`` embeddings (normalised in ncdlr; the squared distance is exact either way).
        prototypes: ``[D, K]`` fixed prototypes (all classes, or just the novel block ``P^u``).
        targets: hard labels ``[N]`` in ``[0, K)`` or soft labels ``[N, K]`` with rows summing to 1.
        weights: optional ``[N]`` row weights (≥ 0, not all 0): the mean becomes ``Σ_i w_i l_i / Σ_i w_i``
            (:func:`class_balance_weights`).

    Returns:
        scalar loss (mean over the batch, or its weighted mean).
    """
    q = _soft_targets(targets, prototypes.shape[1], z.shape[0])
    sq_dist = (z * z).sum(1, keepdim=True) - 2 * z @ prototypes + (prototypes * prototypes).sum(0)[None, :]
    return _row_mean((q * sq_dist).sum(1), weights)


def prototype_cross_entropy(z: Tensor, prototypes: Tensor, targets: Tensor, temperature: float = 0.1,
                            weights: Tensor | None = None) -> Tensor:
    """Cross-entropy on cosine logits ``z·p_k / T`` (the ablation of Table 5 and UNO's loss).

    Shapes and ``weights`` as in :func:`prototype_mse`; ``temperature`` 0.1 as in UNO.
    """
    q = _soft_targets(targets, prototypes.shape[1], z.shape[0])
    log_p = torch.log_softmax(z @ prototypes / temperature, dim=1)
    return _row_mean(-(q * log_p).sum(1), weights)


def class_balance_weights(counts: Tensor | Sequence[float], power: float) -> Tensor:
    """``[C]`` per-class loss weights ``n_c^(−power)`` from the classes' training counts ``counts [C]`` (rows), scaled to
    a largest weight of 1 (the losses normalise by the batch's weights, so only the ratios matter).

    ``power`` 0 gives equal weights (the plain mean), 1 the class-balanced weighting: over a batch the weighted mean
    then counts each class about equally, whatever its count. A class with no training row gets weight 0.
    """
    if not power >= 0:  # also refuses NaN
        raise ValueError(f"power must be >= 0, got {power}")
    counts = torch.as_tensor(counts, dtype=torch.float64)
    if counts.ndim != 1 or not bool((counts >= 0).all()) or not bool((counts > 0).any()):
        raise ValueError(f"counts must be [C] non-negative training counts with one above 0, got {counts.tolist()}")
    weights = torch.where(counts > 0, counts.clamp(min=1.0) ** -power, torch.zeros_like(counts))
    return (weights / weights.max()).float()


def known_novel_cross_entropy(z: Tensor, prototypes: Tensor, num_known: int, is_novel: Tensor,
                              temperature: float = 0.1) -> Tensor:
    """Binary cross-entropy of *which block* a row belongs to, known or novel, from the cosine logits ``z·p_k / T``.

    The probability of the novel block is the softmax mass of its columns, ``p(novel) = Σ_{k ≥ Ks} softmax_k``, so
    the loss of a row is ``logsumexp_all − logsumexp_{its block}``. Within a block the columns do not compete: a row
    is not pushed towards any one class, only out of the other block. The targets are exact in discovery (labelled
    rows are known, unlabelled rows novel), unlike a pseudo-label.

    Args:
        z: ``[N, D]`` embeddings.
        prototypes: ``[D, K]`` prototypes, known columns first.
        num_known: ``Ks``, the number of known columns (``0 < Ks < K``).
        is_novel: ``[N]`` bool, True for an unlabelled (novel) row.
        temperature: ``T`` of the logits (UNO's 0.1).

    Returns:
        scalar loss (mean over the rows; 0 for ``N = 0``).
    """
    num_classes = prototypes.shape[1]
    if not 0 < num_known < num_classes:
        raise ValueError(f"num_known must lie in (0, K={num_classes}), got {num_known}")
    if is_novel.shape != (z.shape[0],):
        raise ValueError(f"is_novel must be [N] = [{z.shape[0]}], got {tuple(is_novel.shape)}")
    if z.shape[0] == 0:
        return z.sum() * 0.0
    logits = z @ prototypes / temperature
    known = torch.logsumexp(logits[:, :num_known], dim=1)
    novel = torch.logsumexp(logits[:, num_known:], dim=1)
    return (torch.logsumexp(logits, dim=1) - torch.where(is_novel, novel, known)).mean()
