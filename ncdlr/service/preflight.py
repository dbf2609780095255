"""Everything about a run that can be checked before Ray starts, checked in one place on the driver.

:func:`preflight` runs in :func:`~ncdlr.service.trainer.fit` right after the data has been read (the feature
table's schema, dtypes, NaN/inf and label ranges are :func:`~ncdlr.data.features.read_feature_table`'s) and
before anything is written or Ray starts. Each refusal is one user error naming the key or file
(:class:`~ncdlr.service.config.ConfigError`, :class:`~ncdlr.service.checkpoint.CheckpointError`), shown by the
entry points as one line with exit code 2:

1. local paths (``data.features``, ``data.uri``, ``run.resume``, ``run.storage_path``, ``run.output``,
   ``model.pretrained``) become absolute in the config — the Ray Train workers run in another directory —
   an input path that does not exist is refused, and so is an output path inside Ray's temporary session
   directory (a job submitted with ``--working-dir`` runs in a copy of it that is deleted with the cluster);
2. the run directory: one that holds a run already (``config.yaml`` or ``metrics.json``) is refused unless
   ``run.overwrite`` or ``run.resume``;
3. the test split exists when ``run.evaluate`` is true;
4. a number ``model.num_novel`` lies in ``[2, novel training rows]``;
5. the ``run.resume`` checkpoint is readable and fits the model the workers will build (trainable parameter
   names and shapes) and the labeler's ``Ku`` (the width of the buffer rows it saved);
6. an image dataset's shards match their manifest (sha256 the first time, then the stamp it leaves:
   :func:`ncdlr.data.pipeline.verify_splits`), so a corrupt shard is named before training, not mid-epoch.

Once Ray is up, :func:`check_cluster_storage` refuses a local checkpoint storage on a cluster of several nodes
(the ranks' checkpoints would land on different machines) unless ``run.shared_storage`` says every node mounts it.
"""

from __future__ import annotations

import logging
from pathlib import Path

from .config import Config, ConfigError
from .run_data import TrainingData

log = logging.getLogger(__name__)

#: ``section.key`` of the local paths a run reads (they must exist) and of those it writes.
INPUT_PATHS = ("data.features", "data.uri", "run.resume", "model.pretrained")
OUTPUT_PATHS = ("run.output", "run.storage_path")
#: Files whose presence means a run directory holds a started or finished run.
RUN_MARKERS = ("config.yaml", "metrics.json")


def preflight(cfg: Config, data: TrainingData) -> None:
    """Check ``cfg`` against ``data`` and the file system (paths made absolute in ``cfg`` in place).

    Raises:
        ConfigError: a missing input path, an occupied run directory, no test split to evaluate on, or
            ``model.num_novel`` outside ``[2, novel rows]`` (the message names the key and the file).
        CheckpointError: ``run.resume`` is unreadable or does not fit this run's model or labeler.
        DatasetFormatError: a shard of the image dataset is missing or does not match its manifest.
    """
    absolute_paths(cfg)
    check_run_directory(cfg)
    check_test_split(cfg, data)
    check_num_novel(cfg, data)
    check_head_init(cfg, data)
    check_resume(cfg, data)
    check_shards(cfg, data)


def check_head_init(cfg: Config, data: TrainingData) -> None:
    """``model.head_init imprint`` fits the head on the training rows in memory: a feature table or activation
    cache (``--features``), not image shards streamed by Ray Data."""
    if cfg.model.head_init == "imprint" and data.features is None:
        raise ConfigError("model.head_init imprint needs a feature table or activation cache (--features): in image "
                          "mode the training rows stream through Ray Data and are not in memory to fit the head on")


def _is_local(path: str) -> bool:
    return bool(path) and "://" not in path


def absolute_paths(cfg: Config) -> None:
    """Make every local path of :data:`INPUT_PATHS` and :data:`OUTPUT_PATHS` absolute (relative to this
    process's working directory); refuse an input path that does not exist."""
    for key in INPUT_PATHS + OUTPUT_PATHS:
        section, _, name = key.partition(".")
        value = getattr(getattr(cfg, section), name)
        if not _is_local(value):
            continue
        path = Path(value).expanduser().resolve()
        if key in INPUT_PATHS and not path.exists() and not (key == "data.uri" and cfg.data.features):
            raise ConfigError(f"{key}: {value!r} does not exist (looked for {str(path)!r})")
        if key in OUTPUT_PATHS and in_ray_session_dir(path):
            raise ConfigError(f"{key}: {value!r} resolves to {str(path)!r}, inside Ray's temporary session directory "
                              "(a job's copy of its --working-dir), which is deleted with the cluster: give an "
                              "absolute path on lasting storage (--output /data/runs/NAME; checkpoints: "
                              "--run.storage-path s3://BUCKET/runs)")
        setattr(getattr(cfg, section), name, str(path))


def in_ray_session_dir(path: Path) -> bool:
    """True for a path inside a Ray session's temporary files (``.../session_*/runtime_resources/...``, where a
    submitted job's working directory is unpacked, or anywhere under a ``session_*`` folder of Ray's temp dir)."""
    parts = path.parts
    return "runtime_resources" in parts or any(part.startswith("session_") and parent == "ray"
                                               for parent, part in zip(parts, parts[1:]))


