"""OpenClipart-LT: a real, offline, naturally long-tailed image set from Debian's ``openclipart-png``.

Source: ``apt-get install openclipart-png`` → ``/usr/share/openclipart/png/<area>/<topic>/.../<name>.png``
(public-domain clipart, RGBA PNGs; some entries are symlinks that file one drawing under several topics).

Classes: the first two folder levels, e.g. ``animals/birds`` (a file directly under ``animals/`` belongs to
the catch-all ``animals/_``). Dropped: the catch-all ``<area>/_`` of every area, the areas ``unsorted``,
``special``, ``logos`` and ``buttons`` (mixed content; ``computer/buttons`` is a real topic and stays),
then every class left with fewer than ``min_images`` (15) images.

Duplicates (``dedupe``, on by default): files with identical bytes are one drawing. Inside one class only
the first (by path) is kept; a drawing filed under two or more classes is dropped from all of them (its
label is ambiguous, and a copy in train with its twin in test would leak).

Measured on openclipart-png 1:0.18+dfsg-19 (6900 files + 1221 symlinks; 1822 in catch-all folders):
  - default (dedupe): 43 classes, 5243 images, tail 1540 → 15 (computer/icons … animals/dinosaurs);
    dropped 284 within-class copies and 671 files of drawings filed under two or more classes;
  - ``dedupe=False``: 45 classes, 6188 images, tail 1852 → 15 (the issue's "≈45 classes, ≈6.2k");
  - either way 4 files are skipped: 3 fully transparent, 1 over PIL's decompression-bomb limit (623 Mpx).
  Default build (seed 0, PNG, longer side ≤ 512): 22 known / 21 novel classes, 2047 known + 2142 novel
  training images, 1054 test; 88 MB of images; 4.5 min on 2 heavily shared cores (the ~20 drawings of
  10–170 Mpx dominate).

Images: decoded, cropped to the bounding box of their non-transparent pixels, shrunk so the longer side
is ≤ ``max_side`` (512 by default: training crops are ≤ 224 px, and a few source drawings are 16000 px
tall), flattened onto white (RGB), and encoded as PNG by default — clipart is
flat colour and hard edges, which PNG keeps exactly and JPEG rings around, and PNG is even the smaller
here (88 MB vs 97 MB for JPEG quality 95, 4:4:4, measured on the default build). An image that cannot
be decoded, or is fully transparent, is skipped and reported (``extra["skipped_images"]``).

Splits: classes (sorted by name) are split by ``ncdlr.data.longtail.split_known_novel(C, seed)``, labels
in that order. Inside each class a seeded shuffle holds out ``max(min_test, round(test_fraction · n))``
images as ``test`` (20 %, at least 3); the rest go to ``known``/``novel`` by the class's group.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import warnings
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from PIL import Image

from ncdlr.data.builders.common import (
    Plan,
    SkippedImage,
    SourceFormatError,
    class_hold_out,
    class_table,
    natural_imbalance,
    progress_bar,
    skip_report,
    split_order,
    write_plan,
)
from ncdlr.data.images import DECODE_ERRORS, clipart_to_rgb, encode, pixel_count
from ncdlr.data.longtail import split_known_novel
from ncdlr.data.manifest import DatasetInfo, Manifest
from ncdlr.data.records import ImageRecord

log = logging.getLogger(__name__)

DEFAULT_ROOT = Path("/usr/share/openclipart/png")
CATCH_ALL_AREAS = frozenset({"unsorted", "special", "logos", "buttons"})
CATCH_ALL_TOPIC = "_"  # files directly inside an area folder
BIG_IMAGE_PIXELS = 16_000_000


@dataclass(frozen=True)
class OpenClipartConfig:
    root: Path = DEFAULT_ROOT  # the openclipart-png tree
    seed: int = 0  # seed of the known/novel split and of the test hold-out
    min_images: int = 15  # classes with fewer images (after dedupe and skips) are dropped
    test_fraction: float = 0.2  # share of each class held out as test
    min_test: int = 3  # ...but at least this many
    image_format: str = "PNG"  # "PNG" (lossless, default) or "JPEG" (4:4:4 chroma)
    jpeg_quality: int = 95  # JPEG quality 1..95 (Pillow's scale); unused for PNG
    max_side: int = 512  # shrink so the longer side is at most this many pixels; 0 keeps the cropped size
    dedupe: bool = True  # drop byte-identical duplicates (see the module docstring)
    name: str = "openclipart"


@dataclass(frozen=True)
class ClipartFile:
    path: Path
    class_name: str  # "<area>/<topic>"
    source_id: str  # path relative to the root


def scan(root: Path) -> tuple[list[ClipartFile], int]:
    """Every ``.png`` (files and symlinks) under ``root`` outside the catch-all folders, sorted by path.

    Returns the files and how many were in catch-all folders.
    """
    if not root.is_dir():
        raise SourceFormatError(
            f"OpenClipart root {root} is not a directory (install it with: apt-get install openclipart-png)"
        )
    files: list[ClipartFile] = []
    catch_all = 0
    for folder, _, names in os.walk(root):
        for name in names:
            path = Path(folder) / name
            if path.suffix.lower() != ".png":
                continue
            parts = path.relative_to(root).parts
            area, topic = parts[0], (parts[1] if len(parts) > 2 else CATCH_ALL_TOPIC)
            if area in CATCH_ALL_AREAS or topic == CATCH_ALL_TOPIC:
                catch_all += 1
                continue
            files.append(ClipartFile(path, f"{area}/{topic}", path.relative_to(root).as_posix()))
    if not files:
        raise SourceFormatError(f"no PNG files in class folders under {root}")
    return sorted(files, key=lambda f: f.source_id), catch_all


def _read(file: ClipartFile) -> bytes:
    try:
        return file.path.read_bytes()
    except FileNotFoundError as exc:  # e.g. a dangling symlink
        raise SourceFormatError(f"image file {file.path} does not exist (or is a broken link)") from exc


def dedupe(files: list[ClipartFile], contents: list[bytes]) -> tuple[list[int], dict[str, int]]:
    """Indices of the files kept after dropping byte-identical duplicates, and what was dropped."""
    classes_of: dict[str, set[str]] = defaultdict(set)
    digests = [hashlib.sha256(data).hexdigest() for data in contents]
    for file, digest in zip(files, digests):
        classes_of[digest].add(file.class_name)
    kept, seen = [], set()
    dropped = {"within_class": 0, "across_classes": 0}
    for index, (file, digest) in enumerate(zip(files, digests)):
        if len(classes_of[digest]) > 1:
            dropped["across_classes"] += 1
        elif digest in seen:
            dropped["within_class"] += 1
        else:
            seen.add(digest)
            kept.append(index)
    return kept, dropped


def plan(config: OpenClipartConfig, *, progress: bool = True) -> Plan:
    """Scan, dedupe, re-encode, split: everything ``build`` writes, in memory (≈ 100 MB at full size)."""
    if config.image_format not in ("PNG", "JPEG"):
        raise ValueError(f"image_format must be 'PNG' or 'JPEG', got {config.image_format!r}")
    if not 1 <= config.jpeg_quality <= 95:
        raise ValueError(f"jpeg_quality must be in 1..95 (Pillow's scale; above 95 only grows files), "
                         f"got {config.jpeg_quality}")
    root = Path(config.root)
    files, catch_all = scan(root)
    workers = min(8, os.cpu_count() or 1)
    with ThreadPoolExecutor(workers) as pool:
        contents = list(pool.map(_read, files))
    dropped = {"within_class": 0, "across_classes": 0}
    if config.dedupe:
        kept, dropped = dedupe(files, contents)
        files, contents = [files[i] for i in kept], [contents[i] for i in kept]

    big_image = threading.Lock()  # a few drawings are ~10k x 16k px (0.7 GB as RGBA): decode those one at a time

    def convert(data: bytes) -> bytes | str:
        try:
            if pixel_count(data) > BIG_IMAGE_PIXELS:
                with big_image:
                    image = clipart_to_rgb(data, max_side=config.max_side)
            else:
                image = clipart_to_rgb(data, max_side=config.max_side)
        except DECODE_ERRORS as exc:
            return f"{type(exc).__name__}: {exc}"
        return encode(image, config.image_format, jpeg_quality=config.jpeg_quality)

    by_class: dict[str, list[tuple[ClipartFile, bytes]]] = defaultdict(list)
    skipped: list[SkippedImage] = []
    with (
        warnings.catch_warnings(),  # set once around the pool: the filter list is process-wide
        ThreadPoolExecutor(workers) as pool,
        progress_bar(len(files), "re-encoding clipart", progress) as bar,
    ):
        # A trusted package's big drawings (up to ~169 Mpx, under PIL's hard limit) are decoded on purpose.
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        for file, result in zip(files, pool.map(convert, contents)):
            if isinstance(result, str):
                log.warning("skipping %s: %s", file.source_id, result)
                skipped.append(SkippedImage(file.source_id, result))
            else:
                by_class[file.class_name].append((file, result))
            bar.update()

    small = {name: len(items) for name, items in by_class.items() if len(items) < config.min_images}
    class_names = sorted(name for name in by_class if name not in small)
    if len(class_names) < 2:
        raise SourceFormatError(f"{root}: only {len(class_names)} class(es) with >= {config.min_images} images")
    known, novel = split_known_novel(len(class_names), config.seed)
    names = [class_names[i] for i in known + novel]

    records: list[ImageRecord] = []
    for label, name in enumerate(names):
        items = by_class[name]
        group = "known" if label < len(known) else "novel"
        for index, is_test in class_hold_out(len(items), config.seed, name, config.test_fraction, config.min_test):
            file, data = items[index]
            records.append(ImageRecord(data, label, "test" if is_test else group, name, file.source_id))
    classes = class_table(names, len(known), (r.label for r in records if r.split != "test"))
    info = DatasetInfo(
        name=config.name,
        source=f"Debian openclipart-png at {root}",
        seed=config.seed,
        imbalance=natural_imbalance(classes),
        extra={
            "class_rule": "first two folder levels; catch-all folders dropped; classes < min_images dropped",
            "min_images": config.min_images,
            "test_rule": f"max({config.min_test}, round({config.test_fraction} * n)) per class, seeded",
            "dropped_catch_all": catch_all,
            "dropped_duplicates": dropped,
            "dropped_small_classes": small,
            "image_encoding": f"{config.image_format}"
            + (f" quality {config.jpeg_quality}" if config.image_format == "JPEG" else "")
            + "; cropped to content, flattened onto white"
            + (f", longer side <= {config.max_side}px" if config.max_side else ""),
            "skipped_images": skip_report(skipped),
        },
    )
    return Plan(classes=classes, rows=split_order(records, config.seed), info=info, skipped=skipped)


def build(config: OpenClipartConfig, out_uri: str, *, progress: bool = True, **write_options: Any) -> Manifest:
    """Prepare OpenClipart-LT under ``out_uri`` (local path or ``s3://``); returns the written manifest.

    ``write_options`` go to ``common.write_plan`` (``overwrite``, ``endpoint_url``, ``target_shard_bytes``).
    """
    return write_plan(plan(config, progress=progress), out_uri, progress=progress, **write_options)
