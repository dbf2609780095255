"""Ku estimation (method.md §6): Ward tree + cuts, Hungarian scoring, the paper's bisection, the CLI."""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from scipy.cluster.hierarchy import fcluster, linkage
from sklearn.metrics import adjusted_rand_score

from ncdlr.cli import main
from ncdlr.estimate_k import (
    EstimateKConfig,
    bisect_num_novel,
    build_ward_tree,
    cut_linkage,
    estimate_num_novel,
    known_cluster_accuracy,
    synthetic_long_tail_features,
    weighted_ward_linkage,
)

# --------------------------------------------------------------------------------------------- bisection


@pytest.mark.parametrize("shape", ["increasing", "decreasing", "constant", "peaked", "random"])
def test_bisection_terminates_for_every_range(shape):
    rng = np.random.default_rng(0)
    table = rng.random(64)
    scores = {
        "increasing": lambda k: k,  # the paper's printed loop never ends on this one (high = low + 1)
        "decreasing": lambda k: -k,
        "constant": lambda k: 1.0,
        "peaked": lambda k: -abs(k - 23),
        "random": lambda k: table[k],
    }[shape]
    for low, high in itertools.combinations_with_replacement(range(40), 2):
        k, evaluated = bisect_num_novel(scores, low, high)
        assert low <= k <= high
        assert set(evaluated) <= set(range(low, high + 1))
        assert len(evaluated) <= 3 + math.ceil(math.log2(high - low + 1)) + 1


@pytest.mark.parametrize("k_max", [0, 1])
def test_bisection_handles_tiny_ranges(k_max):
    k, evaluated = bisect_num_novel(lambda k: -k, 0, k_max)
    assert k == 0 and set(evaluated) == set(range(k_max + 1))
    k, _ = bisect_num_novel(lambda k: k, 0, k_max)
    assert k == k_max


def test_bisection_finds_the_peak_of_a_unimodal_curve_on_the_paper_path():
    # Paper's rule compares score(high) vs score(low) and moves the worse end to med.
    k, _ = bisect_num_novel(lambda k: -abs(k - 37), 0, 100)
    assert k == 37


def test_bisection_rejects_an_empty_range():
    with pytest.raises(ValueError, match="k_low <= k_high"):
        bisect_num_novel(lambda k: 0.0, 5, 4)


# ------------------------------------------------------------------------------------ Ward tree and cuts


def test_weighted_ward_with_unit_weights_equals_scipy_ward():
    x = np.random.default_rng(1).normal(size=(200, 6))
    ours, reference = weighted_ward_linkage(x, np.ones(200)), linkage(x, method="ward")
    np.testing.assert_allclose(ours[:, 2], reference[:, 2], rtol=1e-9)
    for c in (1, 2, 7, 50, 199, 200):
        assert adjusted_rand_score(cut_linkage(ours, c), cut_linkage(reference, c)) == 1.0


def test_weighted_point_equals_duplicated_points():
    rng = np.random.default_rng(2)
    x = rng.normal(size=(40, 3))
    weights = rng.integers(1, 5, size=40)
    weighted = weighted_ward_linkage(x, weights)
    duplicated = linkage(np.repeat(x, weights, axis=0), method="ward")
    owner = np.repeat(np.arange(40), weights)
    # Duplicates merge first at height 0; after those n - 40 merges both trees are the same.
    np.testing.assert_allclose(weighted[:, 2], duplicated[-39:, 2], rtol=1e-9)
    for c in (2, 5, 13, 40):
        dup_labels = cut_linkage(duplicated, c)
        assert all(len(set(dup_labels[owner == i])) == 1 for i in range(40))
        assert adjusted_rand_score(cut_linkage(weighted, c), dup_labels[np.unique(owner, return_index=True)[1]]) == 1.0


def test_cut_gives_exactly_the_requested_clusters_and_agrees_with_fcluster():
    x = np.random.default_rng(3).normal(size=(120, 4))
    z = linkage(x, method="ward")
    for c in range(1, 121):
        labels = cut_linkage(z, c)
        assert labels.max() + 1 == c == len(np.unique(labels))
        assert adjusted_rand_score(labels, fcluster(z, c, criterion="maxclust")) == 1.0


