"""Feature tables: write → read round trips (local and S3), every refused input named, split-restricted reads,
and the lazy Ray Data reader."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from ncdlr.data.features import (
    METADATA_KEY,
    FeatureTableError,
    load_feature_table,
    read_feature_table,
    read_metadata,
    read_split_counts,
    synthetic_features,
    write_feature_table,
)
from ncdlr.data.longtail import long_tail_counts
from ncdlr.data.storage import ObjectNotFoundError


def _write(path: Path, embedding: list, label: list[int], split: list[str], meta: dict | None = None,
           embedding_type: pa.DataType | None = pa.list_(pa.float32())) -> str:
    """A hand-made table (no writer checks), optionally with ``ncdlr`` metadata."""
    table = pa.table({"embedding": pa.array(embedding, type=embedding_type), "label": pa.array(label, pa.int32()),
                      "split": pa.array(split, pa.string())})
    if meta is not None:
        table = table.replace_schema_metadata({METADATA_KEY: json.dumps(meta).encode()})
    pq.write_table(table, path)
    return str(path)


def _good_rows() -> tuple[list, list[int], list[str]]:
    """Ks = 2, Ku = 2: two known, three novel and one test row of width 2."""
    embedding = [[0.0, 1.0], [1.0, 0.0], [0.5, 0.5], [0.1, 0.2], [0.3, 0.3], [0.75, 0.25]]
    return embedding, [0, 1, 2, 3, 3, 1], ["known", "known", "novel", "novel", "novel", "test"]


# -- round trips ------------------------------------------------------------------------------------------------

def test_round_trip_keeps_rows_classes_splits_and_source_ids(tmp_path):
    x, y, s = synthetic_features(num_known=3, num_novel=4, dim=5, n_max=10, ratio=2, test_per_class=2)
    ids = [f"img-{i}" for i in range(len(y))]
    path = str(tmp_path / "sub" / "t.parquet")
    write_feature_table(path, x, y, s, num_known=3, num_novel=4, class_names=list("abcdefg"), source_ids=ids,
                        extra={"encoder": "tiny_cnn"})
    table = read_feature_table(path)
    assert (table.num_known, table.num_novel, table.dim) == (3, 4, 5)
    assert table.class_names == list("abcdefg") and table.metadata["encoder"] == "tiny_cnn"
    for split in ("known", "novel", "test"):
        assert torch.equal(table.features[split], torch.from_numpy(x[s == split]))
        assert table.labels[split].dtype == torch.int64 and table.labels[split].tolist() == y[s == split].tolist()
        assert table.source_ids[split] == [i for i, keep in zip(ids, s == split) if keep]
    assert table.train_counts() == [int(((y == c) & (s != "test")).sum()) for c in range(7)]


def test_round_trip_through_s3(s3_bucket):
    x, y, s = synthetic_features(num_known=3, num_novel=3, dim=4, n_max=8, ratio=2, test_per_class=2, seed=5)
    uri = f"{s3_bucket}/feats/t.parquet"
    write_feature_table(uri, x, y, s, num_known=3, num_novel=3)
    table = read_feature_table(uri)
    assert (table.num_known, table.num_novel) == (3, 3)
    assert all(torch.equal(table.features[split], torch.from_numpy(x[s == split])) for split in ("known", "novel", "test"))
    assert read_metadata(uri)["num_novel"] == 3


def test_a_folder_of_parquet_files_reads_as_one_table(tmp_path):
    embedding, label, split = _good_rows()
    (tmp_path / "t").mkdir()
    _write(tmp_path / "t" / "part-0.parquet", embedding[:3], label[:3], split[:3], meta={"num_known": 2, "num_novel": 2})
    _write(tmp_path / "t" / "part-1.parquet", embedding[3:], label[3:], split[3:], meta={"num_known": 2, "num_novel": 2})
    table = read_feature_table(str(tmp_path / "t"))
    assert table.labels["novel"].tolist() == [2, 3, 3] and table.features["test"].tolist() == [[0.75, 0.25]]


def test_table_without_metadata_infers_known_and_novel_counts(tmp_path):
    path = _write(tmp_path / "plain.parquet", [[0.0, 1.0]] * 4, [0, 1, 2, 3], ["known", "known", "novel", "novel"])
    table = read_feature_table(path)
    assert (table.num_known, table.num_novel) == (2, 2) and table.class_names == ["0", "1", "2", "3"]
    assert table.metadata == {}


def test_synthetic_features_are_seeded_and_long_tailed():
    x, y, s = synthetic_features(num_known=4, num_novel=4, dim=6, n_max=40, ratio=8, test_per_class=3, seed=7)
    again = synthetic_features(num_known=4, num_novel=4, dim=6, n_max=40, ratio=8, test_per_class=3, seed=7)
    assert all(np.array_equal(a, b) for a, b in zip((x, y, s), again))
    assert x.dtype == np.float32 and x.shape == (len(y), 6)
    train = np.bincount(y[s != "test"], minlength=8).tolist()
    assert train == long_tail_counts(40, 4, 8) + long_tail_counts(40, 4, 8)
    assert np.bincount(y[s == "test"]).tolist() == [3] * 8


# -- split-restricted reads -------------------------------------------------------------------------------------

def test_reading_known_never_returns_novel_rows(tmp_path):
    embedding, label, split = _good_rows()
    embedding[2] = [float("nan"), 0.0]  # a novel row a full read refuses: it must not even be looked at
    label[3] = -7
    path = _write(tmp_path / "t.parquet", embedding, label, split, meta={"num_known": 2, "num_novel": 2})
    table = read_feature_table(path, splits=("known",))
    assert list(table.features) == ["known"] and list(table.labels) == ["known"]
    assert table.labels["known"].tolist() == [0, 1] and (table.num_known, table.num_novel) == (2, 2)
    with pytest.raises(FeatureTableError):
        read_feature_table(path)


def test_split_counts_read_the_split_column_alone(tmp_path):
    embedding, label, split = _good_rows()
    embedding[2], label[3] = [float("nan"), 0.0], -7  # a bad novel row and label: neither column is read
    path = _write(tmp_path / "t.parquet", embedding, label, split, meta={"num_known": 2, "num_novel": 2})
    assert read_split_counts(path) == {"known": 2, "novel": 3, "test": 1}
    with pytest.raises(ObjectNotFoundError):
        read_split_counts(str(tmp_path / "missing.parquet"))


def test_labeled_rows_are_the_known_then_the_novel_rows(tmp_path):
    embedding, label, split = _good_rows()
    features, labels, labeled = read_feature_table(_write(tmp_path / "t.parquet", embedding, label, split),
                                                   splits=("known", "novel")).labeled_rows()
    assert features.dtype == np.float32 and features.shape == (5, 2)
    assert labels.tolist() == [0, 1, 2, 3, 3] and labeled.tolist() == [True, True, False, False, False]


def test_an_unknown_split_name_is_refused(tmp_path):
    embedding, label, split = _good_rows()
    path = _write(tmp_path / "t.parquet", embedding, label, split)
    with pytest.raises(ValueError, match="unknown split"):
        read_feature_table(path, splits=("train",))
    split[5] = "train"
    path = _write(tmp_path / "t.parquet", embedding, label, split)
    with pytest.raises(FeatureTableError, match=r"t.parquet: column 'split' has values \['train'\]"):
        read_feature_table(path)


# -- refused tables: one test per problem, each message names the table ----------------------------------------

def test_missing_table_raises_the_storage_error_naming_it(tmp_path):
    with pytest.raises(ObjectNotFoundError, match="nothing.parquet: feature table not found"):
        read_feature_table(str(tmp_path / "nothing.parquet"))


def test_missing_column_is_named(tmp_path):
    pq.write_table(pa.table({"embedding": [[0.0]], "split": ["known"]}), tmp_path / "bad.parquet")
    with pytest.raises(FeatureTableError, match=r"bad.parquet: feature table lacks column\(s\) label"):
        read_feature_table(str(tmp_path / "bad.parquet"))


@pytest.mark.parametrize("embedding, kind", [([0.5, 0.5], pa.float32()), ([["a"], ["b"]], pa.list_(pa.string()))])
def test_embedding_that_is_not_a_list_of_floats_is_refused(tmp_path, embedding, kind):
    path = _write(tmp_path / "bad.parquet", embedding, [0, 1], ["known", "novel"], embedding_type=kind)
    with pytest.raises(FeatureTableError, match="bad.parquet: column 'embedding' must be a list of floats"):
        read_feature_table(path)


def test_null_embedding_is_refused_naming_the_row(tmp_path):
    embedding, label, split = _good_rows()
    embedding[3] = None
    path = _write(tmp_path / "bad.parquet", embedding, label, split)
    with pytest.raises(FeatureTableError, match=r"bad.parquet: column 'embedding' has 1 null rows "
                                                r"\(first: row 1 of split 'novel'\)"):
        read_feature_table(path)


def test_ragged_embeddings_are_refused(tmp_path):
    embedding, label, split = _good_rows()
    embedding[4] = [0.3, 0.3, 0.3]
    path = _write(tmp_path / "bad.parquet", embedding, label, split)
    with pytest.raises(FeatureTableError, match=r"bad.parquet: embeddings have unequal widths 2..3 "
                                                r"\(first differing: row 2 of split 'novel'\)"):
        read_feature_table(path)


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_non_finite_embedding_is_refused_naming_the_table_and_row(tmp_path, value):
    embedding, label, split = _good_rows()
    embedding[4] = [0.3, value]
    path = _write(tmp_path / "bad.parquet", embedding, label, split)
    with pytest.raises(FeatureTableError, match=r"bad.parquet: column 'embedding' has NaN or infinite values in 1 "
                                                r"rows \(first: row 2 of split 'novel'\)"):
        read_feature_table(path)


@pytest.mark.parametrize("missing", ["known", "novel"])
def test_table_without_known_or_novel_rows_is_refused(tmp_path, missing):
    embedding, label, split = _good_rows()
    keep = [i for i, s in enumerate(split) if s != missing]
    path = _write(tmp_path / "bad.parquet", [embedding[i] for i in keep], [label[i] for i in keep],
                  [split[i] for i in keep], meta={"num_known": 2, "num_novel": 2})
    with pytest.raises(FeatureTableError, match=f"bad.parquet: no rows with split '{missing}'"):
        read_feature_table(path)


def test_known_label_at_or_above_ks_is_refused(tmp_path):
    embedding, label, split = _good_rows()
    label[1] = 2
    path = _write(tmp_path / "bad.parquet", embedding, label, split, meta={"num_known": 2, "num_novel": 2})
    with pytest.raises(FeatureTableError, match=r"bad.parquet: known labels must lie in 0..Ks-1 \(Ks=2, K=4\), "
                                                r"found 0..2"):
        read_feature_table(path)


def test_novel_label_below_ks_is_refused(tmp_path):
    path = _write(tmp_path / "bad.parquet", [[0.0], [1.0]], [1, 0], ["known", "novel"])
    with pytest.raises(FeatureTableError, match="bad.parquet: novel labels must lie in Ks..K-1"):
        read_feature_table(path)


# -- Ray Data -------------------------------------------------------------------------------------------------

def test_lazy_reader_refuses_a_table_without_embedding_naming_the_file(tmp_path):
    pq.write_table(pa.table({"label": [0], "split": ["known"]}), tmp_path / "features.parquet")
    with pytest.raises(FeatureTableError, match=r"features.parquet: feature table lacks column\(s\) embedding"):
        load_feature_table(str(tmp_path / "features.parquet"))


@pytest.mark.slow
def test_lazy_reader_streams_embeddings_per_split(ray_local, tmp_path):
    from ncdlr.data.pipeline import PairedBatches

    emb = np.random.default_rng(0).normal(size=(10, 6)).astype(np.float32)
    _write(tmp_path / "features.parquet", list(emb), [0, 1, 2, 3, 2, 3, 0, 1, 2, 3],
           ["known", "known", "novel", "novel", "novel", "novel", "test", "test", "test", "test"])
    datasets = load_feature_table(str(tmp_path / "features.parquet"))
    batches = PairedBatches(datasets["known"], datasets["novel"], batch_size=2)
    steps = list(batches)
    batches.close()
    assert len(steps) == 2 and steps[0]["known"]["embedding"].shape == (2, 6)
    novel = torch.cat([s["novel"]["embedding"] for s in steps])
    assert novel.dtype == torch.float32
    assert sorted(map(tuple, novel.tolist())) == sorted(map(tuple, emb[2:6].tolist()))
    assert sorted(torch.cat([s["novel"]["label"] for s in steps]).tolist()) == [2, 2, 3, 3]
    with pytest.raises(ValueError, match="novel stream holds fewer than batch_size=8"):
        list(PairedBatches(datasets["known"], datasets["novel"], batch_size=8))
