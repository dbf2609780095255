"""The per-worker training loop: paired known/novel batches, two views, ``L = L_s + α L_u`` (method.md §3-4).

Plain PyTorch: the run's :class:`~ncdlr.methods.Method` (built once per worker, its distributed parts wired in
with ``Method.connect``) gives the losses and the novel targets, so the loop runs (and is tested) in one
process without Ray.

One step on rank ``r`` of ``W`` (``B`` known + ``B`` novel rows, two views each):

1. ``z = normalize(g(f(x)))`` for the four view batches (one forward pass).
2. ``L_s``: the method's known loss over the valid known rows.
3. Novel targets: the method's discovery step (:class:`ncdlr.methods.Discovery`: all ranks' novel logits
   gathered, solved over the shared buffer, this rank's labels kept).
4. ``L_u``: the method's novel loss (swapped prediction); ``L = L_s + α L_u``; AdamW step; the LR schedule
   (linear warm-up, then cosine to ``min_lr``) advances per step.

With ``optim.mixup`` (off by default) the second views of the known and the novel rows are also blended with
other rows of the batch (:mod:`ncdlr.methods.mixup`) and pass through the same forward; ``L`` gains
``L_s^mix + α L_u^mix`` against the same blend of their targets (labels; the other view's pseudo-labels).
With ``optim.teacher_epochs`` > 0 (off by default) step 3 solves a *mean teacher*'s novel logits instead of the
model's own: an exponential moving average of the weights, run without gradient in eval mode on the novel views
(:func:`teacher_embeddings`); the model trains on the teacher's labels, and the teacher follows it after each step.
With ``method.task_weight`` > 0 (off by default) ``L`` also gains the method's known-vs-novel term over the valid
rows of both views (``Method.task_loss``; not on the mixed rows), from the first step, the warm-up included.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

from ncdlr.data.features import FeatureSplits
from ncdlr.data.transforms import normalise_chw_torch
from ncdlr.labeler import AdaptiveSelfLabeler
from ncdlr.methods import Method
from ncdlr.methods.mixup import MixPlan, blend, draw_mix, mixed_loss
from ncdlr.metrics import pseudo_label_sizes
from ncdlr.models import NCDModel

from .config import DataConfig, OptimConfig

log = logging.getLogger(__name__)


@dataclass
class PairedBatch:
    """One step's input on one rank. Views are ``[B, ...]`` (images ``[B,3,H,W]`` or features ``[B,D]``).

    ``*_valid`` is False for rows whose image could not be decoded (their views are zeros); such rows are
    excluded from the losses and the OT problem and counted in ``bad_images``.
    """

    known_view1: torch.Tensor
    known_view2: torch.Tensor
    known_labels: torch.Tensor  # [B] int64 in 0..Ks-1
    known_valid: torch.Tensor  # [B] bool
    novel_view1: torch.Tensor
    novel_view2: torch.Tensor
    novel_valid: torch.Tensor  # [B] bool
    # Set when the image views are uint8 (not yet normalised): train_step normalises them on its device.
    scaling: str | None = None


def all_gather_rows(local: torch.Tensor) -> torch.Tensor:
    """``[n, ...]`` on each rank → ``[W, n, ...]`` (rank order); identity with a leading 1 when not distributed."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return local.unsqueeze(0)
    parts = [torch.empty_like(local) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, local.contiguous())
    return torch.stack(parts)


@dataclass
class StepTimes:
    """Seconds per phase, summed over an epoch."""

    data: float = 0.0  # waiting for the next batch
    exchange: float = 0.0  # all_gather + buffer (actor) exchange
    ot: float = 0.0  # AdaptiveSelfLabeler call
    total: float = 0.0  # whole step including data wait

    def shares(self) -> dict[str, float]:
        total = max(self.total, 1e-12)
        return {"data_share": self.data / total, "exchange_share": self.exchange / total, "ot_share": self.ot / total}