def test_cut_rejects_impossible_cluster_counts():
    z = linkage(np.random.default_rng(0).normal(size=(5, 2)), method="ward")
    with pytest.raises(ValueError, match="num_clusters"):
        cut_linkage(z, 6)


def test_micro_cluster_tree_keeps_well_separated_classes_apart():
    features, labels, _ = synthetic_long_tail_features(4, 4, n_max=400, imbalance=5.0, seed=4)
    tree = build_ward_tree(features, ward_points=300, seed=0)
    assert tree.approximate and tree.num_leaves <= 300 and tree.leaf_of_row.shape == labels.shape
    assert adjusted_rand_score(labels, tree.cut(8)) > 0.99


def test_weighted_ward_rejects_nonpositive_weights():
    with pytest.raises(ValueError, match="positive"):
        weighted_ward_linkage(np.zeros((3, 2)), np.array([1.0, 0.0, 2.0]))


# ------------------------------------------------------------------------------------------------ scoring


def test_known_cluster_accuracy_instance_and_class_mean_divide_by_ks():
    labels = np.array([0] * 8 + [1] * 2 + [2] * 2)
    clusters = np.array([0] * 8 + [0] * 2 + [1, 2])  # class 1 merged into class 0's cluster, class 2 split
    instance, class_mean = known_cluster_accuracy(labels, clusters, num_known=3)
    assert instance == pytest.approx(9 / 12)
    assert class_mean == pytest.approx((1 + 0 + 0.5) / 3)  # the authors divide by Ks - 1 = 2


def test_known_cluster_accuracy_perfect_clustering_with_extra_clusters():
    labels = np.array([0, 0, 1, 1, 2])
    instance, class_mean = known_cluster_accuracy(labels, np.array([4, 4, 0, 0, 2]), num_known=3)
    assert instance == class_mean == 1.0


# --------------------------------------------------------------------------------------- the estimate


@pytest.fixture(scope="module")
def long_tail_estimates():
    """β = 0.5 and β = 1 estimates for Ks = Ku = 10, imbalance 10, on three seeds (one tree per seed)."""
    out = []
    for seed in range(3):
        features, labels, mask = synthetic_long_tail_features(10, 10, n_max=300, imbalance=10.0, seed=seed)
        mixed, scorer = estimate_num_novel(features, labels, mask, EstimateKConfig(beta=0.5, seed=seed))
        baseline, _ = estimate_num_novel(features, labels, mask, EstimateKConfig(beta=1.0), scorer=scorer)
        out.append((mixed, baseline))
    return out


def test_estimate_recovers_true_k_within_20_percent(long_tail_estimates):
    for mixed, _ in long_tail_estimates:
        assert mixed.num_known == 10
        assert abs(mixed.num_novel - 10) <= 2, mixed.evaluations


def test_mixed_metric_is_at_least_as_close_as_instance_accuracy(long_tail_estimates):
    # The paper's claim (Tab. 7): β = 1 favours head classes and underestimates Ku.
    for mixed, baseline in long_tail_estimates:
        assert abs(mixed.num_novel - 10) <= abs(baseline.num_novel - 10)
    assert sum(abs(b.num_novel - 10) for _, b in long_tail_estimates) > 0


def test_estimate_through_micro_clusters_when_rows_exceed_ward_points():
    features, labels, mask = synthetic_long_tail_features(10, 10, n_max=300, imbalance=10.0, seed=0)
    result, _ = estimate_num_novel(features, labels, mask, EstimateKConfig(ward_points=800))
    assert result.approximate and result.num_ward_leaves <= 800
    assert abs(result.num_novel - 10) <= 2


def test_k_max_is_clamped_to_the_tree():
    features, labels, mask = synthetic_long_tail_features(3, 3, n_max=5, imbalance=1.0, seed=0)
    result, _ = estimate_num_novel(features, labels, mask, EstimateKConfig(k_max=1000))
    assert result.k_max == len(labels) - 3


