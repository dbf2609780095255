"""Ray Train on the driver: the ``TorchTrainer`` around :func:`ncdlr.service.worker.train_worker`.

:func:`fit` reads the data once (:func:`~ncdlr.service.run_data.load_training_data`), resolves the number of
novel clusters, creates the named :class:`~ncdlr.service.buffer_actor.BufferActor`, builds ``TorchTrainer``
with ``ScalingConfig`` (workers, GPU auto-detected, fractional CPUs so Ray Data read tasks still get a CPU),
``RunConfig`` (local or s3:// storage, ``CheckpointConfig``, ``FailureConfig``), runs it, and evaluates the
final checkpoint.
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from pathlib import Path

import torch

from .config import Config, save_config
from .entry import RunInterrupted
from .run_data import TrainingData, load_training_data, model_for_table, pipeline_config, save_summary

log = logging.getLogger(__name__)


def resolve_use_gpu(setting: str) -> bool:
    """``"auto"`` → True when the Ray cluster (or this machine) has a GPU."""
    if setting in ("true", "false"):
        return setting == "true"
    import ray

    if ray.is_initialized():
        return ray.cluster_resources().get("GPU", 0) > 0
    return torch.cuda.is_available()


def _storage_path(cfg: Config) -> str:
    if cfg.run.storage_path:
        return cfg.run.storage_path
    return str(Path(cfg.run.output, "ray").resolve())


def ray_storage(uri: str, endpoint_url: str | None = None):
    """``(filesystem, path)`` for Ray's ``storage_filesystem``/``storage_path`` (Train and Tune): a local folder →
    ``(None, absolute path)``; ``s3://bucket/prefix`` → our filesystem that writes no directory markers
    (:func:`ncdlr.data.storage.run_storage_filesystem`; the rclone S3 server refuses them; the bucket is checked
    and errors name the URI)."""
    from ncdlr.data.storage import is_s3, run_storage_filesystem

    if not is_s3(uri):
        return None, str(Path(uri).resolve())
    return run_storage_filesystem(uri, endpoint_url)


def _run_storage(cfg: Config) -> dict:
    """``RunConfig`` storage arguments of the run (:func:`ray_storage` of ``run.storage_path``)."""
    fs, path = ray_storage(_storage_path(cfg), cfg.data.endpoint_url or None)
    return {"storage_path": path} if fs is None else {"storage_path": path, "storage_filesystem": fs}


def data_cpus(cfg: Config) -> float:
    """CPUs of the connected Ray cluster left for Ray Data once the training workers hold theirs (at least 1)."""
    import ray

    total = float(ray.cluster_resources().get("CPU", 0.0))
    return max(1.0, total - cfg.run.num_workers * cfg.run.cpus_per_worker)


def _datasets(cfg: Config, data: TrainingData) -> dict:
    """``datasets`` + ``dataset_config`` for image mode (two-view known/novel streams split over workers; with
    ``data.decode_on = device``, streams of encoded images the workers decode)."""
    if data.features is not None:
        return {}
    from ncdlr.data import pipeline

    free = data_cpus(cfg)
    pipe = pipeline.read_tasks_for(pipeline_config(cfg),
                                   {s: data.manifest.split_counts.get(s, 0) for s in ("known", "novel")}, free)
    per_stream = pipeline.stream_cpu_limit(pipe, free)
    log.info("Ray Data: %.0f CPU(s) beside the training workers, at most %g per training stream; training splits "
             "read in tasks of <= %d rows, images decoded on the %s", free, per_stream, pipe.rows_per_read_task,
             pipe.decode_on)
    raw = pipeline.load_splits(cfg.data.uri, ["known", "novel"], endpoint_url=cfg.data.endpoint_url or None,
                               manifest=data.manifest, verify="none")  # preflight.check_shards checked them
    return {"datasets": {name: pipeline.with_train_views(ds, pipe) for name, ds in raw.items()},
            "dataset_config": pipeline.train_data_config(pipe, cpu_limit=per_stream)}


def run_torch_trainer(cfg: Config, data: TrainingData, train_fn, *, actor_name: str, num_novel: int,
                      scaling_config, run_config, extra_loop_config: dict | None = None, **trainer_kwargs):
    """Run ``TorchTrainer(train_fn)`` next to a fresh shared buffer actor; return the Ray Train ``Result``.

    The workers get the loop config of :func:`ncdlr.service.worker.train_worker` (``cfg``, the data summary,
    the feature splits through the object store, the actor's name, the driver's ``AWS_*`` variables) plus
    ``extra_loop_config``. The actor exists only when the run uses the buffer; it is released however the run
    ends, and a failed run raises its error.
    """
    import ray
    from ray.train.torch import TorchTrainer

    from ncdlr.methods import buffer_width

    from .buffer_actor import get_or_create_buffer_actor

    namespace = "ncdlr"
    actor = get_or_create_buffer_actor(actor_name, cfg.labeler.buffer_size, buffer_width(num_novel, cfg.model.heads),
                                       namespace) \
        if cfg.labeler.use_buffer else None
    trainer = TorchTrainer(
        train_fn,
        train_loop_config={"cfg": cfg, "summary": data.summary,
                           "features": ray.put(data.features) if data.features is not None else None,
                           "actor": actor_name if actor is not None else None, "namespace": namespace,
                           "env": {k: v for k, v in os.environ.items() if k.startswith("AWS_")},
                           **(extra_loop_config or {})},
        scaling_config=scaling_config,
        run_config=run_config,
        **trainer_kwargs,
    )
    try:
        result = trainer.fit()
    finally:
        if actor is not None:
            ray.kill(actor)  # no_restart: the actor's restarts (max_restarts) end with the run
    if result.error:
        raise result.error
    return result


def _checkpoint_uri(cfg: Config, fs_path: str) -> str:
    """A checkpoint's path on the run storage as the user names it (an s3 path has no scheme: restore it)."""
    return "s3://" + fs_path.lstrip("/") if _storage_path(cfg).startswith("s3://") else str(Path(fs_path))