@dataclass
class WorkerState:
    """Everything a rank trains and checkpoints."""

    model: NCDModel
    method: Method  # built once per worker; its labeler (t, τ) is part of the state
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    device: torch.device
    step: int = 0  # global steps done
    epoch: int = 0  # epochs done
    tau_history: list[float] = field(default_factory=list)
    forward: torch.nn.Module | None = None  # DDP wrapper of ``model`` when distributed, else None (use model)
    discovery_from: int = 0  # first global step with self-labeling and the novel loss (optim.known_warmup_epochs)
    relax_from: int = 0  # first discovery step whose solves relax the sizes by reg_m (labeler.relax_after_epochs)
    seed: int = 0  # the run's seed: with the step and the rank it draws each step's mixup pairing (optim.mixup)
    average: AveragedModel | None = None  # the weights' moving average (optim.average_epochs), updated every step
    teacher: AveragedModel | None = None  # the mean teacher that labels the novel rows (optim.teacher_epochs), likewise
    # model.heads > 1: each head's novel loss summed over this epoch's discovery steps ([H], on the device; reset
    # and read by run_epoch, which selects the predicting head from it)
    head_loss: torch.Tensor | None = None
    head_steps: int = 0
    # hard pseudo-labels per novel cluster over this epoch's valid novel rows, both views ([Ku], on the device;
    # reset and read by run_epoch: the label-free clusters_empty / cluster_imbalance of its metrics)
    cluster_counts: torch.Tensor | None = None
    # the same rows' largest target share max_k q_ik, summed ([], on the device; reset and read with cluster_counts:
    # the label-free pseudo_label_confidence of its metrics)
    confidence_sum: torch.Tensor | None = None

    def averaged_model(self) -> NCDModel:
        """The model to evaluate and export: the moving average's copy when ``optim.average_epochs`` > 0, else
        ``model`` (the last iterate)."""
        return self.model if self.average is None else self.average.module

    @property
    def discovery_step(self) -> int:
        """Steps of self-labeling done: the shared buffer's clock (negative during the known-class warm-up)."""
        return self.step - self.discovery_from

    @property
    def labeler(self) -> AdaptiveSelfLabeler | None:
        """The method's stateful labeler (None for methods without one)."""
        return self.method.labeler


def warmup_cosine(total_steps: int, warmup_steps: int, min_ratio: float):
    """LR multiplier: linear warm-up over ``warmup_steps`` then cosine from 1 to ``min_ratio`` at ``total_steps``."""

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return factor


def build_worker_state(optim: OptimConfig, model: NCDModel, method: Method, steps_per_epoch: int,
                       device: torch.device, seed: int = 0, relax_after_epochs: float = 0.0) -> WorkerState:
    """AdamW over the trainable parameters and the LR schedule; the model and the method's labeler on ``device``.
    ``relax_after_epochs``: epochs of self-labeling whose solves hold the sizes before ``reg_m`` relaxes them."""
    model.to(device)
    if optim.channels_last:
        model.to(memory_format=torch.channels_last)
    for labeler in method.labelers:
        labeler.to(device)
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise ValueError("the model has no trainable parameters (trainable_blocks=0 with a frozen head?)")
    optimizer = torch.optim.AdamW(params, lr=optim.lr, weight_decay=optim.weight_decay)
    total = max(1, optim.epochs * steps_per_epoch)
    warm = max(1, int(round(optim.warmup_epochs * steps_per_epoch)))
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_cosine(total, warm, optim.min_lr / optim.lr))
    return WorkerState(model, method, optimizer, scheduler, device,
                       discovery_from=int(round(optim.known_warmup_epochs * steps_per_epoch)),
                       relax_from=int(round(relax_after_epochs * steps_per_epoch)), seed=seed,
                       average=moving_average(model, optim.average_epochs, steps_per_epoch),
                       teacher=moving_average(model, optim.teacher_epochs, steps_per_epoch))


