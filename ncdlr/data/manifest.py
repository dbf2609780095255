"""``manifest.json``: what a prepared dataset holds, and the proof that its shards are whole.

A prepared dataset is a directory (local or ``s3://bucket/prefix``) of parquet shards plus one
``manifest.json`` written LAST by ``ncdlr.data.shards.write_dataset``; a directory without a manifest (a build
that crashed or is still running) is not a dataset. Format version 1::

    {
      "format_version": 1,
      "name": "inat18-1k", "source": "iNaturalist 2018 (train2018.json/val2018.json)", "seed": 0,
      "classes": [{"label": 0, "name": "...", "group": "known", "train_count": 1000}, ...],   # label order
      "num_known": 500, "num_novel": 500,
      "imbalance": {"known": 100.0, "novel": 100.0},
      "split_counts": {"known": 12000, "novel": 11000, "test": 3000},
      "shards": [{"path": "shards/known/part-00000.parquet", "split": "known", "rows": 4211,
                  "sha256": "...", "bytes": 134217728}, ...],
      "created_by": "ncdlr 0.1.0", "created_at": "2026-11-26T01:00:00Z",
      "extra": {}
    }

Shard paths are relative to the dataset directory; each shard holds the rows of one split. Readers refuse
any other ``format_version``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import pyarrow.fs as pafs

from ncdlr.data.records import GROUPS, SPLITS, ClassInfo
from ncdlr.data.storage import ObjectNotFoundError, join, resolve, with_retries

FORMAT_VERSION = 1
MANIFEST_NAME = "manifest.json"


class DatasetFormatError(ValueError):
    """A manifest or shard of a prepared dataset is invalid; the message names the file."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


@dataclass(frozen=True)
class DatasetInfo:
    """What a builder knows about its dataset beyond the classes and the images."""

    name: str  # e.g. "inat18-1k", "cifar100-lt-50-100", "openclipart"
    source: str  # where the images came from (release name, paths)
    seed: int  # seed of the class draw / subsampling
    imbalance: dict[str, float] = field(default_factory=dict)  # e.g. {"known": 100.0, "novel": 100.0}
    extra: dict[str, Any] = field(default_factory=dict)  # builder-specific, JSON-serialisable


@dataclass(frozen=True)
class ShardInfo:
    path: str  # relative to the dataset directory
    rows: int
    sha256: str  # hex digest of the whole parquet file
    bytes: int  # file size
    split: str  # every row of the shard belongs to this split


