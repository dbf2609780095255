"""The known-class validation split: only known rows, no image twice, scoring disjoint from training, long tail kept."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from ncdlr.data.features import (FeatureSplits, FeatureTableError, read_feature_table, synthetic_features,
                                 write_feature_table)
from ncdlr.data.storage import ObjectNotFoundError
from ncdlr.metrics import head_medium_tail
from ncdlr.service.validation import (
    SCORING_SPLIT,
    ValidationConfig,
    build_validation_table,
    choose_pseudo_novel,
    holdout_mask,
    planted_scores,
    planted_splits,
    read_validation_split,
    validation_scores,
    validation_splits,
)


@pytest.fixture
def source_table(tmp_path) -> str:
    """10 known + 10 novel long-tailed classes, with unique source ids; novel labels deliberately corrupted."""
    x, y, s = synthetic_features(num_known=10, num_novel=10, dim=8, n_max=60, ratio=10, test_per_class=4, seed=1)
    ids = [f"img-{i:05d}" for i in range(len(y))]
    path = str(tmp_path / "source.parquet")
    write_feature_table(path, x, y, s, num_known=10, num_novel=10, source_ids=ids)
    # Novel labels are never read: make them unusable (a reader that looked at them would fail or mislabel).
    table = pq.read_table(path)
    labels = np.where(np.asarray(table.column("split").to_pylist()) == "novel", -7, table.column("label").to_numpy())
    table = table.set_column(table.schema.get_field_index("label"), "label", pa.array(labels, pa.int32()))
    pq.write_table(table, path)
    return path


def _rows(uri: str) -> dict[str, np.ndarray]:
    table = pq.read_table(uri)
    return {name: np.asarray(table.column(name).to_pylist()) for name in ("label", "split", "source_id")}


def test_validation_table_holds_only_known_class_images(source_table, tmp_path):
    out = str(tmp_path / "val.parquet")
    info = build_validation_table(source_table, out)
    src = _rows(source_table)
    known_ids = set(src["source_id"][src["split"] == "known"])
    val = _rows(out)
    assert set(val["source_id"]) == known_ids  # every known image, and nothing from novel/test
    assert set(info.pseudo_known) | set(info.pseudo_novel) == set(range(10))
    assert not set(info.pseudo_known) & set(info.pseudo_novel)


def test_no_image_twice_and_none_both_trained_and_scored(source_table, tmp_path):
    out = str(tmp_path / "val.parquet")
    build_validation_table(source_table, out)
    val = _rows(out)
    assert len(set(val["source_id"])) == len(val["source_id"])
    scored = set(val["source_id"][val["split"] == SCORING_SPLIT])
    trained = set(val["source_id"][val["split"] != SCORING_SPLIT])
    assert scored and trained and not scored & trained


def test_labels_are_remapped_pseudo_known_first_and_the_trainer_reads_the_table(source_table, tmp_path):
    out = str(tmp_path / "val.parquet")
    info = build_validation_table(source_table, out)
    splits = read_feature_table(out)  # the trainer's reader accepts it
    assert (splits.num_known, splits.num_novel) == (8, 2) == (info.num_known, info.num_novel)
    assert set(splits.labels["known"].tolist()) == set(range(8))
    assert set(splits.labels["novel"].tolist()) == {8, 9}
    src = _rows(source_table)
    original = dict(zip(src["source_id"], src["label"]))
    val = _rows(out)
    order = info.pseudo_known + info.pseudo_novel
    assert all(order[new] == original[sid] for new, sid in zip(val["label"], val["source_id"]))
    assert read_validation_split(out).pseudo_novel == info.pseudo_novel
    assert info.target_num_novel == 10  # Ku of the real problem, from the metadata (for the γ transfer)


def test_the_table_holds_the_in_memory_validation_splits(source_table, tmp_path):
    out = str(tmp_path / "val.parquet")
    info = build_validation_table(source_table, out)
    known = read_feature_table(source_table, splits=("known",))
    expected, same = validation_splits(known, ValidationConfig(), num_novel=10, source=source_table)
    assert same == info
    written = read_feature_table(out)
    assert (written.num_known, written.num_novel, written.class_names) == \
        (expected.num_known, expected.num_novel, expected.class_names)
    for split in ("known", "novel", SCORING_SPLIT):
        assert torch.equal(written.features[split], expected.features[split])
        assert torch.equal(written.labels[split], expected.labels[split])
        assert written.source_ids[split] == expected.source_ids[split]


def test_in_memory_splits_need_only_the_known_rows(source_table):
    known = read_feature_table(source_table, splits=("known",))
    only_known = type(known)({"known": known.features["known"]}, {"known": known.labels["known"]}, 10, 10,
                             known.class_names)
    validation, info = validation_splits(only_known)
    assert info.target_num_novel == 10 and sum(info.split_counts.values()) == len(known.labels["known"])
    assert sorted(validation.features) == ["known", "novel", SCORING_SPLIT]


def unlabeled_pool() -> tuple[FeatureSplits, int]:
    """10 known + 10 novel long-tailed classes in memory; the novel rows come *without labels*."""
    x, y, s = synthetic_features(num_known=10, num_novel=10, dim=8, n_max=60, ratio=10, test_per_class=4, seed=1)
    x, y = torch.as_tensor(x), torch.as_tensor(y)
    known, novel = torch.as_tensor(s == "known"), torch.as_tensor(s == "novel")
    ids = {"known": [f"k-{i}" for i in range(int(known.sum()))], "novel": [f"n-{i}" for i in range(int(novel.sum()))]}
    return FeatureSplits({"known": x[known], "novel": x[novel]}, {"known": y[known]}, 10, 10,
                         [str(c) for c in range(20)], source_ids=ids), int(novel.sum())


def test_a_planted_problem_puts_the_pseudo_novel_rows_in_the_real_pool_without_reading_a_novel_label():
    """planted_splits: the validation problem of the same seed, its ``novel`` split followed by every real novel
    training row under one placeholder label, with clusters for both (Ku' + Ku); ``val`` and ``known`` unchanged.
    The novel labels are absent from the splits given, so a reader of them would fail."""
    splits, real = unlabeled_pool()
    alone, _ = validation_splits(splits, ValidationConfig(seed=3))
    problem, info = planted_splits(splits, ValidationConfig(seed=3))
    for split in ("known", SCORING_SPLIT):
        assert torch.equal(problem.features[split], alone.features[split])
        assert torch.equal(problem.labels[split], alone.labels[split])
    pseudo = len(alone.labels["novel"])
    assert torch.equal(problem.features["novel"], torch.cat([alone.features["novel"], splits.features["novel"]]))
    assert torch.equal(problem.labels["novel"][:pseudo], alone.labels["novel"])
    assert set(problem.labels["novel"][pseudo:].tolist()) == {alone.num_known + alone.num_novel}
    assert problem.num_novel == alone.num_novel + 10 and problem.num_known == alone.num_known
    assert len(problem.class_names) == problem.num_known + problem.num_novel
    assert problem.source_ids["novel"] == alone.source_ids["novel"] + splits.source_ids["novel"]
    assert info.unlabeled_rows == real and info.split_counts["novel"] == pseudo + real
    assert (info.num_known, info.num_novel) == (alone.num_known, alone.num_novel)  # the planted classes alone
    assert problem.metadata["validation"]["unlabeled_rows"] == real


def test_a_planted_problem_needs_novel_rows_of_the_known_rows_shape():
    splits, _ = unlabeled_pool()
    only_known = FeatureSplits({"known": splits.features["known"]}, splits.labels, 10, 10, splits.class_names)
    with pytest.raises(FeatureTableError, match="the-table: no rows with split 'novel' to plant"):
        planted_splits(only_known, source="the-table")
    wrong = FeatureSplits({"known": splits.features["known"], "novel": splits.features["novel"][:, :5]},
                          splits.labels, 10, 10, splits.class_names)
    with pytest.raises(FeatureTableError, match=r"the-table: novel rows have shape \(5,\), known rows \(8,\)"):
        planted_splits(wrong, source="the-table")


def test_the_planted_score_is_the_planted_classes_mean_f1_in_the_whole_pool():
    problem, info = planted_splits(unlabeled_pool()[0], ValidationConfig(seed=0))
    y = problem.labels["novel"].numpy()
    perfect = np.where(y < problem.num_known + info.num_novel, y, -1)  # each planted class its own cluster
    assert planted_scores(y, perfect, info) == {"score": 1.0, "score_min": 1.0}
    one_cluster = planted_scores(y, np.zeros_like(y), info)
    counts = [int((y == c).sum()) for c in range(info.num_known, info.num_known + info.num_novel)]
    assert one_cluster["score"] == pytest.approx(np.mean([2 * n / (n + len(y)) for n in counts]))
    assert one_cluster["score_min"] == pytest.approx(2 * min(counts) / (min(counts) + len(y)))


def _pool_table(path: str, novel_labels_seed: int) -> str:
    """10 known + 10 novel classes; the novel rows' labels permuted by ``novel_labels_seed`` (valid, but scrambled)."""
    x, y, s = synthetic_features(num_known=10, num_novel=10, dim=8, n_max=60, ratio=10, test_per_class=4, seed=1)
    y = np.asarray(y).copy()
    novel = np.flatnonzero(np.asarray(s) == "novel")
    y[novel] = np.random.default_rng(novel_labels_seed).permutation(y[novel])
    write_feature_table(path, x, y, s, num_known=10, num_novel=10, source_ids=[f"img-{i:05d}" for i in range(len(y))])
    return path


def test_a_planted_validation_table_holds_the_pool_and_no_novel_label(tmp_path):
    """build_validation_table(planted=True) writes planted_splits' problem: the pseudo-novel training rows and every
    novel row of the source, Ku' + Ku clusters. Two sources that differ only in their novel labels give the same
    table, and the pool's rows carry the placeholder alone: no novel label is used or written."""
    a = build_validation_table(_pool_table(str(tmp_path / "a.parquet"), 1), str(tmp_path / "va.parquet"), planted=True)
    b = build_validation_table(_pool_table(str(tmp_path / "b.parquet"), 2), str(tmp_path / "vb.parquet"), planted=True)
    assert dataclasses.replace(a, source="") == dataclasses.replace(b, source="")
    assert a.planted and a.num_clusters == a.num_novel + 10
    first, second = read_feature_table(str(tmp_path / "va.parquet")), read_feature_table(str(tmp_path / "vb.parquet"))
    for split in ("known", "novel", SCORING_SPLIT):
        assert torch.equal(first.features[split], second.features[split])
        assert torch.equal(first.labels[split], second.labels[split])
    source = read_feature_table(str(tmp_path / "a.parquet"), splits=("known", "novel"))
    expected, _ = planted_splits(source, ValidationConfig(), source="a")
    assert (first.num_known, first.num_novel) == (expected.num_known, expected.num_novel) == (8, 12)
    assert torch.equal(first.features["novel"], expected.features["novel"])
    pool = first.labels["novel"][-a.unlabeled_rows:]
    assert a.unlabeled_rows == len(source.labels["novel"]) and set(pool.tolist()) == {first.num_known + a.num_novel}
    assert first.source_ids["novel"][-a.unlabeled_rows:] == source.source_ids["novel"]
    assert read_validation_split(str(tmp_path / "va.parquet")) == a


def test_a_planted_validation_table_needs_novel_rows(tmp_path):
    x, y, s = synthetic_features(num_known=10, num_novel=10, dim=8, n_max=60, ratio=10, test_per_class=4, seed=1)
    keep = np.asarray(s) != "novel"
    path = str(tmp_path / "known-only.parquet")
    write_feature_table(path, np.asarray(x)[keep], np.asarray(y)[keep], np.asarray(s)[keep], num_known=10,
                        num_novel=10)
    with pytest.raises(FeatureTableError, match="known-only.parquet: no rows with split 'novel'"):
        build_validation_table(path, str(tmp_path / "val.parquet"), planted=True)
    assert not (tmp_path / "val.parquet").exists()


def test_the_score_is_the_pseudo_novel_class_mean_accuracy_after_one_matching():
    y_true = np.array([0, 0, 1, 1, 2, 2, 2, 3])
    counts = [10, 10, 8, 2]
    swapped = validation_scores(y_true, np.array([0, 0, 1, 1, 3, 3, 3, 2]), 2, counts)
    assert swapped["score"] == 1.0 and swapped["val_known"] == 1.0  # cluster ids are matched, not compared
    merged = validation_scores(y_true, np.array([0, 0, 1, 1, 2, 2, 2, 2]), 2, counts)
    assert merged["score"] == pytest.approx(0.5) and merged["val_novel_inst"] == pytest.approx(0.75)


def test_pseudo_novel_choice_is_stratified_over_head_medium_tail():
    counts = [int(1000 * 50 ** (-c / 19)) for c in range(20)]
    groups = head_medium_tail(list(range(20)), counts)
    for seed in range(5):
        chosen = choose_pseudo_novel(counts, 0.2, seed)
        assert len(chosen) == 4
        per_group = {g: len(set(chosen) & set(members)) for g, members in groups.items()}
        assert per_group == {"head": 1, "medium": 2, "tail": 1}
    assert choose_pseudo_novel(counts, 0.2, 0) == choose_pseudo_novel(counts, 0.2, 0)
    assert len({tuple(choose_pseudo_novel(counts, 0.2, s)) for s in range(5)}) > 1


def test_holdout_takes_a_share_of_every_class_but_keeps_one_image_classes_for_training():
    labels = np.repeat([0, 1, 2, 3], [50, 5, 2, 1])
    mask = holdout_mask(labels, 0.2, seed=0)
    assert [int(mask[labels == c].sum()) for c in range(4)] == [10, 1, 1, 0]


def test_too_few_known_classes_are_refused(tmp_path):
    x, y, s = synthetic_features(num_known=2, num_novel=2, dim=4, n_max=10, ratio=2, seed=0)
    path = str(tmp_path / "two.parquet")
    write_feature_table(path, x, y, s, num_known=2, num_novel=2)
    with pytest.raises(ValueError, match="2 known classes cannot give 2 pseudo-novel"):
        build_validation_table(path, str(tmp_path / "val.parquet"))


def test_missing_column_is_named(tmp_path):
    path = str(tmp_path / "bad.parquet")
    pq.write_table(pa.table({"embedding": [[0.0, 1.0]], "split": ["known"]}), path)
    with pytest.raises(ValueError, match=r"lacks column\(s\) label"):
        build_validation_table(path, str(tmp_path / "val.parquet"))


def test_missing_table_is_named(tmp_path):
    with pytest.raises(ObjectNotFoundError, match="nowhere.parquet"):
        build_validation_table(str(tmp_path / "nowhere.parquet"), str(tmp_path / "val.parquet"))


def test_repeated_source_ids_are_refused(tmp_path):
    x, y, s = synthetic_features(num_known=5, num_novel=5, dim=4, n_max=10, ratio=2, seed=0)
    ids = ["same"] * len(y)
    path = str(tmp_path / "dup.parquet")
    write_feature_table(path, x, y, s, num_known=5, num_novel=5, source_ids=ids)
    with pytest.raises(ValueError, match="source_id values repeat"):
        build_validation_table(path, str(tmp_path / "val.parquet"))


def test_table_without_ku_needs_num_novel(tmp_path):
    x, y, s = synthetic_features(num_known=5, num_novel=5, dim=4, n_max=10, ratio=2, seed=0)
    path = str(tmp_path / "plain.parquet")
    write_feature_table(path, x, y, s, num_known=5, num_novel=5)
    table = pq.read_table(path)
    pq.write_table(table.replace_schema_metadata({}), path)
    with pytest.raises(ValueError, match="num_novel"):
        build_validation_table(path, str(tmp_path / "val.parquet"))
    info = build_validation_table(path, str(tmp_path / "val.parquet"), num_novel=5)
    meta = json.loads(pq.read_schema(str(tmp_path / "val.parquet")).metadata[b"ncdlr"])
    assert info.target_num_known == 5 and meta["validation"]["target_num_novel"] == 5


@pytest.mark.parametrize("field,value", [("pseudo_novel_fraction", 0.0), ("pseudo_novel_fraction", 1.0),
                                         ("holdout_fraction", 1.5), ("min_pseudo_novel", 1)])
def test_out_of_range_settings_are_refused(source_table, tmp_path, field, value):
    with pytest.raises(ValueError, match=field):
        build_validation_table(source_table, str(tmp_path / "val.parquet"), ValidationConfig(**{field: value}))
