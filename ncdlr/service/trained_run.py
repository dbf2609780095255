"""A finished training run, opened for use: its config, checkpoint, classes and names, and its model on images.

:func:`open_run` checks the run directory once (config, checkpoint, data summary) with messages that say what
is missing; :func:`image_model` rebuilds the model that maps *images* to embeddings, whatever the run trained
on: an image run's model as it is; an activation-cache run's model with its full encoder (the frozen stem from
the same weights the cache was made with, then the trained blocks); a head-only feature-table run's head behind
the frozen encoder that made the table (recorded in the table's metadata).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from torch import nn

from .config import Config, ConfigError, load_yaml
from .names import class_keys, display_names, read_names


log = logging.getLogger(__name__)


class RunError(ValueError):
    """A run directory that cannot be used (names it and what is missing)."""


@dataclass
class TrainedRun:
    """What a finished run holds. ``K = num_known + num_novel`` classes of the *model* (its prototypes)."""

    run_dir: Path
    cfg: Config
    checkpoint: str  # the checkpoint used (the run's last unless given)
    payload: dict[str, Any]  # load_checkpoint's dict: model state, epoch, metrics, ...
    num_known: int
    num_novel: int
    class_names: list[str]  # the data's [Ks + Ku_data] class names (true novel names included)
    train_counts: list[int]  # [Ks + Ku_data] training rows per class of the data
    table_metadata: dict[str, Any]  # feature-table runs: the table's metadata; {} for image runs

    @property
    def num_classes(self) -> int:
        return self.num_known + self.num_novel

    def names(self) -> list[str]:
        """``[K]`` display names: known classes by name, novel clusters ``novel-NN`` or their ``names.yaml`` name."""
        return display_names(self.class_names, self.num_known, self.num_novel, read_names(self.run_dir, self.num_novel))

    def keys(self) -> list[str]:
        """``[K]`` stable keys: known class names, ``novel-NN`` for novel clusters."""
        return class_keys(self.class_names, self.num_known, self.num_novel)


def open_run(run_dir: str | Path, checkpoint: str = "") -> TrainedRun:
    """Open the run ``run_dir`` (written by ``ncdlr train``) at ``checkpoint`` (default: its ``checkpoint.txt``).

    Raises :class:`RunError` for a missing directory, config or checkpoint pointer; ``CheckpointError`` for a
    checkpoint that cannot be read; the data plane's errors when the run's data cannot be read.
    """
    from .checkpoint import load_checkpoint
    from .num_novel import model_num_novel

    run = Path(run_dir)
    if not run.is_dir():
        raise RunError(f"run directory {str(run)!r} not found")
    if not (run / "config.yaml").is_file():
        raise RunError(f"{str(run)!r} has no config.yaml: not a run directory of `ncdlr train`")
    if not checkpoint:
        pointer = run / "checkpoint.txt"
        if not pointer.is_file() or not pointer.read_text().strip():
            raise RunError(f"run {str(run)!r} has no checkpoint yet (no checkpoint.txt: did its first epoch finish?)")
        checkpoint = pointer.read_text().strip()
    cfg = load_yaml(run / "config.yaml")
    payload = load_checkpoint(checkpoint)
    num_known, data_novel, class_names, train_counts, meta = _data_summary(cfg, run)
    num_novel = model_num_novel(cfg, SimpleNamespace(num_novel=data_novel))
    return TrainedRun(run, cfg, checkpoint, payload, num_known, num_novel, class_names, train_counts, meta)


def _data_summary(cfg: Config, run: Path) -> tuple[int, int, list[str], list[int], dict[str, Any]]:
    """``(Ks, Ku, class_names, train_counts, table metadata)`` of the run's data: from the run directory's
    ``classes.json`` (and the table's metadata when it can be read), else from the data, reading no features."""
    from .run_data import load_summary

    endpoint = cfg.data.endpoint_url or None
    saved = load_summary(run)
    if saved is not None:
        meta = _table_metadata(cfg.data.features, endpoint) if cfg.data.features else {}
        return saved.num_known, saved.num_novel, list(saved.class_names), list(saved.train_counts), meta
    if cfg.data.features:
        from ncdlr.data.features import read_class_summary, read_metadata

        meta = read_metadata(cfg.data.features, endpoint_url=endpoint)
        num_known, num_novel, names, counts = read_class_summary(cfg.data.features, endpoint_url=endpoint)
        return num_known, num_novel, names, counts, meta
    from ncdlr.data.manifest import read_manifest

    manifest = read_manifest(cfg.data.uri, endpoint_url=endpoint)
    return manifest.num_known, manifest.num_novel, list(manifest.class_names), list(manifest.train_counts), {}


def _table_metadata(uri: str, endpoint_url: str | None) -> dict[str, Any]:
    """The run's table metadata (what made it: encoder, image size, source dataset); ``{}`` when the table
    cannot be reached (only a head-only run applied to images needs it, and says so)."""
    from ncdlr.data.features import FeatureTableError, read_metadata
    from ncdlr.data.storage import StorageError

    try:
        return read_metadata(uri, endpoint_url=endpoint_url)
    except (StorageError, FeatureTableError, OSError) as err:
        log.warning("the run's feature table %s cannot be read (%s); using the run's classes.json", uri, err)
        return {}


def table_model(run: TrainedRun) -> nn.Module:
    """The model exactly as trained (its input: what the run's table or dataset rows hold), in eval mode: the
    weights' moving average when the run kept one (``optim.average_epochs``), else the last iterate."""
    from ncdlr.models import build_model

    from .checkpoint import inference_state, load_model_state

    model = build_model(run.cfg.model, run.num_known, run.num_novel, image_size=run.cfg.data.image_size)
    load_model_state(model, inference_state(run.payload), run.payload["source"])
    return model.eval()


class _EmbedThenHead(nn.Module):
    """A frozen encoder, then a head-only run's model (whose input was that encoder's embeddings)."""

    def __init__(self, encoder: nn.Module, model: nn.Module):
        super().__init__()
        self.encoder, self.model = encoder, model
        self.num_known, self.num_novel = model.num_known, model.num_novel

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(self.encoder(x))

    def logits(self, z: torch.Tensor) -> torch.Tensor:
        return self.model.logits(z)

    def class_prototypes(self) -> torch.Tensor:
        return self.model.class_prototypes()


class _Fixed(nn.Module):
    """A run's model whose scores pass through its fitted post-hoc fix (``logits(z)`` = the fix applied to the
    model's cosines; ``forward`` and the prototypes unchanged)."""

    def __init__(self, model: nn.Module, fix):
        super().__init__()
        self.model, self.fix = model, fix
        self.num_known, self.num_novel = model.num_known, model.num_novel

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)

    def logits(self, z: torch.Tensor) -> torch.Tensor:
        return self.fix.apply(z, self.model.logits(z))

    def class_prototypes(self) -> torch.Tensor:
        return self.model.class_prototypes()


