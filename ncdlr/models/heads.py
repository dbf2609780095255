"""Heads ``g`` and the full model ``z = normalize(g(f(x)))`` scored against fixed ETF prototypes (method.md §2).

A simplex ETF over K classes needs a width D ≥ K - 1. When the encoder is narrower (iNat-2K: 768 < 2000)
the head must widen it: ``"expand"`` is the authors' frozen random linear map, ``"linear"`` and ``"mlp"``
are trainable projections (a config switch, to benchmark). ``"identity"`` only normalises.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ncdlr.prototypes import simplex_etf

from .encoders import Encoder

HEAD_KINDS = ("auto", "identity", "expand", "linear", "mlp")


def head_width(kind: str, in_dim: int, num_classes: int, head_dim: int = 0) -> int:
    """Output width D of the head: ``head_dim`` if set, else ``in_dim`` or ``num_classes`` if wider."""
    if kind == "identity":
        width = in_dim
    else:
        width = head_dim or max(in_dim, num_classes)
    if width < num_classes - 1:
        raise ValueError(f"head width {width} < K - 1 = {num_classes - 1}: a simplex ETF over {num_classes} "
                         "classes needs a wider head (use head 'expand', 'linear' or 'mlp', or a larger head_dim)")
    return width


class Head(nn.Module):
    """``g``: features ``[N, in_dim]`` → unit-norm embeddings ``[N, out_dim]``.

    kinds: ``identity`` (normalise only), ``expand`` (frozen seeded Gaussian map, scaled by 1/sqrt(in_dim)),
    ``linear`` (trainable), ``mlp`` (trainable Linear-GELU-Linear with hidden width ``max(in_dim, out_dim)``).
    """

    def __init__(self, kind: str, in_dim: int, out_dim: int, seed: int = 0):
        super().__init__()
        if kind not in HEAD_KINDS[1:]:
            raise ValueError(f"unknown head {kind!r} (choose from {', '.join(HEAD_KINDS)})")
        self.kind = kind
        self.out_dim = int(out_dim)
        if kind == "identity":
            if out_dim != in_dim:
                raise ValueError(f"identity head keeps the width ({in_dim}), asked for {out_dim}")
            self.net = nn.Identity()
        elif kind == "expand":
            gen = torch.Generator().manual_seed(seed + 7919)
            weight = torch.randn(out_dim, in_dim, generator=gen) / math.sqrt(in_dim)
            self.register_buffer("expansion", weight)  # frozen, saved in checkpoints
            self.net = None
        elif kind == "linear":
            self.net = nn.Linear(in_dim, out_dim)
        else:
            hidden = max(in_dim, out_dim)
            self.net = nn.Sequential(nn.Linear(in_dim, hidden), nn.GELU(), nn.Linear(hidden, out_dim))

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        x = features @ self.expansion.T if self.kind == "expand" else self.net(features)
        return F.normalize(x.float(), dim=-1)


class NCDModel(nn.Module):
    """Encoder f, head g and fixed prototypes P ``[D, K]`` (buffer; known columns first, then novel).

    ``forward(x) -> z [N, D]`` unit norm; ``logits(z) = z @ P -> [N, K]`` cosines; predictions are
    ``argmax`` over all K (task-agnostic).
    """

    def __init__(self, encoder: Encoder, head: Head, num_known: int, num_novel: int, prototype_seed: int = 0,
                 learnable_prototypes: bool = False):
        super().__init__()
        self.encoder = encoder
        self.head = head
        self.num_known = int(num_known)
        self.num_novel = int(num_novel)
        self.learnable_prototypes = bool(learnable_prototypes)
        if self.learnable_prototypes:  # UNO-style: seeded Gaussian columns, used column-normalised (see logits)
            gen = torch.Generator().manual_seed(prototype_seed + 104729)
            self.prototypes = nn.Parameter(torch.randn(head.out_dim, num_known + num_novel, generator=gen))
        else:
            self.register_buffer("prototypes", simplex_etf(head.out_dim, num_known + num_novel, seed=prototype_seed))

    @property
    def novel_prototypes(self) -> torch.Tensor:
        """``P^u`` ``[D, Ku]``."""
        return self.prototypes[:, self.num_known:]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(x))

    def class_prototypes(self) -> torch.Tensor:
        """``[D, K]`` unit-norm prototypes: the fixed ETF, or the learnable ones column-normalised (differentiable)."""
        return F.normalize(self.prototypes, dim=0) if self.learnable_prototypes else self.prototypes

    def logits(self, z: torch.Tensor) -> torch.Tensor:
        return z @ self.class_prototypes()


def build_head(kind: str, in_dim: int, num_classes: int, head_dim: int = 0, seed: int = 0) -> Head:
    """Resolve ``"auto"`` (identity when in_dim ≥ K - 1 and no head_dim, else the frozen expansion) and build."""
    if kind == "auto":
        kind = "identity" if (in_dim >= num_classes - 1 and not head_dim) else "expand"
    return Head(kind, in_dim, head_width(kind, in_dim, num_classes, head_dim), seed)