@pytest.mark.parametrize(
    ("mask_kind", "message"), [("none", "no labeled"), ("all", "no unlabeled")]
)
def test_estimate_rejects_data_without_both_halves(mask_kind, message):
    features, labels, _ = synthetic_long_tail_features(2, 2, n_max=5, seed=0)
    mask = np.zeros(len(labels), bool) if mask_kind == "none" else np.ones(len(labels), bool)
    with pytest.raises(ValueError, match=message):
        estimate_num_novel(features, labels, mask)


def test_estimate_rejects_nan_features():
    features, labels, mask = synthetic_long_tail_features(2, 2, n_max=5, seed=0)
    features[0, 0] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        estimate_num_novel(features, labels, mask)


@pytest.mark.parametrize("kwargs", [{"beta": 1.5}, {"k_max": -1}, {"ward_points": 1}, {"max_samples": 1}])
def test_config_rejects_bad_values(kwargs):
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        EstimateKConfig(**kwargs)


# -------------------------------------------------------------------------------------------------- CLI


def write_table(path, features, labels, splits):
    table = pa.table({
        "embedding": pa.array(list(features), type=pa.list_(pa.float32())),
        "label": pa.array(labels, type=pa.int32()),
        "split": pa.array(splits, type=pa.string()),
    })
    pq.write_table(table, path)


@pytest.fixture
def feature_table(tmp_path):
    features, labels, mask = synthetic_long_tail_features(10, 10, n_max=200, imbalance=10.0, seed=1)
    splits = np.where(mask, "known", "novel").tolist()
    # val/test rows must be ignored: give them a label the estimate would otherwise count as a class.
    features = np.concatenate([features, features[:5]])
    labels = np.concatenate([labels, np.full(5, 99)])
    splits += ["test"] * 5
    path = tmp_path / "features.parquet"
    write_table(path, features, labels, splits)
    return path


def test_cli_json_last_line_parses(feature_table, tmp_path, capsys):
    plot = tmp_path / "curve.png"
    assert main(["estimate-k", "--features", str(feature_table), "--json", "--plot", str(plot)]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    result = json.loads(out[-1])
    assert result["num_known"] == 10 and abs(result["num_novel"] - 10) <= 2
    assert result["seconds"] > 0 and 0 <= result["score"] <= 1
    assert any("estimated number of novel classes" in line for line in out)
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_missing_table_is_a_clear_error(tmp_path, capsys):
    assert main(["estimate-k", "--features", str(tmp_path / "nope.parquet")]) == 1
    assert "nope.parquet: feature table not found" in capsys.readouterr().err


def test_cli_table_without_embedding_column_names_it(tmp_path, capsys):
    path = tmp_path / "bad.parquet"
    pq.write_table(pa.table({"label": [0, 1], "split": ["known", "novel"]}), path)
    assert main(["estimate-k", "--features", str(path)]) == 1
    assert "lacks column(s) embedding" in capsys.readouterr().err


def test_cli_ragged_embeddings_are_rejected(tmp_path, capsys):
    path = tmp_path / "ragged.parquet"
    write_table(path, [np.zeros(3, np.float32), np.zeros(2, np.float32)], [0, 1], ["known", "novel"])
    assert main(["estimate-k", "--features", str(path)]) == 1
    assert "unequal" in capsys.readouterr().err


def test_cli_table_without_novel_rows_is_rejected(tmp_path, capsys):
    path = tmp_path / "known_only.parquet"
    write_table(path, [np.ones(3, np.float32)] * 2, [0, 1], ["known", "known"])
    assert main(["estimate-k", "--features", str(path)]) == 1
    assert "no rows with split 'novel'" in capsys.readouterr().err


def test_cli_bad_beta_is_rejected(feature_table, capsys):
    assert main(["estimate-k", "--features", str(feature_table), "--beta", "2"]) == 2
    assert "beta" in capsys.readouterr().err


def test_cli_data_without_encoder_is_a_clear_error(tmp_path, capsys):
    assert main(["estimate-k", "--data", str(tmp_path / "dataset")]) == 1
    assert "--data needs --encoder" in capsys.readouterr().err
