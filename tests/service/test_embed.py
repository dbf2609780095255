"""`ncdlr embed`: a prepared image dataset through a frozen encoder into a feature table (tables: tests/data/test_features.py)."""

import pytest

from ncdlr.data.features import read_feature_table
from ncdlr.data.shards import write_dataset
from ncdlr.service.embed import embed_dataset
from tests.fixtures.tiny_images import make_tiny_dataset


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
