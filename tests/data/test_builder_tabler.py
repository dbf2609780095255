"""Tabler-LT builder on a generated @tabler/icons package (the npm package is not needed): the real layout,
``@tabler/icons/icons.json`` and ``icons/<style>/<name>.svg``, with line-drawing SVGs rendered by resvg."""

from __future__ import annotations

import io
import json
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from ncdlr.cli import main
from ncdlr.data.builders import tabler
from ncdlr.data.builders.common import SourceFormatError
from ncdlr.data.manifest import read_manifest
from tests.fixtures.datasets import prepared_rows

#: category → icons in it (each a family of the icon and, for even i, its "-off" variant): Arrows 8 icons, Weather 6,
#: Food 5 (4 once its broken one is left out), Zodiac 2; icons with an empty category are left out
CLASSES = {"Arrows": 5, "Weather": 4, "Food": 3, "Zodiac": 1}


def _svg(k: int) -> str:
    """A 24-px-grid line drawing in Tabler's form (stroke = currentColor): a rectangle whose corners depend on k."""
    x, y = 2 + k % 5, 3 + k % 4
    return ('<svg xmlns="http://www.w3.org/2000/svg" width="24" height="24" viewBox="0 0 24 24" fill="none" '
            'stroke="currentColor" stroke-width="2"><path stroke="none" d="M0 0h24v24H0z" fill="none"/>'
            f'<path d="M{x} {y}h{12 + k % 6}v{10 + k % 3}h-{12 + k % 6}z"/></svg>')


@pytest.fixture
def tabler_root(tmp_path: Path) -> Path:
    """Outline for every icon, filled for Arrows and Weather but weather-3; one food SVG is not an SVG; two icons
    lack a category."""
    root = tmp_path / "node_modules"
    package = root / "@tabler" / "icons"
    entries: dict[str, dict] = {}
    k = 0
    for category, n in CLASSES.items():
        for i in range(n):
            for name in [f"{category.lower()}-{i}"] + ([f"{category.lower()}-{i}-off"] if i % 2 == 0 else []):
                styles = {"outline": {"unicode": f"{k:04x}"}}
                if category in ("Arrows", "Weather") and name != "weather-3":
                    styles["filled"] = {"unicode": f"{k:04x}"}
                entries[name] = {"name": name, "category": category, "tags": [], "styles": styles}
                k += 1
    entries["loose-0"] = {"name": "loose-0", "category": "", "styles": {"outline": {}}}
    entries["loose-1"] = {"name": "loose-1", "category": "", "styles": {"outline": {}}}
    for style in ("outline", "filled"):
        (package / "icons" / style).mkdir(parents=True)
    (package / "icons.json").write_text(json.dumps(entries))
    for k, (name, entry) in enumerate(entries.items()):
        for style in entry["styles"]:
            (package / "icons" / style / f"{name}.svg").write_text(_svg(k))
    (package / "icons" / "outline" / "food-1.svg").write_text("<svg this is not")
    return root


def config(root: Path, **overrides) -> tabler.TablerConfig:
    return tabler.TablerConfig(root=root, **{"min_icons": 5, "min_test": 1, **overrides})


def test_classes_are_categories_of_icons_with_a_category(tabler_root: Path) -> None:
    plan = tabler.plan(config(tabler_root), progress=False)
    assert {c.name for c in plan.classes} == {"Arrows", "Weather"}
    # Food: 3 icons + 2 "-off" variants, less the broken food-1: 4, below min_icons 5
    assert plan.info.extra["dropped_small_classes"] == {"Food": 4, "Zodiac": 2}
    assert Counter(r.class_name for r in plan.rows) == {"Arrows": 8, "Weather": 6}
    assert not any(r.source_id.split("/")[1].startswith("loose") for r in plan.rows)
    assert {r.source_id.split("/")[0] for r in plan.rows} == {"outline"}


def test_two_styles_keep_the_icons_drawn_in_both_each_twice(tabler_root: Path) -> None:
    plan = tabler.plan(config(tabler_root, styles=("outline", "filled")), progress=False)
    assert Counter(r.class_name for r in plan.rows) == {"Arrows": 16, "Weather": 10}  # weather-3 has no filled one
    assert set(Counter(r.source_id.split("/")[1] for r in plan.rows).values()) == {2}


def test_an_unrenderable_drawing_is_reported_and_its_icon_left_out(tabler_root: Path) -> None:
    plan = tabler.plan(config(tabler_root, min_icons=3), progress=False)
    report = plan.info.extra["skipped_images"]
    assert report["count"] == 1 and report["images"][0]["source_id"] == "outline/food-1"
    assert not any(r.source_id == "outline/food-1" for r in plan.rows)
    assert Counter(r.class_name for r in plan.rows)["Food"] == 4


