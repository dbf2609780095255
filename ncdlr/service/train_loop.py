"""The per-worker training loop: paired known/novel batches, two views, ``L = L_s + α L_u`` (method.md §3-4).

Plain PyTorch; Ray appears only through the :class:`Exchange` a worker is given, so the loop runs (and is
tested) in one process without Ray.

One step on rank ``r`` of ``W`` (``B`` known + ``B`` novel rows, two views each):

1. ``z = normalize(g(f(x)))`` for the four view batches (one forward pass).
2. ``L_s = ½ Σ_views mean_i ‖z_i - p_{y_i}‖²`` over the valid known rows.
3. Novel logits ``S_v = z_v P^u`` ``[B, Ku]``; all ranks' rows are gathered (``all_gather``) and ordered
   ``[view 1 of rank 0..W-1; view 2 of rank 0..W-1]`` — exactly the rows a single process would have on
   the concatenated batch. Invalid (undecodable) rows are dropped by a gathered mask.
4. Each rank's replica of the shared buffer gives ``[history; gathered]`` — identical on all ranks, since all
   push the same gathered rows (no actor read in the step); every rank runs the same
   :class:`~ncdlr.ot.AdaptiveSelfLabeler` on it, so ``t``/``τ`` stay identical; each rank keeps the soft
   labels of its own rows; rank 0 hands the gathered rows to the buffer actor asynchronously
   (:class:`~ncdlr.service.buffer_actor.BufferClient`).
5. Swapped prediction: ``L_u = ½ (mse(z_2, P^u, q_1) + mse(z_1, P^u, q_2))``; AdamW step; the LR schedule
   (linear warm-up, then cosine to ``min_lr``) advances per step.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import torch
import torch.distributed as dist

from ncdlr.buffer import LogitBuffer
from ncdlr.data.transforms import normalise_chw_torch
from ncdlr.methods import build_method
from ncdlr.models import NCDModel
from ncdlr.ot import AdaptiveSelfLabeler

from .config import Config

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


class Buffer(Protocol):
    def history_plus(self, step: int, rows: torch.Tensor) -> torch.Tensor: ...
    def commit(self, step: int, rows: torch.Tensor) -> None: ...


class LocalBuffer:
    """Single-process buffer: a plain :class:`~ncdlr.buffer.LogitBuffer` (no actor) on ``device``."""

    def __init__(self, capacity: int, num_clusters: int, device: torch.device | str | None = None):
        self.buffer = LogitBuffer(capacity, num_clusters, device)

    def history_plus(self, step: int, rows: torch.Tensor) -> torch.Tensor:
        return self.buffer.push(rows)

    def commit(self, step: int, rows: torch.Tensor) -> None:
        """Nothing to share: the local buffer already holds the rows."""

    def state_dict(self) -> dict:
        return self.buffer.state_dict()


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
    labeler: AdaptiveSelfLabeler
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    device: torch.device
    step: int = 0  # global steps done
    epoch: int = 0  # epochs done
    tau_history: list[float] = field(default_factory=list)
    forward: torch.nn.Module | None = None  # DDP wrapper of ``model`` when distributed, else None (use model)


def warmup_cosine(total_steps: int, warmup_steps: int, min_ratio: float):
    """LR multiplier: linear warm-up over ``warmup_steps`` then cosine from 1 to ``min_ratio`` at ``total_steps``."""

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return factor


def build_worker_state(cfg: Config, model: NCDModel, steps_per_epoch: int, device: torch.device,
                       fixed_prior: torch.Tensor | None = None) -> WorkerState:
    """AdamW over the trainable parameters, the LR schedule and the labeler for ``Ku`` clusters.

    ``fixed_prior`` ``[Ku]``: the true novel training counts, needed (only) by ``labeler.prior=fixed``
    (the oracle ablation; :func:`ncdlr.service.num_novel.fixed_prior_counts`).
    """
    model.to(device)
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise ValueError("the model has no trainable parameters (trainable_blocks=0 with a frozen head?)")
    opt = cfg.optim
    optimizer = torch.optim.AdamW(params, lr=opt.lr, weight_decay=opt.weight_decay)
    total = max(1, opt.epochs * steps_per_epoch)
    warm = max(1, int(round(opt.warmup_epochs * steps_per_epoch)))
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_cosine(total, warm, opt.min_lr / opt.lr))
    lab = cfg.labeler
    labeler = AdaptiveSelfLabeler(model.num_novel, prior=lab.prior, eps=lab.eps, n_iters=lab.n_iters,
                                  outer_steps=lab.outer_steps, gamma=lab.gamma, lr=lab.lr, momentum=lab.momentum,
                                  init_t=lab.init_t, fixed_prior=fixed_prior,
                                  max_imbalance=lab.max_imbalance or None).to(device)
    return WorkerState(model, labeler, optimizer, scheduler, device)


def _settle(device: torch.device) -> None:
    """Wait for queued GPU work, so that the phase timers below measure their own phase (no-op on CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def pseudo_labels(novel_scores: torch.Tensor, valid: torch.Tensor, labeler: AdaptiveSelfLabeler,
                  buffer: Buffer | None, step: int, rank: int) -> tuple[torch.Tensor, dict[str, float]]:
    """Soft pseudo-labels for this rank's novel rows, solved on the global problem.

    Args:
        novel_scores: ``[2, B, Ku]`` detached logits of this rank's two views.
        valid: ``[B]`` bool, decodable novel rows.
        buffer: the shared history (None → buffer off: solve on the gathered batch only).

    Returns:
        ``[2, B, Ku]`` soft labels (rows of invalid images are zeros) and phase times
        ``{"exchange": s, "ot": s}``.
    """
    views, b, ku = novel_scores.shape
    _settle(novel_scores.device)  # the forward pass is compute, not exchange: let it finish before timing
    t0 = time.perf_counter()
    mask = valid.to(novel_scores.device).float()[None, :, None].expand(views, b, 1)
    packed = torch.cat([novel_scores.float(), mask], dim=2)
    gathered = all_gather_rows(packed)  # [W, 2, B, Ku+1]
    world = gathered.shape[0]
    rows = gathered.transpose(0, 1).reshape(views * world * b, ku + 1)  # [view1 of all ranks; view2 ...]
    keep = rows[:, ku] > 0.5
    new_rows = rows[keep, :ku]  # stays on the device, like the buffer replica
    problem = buffer.history_plus(step, new_rows) if buffer is not None else new_rows
    _settle(novel_scores.device)
    t1 = time.perf_counter()
    labels = labeler(problem.to(novel_scores.device), last=new_rows.shape[0])
    t2 = time.perf_counter()
    if buffer is not None:
        buffer.commit(step, new_rows)
    position = torch.full((rows.shape[0],), -1, dtype=torch.long)
    position[keep.cpu()] = torch.arange(new_rows.shape[0])
    mine = position.view(views, world, b)[:, rank]  # [2, B]
    out = torch.zeros(views, b, ku, device=labels.device)
    ok = mine >= 0
    out[ok] = labels[mine[ok].to(labels.device)]
    t3 = time.perf_counter()
    return out, {"exchange": (t1 - t0) + (t3 - t2), "ot": t2 - t1}


def train_step(state: WorkerState, batch: PairedBatch, cfg: Config, buffer: Buffer | None, rank: int = 0
               ) -> dict[str, float]:
    """One optimisation step on this rank (collective: every rank must call it). Returns scalar stats."""
    model, device = state.model, state.device
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
    use_amp = cfg.optim.amp and device.type == "cuda"
    with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=use_amp):
        z = (state.forward or model)(x).float()
    zk1, zk2, zn1, zn2 = z.split(b)
    labels = batch.known_labels.to(device)
    method = build_method(cfg)  # ncdlr.methods: the faithful ncdlr (default) or a baseline/ablation
    if known_valid.any():
        loss_s = method.known_loss(model, zk1[known_valid], zk2[known_valid], labels[known_valid])
    else:
        loss_s = z.sum() * 0.0
    q, times = method.novel_targets(model, zn1, zn2, novel_valid, state, buffer, rank)
    if novel_valid.any():
        loss_u = method.novel_loss(model, zn1, zn2, q, novel_valid)
    else:
        loss_u = z.sum() * 0.0
    loss = loss_s + cfg.optim.alpha * loss_u
    state.optimizer.zero_grad(set_to_none=True)
    loss.backward()
    state.optimizer.step()
    state.scheduler.step()
    state.step += 1
    stats = {
        "loss": loss.item(), "loss_s": loss_s.item(), "loss_u": loss_u.item(),
        "tau": state.labeler.imbalance_factor,
        "bad_images": float((~batch.known_valid).sum() + (~batch.novel_valid).sum()),
        "exchange_s": times["exchange"], "ot_s": times["ot"],
    }
    return stats


