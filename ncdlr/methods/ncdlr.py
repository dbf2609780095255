"""The paper's method (method.md §3-4): fixed ETF prototypes, MSE, adaptive self-labeling over the buffer."""

from __future__ import annotations

import torch
from torch import Tensor

from ncdlr.buffer import SharedBuffer
from ncdlr.labeler import AdaptiveSelfLabeler
from ncdlr.method_settings import MethodConfig

from .base import Method, PrototypeModel
from .discovery import Discovery, Gather, single_process


class NCDLR(Method):
    """Known + swapped novel loss against the prototypes, labels from the adaptive OT.

    Novel logits ``S_v = z_v P^u`` of both views are labelled together by the discovery step (gathered over
    ranks, history + current rows), and ``L_u = ½ (loss(z_2, q_1) + loss(z_1, q_2))``. With the defaults
    (fixed ETF, ``mse``, adaptive prior, buffer on) this is method.md §3-4 exactly; ``loss="ce"``, learnable
    prototypes, the prior and the buffer switch give the paper's ablations.

    Args:
        use_buffer: solve over the shared buffer (``labeler.use_buffer``); off → the gathered batch only.
    """

    name = "ncdlr"
    default_loss = "mse"

    def __init__(self, cfg: MethodConfig, labeler: AdaptiveSelfLabeler, use_buffer: bool = True,
                 extra_labelers: list[AdaptiveSelfLabeler] | None = None):
        super().__init__(cfg, labeler)
        self.extra_labelers.extend(extra_labelers or [])
        self._use_buffer = use_buffer
        self.discovery = Discovery(self.labelers, sizes=self.novel_reweight > 0)

    @property
    def uses_buffer(self) -> bool:
        return self._use_buffer

    def connect(self, *, buffer: SharedBuffer | None = None, gather: Gather = single_process, rank: int = 0) -> None:
        self.discovery = Discovery(self.labelers, buffer if self._use_buffer else None, gather, rank,
                                   sizes=self.novel_reweight > 0)

    def novel_targets(self, model: PrototypeModel, z1: Tensor, z2: Tensor, valid: Tensor, step: int):
        """``[2, B, Ku]`` detached soft labels (view 1, view 2); invalid rows are zeros."""
        targets, times = self.novel_targets_heads([model], z1[None], z2[None], valid, step)
        return targets[0], times

    def novel_targets_heads(self, views: list[PrototypeModel], z1: Tensor, z2: Tensor, valid: Tensor, step: int):
        """``[2, B, Ku]`` labels per head from ``z_v [H, B, D]``: the heads' novel logits side by side
        (``[2, B, H·Ku]``) go through one discovery step, each head's columns solved by its own labeler."""
        scores = []
        for h, view in enumerate(views):
            pu = view.class_prototypes()[:, view.num_known:]
            scores.append(torch.stack([z1[h] @ pu, z2[h] @ pu]))
        q, times = self.discovery(torch.cat(scores, dim=2).detach(), valid, step)
        self.novel_sizes = self.discovery.last_sizes  # [H·Ku] with sizes on (one head: method.novel_reweight), else None
        return list(q.chunk(len(views), dim=2)), times