def test_test_hold_out_keeps_an_icon_and_its_crossed_out_variant_together(tabler_root: Path) -> None:
    plan = tabler.plan(config(tabler_root), progress=False)
    splits: dict[str, set[str]] = defaultdict(set)
    for r in plan.rows:
        splits[r.source_id.split("/")[1].removesuffix("-off")].add(r.split)
    assert all(len(s) == 1 for s in splits.values()), "an icon and its -off variant straddle two splits"
    test_families = Counter(r.class_name for r in plan.rows if r.split == "test" and not r.source_id.endswith("-off"))
    assert test_families == {"Arrows": 1, "Weather": 1}  # max(1, round(0.2 · families)): 5 and 4 families

    def held_out(seed: int) -> set[str]:
        return {r.source_id for r in tabler.plan(config(tabler_root, seed=seed), progress=False).rows
                if r.split == "test"}

    assert held_out(0) == held_out(0)
    assert any(held_out(0) != held_out(seed) for seed in (1, 2, 3))


def test_images_are_rendered_cropped_opaque_pngs(tabler_root: Path) -> None:
    plan = tabler.plan(config(tabler_root), progress=False)
    row = next(r for r in plan.rows if r.source_id == "outline/arrows-0")
    out = Image.open(io.BytesIO(row.image))
    assert out.format == "PNG" and out.mode == "RGB"
    # the rectangle 12 × 10 units (+ the 2-unit stroke) of a 24-unit grid on a 96-px canvas, cropped to it
    assert abs(out.size[0] - 14 * 4) <= 2 and abs(out.size[1] - 12 * 4) <= 2
    pixels = np.asarray(out)
    assert pixels.min() < 40 and pixels.max() == 255  # a dark line on white
    assert (pixels[out.size[1] // 2, out.size[0] // 2] == 255).all()  # the outline's inside stays white (fill none)


def test_build_through_the_cli(tabler_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "tabler-lt"
    code = main(["prepare", "tabler", "--root", str(tabler_root), "--min-icons", "5", "--min-test", "1",
                 "--out", str(out), "--no-progress"])
    assert code == 0 and "prepared tabler" in capsys.readouterr().out
    manifest = read_manifest(str(out))
    assert manifest.num_known == 1 and manifest.num_novel == 1
    rows = prepared_rows(out)
    assert len(rows) == 14 and all(r["image"][:4] == b"\x89PNG" for r in rows)
    assert manifest.extra["styles"] == ["outline"]


def test_missing_package_names_the_install_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["prepare", "tabler", "--root", str(tmp_path), "--out", str(tmp_path / "out"), "--no-progress"])
    assert code == 2
    err = capsys.readouterr().err
    assert "@tabler/icons" in err and "npm install" in err
    assert not (tmp_path / "out").exists()


def test_a_listed_drawing_missing_on_disk_is_an_error_naming_it(tabler_root: Path) -> None:
    (tabler_root / "@tabler" / "icons" / "icons" / "outline" / "weather-3.svg").unlink()
    with pytest.raises(SourceFormatError, match=r"weather-3\.svg.*does not exist"):
        tabler.plan(config(tabler_root), progress=False)


@pytest.mark.parametrize("text, match", [("{not json", "not valid JSON"), ('[{"name": "a"}]', "JSON object"),
                                         ('{"a": {"name": "a", "category": "X"}}', r"'a' lacks")])
def test_a_malformed_index_is_an_error_naming_the_file(tabler_root: Path, text: str, match: str) -> None:
    (tabler_root / "@tabler" / "icons" / "icons.json").write_text(text)
    with pytest.raises(SourceFormatError, match=match):
        tabler.plan(config(tabler_root), progress=False)


def test_unknown_style_too_few_classes_and_a_tiny_canvas_are_errors(tabler_root: Path) -> None:
    with pytest.raises(ValueError, match="styles"):
        tabler.plan(config(tabler_root, styles=("outline", "duotone")), progress=False)
    with pytest.raises(ValueError, match="distinct"):
        tabler.plan(config(tabler_root, styles=("outline", "outline")), progress=False)
    with pytest.raises(SourceFormatError, match="class"):
        tabler.plan(config(tabler_root, min_icons=7), progress=False)
    with pytest.raises(ValueError, match="render_size"):
        tabler.plan(config(tabler_root, render_size=4), progress=False)