@dataclass(frozen=True)
class Manifest:
    name: str
    source: str
    seed: int
    classes: tuple[ClassInfo, ...]  # label order
    num_known: int  # Ks
    num_novel: int  # Ku
    imbalance: dict[str, float]
    split_counts: dict[str, int]
    shards: tuple[ShardInfo, ...]
    created_by: str
    created_at: str
    extra: dict[str, Any] = field(default_factory=dict)
    format_version: int = FORMAT_VERSION

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    @property
    def class_names(self) -> list[str]:
        return [c.name for c in self.classes]

    @property
    def train_counts(self) -> list[int]:
        """Training images per class in label order (the long-tail profile ``n_k``)."""
        return [c.train_count for c in self.classes]

    @property
    def num_rows(self) -> int:
        return sum(s.rows for s in self.shards)

    def to_json(self) -> str:
        data = asdict(self)
        data = {"format_version": data.pop("format_version"), **data}
        return json.dumps(data, indent=1, sort_keys=False) + "\n"

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], path: str) -> Manifest:
        """Parse and validate a manifest dict; every error names ``path``."""
        if not isinstance(data, Mapping):
            raise DatasetFormatError(path, "manifest is not a JSON object")
        version = data.get("format_version")
        if version != FORMAT_VERSION:
            raise DatasetFormatError(
                path, f"unsupported manifest format_version {version!r} (this ncdlr reads {FORMAT_VERSION})")
        required = ("name", "source", "seed", "classes", "num_known", "num_novel", "imbalance",
                    "split_counts", "shards", "created_by")
        missing = [key for key in required if key not in data]
        if missing:
            raise DatasetFormatError(path, f"manifest lacks key(s) {missing}")
        try:
            classes = tuple(ClassInfo(**c) for c in data["classes"])
            shards = tuple(ShardInfo(**s) for s in data["shards"])
            manifest = cls(
                name=str(data["name"]), source=str(data["source"]), seed=int(data["seed"]), classes=classes,
                num_known=int(data["num_known"]), num_novel=int(data["num_novel"]),
                imbalance={str(k): float(v) for k, v in dict(data["imbalance"]).items()},
                split_counts={str(k): int(v) for k, v in dict(data["split_counts"]).items()},
                shards=shards, created_by=str(data["created_by"]), created_at=str(data.get("created_at", "")),
                extra=dict(data.get("extra", {})), format_version=int(version),
            )
        except (TypeError, ValueError) as exc:
            raise DatasetFormatError(path, f"malformed manifest: {exc}") from exc
        problem = manifest.problem()
        if problem:
            raise DatasetFormatError(path, problem)
        return manifest

    def problem(self) -> str | None:
        """A description of the first inconsistency, or ``None`` when the manifest is self-consistent."""
        labels = [c.label for c in self.classes]
        if labels != list(range(len(labels))):
            return "classes are not in label order 0..K-1"
        groups = [c.group for c in self.classes]
        if groups != ["known"] * self.num_known + ["novel"] * self.num_novel:
            return f"classes must be {self.num_known} known then {self.num_novel} novel (num_known/num_novel)"
        if unknown := set(self.split_counts) - set(SPLITS):
            return f"unknown split(s) {sorted(unknown)} in split_counts"
        if sum(self.split_counts.values()) != self.num_rows:
            return f"split_counts sum to {sum(self.split_counts.values())} but the shards hold {self.num_rows} rows"
        for group in GROUPS:
            expected = sum(c.train_count for c in self.classes if c.group == group)
            if self.split_counts.get(group, 0) != expected:
                return (f"split {group!r} has {self.split_counts.get(group, 0)} rows but its classes' "
                        f"train_count sum to {expected}")
        if len({s.path for s in self.shards}) != len(self.shards):
            return "a shard is listed twice"
        for split in set(SPLITS):
            rows = sum(s.rows for s in self.shards if s.split == split)
            if rows != self.split_counts.get(split, 0):
                return f"shards of split {split!r} hold {rows} rows but split_counts says {self.split_counts.get(split, 0)}"
        return None


def manifest_uri(dataset_uri: str) -> str:
    return join(dataset_uri, MANIFEST_NAME)


def read_manifest(uri: str, endpoint_url: str | None = None) -> Manifest:
    """Read and validate ``<uri>/manifest.json``.

    Raises ``ObjectNotFoundError`` when there is no manifest (not a dataset, or an unfinished build),
    ``DatasetFormatError`` for an unknown ``format_version`` or a malformed manifest, and the other
    ``StorageError`` subclasses for storage problems; all name the manifest's URI.
    """
    fs, base = resolve(uri, endpoint_url)
    where = manifest_uri(uri)
    path = join(base, MANIFEST_NAME)

    def read() -> bytes:
        with fs.open_input_stream(path) as stream:
            return stream.read()

    try:
        raw = with_retries(read, where)
    except ObjectNotFoundError as exc:
        raise ObjectNotFoundError(where, "no manifest.json: not a prepared dataset, or its build did not finish "
                                  "(the manifest is written last)") from exc
    try:
        data = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DatasetFormatError(where, f"manifest is not valid JSON: {exc}") from exc
    return Manifest.from_dict(data, where)


def write_manifest(fs: pafs.FileSystem, base: str, manifest: Manifest, where: str) -> None:
    """Write ``manifest.json`` atomically: a temporary object then a rename on local disk; a single PUT
    (atomic by the S3 protocol) on object stores."""
    problem = manifest.problem()
    if problem:
        raise DatasetFormatError(where, problem)
    payload = manifest.to_json().encode()
    final = join(base, MANIFEST_NAME)

    def write() -> None:
        if isinstance(fs, pafs.LocalFileSystem):
            tmp = join(base, f".{MANIFEST_NAME}.tmp")
            with fs.open_output_stream(tmp) as out:
                out.write(payload)
            fs.move(tmp, final)
        else:
            with fs.open_output_stream(final) as out:
                out.write(payload)

    with_retries(write, where)
