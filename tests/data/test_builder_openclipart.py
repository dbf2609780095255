"""OpenClipart builder on a generated tree in the openclipart-png layout (the Debian package is not needed)."""

from __future__ import annotations

import io
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from ncdlr.data.builders import openclipart
from ncdlr.data.builders.common import SourceFormatError
from tests.fixtures.datasets import OPENCLIPART_CLASSES, prepared_rows


def config(root: Path, **overrides) -> openclipart.OpenClipartConfig:
    return openclipart.OpenClipartConfig(root=root, **{"min_images": 4, **overrides})


def test_classes_are_two_folder_levels_without_catch_alls_or_small_classes(openclipart_root: Path) -> None:
    plan = openclipart.plan(config(openclipart_root), progress=False)
    kept = {name for name, n in OPENCLIPART_CLASSES.items() if n >= 4}
    assert {c.name for c in plan.classes} == kept == {"animals/birds", "shapes/stars", "food/fruit"}
    assert plan.info.extra["dropped_catch_all"] == 11  # animals/loose.png, unsorted/ x5, special/ x5
    assert plan.info.extra["dropped_small_classes"] == {"plants/trees": 3}
    per_class = Counter(r.class_name for r in plan.rows)
    assert per_class == {name: OPENCLIPART_CLASSES[name] for name in kept}


def test_duplicates_are_dropped_within_and_across_classes(openclipart_root: Path) -> None:
    plan = openclipart.plan(config(openclipart_root), progress=False)
    ids = {r.source_id for r in plan.rows}
    assert "animals/birds/copy_of_birds0.png" not in ids and "animals/birds/birds0.png" in ids
    assert not {"food/fruit/shared.png", "shapes/stars/shared.png"} & ids
    assert plan.info.extra["dropped_duplicates"] == {"within_class": 1, "across_classes": 2}
    raw = openclipart.plan(config(openclipart_root, dedupe=False), progress=False)
    assert Counter(r.class_name for r in raw.rows) == {"animals/birds": 10, "shapes/stars": 7, "food/fruit": 5}


def test_undrawable_files_are_skipped_and_reported(openclipart_root: Path) -> None:
    plan = openclipart.plan(config(openclipart_root), progress=False)
    report = {s["source_id"]: s["reason"] for s in plan.info.extra["skipped_images"]["images"]}
    assert set(report) == {"animals/birds/blank.png", "animals/birds/broken.png"}
    assert "fully transparent" in report["animals/birds/blank.png"]
    assert plan.info.extra["skipped_images"]["count"] == 2


def test_test_hold_out_is_a_seeded_fifth_with_a_minimum(openclipart_root: Path) -> None:
    plan = openclipart.plan(config(openclipart_root, min_test=1), progress=False)
    test = Counter(r.class_name for r in plan.rows if r.split == "test")
    assert test == {"animals/birds": 2, "shapes/stars": 1, "food/fruit": 1}  # round(0.2 n), n = 9, 6, 4
    plan3 = openclipart.plan(config(openclipart_root), progress=False)
    assert set(Counter(r.class_name for r in plan3.rows if r.split == "test").values()) == {3}

    def held_out(seed: int) -> set[str]:
        plan = openclipart.plan(config(openclipart_root, min_test=1, seed=seed), progress=False)
        return {r.source_id for r in plan.rows if r.split == "test"}

    assert held_out(0) == held_out(0) == {r.source_id for r in plan.rows if r.split == "test"}
    assert held_out(0) != held_out(5)


def test_images_are_cropped_flattened_opaque_pngs(openclipart_root: Path) -> None:
    plan = openclipart.plan(config(openclipart_root), progress=False)
    row = next(r for r in plan.rows if r.source_id == "animals/birds/birds1.png")  # an RGBA source
    left, upper, right, lower = Image.open(openclipart_root / row.source_id).getchannel("A").getbbox()
    out = Image.open(io.BytesIO(row.image))
    assert out.format == "PNG" and out.mode == "RGB"
    assert out.size == (right - left, lower - upper)
    colours = np.unique(np.asarray(out).reshape(-1, 3), axis=0)
    assert len(colours) == 1, "the fixture's drawing is one opaque rectangle: the crop holds nothing else"


def test_jpeg_option_and_build(openclipart_root: Path, tmp_path: Path) -> None:
    manifest = openclipart.build(config(openclipart_root, image_format="JPEG"), str(tmp_path / "out"), progress=False)
    rows = prepared_rows(tmp_path / "out")
    assert all(r["image"][:2] == b"\xff\xd8" for r in rows)
    assert manifest.num_known + manifest.num_novel == 3 and len(rows) == 19
    assert manifest.extra["skipped_images"]["count"] == 2


def test_jpeg_quality_sets_the_quantisation_and_is_recorded(openclipart_root: Path) -> None:
    """``--jpeg-quality`` (a copy small enough to carry to a GPU machine) reaches the encoder and the manifest."""
    def plan_at(quality: int):
        return openclipart.plan(config(openclipart_root, image_format="JPEG", jpeg_quality=quality), progress=False)

    def luma_table(plan) -> float:
        return float(np.mean(Image.open(io.BytesIO(plan.rows[0].image)).quantization[0]))

    fine, coarse = plan_at(95), plan_at(30)
    assert luma_table(coarse) > 5 * luma_table(fine)  # Pillow's quality scales the quantisation tables
    assert coarse.info.extra["image_encoding"].startswith("JPEG quality 30;")
    assert [r.source_id for r in coarse.rows] == [r.source_id for r in fine.rows]  # only the bytes change


@pytest.mark.parametrize("quality", [0, 96])
def test_jpeg_quality_out_of_range_is_an_error(openclipart_root: Path, quality: int) -> None:
    with pytest.raises(ValueError, match="jpeg_quality must be in 1..95"):
        openclipart.plan(config(openclipart_root, image_format="JPEG", jpeg_quality=quality), progress=False)


def test_missing_root_names_the_package(tmp_path: Path) -> None:
    with pytest.raises(SourceFormatError, match="apt-get install openclipart-png"):
        openclipart.plan(config(tmp_path / "nope"), progress=False)


def test_too_few_classes_is_an_error(openclipart_root: Path) -> None:
    with pytest.raises(SourceFormatError, match="only 0 class"):
        openclipart.plan(config(openclipart_root, min_images=50), progress=False)
