"""iNat18 builder: the seeded class draw (prefix property), natural-tail splits, and bad-input handling."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from ncdlr.data.builders import inat18
from ncdlr.data.builders.common import SourceFormatError
from ncdlr.data.manifest import read_manifest
from tests.fixtures.datasets import (
    INAT_CATEGORIES,
    inat_train_count,
    INAT_VAL_PER_CLASS,
    copy_tree,
    prepared_rows,
    truncated,
)


def test_smaller_draw_is_a_prefix_of_the_larger_draw() -> None:
    known10, novel10 = inat18.draw_classes(range(INAT_CATEGORIES), 10, seed=0)
    known20, novel20 = inat18.draw_classes(range(INAT_CATEGORIES), 20, seed=0)
    assert known10 + novel10 == (known20 + novel20)[:10]
    assert set(known10) <= set(known20), "the known half of the small draw is known in the large one"
    assert set(known20) == set(known10 + novel10), "the large draw's known set is the whole small draw"
    assert len(known10) == len(novel10) == 5 and len(known20) == len(novel20) == 10


def test_draw_equals_the_authors_numpy_choice() -> None:
    np.random.seed(0)
    authors = np.random.choice(range(INAT_CATEGORIES), size=20, replace=False).tolist()
    known, novel = inat18.draw_classes(range(INAT_CATEGORIES), 20, seed=0)
    assert known + novel == authors


def test_draw_depends_on_seed_and_rejects_impossible_sizes() -> None:
    assert inat18.draw_classes(range(40), 10, 0) != inat18.draw_classes(range(40), 10, 1)
    assert inat18.draw_classes(range(40), 7, 0)[0] == inat18.draw_classes(range(40), 7, 0)[0]
    assert len(inat18.draw_classes(range(40), 7, 0)[0]) == 4  # ceil(7/2) known
    with pytest.raises(ValueError, match="2..40"):
        inat18.draw_classes(range(40), 41, 0)


def test_plan_takes_every_train_and_val_image_of_the_drawn_classes(inat_root: Path) -> None:
    plan = inat18.plan(inat18.Inat18Config(root=inat_root, num_classes=10), progress=False)
    known, novel = inat18.draw_classes(range(INAT_CATEGORIES), 10, seed=0)
    assert [c.name for c in plan.classes] == [f"Species {c:04d}" for c in known + novel]
    assert [c.group for c in plan.classes] == ["known"] * 5 + ["novel"] * 5
    assert [c.train_count for c in plan.classes] == [inat_train_count(c) for c in known + novel]
    test_counts = Counter(r.label for r in plan.rows if r.split == "test")
    assert test_counts == {label: INAT_VAL_PER_CLASS for label in range(10)}
    for row in plan.rows:
        assert row.split == ("test" if row.split == "test" else ("known" if row.label < 5 else "novel"))
        assert row.source_id.startswith("train_val2018/") and (inat_root / row.source_id).is_file()


def test_a_class_keeps_its_label_in_the_larger_draw(inat_root: Path) -> None:
    small = inat18.plan(inat18.Inat18Config(root=inat_root, num_classes=10), progress=False)
    large = inat18.plan(inat18.Inat18Config(root=inat_root, num_classes=20), progress=False)
    assert [c.name for c in small.classes] == [c.name for c in large.classes][:10]
    assert all(c.group == "known" for c in large.classes[:10])


def test_build_writes_a_dataset_whose_rows_match_the_plan(inat_root: Path, tmp_path: Path) -> None:
    config = inat18.Inat18Config(root=inat_root, num_classes=10)
    manifest = inat18.build(config, str(tmp_path / "out"), progress=False)
    plan = inat18.plan(config, progress=False)
    assert manifest == read_manifest(str(tmp_path / "out"))
    assert manifest.name == "inat18-10" and manifest.num_known == 5 and manifest.num_novel == 5
    assert manifest.extra["skipped_images"]["count"] == 0
    rows = prepared_rows(tmp_path / "out")
    assert [(r["source_id"], r["label"], r["split"]) for r in rows] == sorted(
        (p.source_id, p.label, p.split) for p in plan.rows
    )
    assert all(r["image"] == (inat_root / r["source_id"]).read_bytes() for r in rows), "bytes copied verbatim"


def test_build_is_deterministic(inat_root: Path, tmp_path: Path) -> None:
    config = inat18.Inat18Config(root=inat_root, num_classes=10, seed=3)
    first = inat18.build(config, str(tmp_path / "a"), progress=False)
    second = inat18.build(config, str(tmp_path / "b"), progress=False)
    assert [s.sha256 for s in first.shards] == [s.sha256 for s in second.shards]


# ------------------------------------------------------------------------------------------ bad input

def _edit_json(root: Path, name: str, edit) -> None:
    data = json.loads((root / name).read_text())
    edit(data)
    (root / name).write_text(json.dumps(data))


def test_annotation_naming_an_unknown_category_is_an_error_naming_it(inat_root: Path, tmp_path: Path) -> None:
    root = copy_tree(inat_root, tmp_path / "src")
    _edit_json(root, "val2018.json", lambda d: d["annotations"][0].update(category_id=987654))
    with pytest.raises(SourceFormatError, match=r"val2018\.json.*category id 987654"):
        inat18.plan(inat18.Inat18Config(root=root, num_classes=10), progress=False)


def test_annotation_naming_an_unknown_image_is_an_error(inat_root: Path, tmp_path: Path) -> None:
    root = copy_tree(inat_root, tmp_path / "src")
    _edit_json(root, "train2018.json", lambda d: d["annotations"][0].update(image_id=55555555))
    with pytest.raises(SourceFormatError, match="image id 55555555"):
        inat18.plan(inat18.Inat18Config(root=root, num_classes=10), progress=False)


def test_image_with_two_annotations_is_an_error(inat_root: Path, tmp_path: Path) -> None:
    root = copy_tree(inat_root, tmp_path / "src")
    _edit_json(root, "train2018.json", lambda d: d["annotations"].append(dict(d["annotations"][0], id=-1)))
    with pytest.raises(SourceFormatError, match="more than one annotation"):
        inat18.plan(inat18.Inat18Config(root=root, num_classes=10), progress=False)


def test_missing_json_key_and_invalid_json_are_errors_naming_the_file(inat_root: Path, tmp_path: Path) -> None:
    root = copy_tree(inat_root, tmp_path / "src")
    _edit_json(root, "train2018.json", lambda d: d.pop("annotations"))
    with pytest.raises(SourceFormatError, match=r"train2018\.json: missing or non-list key 'annotations'"):
        inat18.plan(inat18.Inat18Config(root=root, num_classes=10), progress=False)
    (root / "train2018.json").write_text("{not json")
    with pytest.raises(SourceFormatError, match=r"train2018\.json is not valid JSON"):
        inat18.plan(inat18.Inat18Config(root=root, num_classes=10), progress=False)


def test_missing_image_file_is_an_error_naming_the_path(inat_root: Path, tmp_path: Path) -> None:
    root = copy_tree(inat_root, tmp_path / "src")
    plan = inat18.plan(inat18.Inat18Config(root=root, num_classes=10), progress=False)
    victim = root / plan.rows[-1].source_id
    victim.unlink()
    with pytest.raises(SourceFormatError, match=str(victim)):
        inat18.plan(inat18.Inat18Config(root=root, num_classes=10), progress=False)


def test_undecodable_image_is_skipped_counted_and_reported(inat_root: Path, tmp_path: Path) -> None:
    root = copy_tree(inat_root, tmp_path / "src")
    config = inat18.Inat18Config(root=root, num_classes=10)
    before = inat18.plan(config, progress=False)
    victim = next(r for r in before.rows if r.split == "known")
    victim.path.write_bytes(truncated(victim.path.read_bytes()))
    manifest = inat18.build(config, str(tmp_path / "out"), progress=False)
    report = manifest.extra["skipped_images"]
    assert report["count"] == 1 and report["images"][0]["source_id"] == victim.source_id
    assert manifest.classes[victim.label].train_count == before.classes[victim.label].train_count - 1
    assert victim.source_id not in {r["source_id"] for r in prepared_rows(tmp_path / "out")}


def test_without_verify_an_undecodable_image_is_copied_as_is(inat_root: Path, tmp_path: Path) -> None:
    root = copy_tree(inat_root, tmp_path / "src")
    config = inat18.Inat18Config(root=root, num_classes=10, verify=False)
    victim = next(r for r in inat18.plan(config, progress=False).rows if r.split == "test")
    victim.path.write_bytes(truncated(victim.path.read_bytes()))
    plan = inat18.plan(config, progress=False)
    assert victim.source_id in {r.source_id for r in plan.rows}
    assert plan.info.extra["skipped_images"]["count"] == 0


def test_more_classes_than_categories_is_an_error(inat_root: Path) -> None:
    with pytest.raises(ValueError, match="num_classes must be in 2..40"):
        inat18.plan(inat18.Inat18Config(root=inat_root, num_classes=41), progress=False)
