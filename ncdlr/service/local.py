"""Train one method on in-memory feature splits with the service's own loop (W = 1) and evaluate it.

The benchmark (``benchmarks/quality.py``) and the tests call this instead of Ray Train: with one worker
the service's step (``ncdlr.service.train_loop.train_step`` via ``run_epoch`` on ``feature_batches``) is
exactly the single-process algorithm (method.md §4.7), and no Ray start-up is paid per grid cell.
Evaluation follows method.md §5 (one Hungarian matching over all classes, class-mean accuracies,
Head/Medium/Tail by training count, last epoch — never selected on test), for the plain predictions and
for the post-hoc +LA and +cRT variants of the same trained model.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from ncdlr.metrics import cluster_accuracy
from ncdlr.ot import AdaptiveSelfLabeler

from . import build_method
from .crt import retrain_classifier
from .posthoc import logit_adjustment, pseudo_label_counts


@dataclass
class TrainedRun:
    """A trained model with what evaluation needs."""

    model: torch.nn.Module
    method: object
    tau_history: list[float] = field(default_factory=list)
    seconds: float = 0.0


def build_labeler(cfg, splits) -> AdaptiveSelfLabeler:
    """The run's labeler; ``prior="fixed"`` gets the true novel training counts (the paper's oracle ablation)."""
    lab = cfg.labeler
    fixed = None
    if lab.prior == "fixed":
        counts = torch.tensor(splits.train_counts()[splits.num_known:], dtype=torch.float32)
        fixed = counts
    return AdaptiveSelfLabeler(splits.num_novel, prior=lab.prior, eps=lab.eps, n_iters=lab.n_iters,
                               outer_steps=lab.outer_steps, gamma=lab.gamma, lr=lab.lr, momentum=lab.momentum,
                               init_t=lab.init_t, fixed_prior=fixed, max_imbalance=lab.max_imbalance or None)


def known_imbalance(splits) -> float:
    """``n_max / n_min`` over the known classes' training counts (observable; the bounded prior's τ_max)."""
    counts = np.asarray(splits.train_counts()[: splits.num_known], dtype=float)
    counts = counts[counts > 0]
    return float(counts.max() / counts.min())


def train(cfg, splits) -> TrainedRun:
    """Train ``cfg`` (method, model, labeler, optim, data.batch_size/feature_noise) on ``splits`` (known, novel)."""
    from ncdlr.models import build_model
    from ncdlr.service.train_loop import LocalBuffer, build_worker_state, feature_batches, run_epoch, steps_per_epoch

    start = time.perf_counter()
    torch.manual_seed(cfg.run.seed)
    cfg.model.encoder, cfg.model.feature_dim = "identity", splits.dim
    model = build_model(cfg.model, splits.num_known, splits.num_novel)
    steps = steps_per_epoch(splits.features["novel"].shape[0], cfg.data.batch_size, 1, cfg.data.max_steps_per_epoch)
    plain = copy.deepcopy(cfg)
    plain.labeler.prior = "uniform"  # build_worker_state cannot give prior="fixed" its counts; ours replaces it
    state = build_worker_state(plain, model, steps, torch.device("cpu"))
    state.labeler = build_labeler(cfg, splits)
    buffer = LocalBuffer(cfg.labeler.buffer_size, splits.num_novel) if cfg.labeler.use_buffer else None
    for epoch in range(cfg.optim.epochs):
        run_epoch(state, feature_batches(splits, cfg, epoch, 0, 1), cfg, buffer)
    return TrainedRun(model.eval(), build_method(cfg), list(state.tau_history), time.perf_counter() - start)


@torch.no_grad()
def embed(model, x: torch.Tensor, batch: int = 4096) -> torch.Tensor:
    """``[N, D]`` unit embeddings of features ``x [N, d_in]``."""
    return torch.cat([model(part).float() for part in x.split(batch)]) if len(x) else x.new_zeros(0, model.head.out_dim)


def evaluate(run: TrainedRun, splits, split: str = "test", posthoc: tuple[str, ...] = ("none", "la", "crt"),
             temperature: float = 0.1, crt_epochs: int = 10, seed: int = 0) -> dict[str, dict[str, float]]:
    """``{posthoc: cluster_accuracy(...)}`` on ``split`` for the plain model, +LA and +cRT.

    +LA and +cRT use pseudo-labels of the novel training rows: the argmax of the trained model over the
    novel columns (known rows keep their labels).
    """
    model, ks = run.model, splits.num_known
    counts = splits.train_counts()
    y_true = splits.labels[split].numpy()
    z_test = embed(model, splits.features[split])
    logits = run.method.predict_logits(model, z_test)
    out: dict[str, dict[str, float]] = {}
    if "none" in posthoc:
        out["none"] = cluster_accuracy(y_true, logits.argmax(1).numpy(), ks, train_counts=counts)
    if {"la", "crt"} & set(posthoc):
        z_known, z_novel = embed(model, splits.features["known"]), embed(model, splits.features["novel"])
        novel_logits = run.method.predict_logits(model, z_novel)[:, ks:]
        pseudo = pseudo_label_counts(splits.labels["known"], novel_logits, ks)
        if "la" in posthoc:
            adjusted = logit_adjustment(logits, pseudo, temperature)
            out["la"] = cluster_accuracy(y_true, adjusted.argmax(1).numpy(), ks, train_counts=counts)
        if "crt" in posthoc:
            labels = torch.cat([splits.labels["known"], ks + novel_logits.argmax(1)])
            weights = retrain_classifier(torch.cat([z_known, z_novel]), labels, model.class_prototypes().detach(),
                                         epochs=crt_epochs, temperature=temperature, seed=seed)
            out["crt"] = cluster_accuracy(y_true, (z_test @ weights).argmax(1).numpy(), ks, train_counts=counts)
    return out
