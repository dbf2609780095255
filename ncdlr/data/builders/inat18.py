"""iNaturalist 2018 → iNat18-1K / iNat18-2K (method.md §1): a seeded draw of N of its 8142 categories.

Source layout (the official release, unpacked under ``root``)::

    root/train2018.json   root/val2018.json   root/train_val2018/<supercategory>/<category id>/<hash>.jpg

``train2018.json``/``val2018.json`` are COCO-like (``images``, ``annotations``, ``categories``; see
``ncdlr.data.builders.coco``); ``file_name`` is relative to ``root``.

The class draw, and why both promises of method.md hold:
  1. sort the category ids of ``train2018.json`` and permute them once with
     ``numpy.random.RandomState(seed).permutation`` → ``π``;
  2. the N chosen classes are ``π[:N]``; known = ``π[:ceil(N/2)]`` (the first half), novel = the rest —
     the same ``ceil`` rule as ``ncdlr.data.longtail.split_known_novel`` (683 → 342 known);
  3. labels follow draw order: class ``π[i]`` gets label ``i``.
  Hence the 1K draw is a prefix of the 2K draw (``π[:1000]``), the 2K known set is exactly the 1K classes
  (``π[:1000]``, method.md: "the 2K known set should contain the 1K classes"), the 1K known half
  ``π[:500]`` lies inside the 2K known half, and a class has the same label in both datasets. The two
  statements do not conflict. With iNat's ids 0..8141 and seed 0 this is also the authors' draw
  (``np.random.seed(0); np.random.choice(8142, N, replace=False)``, which is ``permutation(8142)[:N]``).

Splits: every ``train2018.json`` image of a known class → ``known``, of a novel class → ``novel``
(natural long tail, nothing subsampled); every ``val2018.json`` image of a chosen class → ``test``
(≈3 per class). Paper sizes: iNat18-2K known 52.7k, novel 49.9k, test 6.0k; 1K: 26.3k / 26.4k / 3.0k.

Bad input: see ``ncdlr.data.builders.common`` (inconsistent JSON and missing files are errors naming the
id/path; undecodable JPEGs are skipped and reported in the manifest's ``extra["skipped_images"]``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ncdlr.data.builders.coco import image_base, plan_coco, read_coco
from ncdlr.data.builders.common import Plan, SourceFormatError, write_plan
from ncdlr.data.manifest import DatasetInfo, Manifest

TRAIN_JSON = "train2018.json"
TEST_JSON = "val2018.json"
NUM_CATEGORIES = 8142  # in the official release; any count works


@dataclass(frozen=True)
class Inat18Config:
    root: Path  # folder holding train2018.json, val2018.json and train_val2018/
    num_classes: int = 1000  # N: 1000 (iNat18-1K) or 2000 (iNat18-2K) in the paper; any 2 <= N <= categories
    seed: int = 0  # seed of the class permutation π (and of the row order)
    verify: bool = True  # decode every image before writing; undecodable ones are skipped and reported
    name: str = ""  # dataset name in the manifest; default "inat18-<N>"
    source: str = "iNaturalist 2018 (train2018.json / val2018.json)"


def draw_classes(category_ids: Iterable[int], num_classes: int, seed: int) -> tuple[list[int], list[int]]:
    """``(known_ids, novel_ids)``: ``π[:ceil(N/2)]`` and ``π[ceil(N/2):N]`` of the seeded permutation ``π``.

    ``π = sorted(category_ids)[RandomState(seed).permutation(C)]``; draws for different N from the same
    seed are prefixes of one another.
    """
    ordered = sorted(category_ids)
    if not 2 <= num_classes <= len(ordered):
        raise ValueError(f"num_classes must be in 2..{len(ordered)} (the categories available), got {num_classes}")
    permutation = np.random.RandomState(seed).permutation(len(ordered))
    chosen = [ordered[i] for i in permutation[:num_classes]]
    num_known = math.ceil(num_classes / 2)
    return chosen[:num_known], chosen[num_known:]


def plan(config: Inat18Config, *, progress: bool = True) -> Plan:
    """Read the JSON, draw the classes, check the files: everything ``build`` writes, nothing written."""
    root = Path(config.root)
    if not root.is_dir():
        raise SourceFormatError(f"iNat18 root {root} is not a directory")
    train = read_coco(root / TRAIN_JSON)
    test = read_coco(root / TEST_JSON, categories=train.categories)
    known, novel = draw_classes(train.categories, config.num_classes, config.seed)
    info = DatasetInfo(
        name=config.name or f"inat18-{config.num_classes}",
        source=f"{config.source} at {root}",
        seed=config.seed,
        extra={
            "class_draw": "sorted category ids permuted by numpy RandomState(seed); first N, first ceil(N/2) known",
            "category_ids": known + novel,
            "source_categories": len(train.categories),
        },
    )
    return plan_coco(
        root=root,
        train=train,
        train_base=image_base(train, [root]),
        test=test,
        test_base=image_base(test, [root]),
        class_ids=known + novel,
        num_known=len(known),
        info=info,
        verify=config.verify,
        progress=progress,
    )


def build(config: Inat18Config, out_uri: str, *, progress: bool = True, **write_options: Any) -> Manifest:
    """Prepare iNat18-N under ``out_uri`` (local path or ``s3://``); returns the written manifest.

    ``write_options`` go to ``common.write_plan`` (``overwrite``, ``endpoint_url``, ``target_shard_bytes``).
    """
    return write_plan(plan(config, progress=progress), out_uri, progress=progress, **write_options)
