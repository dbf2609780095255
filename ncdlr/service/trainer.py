"""Ray Train glue: the ``TorchTrainer`` around :mod:`ncdlr.service.train_loop`, and the worker function it runs.

Driver side (:func:`fit`): resolve the data (feature table or prepared image dataset), create the named
:class:`~ncdlr.service.buffer_actor.BufferActor`, build ``TorchTrainer`` with ``ScalingConfig`` (workers,
GPU auto-detected, fractional CPUs so Ray Data read tasks still get a CPU), ``RunConfig`` (local or s3://
storage, ``CheckpointConfig``, ``FailureConfig``), run it, and evaluate the final checkpoint.

Worker side (:func:`train_worker`): build model/optimiser/labeler, restore the latest checkpoint (after a
worker restart Ray hands it back; ``run.resume`` names one from an earlier run) and re-seed the buffer
actor from it, then train epoch by epoch. Rank 0 checkpoints and reports once per epoch (platform note:
``ray.train.report`` is slow, and ``Result.metrics`` needs a checkpoint).
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import torch

from .config import Config, from_dict, save_config

log = logging.getLogger(__name__)


@dataclass
class DatasetSummary:
    """What the driver needs to know about the data before training."""

    num_known: int
    num_novel: int
    feature_dim: int  # 0 for image datasets
    novel_rows: int
    class_names: list[str]
    train_counts: list[int]


def summarize_data(cfg: Config) -> DatasetSummary:
    """Read the feature table's metadata or the dataset manifest; errors name the URI."""
    if cfg.data.features:
        from .embed import read_feature_table

        splits = read_feature_table(cfg.data.features)
        return DatasetSummary(splits.num_known, splits.num_novel, splits.dim, splits.features["novel"].shape[0],
                              splits.class_names, splits.train_counts())
    if not cfg.data.uri:
        raise ValueError("no training data: set data.uri (prepared image dataset) or data.features (feature table)")
    from ncdlr.data.manifest import read_manifest

    manifest = read_manifest(cfg.data.uri, endpoint_url=cfg.data.endpoint_url or None)
    return DatasetSummary(manifest.num_known, manifest.num_novel, 0, manifest.split_counts.get("novel", 0),
                          manifest.class_names, manifest.train_counts)


def resolve_use_gpu(setting: str) -> bool:
    """``"auto"`` → True when the Ray cluster (or this machine) has a GPU."""
    if setting in ("true", "false"):
        return setting == "true"
    import ray

    if ray.is_initialized():
        return ray.cluster_resources().get("GPU", 0) > 0
    return torch.cuda.is_available()


def validate(state, splits) -> dict[str, float]:
    """Cluster accuracy on the feature table's ``val`` split (never ``test``): ``val_all/known/novel``."""
    from ncdlr.metrics import cluster_accuracy

    from .train_loop import predict

    pred = predict(state.model, splits.features["val"].split(1024), state.device)
    scores = cluster_accuracy(splits.labels["val"].numpy(), pred, splits.num_known)
    return {f"val_{key}": float(scores[key]) for key in ("all", "known", "novel")}


# -- worker side ------------------------------------------------------------------------------------------

def _rank_and_world() -> tuple[int, int]:
    import ray.train

    ctx = ray.train.get_context()
    return ctx.get_world_rank(), ctx.get_world_size()


def pipeline_config(cfg: Config, *, eval_mode: bool = False):
    """The data plane's :class:`~ncdlr.data.pipeline.PipelineConfig` for this run's encoder and sizes."""
    from ncdlr.data import pipeline
    from ncdlr.models import input_scaling

    return pipeline.PipelineConfig(image_size=cfg.data.image_size, crop_scale=(cfg.data.crop_scale_min, 1.0),
                                   scaling=input_scaling(cfg.model.encoder),
                                   batch_size=cfg.data.eval_batch_size if eval_mode else cfg.data.batch_size)


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


def _image_batches(paired, batch_size: int):
    """One epoch of :class:`~ncdlr.data.pipeline.PairedBatches` as fixed-shape :class:`PairedBatch`es (uint8
    views, from ``PairedBatches(normalise=False)``, carry their ``scaling`` for ``train_step``)."""
    from ncdlr.data.transforms import batch_scaling

    from .train_loop import PairedBatch

    for step in paired:
        k1, k2, ky, kv = _pad_side(step["known"], batch_size)
        n1, n2, _, nv = _pad_side(step["novel"], batch_size)
        scaling = None
        if "scaling" in step["known"] or "scaling" in step["novel"]:
            scaling = batch_scaling([*step["known"].get("scaling", []), *step["novel"].get("scaling", [])])
        yield PairedBatch(k1, k2, ky, kv, n1, n2, nv, scaling)


