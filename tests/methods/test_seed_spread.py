"""benchmarks/seed_spread.py: the seed-spread measures on hand-made cells whose answer is known."""

from __future__ import annotations

import numpy as np
import pytest

from tests.fixtures.benchmarks import load_benchmark


def test_one_tail_image_that_flips_carries_the_whole_spread():
    """Known classes 0, 1; novel 2..5 (training counts 40, 30, 20, 10: head 2, medium 3 and 4, tail 5). Two seeds
    agree on every image but one of the tail class's two test images."""
    seed_spread = load_benchmark("seed_spread")
    y_true = np.array([0, 0, 1, 1, 2, 2, 2, 2, 3, 3, 3, 4, 4, 4, 5, 5])
    train_counts = [50, 50, 40, 30, 20, 10]
    right = y_true.copy()
    right[[8, 11]] = [4, 3]  # one image of class 3 and one of class 4 wrong in both seeds (4 ↔ 3 swapped)
    other = right.copy()
    other[15] = 2  # the second tail image: right in seed 0, wrong in seed 1
    cells = [{"test_pred": right.tolist(), "novel_train": {"all": 0.5}},
             {"test_pred": other.tolist(), "novel_train": {"all": 0.7}}]
    r = seed_spread.spread(y_true, train_counts, 2, cells)
    assert r["images_differing"] == 1 and r["tail_images_differing"] == 1
    assert r["novel_test_images"] == 12 and r["tail_test_images"] == 2
    assert r["share_tail"] == pytest.approx(1.0) and r["share_head"] == pytest.approx(0.0)
    assert r["share_medium"] == pytest.approx(0.0)
    # class accuracies (head, medium, medium, tail): seed 0 (1, 2/3, 2/3, 1), seed 1 (1, 2/3, 2/3, 1/2)
    novel = np.array([(1 + 2 / 3 + 2 / 3 + 1) / 4, (1 + 2 / 3 + 2 / 3 + 0.5) / 4]) * 100
    assert r["test_novel"] == pytest.approx(novel.mean()) and r["test_novel_std"] == pytest.approx(novel.std())
    assert r["train_novel"] == pytest.approx(60.0) and r["train_novel_std"] == pytest.approx(10.0)
    p = np.array([1, 2 / 3, 2 / 3, 0.75])
    n = np.array([4, 3, 3, 2])
    assert r["resolution"] == pytest.approx(100 * np.sqrt((p * (1 - p) / n).sum()) / 4)