def run_epoch(state: WorkerState, batches: Iterable[PairedBatch], cfg: Config, buffer: Buffer | None, rank: int = 0,
              on_step=None) -> dict[str, float]:
    """Train over ``batches``; return epoch means of the step stats, phase shares and ``steps_per_s``."""
    times = StepTimes()
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
        stats = train_step(state, batch, cfg, buffer, rank)
        t2 = time.perf_counter()
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
    out = {k: v / max(steps, 1) for k, v in sums.items() if k != "bad_images"}
    out["bad_images"] = sums.get("bad_images", 0.0)
    out.update(times.shares())
    out.update({"steps": float(steps), "steps_per_s": steps / max(elapsed, 1e-9), "epoch": float(state.epoch),
                "tau": state.labeler.imbalance_factor, "lr": state.scheduler.get_last_lr()[0]})
    return out


# -- feature-table mode: in-memory, deterministic per (seed, epoch, step, rank) --------------------------------

@dataclass
class FeatureSplits:
    """Feature-table splits as tensors: ``features[split] [n, D]`` float32, ``labels[split] [n]`` int64."""

    features: dict[str, torch.Tensor]
    labels: dict[str, torch.Tensor]
    num_known: int
    num_novel: int
    class_names: list[str]

    @property
    def dim(self) -> int:
        return next(iter(self.features.values())).shape[1]

    def train_counts(self) -> list[int]:
        counts = np.zeros(self.num_known + self.num_novel, dtype=np.int64)
        for split in ("known", "novel"):
            if split in self.labels:
                counts += np.bincount(self.labels[split].numpy(), minlength=len(counts))
        return counts.tolist()