def moving_average(model: NCDModel, horizon_epochs: float, steps_per_epoch: int) -> AveragedModel | None:
    """``torch.optim.swa_utils.AveragedModel`` keeping an exponential moving average of ``model``'s parameters and
    buffers (batch-norm statistics too) with decay ``1 − 1/(horizon_epochs · steps_per_epoch)``: a horizon in
    epochs, so it carries across datasets of other sizes. None when ``horizon_epochs`` is 0 (off)."""
    if horizon_epochs <= 0:
        return None
    decay = 1.0 - 1.0 / max(1.0, horizon_epochs * steps_per_epoch)
    return AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(decay), use_buffers=True)


def compile_forward(state: WorkerState, optim: OptimConfig) -> None:
    """With ``optim.compile``: the step's forward (the DDP wrapper when there is one) through ``torch.compile``.
    Call once the state is complete; ``state.model`` stays the eager module (evaluation, checkpoints)."""
    if optim.compile:
        state.forward = torch.compile(state.model if state.forward is None else state.forward)


def train_step(state: WorkerState, batch: PairedBatch, optim: OptimConfig) -> dict[str, float]:
    """One optimisation step on this rank (collective: every rank must call it). Returns scalar stats."""
    model, device, method = state.model, state.device, state.method
    model.train()
    b = batch.known_view1.shape[0]
    x = torch.cat([batch.known_view1, batch.known_view2, batch.novel_view1, batch.novel_view2]).to(device, non_blocking=True)
    known_valid = batch.known_valid.to(device)
    novel_valid = batch.novel_valid.to(device)
    if x.dtype == torch.uint8:  # views that crossed to the device as bytes (PairedBatches(normalise=False))
        if batch.scaling is None:
            raise ValueError("uint8 image views need PairedBatch.scaling (the normalisation to apply)")
        x = normalise_chw_torch(x, batch.scaling)
        # Rows of undecodable or padded images are zeros after normalisation, as on the host path (the encoder
        # still sees them, e.g. in batch-norm statistics). masked_fill_, not boolean indexing: no device sync.
        rows = torch.cat([known_valid, known_valid, novel_valid, novel_valid])
        x.masked_fill_(~rows[:, None, None, None], 0.0)  # x is [4B, 3, H, W] (normalise_chw_torch checked)
    mix = mix_plans(state, batch, optim.mixup)
    if mix is not None:  # the mixed second views ride in the same forward (one pass; DDP-safe)
        x = torch.cat([x, blend(x[b:2 * b], mix[0]), blend(x[3 * b:], mix[1])])
    if optim.channels_last and x.dim() == 4:
        x = x.contiguous(memory_format=torch.channels_last)
    use_amp = optim.amp and device.type == "cuda"
    heads = model.num_heads
    forward = model if state.forward is None else state.forward
    with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=use_amp):
        # [H, rows, D]: every head's embeddings (one head: the plain forward, with a leading 1)
        zs = forward(x, all_heads=True).float() if heads > 1 else forward(x).float()[None]
    views = [model] if heads == 1 else [model.head_view(h) for h in range(heads)]
    zk1, zk2, zn1, zn2, *z_mix = zs.split(b, dim=1)
    labels = batch.known_labels.to(device)
    if known_valid.any():
        loss_s = sum(method.known_loss(views[h], zk1[h][known_valid], zk2[h][known_valid], labels[known_valid])
                     for h in range(heads)) / heads
    else:
        loss_s = zs.sum() * 0.0
    q = None
    if state.discovery_step < 0:  # known-class warm-up: no pseudo-labels (the buffer and τ wait too)
        loss_u, times = zs.sum() * 0.0, {"exchange": 0.0, "ot": 0.0}
    else:
        hold_sizes(method, state.discovery_step < state.relax_from)
        if state.teacher is None:
            targets, times = method.novel_targets_heads(views, zn1, zn2, novel_valid, state.discovery_step)
        else:  # the mean teacher's logits of the same novel views are what the discovery step solves
            teacher_views, tn1, tn2 = teacher_embeddings(state.teacher.module, x[2 * b:4 * b], heads, use_amp)
            targets, times = method.novel_targets_heads(teacher_views, tn1, tn2, novel_valid, state.discovery_step)
        q = targets[0]
        count_pseudo_labels(state, q, novel_valid)
        has_novel = bool(novel_valid.any())
        if has_novel:
            per_head = torch.stack([method.novel_loss(views[h], zn1[h], zn2[h], targets[h], novel_valid)
                                    for h in range(heads)])
            loss_u = per_head.sum() / heads
        else:
            per_head, loss_u = zs.new_zeros(heads), zs.sum() * 0.0
        if heads > 1:  # every rank adds in the same steps (the discovery steps), so select_head's reduce matches
            state.head_loss = per_head.detach() + (0.0 if state.head_loss is None else state.head_loss)
            state.head_steps += int(has_novel)
    loss = loss_s + optim.alpha * loss_u
    loss_task = zs.sum() * 0.0
    if method.task_weight > 0:  # the known-vs-novel term, valid rows of both views (exact targets: from step 0)
        loss_task = sum(method.task_loss(views[h], torch.cat([zk1[h][known_valid], zk2[h][known_valid]]),
                                         torch.cat([zn1[h][novel_valid], zn2[h][novel_valid]]))
                        for h in range(heads)) / heads
        loss = loss + loss_task
    loss_mix = zs.sum() * 0.0
    if mix is not None:  # one head (the config refuses model.heads > 1 with mixup)
        loss_mix = mixed_loss(method, model, [zm[0] for zm in z_mix], mix, labels, q, optim.alpha)
        loss = loss + loss_mix
    state.optimizer.zero_grad(set_to_none=True)
    loss.backward()
    state.optimizer.step()
    state.scheduler.step()
    for averaged in (state.average, state.teacher):
        if averaged is not None:
            averaged.update_parameters(model)
    state.step += 1
    return {
        "loss": loss.item(), "loss_s": loss_s.item(), "loss_u": loss_u.item(), "loss_mix": loss_mix.item(),
        "loss_task": loss_task.item(),
        "tau": method.imbalance_factor,
        "bad_images": float((~batch.known_valid).sum() + (~batch.novel_valid).sum()),
        "exchange_s": times["exchange"], "ot_s": times["ot"],
    }


