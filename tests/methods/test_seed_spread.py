"""benchmarks/seed_spread.py: the seed-spread measures on hand-made cells whose answer is known."""

from __future__ import annotations

import json

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


def two_seed_cells() -> tuple[np.ndarray, list[dict], list[dict]]:
    """Known classes 0, 1; novel 2, 3 with four test images each: ``(y_true [12], A's two cells, B's two cells)``.
    A is right everywhere; B calls two of class 2's images class 0 in both seeds, and one of class 3's class 1 in
    seed 1 only."""
    y_true = np.array([0, 0, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3])
    b0 = y_true.copy()
    b0[[4, 5]] = 0
    b1 = b0.copy()
    b1[8] = 1
    a = {"test_pred": y_true.tolist()}
    return y_true, [a, a], [{"test_pred": b0.tolist()}, {"test_pred": b1.tolist()}]


def test_the_paired_gap_has_a_seed_error_and_a_test_split_error():
    """Known classes 0, 1; novel 2, 3 with four test images each. A is right everywhere. B calls two of class 2's
    images class 0 (wrong under any matching) in both seeds, and one of class 3's in seed 1 only. Per-seed gaps
    (class-mean over the two novel classes) 25 and 37.5 points; the test split's bootstrap spread follows from the
    per-image seed-mean gaps (class 2: 1, 1, 0, 0; class 3: ½, 0, 0, 0) as the std of a mean of n draws."""
    seed_spread = load_benchmark("seed_spread")
    y_true, cells_a, cells_b = two_seed_cells()
    g = seed_spread.paired_gap(y_true, 2, cells_a, cells_b, draws=40000, seed=3)
    assert g["seeds"] == 2 and g["gap"] == pytest.approx(31.25)
    assert g["seed_se"] == pytest.approx(np.std([25.0, 37.5], ddof=1) / np.sqrt(2))
    var_class2 = 0.25 / 4  # Bernoulli(½) mean of 4 draws
    var_class3 = (0.5 ** 2 / 4 - (0.5 / 4) ** 2) / 4
    expected = 100 * np.sqrt(var_class2 + var_class3) / 2
    assert g["sample_se"] == pytest.approx(expected, rel=0.03)
    assert g["total_se"] == pytest.approx(np.hypot(g["seed_se"], g["sample_se"]))


def test_the_paired_gap_over_a_group_of_classes_averages_that_group_only():
    """The cells of the test above, read over novel class 3 alone (``classes=[3]``, as ``--gap-groups`` reads the
    tail): B loses only seed 1's one image there, so the per-seed gaps are 0 and 25 points, and the bootstrap draws
    class 3's images only (per-image seed-mean gaps ½, 0, 0, 0)."""
    seed_spread = load_benchmark("seed_spread")
    y_true, cells_a, cells_b = two_seed_cells()
    g = seed_spread.paired_gap(y_true, 2, cells_a, cells_b, draws=40000, seed=3, classes=[3])
    assert g["gap"] == pytest.approx(12.5)
    assert g["seed_se"] == pytest.approx(np.std([0.0, 25.0], ddof=1) / np.sqrt(2))
    assert g["sample_se"] == pytest.approx(100 * np.sqrt((0.5 ** 2 / 4 - (0.5 / 4) ** 2) / 4), rel=0.03)


def test_the_paired_gap_needs_two_paired_seeds():
    seed_spread = load_benchmark("seed_spread")
    y_true = np.array([0, 1, 2, 2])
    cell = {"test_pred": y_true.tolist()}
    with pytest.raises(ValueError, match="same number"):
        seed_spread.paired_gap(y_true, 2, [cell, cell], [cell])
    with pytest.raises(ValueError, match="≥ 2"):
        seed_spread.paired_gap(y_true, 2, [cell], [cell])