def posthoc_fix(run: TrainedRun):
    """The run's ``method.posthoc`` fix (:class:`ncdlr.methods.PosthocFix`, fitted when the run was evaluated:
    :mod:`ncdlr.service.fitted_fix`); the identity fix for ``none``.

    Raises :class:`RunError` when the run names a fix that was never fitted for its checkpoint."""
    from .fitted_fix import load_fix

    try:
        return load_fix(run.run_dir, run.cfg.method.posthoc, run.checkpoint)
    except FileNotFoundError as err:
        raise RunError(str(err)) from None


def with_fix(model: nn.Module, fix) -> nn.Module:
    """``model`` with ``fix`` on its scores (``logits``); ``model`` itself for the identity fix."""
    return model if fix.kind == "none" else _Fixed(model, fix).eval()


@dataclass(frozen=True)
class ImageInput:
    """How images must be prepared for :func:`image_model`: the eval crop side (px) and the pixel scaling."""

    image_size: int
    encoder: str


def image_input(run: TrainedRun) -> ImageInput:
    """The eval view the run's model takes images at (a head-only table's: the encoder that made the table)."""
    if run.cfg.model.encoder != "identity":
        return ImageInput(run.cfg.data.image_size, run.cfg.model.encoder)
    meta = run.table_metadata
    if not meta.get("encoder") or not meta.get("image_size"):
        raise RunError(f"run {str(run.run_dir)!r} trained a head on the table {run.cfg.data.features!r}, which does not "
                       "record the encoder and image size that made it (tables from an older `ncdlr embed`): predict "
                       "on a feature table instead (--data TABLE), or embed the data again and retrain")
    return ImageInput(int(meta["image_size"]), str(meta["encoder"]))


def image_model(run: TrainedRun) -> nn.Module:
    """The run's model on images ``[n, 3, S, S]`` (scaled for :func:`image_input`'s encoder), in eval mode:
    ``forward → z [n, D]`` unit norm, ``logits(z) → [n, K]`` cosines."""
    from ncdlr.models import build_encoder

    spec = image_input(run)
    if run.cfg.model.encoder == "identity":
        meta = run.table_metadata
        encoder = build_encoder(spec.encoder, pretrained=str(meta.get("pretrained", "")), trainable_blocks=0,
                                image_size=spec.image_size).eval()
        return _EmbedThenHead(encoder, table_model(run)).eval()
    model = table_model(run)  # built as trained: a cache run's frozen stem from the same weights (or seed)
    model.encoder.use_image_input()  # ... now run on images: stem, then the trained blocks
    return model


def check_table_fits(run: TrainedRun, meta: dict[str, Any], uri: str) -> None:
    """Refuse a feature table whose rows are not the input of the run's model (other encoder, blocks or width)."""
    own = run.table_metadata
    if not run.cfg.data.features:
        raise ConfigError(f"run {str(run.run_dir)!r} trained on images; --data {uri} is a feature table: give a "
                          "prepared dataset or a folder of images")
    keys = ("kind", "encoder", "cached_blocks", "image_size", "shape")
    differ = {k: (own.get(k), meta.get(k)) for k in keys if own.get(k) != meta.get(k)}
    if differ:
        raise ConfigError(f"--data {uri} is not the same kind of table as the run's {run.cfg.data.features!r} "
                          f"({', '.join(f'{k}: {b!r} here, {a!r} in the run' for k, (a, b) in differ.items())})")
