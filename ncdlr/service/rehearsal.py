"""Choosing γ without touching the novel labels: a discovery rehearsal on the known classes (method.md §4 trap c).

The known classes are split (seeded) into a proxy-known half and a proxy-novel half whose labels are
hidden; each candidate ``γ`` trains the method on that proxy problem and is scored by the clustering
accuracy (class-mean, Hungarian) on the proxy-novel training rows. Since ``γ`` enters as ``γ · KL / Ku``
(its strength grows as Ku shrinks, trap a), the candidates are compared at equal ``γ / Ku`` and the winner is
rescaled to the real ``Ku``. Cost: one proxy training per candidate (about half a real one each).
"""

from __future__ import annotations

import copy

import numpy as np
import torch

from ncdlr.metrics import cluster_accuracy


def known_class_proxy(splits, seed: int):
    """``FeatureSplits`` of the proxy problem: known classes split in half, ``test`` = the proxy-novel rows.

    Returns the proxy splits; proxy labels are ``0..a-1`` (proxy-known) and ``a..Ks-1`` (proxy-novel).
    """
    from ncdlr.service.train_loop import FeatureSplits

    ks = splits.num_known
    if ks < 4:
        raise ValueError(f"a known-class proxy needs at least 4 known classes, got {ks}")
    order = torch.randperm(ks, generator=torch.Generator().manual_seed(seed + 7))
    a = ks - ks // 2
    relabel = torch.empty(ks, dtype=torch.long)
    relabel[order] = torch.arange(ks)
    x, y = splits.features["known"], relabel[splits.labels["known"]]
    known, novel = y < a, y >= a
    return FeatureSplits({"known": x[known], "novel": x[novel], "test": x[novel]},
                         {"known": y[known], "novel": y[novel], "test": y[novel]}, a, ks - a,
                         [str(i) for i in range(ks)])


def select_gamma(cfg, splits, gamma_per_cluster: tuple[float, ...] = (0.05, 0.15, 0.5, 1.5)) -> tuple[float, dict]:
    """Best ``γ`` for ``cfg`` on ``splits`` by the known-class rehearsal.

    Args:
        cfg: the run's config (its ``labeler.gamma`` is ignored); ``splits``: the real feature splits.
        gamma_per_cluster: candidates for ``γ / Ku``.

    Returns:
        ``(γ for the real Ku, {γ/Ku: proxy-novel class-mean accuracy})``.
    """
    from .run import evaluate, train

    proxy = known_class_proxy(splits, cfg.run.seed)
    scores = {}
    for ratio in gamma_per_cluster:
        trial = copy.deepcopy(cfg)
        trial.labeler.gamma = ratio * proxy.num_novel
        run = train(trial, proxy)
        metrics = evaluate(run, proxy, posthoc=("none",))["none"]
        scores[ratio] = metrics["novel"]
    best = max(scores, key=lambda r: (scores[r], -abs(np.log(r / 0.5))))
    return best * splits.num_novel, scores
