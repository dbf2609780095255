"""Feature tables: a frozen encoder's embeddings of a dataset, as parquet — the one home of their schema.

A feature table is a parquet file, or a folder of parquet files (local path, ``file://`` or ``s3://``), with

* ``embedding`` — list<float32>, one ``D``-vector per image (the same ``D`` on every row),
* ``label`` — int: known classes ``0..Ks-1``, novel classes ``Ks..K-1``,
* ``split`` — string: ``known`` | ``novel`` | ``val`` | ``test``,
* optionally ``class_name`` and ``source_id`` (strings),

and JSON metadata under the schema metadata key :data:`METADATA_KEY` (``b"ncdlr"``):
``{"num_known", "num_novel", "class_names", ...}`` (``embed_dataset`` adds ``encoder`` and ``dataset``, the
validation builder ``validation``). Tables from elsewhere without it are accepted: ``Ks`` is then one more than
the largest ``known`` label and ``K`` one more than the largest label read.

Usage::

    write_feature_table("s3://bucket/feats.parquet", x, y, splits, num_known=50, num_novel=50)
    table = read_feature_table("s3://bucket/feats.parquet")              # FeatureSplits, every split
    known = read_feature_table(uri, splits=("known",))                   # reads only the known rows
    x, y, labeled = read_feature_table(uri, splits=("known", "novel")).labeled_rows()   # for estimate-k
    datasets = load_feature_table(uri, ("known", "novel", "test"))      # lazy Ray Data, one per split

:func:`read_feature_table` refuses, with a :class:`FeatureTableError` naming the table and the problem, every
table training could not use: a missing column, an ``embedding`` that is not a list of floats, null
embeddings, ragged or zero widths, NaN/inf values (with the first bad row), a requested split without rows
(``known`` and ``novel`` when all splits are read), unknown split names, and labels outside their range.
A missing table or bucket raises the :mod:`ncdlr.data.storage` error types.

**Activation tables** (``ncdlr embed --trainable-blocks B --views A``) have an ``activation`` column instead of
``embedding``: list<float16>, the ``V`` cached views of one image flattened (``V`` = A random training crops on
``known``/``novel``/``val`` rows, 1 centre view on ``test``), each the frozen encoder's activation at the input of
its last ``B`` blocks. Their metadata adds ``{"kind": "activations", "shape": [C, h, w] or [T, D], "encoder",
"image_size", "cached_blocks": B, "views": {split: V}, ...}``. They read into the same :class:`FeatureSplits`
with ``features[split]`` float16 ``[N, V, *shape]`` (rows sorted by ``source_id``, so the order never depends
on the order the parts were written in) and ``activation_shape`` set; :func:`first_view` gives the ``[N, *shape]``
float32 inputs a model evaluates. Written part by part (:func:`write_table_part`), so ``embed`` can resume.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import torch

from ncdlr.data.longtail import long_tail_counts
from ncdlr.data.records import SPLITS, checked_splits
from ncdlr.data.storage import ObjectNotFoundError, join, resolve, with_retries, write_parquet

METADATA_KEY = b"ncdlr"  #: schema metadata key of the JSON table metadata
FEATURE_COLUMNS = ("embedding", "label", "split")  #: required columns; ``class_name``/``source_id`` are optional
OPTIONAL_COLUMNS = ("class_name", "source_id")
ACTIVATIONS = "activations"  #: metadata ``kind`` of an activation table (column ``activation`` instead of ``embedding``)


class FeatureTableError(ValueError):
    """A feature table that cannot be used; the message names the table and the column or problem."""


@dataclass
class FeatureSplits:
    """Feature-table splits as tensors: ``features[split] [n, D]`` float32, ``labels[split] [n]`` int64.

    ``num_known`` = Ks, ``num_novel`` = Ku of the data (``K = Ks + Ku`` names in ``class_names``).
    ``source_ids[split]`` holds the ``source_id`` of each row where the table has that column;
    ``metadata`` is the table's JSON metadata (``{}`` when it has none).
    """

    features: dict[str, torch.Tensor]
    labels: dict[str, torch.Tensor]
    num_known: int
    num_novel: int
    class_names: list[str]
    source_ids: dict[str, list[str]] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)
    #: activation tables: the shape of one cached activation (``features[split]`` is float16 ``[N, V, *shape]``)
    activation_shape: tuple[int, ...] = ()

    @property
    def is_activations(self) -> bool:
        return bool(self.activation_shape)

    @property
    def dim(self) -> int:
        """``D`` of an embedding table (0 for an activation table, whose inputs are ``activation_shape``)."""
        return 0 if self.is_activations else next(iter(self.features.values())).shape[1]

    def views(self, split: str) -> int:
        """Cached views per row of ``split`` (1 for an embedding table)."""
        return int(self.features[split].shape[1]) if self.is_activations else 1

    def train_counts(self) -> list[int]:
        """``[K]`` training rows per class (the ``known`` and ``novel`` splits)."""
        counts = np.zeros(self.num_known + self.num_novel, dtype=np.int64)
        for split in ("known", "novel"):
            if split in self.labels:
                counts += np.bincount(self.labels[split].numpy(), minlength=len(counts))
        return counts.tolist()

    def labeled_rows(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The training rows as arrays, known rows first: ``features [N, D]`` float32, ``labels [N]`` int64,
        ``labeled [N]`` bool (True for split ``known``) — the input of :func:`ncdlr.estimate_k.estimate_num_novel`."""
        if self.is_activations:
            raise ValueError("an activation table holds the input of the last encoder blocks, not embeddings: "
                             "estimate the number of novel classes on a head-only table (ncdlr embed without "
                             "--trainable-blocks) and pass it as model.num_novel")
        missing = [s for s in ("known", "novel") if s not in self.features]
        if missing:
            raise ValueError(f"labeled_rows needs the known and novel splits; these were not read: {missing}")
        known, novel = self.features["known"], self.features["novel"]
        labeled = np.concatenate([np.ones(len(known), dtype=bool), np.zeros(len(novel), dtype=bool)])
        labels = torch.cat([self.labels["known"], self.labels["novel"]]).numpy()
        return torch.cat([known, novel]).numpy(), labels, labeled