def test_carried_matching_names_clusters_on_the_training_rows_not_on_the_test_images():
    """Known 0, 1; novel 2, 3. On the training rows novel cluster 0 holds class 3 and cluster 1 class 2, so column
    2 is named 3 and column 3 is named 2. The test split's own matching would name them the other way round (its
    class-2 images sit in column 2), and score 4 of 4 novel images where the carried names score 1."""
    seed_spread = load_benchmark("seed_spread")
    train_labels = np.array([2, 2, 2, 3, 3, 3])
    train_pred = np.array([1, 1, 0, 0, 0, 1])  # novel cluster ids 0..Ku-1
    y_true = np.array([0, 1, 2, 2, 3, 3])
    test_pred = np.array([0, 0, 2, 2, 3, 2])  # a known image in the wrong known column; novel images in columns 2, 3
    carried = seed_spread.carried_correct(y_true, test_pred, 2, train_labels, train_pred)
    assert carried.tolist() == [True, False, False, False, False, True]
    own = seed_spread.correct_under_matching(y_true, test_pred)
    assert own[2:].sum() == 3 and carried[2:].sum() == 1
    cells = [{"test_pred": test_pred.tolist(), "novel_train_pred": train_pred.tolist(), "novel_train": {"all": 0.7}},
             {"test_pred": [0, 1, 3, 3, 2, 2], "novel_train_pred": train_pred.tolist(),  # all right when carried
              "novel_train": {"all": 0.7}}]
    r = seed_spread.spread(y_true, [9, 9, 6, 3], 2, cells, train_labels)
    # seed 0: class 2 0/2, class 3 1/2 → 25 %; seed 1: 100 %
    assert r["test_novel_carried"] == pytest.approx(62.5) and r["test_novel_carried_std"] == pytest.approx(37.5)
    assert "test_novel_carried" not in seed_spread.spread(y_true, [9, 9, 6, 3], 2, cells)
    # the paired gap under the carried names: seed 1 minus seed 0 as if they were two methods, 75 points
    g = seed_spread.paired_gap(y_true, 2, [cells[1], cells[1]], [cells[0], cells[0]], draws=100,
                               correct=lambda c: seed_spread.carried_correct(y_true, c["test_pred"], 2, train_labels,
                                                                             c["novel_train_pred"]))
    assert g["gap"] == pytest.approx(75.0) and g["seed_se"] == 0.0


def test_merged_counts_the_novel_classes_that_share_their_majority_cluster():
    """Known 0, 1; novel 2..6 (Ku = 5). Classes 4, 5, 6 all go mostly to cluster 2, class 2 splits over clusters 0
    and 3 (majority 0), class 3 goes to cluster 1, class 4 half to 3 and half to 2 (a tie goes to the lower column,
    2): three classes share a cluster. The spread reads it per seed."""
    seed_spread = load_benchmark("seed_spread")
    y_true = np.array([0, 1, 2, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6])
    novel_pred = np.array([4, 4, 0, 0, 3, 1, 1, 3, 2, 2, 2, 2, 2])
    assert seed_spread.merged_classes(y_true, novel_pred, [2, 3, 4, 5, 6]) == 3
    distinct = np.array([4, 4, 0, 0, 0, 1, 1, 2, 2, 3, 3, 4, 4])  # one cluster each: nothing merged
    assert seed_spread.merged_classes(y_true, distinct, [2, 3, 4, 5, 6]) == 0
    assert seed_spread.merged_classes(y_true, novel_pred, [2, 3, 4, 5, 6, 7]) == 3  # no test image: left out
    test_pred = np.where(y_true >= 2, novel_pred + 2, y_true)
    cells = [{"test_pred": test_pred.tolist(), "test_novel_pred": novel_pred.tolist(), "novel_train": {"all": 0.5}},
             {"test_pred": test_pred.tolist(), "test_novel_pred": distinct.tolist(), "novel_train": {"all": 0.5}}]
    assert seed_spread.spread(y_true, [9, 9, 8, 7, 6, 5, 4], 2, cells)["merged"] == pytest.approx(1.5)
    del cells[1]["test_novel_pred"]
    assert "merged" not in seed_spread.spread(y_true, [9, 9, 8, 7, 6, 5, 4], 2, cells)