def teacher_embeddings(teacher: NCDModel, x_novel: torch.Tensor, heads: int, use_amp: bool
                       ) -> tuple[list, torch.Tensor, torch.Tensor]:
    """The mean teacher's view of the step's novel rows (``optim.teacher_epochs``): ``x_novel [2B, ...]`` (view 1
    rows, then view 2 rows) through ``teacher`` without gradient, in eval mode (batch-norm layers use the teacher's
    averaged statistics, so the batch's own statistics do not move its labels), under the step's autocast.
    Returns the teacher's per-head prototype views (what the discovery step reads the novel prototypes from) and
    its embeddings ``[H, B, D]`` of each view."""
    was_training = teacher.training
    teacher.eval()
    try:
        with torch.no_grad(), torch.autocast(device_type=x_novel.device.type, dtype=torch.bfloat16, enabled=use_amp):
            zt = teacher(x_novel, all_heads=True).float() if heads > 1 else teacher(x_novel).float()[None]
    finally:
        teacher.train(was_training)
    views = [teacher] if heads == 1 else [teacher.head_view(h) for h in range(heads)]
    tn1, tn2 = zt.split(x_novel.shape[0] // 2, dim=1)
    return views, tn1, tn2


def hold_sizes(method: Method, held: bool) -> None:
    """Hold (``held``) or relax the cluster sizes of every labeler of ``method`` for the next solve: the relaxation's
    warm-up (``labeler.relax_after_epochs``). Derived from the step each time, so a resumed run holds and relaxes
    in the same steps as an uninterrupted one. No effect where ``reg_m`` is 0."""
    for labeler in method.labelers:
        labeler.sizes_held = held


def count_pseudo_labels(state: WorkerState, q: torch.Tensor, valid: torch.Tensor) -> None:
    """Add the step's hard pseudo-labels (argmax of ``q [2, B, Ku]``, soft targets of both views) of the ``valid
    [B]`` rows to ``state.cluster_counts``, and their largest target shares ``max_k q`` to ``state.confidence_sum``.
    Masked, not indexed: no device sync. Targets of another shape (a method whose targets are not per-cluster
    distributions) are not counted."""
    num_novel = state.model.num_novel
    if q.dim() != 3 or q.shape[0] != 2 or q.shape[-1] != num_novel:
        return
    rows = valid.to(q.device, torch.float32)[None, :]  # [1, B]
    top, hard = q.detach().float().max(-1)  # [2, B] each
    counts = (F.one_hot(hard, num_novel).to(torch.float32) * rows[..., None]).sum((0, 1))
    confidence = (top * rows).sum()
    state.cluster_counts = counts if state.cluster_counts is None else state.cluster_counts + counts
    state.confidence_sum = confidence if state.confidence_sum is None else state.confidence_sum + confidence


def epoch_cluster_sizes(state: WorkerState) -> dict[str, float]:
    """:func:`ncdlr.metrics.pseudo_label_sizes` of this epoch's pseudo-labels, summed over the ranks (collective
    when distributed: every rank counts in the same steps), and ``pseudo_label_confidence``: the mean over the same
    rows of their target's largest share ``max_k q_ik`` (1: one-hot targets; ``1/Ku``: uniform ones; label-free, it
    says how sharp the self-labels the novel loss trained on were). Resets the counts. Empty without a counted step
    (the known-class warm-up, or a method whose targets are not counted: alike on every rank)."""
    counts, state.cluster_counts = state.cluster_counts, None
    confidence, state.confidence_sum = state.confidence_sum, None
    if counts is None:
        return {}
    totals = torch.cat([counts, confidence.reshape(1)])
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(totals)
    totals = totals.cpu().numpy()
    sizes = pseudo_label_sizes(totals[:-1])
    rows = float(totals[:-1].sum())
    sizes["pseudo_label_confidence"] = float(totals[-1]) / rows if rows > 0 else float("nan")
    return sizes


def watch_relaxation(state: WorkerState, sizes: dict[str, float]) -> dict[str, float]:
    """Hand an epoch's pseudo-label sizes (:func:`epoch_cluster_sizes`, the same on every rank) to every labeler's
    ``labeler.relax_bound`` watch (:meth:`~ncdlr.labeler.AdaptiveSelfLabeler.watch_epoch_sizes`). Returns
    ``{"sizes_held_from_epoch": e}`` when this epoch stopped a relaxation (the sizes are held from epoch ``e + 1``
    on), ``{"sizes_tightened_from_epoch": e, "reg_m_now": ρ}`` when it tightened one (``labeler.relax_tighten``: the
    first labeler's ``ρ`` from epoch ``e + 1`` on), else ``{}``."""
    if not sizes:
        return {}
    acted = [labeler.watch_epoch_sizes(sizes["clusters_empty"], sizes["cluster_imbalance"])
             for labeler in state.method.labelers]
    if not any(acted):
        return {}
    first = state.method.labelers[0]
    if first.relax_stopped:
        return {"sizes_held_from_epoch": float(state.epoch + 1)}
    return {"sizes_tightened_from_epoch": float(state.epoch + 1), "reg_m_now": first.reg_m_now}


def mix_plans(state: WorkerState, batch: PairedBatch, alpha: float) -> tuple[MixPlan, MixPlan] | None:
    """The step's mixup pairings (known rows, novel rows), drawn from (run seed, step, rank, which); None when
    ``optim.mixup`` is 0. Seeded per step, so a resumed run pairs the rows as an uninterrupted one."""
    if alpha <= 0:
        return None
    rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
    return (draw_mix(batch.known_valid, alpha, [state.seed, state.step, rank, 0]),
            draw_mix(batch.novel_valid, alpha, [state.seed, state.step, rank, 1]))


def run_epoch(state: WorkerState, batches: Iterable[PairedBatch], optim: OptimConfig, on_step=None
              ) -> dict[str, float]:
    """Train over ``batches``; return epoch means of the step stats, phase shares, ``steps_per_s``, the epoch's
    start-up: ``first_batch_s`` (waiting for the first batch) and ``first_step_s`` (the first step), and, after a
    self-labeling epoch, the label-free ``clusters_empty`` and ``cluster_imbalance`` of its pseudo-labels
    (:func:`epoch_cluster_sizes`), and ``sizes_held_from_epoch`` when they stopped a relaxation (:func:`watch_relaxation`)."""
    times = StepTimes()
    first: list[float] = []
    sums: dict[str, float] = {}
    steps = 0
    iterator: Iterator[PairedBatch] = iter(batches)
    start = time.perf_counter()
    while True:
        t0 = time.perf_counter()
        try:
            batch = next(iterator)
        except StopIteration:
            break
        t1 = time.perf_counter()
        stats = train_step(state, batch, optim)
        t2 = time.perf_counter()
        if not first:
            first = [t1 - t0, t2 - t1]
        times.data += t1 - t0
        times.exchange += stats["exchange_s"]
        times.ot += stats["ot_s"]
        times.total += t2 - t0
        steps += 1
        for key, value in stats.items():
            sums[key] = sums.get(key, 0.0) + value
        state.tau_history.append(stats["tau"])
        if on_step is not None:
            on_step(state, stats)
    state.epoch += 1
    elapsed = time.perf_counter() - start
    head_losses = select_head(state)
    sizes = epoch_cluster_sizes(state)
    out = {k: v / max(steps, 1) for k, v in sums.items() if k != "bad_images"}
    out["bad_images"] = sums.get("bad_images", 0.0)
    out.update(times.shares())
    out["first_batch_s"], out["first_step_s"] = first or [0.0, 0.0]
    out.update({"steps": float(steps), "steps_per_s": steps / max(elapsed, 1e-9), "epoch": float(state.epoch),
                "tau": state.method.imbalance_factor, "lr": state.scheduler.get_last_lr()[0]})
    out.update(sizes)
    out.update(watch_relaxation(state, sizes))
    if head_losses is not None:
        out["head"] = float(state.model.selected)
        out.update({f"loss_u_head{h}": value for h, value in enumerate(head_losses)})
    return out


def select_head(state: WorkerState) -> list[float] | None:
    """``model.heads`` > 1: make the head with the lowest mean novel loss over this epoch (summed over the ranks,
    so every rank picks the same) the one that predicts, in the model and its moving average; reset the sums.
    Returns the heads' mean losses, or None with one head or an epoch without self-labeling (selection kept).

    The loss is label-free (UNO's rule for its multi-head evaluation): of heads trained on the same encoder, the one
    whose swapped predictions agree best with its own pseudo-labels."""
    if state.model.num_heads == 1:
        return None
    sums, steps = state.head_loss, state.head_steps
    state.head_loss, state.head_steps = None, 0
    if sums is None:  # no discovery step this epoch (the known-class warm-up): alike on every rank
        return None
    totals = torch.cat([sums, sums.new_tensor([float(steps)])])  # [H + 1]: the loss sums, the steps with novel rows
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(totals)
    if totals[-1].item() == 0:
        return None
    means = (totals[:-1] / totals[-1]).tolist()
    best = int(np.argmin(means))
    state.model.select_head(best)
    if state.average is not None:
        state.average.module.select_head(best)
    state.method.active_head = best
    return means


# -- feature-table mode: in-memory, deterministic per (seed, epoch, step, rank) --------------------------------

def steps_per_epoch(num_novel_rows: int, batch_size: int, world: int, max_steps: int = 0) -> int:
    """Global steps per epoch: full batches of ``W·B`` novel rows (drop-last), capped by ``max_steps``."""
    steps = num_novel_rows // (batch_size * world)
    if steps == 0:
        raise ValueError(f"novel split has {num_novel_rows} rows, fewer than one global batch of "
                         f"{world} workers × {batch_size}; lower data.batch_size")
    return min(steps, max_steps) if max_steps > 0 else steps


def epoch_max_steps(data: DataConfig, feature_table: bool) -> int:
    """The ``max_steps`` of :func:`steps_per_epoch` for a run: ``data.max_steps_per_epoch`` on a feature table; 0 on
    image streams, which run whole epochs. The worker and the driver's buffer cap both count steps by it."""
    return data.max_steps_per_epoch if feature_table else 0


def feature_batches(splits: FeatureSplits, data: DataConfig, seed: int, epoch: int, rank: int, world: int
                    ) -> Iterator[PairedBatch]:
    """Paired batches for ``rank``: a seeded permutation of the novel rows (known rows cycled), ``B`` each.

    Global batch ``s`` is rows ``[s·W·B, (s+1)·W·B)`` of the epoch's permutation; rank ``r`` takes its
    ``r``-th block of ``B``, so the concatenation over ranks is the single-process batch of size ``W·B``.
    Embeddings ``[N, D]``: the two views add Gaussian noise of std ``data.feature_noise`` (seeded per step and
    rank). Cached activations ``[N, V, *shape]`` (float16): the two views are two *different* cached crops of
    each image, drawn per step and rank, as float32.
    """
    b = data.batch_size
    known_x, known_y = splits.features["known"], splits.labels["known"]
    novel_x, novel_y = splits.features["novel"], splits.labels["novel"]
    steps = steps_per_epoch(novel_x.shape[0], b, world, data.max_steps_per_epoch)
    gen = torch.Generator().manual_seed(seed * 100003 + epoch)
    novel_order = torch.randperm(novel_x.shape[0], generator=gen)
    need = steps * world * b
    known_order = torch.cat([torch.randperm(known_x.shape[0], generator=gen)
                             for _ in range(-(-need // known_x.shape[0]))])
    noise = data.feature_noise
    for s in range(steps):
        lo = (s * world + rank) * b
        ki, ni = known_order[lo:lo + b], novel_order[lo:lo + b]
        view_gen = torch.Generator().manual_seed(((seed * 1009 + epoch) * 100003 + s) * 131 + rank)

        def views(table: torch.Tensor, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            if table.dim() > 2:  # [N, V, *shape]: view v and a different view w of each row (only those gathered)
                count = table.shape[1]
                v = torch.randint(0, count, (len(rows),), generator=view_gen)
                w = (v + torch.randint(1, count, (len(rows),), generator=view_gen)) % count
                return table[rows, v].float(), table[rows, w].float()
            x = table[rows]
            if noise <= 0:
                return x, x
            return (x + noise * torch.randn(x.shape, generator=view_gen),
                    x + noise * torch.randn(x.shape, generator=view_gen))

        k1, k2 = views(known_x, ki)
        n1, n2 = views(novel_x, ni)
        yield PairedBatch(k1, k2, known_y[ki], torch.ones(b, dtype=torch.bool), n1, n2,
                          torch.ones(b, dtype=torch.bool))


@torch.no_grad()
def predict(model: NCDModel, inputs: Iterable[torch.Tensor], device: torch.device) -> np.ndarray:
    """``argmax_k z·p_k`` over all K classes for each batch of inputs; ``[N]`` int64."""
    model.eval()
    out = [model.logits(model(x.to(device)).float()).argmax(1).cpu() for x in inputs]
    return torch.cat(out).numpy() if out else np.zeros(0, dtype=np.int64)
