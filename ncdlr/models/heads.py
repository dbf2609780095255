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

    With ``extra_heads`` (``model.heads`` > 1, UNO's multi-head): ``H = 1 + len(extra_heads)`` heads share the
    encoder and are trained side by side, each with its own self-labeling (:mod:`ncdlr.methods`); learnable
    prototypes are then per head too, the fixed ETF is shared. ``forward(x, all_heads=True) -> [H, N, D]`` gives
    every head's embeddings; the plain ``forward``, ``logits`` and ``class_prototypes`` use the *selected* head
    (the ``selected_head`` buffer, set after each epoch by the train loop to the head with the lowest novel loss), so
    evaluation, prediction and the post-hoc fixes see one model. With one head nothing is added to the state dict.
    """

    def __init__(self, encoder: Encoder, head: Head, num_known: int, num_novel: int, prototype_seed: int = 0,
                 learnable_prototypes: bool = False, extra_heads: list[Head] | None = None):
        super().__init__()
        self.encoder = encoder
        self.head = head
        self.num_known = int(num_known)
        self.num_novel = int(num_novel)
        self.learnable_prototypes = bool(learnable_prototypes)
        extra = list(extra_heads or [])
        if extra and head.kind == "identity" and not self.learnable_prototypes:
            raise ValueError("model.heads > 1 needs heads that differ: an identity head with the fixed ETF gives every "
                             "head the same embeddings (use model.head linear or mlp, or learnable prototypes)")
        if any(h.out_dim != head.out_dim for h in extra):
            raise ValueError("every head must have the same output width")
        self.extra_heads = nn.ModuleList(extra)
        if self.learnable_prototypes:  # UNO-style: seeded Gaussian columns, used column-normalised (see logits)
            self.prototypes = nn.Parameter(self._gaussian_prototypes(prototype_seed, 0))
            self.extra_prototypes = nn.ParameterList(
                [nn.Parameter(self._gaussian_prototypes(prototype_seed, h)) for h in range(1, len(extra) + 1)])
        else:
            self.register_buffer("prototypes", simplex_etf(head.out_dim, num_known + num_novel, seed=prototype_seed))
        if extra:  # only with several heads, so that one-head checkpoints keep their keys
            self.register_buffer("selected_head", torch.zeros((), dtype=torch.long))

    def _gaussian_prototypes(self, seed: int, head: int) -> torch.Tensor:
        gen = torch.Generator().manual_seed(seed + 104729 + 7 * head)
        return torch.randn(self.head.out_dim, self.num_known + self.num_novel, generator=gen)

    @property
    def num_heads(self) -> int:
        """``H``: 1 plus the extra heads."""
        return 1 + len(self.extra_heads)

    @property
    def selected(self) -> int:
        """Index of the head that predicts (0 with one head)."""
        return int(self.selected_head) if self.extra_heads else 0

    def select_head(self, index: int) -> None:
        """Make head ``index`` (``0..H-1``) the one that predicts."""
        if not 0 <= index < self.num_heads:
            raise ValueError(f"head {index} out of range 0..{self.num_heads - 1}")
        if self.extra_heads:
            self.selected_head.fill_(index)

    def head_at(self, index: int) -> Head:
        return self.head if index == 0 else self.extra_heads[index - 1]

    @property
    def novel_prototypes(self) -> torch.Tensor:
        """``P^u`` ``[D, Ku]`` (raw, of the selected head)."""
        return self._raw_prototypes(self.selected)[:, self.num_known:]

    def _raw_prototypes(self, index: int) -> torch.Tensor:
        if self.learnable_prototypes and index > 0:
            return self.extra_prototypes[index - 1]
        return self.prototypes

    def forward(self, x: torch.Tensor, all_heads: bool = False) -> torch.Tensor:
        """``x`` → ``[N, D]`` unit embeddings of the selected head, or ``[H, N, D]`` of every head."""
        features = self.encoder(x)
        if all_heads:
            return torch.stack([self.head_at(h)(features) for h in range(self.num_heads)])
        return self.head_at(self.selected)(features)

    def class_prototypes(self, index: int | None = None) -> torch.Tensor:
        """``[D, K]`` unit-norm prototypes of head ``index`` (default: the selected one): the fixed ETF, or the
        learnable ones column-normalised (differentiable)."""
        raw = self._raw_prototypes(self.selected if index is None else index)
        return F.normalize(raw, dim=0) if self.learnable_prototypes else raw

    def logits(self, z: torch.Tensor) -> torch.Tensor:
        return z @ self.class_prototypes()

    def head_view(self, index: int) -> "HeadView":
        """The :class:`~ncdlr.methods.PrototypeModel` of head ``index`` (what a method's losses need of it)."""
        return HeadView(self, index)


class HeadView:
    """One head of an :class:`NCDModel` seen as a whole model by the methods: its prototypes and logits."""

    def __init__(self, model: NCDModel, index: int):
        self.model, self.index = model, index
        self.num_known, self.num_novel = model.num_known, model.num_novel
        self.learnable_prototypes = model.learnable_prototypes

    def class_prototypes(self) -> torch.Tensor:
        return self.model.class_prototypes(self.index)

    def logits(self, z: torch.Tensor) -> torch.Tensor:
        return z @ self.class_prototypes()


def build_head(kind: str, in_dim: int, num_classes: int, head_dim: int = 0, seed: int = 0) -> Head:
    """Resolve ``"auto"`` (identity when in_dim ≥ K - 1 and no head_dim, else the frozen expansion) and build."""
    if kind == "auto":
        kind = "identity" if (in_dim >= num_classes - 1 and not head_dim) else "expand"
    return Head(kind, in_dim, head_width(kind, in_dim, num_classes, head_dim), seed)