def command_on_a_tiny_table(tmp_path, train_labels: list[int], test_labels: list[int], num_known: int) -> list[str]:
    """Writes a feature table (zero features) whose training rows have ``train_labels`` (known below ``num_known``,
    novel from it) and whose test rows have ``test_labels``; returns seed_spread's arguments for 2 seeds of
    ``ncdlr`` cells in ``tmp_path``, with the table standing in for fashion-cached's."""
    from ncdlr.data.features import write_feature_table

    labels = np.array([*train_labels, *test_labels])
    splits = ["known" if y < num_known else "novel" for y in train_labels] + ["test"] * len(test_labels)
    table = str(tmp_path / "table.parquet")
    write_feature_table(table, np.zeros((len(labels), 2)), labels, splits, num_known=num_known,
                        num_novel=int(labels.max()) + 1 - num_known)
    return ["--datasets", "fashion-cached", "--variants", "ncdlr", "--seeds", "2", "--results", str(tmp_path),
            "--table", f"fashion-cached={table}"]


def test_the_command_reads_the_holdout_view_cells_only_when_asked(tmp_path, capsys):
    """A tiny feature table (1 known, 2 novel classes) and two cells of each protocol, with different predictions:
    the plain cells name class 1 and 2 apart (nothing merged), the ``--holdout-view`` cells put both in one cluster.
    The command prints each protocol's own reading."""
    seed_spread, quality = load_benchmark("seed_spread"), load_benchmark("quality")
    argv = command_on_a_tiny_table(tmp_path, [0, 0, 1, 1, 2, 2], [0, 1, 1, 2, 2], num_known=1)
    apart = {"test_pred": [0, 1, 1, 2, 2], "test_novel_pred": [0, 0, 0, 1, 1], "novel_train": {"all": 1.0}}
    merged = {"test_pred": [0, 1, 1, 1, 1], "test_novel_pred": [0, 0, 0, 0, 0], "novel_train": {"all": 0.5}}
    for seed in (0, 1):
        quality.cell_path(tmp_path, "fashion-cached", "ncdlr", seed, None).write_text(json.dumps(apart))
        quality.cell_path(tmp_path, "fashion-cached", "ncdlr", seed, None, holdout_view=True).write_text(
            json.dumps(merged))
    assert seed_spread.main(argv) == 0
    plain = capsys.readouterr().out.splitlines()[-1]
    assert "| 100.0 ± 0.0 |" in plain and plain.endswith("| 0.0 of 2 |")
    assert seed_spread.main([*argv, "--holdout-view"]) == 0
    held = capsys.readouterr().out.splitlines()[-1]
    assert "| 50.0 ± 0.0 |" in held and held.endswith("| 2.0 of 2 |")


def test_known_detail_says_which_known_classes_lose_their_images_and_to_what():
    """Known 0, 1, 2 (train counts 50, 5, 20), novel 3, 4. Class 0: all right. Class 1 (the tail): seed 0 sends one of
    its two images to known class 0 and one to a novel column, seed 1 both to novel columns. Class 2: one of two
    right in both seeds, the other to a novel column."""
    seed_spread = load_benchmark("seed_spread")
    y_true = np.array([0, 0, 1, 1, 2, 2, 3, 3, 3, 4, 4, 4])  # three images per novel class: the matching is clear
    novel = [3, 3, 3, 4, 4, 4]
    cells = [{"test_pred": [0, 0, 0, 3, 2, 4, *novel]}, {"test_pred": [0, 0, 4, 3, 2, 3, *novel]}]
    k = seed_spread.known_detail(y_true, 3, [50, 5, 20, 9, 9], cells)
    assert k["seeds"] == 2 and k["known"] == pytest.approx((100 + 0 + 50) / 3)
    assert k["to_novel"] == pytest.approx(100 * (2 + 3) / 12)
    assert [c[:2] for c in k["classes"]] == [(0, 50), (2, 20), (1, 5)]
    assert k["classes"][2][2:] == pytest.approx((0.0, 75.0)) and k["classes"][1][2:] == pytest.approx((50.0, 50.0))


