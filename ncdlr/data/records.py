"""The two records every dataset builder produces: one ``ClassInfo`` per class, one ``ImageRecord`` per image.

They are the contract between the builders (``ncdlr.data.builders``) and the shard writer
(``ncdlr.data.shards.write_dataset``); the parquet columns and the manifest's ``classes`` list mirror them.
"""

from __future__ import annotations

from dataclasses import dataclass

SPLITS: tuple[str, ...] = ("known", "novel", "val", "test")
"""Split names in a prepared dataset: the labelled known-class training set, the unlabelled novel-class
training set, and the evaluation splits (which hold images of both groups)."""

GROUPS: tuple[str, ...] = ("known", "novel")


def checked_splits(names) -> list[str]:
    """``names`` as a list, refusing any that is not one of :data:`SPLITS` (``ValueError`` naming them)."""
    names = list(names)
    if unknown := [s for s in names if s not in SPLITS]:
        raise ValueError(f"unknown split(s) {unknown}; splits are {SPLITS}")
    return names


@dataclass(frozen=True)
class ClassInfo:
    """One class of a prepared dataset.

    ``label`` is ``0..Ks-1`` for known classes and ``Ks..K-1`` for novel ones; ``train_count`` is the number
    of images of the class in its training split (``known`` or ``novel``), i.e. the long-tail profile.
    """

    label: int  # known 0..Ks-1, novel Ks..K-1
    name: str
    group: str  # "known" | "novel"
    train_count: int  # images of this class in the known/novel training split

    def __post_init__(self) -> None:
        if self.group not in GROUPS:
            raise ValueError(f"ClassInfo {self.name!r}: group must be one of {GROUPS}, got {self.group!r}")
        if self.label < 0 or self.train_count < 0:
            raise ValueError(f"ClassInfo {self.name!r}: label and train_count must be >= 0")


@dataclass(frozen=True)
class ImageRecord:
    """One image with its label and split; ``image`` holds the encoded bytes exactly as in the source."""

    image: bytes  # encoded JPEG/PNG exactly as in the source
    label: int
    split: str  # "known" | "novel" | "val" | "test"
    class_name: str
    source_id: str  # stable id (e.g. the iNat image id or the relative path)

    def __post_init__(self) -> None:
        if self.split not in SPLITS:
            raise ValueError(f"ImageRecord {self.source_id!r}: split must be one of {SPLITS}, got {self.split!r}")
