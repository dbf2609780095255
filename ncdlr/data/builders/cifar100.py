"""CIFAR-100 (python release) → CIFAR100-LT-R^s-R^u (method.md §1; CIFAR100-50-50 of the paper).

Source layout: ``root/cifar-100-python/{train,test,meta}`` (``root`` may also be the ``cifar-100-python``
folder itself). ``train``/``test`` are pickled dicts with ``b"data"`` (uint8 ``[N, 3072]``, each row the
R, G, B planes of a 32×32 image), ``b"fine_labels"`` and ``b"filenames"``; ``meta`` holds
``b"fine_label_names"``. They are read with an unpickler that only admits the NumPy array constructors,
so a tampered file cannot run code.

Construction:
  - classes 0..99 are split by ``ncdlr.data.longtail.split_known_novel(100, seed)``; labels follow its
    order, which is also the rank order of the tail (label 0 = known head, label 50 = novel head);
  - class of rank ``c`` keeps ``floor(n_max · R^(-c/49))`` images (``long_tail_counts``; ``n_max`` = 500,
    R = ``known_ratio`` for known, ``novel_ratio`` for novel) — the first ones of a seeded shuffle inside the
    class (``subsample_order``); counts are exact (every class has 500 training images);
  - test = the whole official test set (10k, balanced, both groups), as in the paper.
  Paper sizes reproduced: known 6369 images (R=50), novel 6369 (R=50) / 5499 (R=100).

The source holds raw pixels, not encoded images, so each image is stored as a lossless PNG (``image``
bytes decode to exactly the source pixels).
"""

from __future__ import annotations

import pickle
from collections.abc import Mapping
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
    split_order,
    write_plan,
)
from ncdlr.data.images import encode_png
from ncdlr.data.longtail import split_known_novel
from ncdlr.data.manifest import Manifest
from ncdlr.data.records import ImageRecord

RELEASE_DIR = "cifar-100-python"
NUM_CLASSES = 100
_ALLOWED_GLOBALS = {
    ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy", "ndarray"),
    ("numpy", "dtype"),
    ("_codecs", "encode"),
}


@dataclass(frozen=True)
class Cifar100LTConfig:
    root: Path  # folder holding cifar-100-python/ (or that folder itself)
    known_ratio: float = 50.0  # R^s = n_max / n_min of the known classes (paper: 50)
    novel_ratio: float = 50.0  # R^u of the novel classes (paper: 50 or 100)
    n_max: int = 500  # images of each half's head class (CIFAR-100 has 500 per class)
    seed: int = 0  # seed of the class split and of the in-class shuffles
    name: str = ""  # default "cifar100-lt-<R^s>-<R^u>"


class _ArrayUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in _ALLOWED_GLOBALS:
            raise pickle.UnpicklingError(f"global {module}.{name} is not allowed in a CIFAR pickle")
        return super().find_class(module, name)


def _load_pickle(path: Path) -> Mapping[bytes, Any]:
    if not path.is_file():
        raise SourceFormatError(f"{path} does not exist")
    try:
        with path.open("rb") as handle:
            data = _ArrayUnpickler(handle, encoding="bytes").load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, ImportError) as exc:
        raise SourceFormatError(f"{path} is not a CIFAR python pickle: {exc}") from exc
    if not isinstance(data, Mapping):
        raise SourceFormatError(f"{path}: expected a pickled dict, got {type(data).__name__}")
    return data


def _field(data: Mapping[bytes, Any], key: bytes, path: Path) -> Any:
    if key not in data:
        raise SourceFormatError(f"{path}: missing key {key.decode()!r}")
    return data[key]


def read_split(path: Path, num_classes: int) -> tuple[np.ndarray, np.ndarray]:
    """``(pixels [N, 32, 32, 3] uint8, fine labels [N] int64)`` of one CIFAR-100 pickle, validated."""
    data = _load_pickle(path)
    flat = np.asarray(_field(data, b"data", path))
    labels = np.asarray(_field(data, b"fine_labels", path), dtype=np.int64)
    if flat.dtype != np.uint8 or flat.ndim != 2 or flat.shape[1] != 3 * 32 * 32:
        raise SourceFormatError(f"{path}: 'data' must be uint8 [N, 3072], got {flat.dtype} {flat.shape}")
    if labels.shape != (flat.shape[0],):
        raise SourceFormatError(f"{path}: {labels.shape[0]} fine_labels for {flat.shape[0]} images")
    bad = labels[(labels < 0) | (labels >= num_classes)]
    if bad.size:
        raise SourceFormatError(f"{path}: fine label {int(bad[0])} outside 0..{num_classes - 1} (see meta)")
    return flat.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1), labels


def read_class_names(path: Path) -> list[str]:
    names = _field(_load_pickle(path), b"fine_label_names", path)
    return [n.decode() if isinstance(n, bytes) else str(n) for n in names]


def release_dir(root: Path) -> Path:
    root = Path(root)
    return root if (root / "meta").is_file() and not (root / RELEASE_DIR).is_dir() else root / RELEASE_DIR


def plan(config: Cifar100LTConfig, *, progress: bool = True) -> Plan:
    """Read the pickles, subsample, encode PNGs: everything ``build`` writes, in memory (≈ 25 MB)."""
    folder = release_dir(config.root)
    source_names = read_class_names(folder / "meta")
    if len(source_names) != NUM_CLASSES:
        raise SourceFormatError(f"{folder / 'meta'}: {len(source_names)} fine_label_names, expected {NUM_CLASSES}")
    train_pixels, train_labels = read_split(folder / "train", NUM_CLASSES)
    test_pixels, test_labels = read_split(folder / "test", NUM_CLASSES)

    known, novel = split_known_novel(NUM_CLASSES, config.seed)
    order = known + novel  # source class id per label
    label_of = {source: label for label, source in enumerate(order)}
    names = [source_names[i] for i in order]
    targets = long_tail_targets(len(known), len(novel), config.n_max, config.known_ratio, config.novel_ratio)

    picked, got = pick_long_tail(train_labels, order, targets, config.seed)
    records = [
        ImageRecord(encode_png(train_pixels[i]), label, "known" if label < len(known) else "novel", names[label],
                    f"train/{i:05d}")
        for i, label in picked
    ]
    records += [
        ImageRecord(encode_png(test_pixels[i]), label_of[int(y)], "test", names[label_of[int(y)]], f"test/{i:05d}")
        for i, y in enumerate(test_labels)
    ]
    classes = class_table(names, len(known), (r.label for r in records if r.split != "test"))
    info = long_tail_info(config.name or f"cifar100-lt-{config.known_ratio:g}-{config.novel_ratio:g}",
                          f"CIFAR-100 python release at {folder}", config.seed,
                          (config.known_ratio, config.novel_ratio), config.n_max, names, targets, got,
                          source_class_ids=order, image_encoding="PNG (lossless; the source holds raw pixels)")
    return Plan(classes=classes, rows=split_order(records, config.seed), info=info)


def build(config: Cifar100LTConfig, out_uri: str, *, progress: bool = True, **write_options: Any) -> Manifest:
    """Prepare CIFAR100-LT under ``out_uri`` (local path or ``s3://``); returns the written manifest.

    ``write_options`` go to ``common.write_plan`` (``overwrite``, ``endpoint_url``, ``target_shard_bytes``).
    """
    return write_plan(plan(config, progress=progress), out_uri, progress=progress, **write_options)
