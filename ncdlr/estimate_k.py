"""Estimating the number of novel classes ``Ku`` (method.md §6; paper §3.5 and Appendix, Alg. "estimate k").

The idea: cluster labeled (known) and unlabeled (novel) features together into ``Ks + k`` clusters with
agglomerative Ward clustering, and score each candidate ``k`` by how well the clusters recover the *known*
labels (Hungarian matching on the labeled instances only). The score is the paper's mixed metric

    score(k) = β · Acc_inst(k) + (1 - β) · Acc_class(k),      β = 0.5 (β = 1 is the paper's "baseline"),

where ``Acc_inst`` is the instance accuracy over labeled instances and ``Acc_class`` the mean of the ``Ks``
per-class accuracies (divided by ``Ks``; the authors' code divides by ``Ks - 1``). ``k`` is searched over
``[0, k_max]`` by the paper's bisection (:func:`bisect_num_novel`).

Scaling. Ward is computed ONCE as a tree and cut at each candidate ``k`` (a cut costs O(n)), so the search
costs one clustering. An exact Ward tree needs O(n²) memory, so beyond ``ward_points`` rows the features are
first summarised by k-means micro-clusters (``MiniBatchKMeans``, ``ward_points`` centres) and the Ward tree is
built on the micro-cluster centroids *weighted by their sizes* (:func:`weighted_ward_linkage`). That tree is
exactly Ward's greedy merge order on the full data under one constraint: points of the same micro-cluster
are merged first (they always share a cluster). Up to ``ward_points`` rows the tree is exact Ward
(``scipy.cluster.hierarchy.linkage``).

Pure NumPy/SciPy/scikit-learn: no Ray, no files.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from scipy.cluster.hierarchy import linkage
from scipy.optimize import linear_sum_assignment
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components
from sklearn.cluster import MiniBatchKMeans
from sklearn.decomposition import PCA

MICRO_CLUSTER_DIMS = 128  # PCA width for assigning rows to micro-clusters (the Ward step uses full features)
MICRO_CLUSTER_EPOCHS = 5  # MiniBatchKMeans passes over the data for the micro-clusters

__all__ = [
    "EstimateKConfig",
    "EstimateKResult",
    "KnownClusterScorer",
    "WardTree",
    "bisect_num_novel",
    "build_ward_tree",
    "cut_linkage",
    "estimate_num_novel",
    "known_cluster_accuracy",
    "synthetic_long_tail_features",
    "weighted_ward_linkage",
]


@dataclass(frozen=True)
class EstimateKConfig:
    """Settings of the ``Ku`` estimate.

    Attributes:
        k_max: upper end of the search range ``[0, k_max]`` for the number of novel classes. ``None``:
            ``2 · Ks`` (at least 10). Clamped so that ``Ks + k_max`` does not exceed the Ward tree's leaves.
        beta: β of the mixed metric; 0.5 is the paper's choice, 1.0 its instance-accuracy baseline.
        ward_points: largest number of rows clustered by exact Ward; above it, this many k-means
            micro-clusters are built first (memory ≈ 8 · ward_points² bytes).
        max_samples: rows used at all; a larger table is subsampled uniformly with ``seed``. ``None``: all.
        l2_normalize: L2-normalise features first (as the authors do for DINO features).
        seed: seeds the subsample and the k-means micro-clusters.
    """

    k_max: int | None = None
    beta: float = 0.5
    ward_points: int = 3000
    max_samples: int | None = 200_000
    l2_normalize: bool = True
    seed: int = 0

    def __post_init__(self) -> None:
        if self.k_max is not None and self.k_max < 0:
            raise ValueError(f"k_max must be >= 0, got {self.k_max}")
        if not 0.0 <= self.beta <= 1.0:
            raise ValueError(f"beta must lie in [0, 1], got {self.beta}")
        if self.ward_points < 2:
            raise ValueError(f"ward_points must be >= 2, got {self.ward_points}")
        if self.max_samples is not None and self.max_samples < 2:
            raise ValueError(f"max_samples must be >= 2 (or None for all rows), got {self.max_samples}")


@dataclass(frozen=True)
class EstimateKResult:
    """Outcome of :func:`estimate_num_novel`.

    ``evaluations`` maps every ``k`` the bisection scored to ``(score, instance_acc, class_mean_acc)``,
    in evaluation order. ``seconds`` is the wall time of the whole estimate (tree + search).
    """

    num_novel: int
    num_known: int
    score: float
    beta: float
    k_max: int
    evaluations: dict[int, tuple[float, float, float]]
    seconds: float
    num_rows: int
    num_ward_leaves: int
    approximate: bool
    tree_seconds: float = field(default=0.0)


# ----------------------------------------------------------------------------------------------------------
# Ward tree (built once) and its cuts
# ----------------------------------------------------------------------------------------------------------


def weighted_ward_linkage(points: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Ward linkage of weighted points, in SciPy's linkage format.

    Each point ``i`` stands for ``weights[i]`` observations sitting at ``points[i]`` (a micro-cluster
    centroid). The merge cost of clusters ``A``, ``B`` is Ward's

        d(A, B)² = 2 · n_A n_B / (n_A + n_B) · ‖c_A − c_B‖²

    (twice the increase of the within-cluster sum of squares, SciPy's convention), with ``n`` the summed
    weights, updated by the Lance–Williams formula. With unit weights this is
    ``scipy.cluster.hierarchy.linkage(points, "ward")``. Solved by the nearest-neighbour-chain algorithm
    on a dense ``[M, M]`` float64 matrix: O(M²) time and memory.

    Args:
        points: ``[M, D]`` centroids.
        weights: ``[M]`` positive sizes.

    Returns:
        ``[M-1, 4]`` float64 linkage ``Z`` (rows sorted by height; column 3 counts leaves, not weights).
    """
    x = np.asarray(points, dtype=np.float64)
    w = np.asarray(weights, dtype=np.float64)
    m = x.shape[0]
    if x.ndim != 2 or w.shape != (m,):
        raise ValueError(f"points must be [M, D] and weights [M]; got {x.shape} and {w.shape}")
    if m and not np.all(w > 0):
        raise ValueError("weights must all be positive")
    if m < 2:
        return np.empty((0, 4), dtype=np.float64)

    sq_norm = np.einsum("ij,ij->i", x, x)
    dist = np.maximum(sq_norm[:, None] + sq_norm[None, :] - 2.0 * (x @ x.T), 0.0)
    dist *= 2.0 * np.outer(w, w) / (w[:, None] + w[None, :])
    np.fill_diagonal(dist, np.inf)

    size = w.copy()
    leaves = np.ones(m)
    slot_height = np.zeros(m)
    merges: list[tuple[int, int, float]] = []  # (absorbed slot, keeping slot, height²) in creation order
    chain: list[int] = []
    active = np.ones(m, dtype=bool)
    for _ in range(m - 1):
        if not chain:
            chain.append(int(np.flatnonzero(active)[0]))
        while True:
            a = chain[-1]
            b = int(np.argmin(dist[a]))
            if len(chain) > 1 and dist[a, chain[-2]] <= dist[a, b]:
                b = chain[-2]  # ties go back down the chain, so it always terminates
                break
            chain.append(b)
        chain.pop()
        chain.pop()
        d_ab = dist[a, b]
        n_a, n_b = size[a], size[b]
        merged = ((n_a + size) * dist[a] + (n_b + size) * dist[b] - size * d_ab) / (n_a + n_b + size)
        dist[b, :] = merged
        dist[:, b] = merged
        dist[b, b] = np.inf
        dist[a, :] = np.inf
        dist[:, a] = np.inf
        active[a] = False
        size[b] = n_a + n_b
        # Ward never inverts; max() only guards against round-off so that sorting keeps children first.
        height2 = max(d_ab, slot_height[a], slot_height[b])
        slot_height[b] = height2
        leaves[b] += leaves[a]
        merges.append((a, b, height2, leaves[b]))

    order = np.argsort(np.array([h for _, _, h, _ in merges]), kind="stable")
    root = np.arange(m)
    cluster_id = np.arange(m)  # id (SciPy numbering) of the cluster whose union-find root is this slot

    def find(i: int) -> int:
        while root[i] != i:
            root[i] = root[root[i]]
            i = root[i]
        return i

    z = np.empty((m - 1, 4), dtype=np.float64)
    for step, index in enumerate(order):
        a, b, height2, count = merges[index]
        ra, rb = find(a), find(b)
        ia, ib = cluster_id[ra], cluster_id[rb]
        z[step] = (min(ia, ib), max(ia, ib), math.sqrt(height2), count)
        root[ra] = rb
        cluster_id[rb] = m + step
    return z


