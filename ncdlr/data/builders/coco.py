"""Reader for the COCO-like classification JSON of iNaturalist 2018 and Herbarium 2019.

Both releases describe a split as one JSON object::

    {"images":      [{"id": 0, "file_name": "train_val2018/Plantae/7477/3b60c9486db1d2ee875f11a669fbde4a.jpg", ...}],
     "annotations": [{"id": 0, "image_id": 0, "category_id": 7477}],
     "categories":  [{"id": 7477, "name": "Lupinus arboreus", "supercategory": "Plantae", ...}]}

with one annotation per image. ``read_coco`` validates that shape and returns the labelled images; every
inconsistency is a ``SourceFormatError`` that names the JSON file and the offending id.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ncdlr.data.builders.common import (
    TRAIN_SPLITS,
    Plan,
    SkippedImage,
    SourceFormatError,
    SourceImage,
    check_decodable,
    class_table,
    natural_imbalance,
    require_files,
    skip_report,
    split_order,
)
from ncdlr.data.manifest import DatasetInfo

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CocoImage:
    image_id: int
    file_name: str  # as written in the JSON (relative to the release's root or to the JSON's folder)
    category_id: int


@dataclass(frozen=True)
class CocoSplit:
    json_path: Path
    categories: dict[int, str]  # category id -> name (the id as text when the release has no name)
    images: list[CocoImage]  # annotated images, in the JSON's image order
    unannotated: int  # images listed without an annotation (ignored)


def _load(json_path: Path) -> Mapping[str, Any]:
    if not json_path.is_file():
        raise SourceFormatError(f"{json_path} does not exist")
    try:
        with json_path.open("rb") as handle:
            data = json.load(handle)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise SourceFormatError(f"{json_path} is not valid JSON: {exc}") from exc
    if not isinstance(data, Mapping):
        raise SourceFormatError(f"{json_path}: top level is {type(data).__name__}, expected a JSON object")
    return data


def _entries(data: Mapping[str, Any], key: str, fields: tuple[str, ...], json_path: Path) -> list[Mapping[str, Any]]:
    entries = data.get(key)
    if not isinstance(entries, list):
        raise SourceFormatError(f"{json_path}: missing or non-list key {key!r}")
    for index, entry in enumerate(entries):
        if not isinstance(entry, Mapping) or any(f not in entry for f in fields):
            raise SourceFormatError(f"{json_path}: {key}[{index}] lacks one of the fields {list(fields)}: {entry!r}")
    return entries


def read_categories(json_path: Path) -> dict[int, str]:
    """Category id → name from the ``categories`` list of ``json_path``."""
    data = _load(json_path)
    return _categories(data, json_path)


def _categories(data: Mapping[str, Any], json_path: Path) -> dict[int, str]:
    categories: dict[int, str] = {}
    for entry in _entries(data, "categories", ("id",), json_path):
        category_id = int(entry["id"])
        if category_id in categories:
            raise SourceFormatError(f"{json_path}: category id {category_id} is listed twice")
        categories[category_id] = str(entry.get("name", category_id))
    if not categories:
        raise SourceFormatError(f"{json_path}: 'categories' is empty")
    return categories


def read_coco(json_path: Path, categories: Mapping[int, str] | None = None) -> CocoSplit:
    """Parse one split's JSON.

    Args:
        json_path: ``train2018.json``, ``val2018.json`` or a Herbarium ``metadata.json``.
        categories: the category table annotations must refer to (e.g. the training file's, when reading
            the validation file). ``None``: the file's own ``categories``.

    Raises:
        SourceFormatError: missing/invalid JSON or keys; duplicate image ids; an annotation whose
            ``image_id`` is not among the images, or whose ``category_id`` is not among the categories
            (the message names the category id); an image with two annotations.
    """
    data = _load(json_path)
    if categories is None:
        categories = _categories(data, json_path)
        category_source = f"the categories of {json_path}"
    else:
        category_source = "the training categories"
    file_names: dict[int, str] = {}
    for entry in _entries(data, "images", ("id", "file_name"), json_path):
        image_id = int(entry["id"])
        if image_id in file_names:
            raise SourceFormatError(f"{json_path}: image id {image_id} is listed twice")
        file_names[image_id] = str(entry["file_name"])
    labels: dict[int, int] = {}
    for entry in _entries(data, "annotations", ("image_id", "category_id"), json_path):
        image_id, category_id = int(entry["image_id"]), int(entry["category_id"])
        if image_id not in file_names:
            raise SourceFormatError(
                f"{json_path}: annotation {entry.get('id', '?')} refers to image id {image_id}, which is not "
                "in 'images'"
            )
        if category_id not in categories:
            raise SourceFormatError(
                f"{json_path}: annotation {entry.get('id', '?')} (image {image_id}) names category id "
                f"{category_id}, which is not among {category_source} ({len(categories)} categories)"
            )
        if image_id in labels:
            raise SourceFormatError(f"{json_path}: image id {image_id} has more than one annotation")
        labels[image_id] = category_id
    images = [CocoImage(i, name, labels[i]) for i, name in file_names.items() if i in labels]
    unannotated = len(file_names) - len(images)
    if unannotated:
        log.warning("%s: %d image(s) have no annotation and are ignored", json_path, unannotated)
    return CocoSplit(json_path=json_path, categories=dict(categories), images=images, unannotated=unannotated)


def image_base(split: CocoSplit, candidates: list[Path]) -> Path:
    """The folder that the split's ``file_name``s are relative to: the first candidate holding its first image.

    Releases differ (iNat: relative to the release root; Herbarium: relative to the JSON's folder in some
    copies, to the root in others), so the first image decides. No candidate holding it is a
    ``SourceFormatError`` naming every path tried.
    """
    if not split.images:
        return candidates[0]
    first = split.images[0].file_name
    for base in candidates:
        if (base / first).is_file():
            return base
    tried = ", ".join(str(base / first) for base in candidates)
    raise SourceFormatError(f"{split.json_path}: first image file not found (tried {tried})")


def unique_names(categories: Mapping[int, str], ids: list[int]) -> list[str]:
    """Names for ``ids`` in order; a name shared by several of them gets its id appended (``"x (id 7)"``)."""
    names = [categories[i] for i in ids]
    shared = {n for n in names if names.count(n) > 1}
    return [f"{n} (id {i})" if n in shared else n for n, i in zip(names, ids)]


def plan_coco(
    *,
    root: Path,
    train: CocoSplit,
    train_base: Path,
    test: CocoSplit,
    test_base: Path,
    class_ids: list[int],
    num_known: int,
    info: DatasetInfo,
    verify: bool = True,
    progress: bool = True,
) -> Plan:
    """Plan a natural-tail dataset: every training image of the chosen classes, test = the other split's.

    ``class_ids`` are category ids in label order (``num_known`` known first). Training images of known
    classes go to split ``known``, of novel classes to ``novel``; images of ``test`` of any chosen class
    to ``test``; images of other categories are left out. Missing files raise ``SourceFormatError``;
    undecodable ones are skipped (``verify``) and reported in ``info.extra["skipped_images"]``.
    """
    label_of = {category_id: label for label, category_id in enumerate(class_ids)}
    names = unique_names(train.categories, class_ids)

    def source_id(path: Path) -> str:
        return path.relative_to(root).as_posix() if path.is_relative_to(root) else path.as_posix()

    rows: list[SourceImage] = []
    for split, base, is_train in ((train, train_base, True), (test, test_base, False)):
        for image in split.images:
            label = label_of.get(image.category_id)
            if label is None:
                continue
            path = base / image.file_name
            group = "known" if label < num_known else "novel"
            rows.append(SourceImage(path, label, group if is_train else "test", names[label], source_id(path)))
    require_files(rows, f"{train.json_path} / {test.json_path}")
    skipped: list[SkippedImage] = []
    if verify:
        rows, skipped = check_decodable(rows, progress=progress, desc="checking images")
    classes = class_table(names, num_known, (r.label for r in rows if r.split in TRAIN_SPLITS))
    empty = [c.name for c in classes if c.train_count == 0]
    if empty:
        log.warning("%d chosen class(es) have no training image, e.g. %s", len(empty), empty[:3])
    extra = dict(info.extra)
    extra["skipped_images"] = skip_report(skipped)
    imbalance = info.imbalance or natural_imbalance(classes)
    info = replace(info, imbalance=imbalance, extra=extra)
    return Plan(classes=classes, rows=split_order(rows, info.seed), info=info, skipped=skipped)
