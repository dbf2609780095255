"""UNO (Fini et al., 2021) as the paper compares against it (method.md §8).

Learnable, column-normalised prototypes; cross-entropy on ``z·p_k / T`` (T = 0.1) over all K classes;
per view, a balanced Sinkhorn (uniform cluster sizes, ε = ``labeler.eps`` = 0.05, ``labeler.n_iters`` = 3)
on the current batch only (gathered over ranks, no buffer, nothing learned); swapped prediction.
Single head, no over-clustering (UNO's multi-head extras are not part of the paper's comparison on LT).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ncdlr.buffer import SharedBuffer
from ncdlr.labeler import AdaptiveSelfLabeler
from ncdlr.method_settings import MethodConfig

from .base import Method, MethodConfigError, PrototypeModel
from .discovery import Discovery, Gather, single_process


class UNO(Method):
    """Balanced-Sinkhorn swapped prediction with learnable prototypes and cross-entropy.

    Args:
        balanced: a labeler with the uniform prior (nothing learned).
    """

    name = "uno"
    default_loss = "ce"
    requires = {"model.prototypes": "learnable", "labeler.use_buffer": False}

    def __init__(self, cfg: MethodConfig, balanced: AdaptiveSelfLabeler):
        super().__init__(cfg, balanced)
        self.discovery = Discovery(balanced)

    def connect(self, *, buffer: SharedBuffer | None = None, gather: Gather = single_process, rank: int = 0) -> None:
        self.discovery = Discovery(self.labeler, None, gather, rank)

    @staticmethod
    def check_model(model: PrototypeModel) -> None:
        if not getattr(model, "learnable_prototypes", False):
            raise MethodConfigError("method 'uno' trains its prototypes: set model.prototypes=learnable")

    def novel_targets(self, model: PrototypeModel, z1: Tensor, z2: Tensor, valid: Tensor, step: int):
        """``[2, B, Ku]`` balanced-Sinkhorn labels, each view solved on its own gathered batch."""
        self.check_model(model)
        pu = model.class_prototypes()[:, model.num_known:]
        out, times = [], {"exchange": 0.0, "ot": 0.0}
        for z in (z1, z2):
            q, t = self.discovery((z @ pu).detach()[None], valid, step)
            out.append(q[0])
            times = {k: times[k] + t[k] for k in times}
        return torch.stack(out), times