def check_cluster_storage(cfg: Config, nodes: int) -> None:
    """On a Ray cluster of ``nodes`` > 1 alive nodes, Ray Train's checkpoint storage must be one every node
    reaches: ``s3://`` (or another URI), or a local path marked ``run.shared_storage`` (a filesystem every node
    mounts). A plain local path would leave each rank's checkpoint files on its own machine's disk."""
    storage = cfg.run.storage_path or str(Path(cfg.run.output) / "ray")
    if nodes <= 1 or not _is_local(storage) or cfg.run.shared_storage:
        return
    raise ConfigError(f"run.storage_path {storage!r} is a local path, but this Ray cluster has {nodes} nodes: each "
                      "would keep its checkpoints on its own disk. Give storage every node reaches "
                      "(--run.storage-path s3://BUCKET/runs) or, for a filesystem mounted on every node, "
                      "--run.shared-storage true")


def check_run_directory(cfg: Config) -> None:
    """Refuse a ``run.output`` that holds a run already, unless ``run.overwrite`` or ``run.resume``."""
    if not _is_local(cfg.run.output):
        return
    found = [name for name in RUN_MARKERS if (Path(cfg.run.output) / name).exists()]
    if not found:
        return
    if cfg.run.overwrite or cfg.run.resume:
        log.warning("run.output %s holds a run already (%s): %s it", cfg.run.output, ", ".join(found),
                    "resuming into" if cfg.run.resume else "run.overwrite: replacing")
        return
    raise ConfigError(f"run.output {cfg.run.output!r} holds a run already ({', '.join(found)}); choose another "
                      f"--output, pass --overwrite to replace it, or --run.resume CHECKPOINT to continue it")


def check_test_split(cfg: Config, data: TrainingData) -> None:
    """With ``run.evaluate``, the data must have a (non-empty) ``test`` split to evaluate on after training."""
    if not cfg.run.evaluate:
        return
    if data.features is not None:
        splits = data.features.features
        if "test" in splits and len(splits["test"]) > 0:
            return
        source, have = f"feature table {cfg.data.features!r}", ", ".join(sorted(splits))
    else:
        counts = data.manifest.split_counts
        if counts.get("test", 0) > 0:
            return
        source, have = f"dataset {cfg.data.uri!r}", ", ".join(f"{k}: {v}" for k, v in sorted(counts.items()))
    raise ConfigError(f"run.evaluate is true but the {source} has no test split (splits: {have}); "
                      f"add one or pass --evaluate false")


def check_num_novel(cfg: Config, data: TrainingData) -> None:
    """A number ``model.num_novel = N`` needs ``2 <= N <= `` the novel training rows (one cluster is no
    transport problem; more clusters than rows leaves some empty and drives τ away)."""
    if cfg.model.num_novel in ("auto", "0"):
        return
    count, rows = int(cfg.model.num_novel), data.summary.novel_rows
    source = cfg.data.features or cfg.data.uri
    if count < 2:
        raise ConfigError(f"model.num_novel={count}: need at least 2 novel clusters (or 0 for the data's "
                          f"{data.summary.num_novel}, or auto)")
    if count > rows:
        raise ConfigError(f"model.num_novel={count} is more than the {rows} novel training rows of {source!r}")


def check_resume(cfg: Config, data: TrainingData) -> None:
    """``run.resume``: read the checkpoint here, then load its ``model`` into a throwaway model built as the
    workers build theirs, and compare its buffer's width with ``Ku`` (``H·Ku`` with ``model.heads = H``).

    With ``model.num_novel=auto`` the workers' ``Ku`` is the estimate made after Ray starts, so only
    readability is checked here.
    """
    if not cfg.run.resume:
        return
    from ncdlr.methods import buffer_width
    from ncdlr.models import build_model

    from .checkpoint import CheckpointError, load_checkpoint, load_model_state
    from .num_novel import model_num_novel

    try:
        payload = load_checkpoint(cfg.run.resume)
    except CheckpointError as err:  # torch's reasons for an unreadable file run over several lines: keep the first
        raise CheckpointError(f"run.resume: {str(err).splitlines()[0]}") from err
    if cfg.model.num_novel == "auto":
        return
    source = f"run.resume {payload['source']!r}"
    num_novel = model_num_novel(cfg, data.summary)
    model = build_model(cfg.model, data.summary.num_known, num_novel, image_size=cfg.data.image_size)
    load_model_state(model, payload.get("model") or {}, source)
    buffer = payload.get("buffer")
    if not (cfg.labeler.use_buffer and buffer):
        return
    width, rows = int(buffer["rows"].shape[1]), int(buffer["rows"].shape[0])
    heads = cfg.model.heads
    if width != buffer_width(num_novel, heads):
        this_run = f"Ku = {num_novel} (model.num_novel)" + (f" × {heads} heads (model.heads)" if heads > 1 else "")
        raise CheckpointError(f"{source}: its buffer holds rows of {width} novel clusters, this run has {this_run}")
    if rows > cfg.labeler.buffer_size:
        shortened = (f" (labeler.buffer_epochs {cfg.labeler.buffer_epochs:g} bounds it by the pool's size; "
                     f"--labeler.buffer_epochs 0 keeps buffer_size as given)" if cfg.labeler.buffer_epochs > 0 else "")
        raise CheckpointError(f"{source}: its buffer holds {rows} rows, more than labeler.buffer_size = "
                              f"{cfg.labeler.buffer_size}{shortened}")


def check_shards(cfg: Config, data: TrainingData) -> None:
    """Image mode: the training (and, when evaluating, test) shards match the manifest (``DatasetFormatError``
    names the shard; the Ray Data set-up then checks only the stamp again)."""
    if data.manifest is None:
        return
    from ncdlr.data.pipeline import verify_splits

    splits = ["known", "novel"] + (["test"] if cfg.run.evaluate else [])
    verify_splits(cfg.data.uri, data.manifest, splits, endpoint_url=cfg.data.endpoint_url or None)
