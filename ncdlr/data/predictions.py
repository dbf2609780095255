"""Prediction tables: what ``ncdlr predict`` writes and ``ncdlr gallery`` reads (a folder of parquet parts).

One row per readable image:

=================  ==================  ===================================================================
column             type                meaning
=================  ==================  ===================================================================
``source_id``      string              the image's id: its path under the folder/prefix, or the dataset's id
``pred``           int32               predicted class ``argmax_k z·p_k`` over all ``K`` (known ``0..Ks-1``)
``is_novel``       bool                ``pred >= Ks``
``name``           string              the known class's name, or the novel cluster's (``novel-NN`` or the
                                       user's name from the run's ``names.yaml``)
``confidence``     float32             cosine of the embedding to the predicted prototype, in [-1, 1] (a run
                                       with a post-hoc fix: its fixed score instead, e.g. cos/T − log π̂)
``margin``         float32             that score minus the second largest (≥ 0; small = ambiguous)
``top5``           list<int32>         the five (or K) best-scored classes, best first
``top5_score``     list<float32>       their scores (cosines, or the fixed scores)
``label``          int32, nullable     the true class where the data has labels (a prepared dataset), else null
``split``          string, nullable    the dataset split the row came from (prepared datasets and tables)
``embedding``      list<float32>       ``z`` ``[D]`` (unit norm), only with ``ncdlr predict --embeddings``
=================  ==================  ===================================================================

Files: ``part-<id>.parquet`` (rows) and ``unreadable-<id>.parquet`` (``source_id`` of files that could not
be decoded, with the ``reason``), each written whole (:func:`ncdlr.data.storage.write_parquet`), so a
resumed ``predict`` skips every id already in either (``storage.source_ids_under``); ``_done.json`` (:func:`write_done`) once it finished. The schema metadata (key ``ncdlr_predictions``) holds the
run, checkpoint, data URI, the class names the rows were made with and the post-hoc fix (``posthoc``, ``none`` when
the run has none).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.fs as pafs

from ncdlr.data.storage import ObjectNotFoundError, join, put_bytes, resolve, with_retries, write_parquet

METADATA_KEY = b"ncdlr_predictions"
DONE_FILE = "_done.json"  #: written last by a predict that finished: its settings and counts
PART_PREFIX = "part-"
UNREADABLE_PREFIX = "unreadable-"
TOP = 5  #: classes kept per row in ``top5`` (fewer when K < 5)


@dataclass
class PredictionRows:
    """One batch of predictions, ``n`` rows; arrays as in the module table (``embedding`` optional ``[n, D]``)."""

    source_id: list[str]
    pred: np.ndarray  # [n] int
    confidence: np.ndarray  # [n] float
    margin: np.ndarray  # [n] float
    top: np.ndarray  # [n, min(5, K)] int
    top_score: np.ndarray  # [n, min(5, K)] float
    label: np.ndarray | None = None  # [n] int, -1 = unknown
    split: list[str] | None = None
    embedding: np.ndarray | None = None  # [n, D] float

    def __len__(self) -> int:
        return len(self.source_id)


def _list_column(values: np.ndarray, kind: pa.DataType) -> pa.Array:
    n, width = values.shape
    offsets = pa.array(np.arange(n + 1, dtype=np.int32) * width)
    return pa.ListArray.from_arrays(offsets, pa.array(values.reshape(-1), type=kind))


def prediction_table(rows: PredictionRows, num_known: int, names: Sequence[str], metadata: dict[str, Any]) -> pa.Table:
    """The rows as a table of the module's schema; ``names`` ``[K]`` display names by class index."""
    pred = np.asarray(rows.pred, dtype=np.int32)
    columns: dict[str, pa.Array] = {
        "source_id": pa.array([str(s) for s in rows.source_id], pa.string()),
        "pred": pa.array(pred, pa.int32()),
        "is_novel": pa.array(pred >= num_known, pa.bool_()),
        "name": pa.array([names[p] for p in pred], pa.string()),
        "confidence": pa.array(np.asarray(rows.confidence, dtype=np.float32)),
        "margin": pa.array(np.asarray(rows.margin, dtype=np.float32)),
        "top5": _list_column(np.asarray(rows.top, dtype=np.int32), pa.int32()),
        "top5_score": _list_column(np.asarray(rows.top_score, dtype=np.float32), pa.float32()),
    }
    label = rows.label if rows.label is not None else np.full(len(pred), -1)
    columns["label"] = pa.array(np.asarray(label, dtype=np.int32), pa.int32(), mask=np.asarray(label) < 0)
    columns["split"] = pa.array(rows.split if rows.split is not None else [None] * len(pred), pa.string())
    if rows.embedding is not None:
        columns["embedding"] = _list_column(np.asarray(rows.embedding, dtype=np.float32), pa.float32())
    return pa.table(columns).replace_schema_metadata({METADATA_KEY: json.dumps(metadata).encode()})