def cut_linkage(z: np.ndarray, num_clusters: int) -> np.ndarray:
    """Cut a height-sorted linkage into exactly ``num_clusters`` clusters (apply its first ``n - c`` merges).

    Unlike ``fcluster(criterion="maxclust")`` this never returns fewer clusters on tied heights.

    Args:
        z: ``[n-1, 4]`` SciPy linkage with rows in merge order.
        num_clusters: ``c`` in ``[1, n]``.

    Returns:
        ``[n]`` int64 cluster ids in ``0..c-1``.
    """
    n = z.shape[0] + 1
    if not 1 <= num_clusters <= n:
        raise ValueError(f"num_clusters must lie in [1, {n}] for a tree of {n} leaves, got {num_clusters}")
    steps = n - num_clusters
    children = z[:steps, :2].astype(np.int64).ravel()
    parents = n + np.repeat(np.arange(steps, dtype=np.int64), 2)
    graph = coo_matrix((np.ones(2 * steps), (children, parents)), shape=(n + steps, n + steps))
    _, component = connected_components(graph, directed=False)
    return np.unique(component[:n], return_inverse=True)[1].astype(np.int64)


@dataclass(frozen=True)
class WardTree:
    """A Ward tree over ``leaf_of_row.max() + 1`` leaves (rows or micro-clusters), cut per candidate ``k``.

    Attributes:
        linkage: ``[L-1, 4]`` SciPy linkage, rows sorted by height.
        leaf_of_row: ``[N]`` leaf of each input row (identity when exact).
        approximate: True when leaves are k-means micro-clusters.
        seconds: wall time to build it.
    """

    linkage: np.ndarray
    leaf_of_row: np.ndarray
    approximate: bool
    seconds: float

    @property
    def num_leaves(self) -> int:
        return self.linkage.shape[0] + 1

    def cut(self, num_clusters: int) -> np.ndarray:
        """``[N]`` cluster id of every input row for a cut into ``num_clusters`` clusters."""
        return cut_linkage(self.linkage, num_clusters)[self.leaf_of_row]