def progress(line: str) -> None:
    """Print a progress line once to the job log from a Ray Train worker.

    Ray Train V2 patches ``print`` in workers: when the worker's ``sys.stdout`` is wrapped (it is in Ray
    worker processes) the patched print writes the line to stdout *and* logs it through the root logger,
    whose console handler writes it to stderr — the job log showed every line twice. Writing to the
    process's own stdout (``sys.__stdout__``, which Ray streams to the driver) bypasses the patch.
    """
    print(line, file=sys.__stdout__, flush=True)


def train_worker(config: dict) -> None:
    """Ray Train per-worker entry: ``config = {"cfg": Config.to_dict(), "actor": name, "namespace": ns, "summary": {...}}``."""
    import ray
    import ray.train
    import ray.train.torch
    import torch.distributed as dist
    from ray.train import Checkpoint

    from ncdlr.models import build_model

    from .buffer_actor import BufferClient
    from .checkpoint import load_checkpoint, restore_state, rng_state, save_state
    from .num_novel import fixed_prior_counts, model_num_novel
    from .train_loop import build_worker_state, feature_batches, run_epoch, steps_per_epoch

    os.environ.update(config.get("env", {}))  # S3 endpoint/credentials of the driver
    cfg = from_dict(config["cfg"])
    summary = DatasetSummary(**config["summary"])
    rank, world = _rank_and_world()
    device = ray.train.torch.get_device()
    torch.manual_seed(cfg.run.seed)
    if device.type == "cpu":
        torch.set_num_threads(max(1, int(cfg.run.cpus_per_worker)))

    # ---- data -----------------------------------------------------------------------------------------
    splits = None
    if cfg.data.features:
        from .embed import read_feature_table

        splits = read_feature_table(cfg.data.features)
        cfg.model.feature_dim = splits.dim
    max_steps = cfg.data.max_steps_per_epoch if splits is not None else 0  # image streams run whole epochs
    steps = steps_per_epoch(summary.novel_rows, cfg.data.batch_size, world, max_steps)

    # ---- model, optimiser, labeler, restore ------------------------------------------------------------
    num_novel = model_num_novel(cfg, summary)  # model.num_novel (resolved by fit) or the data's Ku
    model = build_model(cfg.model, summary.num_known, num_novel, image_size=cfg.data.image_size)
    state = build_worker_state(cfg, model, steps, device, fixed_prior=fixed_prior_counts(cfg, summary))
    if world > 1:
        from torch.nn.parallel import DistributedDataParallel

        ddp = DistributedDataParallel(state.model, device_ids=[device.index] if device.type == "cuda" else None)
        state.forward = ddp
    checkpoint = ray.train.get_checkpoint()
    payload = None
    if checkpoint is not None:
        with checkpoint.as_directory() as directory:
            payload = load_checkpoint(directory)
    elif cfg.run.resume:
        payload = load_checkpoint(cfg.run.resume)
    buffer_state = restore_state(state, payload, rank) if payload is not None else None

    actor = ray.get_actor(config["actor"], namespace=config["namespace"]) if cfg.labeler.use_buffer else None
    client = None
    if actor is not None:
        if rank == 0:
            ray.get(actor.restore.remote(state.step - 1, buffer_state))
        if world > 1:
            dist.barrier()
        client = BufferClient(actor, cfg.labeler.buffer_size, num_novel, rank, device)
        client.start(state.step - 1)

    writer = None
    if rank == 0:
        from torch.utils.tensorboard import SummaryWriter

        writer = SummaryWriter(os.path.join(cfg.run.output, "tensorboard"))

    def on_step(st, stats):
        if writer is not None:
            writer.add_scalar("train/loss", stats["loss"], st.step)
            writer.add_scalar("train/tau", stats["tau"], st.step)
        if rank == 0 and cfg.run.log_every and st.step % cfg.run.log_every == 0:
            progress(f"[ncdlr] epoch {st.epoch + 1}/{cfg.optim.epochs} step {st.step} loss {stats['loss']:.4f} "
                     f"L_s {stats['loss_s']:.4f} L_u {stats['loss_u']:.4f} tau {stats['tau']:.3f}")

    # ---- training ---------------------------------------------------------------------------------------
    paired = None
    if splits is None:
        from ncdlr.data.pipeline import PairedBatches

        # On a GPU the views cross to the device as uint8 and are normalised there (4x fewer bytes through
        # host memory and the PCIe copy); on a CPU they are normalised in Ray's prefetch threads, beside the step.
        paired = PairedBatches(ray.train.get_dataset_shard("known"), ray.train.get_dataset_shard("novel"),
                               batch_size=cfg.data.batch_size, normalise=device.type != "cuda")
    while state.epoch < cfg.optim.epochs:
        epoch = state.epoch
        if splits is not None:
            batches = feature_batches(splits, cfg, epoch, rank, world)
        else:
            batches = _image_batches(paired, cfg.data.batch_size)
        start = time.perf_counter()
        metrics = run_epoch(state, batches, cfg, client, rank, on_step=on_step)
        if client is not None:
            metrics["actor_wait_s_per_step"] = client.times.wait / max(client.times.steps, 1)
        if world > 1:
            bad = torch.tensor([metrics["bad_images"]], dtype=torch.float64)
            dist.all_reduce(bad)
            metrics["bad_images"] = float(bad)
            rngs: list = [None] * world
            dist.all_gather_object(rngs, rng_state())
            taus: list = [None] * world
            dist.all_gather_object(taus, state.labeler.imbalance_factor)
            metrics["tau_rank_spread"] = max(taus) - min(taus)  # 0: every rank solved the same problem
        else:
            rngs = [rng_state()]
        metrics["epoch_s"] = time.perf_counter() - start
        if rank == 0:
            if splits is not None and "val" in splits.features:
                metrics.update(validate(state, splits))
            progress(f"[ncdlr] epoch {state.epoch}/{cfg.optim.epochs} done in {metrics['epoch_s']:.1f}s: loss "
                     f"{metrics['loss']:.4f} tau {metrics['tau']:.3f} bad_images {int(metrics['bad_images'])} "
                     f"({metrics['steps_per_s']:.2f} steps/s)"
                     + (f" val novel {metrics['val_novel']:.3f}" if "val_novel" in metrics else ""))
        if writer is not None:
            for key in ("loss", "loss_s", "loss_u", "tau", "lr", "bad_images", "steps_per_s"):
                writer.add_scalar(f"epoch/{key}", metrics[key], state.epoch)
            writer.flush()
        if rank == 0:
            buffer = None
            if client is not None:  # the actor is the source of truth; the replica must equal it
                client.flush()
                buffer = ray.get(actor.snapshot.remote(client.step))[1]
                if not torch.equal(buffer["rows"], client.state_dict()["rows"]):  # both on the host
                    raise RuntimeError(f"buffer replica of rank 0 differs from the buffer actor at step {client.step}")
            with tempfile.TemporaryDirectory() as tmp:
                save_state(tmp, state, buffer=buffer, rng=rngs, config=cfg.to_dict(), metrics=metrics)
                ray.train.report(metrics, checkpoint=Checkpoint.from_directory(tmp))
        else:
            ray.train.report(metrics)
    if client is not None:
        client.close()
    if writer is not None:
        writer.close()


