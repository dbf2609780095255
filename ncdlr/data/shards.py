"""Write and verify prepared datasets: parquet shards of ``ImageRecord`` rows plus ``manifest.json``.

Shard columns (``SCHEMA``): ``image`` (binary, the source's encoded bytes), ``label`` (int32), ``split``,
``class_name``, ``source_id`` (strings). Every shard holds rows of ONE split (so a reader of ``test`` never
fetches training images) and is cut at ``target_shard_bytes`` of image payload (128 MiB by default: few
enough objects for S3, each read in row groups of ~16 MiB); it is stored as
``shards/<split>/part-NNNNN.parquet``. The image column is stored uncompressed (JPEG/PNG are compressed
already), the others with zstd. The manifest is written last (``ncdlr.data.manifest``), so an interrupted build leaves
no dataset that a reader accepts.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from ncdlr.data.manifest import (
    MANIFEST_NAME,
    DatasetFormatError,
    DatasetInfo,
    Manifest,
    ShardInfo,
    manifest_uri,
    read_manifest,
    write_manifest,
)
from ncdlr.data.records import SPLITS, ClassInfo, ImageRecord
from ncdlr.data.storage import join, put_bytes, resolve, with_retries, without_dir_markers

log = logging.getLogger(__name__)

SCHEMA = pa.schema([
    pa.field("image", pa.binary()),
    pa.field("label", pa.int32()),
    pa.field("split", pa.string()),
    pa.field("class_name", pa.string()),
    pa.field("source_id", pa.string()),
])
SHARD_DIR = "shards"
STAMP_NAME = "verified.json"  # next to the manifest: the shards whose SHA-256 was checked (``verify_with_stamp``)
STAMP_FORMAT = 1
REPREPARE = "re-prepare the dataset (`ncdlr prepare ... --overwrite`)"
DEFAULT_SHARD_BYTES = 128 * 1024**2
ROW_GROUP_BYTES = 16 * 1024**2  # a row group is the unit a reader decompresses/holds at once


def _created_by() -> str:
    try:
        from importlib.metadata import version

        return f"ncdlr {version('ncdlr')}"
    except Exception:  # noqa: BLE001 - not installed as a distribution
        return "ncdlr"


@dataclass
class _ShardBuffer:
    images: list[bytes] = field(default_factory=list)
    labels: list[int] = field(default_factory=list)
    splits: list[str] = field(default_factory=list)
    class_names: list[str] = field(default_factory=list)
    source_ids: list[str] = field(default_factory=list)
    nbytes: int = 0

    def add(self, r: ImageRecord) -> None:
        self.images.append(r.image)
        self.labels.append(r.label)
        self.splits.append(r.split)
        self.class_names.append(r.class_name)
        self.source_ids.append(r.source_id)
        self.nbytes += len(r.image)

    def table(self, rng: np.random.Generator) -> pa.Table:
        """The buffered rows in a seeded random order (a class-sorted source must not give class-sorted shards)."""
        table = pa.table([self.images, self.labels, self.splits, self.class_names, self.source_ids], schema=SCHEMA)
        return table.take(rng.permutation(table.num_rows))


def encode_shard(table: pa.Table) -> bytes:
    """Serialise one shard to parquet bytes (row groups of about ``ROW_GROUP_BYTES`` image payload)."""
    payload = max(1, sum(len(b) for b in table.column("image").to_pylist()) if table.num_rows else 1)
    rows_per_group = max(1, int(table.num_rows * ROW_GROUP_BYTES / payload))
    sink = io.BytesIO()
    pq.write_table(
        table, sink, row_group_size=rows_per_group,
        compression={"image": "NONE", "label": "ZSTD", "split": "ZSTD", "class_name": "ZSTD", "source_id": "ZSTD"},
        use_dictionary=["split", "class_name"],
    )
    return sink.getvalue()


def _check_classes(classes: Sequence[ClassInfo], where: str) -> None:
    if [c.label for c in classes] != list(range(len(classes))):
        raise ValueError(f"{where}: classes must be given in label order 0..K-1")
    groups = [c.group for c in classes]
    num_known = groups.count("known")
    if groups != ["known"] * num_known + ["novel"] * (len(groups) - num_known):
        raise ValueError(f"{where}: known classes (labels 0..Ks-1) must come before novel ones")


def _clear_previous(fs: pafs.FileSystem, base: str, uri: str, overwrite: bool) -> None:
    """Refuse to replace a finished dataset unless ``overwrite``; remove its manifest FIRST, then any shards
    and the verification stamp (so a crash from here on leaves a directory that no reader accepts). On S3 the
    deletes write no directory markers (``without_dir_markers``: the rclone server refuses them)."""
    fs = without_dir_markers(fs)
    info = fs.get_file_info(join(base, MANIFEST_NAME))
    if info.type != pafs.FileType.NotFound:
        if not overwrite:
            raise FileExistsError(f"{manifest_uri(uri)}: a prepared dataset exists here (pass overwrite=True)")
        with_retries(lambda: fs.delete_file(join(base, MANIFEST_NAME)), manifest_uri(uri))
    shard_dir = join(base, SHARD_DIR)
    if fs.get_file_info(shard_dir).type == pafs.FileType.Directory:
        with_retries(lambda: fs.delete_dir_contents(shard_dir, missing_dir_ok=True), join(uri, SHARD_DIR))
    if fs.get_file_info(join(base, STAMP_NAME)).type == pafs.FileType.File:
        with_retries(lambda: fs.delete_file(join(base, STAMP_NAME)), join(uri, STAMP_NAME))


def write_dataset(
    out_uri: str,
    records: Iterable[ImageRecord],
    classes: Sequence[ClassInfo],
    info: DatasetInfo,
    *,
    target_shard_bytes: int = DEFAULT_SHARD_BYTES,
    progress: bool = True,
    overwrite: bool = False,
    endpoint_url: str | None = None,
) -> Manifest:
    """Stream ``records`` into parquet shards under ``out_uri`` and write ``manifest.json`` last.

    Checks while writing (``ValueError`` naming the record's ``source_id``): labels in range, ``class_name``
    equal to its class's name, split valid, training rows in their class's group (known class → ``known``
    split), unique ``source_id``; and at the end, each class's ``train_count`` equals its rows in the training
    splits. An error anywhere leaves no manifest, so the directory is never taken for a dataset.

    Rows are permuted within each shard (seeded by ``info.seed``); builders should still yield records in a
    seeded random order, since a shard only mixes the records that arrive while it fills.

    Memory: up to one shard's rows per split (``target_shard_bytes`` each) plus one encoded shard.
    """
    _check_classes(classes, out_uri)
    fs, base = resolve(out_uri, endpoint_url)
    _clear_previous(fs, base, out_uri, overwrite)
    if isinstance(fs, pafs.LocalFileSystem):
        for split in SPLITS:
            fs.create_dir(join(base, SHARD_DIR, split), recursive=True)

    shards: list[ShardInfo] = []
    split_counts: Counter[str] = Counter()
    train_counts: Counter[int] = Counter()
    seen_ids: set[str] = set()
    buffers: dict[str, _ShardBuffer] = {}
    rng = np.random.default_rng(info.seed)
    shards_per_split: Counter[str] = Counter()

    def flush(split: str) -> None:
        buffer = buffers.pop(split, None)
        if buffer is None or not buffer.images:
            return
        rel = f"{SHARD_DIR}/{split}/part-{shards_per_split[split]:05d}.parquet"
        shards_per_split[split] += 1
        data = encode_shard(buffer.table(rng))

        def upload() -> None:
            with fs.open_output_stream(join(base, rel)) as out:
                out.write(data)

        with_retries(upload, join(out_uri, rel))
        shards.append(ShardInfo(path=rel, rows=len(buffer.images), sha256=hashlib.sha256(data).hexdigest(),
                                bytes=len(data), split=split))

    total = len(records) if isinstance(records, Sequence) else None
    bar = _progress(total, f"writing {out_uri}", enabled=progress)
    for record in records:
        if not 0 <= record.label < len(classes):
            raise ValueError(f"record {record.source_id!r}: label {record.label} outside 0..{len(classes) - 1}")
        cls = classes[record.label]
        if record.class_name != cls.name:
            raise ValueError(f"record {record.source_id!r}: class_name {record.class_name!r} but label "
                             f"{record.label} is {cls.name!r}")
        if record.split in ("known", "novel"):
            if record.split != cls.group:
                raise ValueError(f"record {record.source_id!r}: {cls.group} class {cls.name!r} in split "
                                 f"{record.split!r}")
            train_counts[record.label] += 1
        if record.source_id in seen_ids:
            raise ValueError(f"record {record.source_id!r}: duplicate source_id")
        seen_ids.add(record.source_id)
        split_counts[record.split] += 1
        buffer = buffers.setdefault(record.split, _ShardBuffer())
        buffer.add(record)
        bar.update(1)
        if buffer.nbytes >= target_shard_bytes:
            flush(record.split)
    for split in sorted(buffers):
        flush(split)
    bar.close()

    wrong = [(c.name, c.train_count, train_counts[c.label]) for c in classes if c.train_count != train_counts[c.label]]
    if wrong:
        raise ValueError(f"{out_uri}: ClassInfo.train_count disagrees with the rows written for "
                         f"{len(wrong)} class(es), e.g. (name, train_count, rows) = {wrong[:3]}")
    num_known = sum(c.group == "known" for c in classes)
    manifest = Manifest(
        name=info.name, source=info.source, seed=info.seed, classes=tuple(classes), num_known=num_known,
        num_novel=len(classes) - num_known, imbalance=dict(info.imbalance), split_counts=dict(split_counts),
        shards=tuple(shards), created_by=_created_by(),
        created_at=datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"), extra=dict(info.extra),
    )
    write_manifest(fs, base, manifest, manifest_uri(out_uri))
    log.info("%s: wrote %d rows in %d shard(s)", out_uri, manifest.num_rows, len(shards))
    return manifest


class _progress:
    """A tqdm bar when enabled (tqdm ships with Ray), else nothing; at most one refresh per 2 s."""

    def __init__(self, total: int | None, desc: str, enabled: bool) -> None:
        self._bar = None
        if enabled:
            from tqdm.auto import tqdm

            self._bar = tqdm(total=total, desc=desc, unit="img", mininterval=2.0, smoothing=0.1)

    def update(self, n: int) -> None:
        if self._bar is not None:
            self._bar.update(n)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


def check_shard(fs: pafs.FileSystem, path: str, shard: ShardInfo, where: str, *, checksum: bool) -> None:
    """Raise ``DatasetFormatError`` naming ``where`` unless the shard's size, row count, columns and (when
    ``checksum``) SHA-256 match the manifest. Without ``checksum`` only the parquet footer is read."""
    if checksum:
        def read() -> bytes:
            with fs.open_input_stream(path) as stream:
                return stream.read()

        data = with_retries(read, where)
        if len(data) != shard.bytes:
            raise DatasetFormatError(where, f"size {len(data)} bytes, manifest says {shard.bytes}")
        digest = hashlib.sha256(data).hexdigest()
        if digest != shard.sha256:
            raise DatasetFormatError(where, f"sha256 {digest[:16]}… disagrees with the manifest's "
                                            f"{shard.sha256[:16]}…: the shard is corrupt; {REPREPARE}")
        source: object = pa.BufferReader(data)
    else:
        size = with_retries(lambda: fs.get_file_info(path), where).size
        if size is None:
            raise DatasetFormatError(where, "shard listed in the manifest is missing")
        if size != shard.bytes:
            raise DatasetFormatError(where, f"size {size} bytes, manifest says {shard.bytes}")
        source = with_retries(lambda: fs.open_input_file(path), where)
    try:
        meta = pq.read_metadata(source)
    except (OSError, pa.ArrowInvalid) as exc:
        raise DatasetFormatError(where, f"not a readable parquet file: {exc}") from exc
    finally:
        source.close()
    if meta.num_rows != shard.rows:
        raise DatasetFormatError(where, f"{meta.num_rows} rows, manifest says {shard.rows}")
    missing = set(SCHEMA.names) - set(meta.schema.names)
    if missing:
        raise DatasetFormatError(where, f"shard lacks column(s) {sorted(missing)}")


def verify_dataset(uri: str, *, checksum: bool = True, endpoint_url: str | None = None) -> Manifest:
    """Read the manifest and check every shard against it (existence, size, row count, columns and, with
    ``checksum``, SHA-256 of the whole file). Returns the manifest; raises ``DatasetFormatError`` naming the
    first bad file, or ``ObjectNotFoundError`` for a missing one."""
    manifest = read_manifest(uri, endpoint_url)
    fs, base = resolve(uri, endpoint_url)
    started = time.monotonic()
    for shard in manifest.shards:
        where = join(uri, shard.path)
        if fs.get_file_info(join(base, shard.path)).type == pafs.FileType.NotFound:
            raise DatasetFormatError(where, "shard listed in the manifest is missing")
        check_shard(fs, join(base, shard.path), shard, where, checksum=checksum)
    log.info("%s: %d shard(s) verified in %.1fs", uri, len(manifest.shards), time.monotonic() - started)
    return manifest


def verify_with_stamp(uri: str, fs: pafs.FileSystem, base: str, shards: Sequence[ShardInfo]) -> list[ShardInfo]:
    """Check ``shards`` of the dataset at ``uri`` (``base`` inside ``fs``): SHA-256 once, then only the stamp.

    The stamp, ``<dataset>/verified.json``, records per shard path the size, modification time and SHA-256 of
    the bytes that were hashed. A shard whose listing (one ``get_file_info`` for all shards: a stat or an S3
    HEAD each) shows the stamped size and mtime, and whose stamped SHA-256 is the manifest's, is accepted
    without being read; any other is read and hashed in full (``check_shard``), and the stamp is rewritten
    with it. Rewriting a shard, locally or on S3 (objects are immutable), gives it a new mtime, so a changed
    shard is hashed again; a bit flipped on disk behind the filesystem's back is caught only by
    ``verify="checksum"``. A stamp that cannot be written (read-only bucket) is logged, and every run then
    hashes (as it does for a store that reports no mtime). Returns the shards hashed this time; raises
    ``DatasetFormatError`` naming the first bad shard and saying the dataset must be re-prepared.
    """
    started = time.monotonic()
    stamp_path = join(base, STAMP_NAME)
    stamped = _read_stamp(fs, stamp_path)
    infos = with_retries(lambda: fs.get_file_info([join(base, s.path) for s in shards]), uri)
    hashed = []
    for shard, info in zip(shards, infos):
        where = join(uri, shard.path)
        if info.type == pafs.FileType.NotFound:
            raise DatasetFormatError(where, f"shard listed in the manifest is missing; {REPREPARE}")
        if info.size != shard.bytes:
            raise DatasetFormatError(where, f"size {info.size} bytes, manifest says {shard.bytes}; {REPREPARE}")
        entry = {"bytes": shard.bytes, "mtime_ns": info.mtime_ns, "sha256": shard.sha256}
        if info.mtime_ns is not None and stamped.get(shard.path) == entry:
            continue
        check_shard(fs, join(base, shard.path), shard, where, checksum=True)
        stamped[shard.path] = entry
        hashed.append(shard)
    if hashed:
        _write_stamp(fs, stamp_path, stamped, join(uri, STAMP_NAME))
        log.info("%s: SHA-256 of %d shard(s) checked in %.1fs and stamped", uri, len(hashed),
                 time.monotonic() - started)
    return hashed


def _read_stamp(fs: pafs.FileSystem, path: str) -> dict[str, dict]:
    """The stamp's entries by shard path; ``{}`` when there is none or it is unreadable (everything is hashed)."""
    try:
        with fs.open_input_stream(path) as stream:
            data = json.loads(stream.read())
        if data.get("format") == STAMP_FORMAT and isinstance(data.get("shards"), dict):
            return dict(data["shards"])
    except (OSError, ValueError, AttributeError):
        pass
    return {}