def first_view(x: torch.Tensor) -> torch.Tensor:
    """A model's evaluation input from a feature-table tensor: embeddings ``[N, D]`` as they are, cached
    activations ``[N, V, *shape]`` → view 0 as float32 ``[N, *shape]`` (the centre view on ``test``)."""
    return x if x.dim() == 2 else x[:, 0].float()


# ------------------------------------------------------------------------------------------ schema


def _table_files(uri: str, endpoint_url: str | None) -> tuple[pafs.FileSystem, str, list[str]]:
    """Filesystem, path and the parquet files of a table (the file itself, or a folder's ``*.parquet``)."""
    fs, path = resolve(uri, endpoint_url)
    info = with_retries(lambda: fs.get_file_info(path), uri)
    if info.type == pafs.FileType.NotFound:
        raise ObjectNotFoundError(uri, "feature table not found")
    if info.type == pafs.FileType.File:
        return fs, path, [path]
    selector = pafs.FileSelector(path, recursive=True)
    files = sorted(f.path for f in with_retries(lambda: fs.get_file_info(selector), uri)
                   if f.type == pafs.FileType.File and f.path.endswith(".parquet"))
    if not files:
        raise FeatureTableError(f"{uri}: no .parquet files in this feature-table folder")
    return fs, path, files


def _is_float_list(kind: pa.DataType) -> bool:
    lists = pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind)
    return lists and pa.types.is_floating(kind.value_type)


