"""Fashion-MNIST (IDX release) → Fashion-MNIST-LT: a real image set with few classes and many images per class.

Source: ``apt-get install dataset-fashion-mnist`` → ``/usr/share/datasets/fashion-mnist/`` (or the official
release): ``train-images-idx3-ubyte[.gz]``, ``train-labels-idx1-ubyte[.gz]``, ``t10k-images-idx3-ubyte[.gz]``,
``t10k-labels-idx1-ubyte[.gz]``. IDX files are big-endian: a magic number (``0x00000803`` for a uint8 3-d
array, ``0x00000801`` for a uint8 1-d array), the dimension sizes as uint32, then the raw bytes. Images are 28×28
grayscale, 6000 training and 1000 test images in each of 10 classes.

Construction (as ``cifar100``, method.md §1):
  - classes 0..9 are split by ``ncdlr.data.longtail.split_known_novel(10, seed)``; labels follow its order,
    which is also the rank order of the tail;
  - class of rank ``c`` keeps ``floor(n_max · R^(-c/4))`` training images, the first of a seeded shuffle inside
    the class. Defaults n_max = 1000, R^s = R^u = 50: 1000 / 376 / 141 / 53 / 20 per half, 1590 + 1590 rows;
  - test = the whole official test set (10k, 1000 per class): unlike OpenClipart-LT's 3–30 test images per
    tail class, the split resolves a class-mean accuracy to about half a point (binomial SE, measured).

Why this set: OpenClipart-LT has 43 classes and about 100 training images per class. This one has 10 classes
and 320 per class on average (up to 1000), a second real set whose test split is not the limit.

Each image is stored as a lossless grayscale PNG (``image`` decodes to exactly the source pixels; the
pipeline's RGB decode repeats the channel).
"""

from __future__ import annotations

import gzip
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ncdlr.data.builders.common import (
    Plan,
    SourceFormatError,
    class_table,
    long_tail_info,
    long_tail_targets,
    pick_long_tail,
    progress_bar,
    split_order,
    write_plan,
)
from ncdlr.data.images import encode_png
from ncdlr.data.longtail import split_known_novel
from ncdlr.data.manifest import Manifest
from ncdlr.data.records import ImageRecord

DEFAULT_ROOT = Path("/usr/share/datasets/fashion-mnist")
CLASS_NAMES = ("t-shirt/top", "trouser", "pullover", "dress", "coat", "sandal", "shirt", "sneaker", "bag",
               "ankle boot")  # the release's label order (its README)
IMAGE_MAGIC, LABEL_MAGIC = 0x00000803, 0x00000801
SIDE = 28
FILES = {"train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
         "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")}


@dataclass(frozen=True)
class FashionMnistLTConfig:
    root: Path = DEFAULT_ROOT  # folder holding the four IDX files (gzipped or not)
    known_ratio: float = 50.0  # R^s = n_max / n_min of the known classes
    novel_ratio: float = 50.0  # R^u of the novel classes
    n_max: int = 1000  # training images of each half's head class (the release has 6000 per class)
    seed: int = 0  # seed of the class split and of the in-class shuffles
    name: str = ""  # default "fashion-mnist-lt-<R^s>-<R^u>"


def _find(root: Path, stem: str) -> Path:
    for name in (stem + ".gz", stem):
        if (root / name).is_file():
            return root / name
    raise SourceFormatError(f"{root / stem}[.gz] does not exist (install the release with: "
                            "apt-get install dataset-fashion-mnist)")


