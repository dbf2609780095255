"""The known-class validation problem used to choose γ and α without ever looking at novel labels.

One protocol, in one function (:func:`validation_splits`), for both ways γ is chosen: the Ray Tune search
(``tuning/gamma_search.py`` trains its trials on the table :func:`build_validation_table` writes) and the
in-process rehearsal (:func:`ncdlr.service.rehearsal.select_gamma`, used by the quality benchmark).

1. Only the rows of the **known** split are used (from a table, a parquet filter reads only
   ``split == "known"``); the novel split, its labels and any val/test rows are never loaded or looked at.
2. A seeded ``pseudo_novel_fraction`` (default 20 %) of the ``Ks`` known classes becomes *pseudo-novel*. The
   choice is stratified over head / medium / tail (the 3:4:3 cut of :func:`ncdlr.metrics.head_medium_tail` by
   training count), so the validation problem keeps the long tail of the real one. At least two classes are
   pseudo-novel (an OT problem needs two clusters) and at least one stays pseudo-known.
3. In every class a seeded ``holdout_fraction`` (default 20 %) of its images is held out for scoring (at least
   one image when the class has two or more; a one-image class is kept for training). The rest trains:
   pseudo-known images as the labeled ``known`` split, pseudo-novel images as the unlabeled ``novel`` split.
4. Labels are remapped: pseudo-known classes ``0..Ks'-1``, pseudo-novel ``Ks'..Ks'+Ku'-1`` (each group in
   original label order); the held-out rows form the ``val`` split. Every source row lands in exactly one
   split, so no image is used twice and none is both trained on and scored.

The score of a run on this problem is the class-mean accuracy over the pseudo-novel classes of ``val``
(:func:`validation_scores`: ``cluster_accuracy(...)["novel"]``, one Hungarian matching over all classes,
task-agnostic).

A second problem, :func:`planted_splits`, *plants* the pseudo-novel classes in the real unlabeled pool instead of
posing them alone: its ``novel`` split is the pseudo-novel training rows plus every real novel training row (their
labels are never read), with ``Ku' + Ku`` clusters. The run then faces the real pool — its sizes, its long tail,
its number of clusters — and the planted classes are the only ones it is scored on (:func:`planted_scores`). A
problem of a few pseudo-novel classes alone is another problem when Ks is small (5 known classes leave 2 or 3
pseudo-novel clusters where the real pool has 5). ``build_validation_table(..., planted=True)`` writes it as a table
for the Ray Tune search (``tuning/gamma_search.py --problem planted``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np
import torch

from ncdlr.data.features import (FeatureSplits, FeatureTableError, read_feature_table, read_metadata, write_feature_table,
                                 write_table_part)
from ncdlr.metrics import cluster_accuracy, head_medium_tail, planted_f1

from .config import ConfigError

SCORING_SPLIT = "val"


@dataclass(frozen=True)
class ValidationConfig:
    """How the known classes are split into a pseudo-known / pseudo-novel problem."""

    pseudo_novel_fraction: float = 0.2  #: share of the known classes that become pseudo-novel
    holdout_fraction: float = 0.2  #: share of each class's images held out for scoring
    seed: int = 0
    min_pseudo_novel: int = 2  #: an OT problem needs at least two clusters

    def check(self) -> None:
        if not 0.0 < self.pseudo_novel_fraction < 1.0:
            raise ConfigError(f"pseudo_novel_fraction must be in (0, 1), got {self.pseudo_novel_fraction}")
        if not 0.0 < self.holdout_fraction < 1.0:
            raise ConfigError(f"holdout_fraction must be in (0, 1), got {self.holdout_fraction}")
        if self.min_pseudo_novel < 2:
            raise ConfigError(f"min_pseudo_novel must be at least 2, got {self.min_pseudo_novel}")


@dataclass(frozen=True)
class ValidationSplit:
    """What :func:`validation_splits` built (stored in a validation table's metadata under ``validation``).

    ``pseudo_known[i]`` is the original label of new label ``i``; ``pseudo_novel[j]`` that of ``Ks' + j``.
    ``target_num_known``/``target_num_novel`` are Ks and Ku of the source table (Ku from its metadata or the
    user: the count of novel classes is an input of the real run, never derived from novel labels here).
    """

    source: str
    pseudo_known: list[int]
    pseudo_novel: list[int]
    split_counts: dict[str, int]
    target_num_known: int
    target_num_novel: int
    config: dict
    unlabeled_rows: int = 0  #: real novel training rows in the ``novel`` split (:func:`planted_splits`)

    @property
    def num_known(self) -> int:
        return len(self.pseudo_known)

    @property
    def num_novel(self) -> int:
        return len(self.pseudo_novel)

    @property
    def planted(self) -> bool:
        """Whether the pseudo-novel classes are planted in the real pool (:func:`planted_splits`)."""
        return self.unlabeled_rows > 0

    @property
    def num_clusters(self) -> int:
        """The novel clusters a run on this problem has: ``Ku'``, or ``Ku' + Ku`` when planted."""
        return self.num_novel + (self.target_num_novel if self.planted else 0)


def choose_pseudo_novel(train_counts: Sequence[int], fraction: float = 0.2, seed: int = 0,
                        min_classes: int = 2) -> list[int]:
    """Seeded, long-tail-preserving choice of pseudo-novel classes among ``Ks`` known classes.

    Args:
        train_counts: ``[Ks]`` training images per known class.
        fraction: share of classes to choose; the total is ``max(min_classes, round(fraction·Ks))``.

    Returns:
        Sorted class ids. The total is allocated to the head / medium / tail groups (3:4:3 by count) in
        proportion to their sizes (largest remainder), then drawn uniformly inside each group.
    """
    num_classes = len(train_counts)
    total = max(min_classes, int(round(fraction * num_classes)))
    if total >= num_classes:
        raise ValueError(f"{num_classes} known classes cannot give {total} pseudo-novel classes and keep one "
                         f"pseudo-known (need at least {min_classes + 1} known classes)")
    groups = head_medium_tail(list(range(num_classes)), train_counts)
    names = ("medium", "head", "tail")  # remainder ties go to the middle of the distribution first
    quota = {g: total * len(groups[g]) / num_classes for g in names}
    take = {g: int(np.floor(quota[g])) for g in names}
    for g in sorted(names, key=lambda g: -(quota[g] - take[g]))[: total - sum(take.values())]:
        take[g] += 1
    rng = np.random.default_rng(seed)
    chosen: list[int] = []
    for g in ("head", "medium", "tail"):
        members = np.asarray(groups[g], dtype=np.int64)
        chosen += rng.choice(members, size=min(take[g], len(members)), replace=False).tolist()
    return sorted(int(c) for c in chosen)


def holdout_mask(labels: np.ndarray, fraction: float = 0.2, seed: int = 0) -> np.ndarray:
    """``[N]`` bool, True for the rows held out for scoring: per class ``floor(fraction·n)`` rows, at least one
    when the class has ``n >= 2`` rows and never all of them (a one-row class is kept for training)."""
    labels = np.asarray(labels)
    mask = np.zeros(len(labels), dtype=bool)
    rng = np.random.default_rng(seed)
    for c in np.unique(labels):
        rows = np.flatnonzero(labels == c)
        n = len(rows)
        k = min(n - 1, max(1, int(np.floor(fraction * n)))) if n >= 2 else 0
        mask[rng.permutation(rows)[:k]] = True
    return mask


def validation_splits(splits: FeatureSplits, cfg: ValidationConfig = ValidationConfig(), num_novel: int | None = None,
                      *, source: str = "feature splits") -> tuple[FeatureSplits, ValidationSplit]:
    """The validation problem of ``splits`` (the protocol above), in memory.

    Args:
        splits: reads only ``features["known"]``, ``labels["known"]`` and ``source_ids["known"]`` (when present);
            every other split may be absent, and no novel label is looked at.
        num_novel: Ku of the real problem (for the γ transfer); default ``splits.num_novel``.
        source: what the splits came from (in the :class:`ValidationSplit` and in error messages).

    Returns:
        ``(validation, info)``: ``validation`` has the splits ``known`` (pseudo-known, labels ``0..Ks'-1``),
        ``novel`` (pseudo-novel, ``Ks'..Ks'+Ku'-1``) and ``val`` (the held-out rows of both), each in source row
        order, ``num_known = Ks'``, ``num_novel = Ku'`` and ``metadata["validation"]`` = ``asdict(info)``.

    Raises:
        FeatureTableError naming ``source``: no known rows, too few known classes, repeated ``source_id`` values,
        no row to hold out, or no Ku. ValueError (a :class:`ConfigError`) for ``cfg`` out of range.
    """
    cfg.check()
    if "known" not in splits.labels or not len(splits.labels["known"]):
        raise FeatureTableError(f"{source}: no rows with split 'known'")
    num_novel = splits.num_novel if num_novel is None else num_novel
    if num_novel < 1:
        raise FeatureTableError(f"{source}: the number of novel classes Ku is unknown; give it (e.g. from "
                                f"`ncdlr estimate-k`)")
    labels = splits.labels["known"].numpy()
    source_ids = list(splits.source_ids.get("known") or [f"row-{i}" for i in range(len(labels))])
    unique, repeats = np.unique(np.asarray(source_ids, dtype=str), return_counts=True)
    if (repeats > 1).any():
        raise FeatureTableError(f"{source}: source_id values repeat among the known rows "
                                f"(e.g. {unique[repeats > 1][:3].tolist()}); an image may be used only once")

    counts = np.bincount(labels, minlength=splits.num_known)
    present = np.flatnonzero(counts > 0)
    try:
        chosen = choose_pseudo_novel(counts[present].tolist(), cfg.pseudo_novel_fraction, cfg.seed,
                                     cfg.min_pseudo_novel)
    except ValueError as err:
        raise FeatureTableError(f"{source}: {err}") from None
    pseudo_novel = sorted(int(present[i]) for i in chosen)
    pseudo_known = [int(c) for c in present if int(c) not in set(pseudo_novel)]
    new_label = np.full(splits.num_known, -1, dtype=np.int64)
    new_label[pseudo_known] = np.arange(len(pseudo_known))
    new_label[pseudo_novel] = len(pseudo_known) + np.arange(len(pseudo_novel))

    scoring = holdout_mask(labels, cfg.holdout_fraction, cfg.seed + 1)
    if not scoring.any():
        raise FeatureTableError(f"{source}: no known class has two or more rows, so none can be held out for scoring")
    is_novel = np.isin(labels, pseudo_novel)
    split = np.where(scoring, SCORING_SPLIT, np.where(is_novel, "novel", "known"))
    masks = {name: split == name for name in ("known", "novel", SCORING_SPLIT)}
    info = ValidationSplit(source=source, pseudo_known=pseudo_known, pseudo_novel=pseudo_novel,
                           split_counts={name: int(mask.sum()) for name, mask in masks.items()},
                           target_num_known=splits.num_known, target_num_novel=int(num_novel), config=asdict(cfg))
    x, y = splits.features["known"], torch.from_numpy(new_label[labels])
    validation = FeatureSplits(
        features={name: x[torch.from_numpy(mask)] for name, mask in masks.items()},
        labels={name: y[torch.from_numpy(mask)] for name, mask in masks.items()},
        num_known=len(pseudo_known), num_novel=len(pseudo_novel),
        class_names=[splits.class_names[c] for c in pseudo_known + pseudo_novel],
        source_ids={name: [i for i, keep in zip(source_ids, mask) if keep] for name, mask in masks.items()},
        metadata={**{k: v for k, v in splits.metadata.items() if k in CACHE_KEYS}, "validation": asdict(info)},
        activation_shape=splits.activation_shape)
    return validation, info


def planted_splits(splits: FeatureSplits, cfg: ValidationConfig = ValidationConfig(), num_novel: int | None = None,
                   *, source: str = "feature splits") -> tuple[FeatureSplits, ValidationSplit]:
    """The validation problem of :func:`validation_splits` with its pseudo-novel classes planted in the real pool.

    Args:
        splits: the real problem; reads what :func:`validation_splits` reads plus ``features["novel"]`` (and
            ``source_ids["novel"]``). The novel labels are never read.
        num_novel: Ku of the real problem, the clusters the real rows get; default ``splits.num_novel``.

    Returns:
        ``(problem, info)``: as :func:`validation_splits`, but the ``novel`` split holds the pseudo-novel training
        rows (labels ``Ks'..Ks'+Ku'-1``) followed by every real novel training row, and ``num_novel = Ku' + Ku``:
        the run has clusters for both. The real rows carry the placeholder label ``Ks' + Ku'`` (a training loop
        reads no novel label; a score must ignore them: :func:`planted_scores`); ``info.unlabeled_rows`` counts them.
        ``val`` is unchanged: only held-out rows of known classes.

    Raises:
        FeatureTableError naming ``source`` for those of :func:`validation_splits` or no novel rows to plant in.
    """
    if "novel" not in splits.features or not len(splits.features["novel"]):
        raise FeatureTableError(f"{source}: no rows with split 'novel' to plant the pseudo-novel classes in")
    real, known = splits.features["novel"], splits.features["known"]
    if real.shape[1:] != known.shape[1:]:
        raise FeatureTableError(f"{source}: novel rows have shape {tuple(real.shape[1:])}, known rows "
                                f"{tuple(known.shape[1:])}")
    problem, info = validation_splits(splits, cfg, num_novel, source=source)
    placeholder = problem.num_known + problem.num_novel
    ids = list(splits.source_ids.get("novel") or [f"novel-row-{i}" for i in range(len(real))])
    problem.features["novel"] = torch.cat([problem.features["novel"], real])
    problem.labels["novel"] = torch.cat([problem.labels["novel"],
                                         torch.full((len(real),), placeholder, dtype=torch.int64)])
    problem.source_ids["novel"] = problem.source_ids["novel"] + ids
    problem.num_novel += info.target_num_novel
    problem.class_names = problem.class_names + [f"unlabeled-{j}" for j in range(info.target_num_novel)]
    info = ValidationSplit(**{**asdict(info), "unlabeled_rows": len(real),
                              "split_counts": {**info.split_counts, "novel": len(problem.labels["novel"])}})
    problem.metadata["validation"] = asdict(info)
    return problem, info


def planted_scores(y_novel: np.ndarray, pred_novel: np.ndarray, info: ValidationSplit) -> dict[str, float]:
    """The score of a run on a planted problem, from its predictions ``[n]`` of the ``novel`` training rows ``[n]``
    (labels as :func:`planted_splits` gave them; the real rows' placeholder is never a planted class).

    ``score`` = mean over the planted classes of their best F1 against the predicted clusters of the whole pool
    (:func:`ncdlr.metrics.planted_f1`): splitting a planted class, merging it into a larger cluster, and one
    cluster swallowing the pool all lower it. ``score_min``: the worst planted class.
    """
    planted = range(info.num_known, info.num_known + info.num_novel)
    f1 = planted_f1(y_novel, pred_novel, planted)
    return {"score": float(np.mean(list(f1.values()))), "score_min": float(min(f1.values()))}


#: what an activation cache's metadata says about its encoder; kept in a validation problem made from one
CACHE_KEYS = ("kind", "encoder", "pretrained", "image_size", "cached_blocks", "shape", "views", "crop_scale", "seed",
              "photometric", "dataset")


def build_validation_table(source_uri: str, out_uri: str, cfg: ValidationConfig = ValidationConfig(),
                           num_novel: int | None = None, *, planted: bool = False) -> ValidationSplit:
    """Write the validation feature table of ``source_uri`` (:func:`validation_splits`, or :func:`planted_splits`
    when ``planted``) to ``out_uri``.

    Args:
        source_uri: feature table (local or s3://) with ``embedding``, ``label``, ``split``; only its ``known``
            rows are read (a parquet filter), and with ``planted`` its ``novel`` rows too: the reader checks
            their label column's range with the rest of the row, and the labels are then replaced by a placeholder
            before anything uses them (no novel label reaches the problem or the written table).
        out_uri: where to write the validation table (same format; splits ``known``, ``novel``, ``val``).
        num_novel: Ku of the real problem (for γ transfer, and the real rows' clusters when planted); default
            from the source table's metadata.

    Raises:
        FeatureTableError naming the table: every check of :func:`ncdlr.data.features.read_feature_table` on the
        rows read (missing columns, no known rows — or no novel rows when planted —, bad embeddings or labels),
        those of :func:`validation_splits` / :func:`planted_splits`, or no Ku available. Storage errors for a
        missing table.
    """
    cfg.check()
    source = read_feature_table(source_uri, splits=("known", "novel") if planted else ("known",))
    if planted:  # the pool's rows are needed, their labels never: gone before anything else runs
        source.labels["novel"] = torch.full_like(source.labels["novel"], -1)
    if num_novel is None:
        if "num_novel" not in source.metadata:
            raise FeatureTableError(f"feature table {source_uri!r} has no 'num_novel' in its metadata; give the "
                                    f"number of novel classes (e.g. from `ncdlr estimate-k`)")
        num_novel = int(source.metadata["num_novel"])
    build = planted_splits if planted else validation_splits
    validation, info = build(source, cfg, num_novel, source=source_uri)
    names = ("known", "novel", SCORING_SPLIT)
    if validation.is_activations:  # one part, every split (all known rows: same views), the cache's metadata
        views = {s: validation.views("known") for s in names}
        write_table_part(out_uri, torch.cat([validation.features[s] for s in names]).numpy(),
                         torch.cat([validation.labels[s] for s in names]).numpy(),
                         sum(([s] * len(validation.labels[s]) for s in names), []),
                         source_ids=sum((validation.source_ids[s] for s in names), []),
                         class_names=validation.class_names,
                         metadata={**validation.metadata, "views": views, "num_known": validation.num_known,
                                   "num_novel": validation.num_novel})
        return info
    write_feature_table(out_uri, torch.cat([validation.features[s] for s in names]).numpy(),
                        torch.cat([validation.labels[s] for s in names]).numpy(),
                        sum(([s] * len(validation.labels[s]) for s in names), []),
                        num_known=validation.num_known, num_novel=validation.num_novel,
                        class_names=validation.class_names,
                        source_ids=sum((validation.source_ids[s] for s in names), []), extra=validation.metadata)
    return info


def validation_scores(y_true: np.ndarray, y_pred: np.ndarray, num_known: int,
                      train_counts: Sequence[int]) -> dict[str, float]:
    """The score of a run on the validation problem, from its predictions ``[n]`` of the ``val`` rows ``[n]``.

    ``score`` = class-mean accuracy over the pseudo-novel classes after one Hungarian matching over all classes
    (``cluster_accuracy(...)["novel"]``); ``score_head/medium/tail`` its parts by training count; ``val_all``,
    ``val_known``, ``val_novel_inst`` (instance accuracy) for context.
    """
    acc = cluster_accuracy(y_true, y_pred, num_known, list(train_counts))
    return {"score": acc["novel"], "score_head": acc["novel_head"], "score_medium": acc["novel_medium"],
            "score_tail": acc["novel_tail"], "val_all": acc["all"], "val_known": acc["known"],
            "val_novel_inst": acc["novel_inst"]}


def read_validation_split(uri: str) -> ValidationSplit:
    """The :class:`ValidationSplit` stored in a validation table's metadata (errors name the URI)."""
    meta = read_metadata(uri)
    if "validation" not in meta:
        raise ValueError(f"{uri!r} is not a validation table (no 'validation' entry in its metadata)")
    return ValidationSplit(**meta["validation"])
