"""benchmarks/boundary.py: the known/novel boundary shift and its readings, on hand-made scores whose answer is
known (no training: :func:`cell_scores` is replaced by a fixed cell in the command's test)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.fixtures.benchmarks import load_benchmark

# Known classes 0, 1; novel 2, 3. Cosines [N, 4].
KNOWN = np.array([[0.9, 0.1, 0.0, 0.2],   # class 0: margin max_novel − max_known = 0.2 − 0.9 = −0.7
                  [0.8, 0.0, 0.1, 0.0],   # class 0: −0.7
                  [0.0, 0.7, 0.2, 0.1],   # class 1: −0.5
                  [0.1, 0.8, 0.0, 0.0]])  # class 1: −0.8
KNOWN_Y = np.array([0, 0, 1, 1])
NOVEL = np.array([[0.1, 0.0, 0.4, 0.0],   # cluster 0: margin 0.3
                  [0.2, 0.0, 0.5, 0.1],   # cluster 0: 0.3
                  [0.0, 0.1, 0.0, 0.6],   # cluster 1: 0.5
                  [0.3, 0.0, 0.1, 0.4]])  # cluster 1: 0.1


def test_margins_are_the_best_novel_minus_the_best_known_cosine():
    boundary = load_benchmark("boundary")
    assert boundary.margins(KNOWN, 2) == pytest.approx([-0.7, -0.7, -0.5, -0.8])  # rows as commented
    assert boundary.margins(NOVEL, 2) == pytest.approx([0.3, 0.3, 0.5, 0.1])


def test_the_midpoint_shift_makes_the_class_and_cluster_mean_median_margins_equal():
    """Known medians 0.7 (class 0) and 0.65 (class 1): mean 0.675. Novel medians 0.3 (cluster 0) and 0.3 (cluster 1,
    median of 0.5 and 0.1): mean 0.3. b = (0.675 − 0.3) / 2 = 0.1875, after which both means are 0.4875."""
    boundary = load_benchmark("boundary")
    b = boundary.midpoint_offset(KNOWN, KNOWN_Y, NOVEL, 2)
    assert b == pytest.approx(0.1875)
    known, novel = KNOWN.copy(), NOVEL.copy()
    known[:, 2:] += b
    novel[:, 2:] += b
    known_means = [-np.median(boundary.margins(known[KNOWN_Y == c], 2)) for c in (0, 1)]
    novel_means = [np.median(boundary.margins(novel[rows], 2)) for rows in ([0, 1], [2, 3])]
    assert np.mean(known_means) == pytest.approx(0.4875) and np.mean(novel_means) == pytest.approx(0.4875)


def test_the_midpoint_counts_a_large_class_as_one():
    """Adding nine more rows of class 0 at the same margin leaves every class's median, so b, unchanged."""
    boundary = load_benchmark("boundary")
    known = np.concatenate([KNOWN, np.repeat(KNOWN[:1], 9, axis=0)])
    labels = np.concatenate([KNOWN_Y, np.zeros(9, dtype=int)])
    assert boundary.midpoint_offset(known, labels, NOVEL, 2) == pytest.approx(0.1875)


TEST = np.array([[0.9, 0.0, 0.1, 0.0],   # class 0, right
                 [0.0, 0.8, 0.0, 0.3],   # class 1, right
                 [0.5, 0.0, 0.45, 0.0],  # class 2 sent to known column 0 (margin −0.05)
                 [0.0, 0.1, 0.7, 0.0],   # class 2, right
                 [0.0, 0.0, 0.1, 0.8],   # class 3, right
                 [0.0, 0.0, 0.1, 0.9]])  # class 3, right
TEST_Y = np.array([0, 1, 2, 2, 3, 3])
COUNTS = [10, 10, 5, 5]
#: one cell as :func:`cell_scores` returns it, built from the arrays above (the command tests' stand-in for training)
CELL = {"num_known": np.asarray(2), "train_counts": np.asarray(COUNTS), "test": TEST, "y_test": TEST_Y,
        "known": KNOWN, "y_known": KNOWN_Y, "novel": NOVEL, "y_novel": np.array([2, 2, 3, 3])}


def test_a_shift_past_an_images_margin_moves_it_across_the_boundary():
    boundary = load_benchmark("boundary")
    assert boundary.shifted_accuracy(TEST, TEST_Y, 2, COUNTS, 0.0) == pytest.approx((75.0, 100.0))
    assert boundary.shifted_accuracy(TEST, TEST_Y, 2, COUNTS, 0.15) == pytest.approx((100.0, 100.0))
    # 0.55: class 1's image goes to novel column 3 too (0.3 + 0.55 > 0.8); the matching gives column 3 to class 3
    assert boundary.shifted_accuracy(TEST, TEST_Y, 2, COUNTS, 0.55) == pytest.approx((100.0, 50.0))


