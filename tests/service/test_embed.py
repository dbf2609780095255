"""Feature tables: write/read round trip, named errors, and `ncdlr embed` over a prepared image dataset."""

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ncdlr.data.shards import write_dataset
from ncdlr.service.embed import embed_dataset, read_feature_table, synthetic_features, write_feature_table
from tests.fixtures.tiny_images import make_tiny_dataset


def test_feature_table_round_trip_keeps_classes_and_splits(tmp_path):
    x, y, s = synthetic_features(num_known=3, num_novel=4, dim=5, n_max=10, ratio=2, test_per_class=2)
    write_feature_table(str(tmp_path / "t.parquet"), x, y, s, num_known=3, num_novel=4, class_names=list("abcdefg"))
    table = read_feature_table(str(tmp_path / "t.parquet"))
    assert (table.num_known, table.num_novel, table.dim) == (3, 4, 5)
    assert table.class_names == list("abcdefg")
    assert np.allclose(table.features["novel"].numpy(), x[s == "novel"])
    assert table.train_counts()[:3] == [int(((y == c) & (s == "known")).sum()) for c in range(3)]


def test_table_without_metadata_infers_known_and_novel_counts(tmp_path):
    pq.write_table(pa.table({"embedding": [[0.0, 1.0]] * 4, "label": [0, 1, 2, 3],
                             "split": ["known", "known", "novel", "novel"]}), tmp_path / "plain.parquet")
    table = read_feature_table(str(tmp_path / "plain.parquet"))
    assert (table.num_known, table.num_novel) == (2, 2)


@pytest.mark.parametrize("columns, message", [
    ({"embedding": [[0.0]], "split": ["known"]}, "lacks column 'label'"),
    ({"embedding": [0.5], "label": [0], "split": ["known"]}, "must be a list of floats"),
    ({"embedding": [[0.0]], "label": [0], "split": ["known"]}, "no rows with split 'novel'"),
    ({"embedding": [[0.0], [1.0]], "label": [1, 0], "split": ["known", "novel"]}, "known labels must be"),
])
def test_bad_feature_table_is_refused_naming_the_file(tmp_path, columns, message):
    path = tmp_path / "bad.parquet"
    pq.write_table(pa.table(columns), path)
    with pytest.raises(ValueError, match=message) as info:
        read_feature_table(str(path))
    assert "bad.parquet" in str(info.value)


def test_missing_feature_table_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="nothing.parquet"):
        read_feature_table(str(tmp_path / "nothing.parquet"))


@pytest.mark.slow
def test_embed_writes_one_row_per_decodable_image(ray_local, tmp_path):
    records, classes, info = make_tiny_dataset(train_counts=(6, 3, 5, 2), test_per_class=2, size=32)
    write_dataset(str(tmp_path / "data"), records, classes, info, progress=False)
    stats = embed_dataset(str(tmp_path / "data"), str(tmp_path / "f.parquet"), encoder="tiny_cnn", image_size=32,
                          batch_size=8)
    table = read_feature_table(str(tmp_path / "f.parquet"))
    assert stats["rows"] == len(records) and stats["bad_images"] == 0
    assert table.dim == 64 and (table.num_known, table.num_novel) == (2, 2)
    assert sorted(table.features) == ["known", "novel", "test"] and len(table.labels["test"]) == 8
