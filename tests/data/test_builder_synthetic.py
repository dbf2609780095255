"""Synthetic builder: an iNat-2018 tree run through the inat18 builder, exact tails, fast, deterministic."""

from __future__ import annotations

import io
import json
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from ncdlr.data.builders import synthetic
from ncdlr.data.longtail import long_tail_counts
from ncdlr.data.manifest import read_manifest
from ncdlr.data.shards import verify_dataset
from tests.fixtures.datasets import prepared_rows


def test_writes_an_inat_release_then_prepares_it_with_exact_tails(tmp_path: Path) -> None:
    config = synthetic.SyntheticConfig(num_classes=10, ratio=10.0, n_max=60, test_per_class=4, image_size=32)
    started = time.monotonic()
    manifest = synthetic.build(config, str(tmp_path / "out"), source_dir=tmp_path / "src", progress=False)
    assert time.monotonic() - started < 30
    train = json.loads((tmp_path / "src" / "train2018.json").read_text())
    assert {"images", "annotations", "categories"} <= set(train) and len(train["categories"]) == 10
    assert (tmp_path / "src" / train["images"][0]["file_name"]).is_file()
    assert manifest.train_counts == long_tail_counts(60, 5, 10.0) * 2
    assert manifest.split_counts == {"known": 127, "novel": 127, "test": 40}
    assert manifest.imbalance == {"known": 10.0, "novel": 10.0}
    assert manifest.name == "synthetic-10"
    rows = prepared_rows(tmp_path / "out")
    image = Image.open(io.BytesIO(rows[0]["image"]))
    assert image.format == "JPEG" and image.size == (32, 32)
    assert Counter(r["label"] for r in rows if r["split"] == "test") == {k: 4 for k in range(10)}


def test_odd_class_count_gives_ceil_half_known(tmp_path: Path) -> None:
    config = synthetic.SyntheticConfig(num_classes=5, n_max=8, ratio=4.0, test_per_class=1, image_size=16)
    manifest = synthetic.build(config, str(tmp_path / "out"), progress=False)
    assert (manifest.num_known, manifest.num_novel) == (3, 2)
    assert manifest.train_counts == long_tail_counts(8, 3, 4.0) + long_tail_counts(8, 2, 4.0)


def test_same_seed_same_bytes_other_seed_other_images(tmp_path: Path) -> None:
    config = synthetic.SyntheticConfig(num_classes=4, n_max=6, ratio=3.0, test_per_class=1, image_size=16)
    first = synthetic.build(config, str(tmp_path / "a"), progress=False)
    second = synthetic.build(config, str(tmp_path / "b"), progress=False)
    assert [s.sha256 for s in first.shards] == [s.sha256 for s in second.shards]
    other = synthetic.SyntheticConfig(num_classes=4, n_max=6, ratio=3.0, test_per_class=1, image_size=16, seed=1)
    third = synthetic.build(other, str(tmp_path / "c"), progress=False)
    assert [s.sha256 for s in first.shards] != [s.sha256 for s in third.shards]


def test_classes_look_different_and_images_vary_within_a_class() -> None:
    looks = synthetic.class_looks(20, seed=0)
    assert len({look.name for look in looks}) == 20
    rng = np.random.default_rng(0)
    a, b = (synthetic.render(looks[0], 32, rng).astype(float) for _ in range(2))
    assert np.abs(a - b).mean() > 10, "two images of one class are not copies"
    with pytest.raises(ValueError, match="2..384"):
        synthetic.class_looks(385, seed=0)


@pytest.mark.slow
def test_prepared_dataset_round_trips_through_s3(s3_bucket: str, tmp_path: Path) -> None:
    uri = f"{s3_bucket}/synthetic"
    config = synthetic.SyntheticConfig(num_classes=6, n_max=10, ratio=5.0, test_per_class=2, image_size=16)
    written = synthetic.build(config, uri, progress=False, target_shard_bytes=4 * 1024)
    assert len(written.shards) > 1
    assert verify_dataset(uri) == read_manifest(uri) == written
    local = synthetic.build(config, str(tmp_path / "local"), progress=False)
    assert prepared_rows(uri) == prepared_rows(tmp_path / "local")
    assert local.split_counts == written.split_counts