def build_ward_tree(features: np.ndarray, *, ward_points: int = 3000, seed: int = 0) -> WardTree:
    """Ward tree of ``features`` (``[N, D]``): exact up to ``ward_points`` rows, else on weighted micro-clusters.

    Above ``ward_points`` rows, ``MiniBatchKMeans(ward_points)`` (random init, ``MICRO_CLUSTER_EPOCHS``
    passes, on a ``MICRO_CLUSTER_DIMS``-d PCA projection when the features are wider) assigns every row to
    a micro-cluster; empty micro-clusters are dropped, centroids are recomputed as exact means of their rows
    in the full feature space, and :func:`weighted_ward_linkage` clusters the centroids weighted by row
    counts. (k-means++ init was measured at > 400 s for 3000 centres on 39k rows here, hence random init.)
    """
    start = time.perf_counter()
    x = np.asarray(features, dtype=np.float64)
    n = x.shape[0]
    if n < 2:
        raise ValueError(f"need at least 2 feature rows to cluster, got {n}")
    if n <= ward_points:
        z = linkage(x, method="ward")
        return WardTree(z, np.arange(n), approximate=False, seconds=time.perf_counter() - start)
    reduced = x.astype(np.float32)
    if reduced.shape[1] > MICRO_CLUSTER_DIMS:
        reduced = PCA(MICRO_CLUSTER_DIMS, svd_solver="randomized", random_state=seed).fit_transform(reduced)
    kmeans = MiniBatchKMeans(n_clusters=ward_points, init="random", max_iter=MICRO_CLUSTER_EPOCHS,
                             batch_size=4096, random_state=seed)
    assignment = kmeans.fit_predict(reduced)
    used, leaf_of_row = np.unique(assignment, return_inverse=True)
    counts = np.bincount(leaf_of_row, minlength=used.size).astype(np.float64)
    centroids = np.zeros((used.size, x.shape[1]))
    np.add.at(centroids, leaf_of_row, x)
    centroids /= counts[:, None]
    z = weighted_ward_linkage(centroids, counts)
    return WardTree(z, leaf_of_row.astype(np.int64), approximate=True, seconds=time.perf_counter() - start)


# ----------------------------------------------------------------------------------------------------------
# Scoring a cut on the labeled instances
# ----------------------------------------------------------------------------------------------------------


