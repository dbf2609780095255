"""AutoNovel (Han et al., 2020): ranking-statistics pairwise pseudo-labels (method.md §8).

Two novel samples are a positive pair when the index sets of their top-``k`` feature dimensions agree
(k = 5). The novel head's class probabilities ``p_i = softmax(z_i·P^u / T)`` (view 1) and ``p̄_j`` (view 2)
are trained with binary cross-entropy on ``p_i·p̄_j`` against the pair label, over all ``n²`` ordered
pairs of the batch; the known classes get the supervised cross-entropy over all K, and an optional MSE
consistency ties ``p`` and ``p̄``. Predictions are task-agnostic (argmax over all K), so, as in
AutoNovel's incremental-learning variant, the novel rows also get a cross-entropy over all K classes
with the other view's hard novel-head label ``Ks + argmax p̄`` (detached): without it nothing keeps novel
samples away from the known prototypes, and on our tiny tables 96 % of the novel test rows landed on
known classes. Features ranked: the detached embeddings ``z`` of view 1 (the
representation both heads read; in feature-table mode the head's output). Pairs are formed inside each
rank's batch, as in AutoNovel.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from ncdlr.method_settings import MethodConfig

from .base import NCDLR_LOSS_OPTIONS, Method, MethodConfigError


def ranking_pairs(features: Tensor, topk: int) -> Tensor:
    """Pairwise pseudo-labels ``[N, N]`` (float 0/1): 1 where two rows' top-``k`` dimension sets agree.

    Args:
        features: ``[N, D]`` (detached); ``topk`` ≤ D.

    Returns:
        symmetric ``[N, N]`` with ones on the diagonal.
    """
    if features.ndim != 2 or not 1 <= topk <= features.shape[1]:
        raise ValueError(f"need features [N, D] and 1 <= topk <= D, got {tuple(features.shape)} and topk={topk}")
    top = features.topk(topk, dim=1).indices.sort(dim=1).values  # [N, k] as sorted sets
    return (top[:, None, :] == top[None, :, :]).all(dim=2).float()


class AutoNovel(Method):
    """Ranking-statistics BCE on the novel head plus supervised CE on the known classes."""

    name = "autonovel"
    default_loss = "ce"
    requires = {"model.prototypes": "learnable", "labeler.use_buffer": False}
    file_resets = NCDLR_LOSS_OPTIONS  # AutoNovel as published: a dataset config's ncdlr loss options do not carry over
    soft_novel_targets = False  # pairwise labels: mixup blends only the known rows

    def __init__(self, cfg: MethodConfig):
        super().__init__(cfg)
        if cfg.topk < 1 or cfg.consistency < 0:
            raise MethodConfigError(f"method.topk must be >= 1 and method.consistency >= 0, got {cfg.topk}, {cfg.consistency}")
        self.topk = cfg.topk
        self.consistency = cfg.consistency

    def novel_targets(self, model, z1, z2, valid, step):
        """``[n, n]`` pair labels of the valid rows of this rank (no OT, no exchange)."""
        if not getattr(model, "learnable_prototypes", False):
            raise MethodConfigError("method 'autonovel' trains its prototypes: set model.prototypes=learnable")
        return ranking_pairs(z1[valid].detach(), self.topk), {"exchange": 0.0, "ot": 0.0}

    def novel_probabilities(self, model, z: Tensor) -> Tensor:
        """``[N, Ku]`` novel-head probabilities ``softmax(z·P^u / T)``."""
        return torch.softmax(z @ model.class_prototypes()[:, model.num_known:] / self.temperature, dim=1)

    def novel_loss(self, model, z1, z2, targets: Tensor, valid):
        p1 = self.novel_probabilities(model, z1[valid])
        p2 = self.novel_probabilities(model, z2[valid])
        similarity = (p1 @ p2.T).clamp(1e-7, 1 - 1e-7)
        loss = F.binary_cross_entropy(similarity, targets.to(similarity.device))
        prototypes, ks = model.class_prototypes(), model.num_known
        hard1, hard2 = ks + p1.detach().argmax(1), ks + p2.detach().argmax(1)
        loss = loss + 0.5 * (self.prototype_loss(z1[valid], prototypes, hard2) + self.prototype_loss(z2[valid], prototypes, hard1))
        if self.consistency > 0:
            loss = loss + self.consistency * F.mse_loss(p1, p2)
        return loss
