"""Hungarian-matched accuracies and head/medium/tail groups (method.md §5)."""

import itertools

import numpy as np
import pytest

from ncdlr.metrics import cluster_accuracy, head_medium_tail, hungarian_mapping


def brute_force_best_instance_accuracy(y_true, y_pred) -> float:
    preds, trues = sorted(set(y_pred)), sorted(set(y_true))
    best = 0
    slots = trues + [None] * max(0, len(preds) - len(trues))
    for perm in itertools.permutations(slots, len(preds)):
        mapping = dict(zip(preds, perm))
        best = max(best, sum(mapping[p] == t for p, t in zip(y_pred, y_true)))
    return best / len(y_true)


@pytest.mark.parametrize("seed", range(6))
def test_matching_equals_brute_force_over_all_permutations(seed):
    rng = np.random.default_rng(seed)
    y_true = rng.integers(0, 4, size=30)
    y_pred = rng.integers(0, 4 + seed % 3, size=30) + 10  # arbitrary integers, sometimes extra clusters
    acc = cluster_accuracy(y_true, y_pred, num_known=2)["all_inst"]
    assert acc == pytest.approx(brute_force_best_instance_accuracy(y_true.tolist(), y_pred.tolist()))


def test_relabelled_perfect_prediction_scores_one():
    y_true = np.array([0, 0, 1, 2, 2, 3])
    result = cluster_accuracy(y_true, y_true * 7 + 100, num_known=2)
    assert all(result[k] == 1.0 for k in ("all", "known", "novel", "all_inst", "known_inst", "novel_inst"))


def test_class_mean_differs_from_instance_mean_on_imbalanced_classes():
    y_true = np.array([0] * 8 + [1] * 2)
    y_pred = np.array([0] * 8 + [0] * 2)  # tail class fully wrong
    result = cluster_accuracy(y_true, y_pred, num_known=1)
    assert result["all_inst"] == pytest.approx(0.8)
    assert result["all"] == pytest.approx(0.5)
    assert result["known"] == 1.0 and result["novel"] == 0.0


def test_fewer_clusters_than_classes_leaves_classes_unmatched():
    y_true = np.array([0, 1, 2, 3])
    y_pred = np.array([5, 5, 6, 6])
    assert cluster_accuracy(y_true, y_pred, num_known=2)["all_inst"] == pytest.approx(0.5)
    assert len(hungarian_mapping(y_true, y_pred)) == 2


def test_head_medium_tail_is_three_four_three_by_training_count():
    counts = list(range(100, 0, -10))  # 10 classes, class 0 largest
    groups = head_medium_tail(list(range(10)), counts)
    assert [len(groups[g]) for g in ("head", "medium", "tail")] == [3, 4, 3]
    assert groups["head"] == [0, 1, 2] and groups["tail"] == [7, 8, 9]
    shuffled = [counts[i] for i in (3, 0, 9, 1, 8, 2, 7, 4, 6, 5)]
    assert head_medium_tail(list(range(10)), shuffled)["head"] == [1, 3, 5]


def test_group_keys_are_reported_inside_each_half():
    rng = np.random.default_rng(0)
    y_true = np.repeat(np.arange(20), 5)
    y_pred = np.where(rng.random(100) < 0.8, y_true, rng.integers(0, 20, 100))
    result = cluster_accuracy(y_true, y_pred, num_known=10, train_counts=list(range(200, 0, -10)))
    for half in ("known", "novel"):
        for group in ("head", "medium", "tail"):
            assert 0.0 <= result[f"{half}_{group}"] <= 1.0


def test_mismatched_lengths_are_a_clear_error():
    with pytest.raises(ValueError, match="equal length"):
        cluster_accuracy([0, 1], [0], num_known=1)


def test_pseudo_label_sizes_count_the_empty_clusters_and_the_spread_of_the_others():
    from ncdlr.metrics import pseudo_label_sizes

    assert pseudo_label_sizes([5, 0, 2, 0]) == {"clusters_empty": 2.0, "cluster_imbalance": 2.5}
    assert pseudo_label_sizes(np.full(6, 3.0)) == {"clusters_empty": 0.0, "cluster_imbalance": 1.0}
    nothing = pseudo_label_sizes([0, 0, 0])
    assert nothing["clusters_empty"] == 3.0 and np.isnan(nothing["cluster_imbalance"])
    for bad in ([], [[1, 2]], [1, -1]):
        with pytest.raises(ValueError, match="non-negative counts"):
            pseudo_label_sizes(bad)


def test_planted_f1_punishes_a_split_a_merge_and_a_swallowing_cluster_without_the_other_rows_labels():
    """F1(c, k) = 2|R_c ∩ k| / (|R_c| + |k|), best cluster per class; rows labelled -1 count only in cluster sizes."""
    from ncdlr.metrics import planted_f1

    planted = np.array([7] * 4 + [8] * 4)
    others = np.full(8, -1)  # the real pool: no labels
    y_true = np.concatenate([planted, others])
    alone = planted_f1(y_true, np.array([0] * 4 + [1] * 4 + [2] * 8), [7, 8])
    assert alone == {7: 1.0, 8: 1.0}  # cluster ids are free: each class is its own cluster
    split = planted_f1(y_true, np.array([0, 0, 5, 5] + [1] * 4 + [2] * 8), [7])
    assert split[7] == pytest.approx(2 * 2 / (4 + 2))  # half the class in each of two clusters
    merged = planted_f1(y_true, np.array([0] * 4 + [1] * 4 + [0] * 4 + [2] * 4), [7, 8])
    assert merged[7] == pytest.approx(2 * 4 / (4 + 8)) and merged[8] == 1.0  # four unlabelled rows joined class 7
    swallowed = planted_f1(y_true, np.zeros(16, dtype=int), [7, 8])
    assert swallowed == {7: pytest.approx(8 / 20), 8: pytest.approx(8 / 20)}
    with pytest.raises(ValueError, match="planted class 9 has no row"):
        planted_f1(y_true, np.zeros(16, dtype=int), [9])
    with pytest.raises(ValueError, match="equal length"):
        planted_f1(y_true, np.zeros(3, dtype=int), [7])