def known_cluster_accuracy(known_labels: np.ndarray, clusters: np.ndarray, num_known: int) -> tuple[float, float]:
    """Hungarian clustering accuracy of the labeled instances.

    Clusters are matched one-to-one to the ``Ks`` known classes (``linear_sum_assignment`` maximising the
    matched counts); unmatched clusters count as wrong.

    Args:
        known_labels: ``[Nl]`` labels in ``0..Ks-1``.
        clusters: ``[Nl]`` cluster ids (any non-negative ints) of the same instances.
        num_known: ``Ks``.

    Returns:
        ``(instance_acc, class_mean_acc)``: matched / ``Nl``, and the mean over the ``Ks`` classes of matched /
        class count (divided by ``Ks``).
    """
    if known_labels.shape != clusters.shape or known_labels.size == 0:
        raise ValueError("known_labels and clusters must be equal-length, non-empty [Nl] arrays")
    num_clusters = int(clusters.max()) + 1
    counts = np.bincount(clusters * num_known + known_labels, minlength=num_clusters * num_known)
    confusion = counts.reshape(num_clusters, num_known)
    rows, cols = linear_sum_assignment(confusion, maximize=True)
    matched = np.zeros(num_known)
    matched[cols] = confusion[rows, cols]
    class_sizes = np.bincount(known_labels, minlength=num_known)
    per_class = np.divide(matched, class_sizes, out=np.zeros(num_known), where=class_sizes > 0)
    return float(matched.sum() / known_labels.size), float(per_class.sum() / num_known)


class KnownClusterScorer:
    """Scores candidate novel-class counts ``k`` by cutting one Ward tree into ``Ks + k`` clusters.

    ``accuracies(k)`` is cached, so scoring several β on the same tree costs nothing extra.
    """

    def __init__(self, tree: WardTree, known_labels: np.ndarray, labeled_mask: np.ndarray, num_known: int):
        self.tree = tree
        self.known_labels = known_labels
        self.labeled_mask = labeled_mask
        self.num_known = num_known
        self._cache: dict[int, tuple[float, float]] = {}

    @property
    def k_limit(self) -> int:
        """Largest ``k`` the tree can be cut at (``Ks + k <= leaves``)."""
        return self.tree.num_leaves - self.num_known

    def accuracies(self, k: int) -> tuple[float, float]:
        """``(instance_acc, class_mean_acc)`` of the known instances for ``Ks + k`` clusters."""
        if k not in self._cache:
            clusters = self.tree.cut(self.num_known + k)[self.labeled_mask]
            self._cache[k] = known_cluster_accuracy(self.known_labels, clusters, self.num_known)
        return self._cache[k]

    def score(self, k: int, beta: float) -> float:
        """Mixed metric β · instance_acc + (1 − β) · class_mean_acc."""
        instance_acc, class_acc = self.accuracies(k)
        return beta * instance_acc + (1.0 - beta) * class_acc


# ----------------------------------------------------------------------------------------------------------
# The paper's bisection
# ----------------------------------------------------------------------------------------------------------


def bisect_num_novel(score: Callable[[int], float], k_low: int, k_high: int) -> tuple[int, dict[int, float]]:
    """The paper's bisection (Appendix, Alg. "estimating the number of novel categories") over ``[k_low, k_high]``.

    Keeps ``(low, med, high)`` with ``med = (low + high) // 2``; while ``high > low``: if
    ``score(high) > score(low)`` the low end moves to ``med``, else the high end does; ``med`` is
    recomputed. As printed, the loop never ends once ``high = low + 1`` and ``score(high) > score(low)``
    (``med == low``, so nothing moves). We stop at ``high - low <= 1`` and resolve that last pair the way the
    paper's branches intend: ``high`` if it scores strictly higher, else ``low`` (the printed else-branch
    result). Each ``score(k)`` is evaluated at most once.

    Returns:
        ``(k, evaluated)``: the estimate and every scored ``k`` → score, in evaluation order.
    """
    if k_low < 0 or k_high < k_low:
        raise ValueError(f"need 0 <= k_low <= k_high, got [{k_low}, {k_high}]")
    evaluated: dict[int, float] = {}

    def cached(k: int) -> float:
        if k not in evaluated:
            evaluated[k] = float(score(k))
        return evaluated[k]

    low, high = k_low, k_high
    med = (low + high) // 2
    cached(high), cached(med), cached(low)
    while high - low > 1:
        if cached(high) > cached(low):
            low = med
        else:
            high = med
        med = (low + high) // 2
        cached(med)
    return (high if cached(high) > cached(low) else low), evaluated