def read_idx(path: Path, magic: int, ndim: int) -> np.ndarray:
    """The uint8 array of one IDX file (gzipped or raw), its header validated: ``[N]`` labels or ``[N, 28, 28]``."""
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as handle:
            data = handle.read()
    except (OSError, EOFError) as exc:  # gzip.BadGzipFile is an OSError; a cut-off gzip stream is an EOFError
        raise SourceFormatError(f"{path}: cannot read ({exc})") from exc
    header = 4 + 4 * ndim
    found = struct.unpack(">I", data[:4])[0] if len(data) >= 4 else None
    if found != magic:
        got = "no magic number" if found is None else f"IDX magic {found:#010x}"
        raise SourceFormatError(f"{path}: {got}, expected {magic:#010x} (uint8, {ndim}-d)")
    if len(data) < header:
        raise SourceFormatError(f"{path}: {len(data)} bytes, shorter than its IDX header ({header})")
    shape = struct.unpack(f">{ndim}I", data[4:header])
    if len(data) - header != int(np.prod(shape)):
        raise SourceFormatError(f"{path}: header says {shape} = {int(np.prod(shape))} bytes, "
                                f"the file holds {len(data) - header}")
    return np.frombuffer(data, dtype=np.uint8, offset=header).reshape(shape)


def read_split(root: Path, split: str) -> tuple[np.ndarray, np.ndarray]:
    """``(pixels [N, 28, 28] uint8, labels [N] int64)`` of ``"train"`` or ``"test"``, validated."""
    images_path, labels_path = (_find(Path(root), stem) for stem in FILES[split])
    pixels = read_idx(images_path, IMAGE_MAGIC, 3)
    labels = read_idx(labels_path, LABEL_MAGIC, 1).astype(np.int64)
    if pixels.shape[1:] != (SIDE, SIDE):
        raise SourceFormatError(f"{images_path}: images are {pixels.shape[1]}×{pixels.shape[2]}, expected {SIDE}×{SIDE}")
    if len(labels) != len(pixels):
        raise SourceFormatError(f"{labels_path}: {len(labels)} labels for the {len(pixels)} images of {images_path}")
    bad = labels[labels >= len(CLASS_NAMES)]
    if bad.size:
        raise SourceFormatError(f"{labels_path}: label {int(bad[0])} outside 0..{len(CLASS_NAMES) - 1}")
    return pixels, labels


def plan(config: FashionMnistLTConfig, *, progress: bool = True) -> Plan:
    """Read the IDX files, subsample, encode PNGs: everything ``build`` writes, in memory (≈ 10 MB at defaults)."""
    train_pixels, train_labels = read_split(config.root, "train")
    test_pixels, test_labels = read_split(config.root, "test")
    known, novel = split_known_novel(len(CLASS_NAMES), config.seed)
    order = known + novel  # source class id per label
    label_of = {source: label for label, source in enumerate(order)}
    names = [CLASS_NAMES[i] for i in order]
    targets = long_tail_targets(len(known), len(novel), config.n_max, config.known_ratio, config.novel_ratio)

    picked, got = pick_long_tail(train_labels, order, targets, config.seed)
    records: list[ImageRecord] = []
    with progress_bar(len(picked) + len(test_labels), "encoding fashion-mnist", progress) as bar:
        for i, label in picked:
            split = "known" if label < len(known) else "novel"
            records.append(ImageRecord(encode_png(train_pixels[i]), label, split, names[label], f"train/{i:05d}"))
            bar.update()
        for i, y in enumerate(test_labels):
            label = label_of[int(y)]
            records.append(ImageRecord(encode_png(test_pixels[i]), label, "test", names[label], f"test/{i:05d}"))
            bar.update()
    classes = class_table(names, len(known), (r.label for r in records if r.split != "test"))
    info = long_tail_info(config.name or f"fashion-mnist-lt-{config.known_ratio:g}-{config.novel_ratio:g}",
                          f"Fashion-MNIST IDX release at {config.root}", config.seed,
                          (config.known_ratio, config.novel_ratio), config.n_max, names, targets, got,
                          source_class_ids=order,
                          image_encoding="PNG, grayscale 28x28 (lossless; the source holds raw pixels)")
    return Plan(classes=classes, rows=split_order(records, config.seed), info=info)


def build(config: FashionMnistLTConfig, out_uri: str, *, progress: bool = True, **write_options: Any) -> Manifest:
    """Prepare Fashion-MNIST-LT under ``out_uri`` (local path or ``s3://``); returns the written manifest.

    ``write_options`` go to ``common.write_plan`` (``overwrite``, ``endpoint_url``, ``target_shard_bytes``).
    """
    return write_plan(plan(config, progress=progress), out_uri, progress=progress, **write_options)