def _write_stamp(fs: pafs.FileSystem, path: str, entries: dict[str, dict], where: str) -> None:
    body = {"format": STAMP_FORMAT, "note": "shards whose SHA-256 matched the manifest at this size and mtime",
            "shards": dict(sorted(entries.items()))}
    try:
        with_retries(lambda: put_bytes(fs, path, json.dumps(body, indent=1).encode()), where)
    except Exception as exc:  # noqa: BLE001 - the check itself passed; only the next run's shortcut is lost
        log.warning("%s: could not write the verification stamp (%s); the next run hashes the shards again",
                    where, exc)


def shard_paths(uri: str, manifest: Manifest, splits: Iterable[str] | None = None,
                endpoint_url: str | None = None) -> tuple[pafs.FileSystem, list[str]]:
    """The filesystem and the paths (inside it) of the shards holding ``splits`` (all when ``None``)."""
    fs, base = resolve(uri, endpoint_url)
    wanted = set(splits) if splits is not None else None
    return fs, [join(base, s.path) for s in manifest.shards if wanted is None or s.split in wanted]


def images_by_id(uri: str, source_ids: Iterable[str], *, splits: Iterable[str] | None = None,
                 endpoint_url: str | None = None) -> dict[str, bytes]:
    """``{source_id: encoded image}`` of the given rows of the prepared dataset at ``uri`` (ids it does not hold
    are absent). Reads only the ``image`` and ``source_id`` columns, filtered by id (a gallery's thumbnails)."""
    import pyarrow.compute as pc
    import pyarrow.dataset as pads

    from ncdlr.data.manifest import read_manifest

    wanted = sorted(set(source_ids))
    if not wanted:
        return {}
    fs, paths = shard_paths(uri, read_manifest(uri, endpoint_url), splits, endpoint_url)
    table = pads.dataset(paths, filesystem=fs, format="parquet").to_table(
        columns=["source_id", "image"], filter=pc.field("source_id").isin(wanted))
    return dict(zip(table.column("source_id").to_pylist(), table.column("image").to_pylist()))
