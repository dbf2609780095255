"""The method protocol the train loop dispatches through, its configuration, and what a method needs of a model.

One training step (``ncdlr.service.train_loop.train_step``) embeds the four view batches once, then asks
the run's :class:`Method` (built once per worker by :func:`ncdlr.methods.build_method`) for

1. ``known_loss(model, z1, z2, labels)`` — supervised loss of the valid known rows, both views;
2. ``novel_targets(model, z1, z2, valid, step)`` — detached targets for the novel rows (soft pseudo-labels
   from the discovery step, or AutoNovel's pairwise labels) and phase times ``{"exchange", "ot"}``;
3. ``novel_loss(model, z1, z2, targets, valid)`` — the unsupervised loss (swapped prediction unless the
   method has its own);

and at evaluation ``predict_logits(model, z)`` gives the ``[N, K]`` scores whose argmax over all ``K``
classes is the (task-agnostic) prediction. Post-hoc fixes (:mod:`ncdlr.methods.posthoc`,
:mod:`ncdlr.methods.crt`) act on those scores and on the frozen embeddings.

A method's distributed parts (the shared buffer, the all-gather, the rank) are wired in once with
:meth:`Method.connect`; the method itself knows nothing of Ray.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from types import MappingProxyType
from typing import ClassVar, Protocol

import torch
from torch import Tensor, nn

from ncdlr.buffer import SharedBuffer
from ncdlr.labeler import AdaptiveSelfLabeler
from ncdlr.method_settings import MethodConfig
from ncdlr.losses import class_balance_weights, known_novel_cross_entropy, prototype_cross_entropy, prototype_mse

from .discovery import Gather, single_process


class PrototypeModel(Protocol):
    """What a method needs of a model: unit embeddings ``z = model(x) [N, D]`` and ``K = Ks + Ku`` prototypes."""

    num_known: int
    num_novel: int
    learnable_prototypes: bool

    def class_prototypes(self) -> Tensor:
        """``[D, K]`` unit-norm prototypes, known columns first."""

    def logits(self, z: Tensor) -> Tensor:
        """``[N, K]`` cosines ``z·p_k``."""


class MethodConfigError(ValueError):
    """The method's configuration is inconsistent (the message names the key to change)."""


def pad_novel(q: Tensor, num_known: int) -> Tensor:
    """Soft novel targets ``[N, Ku]`` → all-class targets ``[N, K]`` with zeros on the known columns."""
    return torch.cat([q.new_zeros(q.shape[0], num_known), q], dim=1)


#: ncdlr's loss options a dataset config may set (the known-vs-novel term, the class-balanced known loss), at their
#: off values: the baselines as published train without them, so they undo a file's values (``Method.file_resets``)
NCDLR_LOSS_OPTIONS: Mapping[str, object] = MappingProxyType({"method.task_weight": 0.0, "method.known_reweight": 0.0,
                                                                     "method.novel_reweight": 0.0})