def command_on_two_tiny_cells(tmp_path) -> list[str]:
    """:func:`command_on_a_tiny_table` with known 0, 1 and novel 2, and two identical ``ncdlr`` cells: one known
    test image of class 1 predicted into the novel column, the novel test image right."""
    quality = load_benchmark("quality")
    argv = command_on_a_tiny_table(tmp_path, [0, 0, 0, 1, 2, 2], [0, 0, 1, 1, 2], num_known=2)
    cell = {"test_pred": [0, 0, 1, 2, 2], "test_novel_pred": [0, 0, 0, 0, 0], "novel_train": {"all": 1.0}}
    for seed in (0, 1):
        quality.cell_path(tmp_path, "fashion-cached", "ncdlr", seed, None).write_text(json.dumps(cell))
    return argv


def test_the_command_prints_the_known_table_when_asked(tmp_path, capsys):
    seed_spread = load_benchmark("seed_spread")
    argv = command_on_two_tiny_cells(tmp_path)
    assert seed_spread.main(argv) == 0
    assert "known → novel" not in capsys.readouterr().out
    assert seed_spread.main([*argv, "--known"]) == 0
    row = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ncdlr | 2 |")]
    assert row == ["| ncdlr | 2 | 75.0 | 25.0 | 3: 100.0 / 0.0; 1: 50.0 / 50.0 |"]


def test_head_detail_scores_the_chosen_head_against_the_others():
    """Two seeds of three heads: seed 0 chose its best head (lowest loss, best novel), seed 1 its worst."""
    seed_spread = load_benchmark("seed_spread")

    def cell(selected, loss, novel):
        return {"heads": {"selected": selected, "loss_u": loss, "test": [{"novel": n, "known": 0.5} for n in novel]}}

    cells = [cell(0, [0.1, 0.2, 0.3], [0.6, 0.4, 0.2]), cell(2, [0.3, 0.2, 0.1], [0.5, 0.4, 0.3]), {"test_pred": []}]
    h = seed_spread.head_detail(cells)
    assert h["seeds"] == 2 and h["heads"] == 3 and h["picked_best"] == 0.5
    assert h["selected"] == pytest.approx(45.0) and h["best"] == pytest.approx(55.0) and h["worst"] == pytest.approx(25.0)
    assert h["mean"] == pytest.approx(40.0) and h["rank_corr"] == pytest.approx(0.0)  # −1 (seed 0) and +1 (seed 1)
    assert seed_spread.head_detail([{"test_pred": []}]) is None


def test_cluster_sizes_count_the_clusters_holding_no_training_row_and_the_size_ratio():
    """Ku = 4. Seed 0 puts its 8 novel training rows into clusters of 5, 2, 1 and 0 rows; seed 1 into 4, 4, 0, 0."""
    seed_spread = load_benchmark("seed_spread")
    cells = [{"novel_train_pred": [0, 0, 0, 0, 0, 1, 1, 2]}, {"novel_train_pred": [3, 3, 3, 3, 1, 1, 1, 1]}]
    z = seed_spread.cluster_sizes(cells, 4)
    assert z["seeds"] == 2 and z["empty"] == 1.5 and (z["empty_min"], z["empty_max"]) == (1, 2)
    assert z["ratio"] == 3.0 and (z["ratio_min"], z["ratio_max"]) == (1.0, 5.0)  # median of 5 and 1
    kl = [(5 * np.log(5 / 2) + 2 * np.log(1) + np.log(1 / 2)) / 8, np.log(2)]  # Σ p log(4p): 4 shares; 2 of 1/2
    assert z["kl"] == pytest.approx(np.mean(kl)) and z["kl_std"] == pytest.approx(np.std(kl))


