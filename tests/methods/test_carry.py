"""benchmarks/carry.py and quality.py --holdout-view: hand-made cells and splits whose answer is known."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ncdlr.data.features import FeatureSplits
from tests.fixtures.benchmarks import load_benchmark


def test_the_four_readings_name_every_split_with_the_training_rows_clusters():
    """Known 0, 1; novel 2, 3. On the seen crops cluster 0 holds class 3 and cluster 1 class 2 (5 of 6 rows right).
    The unseen crops of the same rows swap one more row; the test images are read task-aware and over all K."""
    carry = load_benchmark("carry")
    train_labels = np.array([2, 2, 2, 3, 3, 3])
    cell = {
        "novel_train_pred": [1, 1, 1, 0, 0, 1],  # class 2: 3/3, class 3: 2/3 → 83.3
        "novel_heldout_pred": [1, 1, 0, 0, 0, 1],  # class 2: 2/3, class 3: 2/3 → 66.7
        "test_novel_pred": [0, 0, 1, 0, 0, 0],  # novel rows (2, 2, 3, 3) → classes 2: 1/2 (col 0 = 3), 3: 2/2 → 75
        "test_pred": [0, 1, 3, 0, 2, 2],  # novel rows: 3 (col 1 → 2 ✓), 0 (known ✗), 2 (col 0 → 3 ✓), 2 ✓ → 1/2, 2/2
        "results": {"none": {"novel": 0.25, "known": 0.5}},  # the cell's own scores (fractions), read as they are
    }
    test_labels = np.array([0, 1, 2, 2, 3, 3])
    r = carry.readings(cell, 2, train_labels, test_labels)
    assert r["seen crop"] == pytest.approx(100 * (1 + 2 / 3) / 2)
    assert r["unseen crop"] == pytest.approx(100 * (2 / 3 + 2 / 3) / 2)
    assert r["unseen image"] == pytest.approx(75.0)
    assert r["unseen image, all classes"] == pytest.approx(75.0)
    assert r["headline"] == pytest.approx(25.0) and r["known"] == pytest.approx(50.0)
    by_group = carry.readings(cell, 2, train_labels, test_labels, {"head": [2], "tail": [3]})
    assert by_group["seen crop/head"] == pytest.approx(100.0) and by_group["seen crop/tail"] == pytest.approx(200 / 3)
    assert by_group["unseen image/head"] == pytest.approx(50.0) and by_group["unseen image/tail"] == pytest.approx(100.0)
    assert by_group["unseen image"] == r["unseen image"]
    cell["test_pred"] = [0, 1, 0, 0, 2, 2]  # the first novel test image now goes to a known class as well
    assert carry.readings(cell, 2, train_labels, test_labels)["unseen image, all classes"] == pytest.approx(50.0)


def test_holding_out_the_last_view_keeps_the_other_views_for_training_and_leaves_the_test_split_alone():
    quality = load_benchmark("quality")
    shape = (2, 3, 3)
    feats = {"known": torch.randn(5, 4, *shape).half(), "novel": torch.randn(6, 4, *shape).half(),
             "test": torch.randn(3, 1, *shape).half()}
    labels = {"known": torch.zeros(5, dtype=torch.long), "novel": torch.ones(6, dtype=torch.long),
              "test": torch.tensor([0, 1, 1])}
    splits = FeatureSplits(feats, labels, 1, 1, ["a", "b"], activation_shape=shape)
    kept, probe = quality.hold_out_last_view(splits)
    assert kept.views("known") == kept.views("novel") == 3 and kept.views("test") == 1
    assert torch.equal(kept.features["novel"], feats["novel"][:, :3]) and kept.features["test"] is feats["test"]
    assert probe.shape == (6, 1, *shape) and torch.equal(probe[:, 0], feats["novel"][:, 3])
    assert splits.views("novel") == 4  # the caller's splits are not changed
    embeddings = FeatureSplits({k: torch.randn(4, 8) for k in feats}, labels, 1, 1, ["a", "b"])
    with pytest.raises(SystemExit, match="--holdout-view needs an activation table"):
        quality.hold_out_last_view(embeddings)
    two_views = FeatureSplits({**feats, "novel": feats["novel"][:, :2]}, labels, 1, 1, ["a", "b"], activation_shape=shape)
    with pytest.raises(SystemExit, match="at least 3 views"):
        quality.hold_out_last_view(two_views)


def test_a_variant_names_its_epochs_and_reads_only_the_cells_of_that_many_epochs(tmp_path):
    """``ncdlr@5`` reads ``quality.py --epochs 5``'s cells, plain ``ncdlr`` the default epochs' cells; a bad suffix
    is refused by name."""
    carry, quality = load_benchmark("carry"), load_benchmark("quality")
    assert quality.variant_epochs("ncdlr@5") == ("ncdlr", 5) and quality.variant_epochs("uno") == ("uno", None)
    with pytest.raises(SystemExit, match="ncdlr@five"):
        quality.variant_epochs("ncdlr@five")
    for epochs, seed in ((5, 0), (None, 0), (None, 1)):
        quality.cell_path(tmp_path, "d", "ncdlr", seed, epochs, holdout_view=True).write_text(
            f'{{"epochs": {epochs or 10}}}')
    short = quality.read_cells(tmp_path, "d", "ncdlr", 5, holdout_view=True, epochs=5)
    default = quality.read_cells(tmp_path, "d", "ncdlr", 5, holdout_view=True)
    assert {s: c["epochs"] for s, c in short.items()} == {0: 5}
    assert {s: c["epochs"] for s, c in default.items()} == {0: 10, 1: 10}