def _open(uri: str, endpoint_url: str | None) -> tuple[pafs.FileSystem, list[str], pa.Schema]:
    """Filesystem, files and schema (of the first file) of a table whose columns have the right types."""
    fs, path, files = _table_files(uri, endpoint_url)
    where = uri if files == [path] else join(uri, files[0][len(path):])
    try:
        schema = with_retries(lambda: pq.read_schema(files[0], filesystem=fs), uri)
    except pa.ArrowInvalid as err:
        raise FeatureTableError(f"{where}: not a parquet file ({err})") from err
    data = _data_column(schema)
    missing = [c for c in (data, "label", "split") if c not in schema.names]
    if missing:
        raise FeatureTableError(f"{where}: feature table lacks column(s) {', '.join(missing)} "
                                f"(has {', '.join(schema.names)})")
    if not _is_float_list(schema.field(data).type):
        raise FeatureTableError(f"{where}: column {data!r} must be a list of floats, got {schema.field(data).type}")
    if data == "activation":
        meta = _metadata(schema)
        shape = meta.get("shape")
        if meta.get("kind") != ACTIVATIONS or not shape or not all(isinstance(d, int) and d > 0 for d in shape):
            raise FeatureTableError(f"{where}: an 'activation' column needs metadata kind {ACTIVATIONS!r} and the "
                                    f"activation 'shape' (got kind={meta.get('kind')!r}, shape={shape!r})")
    if not pa.types.is_integer(schema.field("label").type):
        raise FeatureTableError(f"{where}: column 'label' must hold integers, got {schema.field('label').type}")
    split = schema.field("split").type
    if pa.types.is_dictionary(split):  # e.g. a pandas categorical
        split = split.value_type
    if not (pa.types.is_string(split) or pa.types.is_large_string(split)):
        raise FeatureTableError(f"{where}: column 'split' must hold strings, got {schema.field('split').type}")
    return fs, files, schema


def _data_column(schema: pa.Schema) -> str:
    """``"activation"`` for an activation table, else ``"embedding"``."""
    return "activation" if "activation" in schema.names and "embedding" not in schema.names else "embedding"


def _metadata(schema: pa.Schema) -> dict[str, Any]:
    return json.loads(schema.metadata[METADATA_KEY]) if schema.metadata and METADATA_KEY in schema.metadata else {}


def read_metadata(uri: str, *, endpoint_url: str | None = None) -> dict[str, Any]:
    """The JSON metadata of a feature table (``{}`` when it has none); reads only the schema."""
    return _metadata(_open(uri, endpoint_url)[2])


# ------------------------------------------------------------------------------------------ reading


def _first_row(bad: np.ndarray, split: np.ndarray) -> str:
    """``"row i of split 's'"`` for the first True of ``bad`` (``i`` counts that split's rows in file order)."""
    row = int(np.argmax(bad))
    return f"row {int((split[:row] == split[row]).sum())} of split {str(split[row])!r}"


def _embeddings(uri: str, column: pa.ChunkedArray, split: np.ndarray) -> np.ndarray:
    """``[N, D]`` float32 from a list<float> column, refusing nulls, ragged or zero widths and NaN/inf."""
    emb = column.combine_chunks()
    if emb.null_count:
        bad = emb.is_null().to_numpy(zero_copy_only=False)
        raise FeatureTableError(f"{uri}: column 'embedding' has {emb.null_count} null rows "
                                f"(first: {_first_row(bad, split)})")
    if len(emb) == 0:
        return np.zeros((0, 0), dtype=np.float32)
    widths = pc.list_value_length(emb).to_numpy()
    if widths.min() != widths.max():
        raise FeatureTableError(f"{uri}: embeddings have unequal widths {widths.min()}..{widths.max()} "
                                f"(first differing: {_first_row(widths != widths[0], split)})")
    if widths[0] == 0:
        raise FeatureTableError(f"{uri}: embeddings have zero width")
    x = np.asarray(emb.flatten().to_numpy(zero_copy_only=False), dtype=np.float32).reshape(len(emb), int(widths[0]))
    finite = np.isfinite(x).all(axis=1)
    if not finite.all():
        raise FeatureTableError(f"{uri}: column 'embedding' has NaN or infinite values in {int((~finite).sum())} "
                                f"rows (first: {_first_row(~finite, split)})")
    return x


