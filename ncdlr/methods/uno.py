"""UNO (Fini et al., 2021) as the paper compares against it (method.md §8).

Learnable, column-normalised prototypes; cross-entropy on ``z·p_k / T`` (T = 0.1) over all K classes;
per view, a balanced Sinkhorn (uniform cluster sizes, ε = ``labeler.eps`` = 0.05, ``labeler.n_iters`` = 3)
on the current batch only (gathered over ranks, no buffer, nothing learned; ``labeler.reg_m`` > 0 relaxes its sizes
as it does ncdlr's); swapped prediction.
One head by default; ``model.heads`` > 1 gives UNO's multi-head (each head its own prototypes and Sinkhorn, the
head with the lowest novel loss predicts). No over-clustering.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ncdlr.buffer import SharedBuffer
from ncdlr.labeler import AdaptiveSelfLabeler
from ncdlr.method_settings import MethodConfig

from .base import NCDLR_LOSS_OPTIONS, Method, MethodConfigError, PrototypeModel
from .discovery import Discovery, Gather, single_process


class UNO(Method):
    """Balanced-Sinkhorn swapped prediction with learnable prototypes and cross-entropy.

    Args:
        balanced: a labeler with the uniform prior (nothing learned).
    """

    name = "uno"
    default_loss = "ce"
    requires = {"model.prototypes": "learnable", "labeler.use_buffer": False}
    #: UNO as published holds its clusters' sizes and has neither of ncdlr's loss options: a dataset config's relaxed
    #: sizes and loss options (chosen for ncdlr) do not carry over to ``--method.name uno``; given on the command line
    #: (``--labeler.reg_m``, ``--method.task_weight``, ...) they still apply
    file_resets = {"labeler.reg_m": 0.0, "labeler.size_floor": "none", "labeler.relax_after_epochs": 0.0,
                   "labeler.relax_bound": "none", "labeler.relax_tighten": 0.0,
                   **NCDLR_LOSS_OPTIONS}

    def __init__(self, cfg: MethodConfig, balanced: AdaptiveSelfLabeler,
                 extra_labelers: list[AdaptiveSelfLabeler] | None = None):
        super().__init__(cfg, balanced)
        self.extra_labelers.extend(extra_labelers or [])
        self.discovery = Discovery(self.labelers, sizes=self.novel_reweight > 0)

    def connect(self, *, buffer: SharedBuffer | None = None, gather: Gather = single_process, rank: int = 0) -> None:
        self.discovery = Discovery(self.labelers, None, gather, rank, sizes=self.novel_reweight > 0)

    @staticmethod
    def check_model(model: PrototypeModel) -> None:
        if not getattr(model, "learnable_prototypes", False):
            raise MethodConfigError("method 'uno' trains its prototypes: set model.prototypes=learnable")

    def novel_targets(self, model: PrototypeModel, z1: Tensor, z2: Tensor, valid: Tensor, step: int):
        """``[2, B, Ku]`` balanced-Sinkhorn labels, each view solved on its own gathered batch."""
        targets, times = self.novel_targets_heads([model], z1[None], z2[None], valid, step)
        return targets[0], times

    def novel_targets_heads(self, views: list[PrototypeModel], z1: Tensor, z2: Tensor, valid: Tensor, step: int):
        """``[2, B, Ku]`` labels per head from ``z_v [H, B, D]`` (UNO's multi-head: each head its own prototypes
        and balanced Sinkhorn; one gather per view for all heads)."""
        pus = []
        for view in views:
            self.check_model(view)
            pus.append(view.class_prototypes()[:, view.num_known:])
        out, times, sizes = [], {"exchange": 0.0, "ot": 0.0}, []
        for z in (z1, z2):
            scores = torch.cat([z[h] @ pu for h, pu in enumerate(pus)], dim=1).detach()
            q, t = self.discovery(scores[None], valid, step)
            out.append(q[0])
            times = {k: times[k] + t[k] for k in times}
            sizes.append(self.discovery.last_sizes)
        # each view is its own solve: with method.novel_reweight, a cluster's size is its rows over both solves
        self.novel_sizes = None if sizes[0] is None else sizes[0] + sizes[1]
        return list(torch.stack(out).chunk(len(views), dim=2)), times