def latest_checkpoint(cfg: Config, run_name: str) -> str:
    """The newest complete checkpoint of Ray Train run ``run_name`` in the run storage, or ``""`` when none.

    Ray Train V2 keeps ``<storage>/<run_name>/checkpoint_<time>`` directories and, once a checkpoint is
    persisted, names it in ``checkpoint_manager_snapshot.json`` (``latest_checkpoint_result``); without that
    file, the newest ``checkpoint_*`` directory holding a ``state.pt``.
    """
    import json

    import pyarrow.fs as pafs

    from ncdlr.data.storage import run_storage_filesystem

    from .checkpoint import FILENAME

    fs, root = run_storage_filesystem(_storage_path(cfg), cfg.data.endpoint_url or None)
    run_dir = f"{root.rstrip('/')}/{run_name}"
    try:
        with fs.open_input_stream(f"{run_dir}/checkpoint_manager_snapshot.json") as stream:
            latest = json.loads(stream.read()).get("latest_checkpoint_result")
        if latest:
            return _checkpoint_uri(cfg, f"{run_dir}/{latest['checkpoint_dir_name'].strip('/')}")
    except (OSError, ValueError):  # no snapshot yet (or unreadable): look at the directories
        pass
    found = fs.get_file_info(pafs.FileSelector(run_dir, allow_not_found=True))
    names = sorted((info.base_name for info in found
                    if info.type == pafs.FileType.Directory and info.base_name.startswith("checkpoint_")), reverse=True)
    for name in names:  # checkpoint_<%Y-%m-%d_%H-%M-%S.%f>: newest first
        if fs.get_file_info(f"{run_dir}/{name}/{FILENAME}").type == pafs.FileType.File:
            return _checkpoint_uri(cfg, f"{run_dir}/{name}")
    return ""


def fit(cfg: Config) -> dict:
    """Train with Ray Train and (if ``run.evaluate``) evaluate + write the report. Returns a summary dict.

    Keys: ``output`` (run dir), ``checkpoint`` (path/URI of the final checkpoint), ``metrics`` (last
    epoch's training metrics), ``test`` (evaluation metrics, when evaluated), ``seconds``.
    """
    start = time.perf_counter()
    data, output = prepare_run(cfg)
    result, checkpoint_path = train_with_ray(cfg, data, output)
    out = {"output": str(output), "checkpoint": checkpoint_path, "metrics": dict(result.metrics or {})}
    if cfg.run.evaluate:
        from .evaluate import evaluate_run

        out["test"] = evaluate_run(output, checkpoint_path, data=data)
    out["seconds"] = time.perf_counter() - start
    return out