def _activations(uri: str, column: pa.ChunkedArray, split: np.ndarray, shape: tuple[int, ...]
                 ) -> dict[str, np.ndarray]:
    """``{split: float16 [n, V, *shape]}`` from the list<float16> column; every row of a split must hold the
    same number ``V`` of whole views, and every value must be finite."""
    act = column.combine_chunks()
    if act.null_count:
        bad = act.is_null().to_numpy(zero_copy_only=False)
        raise FeatureTableError(f"{uri}: column 'activation' has {act.null_count} null rows "
                                f"(first: {_first_row(bad, split)})")
    size = int(np.prod(shape))
    widths = pc.list_value_length(act).to_numpy().astype(np.int64) if len(act) else np.zeros(0, np.int64)
    bad = (widths % size != 0) | (widths == 0)
    if bad.any():
        raise FeatureTableError(f"{uri}: activations must hold whole views of shape {list(shape)} ({size} values), "
                                f"found a row of {int(widths[bad][0])} (first: {_first_row(bad, split)})")
    values = np.asarray(act.flatten().to_numpy(zero_copy_only=False), dtype=np.float16)
    offsets = np.concatenate([[0], np.cumsum(widths)])
    out: dict[str, np.ndarray] = {}
    for name in np.unique(split):
        rows = np.flatnonzero(split == name)
        views = widths[rows] // size
        if views.min() != views.max():
            raise FeatureTableError(f"{uri}: split {str(name)!r} has rows with {views.min()} and {views.max()} "
                                    "views; every row of a split needs the same number")
        starts = offsets[rows]
        if len(rows) and (np.diff(starts) == widths[rows][:-1]).all():  # contiguous rows: one slice, no copy
            block = values[starts[0]:starts[0] + len(rows) * int(widths[rows[0]])]
        else:
            block = np.concatenate([values[a:a + w] for a, w in zip(starts, widths[rows])])
        x = block.reshape(len(rows), int(views[0]), *shape)
        if not x.flags.writeable:  # a zero-copy view of Arrow's buffer: torch wants memory it may write
            x = x.copy()
        finite = np.isfinite(x.reshape(len(rows), -1)).all(axis=1)
        if not finite.all():
            raise FeatureTableError(f"{uri}: column 'activation' has NaN or infinite values in "
                                    f"{int((~finite).sum())} rows (first: row {int(np.argmax(~finite))} of split "
                                    f"{str(name)!r})")
        out[str(name)] = x
    return out


def _class_counts(uri: str, meta: dict, labels: np.ndarray, split: np.ndarray) -> tuple[int, int]:
    """``(Ks, K)`` from the metadata, else inferred from the labels read; labels checked against them."""
    known = labels[split == "known"]
    if "num_known" in meta:
        num_known = int(meta["num_known"])
    elif len(known):
        num_known = int(known.max()) + 1
    else:
        raise FeatureTableError(f"{uri}: without 'num_known' in its metadata the known split must be read "
                                f"to infer Ks")
    num_classes = num_known + int(meta["num_novel"]) if "num_novel" in meta else \
        max(num_known, int(labels.max()) + 1 if len(labels) else 0)
    ranges = {"known": (0, num_known, "0..Ks-1"), "novel": (num_known, num_classes, "Ks..K-1")}
    for name in np.unique(split):
        lo, hi, rule = ranges.get(str(name), (0, num_classes, "0..K-1"))
        found = labels[split == name]
        if found.min() < lo or found.max() >= hi:
            raise FeatureTableError(f"{uri}: {name} labels must lie in {rule} (Ks={num_known}, K={num_classes}), "
                                    f"found {int(found.min())}..{int(found.max())}")
    return num_known, num_classes