# -- driver side -------------------------------------------------------------------------------------------

def _storage_path(cfg: Config) -> str:
    if cfg.run.storage_path:
        return cfg.run.storage_path
    return str(Path(cfg.run.output, "ray").resolve())


def _run_storage(cfg: Config) -> dict:
    """``RunConfig`` storage arguments: on ``s3://`` our own filesystem that writes no directory markers
    (:class:`ncdlr.data.storage.ImplicitDirsS3Handler`; the rclone S3 server refuses nested ones)."""
    from ncdlr.data.storage import is_s3, run_storage_filesystem

    path = _storage_path(cfg)
    if not is_s3(path):
        return {"storage_path": path}
    fs, fs_path = run_storage_filesystem(path, cfg.data.endpoint_url or None)
    return {"storage_path": fs_path, "storage_filesystem": fs}


def _datasets(cfg: Config) -> dict:
    """``datasets`` + ``dataset_config`` for image mode (two-view known/novel streams split over workers)."""
    if cfg.data.features:
        return {}
    from ncdlr.data import pipeline

    pipe = pipeline_config(cfg)
    raw = pipeline.load_splits(cfg.data.uri, ["known", "novel"], endpoint_url=cfg.data.endpoint_url or None)
    return {"datasets": {name: pipeline.with_train_views(ds, pipe) for name, ds in raw.items()},
            "dataset_config": pipeline.train_data_config(pipe)}


