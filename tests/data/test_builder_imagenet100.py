"""ImageNet100-LT builder: listed WNIDs only, exact tails even with broken files, named errors."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from ncdlr.data.builders import imagenet100
from ncdlr.data.builders.common import SourceFormatError
from ncdlr.data.longtail import long_tail_counts, split_known_novel
from tests.fixtures.datasets import (
    IMAGENET_EXTRA_WNID,
    IMAGENET_TEST_WNIDS,
    IMAGENET_VAL_PER_CLASS,
    copy_tree,
    prepared_rows,
    truncated,
)


def config(root: Path, **overrides) -> imagenet100.ImageNet100LTConfig:
    values = dict(root=root, wnids=IMAGENET_TEST_WNIDS, n_max=10, known_ratio=5.0, novel_ratio=10.0)
    return imagenet100.ImageNet100LTConfig(**{**values, **overrides})


def test_the_list_is_the_authors_hundred_wnids() -> None:
    assert len(imagenet100.IMAGENET100_WNIDS) == 100 == len(set(imagenet100.IMAGENET100_WNIDS))
    assert list(imagenet100.IMAGENET100_WNIDS) == sorted(imagenet100.IMAGENET100_WNIDS)
    assert imagenet100.IMAGENET100_WNIDS[0] == "n01558993" and imagenet100.IMAGENET100_WNIDS[-1] == "n11879895"


def test_counts_follow_the_formula_and_other_folders_are_ignored(imagenet_root: Path) -> None:
    plan = imagenet100.plan(config(imagenet_root), progress=False)
    known, novel = split_known_novel(len(IMAGENET_TEST_WNIDS), 0)
    assert [c.name for c in plan.classes] == [IMAGENET_TEST_WNIDS[i] for i in known + novel]
    assert [c.train_count for c in plan.classes] == long_tail_counts(10, 3, 5.0) + long_tail_counts(10, 3, 10.0)
    assert Counter(r.label for r in plan.rows if r.split == "test") == {k: IMAGENET_VAL_PER_CLASS for k in range(6)}
    assert not any(IMAGENET_EXTRA_WNID in r.source_id for r in plan.rows)
    assert all(r.source_id.endswith(".JPEG") for r in plan.rows)


def test_broken_file_is_skipped_and_the_class_still_gets_its_exact_count(imagenet_root: Path, tmp_path: Path) -> None:
    root = copy_tree(imagenet_root, tmp_path / "src")
    head = imagenet100.plan(config(root), progress=False)
    victim = next(r for r in head.rows if r.label == 0)
    victim.path.write_bytes(truncated(victim.path.read_bytes()))
    plan = imagenet100.plan(config(root), progress=False)
    assert plan.classes[0].train_count == 10
    assert victim.source_id not in {r.source_id for r in plan.rows}
    assert [s.source_id for s in plan.skipped] == [victim.source_id]
    assert plan.info.extra["skipped_images"]["count"] == 1


def test_build_round_trips_bytes(imagenet_root: Path, tmp_path: Path) -> None:
    manifest = imagenet100.build(config(imagenet_root), str(tmp_path / "out"), progress=False)
    assert manifest.name == "imagenet100-lt-5-10" and manifest.split_counts["test"] == 12
    rows = prepared_rows(tmp_path / "out")
    assert all(r["image"] == (imagenet_root / r["source_id"]).read_bytes() for r in rows)


def test_missing_wnid_folder_is_an_error_naming_the_path(imagenet_root: Path) -> None:
    with pytest.raises(SourceFormatError, match=r"class folder \S*/train/n00000001 does not exist"):
        imagenet100.plan(config(imagenet_root, wnids=IMAGENET_TEST_WNIDS[:2] + ("n00000001",)), progress=False)


def test_short_class_keeps_what_it_has_and_is_reported(imagenet_root: Path) -> None:
    plan = imagenet100.plan(config(imagenet_root, n_max=15), progress=False)
    assert plan.classes[0].train_count == 12
    assert plan.info.extra["short_classes"][plan.classes[0].name] == [15, 12]
