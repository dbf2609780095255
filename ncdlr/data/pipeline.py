"""Ray Data streaming of a prepared dataset: rows → decoded, augmented views → paired batches per worker.

Usage (driver, then inside each Ray Train worker)::

    cfg = PipelineConfig(image_size=160, scaling="lite", batch_size=64)
    datasets = build_datasets("s3://bucket/openclipart", cfg)           # {"known", "novel", "test"}
    trainer = TorchTrainer(loop, datasets=datasets, dataset_config=train_data_config(cfg), ...)

    # in loop():
    batches = PairedBatches(ray.train.get_dataset_shard("known"), ray.train.get_dataset_shard("novel"),
                            batch_size=cfg.batch_size)
    for epoch in range(epochs):
        bad_images = 0
        for step in batches:                           # one epoch = one pass over this worker's novel rows
            bad_images += len(step["bad_source_ids"])  # undecodable images, already dropped
            known, novel = step["known"], step["novel"]   # view1/view2 [B,3,H,W] float32, label [B] int64

Nothing is materialised: ``ShardDatasource`` streams the shards of the requested splits (each shard holds one
split, see ``ncdlr.data.shards``) in read tasks of about ``rows_per_read_task`` rows that also decode them
(``decoded_blocks``: ``rows_per_block`` rows per block, ``decode_threads`` blocks at a time, each block stored
as soon as it is ready), and Ray Data's streaming executor keeps at most ``object_store_limit_bytes`` of
blocks in flight (``limit_memory``, ``train_data_config``). Raw image bytes never cross the object store.
Training views travel as uint8 crops (0.3 MB per 224 px image pair instead of 1.2 MB as float32) and are
normalised on the consumer (``to_torch``); see docs/benchmarks.md, "Data pipeline", for the measurements.

Shuffling without a global shuffle: rows are permuted within each shard when it is written; training
splits (``cfg.shuffle``) read their shard pieces in a new order every epoch and, when their read tasks decode,
the rows of each row group in a new order too (``shuffled_rows``); and ``PairedBatches`` can mix rows
further in a local buffer on the worker (``local_shuffle_buffer_size``, memory ≈ rows · 2 · 3·H·W B: the
buffer holds the uint8 views, normalised only as batches leave it).

Epoch convention: a step pairs B known rows with B novel rows. One epoch is one pass over the worker's
share of the NOVEL stream (the unlabelled data the method is about); the known stream is cycled — restarted
whenever it runs out, and continued, not restarted, across epochs — so every novel row is seen once per
epoch and known rows are seen in proportion. Ray Train splits each stream equally over workers, so all
workers take the same number of steps (needed for DDP) and restart the known stream at the same step.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import logging
import math
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import ray.data
from ray.data.block import BlockAccessor, BlockMetadata
from ray.data.collate_fn import NumpyBatchCollateFn
from ray.data.datasource import Datasource, ReadTask

from ncdlr.data.manifest import Manifest, read_manifest
from ncdlr.data.records import GROUPS, checked_splits
from ncdlr.data.shards import SCHEMA, check_shard, verify_with_stamp
from ncdlr.data.storage import join, resolve
from ncdlr.data.transforms import (
    VIEW_DTYPES,
    CachedViews,
    DecodedImages,
    EncodedRows,
    EvalView,
    TrainViews,
    check_photometric,
    decode_pool,
    detail_side,
    normalise_views,
    split_valid,
)

log = logging.getLogger(__name__)

VERIFY_MODES = ("none", "size", "stamp", "checksum")
DECODE_PLACES = ("host", "device", "hybrid")


@dataclass(frozen=True)
class PipelineConfig:
    """How images become model inputs, and how much of them is in flight.

    Sizes in pixels; ``batch_size`` is B, rows of EACH stream (known and novel) per step per worker.
    """

    image_size: int = 224  # crop side of every view
    crop_scale: tuple[float, float] = (0.5, 1.0)  # RandomResizedCrop area fraction
    hflip_prob: float = 0.5
    # The views' colour augmentation after crop and flip: "none" or "uno" (UNO's jitter, greyscale and blur,
    # ``ncdlr.data.transforms.photometric_view``). Host decoding only: the device paths crop and flip alone.
    photometric: str = "none"
    scaling: str = "imagenet"  # "imagenet" (mean/std) | "lite" ((x-127)/128, efficientnet_lite0)
    eval_resize: int | None = None  # eval short side; None → image_size·256/224
    batch_size: int = 64  # B known + B novel rows per step per worker
    # Decoding runs inside the read tasks (``ShardDatasource`` with a ``DecodeSpec``): each task reads about
    # ``rows_per_read_task`` rows of one shard and decodes them ``rows_per_block`` rows at a time, one block
    # per thread of ``decode_threads``, the next blocks queued while the finished one goes to the object store.
    rows_per_read_task: int = 2048  # a shard with more rows is read by several tasks (more CPUs on small data)
    rows_per_block: int = 64  # rows per decoded block (one object-store object, one unit of thread work)
    decode_threads: int = 2  # threads per read task (PIL decodes and resizes without the GIL)
    # Logical CPUs each read-and-decode task reserves. A task runs decode_threads threads on it: on a node
    # where many tasks run side by side, lower decode_threads to 1 (or raise this) to match the cores. Each
    # training stream (known, novel) needs this much free CPU beside the Ray Train workers.
    decode_num_cpus: float = 1.0
    # False: read tasks cut shards into rows_per_block-row blocks and a separate map_batches step decodes them
    # (the previous design, kept for comparison: docs/benchmarks.md); datasets that do not come straight from
    # ``load_splits`` always take that path.
    decode_in_read_tasks: bool = True
    decode_batch_size: int = 32  # rows per map_batches call (the map_batches path only)
    prefetch_batches: int = 2  # batches each worker prefetches per stream
    shuffle: bool = True  # training splits: new shard-piece order and row order within row groups every epoch
    object_store_limit_bytes: int | None = 512 * 1024**2  # Ray Data blocks in flight per dataset; None = Ray's default
    # Shard check on load (``load_splits``): "stamp" (SHA-256 once, then size + mtime against verified.json),
    # "checksum" (SHA-256 every time), "size" (size + row count only), "none". docs/benchmarks.md has the costs.
    verify: str = "stamp"
    augment_seed: int | None = None  # None: fresh entropy per batch; int: reproducible views (tests)
    # Training views cross the object store as "uint8" (normalised by the consumer, ``to_torch``: 4x fewer
    # bytes) or "float32" (normalised in the decode task). What the training loop receives is the same.
    transfer_dtype: str = "uint8"
    # Where training images are decoded and augmented: "host" (PIL in the read tasks, the crops cross the
    # object store), "device" (the read tasks ship the encoded bytes; the consumer decodes and augments on
    # its device, ``ncdlr.data.device_views``) or "hybrid" (the read tasks decode, the consumer crops on its
    # device). docs/benchmarks.md, "GPU input path", compares them.
    decode_on: str = "host"
    # Epochs of the training splits each Ray Data execution streams (``PairedBatches(steps_per_epoch=...)``
    # cuts them into epochs). Each execution starts with a second or two in which little is decoded: on short
    # epochs that is a large share of the epoch (docs/benchmarks.md, "Epoch restarts").
    passes_per_execution: int = 1

    def __post_init__(self) -> None:
        if self.verify not in VERIFY_MODES:
            raise ValueError(f"PipelineConfig.verify must be one of {VERIFY_MODES}, got {self.verify!r}")
        if self.transfer_dtype not in VIEW_DTYPES:
            raise ValueError(f"PipelineConfig.transfer_dtype must be one of {VIEW_DTYPES}, got {self.transfer_dtype!r}")
        if self.decode_on not in DECODE_PLACES:
            raise ValueError(f"PipelineConfig.decode_on must be one of {DECODE_PLACES}, got {self.decode_on!r}")
        check_photometric(self.photometric, self.decode_on)
        counts = {"batch_size": self.batch_size, "decode_batch_size": self.decode_batch_size,
                  "passes_per_execution": self.passes_per_execution,
                  "rows_per_read_task": self.rows_per_read_task, "rows_per_block": self.rows_per_block,
                  "decode_threads": self.decode_threads}
        if bad := {k: v for k, v in counts.items() if v < 1}:
            raise ValueError(f"PipelineConfig: {bad} must be >= 1")
        if self.image_size < 8:
            raise ValueError(f"PipelineConfig: image_size must be >= 8, got {self.image_size}")
        self.train_views()  # validates scaling and crop_scale
        self.eval_view()

    def train_views(self, dtype: str = "float32", threads: int | None = None) -> TrainViews:
        """The training transform; ``dtype="float32"`` gives normalised views (what a model consumes).
        ``threads``: images of one batch decoded in parallel (default ``decode_threads``)."""
        return TrainViews(size=self.image_size, crop_scale=tuple(self.crop_scale), hflip_prob=self.hflip_prob,
                          scaling=self.scaling, seed=self.augment_seed, dtype=dtype, photometric=self.photometric,
                          threads=self.decode_threads if threads is None else threads)

    def eval_view(self) -> EvalView:
        return EvalView(size=self.image_size, resize=self.eval_resize, scaling=self.scaling)

    def device_views(self) -> Any:
        """The training transform of ``decode_on="device"``: encoded bytes → two views on the consumer's device
        (:class:`~ncdlr.data.device_views.DeviceTrainViews`; imported here so read tasks never load torch)."""
        from ncdlr.data.device_views import DeviceTrainViews

        return DeviceTrainViews(size=self.image_size, crop_scale=tuple(self.crop_scale), hflip_prob=self.hflip_prob,
                                scaling=self.scaling, seed=self.augment_seed)


# ------------------------------------------------------------------------------------------ reading rows


Piece = tuple[str, int, int | None]  # (file path, first row, end row or None for the file's end)


def _read_tables(fs: pafs.FileSystem, pieces: Sequence[Piece], columns: list[str] | None,
                 split: str | None, row_limit: int | None) -> Iterator[pa.Table]:
    """Read task body: the rows ``[first, end)`` of each piece's file, one row group at a time (bounded memory;
    only the row groups that overlap the range are read), optionally only ``split`` rows, at most
    ``row_limit`` rows in all."""
    produced = 0
    for path, first, end in pieces:
        with fs.open_input_file(path) as source:
            parquet = pq.ParquetFile(source)
            group_end = 0
            for group in range(parquet.num_row_groups):
                group_first, group_end = group_end, group_end + parquet.metadata.row_group(group).num_rows
                lo, hi = max(first, group_first), group_end if end is None else min(end, group_end)
                if lo >= hi:
                    continue
                table = parquet.read_row_group(group, columns=columns)
                if (lo, hi) != (group_first, group_end):
                    table = table.slice(lo - group_first, hi - lo)
                if split is not None:
                    table = table.filter(pc.field("split") == split)
                if row_limit is not None:
                    table = table.slice(0, row_limit - produced)
                produced += table.num_rows
                if table.num_rows:
                    yield table
                if row_limit is not None and produced >= row_limit:
                    return


@dataclass(frozen=True)
class DecodeSpec:
    """Decoding inside the read task: ``transform`` (a batch → batch function such as ``TrainViews`` with
    ``threads=1``) runs on blocks of ``rows_per_block`` rows, ``threads`` blocks at a time in the process's
    ``decode_pool``."""

    transform: Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]
    rows_per_block: int
    threads: int


def _decode_block(transform: Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]], table: pa.Table) -> Any:
    return BlockAccessor.batch_to_block(transform(BlockAccessor.for_block(table).to_batch_format("numpy")))


def decoded_blocks(tables: Iterable[pa.Table], spec: DecodeSpec) -> Iterator[Any]:
    """Rows → decoded Ray Data blocks (Arrow tables) of at most ``spec.rows_per_block`` rows, in row order.

    Pipelined: ``spec.threads`` blocks decode in parallel threads and one more waits queued, so the threads
    keep working while the caller (Ray's read task) stores a finished block; at most ``threads + 1`` blocks
    are held. Each block's rows are decoded in one ``spec.transform`` call (its random views are drawn per
    block). Stopping early (an error, or the consumer closing the generator) cancels the queued blocks."""
    pool = decode_pool(spec.threads)
    pending: deque[Future] = deque()
    try:
        for table in tables:
            for start in range(0, table.num_rows, spec.rows_per_block):
                pending.append(pool.submit(_decode_block, spec.transform, table.slice(start, spec.rows_per_block)))
                if len(pending) > spec.threads:
                    yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
    finally:
        for future in pending:
            future.cancel()


class ShardDatasource(Datasource):
    """Ray Data source over parquet files whose paths (and, for shards, row counts and sizes) we already know
    from the manifest: no listing or footer pass at the start of every epoch (that costs seconds per
    execution with ``read_parquet`` here).

    One read task per file, or, with ``rows_per_task`` and known row counts, one per range of about that
    many rows of a file (a small dataset then still spreads over several CPUs). With ``decode`` the read
    tasks also decode (``decoded_blocks``): raw rows never cross the object store and no separate map step
    waits to be scheduled. With ``shuffle`` the tasks are handed out in a new random order each time Ray
    plans an execution (each epoch), and decoding tasks also permute the rows of each row group afresh. With
    ``passes`` > 1 one execution reads everything that many times, one pass after the other, each pass in an
    order of its own (a training stream then restarts once per ``passes`` epochs, see ``PairedBatches``)."""

    def __init__(self, fs: pafs.FileSystem, paths: Sequence[str], *, rows: Sequence[int] | None = None,
                 sizes: Sequence[int] | None = None, columns: Sequence[str] | None = None, split: str | None = None,
                 shuffle: bool = False, rows_per_task: int | None = None, decode: DecodeSpec | None = None,
                 passes: int = 1) -> None:
        super().__init__()
        if rows_per_task is not None and rows_per_task < 1:
            raise ValueError(f"rows_per_task must be >= 1, got {rows_per_task}")
        if passes < 1:
            raise ValueError(f"passes must be >= 1, got {passes}")
        self.passes = passes
        self.fs = fs
        self.paths = list(paths)
        self.rows = list(rows) if rows is not None else None
        self.sizes = list(sizes) if sizes is not None else None
        self.columns = list(columns) if columns is not None else None
        self.split = split
        self.shuffle = shuffle
        self.rows_per_task = rows_per_task
        self.decode = decode

    def decoding(self, decode: DecodeSpec, rows_per_task: int | None, passes: int = 1) -> ShardDatasource:
        """The same files, read in tasks of about ``rows_per_task`` rows that also decode (``decode``), ``passes``
        times over in one execution."""
        return ShardDatasource(self.fs, self.paths, rows=self.rows, sizes=self.sizes, columns=self.columns,
                               split=self.split, shuffle=self.shuffle, rows_per_task=rows_per_task, decode=decode,
                               passes=passes)

    def get_name(self) -> str:
        return "ReadShards" if self.decode is None else "ReadAndDecodeShards"

    def estimate_inmemory_data_size(self) -> int | None:
        return sum(self.sizes) if self.sizes is not None else None

    def pieces(self) -> list[tuple[Piece, int | None, int | None]]:
        """``(piece, rows, bytes)`` per unit of reading, in file order (rows and bytes None where unknown)."""
        out: list[tuple[Piece, int | None, int | None]] = []
        for i, path in enumerate(self.paths):
            rows = self.rows[i] if self.rows is not None and self.split is None else None
            size = self.sizes[i] if self.sizes is not None else None
            parts = 1 if rows is None or self.rows_per_task is None else max(1, math.ceil(rows / self.rows_per_task))
            if parts == 1:
                out.append(((path, 0, None), rows, size))
                continue
            bounds = [int(b) for b in np.linspace(0, rows, parts + 1).round()]
            for lo, hi in zip(bounds[:-1], bounds[1:]):
                out.append(((path, lo, hi), hi - lo, None if size is None else size * (hi - lo) // rows))
        return out

    def get_read_tasks(self, parallelism: int, per_task_row_limit: int | None = None,
                       data_context: Any = None) -> list[ReadTask]:
        pieces = self.pieces()
        rng = np.random.default_rng()
        # ``passes`` passes one after the other, each in its own order: pass p's tasks come before pass p+1's
        order = np.concatenate([rng.permutation(len(pieces)) if self.shuffle else np.arange(len(pieces))
                                for _ in range(self.passes)])
        tasks = []
        for group in np.array_split(order, max(1, min(parallelism, len(order)))):
            if len(group) == 0:
                continue
            chosen = [pieces[i] for i in group]
            rows = [r for _, r, _ in chosen]
            sizes = [b for _, _, b in chosen]
            metadata = BlockMetadata(
                num_rows=sum(rows) if None not in rows else None,
                size_bytes=sum(sizes) if None not in sizes else None,
                exec_stats=None, input_files=tuple(dict.fromkeys(p[0] for p, _, _ in chosen)))
            read = functools.partial(_read_tables, self.fs, [p for p, _, _ in chosen], self.columns, self.split,
                                     per_task_row_limit)
            if self.decode is not None:
                read = functools.partial(_read_and_decode, read, self.decode, self.shuffle)
            tasks.append(ReadTask(read, metadata))
        return tasks


def shuffled_rows(tables: Iterable[pa.Table], rng: np.random.Generator) -> Iterator[pa.Table]:
    """Each table with its rows in a random order drawn from ``rng`` (one row group at a time: a copy of its
    raw bytes, small next to decoding it)."""
    for table in tables:
        yield table.take(rng.permutation(table.num_rows))


def _read_and_decode(read: Callable[[], Iterator[pa.Table]], decode: DecodeSpec, shuffle: bool) -> Iterator[Any]:
    tables = read()
    return decoded_blocks(shuffled_rows(tables, np.random.default_rng()) if shuffle else tables, decode)


def _verify(uri: str, fs: pafs.FileSystem, base: str, manifest: Manifest, splits: Sequence[str], mode: str) -> None:
    shards = [shard for shard in manifest.shards if shard.split in splits]
    if mode == "stamp":
        verify_with_stamp(uri, fs, base, shards)
    elif mode != "none":
        for shard in shards:
            check_shard(fs, join(base, shard.path), shard, join(uri, shard.path), checksum=mode == "checksum")


def verify_splits(uri: str, manifest: Manifest, splits: Sequence[str], *, mode: str = "stamp",
                  endpoint_url: str | None = None) -> None:
    """Check the shards of ``splits`` against ``manifest`` as :func:`load_splits` does (``mode``: see there),
    without building a dataset: what a driver runs before it starts Ray. Raises ``DatasetFormatError`` naming
    the shard."""
    fs, base = resolve(uri, endpoint_url)
    _verify(uri, fs, base, manifest, splits, mode)


# Datasets made by ``load_splits`` → (their ``ShardDatasource``, the rows per read block or None). Decoding
# such a dataset reads that source again with the decode step inside the read tasks.
_SOURCE_OF: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def load_splits(uri: str, split_names: Iterable[str], *, verify: str = "stamp",
                shuffle_files: Iterable[str] | None = None, endpoint_url: str | None = None,
                rows_per_block: int | None = 128, manifest: Manifest | None = None) -> dict[str, Any]:
    """One lazy ``ray.data.Dataset`` of raw rows (``image`` bytes, ``label``, ``split``, ``class_name``,
    ``source_id``) per requested split of the prepared dataset at ``uri``.

    Reads only the shards of those splits; nothing is materialised. ``verify`` checks the shards against
    the manifest first: ``"stamp"`` (SHA-256 of each shard the first time, recorded in ``verified.json``
    next to the manifest; later only each shard's size and mtime against that stamp, one listing per shard:
    ``ncdlr.data.shards.verify_with_stamp``), ``"checksum"`` (SHA-256 of every shard: reads them all once
    more on every call), ``"size"`` (object size and parquet row count: one listing and one footer read per
    shard), ``"none"``. Raises the
    ``StorageError``/``DatasetFormatError`` naming the bad URI or file, and ``ValueError`` for a split the
    dataset does not have. Splits in ``shuffle_files`` (default: the training splits ``known`` and ``novel``)
    read their shards in a new random order every epoch.

    ``rows_per_block``: each read task cuts its shard into blocks of about this many raw rows (Ray Data's
    read output split, from the manifest's row counts); None leaves Ray's default block size. These are the
    blocks a ``map_batches`` decode step gets (``PipelineConfig.decode_in_read_tasks=False``); by default
    ``with_train_views`` / ``with_eval_view`` read the splits again with decoding inside the read tasks.
    ``manifest``: the dataset's manifest when the caller has read it already (it is not read again).
    """
    splits = checked_splits(split_names)
    manifest = manifest or read_manifest(uri, endpoint_url)
    empty = [s for s in splits if manifest.split_counts.get(s, 0) == 0]
    if empty:
        raise ValueError(f"{uri}: split(s) {empty} hold no rows (the dataset has {manifest.split_counts})")
    fs, base = resolve(uri, endpoint_url)
    _verify(uri, fs, base, manifest, splits, verify)
    shuffled = set(GROUPS if shuffle_files is None else shuffle_files)
    datasets = {}
    for split in splits:
        shards = [s for s in manifest.shards if s.split == split]
        source = ShardDatasource(fs, [join(base, s.path) for s in shards], rows=[s.rows for s in shards],
                                 sizes=[s.bytes for s in shards], columns=SCHEMA.names,
                                 shuffle=split in shuffled)
        if rows_per_block is None:
            datasets[split] = ray.data.read_datasource(source)
        else:
            # One read task per shard, its output split into ceil(rows / rows_per_block) blocks in all.
            blocks = max(len(shards), sum(math.ceil(s.rows / rows_per_block) for s in shards))
            datasets[split] = ray.data.read_datasource(source, override_num_blocks=blocks)
        _SOURCE_OF[datasets[split]] = (source, rows_per_block)
    return datasets


def _decode(dataset: Any, transform: Callable[[int], Any], cfg: PipelineConfig, passes: int = 1) -> Any:
    """``dataset`` with ``transform(threads)`` applied to every row, ``cfg``'s memory cap set.

    A dataset straight from ``load_splits`` is read again with the decoding inside its read tasks
    (``ShardDatasource.decoding``; measured faster than a separate map step, docs/benchmarks.md "Data
    pipeline"). Otherwise (or with ``cfg.decode_in_read_tasks=False``) ``map_batches`` tasks decode blocks of
    at most ``cfg.rows_per_block`` rows, cut by a ``repartition`` step first (streaming, nothing
    materialised) unless the read already cut them that small, so decoding still runs on every CPU.
    ``passes``: read the data that many times in one execution (read-task decoding only)."""
    source, rows_per_read_block = _SOURCE_OF.get(dataset, (None, None))
    if source is not None and cfg.decode_in_read_tasks:
        one_thread = transform(1)
        fused = source.decoding(DecodeSpec(one_thread, cfg.rows_per_block, cfg.decode_threads),
                                rows_per_task=cfg.rows_per_read_task, passes=passes)
        # Exactly one block request per piece and pass: Ray Data then neither groups pieces nor splits their output.
        decoded = ray.data.read_datasource(fused, override_num_blocks=len(fused.pieces()) * passes,
                                           num_cpus=cfg.decode_num_cpus)
        # Ray Data gathers a task's output blocks up to the context's target_max_block_size (128 MiB) and
        # concatenates them before storing; a target a little under one decoded block stores each block as
        # the task yields it (no copy, the first rows sooner: measured 1.2x the images/s, docs/benchmarks.md).
        decoded.context.target_max_block_size = max(1, int(0.75 * cfg.rows_per_block * one_thread.pixel_bytes_per_row))
    else:
        if rows_per_read_block is None or rows_per_read_block > cfg.rows_per_block:
            dataset = dataset.repartition(target_num_rows_per_block=cfg.rows_per_block)
        decoded = dataset.map_batches(transform(cfg.decode_threads), batch_size=cfg.decode_batch_size,
                                      batch_format="numpy", num_cpus=cfg.decode_num_cpus, zero_copy_batch=True)
    limit_memory(decoded, cfg)
    return decoded


def object_store_limit(cfg: PipelineConfig) -> int | None:
    """The per-dataset object-store cap to apply: ``cfg.object_store_limit_bytes``, but none (Ray's default: a
    share of the node's object store) when an execution streams several passes: with 512 MiB, 6 read tasks
    and 4 passes Ray Data 2.60 back-pressured every task and stopped delivering (``bench_epochs.py``, seen
    2026-11-27)."""
    return cfg.object_store_limit_bytes if cfg.passes_per_execution == 1 else None


def limit_memory(dataset: Any, cfg: PipelineConfig) -> None:
    """Cap the object-store memory this dataset's execution keeps in flight (:func:`object_store_limit`);
    Ray Data's streaming executor then back-pressures the reads. (Inside Ray Train, ``train_data_config``
    sets the same limit for the split streams.)"""
    if object_store_limit(cfg) is None:
        return
    from ray.data import ExecutionResources

    dataset.context.execution_options.resource_limits = ExecutionResources.for_limits(
        object_store_memory=object_store_limit(cfg))


def without_source_ids(batch: dict[str, np.ndarray], done: np.ndarray) -> dict[str, np.ndarray]:
    """The rows of a numpy batch whose ``source_id`` is not in ``done`` (``map_batches``: what a resumed job skips)."""
    keep = ~np.isin(np.asarray(batch["source_id"], dtype=object), done)
    return {key: value[keep] for key, value in batch.items()}


def with_train_views(dataset: Any, cfg: PipelineConfig) -> Any:
    """Rows → ``view1``, ``view2``, ``label``, ``split``, ``class_name``, ``source_id``, ``valid`` (False for an
    undecodable image, whose views are zeros).

    With ``cfg.transfer_dtype == "uint8"`` (default) the views are uint8 ``[3,H,W]`` crops plus a ``scaling``
    column, and ``to_torch`` / ``ToTorch`` / ``PairedBatches`` normalise them on the consumer into float32
    ``[3,H,W]`` (``ncdlr.data.transforms.normalise_views`` for numpy consumers); with ``"float32"`` the decode
    tasks ship normalised float32 views.

    With ``cfg.decode_on == "device"`` the rows keep their encoded ``image`` bytes (plus ``label`` and
    ``source_id``; :class:`~ncdlr.data.transforms.EncodedRows`) and the consumer makes the views:
    ``PairedBatches(device_views=cfg.device_views(), ...)``; with ``"hybrid"`` the rows carry the decoded,
    uncropped ``pixels`` (:class:`~ncdlr.data.transforms.DecodedImages`) and the consumer crops the same way.
    ``cfg.passes_per_execution`` > 1: each execution streams the rows that many times (read with ``PairedBatches(
    steps_per_epoch=...)``, which cuts the stream into epochs)."""
    passes = cfg.passes_per_execution
    if cfg.decode_on == "device":
        return _decode(dataset, lambda threads: EncodedRows(), cfg, passes)
    if cfg.decode_on == "hybrid":
        keep = detail_side(cfg.image_size, tuple(cfg.crop_scale))
        return _decode(dataset, lambda threads: DecodedImages(min_side=keep), cfg, passes)
    return _decode(dataset, lambda threads: cfg.train_views(cfg.transfer_dtype, threads), cfg, passes)


def with_cached_views(dataset: Any, cfg: PipelineConfig, views: int, seed: int) -> Any:
    """Rows → ``views`` (uint8 ``[V, 3, H, W]``: ``V`` training crops drawn from ``(seed, source_id)``, see
    :class:`~ncdlr.data.transforms.CachedViews`), ``scaling``, the label columns and ``valid`` — the input of
    the activation cache (``ncdlr embed --views V``)."""
    return _decode(dataset, lambda threads: CachedViews(size=cfg.image_size, views=views, crop_scale=tuple(cfg.crop_scale),
                                                        hflip_prob=cfg.hflip_prob, scaling=cfg.scaling, seed=seed,
                                                        threads=threads, photometric=cfg.photometric), cfg)


def with_eval_view(dataset: Any, cfg: PipelineConfig) -> Any:
    """Rows → ``image`` (float32 ``[3,H,W]``, deterministic resize + centre crop), the label columns, ``valid``."""
    return _decode(dataset, lambda threads: cfg.eval_view(), cfg)


def build_datasets(uri: str, cfg: PipelineConfig, *, train_splits: Sequence[str] = ("known", "novel"),
                   eval_splits: Sequence[str] = ("test",), endpoint_url: str | None = None) -> dict[str, Any]:
    """``load_splits`` + the training transform on ``train_splits`` and the eval transform on ``eval_splits``
    (a split may be in both: its eval version is keyed ``"<split>_eval"``)."""
    wanted = list(dict.fromkeys([*train_splits, *eval_splits]))
    raw = load_splits(uri, wanted, verify=cfg.verify, shuffle_files=train_splits if cfg.shuffle else (),
                      endpoint_url=endpoint_url, rows_per_block=cfg.rows_per_block)
    out = {split: with_train_views(raw[split], cfg) for split in train_splits}
    for split in eval_splits:
        out[f"{split}_eval" if split in train_splits else split] = with_eval_view(raw[split], cfg)
    return out


def read_tasks_for(cfg: PipelineConfig, split_rows: dict[str, int], free_cpus: float) -> PipelineConfig:
    """``cfg`` with ``rows_per_read_task`` sized so the training streams' read tasks can use every CPU Ray Data
    has on the cluster (``free_cpus``: the cluster's CPUs less the training workers' and actors').

    The ``len(split_rows)`` streams run side by side and share the CPUs: each gets
    ``⌊free_cpus / streams / decode_num_cpus⌋`` (at least 1) tasks at a time, so a split is cut into at least that
    many pieces of at most ``cfg.rows_per_read_task`` rows and never fewer rows than ``rows_per_block``. A
    small dataset then still decodes on all the node's cores; a large one keeps its pieces."""
    tasks = tasks_per_stream(cfg, free_cpus, len(split_rows))
    rows = min(split_rows.values()) if split_rows else cfg.rows_per_read_task
    per_task = max(cfg.rows_per_block, min(cfg.rows_per_read_task, math.ceil(rows / tasks)))
    return dataclasses.replace(cfg, rows_per_read_task=per_task)


def tasks_per_stream(cfg: PipelineConfig, free_cpus: float, streams: int = 2) -> int:
    """Read tasks one of ``streams`` training streams runs at a time: its share of ``free_cpus`` in tasks of
    ``cfg.decode_num_cpus`` CPUs each, at least one."""
    return max(1, int(free_cpus / max(1, streams) / cfg.decode_num_cpus))


def stream_cpu_limit(cfg: PipelineConfig, free_cpus: float, streams: int = 2) -> float:
    """The CPUs (logical slots) one training stream's executor may hold: :func:`tasks_per_stream` tasks' worth.

    Without it the streams deadlock. Each stream's executor sees every free CPU, and a read task that its consumer
    has not drained stays alive holding its CPU (Ray Data back-pressures its output; the task does not end). The
    worker asks for a novel batch first. If the novel stream's tasks take every free CPU, the known stream's first
    task never starts, and the worker, waiting for a known batch, never drains the novel ones. Seen in session 46 on
    2 cores: OpenClipart-LT's novel split in 2 pieces, 2 CPUs beside the worker, no step in 7 minutes."""
    return tasks_per_stream(cfg, free_cpus, streams) * cfg.decode_num_cpus


def stream_options(cfg: PipelineConfig, cpu_limit: float | None = None) -> Any:
    """``ray.data.ExecutionOptions`` of one training stream: at most ``cpu_limit`` CPUs
    (:func:`stream_cpu_limit`; None: no cap) and :func:`object_store_limit` bytes in flight."""
    from ray.data import ExecutionOptions, ExecutionResources

    options = ExecutionOptions()
    if cpu_limit is not None or object_store_limit(cfg) is not None:
        options.resource_limits = ExecutionResources.for_limits(cpu=cpu_limit,
                                                                object_store_memory=object_store_limit(cfg))
    return options


def train_data_config(cfg: PipelineConfig, datasets_to_split: Sequence[str] | str = ("known", "novel"),
                      cpu_limit: float | None = None) -> Any:
    """``ray.train.DataConfig`` that splits the training streams equally over workers, caps each dataset's
    in-flight object-store memory at :func:`object_store_limit` and, given ``cpu_limit``
    (:func:`stream_cpu_limit`), the CPUs each stream's read tasks may hold at once."""
    import ray.train

    split = datasets_to_split if isinstance(datasets_to_split, str) else list(datasets_to_split)
    return ray.train.DataConfig(datasets_to_split=split, execution_options=stream_options(cfg, cpu_limit))


# ----------------------------------------------------------------------------------------- paired batches


def to_torch(batch: dict[str, np.ndarray], normalise: bool = True) -> dict[str, Any]:
    """numpy batch → numeric columns as torch tensors (zero-copy where writable), string columns as lists.

    uint8 views (``scaling`` column present, see ``with_train_views``) are normalised here into new float32
    ``[b,3,H,W]`` tensors (``normalise_views``) and the ``scaling`` column is dropped; with
    ``normalise=False`` they stay uint8 and ``scaling`` stays as a list, for the consumer to normalise on its
    device (``ncdlr.data.transforms.normalise_chw_torch``)."""
    import torch

    out: dict[str, Any] = {}
    for key, value in (normalise_views(batch) if normalise else batch).items():
        value = np.asarray(value)
        if key == "label":
            out[key] = torch.from_numpy(value.astype(np.int64))  # class indices as torch losses expect them
        elif value.dtype.kind in "biuf":
            out[key] = torch.from_numpy(np.require(value, requirements=["W", "C"]))
        elif value.dtype.kind == "S" or key == "image":  # encoded images stay bytes
            out[key] = [bytes(v) for v in value]
        elif len(value) and isinstance(value[0], np.ndarray):  # variable-shaped tensors (decoded images)
            out[key] = [torch.from_numpy(np.require(v, requirements=["W"])) for v in value]
        else:
            out[key] = [str(v) for v in value]
    return out


class ToTorch(NumpyBatchCollateFn):
    """``to_torch`` as the collate function of ``iter_torch_batches`` (runs in Ray's prefetch threads).

    With ``device_views`` (a :class:`~ncdlr.data.device_views.DeviceTrainViews`) a batch of encoded ``image``
    bytes (``decode_on="device"``) or of decoded ``pixels`` (``"hybrid"``) becomes ``view1``, ``view2`` and
    ``valid`` on ``device`` here, in the prefetch thread and on a CUDA stream of its own
    (:func:`~ncdlr.data.device_views.on_side_stream`), so making the next batch overlaps the training step."""

    def __init__(self, normalise: bool = True, device_views: Any = None, device: Any = None) -> None:
        super().__init__()
        self.normalise = normalise
        self.device_views = device_views
        import torch

        self.device = torch.device(device if device is not None else "cpu")

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, Any]:
        out = to_torch(batch, self.normalise)
        if self.device_views is None:
            return out
        from ncdlr.data.device_views import on_side_stream

        if "image" in out:
            images = out.pop("image")
            out.update(on_side_stream(self.device, lambda: self.device_views(images, self.device)))
        elif "pixels" in out:
            pixels, valid = out.pop("pixels"), out.pop("valid")
            out.update(on_side_stream(self.device, lambda: self.device_views.of_pixels(pixels, valid, self.device)))
        return out


class PairedBatches:
    """B known + B novel rows per step from two per-worker streams (``DataIterator``s or Datasets).

    Iterating the object runs one epoch: one pass over the novel stream. The known stream cycles and
    carries over between epochs (see the module docstring). With ``steps_per_epoch`` the novel stream cycles
    too and an epoch is that many steps: for streams that hold several epochs per Ray Data execution
    (``PipelineConfig.passes_per_execution``), whose restart then costs once per execution, not per epoch. Each step is a dict::

        {"known": {...}, "novel": {...}, "bad_source_ids": [...]}

    where each side holds the decoded columns as torch tensors (``view1``/``view2`` ``[b,3,H,W]`` float32,
    ``label`` ``[b]`` int64, ``valid`` dropped) and ``source_id`` as a list; ``b`` ≤ B: undecodable rows are
    removed and their ``source_id``s listed in ``bad_source_ids`` (count them as ``bad_images``).
    Works the same for feature tables (``embedding`` ``[b, D]``; nothing to drop).

    ``local_shuffle_buffer_size``: rows kept on the worker to draw batches from at random (None: stream
    order, which is already shuffled within shards and across shard order).

    ``normalise=False`` (for a GPU consumer): uint8 views stay uint8 ``[b,3,H,W]`` and each side keeps its
    ``scaling`` list, so the consumer copies 4x fewer bytes to its device and normalises there
    (``ncdlr.data.transforms.normalise_chw_torch``, the same bits). The default normalises on this host, in
    Ray's prefetch threads, beside the training step.

    ``device_views`` (streams of ``with_train_views`` with ``decode_on="device"``): each batch's encoded
    images are decoded and augmented on ``device`` in Ray's prefetch threads (:class:`ToTorch`); the views
    arrive as float32 on that device.
    """

    def __init__(self, known: Any, novel: Any, batch_size: int, *, device: Any = None, prefetch_batches: int = 2,
                 local_shuffle_buffer_size: int | None = None, normalise: bool = True,
                 device_views: Any = None, steps_per_epoch: int | None = None) -> None:
        if steps_per_epoch is not None and steps_per_epoch < 1:
            raise ValueError(f"steps_per_epoch must be >= 1, got {steps_per_epoch}")
        self.steps_per_epoch = steps_per_epoch
        self._novel_stream: Iterator[dict[str, Any]] | None = None  # with steps_per_epoch: the cycling novel stream
        self.known = known
        self.novel = novel
        self.batch_size = batch_size
        self.device = device
        self.normalise = normalise
        self.device_views = device_views
        self.prefetch_batches = prefetch_batches
        self.local_shuffle_buffer_size = local_shuffle_buffer_size
        self._known_stream: Iterator[dict[str, Any]] | None = None
        self._head_start: Future | None = None  # start(): the first epoch's novel stream and first batches
        self.epochs_of_known = 0  # completed passes over the known stream

    def _batches(self, stream: Any) -> Iterator[dict[str, Any]]:
        collate = ToTorch(self.normalise, self.device_views, self.device)
        return stream.iter_torch_batches(batch_size=self.batch_size, drop_last=True, collate_fn=collate,
                                         prefetch_batches=self.prefetch_batches,
                                         local_shuffle_buffer_size=self.local_shuffle_buffer_size)

    def _cycle(self, side: str) -> Iterator[dict[str, Any]]:
        """Batches of the ``side`` stream ("known" or "novel"), restarted whenever a pass (execution) ends."""
        while True:
            produced = 0
            for batch in self._batches(self.known if side == "known" else self.novel):
                produced += 1
                yield batch
            if produced == 0:
                raise ValueError(f"the {side} stream holds fewer than batch_size={self.batch_size} rows on this "
                                 "worker: lower the batch size or use fewer workers")
            if side == "known":
                self.epochs_of_known += 1

    def _prepare(self, batch: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
        batch, bad = split_valid(batch)
        batch.pop("valid", None)
        if self.device is not None:
            batch = {k: v.to(self.device, non_blocking=True) if hasattr(v, "to") else v for k, v in batch.items()}
        return batch, bad

    def start(self) -> None:
        """Start both streams now: a background thread asks for the first epoch's first known and novel batches,
        so Ray Data's start-up (planning, launching read tasks, their first blocks) overlaps whatever the caller
        does next (a worker builds its model). The next ``iter`` picks them up; without ``start`` it starts then."""
        if self._head_start is None and self._known_stream is None:
            from concurrent.futures import ThreadPoolExecutor

            pool = ThreadPoolExecutor(1, thread_name_prefix="ncdlr-head-start")
            self._head_start = pool.submit(self._first_batches)
            pool.shutdown(wait=False)  # the one task runs on; the thread ends with it

    def _first_batches(self) -> tuple[Iterator[dict[str, Any]], list[dict[str, Any]]] | None:
        known = self._cycle("known")
        if self.steps_per_epoch is not None:
            novel = self._cycle("novel")
            self._novel_stream = _prepended(next(novel), novel)
            self._known_stream = _prepended(next(known), known)
            return None
        novel = iter(self._batches(self.novel))
        self._known_stream = _prepended(next(known), known)
        first = next(novel, None)
        return novel, ([] if first is None else [first])

    def close(self) -> None:
        """Stop the streams (their prefetch threads) before the end of training."""
        if self._head_start is not None:
            self._head_start.result()
            self._head_start = None
        for stream in (self._known_stream, self._novel_stream):
            if stream is not None:
                stream.close()
        self._known_stream = self._novel_stream = None

    def _novel_batches(self) -> Iterator[dict[str, Any]]:
        """This epoch's novel batches: ``steps_per_epoch`` of the cycling novel stream, or one pass (the head
        start's, whose first batch is already fetched, or a fresh one)."""
        head = self._head_start.result() if self._head_start is not None else None
        self._head_start = None
        if self.steps_per_epoch is not None:
            if self._novel_stream is None:
                self._novel_stream = self._cycle("novel")
            return itertools.islice(self._novel_stream, self.steps_per_epoch)
        if head is None:
            return iter(self._batches(self.novel))
        novel, first = head
        return itertools.chain(first, novel)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        novel_batches = self._novel_batches()
        if self._known_stream is None:
            self._known_stream = self._cycle("known")
        steps = 0
        for novel in novel_batches:
            known, bad_known = self._prepare(next(self._known_stream))
            novel, bad_novel = self._prepare(novel)
            bad = bad_known + bad_novel
            if bad:
                log.warning("dropped %d undecodable image(s): %s", len(bad), ", ".join(bad))
            steps += 1
            yield {"known": known, "novel": novel, "bad_source_ids": bad}
        if steps == 0:
            raise ValueError(f"the novel stream holds fewer than batch_size={self.batch_size} rows on this worker, "
                             "so an epoch has no step: lower the batch size or use fewer workers")


def _prepended(first: Any, rest: Iterator[Any]) -> Iterator[Any]:
    """``first``, then ``rest``; closing it closes ``rest``."""
    try:
        yield first
        yield from rest
    finally:
        rest.close()


def iter_paired_batches(known_shard: Any, novel_shard: Any, batch_size: int, **kwargs: Any) -> Iterator[dict[str, Any]]:
    """One epoch of ``PairedBatches(known_shard, novel_shard, batch_size, **kwargs)``; for several epochs keep
    one ``PairedBatches`` object so the known stream carries over."""
    return iter(PairedBatches(known_shard, novel_shard, batch_size, **kwargs))
