"""Train one method on in-memory feature splits with the service's own loop (W = 1) and evaluate it.

The quality benchmark (``benchmarks/quality.py``), the γ rehearsal and the tests call this instead of Ray
Train: with one worker the service's step (:func:`~ncdlr.service.train_loop.train_step` via ``run_epoch`` on
``feature_batches``) is exactly the single-process algorithm (method.md §4.7), and no Ray start-up is paid per
grid cell. Evaluation follows method.md §5 (one Hungarian matching over all classes, class-mean accuracies,
Head/Medium/Tail by training count, last epoch — never selected on test), for the plain predictions and
for the post-hoc +LA and +cRT variants of the same trained model.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from ncdlr.buffer import LocalBuffer
from ncdlr.data.features import FeatureSplits, first_view
from ncdlr.methods import Method, buffer_width, build_method, posthoc_scores
from ncdlr.metrics import cluster_accuracy

from .buffer_cap import fill_buffer_cap
from .config import Config
from .num_novel import fill_from_known
from .run_data import init_head, model_for_table


@dataclass
class TrainedRun:
    """A trained model with what evaluation needs."""

    model: torch.nn.Module
    method: Method
    tau_history: list[float] = field(default_factory=list)
    seconds: float = 0.0
    metrics: dict[str, float] = field(default_factory=dict)  # the last epoch's (run_epoch's means)
    history: list[dict[str, float]] = field(default_factory=list)  # every epoch's metrics, in order


def oracle_prior(cfg: Config, splits: FeatureSplits) -> torch.Tensor | None:
    """The true novel training counts ``[Ku]`` for ``labeler.prior=fixed`` (the paper's oracle ablation), else None."""
    if cfg.labeler.prior != "fixed":
        return None
    return torch.tensor(splits.train_counts()[splits.num_known:], dtype=torch.float32)


def local_state(cfg: Config, model, steps_per_epoch: int, device: torch.device | str = "cpu",
                fixed_prior: torch.Tensor | None = None, known_counts=None):
    """A single-process :class:`~ncdlr.service.train_loop.WorkerState`: ``cfg``'s method for ``model.num_novel``
    clusters (its known rows weighted by their classes' training counts ``known_counts [Ks]`` under
    ``method.known_reweight``), with a :class:`~ncdlr.buffer.LocalBuffer` on ``device`` when the method uses the
    buffer."""
    from .train_loop import build_worker_state, compile_forward

    method = build_method(cfg.method, cfg.labeler, model.num_novel, fixed_prior=fixed_prior, heads=model.num_heads,
                          known_counts=known_counts)
    if method.uses_buffer:
        method.connect(buffer=LocalBuffer(cfg.labeler.buffer_size, buffer_width(model.num_novel, model.num_heads), device))
    state = build_worker_state(cfg.optim, model, method, steps_per_epoch, torch.device(device), seed=cfg.run.seed,
                               relax_after_epochs=cfg.labeler.relax_after_epochs)
    compile_forward(state, cfg.optim)
    return state


def train(cfg: Config, splits: FeatureSplits, on_epoch=None) -> TrainedRun:
    """Train ``cfg`` (method, model, labeler, optim, data.batch_size/feature_noise) on ``splits`` (known, novel).

    ``on_epoch(epoch, run)``: called after each epoch with the run so far (e.g. a trace of the clustering)."""
    from ncdlr.models import build_model

    from .train_loop import feature_batches, run_epoch, steps_per_epoch

    start = time.perf_counter()
    torch.manual_seed(cfg.run.seed)
    cfg.model.encoder = "identity"  # the table's input: embeddings, or the cached encoder (model_for_table)
    model_for_table(cfg, splits)
    fill_from_known(cfg, splits.train_counts(), splits.num_known, splits.features["novel"].shape[0])
    fill_buffer_cap(cfg, splits.features["novel"].shape[0], world=1, max_steps=cfg.data.max_steps_per_epoch)
    model = build_model(cfg.model, splits.num_known, splits.num_novel, image_size=cfg.data.image_size)
    init_head(cfg, model, splits)
    steps = steps_per_epoch(splits.features["novel"].shape[0], cfg.data.batch_size, 1, cfg.data.max_steps_per_epoch)
    state = local_state(cfg, model, steps, fixed_prior=oracle_prior(cfg, splits),
                        known_counts=splits.train_counts()[:splits.num_known])
    metrics: dict[str, float] = {}
    history: list[dict[str, float]] = []
    for epoch in range(cfg.optim.epochs):
        metrics = run_epoch(state, feature_batches(splits, cfg.data, cfg.run.seed, epoch, 0, 1), cfg.optim)
        history.append(metrics)
        if on_epoch is not None:
            on_epoch(epoch + 1, TrainedRun(model, state.method, list(state.tau_history), time.perf_counter() - start,
                                           metrics))
    final = state.averaged_model()  # the weights' moving average with optim.average_epochs > 0, else the last iterate
    return TrainedRun(final.eval(), state.method, list(state.tau_history), time.perf_counter() - start, metrics,
                      history)


@torch.no_grad()
def embed(model, x: torch.Tensor, batch: int = 1024) -> torch.Tensor:
    """``[N, D]`` unit embeddings of a table's rows ``x``: features ``[N, d_in]`` or cached activations
    ``[N, V, *shape]`` (view 0, :func:`~ncdlr.data.features.first_view`, taken a batch at a time)."""
    return embed_inputs(model, x, batch, view=first_view)


@torch.no_grad()
def embed_inputs(model, x: torch.Tensor, batch: int = 1024, view=None) -> torch.Tensor:
    """``[N, D]`` unit embeddings of model inputs ``x [N, *input]`` — rows already at one view (features
    ``[N, d_in]``, activations ``[N, *shape]``), e.g. :func:`~ncdlr.data.features.first_view`'s output, which must
    not be taken again (an activation row has no view axis left); ``view`` maps each batch first (:func:`embed`)."""
    if not len(x):
        return torch.zeros(0, model.head.out_dim)
    return torch.cat([model(part if view is None else view(part)).float() for part in x.split(batch)])


def fixed_scores(run: TrainedRun, splits, x: torch.Tensor, kinds: tuple[str, ...] = ("none",),
                 temperature: float = 0.1, crt_epochs: int = 10, seed: int = 0) -> dict[str, torch.Tensor]:
    """``{kind: [N, K] scores}`` of the rows ``x`` (a table's rows, view 0) for the plain model (``none``) and each
    post-hoc fix in ``kinds`` (:func:`ncdlr.methods.posthoc_scores`: +LA and +cRT take the known training rows of
    ``splits`` with their labels and the model's argmax over the novel columns as its ``novel`` training rows'
    pseudo-labels); the argmax of each is its prediction. The training rows are embedded once, and only if a fix
    needs them. Not under ``no_grad``: cRT trains a classifier (the embeddings are computed without a graph)."""
    model, ks = run.model, splits.num_known
    z_test = embed(model, x)
    logits = run.method.predict_logits(model, z_test)
    if any(kind != "none" for kind in kinds):  # the post-hoc fixes need the training rows; the plain model not
        z_known, z_novel = embed(model, splits.features["known"]), embed(model, splits.features["novel"])
        novel_logits = run.method.predict_logits(model, z_novel)[:, ks:]
    return {kind: logits if kind == "none" else posthoc_scores(
        kind, z_test, logits, z_known, splits.labels["known"], z_novel, novel_logits, model.class_prototypes(),
        temperature=temperature, crt_epochs=crt_epochs, seed=seed) for kind in kinds}


def evaluate(run: TrainedRun, splits, split: str = "test", posthoc: tuple[str, ...] = ("none", "la", "crt"),
             temperature: float = 0.1, crt_epochs: int = 10, seed: int = 0) -> dict[str, dict[str, float]]:
    """``{posthoc: cluster_accuracy(...)}`` on ``split`` for the plain model and each post-hoc fix
    (:func:`fixed_scores`)."""
    scores = fixed_scores(run, splits, splits.features[split], posthoc, temperature, crt_epochs, seed)
    return {kind: cluster_accuracy(splits.labels[split].numpy(), scores[kind].argmax(1).numpy(), splits.num_known,
                                   train_counts=splits.train_counts()) for kind in posthoc}