def test_a_size_profile_carried_to_other_clusters_keeps_its_imbalance_and_shape():
    """The known classes' sorted sizes carried to k clusters: a geometric profile stays geometric with the same
    largest / smallest ratio (counts 8, 4, 2, 1 on 7 clusters: seven shares, each the last over 8^(1/6))."""
    seed_spread = load_benchmark("seed_spread")
    p = seed_spread.profile_on([1, 8, 0, 4, 2], 7)  # a class with no row is left out
    assert p.sum() == pytest.approx(1.0) and p[0] / p[-1] == pytest.approx(8.0)
    assert np.diff(np.log(p)) == pytest.approx(np.full(6, np.log(1 / 8) / 6))
    assert seed_spread.kl_from_uniform(np.ones(5)) == 0.0
    assert seed_spread.kl_from_uniform(np.array([3, 0, 0])) == pytest.approx(np.log(3))
    assert seed_spread.cluster_sizes([{"test_pred": [0]}], 4) is None  # a cell without its training clustering


def test_the_command_prints_the_sizes_table_when_asked(tmp_path, capsys):
    seed_spread, quality = load_benchmark("seed_spread"), load_benchmark("quality")
    argv = command_on_a_tiny_table(tmp_path, [0, 0, 0, 1, 1, 2], [0, 0, 1, 1, 2], num_known=1)
    cell = {"test_pred": [0, 0, 1, 2, 2], "test_novel_pred": [0, 0, 0, 1, 1], "novel_train": {"all": 1.0},
            "novel_train_pred": [0, 0, 0]}
    for seed in (0, 1):
        quality.cell_path(tmp_path, "fashion-cached", "ncdlr", seed, None).write_text(json.dumps(cell))
    assert seed_spread.main([*argv, "--sizes"]) == 0
    out = capsys.readouterr().out
    assert "(true classes: 2)" in out  # training counts of the novel classes 1, 2: 2 and 1
    # all rows in cluster 0: KL log 2, and the largest class (1) holds that one cluster
    assert "| ncdlr | 2 | 1.0 (1–1) | 1 (1–1) | 0.69 ± 0.00 | 1.0 (1–1) | — |" in out.splitlines()


def test_routing_separates_the_known_novel_boundary_from_the_clustering_of_the_novel_images():
    """Known 0, 1; novel 2, 3 (three test images each). The novel columns alone cluster both novel classes right in
    both seeds (novel only: 100); over all K columns seed 0 sends one image of class 3 to known class 0 (that class
    loses a third: 100 and 66.7, mean 83.3) and seed 1 also one known image of class 1 to a novel column."""
    seed_spread = load_benchmark("seed_spread")
    y_true = np.array([0, 0, 1, 1, 2, 2, 2, 3, 3, 3])
    novel_only = [1, 1, 1, 1, 0, 0, 0, 1, 1, 1]  # task-aware: the columns are named by their own matching
    cells = [{"test_pred": [0, 0, 1, 1, 2, 2, 2, 3, 3, 0], "test_novel_pred": novel_only},
             {"test_pred": [0, 0, 1, 3, 2, 2, 2, 3, 3, 0], "test_novel_pred": novel_only}]
    r = seed_spread.routing(y_true, 2, cells, train_counts=[5, 5, 10, 4])
    assert r["seeds"] == 2
    assert r["novel_only"] == pytest.approx(100.0) and r["novel_only_std"] == pytest.approx(0.0)
    assert r["novel"] == pytest.approx((100 + 200 / 3) / 2)
    assert r["novel_to_known"] == pytest.approx(100 / 6)
    assert r["known_to_novel"] == pytest.approx((0 + 25) / 2)
    assert r["known_to_novel_std"] == pytest.approx(np.std([0, 25], ddof=1))
    # class 2 keeps all three images, class 3 loses one of three in both seeds: class-mean (0 + 33.3) / 2; class 2
    # is the head (10 training rows), class 3 the tail (4), and two classes leave no medium
    assert r["novel_to_known_class"] == pytest.approx(100 / 6) and r["novel_to_known_class_std"] == 0.0
    assert r["novel_to_known_head"] == 0.0 and r["novel_to_known_tail"] == pytest.approx(100 / 3)
    assert "novel_to_known_medium" not in r
    assert "novel_to_known_head" not in seed_spread.routing(y_true, 2, cells)  # no training counts, no groups


