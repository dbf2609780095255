"""Classifier re-training (+cRT; Kang et al., 2020) on frozen embeddings with class-balanced sampling.

After training, the embeddings ``z`` of the known (labelled) and novel (pseudo-labelled: argmax of the
trained model over the novel columns) training rows are frozen; only the prototype layer is re-trained,
starting from the trained prototypes (the ETF for ncdlr), as a normalised cosine classifier with
cross-entropy on ``z·w_k / T``. Each epoch draws as many rows as the table holds with
``torch.utils.data.WeightedRandomSampler`` (weight ``1 / count`` of the row's class), so every class with
at least one row is drawn equally often in expectation.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.data import WeightedRandomSampler

from ncdlr.losses import prototype_cross_entropy


def class_balanced_sampler(labels: Tensor, num_samples: int, generator: torch.Generator) -> WeightedRandomSampler:
    """Sampler over the rows of ``labels [N]`` with probability ∝ 1 / (count of the row's class)."""
    if labels.ndim != 1 or labels.numel() == 0:
        raise ValueError(f"labels must be a non-empty [N] tensor, got shape {tuple(labels.shape)}")
    counts = torch.bincount(labels.long())
    weights = 1.0 / counts[labels.long()].double()
    return WeightedRandomSampler(weights, num_samples, replacement=True, generator=generator)


def retrain_classifier(z: Tensor, labels: Tensor, prototypes: Tensor, *, epochs: int = 10, batch_size: int = 256,
                       lr: float = 1e-2, temperature: float = 0.1, seed: int = 0) -> Tensor:
    """Re-train the prototype layer on frozen ``z [N, D]`` with class-balanced batches.

    Args:
        z: ``[N, D]`` frozen unit embeddings; ``labels [N]`` in ``0..K-1`` (true known + pseudo novel).
        prototypes: ``[D, K]`` initial prototypes (normalised columns).

    Returns:
        ``[D, K]`` re-trained prototypes, columns unit norm (detached).
    """
    if z.shape[0] != labels.shape[0] or z.shape[1] != prototypes.shape[0]:
        raise ValueError(f"z [N, D], labels [N], prototypes [D, K] disagree: {tuple(z.shape)}, "
                         f"{tuple(labels.shape)}, {tuple(prototypes.shape)}")
    z, labels = z.detach(), labels.long()
    weight = torch.nn.Parameter(prototypes.detach().clone())
    optimizer = torch.optim.Adam([weight], lr=lr)
    generator = torch.Generator().manual_seed(seed)
    sampler = class_balanced_sampler(labels, z.shape[0], generator)
    for _ in range(epochs):
        order = torch.tensor(list(sampler))
        for idx in order.split(batch_size):
            loss = prototype_cross_entropy(z[idx], F.normalize(weight, dim=0), labels[idx], temperature)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
    return F.normalize(weight.detach(), dim=0)