def prepare_run(cfg: Config) -> tuple[TrainingData, Path]:
    """Read the data once and check everything that can be checked (:func:`~ncdlr.service.preflight.preflight`,
    the oracle prior's ``Ku``) before Ray starts; start or join Ray and check the cluster's checkpoint storage
    before anything is written; then write ``config.yaml`` and resolve ``model.num_novel``."""
    from .buffer_cap import fill_buffer_cap
    from .entry import init_ray
    from .names import set_aside_names
    from .num_novel import fill_from_known, fixed_prior_counts, resolve_num_novel
    from .preflight import check_cluster_storage, preflight
    from .train_loop import epoch_max_steps

    data = load_training_data(cfg.data)
    if data.features is not None:
        model_for_table(cfg, data.features)
    fill_buffer_cap(cfg, data.summary.novel_rows, world=cfg.run.num_workers,  # the resume check reads it; saved below
                    max_steps=epoch_max_steps(cfg.data, data.features is not None))
    preflight(cfg, data)  # paths made absolute; run directory, test split, num_novel, resume checkpoint, shards
    fill_from_known(cfg, data.summary.train_counts, data.summary.num_known, data.summary.novel_rows)  # saved below
    if cfg.model.num_novel != "auto":
        fixed_prior_counts(cfg, data.summary)  # prior=fixed with a Ku other than the data's: refused before Ray
    init_ray(cpus_needed=cfg.run.num_workers * cfg.run.cpus_per_worker + 2, verbose=cfg.run.verbose)
    check_cluster_storage(cfg, alive_nodes())  # a multi-node cluster needs storage every node reaches
    output = Path(cfg.run.output)
    output.mkdir(parents=True, exist_ok=True)
    if cfg.run.overwrite and not cfg.run.resume and (old := set_aside_names(output)):
        log.warning("replacing the run in %s: its cluster names moved to %s (new clusters, new names)", output, old)
    save_config(cfg, output / "config.yaml")
    save_summary(data.summary, output)  # predict / gallery / name use the run without reaching its data
    if resolve_num_novel(cfg, data, output) is not None:  # model.num_novel=auto → the estimate, saved
        save_config(cfg, output / "config.yaml")
    fixed_prior_counts(cfg, data.summary)  # refuse prior=fixed with a Ku other than the data's before Ray Train starts
    return data, output


def interrupted_message(output: Path, checkpoint_path: str) -> str:
    """What an interrupted run tells the user: where it stopped and how to go on."""
    if not checkpoint_path:
        return f"interrupted (SIGINT) before the first checkpoint; nothing to resume in {output}"
    return (f"interrupted (SIGINT); last checkpoint {checkpoint_path} (also in {output / 'checkpoint.txt'}); go on "
            f"with the same command plus --run.resume {checkpoint_path}")


def alive_nodes() -> int:
    """Alive nodes of the Ray cluster this process is connected to."""
    import ray

    return sum(1 for node in ray.nodes() if node.get("Alive"))


def train_with_ray(cfg: Config, data: TrainingData, output: Path):
    """The ``TorchTrainer`` run with the console relay; returns Ray's ``Result`` and the final checkpoint's path.

    ``<output>/checkpoint.txt`` names the latest checkpoint (for ``--run.resume``) also when the run fails or
    is interrupted (SIGINT), then the error is raised.
    """
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig

    from .console import ConsoleRelay
    from .num_novel import model_num_novel
    from .worker import train_worker

    use_gpu = resolve_use_gpu(cfg.run.use_gpu)
    run_id = f"{cfg.run.name}-{uuid.uuid4().hex[:8]}"
    run_name = f"{cfg.run.name}-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:4]}"
    try:
        with ConsoleRelay(f"console-{run_id}", log_file=output / "train.log"):
            result = run_torch_trainer(
                cfg, data, train_worker,
                actor_name=f"buffer-{run_id}",
                num_novel=model_num_novel(cfg, data.summary),
                extra_loop_config={"console": f"console-{run_id}"},
                scaling_config=ScalingConfig(num_workers=cfg.run.num_workers, use_gpu=use_gpu,
                                             resources_per_worker={"CPU": cfg.run.cpus_per_worker,
                                                                   **({"GPU": 1} if use_gpu else {})}),
                run_config=RunConfig(name=run_name, **_run_storage(cfg),
                                     checkpoint_config=CheckpointConfig(num_to_keep=cfg.run.checkpoints_to_keep),
                                     failure_config=FailureConfig(max_failures=cfg.run.max_failures)),
                **_datasets(cfg, data),
            )
    except BaseException as err:  # failed or interrupted (SIGINT): point checkpoint.txt at what the run saved
        try:
            checkpoint_path = latest_checkpoint(cfg, run_name)
        except Exception:  # storage unreachable: the run's own error is the one to show
            checkpoint_path = ""
        if checkpoint_path:
            (output / "checkpoint.txt").write_text(checkpoint_path + "\n")
        # Ray Train's own SIGINT handler aborts the run and ends with sys.exit; Ctrl-C elsewhere is KeyboardInterrupt
        if isinstance(err, (KeyboardInterrupt, SystemExit)):
            raise RunInterrupted(interrupted_message(output, checkpoint_path)) from None
        raise
    checkpoint_path = _checkpoint_uri(cfg, result.checkpoint.path) if result.checkpoint is not None else ""
    (output / "checkpoint.txt").write_text(checkpoint_path + "\n")
    return result, checkpoint_path
