"""Imprinting the head before training: the known rows onto their class prototypes, the novel rows' k-means
clusters onto the novel prototypes (``model.head_init = imprint``).

A randomly initialised head sends the novel rows to arbitrary prototypes, and the first pseudo-labels break that
symmetry differently for every seed. Imprinting starts every seed from the clustering the initial encoder's
features already hold: k-means (k-means++, best of several restarts) on the novel rows' features, then the linear
head that minimises the training loss's own MSE to the prototypes on the known labels and those clusters, in closed
form (ridge regression; Qi et al. 2018 imprint classifier weights from class means the same way). Which cluster
gets which novel prototype does not matter: the simplex ETF is symmetric. Pure functions on tensors, no I/O.
"""

from __future__ import annotations

import numpy as np
import torch
from scipy.cluster.vq import kmeans2


def kmeans(x: np.ndarray, k: int, seed: int, restarts: int = 10) -> np.ndarray:
    """Cluster labels ``[N]`` (``0..k-1``) of the rows of ``x`` ``[N, D]`` by k-means++ (``scipy.cluster.vq``), the
    restart of least within-cluster squared distance of ``restarts``, seeded by ``seed``."""
    if not 1 <= k <= len(x):
        raise ValueError(f"k-means needs 1 ≤ k ≤ rows, got k={k} for {len(x)} rows")
    x = np.asarray(x, dtype=np.float64)
    rng = np.random.default_rng(seed)
    best, best_cost = None, np.inf
    for _ in range(restarts):
        centroids, labels = kmeans2(x, k, minit="++", seed=rng)
        cost = float(((x - centroids[labels]) ** 2).sum())
        if cost < best_cost:
            best, best_cost = labels, cost
    return best


def ridge_fit(features: torch.Tensor, targets: torch.Tensor, ridge: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``(weight [d, D], bias [d])`` minimising ``Σ‖W f + b − t‖² + λ‖W‖²`` over the rows of ``features`` ``[N, D]``
    and ``targets`` ``[N, d]``, with ``λ = ridge ·`` the mean eigenvalue of the centred features' scatter (so
    ``ridge`` carries across feature scales). float64 inside."""
    f, t = features.double(), targets.double()
    f_mean, t_mean = f.mean(0), t.mean(0)
    fc, tc = f - f_mean, t - t_mean
    scatter = fc.T @ fc
    lam = ridge * float(torch.trace(scatter)) / scatter.shape[0]
    weight = torch.linalg.solve(scatter + lam * torch.eye(scatter.shape[0], dtype=f.dtype), fc.T @ tc).T
    return weight.float(), (t_mean - weight.double() @ f_mean).float()


@torch.no_grad()
def imprint_head(model, known_x: torch.Tensor, known_y: torch.Tensor, novel_x: torch.Tensor, seed: int,
                 ridge: float = 1.0, batch: int = 512) -> dict[str, float]:
    """Set ``model``'s linear head (one head, :class:`~ncdlr.models.heads.NCDModel`) so that the known rows
    ``known_x`` (labels ``known_y`` in ``0..Ks-1``) map onto their class prototypes and the novel rows ``novel_x``
    onto the novel prototype of their k-means cluster (``k = model.num_novel``). Rows are the model's input for one
    view (features ``[N, d_in]`` or activations ``[N, *shape]``). The encoder runs in eval mode (batch-norm running
    statistics) and is not changed. Returns ``{"fit_known": …, "fit_novel": …}``: the share of each block's rows
    the imprinted model assigns to its target column, argmax over all K."""
    if model.num_heads != 1 or model.head.kind != "linear":
        raise ValueError(f"model.head_init imprint fits one linear head (model.head linear, model.heads 1); "
                         f"got head {model.head.kind!r} × {model.num_heads}")
    was_training = model.training
    model.eval()
    try:
        feats = [torch.cat([model.encoder(part).float() for part in x.split(batch)]) if len(x) else
                 torch.zeros(0, model.head.net.in_features) for x in (known_x, novel_x)]
        unit_novel = torch.nn.functional.normalize(feats[1], dim=1).numpy()
        clusters = torch.as_tensor(kmeans(unit_novel, model.num_novel, seed), dtype=torch.long)
        targets = torch.cat([known_y.long(), model.num_known + clusters])
        rows = torch.cat(feats)
        weight, bias = ridge_fit(rows, model.class_prototypes().T[targets], ridge)  # targets' prototypes [N, D]
        model.head.net.weight.copy_(weight)
        model.head.net.bias.copy_(bias)
        pred = model.logits(model.head(rows)).argmax(1)
    finally:
        model.train(was_training)
    hit = pred == targets
    n_known = len(known_y)
    return {"fit_known": float(hit[:n_known].float().mean()) if n_known else 0.0,
            "fit_novel": float(hit[n_known:].float().mean()) if len(clusters) else 0.0}