def read_class_summary(uri: str, *, endpoint_url: str | None = None) -> tuple[int, int, list[str], list[int]]:
    """``(Ks, Ku, class_names [K], train_counts [K])`` of a feature table, reading only its ``label`` and
    ``split`` columns (a run's classes without loading its features)."""
    fs, files, schema = _open(uri, endpoint_url)
    meta = _metadata(schema)
    table = with_retries(lambda: pads.dataset(files, filesystem=fs, format="parquet").to_table(
        columns=["label", "split"]), uri)
    labels = table.column("label").to_numpy().astype(np.int64)
    split = np.asarray(table.column("split").cast(pa.string()).to_pylist(), dtype=object)
    num_known, num_classes = _class_counts(uri, meta, labels, split)
    train = np.isin(split, ["known", "novel"])
    counts = np.bincount(labels[train], minlength=num_classes).tolist()
    names = [str(n) for n in meta.get("class_names", [str(k) for k in range(num_classes)])]
    return num_known, num_classes - num_known, names, counts


def read_split_counts(uri: str, *, endpoint_url: str | None = None) -> dict[str, int]:
    """Rows per split of a feature table (``{"known": n_k, "novel": n_u, "test": n_t}``, splits it has), reading
    only its ``split`` column: no label and no feature is read."""
    fs, files, _ = _open(uri, endpoint_url)
    table = with_retries(lambda: pads.dataset(files, filesystem=fs, format="parquet").to_table(columns=["split"]), uri)
    counts = pc.value_counts(table.column("split").cast(pa.string())).to_pylist()
    return {str(c["values"]): int(c["counts"]) for c in counts}


def read_feature_table(uri: str, splits: Sequence[str] | None = None, *,
                       endpoint_url: str | None = None) -> FeatureSplits:
    """Load a feature table (local path, ``file://`` or ``s3://``; file or folder) into per-split tensors.

    Args:
        splits: read only the rows of these splits (a parquet filter: other rows are never returned —
            the γ search reads ``("known",)`` and never sees a novel row); None reads every split.

    Returns:
        :class:`FeatureSplits` with one entry per split that has rows.

    Raises:
        FeatureTableError naming ``uri``: a missing column or one of the wrong type, null embeddings, ragged
        or zero widths, NaN/inf embeddings (naming the first bad row and its split), unknown split names, a
        requested split without rows (``known`` and ``novel`` when ``splits`` is None), labels outside
        ``0..Ks-1`` (known), ``Ks..K-1`` (novel) or ``0..K-1`` (val/test), or class names that are not ``K``.
        ``ncdlr.data.storage`` errors for a missing table or bucket, refused credentials or no endpoint.
    """
    if splits is not None:
        splits = tuple(checked_splits(splits))
    fs, files, schema = _open(uri, endpoint_url)
    meta = _metadata(schema)
    data = _data_column(schema)
    columns = [c for c in (data, "label", "split", "source_id") if c in schema.names]
    rows = None if splits is None else pc.field("split").isin(list(splits))
    dataset = pads.dataset(files, filesystem=fs, format="parquet", schema=schema)
    table = with_retries(lambda: dataset.to_table(columns=columns, filter=rows), uri)

    for name in ("label", "split"):
        if table.column(name).null_count:
            raise FeatureTableError(f"{uri}: column {name!r} has {table.column(name).null_count} null rows")
    split = table.column("split").cast(pa.string()).to_numpy(zero_copy_only=False).astype(str)
    present = set(np.unique(split).tolist()) if len(split) else set()
    if unknown := sorted(present - set(SPLITS)):
        raise FeatureTableError(f"{uri}: column 'split' has values {unknown}; splits are {SPLITS}")
    for needed in splits if splits is not None else ("known", "novel"):
        if needed not in present:
            raise FeatureTableError(f"{uri}: no rows with split {needed!r}")
    shape: tuple[int, ...] = ()
    if data == "activation":  # rows in source_id order within each split: independent of the parts' order
        shape = tuple(int(d) for d in meta["shape"])
        if "source_id" in columns:
            order = np.lexsort((table.column("source_id").to_numpy(zero_copy_only=False).astype(str), split))
            table, split = table.take(pa.array(order)), split[order]
        x = _activations(uri, table.column("activation"), split, shape)
    else:
        x = _embeddings(uri, table.column("embedding"), split)
    y = table.column("label").to_numpy().astype(np.int64)
    num_known, num_classes = _class_counts(uri, meta, y, split)
    names = list(meta.get("class_names") or [str(i) for i in range(num_classes)])
    if len(names) != num_classes:
        raise FeatureTableError(f"{uri}: metadata names {len(names)} classes, but Ks + Ku = {num_classes}")

    order = [s for s in SPLITS if s in present]
    ids = table.column("source_id").to_numpy(zero_copy_only=False) if "source_id" in columns else None
    return FeatureSplits(
        features={s: torch.from_numpy(x[s] if shape else x[split == s]) for s in order},
        labels={s: torch.from_numpy(y[split == s]) for s in order},
        num_known=num_known, num_novel=num_classes - num_known, class_names=names,
        source_ids={} if ids is None else {s: [str(v) for v in ids[split == s]] for s in order},
        metadata=meta, activation_shape=shape)


