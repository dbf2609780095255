"""The known-class validation split used to tune γ and α without ever looking at novel labels.

Protocol (what ``tuning/gamma_search.py`` scores a trial on):

1. Only the rows of the **known** split of a feature table are read (``split == "known"``); the novel split,
   its labels and any val/test rows are never loaded.
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

The score of a run on this table is the class-mean accuracy over the pseudo-novel classes of ``val``
(``cluster_accuracy(...)["novel"]``: one Hungarian matching over all classes, task-agnostic).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ncdlr.metrics import head_medium_tail

from .embed import METADATA_KEY, open_feature_table, write_feature_table

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
            raise ValueError(f"pseudo_novel_fraction must be in (0, 1), got {self.pseudo_novel_fraction}")
        if not 0.0 < self.holdout_fraction < 1.0:
            raise ValueError(f"holdout_fraction must be in (0, 1), got {self.holdout_fraction}")
        if self.min_pseudo_novel < 2:
            raise ValueError(f"min_pseudo_novel must be at least 2, got {self.min_pseudo_novel}")


@dataclass(frozen=True)
class ValidationSplit:
    """What :func:`build_validation_table` wrote (also stored in the table's metadata under ``validation``).

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

    @property
    def num_known(self) -> int:
        return len(self.pseudo_known)

    @property
    def num_novel(self) -> int:
        return len(self.pseudo_novel)


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


def _read_known_rows(uri: str) -> tuple[pa.Table, dict]:
    """The ``known`` rows of a feature table (``embedding``, ``label``, optional ``source_id``) and its metadata."""
    fs, path, schema = open_feature_table(uri)
    columns = ["embedding", "label"] + (["source_id"] if "source_id" in schema.names else [])
    table = pq.read_table(path, filesystem=fs, columns=columns, filters=[("split", "==", "known")])
    meta = {}
    if schema.metadata and METADATA_KEY in schema.metadata:
        meta = json.loads(schema.metadata[METADATA_KEY])
    if table.num_rows == 0:
        raise ValueError(f"feature table {uri!r} has no rows with split 'known'")
    return table, meta


def build_validation_table(source_uri: str, out_uri: str, cfg: ValidationConfig = ValidationConfig(),
                           num_novel: int | None = None) -> ValidationSplit:
    """Write the pseudo-known / pseudo-novel validation feature table of ``source_uri`` to ``out_uri``.

    Args:
        source_uri: feature table (local or s3://) with ``embedding``, ``label``, ``split``.
        out_uri: where to write the validation table (same format; splits ``known``, ``novel``, ``val``).
        num_novel: Ku of the real problem (for γ transfer); default from the source table's metadata.

    Raises:
        ValueError naming the table: missing columns, no known rows, too few known classes, duplicate
        ``source_id`` values among the known rows, or no Ku available.
    """
    cfg.check()
    table, meta = _read_known_rows(source_uri)
    labels = table.column("label").to_numpy().astype(np.int64)
    num_known = int(meta.get("num_known", labels.max() + 1))
    if labels.min() < 0 or labels.max() >= num_known:
        raise ValueError(f"feature table {source_uri!r}: known labels must lie in 0..Ks-1 (Ks={num_known}), "
                         f"found {int(labels.min())}..{int(labels.max())}")
    if num_novel is None:
        if "num_novel" not in meta:
            raise ValueError(f"feature table {source_uri!r} has no 'num_novel' in its metadata; give the number of "
                             f"novel classes (e.g. from `ncdlr estimate-k`)")
        num_novel = int(meta["num_novel"])
    if "source_id" in table.column_names:
        source_ids = np.asarray(table.column("source_id").to_pylist(), dtype=object)
        unique, counts = np.unique(source_ids.astype(str), return_counts=True)
        if (counts > 1).any():
            raise ValueError(f"feature table {source_uri!r}: source_id values repeat among the known rows "
                             f"(e.g. {unique[counts > 1][:3].tolist()}); an image may be used only once")
    else:
        source_ids = np.asarray([f"row-{i}" for i in range(len(labels))], dtype=object)

    counts = np.bincount(labels, minlength=num_known)
    present = np.flatnonzero(counts > 0)
    chosen = choose_pseudo_novel(counts[present].tolist(), cfg.pseudo_novel_fraction, cfg.seed, cfg.min_pseudo_novel)
    pseudo_novel = sorted(int(present[i]) for i in chosen)
    pseudo_known = [int(c) for c in present if int(c) not in set(pseudo_novel)]
    new_label = np.full(num_known, -1, dtype=np.int64)
    new_label[pseudo_known] = np.arange(len(pseudo_known))
    new_label[pseudo_novel] = len(pseudo_known) + np.arange(len(pseudo_novel))

    scoring = holdout_mask(labels, cfg.holdout_fraction, cfg.seed + 1)
    is_novel = np.isin(labels, pseudo_novel)
    split = np.where(scoring, SCORING_SPLIT, np.where(is_novel, "novel", "known"))
    emb = table.column("embedding").combine_chunks()
    x = np.asarray(emb.flatten().to_numpy(zero_copy_only=False), dtype=np.float32).reshape(len(labels), -1)
    names = meta.get("class_names") or [str(i) for i in range(num_known)]
    split_counts = {s: int((split == s).sum()) for s in ("known", "novel", SCORING_SPLIT)}
    info = ValidationSplit(source=source_uri, pseudo_known=pseudo_known, pseudo_novel=pseudo_novel,
                           split_counts=split_counts, target_num_known=num_known, target_num_novel=num_novel,
                           config=asdict(cfg))
    write_feature_table(out_uri, x, new_label[labels], split, num_known=len(pseudo_known),
                        num_novel=len(pseudo_novel), class_names=[names[c] for c in pseudo_known + pseudo_novel],
                        source_ids=[str(s) for s in source_ids], extra={"validation": asdict(info)})
    return info


def read_validation_split(uri: str) -> ValidationSplit:
    """The :class:`ValidationSplit` stored in a validation table's metadata (errors name the URI)."""
    from ncdlr.data.storage import resolve

    fs, path = resolve(uri)
    schema = pq.read_schema(path, filesystem=fs)
    meta = json.loads(schema.metadata[METADATA_KEY]) if schema.metadata and METADATA_KEY in schema.metadata else {}
    if "validation" not in meta:
        raise ValueError(f"{uri!r} is not a validation table (no 'validation' entry in its metadata)")
    return ValidationSplit(**meta["validation"])
