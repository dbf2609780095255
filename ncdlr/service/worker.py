"""The function every Ray Train worker runs: build once, restore, train epoch by epoch, checkpoint.

Each worker builds its model, its method (with the labeler, :func:`ncdlr.methods.build_method`) and its
optimiser once, restores the latest checkpoint (after a worker restart Ray hands it back; ``run.resume``
names one from an earlier run) and re-seeds the shared buffer actor from it, wires the method's distributed
parts (buffer replica, ``all_gather``, rank) once, then trains. Each epoch's line goes to the driver's console
board; ``ray.train.report`` — rank 0 with a checkpoint, the others with their metrics — happens on the
:class:`CheckpointSchedule`: after the first epoch that ends ``run.checkpoint_every_s`` seconds after the last
checkpoint (0: every epoch) and after the last epoch (``Result.metrics`` needs it). A report waits for Ray
Train's controller to poll the workers (every 2 s by default), which on short epochs cost more than the
training; the checkpoint is uploaded in the background (``run.checkpoint_upload = async``).
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import torch

from ncdlr.data.features import FeatureSplits, first_view

from .config import Config
from .console import EpochLog
from .run_data import DatasetSummary, init_head
from .train_loop import PairedBatch, WorkerState

# ---- the worker's parts ------------------------------------------------------------------------------------


def build_state(cfg: Config, summary: DatasetSummary, steps: int, device: torch.device, world: int,
                features: FeatureSplits | None = None) -> WorkerState:
    """Model, method (with its labeler) and optimiser, built once; DDP-wrapped when ``world > 1``. With
    ``model.head_init imprint`` the head is fitted on ``features`` first (every rank fits the same head from the
    same rows and seed; DDP also broadcasts rank 0's)."""
    from ncdlr.methods import build_method
    from ncdlr.models import build_model

    from .num_novel import fixed_prior_counts, model_num_novel
    from .train_loop import build_worker_state, compile_forward

    num_novel = model_num_novel(cfg, summary)  # model.num_novel (resolved by fit) or the data's Ku
    model = build_model(cfg.model, summary.num_known, num_novel, image_size=cfg.data.image_size)
    if features is not None:
        init_head(cfg, model, features)
    method = build_method(cfg.method, cfg.labeler, num_novel, fixed_prior=fixed_prior_counts(cfg, summary),
                          heads=cfg.model.heads, known_counts=summary.train_counts[:summary.num_known])
    state = build_worker_state(cfg.optim, model, method, steps, device, seed=cfg.run.seed,
                               relax_after_epochs=cfg.labeler.relax_after_epochs)
    if world > 1:
        from torch.nn.parallel import DistributedDataParallel

        state.forward = DistributedDataParallel(state.model, device_ids=[device.index] if device.type == "cuda" else None)
    compile_forward(state, cfg.optim)
    return state


def restore(state: WorkerState, cfg: Config, rank: int) -> dict | None:
    """Load Ray's checkpoint (worker restart) or ``run.resume`` into ``state``; return the buffer state saved."""
    import ray.train

    from .checkpoint import load_checkpoint, restore_state

    checkpoint = ray.train.get_checkpoint()
    payload = None
    if checkpoint is not None:
        with checkpoint.as_directory() as directory:
            payload = load_checkpoint(directory)
    elif cfg.run.resume:
        payload = load_checkpoint(cfg.run.resume)
    return restore_state(state, payload, rank) if payload is not None else None


def connect(state: WorkerState, cfg: Config, actor, buffer_state: dict | None, rank: int, world: int):
    """Wire the method's distributed parts once: this rank's buffer replica (re-seeded from ``buffer_state``
    through the shared actor), the ranks' ``all_gather`` and the rank. Returns the buffer client or None.

    Rank 0 restores the actor on every (re)start, which also revives an actor Ray restarted empty after it
    died (:class:`~ncdlr.service.buffer_actor.BufferLostError`): the run goes on from the checkpoint's buffer."""
    import ray
    import torch.distributed as dist

    from ncdlr.methods import buffer_width

    from .buffer_actor import BufferClient
    from .train_loop import all_gather_rows

    client = None
    if actor is not None and state.method.uses_buffer:
        last = max(state.discovery_step, 0) - 1  # the buffer's clock counts self-labeling steps only
        if rank == 0:
            ray.get(actor.restore.remote(last, buffer_state))
        if world > 1:
            dist.barrier()
        client = BufferClient(actor, cfg.labeler.buffer_size,
                              buffer_width(state.model.num_novel, state.model.num_heads), rank, state.device)
        client.start(last)
    state.method.connect(buffer=client, gather=all_gather_rows, rank=rank)
    return client


def epoch_batches(cfg: Config, features: FeatureSplits | None, rank: int, world: int, device: torch.device,
                  steps: int) -> Callable[[int], Iterable[PairedBatch]]:
    """``epoch → batches`` of this rank: seeded in-memory batches of the feature splits, or the Ray Data shards.

    Image streams by ``data.decode_on``: ``device`` decodes and augments the encoded images on ``device`` in
    Ray's prefetch threads (``hybrid``: crops the images the read tasks decoded); ``host`` streams carry the
    crops, which on a GPU cross to the device as uint8 and are normalised there, on a CPU in Ray's prefetch
    threads. The streams start here (``PairedBatches.start``).
    An epoch is ``steps`` steps of the cycling streams (each Ray Data execution holds ``data.epochs_per_execution``
    epochs; with 1 that is exactly one pass over this rank's share of the novel rows, as before)."""
    from .train_loop import feature_batches

    if features is not None:
        return lambda epoch: feature_batches(features, cfg.data, cfg.run.seed, epoch, rank, world)
    import ray.train

    from ncdlr.data.pipeline import PairedBatches

    from .run_data import pipeline_config

    pipe = pipeline_config(cfg)
    on_device = pipe.decode_on in ("device", "hybrid")
    paired = PairedBatches(ray.train.get_dataset_shard("known"), ray.train.get_dataset_shard("novel"),
                           batch_size=cfg.data.batch_size, normalise=device.type != "cuda",
                           device_views=pipe.device_views() if on_device else None,
                           device=device if on_device else None, steps_per_epoch=steps)
    paired.start()  # Ray Data starts up while the caller builds the model
    return lambda epoch: image_batches(paired, cfg.data.batch_size)


def _pad_side(side: dict, batch_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``view1, view2, label, valid`` padded back to ``batch_size`` rows (dropped bad images → valid=False).

    ``all_gather`` needs the same shape on every rank, so the rows the pipeline dropped are re-added as
    zeros and masked out of the losses and the OT problem.
    """
    n = side["view1"].shape[0]
    pad = batch_size - n
    v1, v2 = side["view1"], side["view2"]
    label = side["label"].long()
    valid = torch.ones(batch_size, dtype=torch.bool)
    if pad > 0:
        v1 = torch.cat([v1, v1.new_zeros((pad, *v1.shape[1:]))])
        v2 = torch.cat([v2, v2.new_zeros((pad, *v2.shape[1:]))])
        label = torch.cat([label, label.new_zeros(pad)])
        valid[n:] = False
    return v1, v2, label, valid


def image_batches(paired, batch_size: int):
    """One epoch of :class:`~ncdlr.data.pipeline.PairedBatches` as fixed-shape :class:`PairedBatch`es (uint8
    views, from ``PairedBatches(normalise=False)``, carry their ``scaling`` for ``train_step``)."""
    from ncdlr.data.transforms import batch_scaling

    for step in paired:
        k1, k2, ky, kv = _pad_side(step["known"], batch_size)
        n1, n2, _, nv = _pad_side(step["novel"], batch_size)
        scaling = None
        if "scaling" in step["known"] or "scaling" in step["novel"]:
            scaling = batch_scaling([*step["known"].get("scaling", []), *step["novel"].get("scaling", [])])
        yield PairedBatch(k1, k2, ky, kv, n1, n2, nv, scaling)


def validate(state: WorkerState, splits: FeatureSplits) -> dict[str, float]:
    """Cluster accuracy on the feature table's ``val`` split (never ``test``): ``val_all/known/novel``, of the model
    the run will export (the weights' moving average with ``optim.average_epochs``)."""
    from ncdlr.metrics import cluster_accuracy

    from .train_loop import predict

    pred = predict(state.averaged_model(), (first_view(x) for x in splits.features["val"].split(1024)), state.device)
    scores = cluster_accuracy(splits.labels["val"].numpy(), pred, splits.num_known)
    return {f"val_{key}": float(scores[key]) for key in ("all", "known", "novel")}


def gather_epoch_stats(state: WorkerState, metrics: dict[str, float], world: int, checkpoint_due: bool
                       ) -> tuple[list, bool]:
    """Sum ``bad_images`` over ranks and check ``τ`` agrees on all ranks; return every rank's RNG state and rank
    0's ``checkpoint_due`` (so every rank reports, or skips the report, at the same epochs)."""
    import torch.distributed as dist

    from .checkpoint import rng_state

    if world == 1:
        return [rng_state()], checkpoint_due
    bad = torch.tensor([metrics["bad_images"]], dtype=torch.float64)
    dist.all_reduce(bad)
    metrics["bad_images"] = float(bad)
    gathered: list = [None] * world
    dist.all_gather_object(gathered, (rng_state(), state.method.imbalance_factor, checkpoint_due))
    taus = [tau for _, tau, _ in gathered]
    metrics["tau_rank_spread"] = max(taus) - min(taus)  # 0: every rank solved the same problem
    return [rng for rng, _, _ in gathered], bool(gathered[0][2])


@dataclass
class CheckpointSchedule:
    """When rank 0 checkpoints: at the end of an epoch once ``every_s`` seconds have passed since the last
    checkpoint (``every_s = 0``: every epoch), and always after the last epoch (``run.checkpoint_every_s``)."""

    every_s: float
    last_epoch: int
    since: float = field(default_factory=time.monotonic)

    def due(self, epoch: int) -> bool:
        """Whether the epoch just finished (``epoch`` epochs done) ends with a checkpoint; restarts the clock if so."""
        now = time.monotonic()
        if epoch >= self.last_epoch or now - self.since >= self.every_s:
            self.since = now
            return True
        return False


def checkpoint_and_report(state: WorkerState, cfg: Config, metrics: dict[str, float], rngs: list, client, actor,
                          rank: int) -> None:
    """Rank 0: check its buffer replica equals the actor's, write the checkpoint and report it (uploaded in the
    background with ``run.checkpoint_upload = async``); others: report the metrics."""
    import ray
    import ray.train
    from ray.train import Checkpoint, CheckpointUploadMode

    from .checkpoint import save_state

    if rank != 0:
        ray.train.report(metrics)
        return
    buffer = None
    if client is not None:  # the actor is the source of truth; the replica must equal it
        client.flush()
        buffer = ray.get(actor.snapshot.remote(client.step))[1]
        if not torch.equal(buffer["rows"], client.state_dict()["rows"]):  # both on the host
            raise RuntimeError(f"buffer replica of rank 0 differs from the buffer actor at step {client.step}")
    tmp = tempfile.mkdtemp(prefix="ncdlr-checkpoint-")  # Ray deletes it once uploaded
    save_state(tmp, state, buffer=buffer, rng=rngs, config=cfg.to_dict(), metrics=metrics)
    mode = CheckpointUploadMode.ASYNC if cfg.run.checkpoint_upload == "async" else CheckpointUploadMode.SYNC
    ray.train.report(metrics, checkpoint=Checkpoint.from_directory(tmp), checkpoint_upload_mode=mode,
                     delete_local_checkpoint_after_upload=True)


# ---- the worker ----------------------------------------------------------------------------------------------


def train_worker(config: dict) -> None:
    """Ray Train per-worker entry.

    ``config``: ``cfg`` (the :class:`Config`), ``summary`` (:class:`DatasetSummary`), ``features`` (an object
    ref of the :class:`FeatureSplits`, or None in image mode), ``actor``/``namespace`` (the buffer actor's name,
    or None), ``env`` (the driver's ``AWS_*`` variables), ``console`` (the name of the driver's
    :class:`~ncdlr.service.console.ConsoleBoard`, or None: lines go to this process's stdout).
    """
    import ray
    import ray.train
    import ray.train.torch

    from .train_loop import epoch_max_steps, run_epoch, steps_per_epoch

    os.environ.update(config.get("env", {}))  # S3 endpoint/credentials of the driver
    cfg: Config = config["cfg"]
    summary: DatasetSummary = config["summary"]
    features: FeatureSplits | None = ray.get(config["features"]) if config.get("features") is not None else None
    context = ray.train.get_context()
    rank, world = context.get_world_rank(), context.get_world_size()
    device = ray.train.torch.get_device()
    torch.manual_seed(cfg.run.seed)
    if device.type == "cpu":
        torch.set_num_threads(max(1, int(cfg.run.cpus_per_worker)))

    # ---- building, once ---------------------------------------------------------------------------------------
    max_steps = epoch_max_steps(cfg.data, features is not None)  # image streams run whole epochs
    steps = steps_per_epoch(summary.novel_rows, cfg.data.batch_size, world, max_steps)
    batches = epoch_batches(cfg, features, rank, world, device, steps)  # image streams start now, beside the build
    state = build_state(cfg, summary, steps, device, world, features)
    buffer_state = restore(state, cfg, rank)
    actor = ray.get_actor(config["actor"], namespace=config["namespace"]) if config.get("actor") else None
    client = connect(state, cfg, actor, buffer_state, rank, world)
    log = EpochLog(cfg, rank, steps, board=config.get("console"))
    log.start(state, world)
    schedule = CheckpointSchedule(cfg.run.checkpoint_every_s, cfg.optim.epochs)

    # ---- training ---------------------------------------------------------------------------------------------
    try:
        while state.epoch < cfg.optim.epochs:
            start = time.perf_counter()
            metrics = run_epoch(state, batches(state.epoch), cfg.optim, on_step=log.step)
            if client is not None:
                metrics["actor_wait_s_per_step"] = client.times.wait / max(client.times.steps, 1)
            rngs, due = gather_epoch_stats(state, metrics, world, schedule.due(state.epoch))
            metrics["epoch_s"] = time.perf_counter() - start
            if rank == 0 and features is not None and "val" in features.features:
                metrics.update(validate(state, features))
            log.epoch(state, metrics)  # the epoch's line reaches the driver's console either way
            if due:  # a report waits for Ray Train's controller to poll (up to 2 s): only with a checkpoint
                checkpoint_and_report(state, cfg, metrics, rngs, client, actor, rank)
    finally:
        if client is not None:  # every checkpoint flushed it; after a failure the buffer actor may be dead
            client.close(flush=False)
        log.close()
