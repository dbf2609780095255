"""ImageNet (ImageFolder layout) → ImageNet100-LT-R^s-R^u (method.md §1; ImageNet100-50-50 of the paper).

Source layout: ``root/train/<WNID>/*.JPEG`` and ``root/val/<WNID>/*.JPEG`` (the usual re-foldered ILSVRC-2012;
``.jpg``/``.jpeg``/``.png`` in any case are accepted). Only the 100 WNIDs of ``IMAGENET100_WNIDS`` are read —
the ImageNet-100 subset of the NCDLR authors' release (the sorted list in their ``data/Imagenet100.py``);
other folders under ``root`` are ignored. A listed WNID without its folder is an error naming the path.

Construction, as for CIFAR100-LT (``ncdlr.data.builders.cifar100``): classes split by
``split_known_novel(100, seed)``; labels in that order, which is the tail's rank order; class of rank
``c`` keeps ``floor(n_max · R^(-c/49))`` training images (``n_max`` = 1300, ImageNet's usual per-class
maximum), the first decodable ones of a seeded shuffle inside the class. A class with fewer images than
its target keeps all it has and is listed in the manifest's ``extra["short_classes"]`` (ImageNet classes
hold 732–1300 images, so this can hit the head classes; the paper's 16.5k known vs 16.2k novel at equal
R suggests the same). Test = every ``val`` image of the 100 classes (50 per class, 5.0k). Images are
copied byte for byte; undecodable files are skipped and reported (``extra["skipped_images"]``).
The authors sampled each image with probability ``R^(-c/49)`` (counts only in expectation) and used the
sorted order for known/novel; we follow method.md (seeded split, exact counts).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ncdlr.data.builders.common import (
    Plan,
    SkippedImage,
    SourceFormatError,
    SourceImage,
    check_decodable,
    class_table,
    long_tail_targets,
    progress_bar,
    shortfall_report,
    skip_report,
    split_order,
    subsample_order,
    take_decodable,
    write_plan,
)
from ncdlr.data.longtail import split_known_novel
from ncdlr.data.manifest import DatasetInfo, Manifest

IMAGE_SUFFIXES = {".jpeg", ".jpg", ".png"}

# ImageNet-100 as used by the NCDLR authors (kleinzcy/NCDLR, data/Imagenet100.py), sorted.
IMAGENET100_WNIDS: tuple[str, ...] = tuple(
    """
    n01558993 n01601694 n01669191 n01751748 n01755581 n01756291 n01770393 n01855672 n01871265 n02018207
    n02037110 n02058221 n02087046 n02088632 n02093256 n02093754 n02094114 n02096177 n02097130 n02097298
    n02099267 n02100877 n02104365 n02105855 n02106030 n02106166 n02107142 n02110341 n02114855 n02120079
    n02120505 n02125311 n02128385 n02133161 n02277742 n02325366 n02364673 n02484975 n02489166 n02708093
    n02747177 n02835271 n02906734 n02909870 n03085013 n03124170 n03127747 n03160309 n03255030 n03272010
    n03291819 n03337140 n03450230 n03483316 n03498962 n03530642 n03623198 n03649909 n03710721 n03717622
    n03733281 n03759954 n03775071 n03814639 n03837869 n03838899 n03854065 n03929855 n03930313 n03954731
    n03956157 n03983396 n04004767 n04026417 n04065272 n04200800 n04209239 n04235860 n04311004 n04325704
    n04336792 n04346328 n04380533 n04428191 n04443257 n04458633 n04483307 n04509417 n04515003 n04525305
    n04554684 n04591157 n04592741 n04606251 n07583066 n07613480 n07693725 n07711569 n07753592 n11879895
    """.split()
)


@dataclass(frozen=True)
class ImageNet100LTConfig:
    root: Path  # folder holding train/<WNID>/ and val/<WNID>/
    known_ratio: float = 50.0  # R^s of the known classes (paper: 50)
    novel_ratio: float = 50.0  # R^u of the novel classes (paper: 50 or 100)
    n_max: int = 1300  # images of each half's head class
    seed: int = 0  # seed of the class split and of the in-class shuffles
    verify: bool = True  # decode images before writing; undecodable ones are skipped and reported
    wnids: tuple[str, ...] = IMAGENET100_WNIDS  # the classes (tests use a shorter list)
    name: str = ""  # default "imagenet100-lt-<R^s>-<R^u>"


def list_images(folder: Path) -> list[Path]:
    """Image files directly inside ``folder``, sorted by name; a missing folder is a ``SourceFormatError``."""
    if not folder.is_dir():
        raise SourceFormatError(f"class folder {folder} does not exist")
    return sorted(p for p in folder.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file())


def plan(config: ImageNet100LTConfig, *, progress: bool = True) -> Plan:
    """List the class folders, subsample, check images: everything ``build`` writes, nothing written."""
    root = Path(config.root)
    if len(set(config.wnids)) != len(config.wnids) or len(config.wnids) < 2:
        raise ValueError(f"wnids must be at least 2 distinct WNIDs, got {len(config.wnids)}")
    known, novel = split_known_novel(len(config.wnids), config.seed)
    names = [config.wnids[i] for i in known + novel]  # label order
    targets = long_tail_targets(len(known), len(novel), config.n_max, config.known_ratio, config.novel_ratio)

    rows: list[SourceImage] = []
    skipped: list[SkippedImage] = []
    got: list[int] = []
    with progress_bar(len(names), "subsampling classes", progress, unit="class") as bar:
        for label, wnid in enumerate(names):
            split = "known" if label < len(known) else "novel"
            files = list_images(root / "train" / wnid)
            shuffled = [files[i] for i in subsample_order(len(files), config.seed, wnid)]
            candidates = [SourceImage(p, label, split, wnid, f"train/{wnid}/{p.name}") for p in shuffled]
            taken, bad = take_decodable(candidates, targets[label], verify=config.verify)
            rows += taken
            skipped += bad
            got.append(len(taken))
            bar.update()
    test = [
        SourceImage(p, label, "test", wnid, f"val/{wnid}/{p.name}")
        for label, wnid in enumerate(names)
        for p in list_images(root / "val" / wnid)
    ]
    if config.verify:
        test, bad = check_decodable(test, progress=progress, desc="checking val images")
        skipped += bad
    rows += test
    classes = class_table(names, len(known), (r.label for r in rows if r.split != "test"))
    info = DatasetInfo(
        name=config.name or f"imagenet100-lt-{config.known_ratio:g}-{config.novel_ratio:g}",
        source=f"ImageNet (ImageFolder train/ val/) at {root}",
        seed=config.seed,
        imbalance={"known": float(config.known_ratio), "novel": float(config.novel_ratio)},
        extra={
            "n_max": config.n_max,
            "profile": "floor(n_max * R^(-c/(C_half-1))), rank c = label order inside each half",
            "short_classes": shortfall_report(names, targets, got),
            "skipped_images": skip_report(skipped),
        },
    )
    return Plan(classes=classes, rows=split_order(rows, config.seed), info=info, skipped=skipped)


def build(config: ImageNet100LTConfig, out_uri: str, *, progress: bool = True, **write_options: Any) -> Manifest:
    """Prepare ImageNet100-LT under ``out_uri`` (local path or ``s3://``); returns the written manifest.

    ``write_options`` go to ``common.write_plan`` (``overwrite``, ``endpoint_url``, ``target_shard_bytes``).
    """
    return write_plan(plan(config, progress=progress), out_uri, progress=progress, **write_options)
