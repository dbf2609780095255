"""Discovery metrics: one Hungarian matching over all classes, then per-class accuracies (method.md §5)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from scipy.optimize import linear_sum_assignment

GROUPS = ("head", "medium", "tail")


def label_pair(y_true: Sequence[int] | np.ndarray, y_pred: Sequence[int] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``y_true``, ``y_pred`` as int64 arrays ``[N]``; ValueError unless both are 1-D of equal length."""
    y_true = np.asarray(y_true, dtype=np.int64)
    y_pred = np.asarray(y_pred, dtype=np.int64)
    if y_true.shape != y_pred.shape or y_true.ndim != 1:
        raise ValueError(f"y_true and y_pred must be 1-D of equal length, got {y_true.shape} and {y_pred.shape}")
    return y_true, y_pred


def hungarian_mapping(y_true: Sequence[int] | np.ndarray, y_pred: Sequence[int] | np.ndarray) -> dict[int, int]:
    """Predicted label → true label maximising the number of matches (scipy ``linear_sum_assignment``).

    Predicted labels may be any integers, more or fewer than the true classes; a predicted cluster left
    unmatched is absent from the mapping (its instances count as errors).
    """
    y_true, y_pred = label_pair(y_true, y_pred)
    pred_ids, pred_idx = np.unique(y_pred, return_inverse=True)
    true_ids, true_idx = np.unique(y_true, return_inverse=True)
    counts = np.zeros((len(pred_ids), len(true_ids)), dtype=np.int64)
    np.add.at(counts, (pred_idx, true_idx), 1)
    rows, cols = linear_sum_assignment(counts, maximize=True)
    return {int(pred_ids[r]): int(true_ids[c]) for r, c in zip(rows, cols)}


def head_medium_tail(class_ids: Sequence[int], train_counts: Sequence[int]) -> dict[str, list[int]]:
    """Split ``class_ids`` 3:4:3 into head/medium/tail by training count (descending, ties by id).

    ``round(0.3·n)`` classes are head and as many tail; the rest are medium.
    """
    ids = sorted(class_ids, key=lambda c: (-int(train_counts[c]), c))
    n_edge = int(round(0.3 * len(ids)))
    return {"head": ids[:n_edge], "medium": ids[n_edge : len(ids) - n_edge], "tail": ids[len(ids) - n_edge :]}


def correct_under_matching(y_true: Sequence[int] | np.ndarray, y_pred: Sequence[int] | np.ndarray) -> np.ndarray:
    """``[N]`` bool: whether each prediction is right under the one Hungarian matching of predicted to true labels
    (:func:`hungarian_mapping`); a prediction of an unmatched cluster is wrong."""
    y_true = np.asarray(y_true, dtype=np.int64)
    mapping = hungarian_mapping(y_true, y_pred)
    return np.array([mapping.get(int(p), -1) for p in np.asarray(y_pred)], dtype=np.int64) == y_true


def planted_f1(y_true: Sequence[int] | np.ndarray, y_pred: Sequence[int] | np.ndarray,
               classes: Sequence[int]) -> dict[int, float]:
    """How well each *planted* class is found among clusters whose other rows carry no label.

    For a class ``c`` with rows ``R_c`` and a predicted cluster ``k`` of ``|k|`` rows (every row of ``y_pred``
    counts, labelled or not), ``F1(c, k) = 2·|R_c ∩ k| / (|R_c| + |k|)``: the harmonic mean of the share of the
    class in the cluster (recall) and of the cluster in the class (precision). A class split over several
    clusters loses recall; one merged into a larger cluster, or a cluster that swallowed much else, loses
    precision — the two failures a one-to-one matching over all classes would also punish, measured here
    without the labels of the other rows.

    Args:
        y_true: ``[N]`` a label for the rows of the planted classes, anything else (e.g. ``-1``) for the rest.
        y_pred: ``[N]`` predicted cluster of every row.
        classes: the planted class ids to score (each must have a row).

    Returns:
        ``{c: max_k F1(c, k)}`` in [0, 1].
    """
    y_true, y_pred = label_pair(y_true, y_pred)
    pred_ids, pred_idx = np.unique(y_pred, return_inverse=True)
    sizes = np.bincount(pred_idx, minlength=len(pred_ids))
    out = {}
    for c in classes:
        rows = y_true == c
        if not rows.any():
            raise ValueError(f"planted class {c} has no row")
        overlap = np.bincount(pred_idx[rows], minlength=len(pred_ids))
        out[int(c)] = float((2.0 * overlap / (rows.sum() + sizes)).max())
    return out