# ------------------------------------------------------------------------------------------ writing


def write_feature_table(uri: str, embeddings: np.ndarray, labels: np.ndarray, splits: list[str] | np.ndarray, *,
                        num_known: int, num_novel: int, class_names: list[str] | None = None,
                        source_ids: list[str] | None = None, extra: dict | None = None,
                        endpoint_url: str | None = None) -> None:
    """Write ``embeddings [N, D]`` with ``labels [N]`` and ``splits [N]`` as one parquet feature table.

    ``class_names`` (default ``"0".."K-1"``) fill the ``class_name`` column and the metadata; ``extra`` is
    merged into the metadata. Local paths get their parent folders; ``s3://`` objects need none.
    """
    embeddings = np.ascontiguousarray(embeddings, dtype=np.float32)
    n, dim = embeddings.shape
    columns = {
        "embedding": pa.FixedSizeListArray.from_arrays(pa.array(embeddings.reshape(-1)), dim).cast(pa.list_(pa.float32())),
        "label": pa.array(np.asarray(labels, dtype=np.int32)),
        "split": pa.array([str(s) for s in splits]),
    }
    names = class_names or [str(i) for i in range(num_known + num_novel)]
    columns["class_name"] = pa.array([names[int(label)] for label in labels])
    if source_ids is not None:
        columns["source_id"] = pa.array(list(source_ids))
    meta = {"num_known": num_known, "num_novel": num_novel, "class_names": names, **(extra or {})}
    table = pa.table(columns).replace_schema_metadata({METADATA_KEY: json.dumps(meta).encode()})
    fs, path = resolve(uri, endpoint_url)
    if isinstance(fs, pafs.LocalFileSystem):  # object stores need no parent "directories"
        fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
    with_retries(lambda: pq.write_table(table, path, filesystem=fs), uri)


def write_table_part(uri: str, activations: np.ndarray, labels: np.ndarray, splits: Sequence[str], *,
                     source_ids: Sequence[str], class_names: list[str], metadata: dict,
                     endpoint_url: str | None = None) -> None:
    """Write one part (one parquet file at ``uri``) of an activation table: ``activations`` ``[n, V, *shape]``
    (stored float16, ``shape`` = ``metadata["shape"]``), ``labels [n]``, ``splits [n]``, ``source_ids [n]``.

    A local part is written to a hidden temporary name and renamed, an ``s3://`` part is one PUT: a reader or a
    resumed ``embed`` never sees half a part. ``metadata`` (``kind``, ``shape``, ``num_known``, ...) goes into
    every part's schema.
    """
    act = np.ascontiguousarray(activations, dtype=np.float16)
    n = act.shape[0]
    if tuple(act.shape[2:]) != tuple(metadata["shape"]):
        raise ValueError(f"activations {act.shape} do not match the table's shape {metadata['shape']}")
    width = int(np.prod(act.shape[1:]))
    offsets = pa.array(np.arange(n + 1, dtype=np.int64) * width)  # 64-bit: a whole cache can pass 2^31 values
    columns = {
        "activation": pa.LargeListArray.from_arrays(offsets, pa.array(act.reshape(-1), type=pa.float16())),
        "label": pa.array(np.asarray(labels, dtype=np.int32)),
        "split": pa.array([str(s) for s in splits]),
        "class_name": pa.array([class_names[int(label)] for label in labels]),
        "source_id": pa.array([str(s) for s in source_ids]),
    }
    meta = {**metadata, "kind": ACTIVATIONS, "class_names": class_names}
    write_parquet(pa.table(columns).replace_schema_metadata({METADATA_KEY: json.dumps(meta).encode()}), uri,
                  endpoint_url)


