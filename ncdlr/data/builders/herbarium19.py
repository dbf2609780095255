"""Herbarium 2019 (FGVC6) → Herbarium19: all 683 classes, natural long tail, 342 known / 341 novel.

Source layout (the Kaggle release, unpacked under ``root``)::

    root/train/metadata.json        root/train/<file_name>...
    root/validation/metadata.json   root/validation/<file_name>...

Each ``metadata.json`` is COCO-like (``images``, ``annotations``, ``categories``; see
``ncdlr.data.builders.coco``). A ``file_name`` is taken relative to the JSON's own folder, or to ``root``
if the first image is found there instead (copies of the release differ).

Split (method.md §1): the sorted category ids are split by ``ncdlr.data.longtail.split_known_novel(C,
seed)`` (a seeded permutation, first ``ceil(C/2)`` known); labels follow that permutation order (known
``0..Ks-1``, novel ``Ks..K-1``). Every training image of a known class → ``known``, of a novel class →
``novel`` (natural tail, nothing subsampled); every validation image → ``test`` (natural distribution,
as in the paper: 2.8k images). Paper sizes: 17.8k known, 16.5k novel images.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ncdlr.data.builders.coco import image_base, plan_coco, read_coco
from ncdlr.data.builders.common import Plan, SourceFormatError, write_plan
from ncdlr.data.longtail import split_known_novel
from ncdlr.data.manifest import DatasetInfo, Manifest

METADATA = "metadata.json"


@dataclass(frozen=True)
class Herbarium19Config:
    root: Path  # folder holding train/ and validation/
    seed: int = 0  # seed of the known/novel split (and of the row order)
    verify: bool = True  # decode every image before writing; undecodable ones are skipped and reported
    train_dir: str = "train"  # "small-train" for the resized release
    test_dir: str = "validation"  # "small-validation" for the resized release
    name: str = "herbarium19"


def plan(config: Herbarium19Config, *, progress: bool = True) -> Plan:
    """Read both metadata files, split the classes, check the files: everything ``build`` writes."""
    root = Path(config.root)
    if not root.is_dir():
        raise SourceFormatError(f"Herbarium19 root {root} is not a directory")
    train_dir, test_dir = root / config.train_dir, root / config.test_dir
    train = read_coco(train_dir / METADATA)
    test = read_coco(test_dir / METADATA, categories=train.categories)
    ordered = sorted(train.categories)
    known_idx, novel_idx = split_known_novel(len(ordered), config.seed)
    class_ids = [ordered[i] for i in known_idx + novel_idx]
    info = DatasetInfo(
        name=config.name,
        source=f"Herbarium 2019 FGVC6 ({config.train_dir}/ and {config.test_dir}/{METADATA}) at {root}",
        seed=config.seed,
        extra={"class_split": "split_known_novel over sorted category ids", "category_ids": class_ids},
    )
    return plan_coco(
        root=root,
        train=train,
        train_base=image_base(train, [train_dir, root]),
        test=test,
        test_base=image_base(test, [test_dir, root]),
        class_ids=class_ids,
        num_known=len(known_idx),
        info=info,
        verify=config.verify,
        progress=progress,
    )


def build(config: Herbarium19Config, out_uri: str, *, progress: bool = True, **write_options: Any) -> Manifest:
    """Prepare Herbarium19 under ``out_uri`` (local path or ``s3://``); returns the written manifest.

    ``write_options`` go to ``common.write_plan`` (``overwrite``, ``endpoint_url``, ``target_shard_bytes``).
    """
    return write_plan(plan(config, progress=progress), out_uri, progress=progress, **write_options)
