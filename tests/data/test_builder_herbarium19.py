"""Herbarium19 builder: every class, natural tail, ceil(C/2) known, validation as test."""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path

import pytest

from ncdlr.data.builders import herbarium19
from ncdlr.data.builders.common import SourceFormatError
from ncdlr.data.longtail import split_known_novel
from tests.fixtures.datasets import HERBARIUM_TRAIN_COUNTS, HERBARIUM_VAL_PER_CLASS, copy_tree, prepared_rows


def test_all_classes_natural_counts_and_validation_as_test(herbarium_root: Path) -> None:
    plan = herbarium19.plan(herbarium19.Herbarium19Config(root=herbarium_root), progress=False)
    known, novel = split_known_novel(len(HERBARIUM_TRAIN_COUNTS), 0)
    assert len(known) == 4 and len(novel) == 3  # ceil(7/2) known, as 683 -> 342
    assert [c.name for c in plan.classes] == [f"Miconia sp{i}" for i in known + novel]
    assert [c.train_count for c in plan.classes] == [HERBARIUM_TRAIN_COUNTS[i] for i in known + novel]
    assert Counter(r.label for r in plan.rows if r.split == "test") == {k: HERBARIUM_VAL_PER_CLASS for k in range(7)}
    assert plan.info.imbalance == {
        group: max(c.train_count for c in plan.classes if c.group == group)
        / min(c.train_count for c in plan.classes if c.group == group)
        for group in ("known", "novel")
    }
    assert {r.source_id.split("/")[0] for r in plan.rows} == {"train", "validation"}


def test_file_names_relative_to_the_root_also_work(herbarium_root: Path, tmp_path: Path) -> None:
    root = copy_tree(herbarium_root, tmp_path / "src")
    for folder in ("train", "validation"):
        meta = json.loads((root / folder / "metadata.json").read_text())
        for image in meta["images"]:
            image["file_name"] = f"{folder}/{image['file_name']}"
        (root / folder / "metadata.json").write_text(json.dumps(meta))
    plan = herbarium19.plan(herbarium19.Herbarium19Config(root=root), progress=False)
    assert sum(c.train_count for c in plan.classes) == sum(HERBARIUM_TRAIN_COUNTS)


def test_build_writes_the_dataset(herbarium_root: Path, tmp_path: Path) -> None:
    manifest = herbarium19.build(herbarium19.Herbarium19Config(root=herbarium_root), str(tmp_path / "out"),
                                 progress=False)
    assert manifest.name == "herbarium19" and (manifest.num_known, manifest.num_novel) == (4, 3)
    assert len(prepared_rows(tmp_path / "out")) == sum(HERBARIUM_TRAIN_COUNTS) + 7 * HERBARIUM_VAL_PER_CLASS


def test_validation_category_missing_from_training_is_an_error(herbarium_root: Path, tmp_path: Path) -> None:
    root = copy_tree(herbarium_root, tmp_path / "src")
    meta = json.loads((root / "validation" / "metadata.json").read_text())
    meta["annotations"][0]["category_id"] = 683
    (root / "validation" / "metadata.json").write_text(json.dumps(meta))
    with pytest.raises(SourceFormatError, match=r"validation/metadata\.json.*category id 683"):
        herbarium19.plan(herbarium19.Herbarium19Config(root=root), progress=False)


def test_missing_image_folder_is_an_error_naming_the_paths_tried(herbarium_root: Path, tmp_path: Path) -> None:
    root = copy_tree(herbarium_root, tmp_path / "src")
    shutil.rmtree(root / "validation" / "images")
    with pytest.raises(SourceFormatError, match=r"first image file not found \(tried .*validation/images/"):
        herbarium19.plan(herbarium19.Herbarium19Config(root=root), progress=False)