class Method(abc.ABC):
    """Base: a supervised known-class loss and a prediction rule over the model's (unit) prototypes.

    Args:
        cfg: the ``method`` config section; ``loss = "auto"`` takes the method's :attr:`default_loss`.
        labeler: the stateful self-labeler this method trains with (checkpointed, reports ``τ``), or None.
    """

    name: ClassVar[str] = "base"
    default_loss: ClassVar[str] = "mse"
    #: Settings (``section.key`` → value) this method needs. The service applies them as defaults under the
    #: user's explicit settings and refuses an explicit contradiction before training starts.
    requires: ClassVar[Mapping[str, object]] = {}
    #: Settings a config *file* gives for the method it was written for, which this method does not take from a
    #: file when the method itself was chosen elsewhere (``--method.name uno`` on top of a dataset's config): the
    #: service trains with these values instead and says so. Given on the command line they are kept.
    file_resets: ClassVar[Mapping[str, object]] = {}
    #: :meth:`novel_targets` gives soft pseudo-labels ``[2, B, Ku]`` that mixup can blend (``optim.mixup``);
    #: AutoNovel's pairwise targets cannot be blended, so its mixed rows get the known-class term only
    soft_novel_targets: ClassVar[bool] = True

    def __init__(self, cfg: MethodConfig, labeler: AdaptiveSelfLabeler | None = None):
        loss = self.default_loss if cfg.loss == "auto" else cfg.loss
        if loss not in ("mse", "ce"):
            raise MethodConfigError(f"method.loss must be auto, mse or ce, got {cfg.loss!r}")
        known = loss if cfg.known_loss == "auto" else cfg.known_loss
        if known not in ("mse", "ce"):
            raise MethodConfigError(f"method.known_loss must be auto, mse or ce, got {cfg.known_loss!r}")
        if cfg.temperature <= 0:
            raise MethodConfigError(f"method.temperature must be > 0, got {cfg.temperature}")
        if not cfg.task_weight >= 0:  # also refuses NaN
            raise MethodConfigError(f"method.task_weight must be >= 0, got {cfg.task_weight}")
        if not cfg.known_reweight >= 0:
            raise MethodConfigError(f"method.known_reweight must be >= 0, got {cfg.known_reweight}")
        if not cfg.novel_reweight >= 0:
            raise MethodConfigError(f"method.novel_reweight must be >= 0, got {cfg.novel_reweight}")
        self.loss = loss
        self.known_loss_kind = known
        self.temperature = cfg.temperature
        self.task_weight = cfg.task_weight
        self.known_reweight = cfg.known_reweight
        self.novel_reweight = cfg.novel_reweight
        #: ``[Ku]`` rows per cluster in the solve(s) of the last :meth:`novel_targets` (``method.novel_reweight`` > 0:
        #: the methods that label through :class:`~ncdlr.methods.discovery.Discovery` set it), or None
        self.novel_sizes: Tensor | None = None
        #: ``[Ks]`` weights of the known classes' rows in :meth:`known_loss` (:meth:`weigh_known_classes`), or None
        self.known_class_weights: Tensor | None = None
        self.labeler = labeler
        #: the labelers of heads 1..H-1 (``model.heads`` > 1; each its own τ/t and buffer columns), checkpointed
        self.extra_labelers = nn.ModuleList()
        #: the head that predicts (the model's ``selected_head``; set by the train loop), whose τ is reported
        self.active_head = 0

    @property
    def labelers(self) -> list[AdaptiveSelfLabeler]:
        """Every head's labeler, head 0 first (empty without a labeler)."""
        return [] if self.labeler is None else [self.labeler, *self.extra_labelers]

    @property
    def uses_buffer(self) -> bool:
        """Whether :meth:`connect` should be given the shared logit buffer."""
        return False

    def connect(self, *, buffer: SharedBuffer | None = None, gather: Gather = single_process, rank: int = 0) -> None:
        """Wire in the distributed parts once per worker: the shared buffer, the ranks' all-gather, this rank."""

    @property
    def imbalance_factor(self) -> float:
        """``τ`` of the predicting head's cluster-size prior (1 without a labeler)."""
        labelers = self.labelers
        return labelers[min(self.active_head, len(labelers) - 1)].imbalance_factor if labelers else 1.0

    def prototype_loss(self, z: Tensor, prototypes: Tensor, targets: Tensor, kind: str | None = None,
                       weights: Tensor | None = None) -> Tensor:
        """``z [N, D]``, ``prototypes [D, K]``, hard ``[N]`` or soft ``[N, K]`` targets → scalar; ``kind`` "mse" or
        "ce" (default: the method's ``loss``; the known rows use ``known_loss_kind``); optional row ``weights [N]``
        (the weighted mean ``Σ w l / Σ w``)."""
        if (kind or self.loss) == "mse":
            return prototype_mse(z, prototypes, targets, weights)
        return prototype_cross_entropy(z, prototypes, targets, self.temperature, weights)

    def weigh_known_classes(self, known_counts) -> None:
        """Set the known classes' row weights from their training counts ``known_counts [Ks]`` under
        ``method.known_reweight`` (q): ``n_c^(−q)`` (:func:`ncdlr.losses.class_balance_weights`); nothing at q = 0."""
        if self.known_reweight > 0:
            self.known_class_weights = class_balance_weights(known_counts, self.known_reweight)

    def known_loss(self, model: PrototypeModel, z1: Tensor, z2: Tensor, labels: Tensor) -> Tensor:
        """``½ Σ_views loss(z_v, P, y)`` over the known rows ``z_v [n, D]``, ``labels [n]`` in ``0..Ks-1``, with the
        known rows' loss (``method.known_loss``; by default the method's one loss), each row weighted by its class
        (``method.known_reweight`` > 0: :meth:`weigh_known_classes`)."""
        prototypes, kind = model.class_prototypes(), self.known_loss_kind
        weights = None
        if self.known_reweight > 0:
            if self.known_class_weights is None:
                raise MethodConfigError("method.known_reweight > 0 weighs the known rows by their classes' training "
                                        "counts, which this method was not given (build_method(..., known_counts=))")
            if self.known_class_weights.device != labels.device:  # moved to the step's device once, not every step
                self.known_class_weights = self.known_class_weights.to(labels.device)
            weights = self.known_class_weights[labels]  # [n]; a labelled row's class has a count > 0
        return 0.5 * (self.prototype_loss(z1, prototypes, labels, kind, weights)
                      + self.prototype_loss(z2, prototypes, labels, kind, weights))

    def task_loss(self, model: PrototypeModel, known: Tensor, novel: Tensor) -> Tensor:
        """``method.task_weight`` × the known-vs-novel cross-entropy (:func:`ncdlr.losses.known_novel_cross_entropy`)
        of the valid labelled rows ``known [n_s, D]`` and unlabelled rows ``novel [n_u, D]`` (both views stacked).
        The train step calls it only when the weight is > 0, so the term costs nothing when it is off."""
        z = torch.cat([known, novel])
        is_novel = torch.cat([known.new_zeros(known.shape[0], dtype=torch.bool), novel.new_ones(novel.shape[0], dtype=torch.bool)])
        return self.task_weight * known_novel_cross_entropy(z, model.class_prototypes(), model.num_known, is_novel,
                                                            self.temperature)

    @abc.abstractmethod
    def novel_targets(self, model: PrototypeModel, z1: Tensor, z2: Tensor, valid: Tensor, step: int
                      ) -> tuple[Tensor, dict[str, float]]:
        """Detached targets for this rank's novel rows ``z_v [B, D]`` (``valid [B]`` bool) and phase times."""

    def novel_targets_heads(self, views: list[PrototypeModel], z1: Tensor, z2: Tensor, valid: Tensor, step: int
                            ) -> tuple[list, dict[str, float]]:
        """:meth:`novel_targets` of every head at once: ``views`` (one :class:`PrototypeModel` per head),
        ``z_v [H, B, D]`` → one target per head and the phase times. Methods with one labeler per head solve all
        heads in one exchange (one gather, one buffer row of ``H·Ku`` columns); this default serves one head."""
        if len(views) != 1:
            raise MethodConfigError(f"method {self.name!r} trains one head only (model.heads = 1)")
        targets, times = self.novel_targets(views[0], z1[0], z2[0], valid, step)
        return [targets], times

    def novel_row_weights(self, q: Tensor) -> Tensor | None:
        """``[n]`` loss weights of unlabelled rows with soft targets ``q [n, Ku]`` under ``method.novel_reweight`` (r):
        ``Σ_k q_ik s_k^(−r)`` with ``s`` the clusters' sizes in the solve that labelled them (:attr:`novel_sizes`,
        through :func:`ncdlr.losses.class_balance_weights`: a cluster under one row counts as one); None at r = 0."""
        if self.novel_reweight <= 0:
            return None
        if self.novel_sizes is None:
            raise MethodConfigError(f"method.novel_reweight > 0 weighs the unlabelled rows by their clusters' sizes in "
                                    f"the solve, which method {self.name!r} does not report")
        return q @ class_balance_weights(self.novel_sizes, self.novel_reweight).to(q.device)

    def novel_loss(self, model: PrototypeModel, z1: Tensor, z2: Tensor, targets: Tensor, valid: Tensor) -> Tensor:
        """Scalar unsupervised loss of the valid novel rows given :meth:`novel_targets`' output; by default the
        swapped prediction ``½ (loss(z_2, q_1) + loss(z_1, q_2))`` with soft ``targets [2, B, Ku]``, each term's rows
        weighted by their target's cluster size when ``method.novel_reweight`` > 0 (:meth:`novel_row_weights`)."""
        prototypes = model.class_prototypes()
        q = targets.to(z1.device)
        w1, w2 = (self.novel_row_weights(q[v][valid]) for v in (0, 1))
        q1, q2 = (pad_novel(q[v][valid], model.num_known) for v in (0, 1))
        return 0.5 * (self.prototype_loss(z2[valid], prototypes, q1, weights=w1)
                      + self.prototype_loss(z1[valid], prototypes, q2, weights=w2))

    def predict_logits(self, model: PrototypeModel, z: Tensor) -> Tensor:
        """``[N, K]`` cosines ``z·p_k`` (argmax over all K = the task-agnostic prediction)."""
        return model.logits(z)