def test_the_command_prints_the_routing_table_when_asked(tmp_path, capsys):
    seed_spread = load_benchmark("seed_spread")
    argv = command_on_two_tiny_cells(tmp_path)
    assert seed_spread.main(argv) == 0
    assert "novel → known" not in capsys.readouterr().out
    assert seed_spread.main([*argv, "--routing"]) == 0
    row = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ncdlr | 2 |")]
    assert row == ["| ncdlr | 2 | 100.0 ± 0.0 | 100.0 ± 0.0 | 0.0 ± 0.0 % | 25.0 ± 0.0 % | 0.0 ± 0.0 % "
                   "| – / 0.0 / – % |"]


def test_pooled_gap_is_the_mean_of_the_gaps_with_the_root_sum_of_their_squared_errors_over_n():
    seed_spread = load_benchmark("seed_spread")
    p = seed_spread.pooled_gap([{"gap": 1.0, "total_se": 3.0}, {"gap": 3.0, "total_se": 4.0}])
    assert (p["gap"], p["se"], p["parts"]) == (pytest.approx(2.0), pytest.approx(2.5), 2)
    with pytest.raises(ValueError, match="at least one"):
        seed_spread.pooled_gap([])


def test_one_gap_command_pools_datasets_whose_cells_live_apart(tmp_path, capsys):
    """Two datasets on the same tiny table (1 known, 2 novel classes): fashion-cached's plain cells under --results,
    where A names every class and B merges the two novel ones (+50 points), and fashion-cached-p1's holdout-view cells
    in another folder, where A and B agree (0). That folder's plain cells would say +50 too, so the pooled +25 shows
    both per-dataset options were read."""
    seed_spread, quality = load_benchmark("seed_spread"), load_benchmark("quality")
    argv = command_on_a_tiny_table(tmp_path, [0, 0, 1, 1, 2, 2], [0, 1, 1, 2, 2], num_known=1)
    table = argv[argv.index("--table") + 1].split("=", 1)[1]
    other = tmp_path / "elsewhere"
    other.mkdir()
    right = {"test_pred": [0, 1, 1, 2, 2], "novel_train": {"all": 1.0}}
    merged = {"test_pred": [0, 1, 1, 1, 1], "novel_train": {"all": 0.5}}
    for seed in (0, 1):
        for root, dataset, hv, a, b in ((tmp_path, "fashion-cached", False, right, merged),
                                        (other, "fashion-cached-p1", True, right, right),
                                        (other, "fashion-cached-p1", False, right, merged)):
            for variant, cell in (("a", a), ("b", b)):
                quality.cell_path(root, dataset, variant, seed, None, holdout_view=hv).write_text(json.dumps(cell))
    assert seed_spread.main(["--datasets", "fashion-cached", "fashion-cached-p1", "--variants", "a", "--seeds", "2",
                             "--results", str(tmp_path), "--table", f"fashion-cached={table}",
                             "--table", f"fashion-cached-p1={table}", "--results-of", f"fashion-cached-p1={other}",
                             "--holdout-view-of", "fashion-cached-p1", "--gap", "a", "b"]) == 0
    out = capsys.readouterr().out
    assert "fashion-cached: a − b on the test novel classes (the test split's own matching), 2 paired seeds: +50.0" in out
    assert "fashion-cached-p1: a − b on the test novel classes (the test split's own matching), 2 paired seeds: +0.0" in out
    assert out.strip().splitlines()[-1].startswith("pooled over 2 datasets: a − b +25.00 (SE 0.00;")
    with pytest.raises(SystemExit):
        seed_spread.main([*argv, "--results-of", "fashion-cached"])


