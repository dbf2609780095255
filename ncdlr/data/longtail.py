"""Known/novel class splits and synthetic long-tail profiles (method.md §1)."""

from __future__ import annotations

import math

import numpy as np


def long_tail_counts(n_max: int, num_classes: int, imbalance_ratio: float) -> list[int]:
    """Images kept per class for an exponential long tail.

    Class of rank ``c`` (0 = head) keeps ``floor(n_max · R^(-c/(C-1)))`` images, so the head keeps
    ``n_max`` and the tail ``floor(n_max / R)``.

    Args:
        n_max: images of the head class.
        num_classes: ``C``, classes in this half (known or novel).
        imbalance_ratio: ``R = n_max / n_min >= 1``.

    Returns:
        ``C`` counts, non-increasing.
    """
    if n_max < 1 or num_classes < 1:
        raise ValueError(f"need n_max >= 1 and num_classes >= 1, got {n_max}, {num_classes}")
    if imbalance_ratio < 1:
        raise ValueError(f"imbalance_ratio must be >= 1, got {imbalance_ratio}")
    if num_classes == 1:
        return [n_max]
    # The tiny slack keeps exact products (e.g. 500 · 50^-1 = 10) from flooring to 9 in floating point.
    return [
        int(math.floor(n_max * imbalance_ratio ** (-c / (num_classes - 1)) + 1e-9))
        for c in range(num_classes)
    ]


def split_known_novel(
    num_classes: int, seed: int, known_fraction: float = 0.5
) -> tuple[list[int], list[int]]:
    """Seeded known/novel split of class ids ``0..C-1``.

    The classes are permuted with ``numpy.random.default_rng(seed)``; the first
    ``ceil(C · known_fraction)`` are known (683 Herbarium classes → 342 known, as in the paper).
    Both lists keep the permutation order, which builders use as the seeded rank order.
    """
    if num_classes < 2:
        raise ValueError(f"need at least 2 classes to split, got {num_classes}")
    if not 0.0 < known_fraction < 1.0:
        raise ValueError(f"known_fraction must be in (0, 1), got {known_fraction}")
    order = np.random.default_rng(seed).permutation(num_classes).tolist()
    num_known = min(num_classes - 1, max(1, math.ceil(num_classes * known_fraction)))
    return order[:num_known], order[num_known:]
