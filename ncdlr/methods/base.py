"""The method protocol the train loop dispatches through, and the faithful NCDLR method (method.md §3-4).

One training step (``ncdlr.service.train_loop.train_step``) embeds the four view batches once, then asks
the run's :class:`Method` for

1. ``known_loss(model, z1, z2, labels)`` — supervised loss of the valid known rows, both views;
2. ``novel_targets(model, z1, z2, valid, state, buffer, rank)`` — detached targets for the novel rows
   (soft pseudo-labels, or AutoNovel's pairwise labels) and phase times ``{"exchange", "ot"}``;
3. ``novel_loss(model, z1, z2, targets, valid)`` — the unsupervised loss (swapped prediction where the
   method has it);

and at evaluation ``predict_logits(model, z)`` gives the ``[N, K]`` scores whose argmax over all ``K``
classes is the (task-agnostic) prediction. Post-hoc fixes (:mod:`ncdlr.methods.posthoc`,
:mod:`ncdlr.methods.crt`) act on those scores and on the frozen embeddings.
"""

from __future__ import annotations

import abc

import torch
from torch import Tensor

from ncdlr.losses import prototype_cross_entropy, prototype_mse


class MethodConfigError(ValueError):
    """The method's configuration is inconsistent (the message names the key to change)."""


def pad_novel(q: Tensor, num_known: int) -> Tensor:
    """Soft novel targets ``[N, Ku]`` → all-class targets ``[N, K]`` with zeros on the known columns."""
    return torch.cat([q.new_zeros(q.shape[0], num_known), q], dim=1)


class Method(abc.ABC):
    """Base: a supervised known-class loss and a prediction rule over the model's (unit) prototypes.

    Args:
        loss: ``"mse"`` (``Σ_k q_k ‖z - p_k‖²``, the paper's) or ``"ce"`` (cross-entropy on ``z·p_k / T``).
        temperature: ``T`` of the cross-entropy.
    """

    name = "base"

    def __init__(self, loss: str = "mse", temperature: float = 0.1):
        if loss not in ("mse", "ce"):
            raise MethodConfigError(f"method.loss must be mse or ce, got {loss!r}")
        if temperature <= 0:
            raise MethodConfigError(f"method.temperature must be > 0, got {temperature}")
        self.loss = loss
        self.temperature = temperature

    def prototype_loss(self, z: Tensor, prototypes: Tensor, targets: Tensor) -> Tensor:
        """``z [N, D]``, ``prototypes [D, K]``, hard ``[N]`` or soft ``[N, K]`` targets → scalar."""
        if self.loss == "mse":
            return prototype_mse(z, prototypes, targets)
        return prototype_cross_entropy(z, prototypes, targets, self.temperature)

    def known_loss(self, model, z1: Tensor, z2: Tensor, labels: Tensor) -> Tensor:
        """``½ Σ_views loss(z_v, P, y)`` over the known rows ``z_v [n, D]``, ``labels [n]`` in ``0..Ks-1``."""
        prototypes = model.class_prototypes()
        return 0.5 * (self.prototype_loss(z1, prototypes, labels) + self.prototype_loss(z2, prototypes, labels))

    @abc.abstractmethod
    def novel_targets(self, model, z1: Tensor, z2: Tensor, valid: Tensor, state, buffer, rank: int
                      ) -> tuple[Tensor, dict[str, float]]:
        """Detached targets for this rank's novel rows ``z_v [B, D]`` (``valid [B]`` bool) and phase times."""

    @abc.abstractmethod
    def novel_loss(self, model, z1: Tensor, z2: Tensor, targets: Tensor, valid: Tensor) -> Tensor:
        """Scalar unsupervised loss of the valid novel rows given :meth:`novel_targets`' output."""

    def predict_logits(self, model, z: Tensor) -> Tensor:
        """``[N, K]`` cosines ``z·p_k`` (argmax over all K = the task-agnostic prediction)."""
        return model.logits(z)


class NCDLR(Method):
    """The paper's method: known + swapped novel loss against the prototypes, labels from the adaptive OT.

    Novel logits ``S_v = z_v P^u`` of both views are labelled together by ``state.labeler`` on the shared
    buffer (``ncdlr.service.train_loop.pseudo_labels``: gathered over ranks, history + current rows), and
    ``L_u = ½ (loss(z_2, q_1) + loss(z_1, q_2))``. With the defaults (fixed ETF, ``mse``, adaptive prior,
    buffer on) this is method.md §3-4 exactly; ``loss="ce"``, learnable prototypes, the prior and the
    buffer switch give the paper's ablations.
    """

    name = "ncdlr"

    def novel_targets(self, model, z1, z2, valid, state, buffer, rank):
        """``[2, B, Ku]`` detached soft labels (view 1, view 2); invalid rows are zeros."""
        from ncdlr.service.train_loop import pseudo_labels

        pu = model.class_prototypes()[:, model.num_known:]
        scores = torch.stack([z1 @ pu, z2 @ pu]).detach()
        return pseudo_labels(scores, valid, state.labeler, buffer, state.step, rank)

    def novel_loss(self, model, z1, z2, targets, valid):
        prototypes = model.class_prototypes()
        q = targets.to(z1.device)
        q1, q2 = (pad_novel(q[v][valid], model.num_known) for v in (0, 1))
        return 0.5 * (self.prototype_loss(z2[valid], prototypes, q1) + self.prototype_loss(z1[valid], prototypes, q2))
