"""`ncdlr embed`: a prepared image dataset through a frozen encoder into a feature table (tables: tests/data/test_features.py)."""

import warnings

import pytest
import torch

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


@pytest.mark.slow
def test_embed_writes_the_same_table_whatever_the_batching_and_the_actors(ray_local, tmp_path):
    """efficientnet_lite0 (32 px) in batches of 8 on one actor or of 3 on two: the same rows, in (split, source_id)
    order, with the same bits (fixed passes inside the actors; rows sorted before writing)."""
    records, classes, info = make_tiny_dataset(train_counts=(6, 3, 5, 2), test_per_class=2, size=32)
    write_dataset(str(tmp_path / "data"), records, classes, info, progress=False)
    tables = []
    for name, batch, actors in (("a", 8, 1), ("b", 3, 2)):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # timm without weights warns (by design)
            stats = embed_dataset(str(tmp_path / "data"), str(tmp_path / f"{name}.parquet"),
                                  encoder="efficientnet_lite0", image_size=32, batch_size=batch, num_actors=actors)
        assert stats["rows"] == len(records) and stats["pass_rows"] == 64
        tables.append(read_feature_table(str(tmp_path / f"{name}.parquet")))
    a, b = tables
    for split in a.features:
        assert a.source_ids[split] == sorted(a.source_ids[split]) == b.source_ids[split], split
        assert torch.equal(a.features[split], b.features[split]), split