def test_a_gap_between_run_lengths_reads_each_variants_own_epochs(tmp_path, capsys):
    """``--gap a@20 a`` pairs ``quality.py --epochs 20``'s cells of ``a`` with its default-length ones: on a tiny
    table the 20-epoch cells name both novel classes and the default ones merge them, so the gap is +50; the plain
    name alone reads only the default cells (50 %), and ``a@20`` only the longer ones (100 %)."""
    seed_spread, quality = load_benchmark("seed_spread"), load_benchmark("quality")
    argv = command_on_a_tiny_table(tmp_path, [0, 0, 1, 1, 2, 2], [0, 1, 1, 2, 2], num_known=1)
    right = {"test_pred": [0, 1, 1, 2, 2], "novel_train": {"all": 1.0}}
    merged = {"test_pred": [0, 1, 1, 1, 1], "novel_train": {"all": 0.5}}
    for seed in (0, 1):
        quality.cell_path(tmp_path, "fashion-cached", "a", seed, 20).write_text(json.dumps(right))
        quality.cell_path(tmp_path, "fashion-cached", "a", seed, None).write_text(json.dumps(merged))
    variants = argv.index("--variants") + 1
    argv[variants:variants + 1] = ["a@20", "a"]
    assert seed_spread.main([*argv, "--gap", "a@20", "a"]) == 0
    out = capsys.readouterr().out
    rows = {line.split(" | ")[1]: line for line in out.splitlines() if line.startswith("| fashion-cached |")}
    assert "| 100.0 ± 0.0 |" in rows["a@20"] and "| 50.0 ± 0.0 |" in rows["a"]
    assert "fashion-cached: a@20 − a on the test novel classes (the test split's own matching), 2 paired seeds: +50.0" in out


def test_clusters_held_by_the_largest_class_count_its_pieces():
    """Novel classes 5 (six rows), 6 and 7 (two each), Ku = 4. Clusters 0 and 1 hold only class 5, cluster 2 holds
    two rows of class 5 and one of class 6, cluster 3 classes 6 and 7: class 5 is the majority of three clusters.
    Cluster ids that no row takes are not counted."""
    seed_spread = load_benchmark("seed_spread")
    labels = np.array([5, 5, 5, 5, 5, 5, 6, 6, 7, 7])
    pred = np.array([0, 0, 1, 1, 2, 2, 2, 3, 3, 3])
    assert seed_spread.clusters_held_by_largest(labels, pred, 4) == 3
    assert seed_spread.clusters_held_by_largest(labels, np.where(pred < 2, 0, pred), 4) == 2


def test_relax_stops_counts_the_runs_a_relax_bound_held_and_from_which_epoch():
    seed_spread = load_benchmark("seed_spread")
    cells = [{"relax_bound": "34.5", "sizes_held_from_epoch": 4.0}, {"relax_bound": "34.5", "sizes_held_from_epoch": None},
             {"relax_bound": "34.5", "sizes_held_from_epoch": 2.0}]
    assert seed_spread.relax_stops(cells) == "2 of 3 (from epochs 2, 4)"
    assert seed_spread.relax_stops([{"relax_bound": "11", "sizes_held_from_epoch": None}]) == "0 of 1"
    assert seed_spread.relax_stops([{}, {"relax_bound": "none"}]) == "—"  # cells before the bound, or without one