# ------------------------------------------------------------------------------------------ Ray Data


def _stack_embeddings(batch: dict[str, Any]) -> dict[str, Any]:
    """``embedding``: list<float32> per row → float32 ``[N, D]``."""
    emb = batch["embedding"]
    if emb.dtype == object:
        emb = np.stack(emb)
    batch["embedding"] = np.ascontiguousarray(emb, dtype=np.float32)
    return batch


def load_feature_table(uri: str, splits: Iterable[str] = ("known", "novel", "test"), *,
                       endpoint_url: str | None = None) -> dict[str, Any]:
    """One lazy Ray Data ``Dataset`` per requested split, rows filtered by ``split`` at read time, ``embedding``
    as float32 ``[D]`` per row (plus ``label``, ``split`` and ``class_name``/``source_id`` where present).

    Nothing is read here but the schema, so only its checks apply (missing columns, column types:
    :class:`FeatureTableError` naming the file); :func:`read_feature_table` checks the rows.
    """
    import ray.data

    from ncdlr.data.pipeline import ShardDatasource

    splits = checked_splits(splits)
    fs, files, schema = _open(uri, endpoint_url)
    if _data_column(schema) != "embedding":
        raise FeatureTableError(f"{uri} is an activation cache: read it with read_feature_table (training reads it "
                                "whole, in memory)")
    columns = [c for c in (*FEATURE_COLUMNS, *OPTIONAL_COLUMNS) if c in schema.names]
    sizes = [with_retries(lambda f=f: fs.get_file_info(f), uri).size for f in files]
    return {split: ray.data.read_datasource(ShardDatasource(fs, files, sizes=sizes, columns=columns, split=split))
            .map_batches(_stack_embeddings, batch_format="numpy", zero_copy_batch=False)
            for split in splits}


# ------------------------------------------------------------------------------------------ synthetic


def synthetic_features(num_known: int = 10, num_novel: int = 10, dim: int = 32, n_max: int = 120,
                       ratio: float = 10.0, test_per_class: int = 10, noise: float = 0.6, seed: int = 0
                       ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A long-tailed clustered feature set (for tests and benchmarks): ``(embeddings [N, D], labels [N], splits [N])``.

    Class ``c`` is a random unit direction plus Gaussian noise of std ``noise / sqrt(D)`` per coordinate;
    train counts follow ``n_max · ratio^(-r/(C-1))`` inside each half; ``test_per_class`` balanced test rows.
    """
    rng = np.random.default_rng(seed)
    k = num_known + num_novel
    centres = rng.standard_normal((k, dim))
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    counts = long_tail_counts(n_max, num_known, ratio) + long_tail_counts(n_max, num_novel, ratio)
    xs, ys, ss = [], [], []
    for c in range(k):
        for split, n in (("known" if c < num_known else "novel", counts[c]), ("test", test_per_class)):
            xs.append(centres[c] + rng.standard_normal((n, dim)) * noise / np.sqrt(dim))
            ys.append(np.full(n, c))
            ss += [split] * n
    return np.concatenate(xs).astype(np.float32), np.concatenate(ys), np.array(ss)