def estimate_num_novel(
    features: np.ndarray,
    labels: np.ndarray,
    labeled_mask: np.ndarray,
    config: EstimateKConfig = EstimateKConfig(),
    *,
    scorer: KnownClusterScorer | None = None,
) -> tuple[EstimateKResult, KnownClusterScorer]:
    """Estimate ``Ku`` from labeled + unlabeled features (method.md §6).

    Args:
        features: ``[N, D]`` frozen-encoder features of the known and novel training data.
        labels: ``[N]`` ints; only the labeled rows' values are read (any ids; remapped to ``0..Ks-1``).
        labeled_mask: ``[N]`` bool, True for labeled (known-class) rows.
        config: see :class:`EstimateKConfig`.
        scorer: reuse the tree of an earlier call (e.g. to score β = 1 as well); ``features`` are then
            ignored except for the row count check.

    Returns:
        ``(result, scorer)``.
    """
    start = time.perf_counter()
    x = np.asarray(features)
    labels = np.asarray(labels)
    mask = np.asarray(labeled_mask, dtype=bool)
    if x.ndim != 2 or labels.shape != (x.shape[0],) or mask.shape != (x.shape[0],):
        raise ValueError(f"features must be [N, D] with labels and labeled_mask [N]; got {x.shape}, "
                         f"{labels.shape}, {mask.shape}")
    if not mask.any():
        raise ValueError("no labeled (known-class) rows: the score needs labeled instances")
    if mask.all():
        raise ValueError("no unlabeled (novel) rows: nothing to estimate")
    if scorer is None:
        if not np.all(np.isfinite(x)):
            raise ValueError("features contain NaN or infinite values")
        if config.max_samples is not None and x.shape[0] > config.max_samples:
            keep = np.sort(np.random.default_rng(config.seed).choice(x.shape[0], config.max_samples, replace=False))
            x, labels, mask = x[keep], labels[keep], mask[keep]
        x = x.astype(np.float64)
        if config.l2_normalize:
            x = x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
        classes, known_labels = np.unique(labels[mask], return_inverse=True)
        tree = build_ward_tree(x, ward_points=config.ward_points, seed=config.seed)
        scorer = KnownClusterScorer(tree, known_labels.astype(np.int64), mask, int(classes.size))
    num_known = scorer.num_known
    k_max = config.k_max if config.k_max is not None else max(2 * num_known, 10)
    k_max = min(k_max, scorer.k_limit)
    k, scores = bisect_num_novel(lambda kk: scorer.score(kk, config.beta), 0, k_max)
    evaluations = {kk: (s, *scorer.accuracies(kk)) for kk, s in scores.items()}
    result = EstimateKResult(
        num_novel=k,
        num_known=num_known,
        score=scores[k],
        beta=config.beta,
        k_max=k_max,
        evaluations=evaluations,
        seconds=time.perf_counter() - start,
        num_rows=int(scorer.labeled_mask.size),
        num_ward_leaves=scorer.tree.num_leaves,
        approximate=scorer.tree.approximate,
        tree_seconds=scorer.tree.seconds,
    )
    return result, scorer


# ----------------------------------------------------------------------------------------------------------
# Known-truth data for checking the estimator
# ----------------------------------------------------------------------------------------------------------


def synthetic_long_tail_features(
    num_known: int = 10,
    num_novel: int = 10,
    *,
    n_max: int = 300,
    imbalance: float = 10.0,
    dim: int = 32,
    separation: float = 8.0,
    seed: int = 0,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Long-tailed isotropic Gaussian classes with a known number of novel classes.

    Class ``c`` (rank inside its half) gets ``floor(n_max · imbalance^(-c / (C_half - 1)))`` points
    (method.md §1), drawn from ``N(μ_c, I_dim)``; the means are independent ``N(0, (separation² / dim) I)``
    draws, so two means lie ≈ ``separation · √2`` apart against a within-class radius ≈ ``√dim``.

    Returns:
        ``features [N, dim]`` float32, ``labels [N]`` (known ``0..Ks-1``, novel ``Ks..K-1``),
        ``labeled_mask [N]`` (True for known classes).
    """
    rng = np.random.default_rng(seed)

    def counts(num_classes: int) -> list[int]:
        if num_classes == 1:
            return [n_max]
        return [max(1, math.floor(n_max * imbalance ** (-c / (num_classes - 1)))) for c in range(num_classes)]

    sizes = counts(num_known) + counts(num_novel)
    means = rng.normal(scale=separation / math.sqrt(dim), size=(len(sizes), dim))
    labels = np.repeat(np.arange(len(sizes)), sizes)
    features = (means[labels] + rng.normal(size=(labels.size, dim))).astype(np.float32)
    return features, labels, labels < num_known
