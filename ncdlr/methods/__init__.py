"""Discovery methods behind one protocol (issue 6): the faithful NCDLR, UNO, AutoNovel, and post-hoc +LA/+cRT.

``build_method(cfg)`` turns ``cfg.method`` into a :class:`Method` that ``train_step`` dispatches through
(known loss, novel targets, novel loss); ``posthoc`` and ``crt`` act after training on the frozen model.
Ablations of ncdlr are config switches: ``labeler.use_buffer``, ``model.prototypes`` (etf | learnable),
``method.loss`` (mse | ce) and ``labeler.prior`` (adaptive | uniform | fixed | free | bounded).
"""

from __future__ import annotations

from .autonovel import AutoNovel, ranking_pairs
from .base import NCDLR, Method, MethodConfigError, pad_novel
from .crt import class_balanced_sampler, retrain_classifier
from .posthoc import logit_adjustment, pseudo_label_counts
from .uno import UNO

METHODS = {"ncdlr": NCDLR, "uno": UNO, "autonovel": AutoNovel}

__all__ = ["METHODS", "AutoNovel", "Method", "MethodConfigError", "NCDLR", "UNO", "build_method",
           "class_balanced_sampler", "logit_adjustment", "pad_novel", "pseudo_label_counts", "ranking_pairs",
           "retrain_classifier"]


def build_method(cfg) -> Method:
    """The :class:`Method` named by ``cfg.method.name`` (a :class:`ncdlr.service.config.Config`).

    ``method.loss = "auto"`` is ``mse`` for ncdlr and ``ce`` for uno/autonovel. UNO and AutoNovel need
    ``model.prototypes = "learnable"`` (checked when they first see the model) and ``labeler.use_buffer =
    false`` (checked here).
    """
    m = cfg.method
    if m.name not in METHODS:
        raise MethodConfigError(f"method.name {m.name!r} is not one of {', '.join(METHODS)}")
    loss = m.loss if m.loss != "auto" else ("mse" if m.name == "ncdlr" else "ce")
    if m.name != "ncdlr" and cfg.labeler.use_buffer:
        raise MethodConfigError(f"method {m.name!r} labels each batch on its own and never feeds the shared logit "
                                "buffer (the buffer actor would wait for it): set labeler.use_buffer=false")
    if m.name == "uno":
        return UNO(loss, m.temperature, eps=cfg.labeler.eps, n_iters=cfg.labeler.n_iters)
    if m.name == "autonovel":
        return AutoNovel(loss, m.temperature, topk=m.topk, consistency=m.consistency)
    return NCDLR(loss, m.temperature)
