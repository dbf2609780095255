"""Discovery methods behind one protocol: the faithful NCDLR, UNO, AutoNovel, and post-hoc +LA/+cRT.

``build_method(method_cfg, labeler_cfg, num_novel)`` turns the ``method`` and ``labeler`` config sections into
a :class:`Method`, built once per worker; ``train_step`` dispatches through it (known loss, novel targets,
novel loss). ``posthoc`` and ``crt`` act after training on the frozen model. Ablations of ncdlr are config
switches: ``labeler.use_buffer``, ``model.prototypes`` (etf | learnable), ``method.loss`` (mse | ce) and
``labeler.prior`` (see :mod:`ncdlr.priors`). A new method is one module here with a :class:`Method` subclass
(its :attr:`~Method.requires` names the settings it needs) and one entry in :data:`METHODS`.
"""

from __future__ import annotations

from torch import Tensor

from ncdlr.labeler import AdaptiveSelfLabeler
from ncdlr.method_settings import LabelerConfig, MethodConfig

from .autonovel import AutoNovel, ranking_pairs
from .base import Method, MethodConfigError, PrototypeModel, pad_novel
from .crt import class_balanced_sampler, retrain_classifier
from .discovery import Discovery, Gather, buffer_width, single_process
from .ncdlr import NCDLR
from .posthoc import PosthocFix, fit_posthoc, logit_adjustment, posthoc_scores, pseudo_label_counts
from .uno import UNO

METHODS: dict[str, type[Method]] = {"ncdlr": NCDLR, "uno": UNO, "autonovel": AutoNovel}

__all__ = ["METHODS", "AutoNovel", "Discovery", "Gather", "Method", "MethodConfig", "MethodConfigError", "NCDLR",
           "PosthocFix", "PrototypeModel", "UNO", "build_method", "buffer_width", "class_balanced_sampler", "fit_posthoc",
           "logit_adjustment", "pad_novel",
           "posthoc_scores", "pseudo_label_counts", "ranking_pairs", "retrain_classifier", "single_process"]


def build_method(method: MethodConfig, labeler: LabelerConfig, num_novel: int, *,
                 fixed_prior: Tensor | None = None, heads: int = 1, known_counts=None) -> Method:
    """The :class:`Method` named by ``method.name`` for ``num_novel`` (Ku) clusters, with its labeler; with
    ``known_counts [Ks]`` (the known classes' training counts) its known rows weighted by ``method.known_reweight``
    (:meth:`Method.weigh_known_classes`; training needs them when the weight is on, prediction does not).

    ncdlr gets the adaptive labeler of ``labeler`` (``fixed_prior [Ku]``: the oracle sizes for ``prior=fixed``);
    UNO a balanced one (uniform prior, ``labeler.eps``/``n_iters``, relaxed by ``labeler.reg_m`` and floored by
    ``labeler.size_floor`` when those are set);
    AutoNovel none. ``heads`` (``model.heads``) labelers for a model of that many heads (one per head; AutoNovel: one
    head only). Distributed parts are wired in afterwards with :meth:`Method.connect`.
    """
    made = _build(method, labeler, num_novel, fixed_prior, heads)
    if known_counts is not None:
        made.weigh_known_classes(known_counts)
    return made


def _build(method: MethodConfig, labeler: LabelerConfig, num_novel: int, fixed_prior: Tensor | None,
           heads: int) -> Method:
    kind = METHODS.get(method.name)
    if kind is None:
        raise MethodConfigError(f"method.name {method.name!r} is not one of {', '.join(METHODS)}")
    if kind.requires.get("labeler.use_buffer", True) is False and labeler.use_buffer:
        raise MethodConfigError(f"method {method.name!r} labels each batch on its own and never feeds the shared "
                                "logit buffer: set labeler.use_buffer=false")
    if heads < 1:
        raise MethodConfigError(f"model.heads must be >= 1, got {heads}")
    if kind is NCDLR:
        made = [AdaptiveSelfLabeler.from_config(labeler, num_novel, fixed_prior) for _ in range(heads)]
        return NCDLR(method, made[0], labeler.use_buffer, made[1:])
    if kind is UNO:
        made = [AdaptiveSelfLabeler(num_novel, prior="uniform", eps=labeler.eps, n_iters=labeler.n_iters,
                                     reg_m=labeler.reg_m,
                                     size_bounds=AdaptiveSelfLabeler.bounds_for(labeler, num_novel))
                for _ in range(heads)]
        return UNO(method, made[0], made[1:])
    if heads > 1:
        raise MethodConfigError(f"method {method.name!r} trains one head only: set model.heads=1")
    return kind(method)