def cluster_accuracy(
    y_true: Sequence[int] | np.ndarray,
    y_pred: Sequence[int] | np.ndarray,
    num_known: int,
    train_counts: Sequence[int] | None = None,
) -> dict[str, float]:
    """All/Known/Novel accuracy under one Hungarian matching over all classes.

    Args:
        y_true: ``[N]`` true labels; known classes are ``0..num_known-1``, novel ``num_known..K-1``.
        y_pred: ``[N]`` predicted labels (any integers).
        num_known: ``Ks``.
        train_counts: optional ``[K]`` training images per class; enables the head/medium/tail keys.

    Returns:
        ``all``, ``known``, ``novel``: mean of per-class accuracies (the paper's metric) over the classes
        present in ``y_true``; ``all_inst``, ``known_inst``, ``novel_inst``: instance-averaged; with
        ``train_counts`` also ``known_head/medium/tail`` and ``novel_head/medium/tail`` (class-mean inside
        each 3:4:3 group of :func:`head_medium_tail`). A group with no test class is NaN.
    """
    y_true = np.asarray(y_true, dtype=np.int64)
    correct = correct_under_matching(y_true, y_pred)
    classes = np.unique(y_true)
    per_class = {int(c): float(correct[y_true == c].mean()) for c in classes}

    def class_mean(ids: Sequence[int]) -> float:
        vals = [per_class[c] for c in ids if c in per_class]
        return float(np.mean(vals)) if vals else float("nan")

    def inst(mask: np.ndarray) -> float:
        return float(correct[mask].mean()) if mask.any() else float("nan")

    known_ids = [int(c) for c in classes if c < num_known]
    novel_ids = [int(c) for c in classes if c >= num_known]
    result = {
        "all": class_mean(per_class),
        "known": class_mean(known_ids),
        "novel": class_mean(novel_ids),
        "all_inst": inst(np.ones_like(correct)),
        "known_inst": inst(y_true < num_known),
        "novel_inst": inst(y_true >= num_known),
    }
    if train_counts is not None:
        num_classes = len(train_counts)
        if classes.max() >= num_classes:
            raise ValueError(f"train_counts has {num_classes} classes but y_true contains label {int(classes.max())}")
        for half, ids in (("known", range(num_known)), ("novel", range(num_known, num_classes))):
            for group, members in head_medium_tail(list(ids), train_counts).items():
                result[f"{half}_{group}"] = class_mean(members)
    return result


def pseudo_label_sizes(counts: Sequence[float] | np.ndarray) -> dict[str, float]:
    """Label-free health of the novel clusters from how many pseudo-labels each got (hard: argmax per row).

    Args:
        counts: ``[Ku]`` pseudo-labels per novel cluster over some rows (e.g. an epoch's two views of every
            novel row); no ground truth is read.

    Returns:
        ``clusters_empty``: clusters that got none (a cluster that is never anyone's label is lost to discovery:
        with ``Ku`` set to the number of novel classes, at least that many classes are merged into others);
        ``cluster_imbalance``: the largest count over the smallest non-empty one (1 when all are equal; NaN
        without any pseudo-label), to read against the data's expected imbalance.
    """
    counts = np.asarray(counts, dtype=np.float64)
    if counts.ndim != 1 or counts.size == 0 or (counts < 0).any():
        raise ValueError(f"counts must be a non-empty 1-D array of non-negative counts, got shape {counts.shape}")
    alive = counts[counts > 0]
    return {"clusters_empty": float(counts.size - alive.size),
            "cluster_imbalance": float(alive.max() / alive.min()) if alive.size else float("nan")}
