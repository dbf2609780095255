"""UNO (Fini et al., 2021) as the paper compares against it (method.md §8).

Learnable, column-normalised prototypes; cross-entropy on ``z·p_k / T`` (T = 0.1) over all K classes;
per view, a balanced Sinkhorn (uniform cluster sizes, ε = ``labeler.eps`` = 0.05, ``labeler.n_iters`` = 3)
on the current batch only (gathered over ranks, no buffer, nothing learned); swapped prediction.
Single head, no over-clustering (UNO's multi-head extras are not part of the paper's comparison on LT).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ncdlr.ot import AdaptiveSelfLabeler

from .base import Method, MethodConfigError, pad_novel


class UNO(Method):
    """Balanced-Sinkhorn swapped prediction with learnable prototypes and cross-entropy."""

    name = "uno"

    def __init__(self, loss: str = "ce", temperature: float = 0.1, eps: float = 0.05, n_iters: int = 3):
        super().__init__(loss, temperature)
        self.eps = eps
        self.n_iters = n_iters

    @staticmethod
    def check_model(model) -> None:
        if not getattr(model, "learnable_prototypes", False):
            raise MethodConfigError("method 'uno' trains its prototypes: set model.prototypes=learnable")

    def novel_targets(self, model, z1, z2, valid, state, buffer, rank):
        """``[2, B, Ku]`` balanced-Sinkhorn labels, each view solved on its own gathered batch."""
        from ncdlr.service.train_loop import pseudo_labels

        self.check_model(model)
        pu = model.class_prototypes()[:, model.num_known:]
        balanced = AdaptiveSelfLabeler(model.num_novel, prior="uniform", eps=self.eps, n_iters=self.n_iters)
        out, times = [], {"exchange": 0.0, "ot": 0.0}
        for z in (z1, z2):
            q, t = pseudo_labels((z @ pu).detach()[None], valid, balanced, None, state.step, rank)
            out.append(q[0])
            times = {k: times[k] + t[k] for k in times}
        return torch.stack(out), times

    def novel_loss(self, model, z1, z2, targets: Tensor, valid):
        prototypes = model.class_prototypes()
        q = targets.to(z1.device)
        q1, q2 = (pad_novel(q[v][valid], model.num_known) for v in (0, 1))
        return 0.5 * (self.prototype_loss(z2[valid], prototypes, q1) + self.prototype_loss(z1[valid], prototypes, q2))
