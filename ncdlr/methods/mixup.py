"""Mixup across the images of a batch (Zhang et al., 2018), on whatever the step's encoder reads.

In image mode the rows are pixels; on an activation cache they are the activations at the input of the first
trainable block (manifold mixup, Verma et al., 2019). One ``λ ~ Beta(a, a)`` per batch and a permutation of the
rows pair each row with another image of the same batch; the mixed row's target is the same blend of the two
rows' targets: one-hot known labels, or the novel soft pseudo-labels the discovery step gave the *other* view
(the swapped target of the clean rows). The mixed rows only add a loss: the targets, the OT problem and the
buffer still come from the clean views, so with ``optim.mixup = 0`` the step is exactly the paper's.

Why it is here: on OpenClipart-LT the clusters ncdlr fits to its training images carry to unseen crops and to
centre views of the same images, but lose 3–7 points on new images (docs/results.md, sessions 15–16): the model
fits images, and blending images is the standard cure for fitting (noisy) labels image by image. Measured there
(a = 1, 5 seeds, two class partitions): it narrows that loss, but the headline novel accuracy moves −1.6 / +1.5
(about 1 SE), so it is an option, off by default.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from .base import Method, PrototypeModel, pad_novel


@dataclass(frozen=True)
class MixPlan:
    """One step's pairing: row ``i`` is blended ``λ · row_i + (1 − λ) · row_perm[i]``.

    ``perm [B]`` (int64) permutes the rows of one batch; ``keep [B]`` (bool) marks the mixed rows whose two
    sources are both valid (decodable), the only ones that enter the loss; ``lam`` is λ in ``[0, 1]``.
    """

    perm: Tensor
    keep: Tensor
    lam: float


def draw_mix(valid: Tensor, alpha: float, seed: int | Sequence[int]) -> MixPlan:
    """A :class:`MixPlan` for a batch with ``valid [B]`` (bool) rows: ``λ ~ Beta(α, α)`` (α > 0) and a random
    permutation of the rows, both drawn from ``seed`` (NumPy's generator), so a step's pairing is reproducible
    (and a resumed run draws the same pairs as an uninterrupted one)."""
    if alpha <= 0:
        raise ValueError(f"mixup needs Beta(α, α) with α > 0, got {alpha}")
    rng = np.random.default_rng(seed)
    lam = float(rng.beta(alpha, alpha))
    perm = torch.from_numpy(rng.permutation(valid.shape[0]))
    valid_cpu = valid.detach().cpu()
    return MixPlan(perm, valid_cpu & valid_cpu[perm], lam)


def blend(x: Tensor, plan: MixPlan) -> Tensor:
    """``λ x + (1 − λ) x[perm]`` for a batch ``x [B, ...]``: the inputs (images, activations or features; any
    float dtype; uint8 images must be normalised first) and their soft targets ``[B, K]`` (rows summing to 1 stay
    so) alike."""
    perm = plan.perm.to(x.device)
    return plan.lam * x + (1.0 - plan.lam) * x[perm]


def mixed_loss(method: Method, model: PrototypeModel, z_mix: Sequence[Tensor], mix: tuple[MixPlan, MixPlan],
               labels: Tensor, novel_targets: Tensor | None, alpha: float) -> Tensor:
    """``L_s^mix + α L_u^mix`` of the mixed second views ``z_mix = [z_known [B, D], z_novel [B, D]]``: the known
    rows against the blend of their one-hot labels ``labels [B]``, the novel rows against the blend of the
    soft pseudo-labels of their first views ``novel_targets[0] [B, Ku]`` (the swapped target; None during the
    known-class warm-up, or for a method whose targets are not soft labels). Rows with an invalid source
    are left out."""
    k, prototypes = model.num_known + model.num_novel, model.class_prototypes()
    known_plan, novel_plan = mix
    zk, zn = z_mix
    loss = zk.sum() * 0.0
    keep = known_plan.keep.to(zk.device)
    if keep.any():
        onehot = torch.nn.functional.one_hot(labels.clamp(0, k - 1), k).float()  # invalid rows: any label, not kept
        loss = loss + method.prototype_loss(zk[keep], prototypes, blend(onehot, known_plan)[keep], method.known_loss_kind)
    keep = novel_plan.keep.to(zn.device)
    if novel_targets is not None and method.soft_novel_targets and keep.any():
        q = pad_novel(novel_targets[0].to(zn.device), model.num_known)
        loss = loss + alpha * method.prototype_loss(zn[keep], prototypes, blend(q, novel_plan)[keep])
    return loss