def steps_per_epoch(num_novel_rows: int, batch_size: int, world: int, max_steps: int = 0) -> int:
    """Global steps per epoch: full batches of ``W·B`` novel rows (drop-last), capped by ``max_steps``."""
    steps = num_novel_rows // (batch_size * world)
    if steps == 0:
        raise ValueError(f"novel split has {num_novel_rows} rows, fewer than one global batch of "
                         f"{world} workers × {batch_size}; lower data.batch_size")
    return min(steps, max_steps) if max_steps > 0 else steps


def feature_batches(splits: FeatureSplits, cfg: Config, epoch: int, rank: int, world: int) -> Iterator[PairedBatch]:
    """Paired batches for ``rank``: a seeded permutation of the novel rows (known rows cycled), ``B`` each.

    Global batch ``s`` is rows ``[s·W·B, (s+1)·W·B)`` of the epoch's permutation; rank ``r`` takes its
    ``r``-th block of ``B``, so the concatenation over ranks is the single-process batch of size ``W·B``.
    The two views add Gaussian noise of std ``data.feature_noise`` (seeded per step and rank).
    """
    b = cfg.data.batch_size
    known_x, known_y = splits.features["known"], splits.labels["known"]
    novel_x, novel_y = splits.features["novel"], splits.labels["novel"]
    steps = steps_per_epoch(novel_x.shape[0], b, world, cfg.data.max_steps_per_epoch)
    gen = torch.Generator().manual_seed(cfg.run.seed * 100003 + epoch)
    novel_order = torch.randperm(novel_x.shape[0], generator=gen)
    need = steps * world * b
    known_order = torch.cat([torch.randperm(known_x.shape[0], generator=gen)
                             for _ in range(-(-need // known_x.shape[0]))])
    noise = cfg.data.feature_noise
    for s in range(steps):
        lo = (s * world + rank) * b
        ki, ni = known_order[lo:lo + b], novel_order[lo:lo + b]
        view_gen = torch.Generator().manual_seed(((cfg.run.seed * 1009 + epoch) * 100003 + s) * 131 + rank)

        def views(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            if noise <= 0:
                return x, x
            return (x + noise * torch.randn(x.shape, generator=view_gen),
                    x + noise * torch.randn(x.shape, generator=view_gen))

        k1, k2 = views(known_x[ki])
        n1, n2 = views(novel_x[ni])
        yield PairedBatch(k1, k2, known_y[ki], torch.ones(b, dtype=torch.bool), n1, n2,
                          torch.ones(b, dtype=torch.bool))


@torch.no_grad()
def predict(model: NCDModel, inputs: Iterable[torch.Tensor], device: torch.device) -> np.ndarray:
    """``argmax_k z·p_k`` over all K classes for each batch of inputs; ``[N]`` int64."""
    model.eval()
    out = [model.logits(model(x.to(device)).float()).argmax(1).cpu() for x in inputs]
    return torch.cat(out).numpy() if out else np.zeros(0, dtype=np.int64)