def test_the_routing_oracle_moves_only_the_novel_images():
    boundary = load_benchmark("boundary")
    test = TEST.copy()
    test[1] = [0.0, 0.5, 0.0, 0.6]  # a known image in a novel column: the oracle leaves it there
    assert boundary.routing_oracle(test, TEST_Y, 2, COUNTS) == pytest.approx((100.0, 50.0))


def test_the_price_of_half_counts_the_known_images_above_the_lost_novel_images_median_margin():
    """Known margins −0.8, −0.3, 0.1; the novel images sent to known columns have margins −0.5 and −0.2 (median
    −0.35; a third novel image, margin 0.4, is routed right and does not count): two of three known images lie
    above, so fetching half the lost novel images back would send 66.7 % of the known images across."""
    boundary = load_benchmark("boundary")
    scores = np.array([[0.9, 0.0, 0.1, 0.0], [0.6, 0.0, 0.3, 0.0], [0.0, 0.4, 0.0, 0.5],  # known
                       [0.7, 0.0, 0.2, 0.0], [0.0, 0.6, 0.0, 0.4], [0.1, 0.0, 0.5, 0.0]])  # novel
    y_true = np.array([0, 0, 1, 2, 3, 2])
    assert boundary.price_of_half(scores, y_true, 2) == pytest.approx(200 / 3)
    assert boundary.price_of_half(scores[[0, 1, 2, 5]], y_true[[0, 1, 2, 5]], 2) == 0.0  # none lost


def test_the_command_trains_each_seed_and_prints_both_tables(monkeypatch, capsys, tmp_path):
    boundary = load_benchmark("boundary")
    calls = []

    def fake_cell(dataset, variant, seed, table, holdout_view):
        calls.append((dataset, variant, seed, holdout_view))
        return CELL

    monkeypatch.setattr(boundary, "cell_scores", fake_cell)
    assert boundary.main(["--datasets", "fashion-cached", "--variants", "uno", "--seeds", "3", "4",
                          "--offsets", "0", "0.2", "3", "--holdout-view", "--save", str(tmp_path / "cells"),
                          "--threads", str(torch.get_num_threads())]) == 0  # this process's threads left as they are
    assert calls == [("fashion-cached", "uno", 3, True), ("fashion-cached", "uno", 4, True)]
    out = capsys.readouterr().out
    assert sorted(p.name for p in (tmp_path / "cells").iterdir()) == ["fashion-cached-uno-s3-hv.npz",
                                                                       "fashion-cached-uno-s4-hv.npz"]
    saved = np.load(tmp_path / "cells" / "fashion-cached-uno-s3-hv.npz")
    assert np.array_equal(saved["test"], TEST) and int(saved["num_known"]) == 2
    assert "| fashion-cached | uno | 2 | 75.0 / 100.0 | 25.0 % | 0.0 % | +0.188: 100.0 / 100.0 " \
           "| +0.10: 100.0 / 100.0 | 100.0 / 100.0 |" in out
    assert "| fashion-cached | uno | 75.0 / 100.0 | 100.0 / 100.0 | 100.0 / 100.0 |" in out


def test_from_saved_reads_the_cells_that_save_wrote_without_training(monkeypatch, capsys, tmp_path):
    """A run with ``--save`` and one with ``--from-saved`` on its folder print the same tables; the second trains
    nothing. Each seed's line gives the training rows' median margins (0.675 known, 0.3 novel) and the lost novel
    test image's (−0.05)."""
    boundary = load_benchmark("boundary")
    monkeypatch.setattr(boundary, "cell_scores", lambda *args: CELL)
    argv = ["--datasets", "fashion-cached", "--variants", "uno", "--seeds", "3",
            "--threads", str(torch.get_num_threads())]
    assert boundary.main([*argv, "--save", str(tmp_path)]) == 0
    first = capsys.readouterr().out
    assert "median margin of the training rows known 0.675, novel 0.300; of the novel test images lost to known " \
           "columns -0.050" in first

    def no_training(*args):
        raise AssertionError("--from-saved trained a cell")

    monkeypatch.setattr(boundary, "cell_scores", no_training)
    assert boundary.main([*argv, "--from-saved", str(tmp_path)]) == 0
    assert capsys.readouterr().out == first
    with pytest.raises(SystemExit):  # a seed that was never saved: one line naming the file, no traceback
        boundary.main([*argv[:-4], "--seeds", "5", "--threads", argv[-1], "--from-saved", str(tmp_path)])
    assert "no fashion-cached-uno-s5.npz in" in capsys.readouterr().err