def write_part(out_uri: str, table: pa.Table, endpoint_url: str | None = None) -> str:
    """Write one part of rows under the folder ``out_uri``; returns its URI."""
    uri = join(out_uri, f"{PART_PREFIX}{uuid.uuid4().hex[:12]}.parquet")
    write_parquet(table, uri, endpoint_url)
    return uri


def write_unreadable(out_uri: str, source_ids: Sequence[str], reason: str, endpoint_url: str | None = None) -> None:
    """Record files that could not be decoded (``source_id``, ``reason``) under ``out_uri``."""
    if not source_ids:
        return
    table = pa.table({"source_id": pa.array([str(s) for s in source_ids], pa.string()),
                      "reason": pa.array([reason] * len(source_ids), pa.string())})
    write_parquet(table, join(out_uri, f"{UNREADABLE_PREFIX}{uuid.uuid4().hex[:12]}.parquet"), endpoint_url)


def _files(out_uri: str, prefix: str, endpoint_url: str | None) -> tuple[pafs.FileSystem, list[str]]:
    fs, path = resolve(out_uri, endpoint_url)
    entries = with_retries(lambda: fs.get_file_info(pafs.FileSelector(path, allow_not_found=True)), out_uri)
    return fs, sorted(e.path for e in entries if e.type == pafs.FileType.File and e.base_name.startswith(prefix)
                      and e.base_name.endswith(".parquet"))


def read_metadata(out_uri: str, endpoint_url: str | None = None) -> dict[str, Any]:
    """The metadata of the first part under ``out_uri`` (``{}`` when there is none yet)."""
    import pyarrow.parquet as pq

    fs, files = _files(out_uri, PART_PREFIX, endpoint_url)
    if not files:
        return {}
    schema = pq.read_schema(files[0], filesystem=fs)
    return json.loads(schema.metadata.get(METADATA_KEY, b"{}")) if schema.metadata else {}


def read_predictions(out_uri: str, columns: Sequence[str] | None = None,
                     endpoint_url: str | None = None) -> tuple[pa.Table, dict[str, Any]]:
    """All rows under ``out_uri`` (sorted by ``source_id``; ``columns``: these and ``source_id``) and the metadata;
    raises naming the folder when it holds no part."""
    fs, files = _files(out_uri, PART_PREFIX, endpoint_url)
    if not files:
        raise ObjectNotFoundError(out_uri, "no prediction parts (part-*.parquet) here; run `ncdlr predict` first")
    wanted = list(dict.fromkeys(["source_id", *columns])) if columns else None
    table = pads.dataset(files, filesystem=fs, format="parquet").to_table(columns=wanted).sort_by("source_id")
    return table, read_metadata(out_uri, endpoint_url)


def read_unreadable(out_uri: str, endpoint_url: str | None = None) -> pa.Table:
    """``source_id`` and ``reason`` of every file a ``predict`` into ``out_uri`` could not decode."""
    fs, files = _files(out_uri, UNREADABLE_PREFIX, endpoint_url)
    if not files:
        return pa.table({"source_id": pa.array([], pa.string()), "reason": pa.array([], pa.string())})
    return pads.dataset(files, filesystem=fs, format="parquet").to_table().sort_by("source_id")


def write_done(out_uri: str, record: dict[str, Any], endpoint_url: str | None = None) -> None:
    """Mark ``out_uri`` finished: ``_done.json`` holding ``record`` (the predict's settings and counts)."""
    fs, path = resolve(out_uri, endpoint_url)
    if isinstance(fs, pafs.LocalFileSystem):  # S3 has no folders to make (and rclone refuses folder markers)
        fs.create_dir(path, recursive=True)
    with_retries(lambda: put_bytes(fs, join(path, DONE_FILE), json.dumps(record, indent=1).encode()), out_uri)


def read_done(out_uri: str, endpoint_url: str | None = None) -> dict[str, Any] | None:
    """The record of a finished predict into ``out_uri`` (None while unfinished or absent)."""
    fs, path = resolve(out_uri, endpoint_url)
    try:
        with fs.open_input_stream(join(path, DONE_FILE)) as handle:
            return json.loads(handle.read())
    except FileNotFoundError:
        return None