def run_torch_trainer(cfg: Config, summary, train_fn, *, actor_name: str, num_novel: int, scaling_config,
                      run_config, extra_loop_config: dict | None = None, **trainer_kwargs):
    """Run ``TorchTrainer(train_fn)`` next to a fresh shared buffer actor; return the Ray Train ``Result``.

    The workers get the standard loop config (``cfg``, the actor's name and namespace, the data ``summary``,
    the driver's ``AWS_*`` variables) plus ``extra_loop_config``. The actor is released however the run ends,
    and a failed run raises its error.
    """
    import ray
    from ray.train.torch import TorchTrainer

    from .buffer_actor import get_or_create_buffer_actor

    namespace = "ncdlr"
    actor = get_or_create_buffer_actor(actor_name, cfg.labeler.buffer_size, num_novel, namespace)
    trainer = TorchTrainer(
        train_fn,
        train_loop_config={"cfg": cfg.to_dict(), "actor": actor_name, "namespace": namespace,
                           "summary": summary.__dict__,
                           "env": {k: v for k, v in os.environ.items() if k.startswith("AWS_")},
                           **(extra_loop_config or {})},
        scaling_config=scaling_config,
        run_config=run_config,
        **trainer_kwargs,
    )
    try:
        result = trainer.fit()
    finally:
        ray.kill(actor)
    if result.error:
        raise result.error
    return result


def fit(cfg: Config) -> dict:
    """Train with Ray Train and (if ``run.evaluate``) evaluate + write the report. Returns a summary dict.

    Keys: ``output`` (run dir), ``checkpoint`` (path/URI of the final checkpoint), ``metrics`` (last
    epoch's training metrics), ``test`` (evaluation metrics, when evaluated), ``seconds``.
    """
    import ray
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig

    from .num_novel import fixed_prior_counts, model_num_novel, resolve_num_novel

    start = time.perf_counter()
    output = Path(cfg.run.output).resolve()
    cfg.run.output = str(output)
    output.mkdir(parents=True, exist_ok=True)
    summary = summarize_data(cfg)
    if cfg.data.features:
        cfg.model.feature_dim = summary.feature_dim
    save_config(cfg, output / "config.yaml")
    if not ray.is_initialized():
        if os.environ.get("RAY_ADDRESS"):  # `ray job submit` / a running cluster
            ray.init(address=os.environ["RAY_ADDRESS"], log_to_driver=True)
        else:  # a local Ray: more logical CPUs than the workers take, or Ray Data tasks starve (platform notes)
            need = cfg.run.num_workers * cfg.run.cpus_per_worker + 2
            ray.init(num_cpus=int(max(os.cpu_count() or 1, need)), log_to_driver=True)
    use_gpu = resolve_use_gpu(cfg.run.use_gpu)
    if resolve_num_novel(cfg, summary, output) is not None:  # model.num_novel=auto → the estimate, saved
        save_config(cfg, output / "config.yaml")
    fixed_prior_counts(cfg, summary)  # refuse prior=fixed with a Ku other than the data's before Ray Train starts
    result = run_torch_trainer(
        cfg, summary, train_worker,
        actor_name=f"buffer-{cfg.run.name}-{uuid.uuid4().hex[:8]}",
        num_novel=model_num_novel(cfg, summary),
        scaling_config=ScalingConfig(num_workers=cfg.run.num_workers, use_gpu=use_gpu,
                                     resources_per_worker={"CPU": cfg.run.cpus_per_worker, **({"GPU": 1} if use_gpu else {})}),
        run_config=RunConfig(name=f"{cfg.run.name}-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:4]}",
                             **_run_storage(cfg),
                             checkpoint_config=CheckpointConfig(num_to_keep=cfg.run.checkpoints_to_keep),
                             failure_config=FailureConfig(max_failures=cfg.run.max_failures)),
        **_datasets(cfg),
    )
    checkpoint_path = ""
    if result.checkpoint is not None:  # an s3 checkpoint's path has no scheme: restore it
        checkpoint_path = ("s3://" + result.checkpoint.path.lstrip("/") if _storage_path(cfg).startswith("s3://")
                           else str(Path(result.checkpoint.path)))
    out = {"output": str(output), "checkpoint": checkpoint_path, "metrics": dict(result.metrics or {}),
           "seconds": time.perf_counter() - start}
    (output / "checkpoint.txt").write_text(checkpoint_path + "\n")
    if cfg.run.evaluate:
        from .evaluate import evaluate_run

        out["test"] = evaluate_run(output, checkpoint_path)
    out["seconds"] = time.perf_counter() - start
    return out
