"""A run's training data, read once on the driver and passed down (feature table or prepared image dataset).

:func:`load_training_data` reads the feature table (feature-table mode) or the dataset manifest (image mode)
exactly once; the trainer, the number-of-novel-classes resolution, the Ray Data set-up, the workers (the
feature splits travel through Ray's object store) and the final evaluation all use that object.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from dataclasses import dataclass
from pathlib import Path

from ncdlr.data.features import FeatureSplits, first_view
from ncdlr.data.manifest import Manifest

from .config import Config, ConfigError, DataConfig

log = logging.getLogger(__name__)


@dataclass
class DatasetSummary:
    """What the driver and the workers need to know about the data before training."""

    num_known: int
    num_novel: int
    feature_dim: int  # 0 for image datasets
    novel_rows: int
    class_names: list[str]
    train_counts: list[int]


SUMMARY_FILE = "classes.json"  #: the data summary a run directory keeps (so using the run needs no data access)


def save_summary(summary: DatasetSummary, run_dir: str | Path) -> None:
    """Write ``summary`` as ``run_dir/classes.json`` (class names, Ks, Ku, training counts)."""
    Path(run_dir, SUMMARY_FILE).write_text(json.dumps(dataclasses.asdict(summary), indent=1) + "\n")


def load_summary(run_dir: str | Path) -> DatasetSummary | None:
    """The summary :func:`save_summary` wrote, or None for a run directory without one (an older run)."""
    path = Path(run_dir, SUMMARY_FILE)
    return DatasetSummary(**json.loads(path.read_text())) if path.is_file() else None


@dataclass
class TrainingData:
    """The run's data as read once: its summary and either the feature splits or the image dataset's manifest."""

    summary: DatasetSummary
    features: FeatureSplits | None = None  # feature-table mode: every split as tensors
    manifest: Manifest | None = None  # image mode


def load_training_data(data: DataConfig) -> TrainingData:
    """Read ``data.features`` (a feature table) or ``data.uri``'s manifest; errors name the URI."""
    if data.features:
        from ncdlr.data.features import read_feature_table

        splits = read_feature_table(data.features)
        summary = DatasetSummary(splits.num_known, splits.num_novel, splits.dim, splits.features["novel"].shape[0],
                                 splits.class_names, splits.train_counts())
        return TrainingData(summary, features=splits)
    if not data.uri:
        raise ValueError("no training data: set data.uri (prepared image dataset) or data.features (feature table)")
    from ncdlr.data.manifest import read_manifest

    manifest = read_manifest(data.uri, endpoint_url=data.endpoint_url or None)
    summary = DatasetSummary(manifest.num_known, manifest.num_novel, 0, manifest.split_counts.get("novel", 0),
                             manifest.class_names, manifest.train_counts)
    return TrainingData(summary, manifest=manifest)


def model_for_table(cfg: Config, splits: FeatureSplits) -> None:
    """Point ``cfg.model`` (and ``cfg.data.image_size``) at the feature table the run trains on.

    An embedding table: the encoder's input is the embedding (``model.feature_dim`` = its width ``D``). An
    activation cache (``ncdlr embed --trainable-blocks B``): the table's encoder, split at its last ``B`` blocks
    (``model.cached_blocks``), at the table's image size; ``model.encoder`` must be that encoder (or
    ``identity``, what a bare ``--features`` sets, replaced by it) and ``model.trainable_blocks`` between 0 and
    ``B``. Raises :class:`ConfigError` naming the table's values otherwise.
    """
    if not splits.is_activations:
        cfg.model.feature_dim = splits.dim
        return
    meta = splits.metadata
    where = f"activation cache {cfg.data.features or '(in memory)'}"
    if cfg.model.encoder in ("identity", meta["encoder"]):
        cfg.model.encoder = meta["encoder"]
    else:
        raise ConfigError(f"{where} holds {meta['encoder']!r} activations, but model.encoder is {cfg.model.encoder!r}")
    if cfg.model.pretrained and cfg.model.pretrained != meta.get("pretrained", ""):
        raise ConfigError(f"{where} was made with pretrained={meta.get('pretrained', '')!r}, but model.pretrained is "
                          f"{cfg.model.pretrained!r}: the trained blocks must start from the weights of the cached stem")
    cfg.model.pretrained = meta.get("pretrained", "")
    blocks = int(meta["cached_blocks"])
    if not 0 <= cfg.model.trainable_blocks <= blocks:
        raise ConfigError(f"{where} holds the input of the encoder's last {blocks} block(s); model.trainable_blocks "
                          f"{cfg.model.trainable_blocks} cannot be trained on it (use 0..{blocks}, or embed with "
                          "--trainable-blocks set to the blocks to train)")
    few = {split: splits.views(split) for split in ("known", "novel") if splits.views(split) < 2}
    if few:
        raise ConfigError(f"{where} caches {few} view(s) per training image; a step needs two different views "
                          "(ncdlr embed --views 2 or more)")
    cfg.model.cached_blocks, cfg.model.feature_dim = blocks, 0
    cfg.data.image_size = int(meta["image_size"])
    cfg.data.photometric = str(meta.get("photometric", "none"))  # what the cached crops hold (older caches: none)


def init_head(cfg: Config, model, splits: FeatureSplits) -> dict[str, float] | None:
    """``model.head_init``: with ``imprint``, fit ``model``'s head on view 0 of the training rows of ``splits`` (the
    known split's labels and k-means clusters of the novel split, seeded by ``run.seed``;
    :func:`ncdlr.models.imprint.imprint_head`) and return its fit shares; None with ``random`` (nothing done).
    No novel label is read."""
    if cfg.model.head_init != "imprint":
        return None
    from ncdlr.models.imprint import imprint_head

    fit = imprint_head(model, first_view(splits.features["known"]), splits.labels["known"],
                       first_view(splits.features["novel"]), seed=cfg.run.seed)
    log.info("head imprinted: %.0f%% of the known rows on their class, %.0f%% of the novel rows on their k-means "
             "cluster's prototype", 100 * fit["fit_known"], 100 * fit["fit_novel"])
    return fit


def pipeline_config(cfg: Config, *, eval_mode: bool = False):
    """The data plane's :class:`~ncdlr.data.pipeline.PipelineConfig` for this run's encoder and sizes."""
    from ncdlr.data import pipeline
    from ncdlr.models import input_scaling

    return pipeline.PipelineConfig(image_size=cfg.data.image_size, crop_scale=(cfg.data.crop_scale_min, 1.0),
                                   scaling=input_scaling(cfg.model.encoder), photometric=cfg.data.photometric,
                                   batch_size=cfg.data.eval_batch_size if eval_mode else cfg.data.batch_size,
                                   decode_on=cfg.data.decode_on,
                                   passes_per_execution=min(cfg.data.epochs_per_execution, max(1, cfg.optim.epochs)))
