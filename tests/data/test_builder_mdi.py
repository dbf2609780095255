"""MDI-LT builder on a generated @iconify-json/mdi package (the npm package is not needed): the real layout,
``@iconify-json/mdi/icons.json`` (Iconify's JSON: bodies on a 24-unit grid, a hidden icon, aliases) and
``metadata.json`` (categories → icon names, one icon in two categories), with filled drawings rendered by resvg."""

from __future__ import annotations

import io
import json
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from ncdlr.cli import main
from ncdlr.data.builders import mdi
from ncdlr.data.builders.common import SourceFormatError
from ncdlr.data.manifest import read_manifest
from tests.fixtures.datasets import prepared_rows

#: category → icon families in it (for even i the icon, its "-outline" and its "-off-outline" redrawings; for odd i
#: the icon alone): Arrow 5 families (11 icons, + "weather-9-outline": 12), Weather 4 (8 + "weather-9": 9), Food 3
#: (7, 6 once its unrenderable food-1 is left out), Zodiac 1 (3)
CLASSES = {"Arrow": 5, "Weather": 4, "Food": 3, "Zodiac": 1}


def _body(k: int) -> str:
    """A filled rectangle in MDI's form (fill = currentColor) whose corners depend on k, 24-unit grid."""
    x, y = 2 + k % 5, 3 + k % 4
    return f'<path fill="currentColor" d="M{x} {y}h{12 + k % 6}v{10 + k % 3}h-{12 + k % 6}z"/>'


def _names(category: str, i: int) -> list[str]:
    base = f"{category.lower()}-{i}"
    return [base, f"{base}-outline", f"{base}-off-outline"] if i % 2 == 0 else [base]


@pytest.fixture
def mdi_root(tmp_path: Path) -> Path:
    """Every icon in one category, but "both" (Arrow and Food); "weather-9" in Weather with its "-outline" in Arrow;
    a hidden icon; an alias listed in a category; one Food body resvg cannot render."""
    root = tmp_path / "node_modules"
    package = root / "@iconify-json" / "mdi"
    package.mkdir(parents=True)
    icons: dict[str, dict] = {}
    categories: dict[str, list[str]] = defaultdict(list)
    for category, n in CLASSES.items():
        for i in range(n):
            for name in _names(category, i):
                icons[name] = {"body": _body(len(icons))}
                categories[category].append(name)
    icons["weather-9"] = {"body": _body(90)}
    icons["weather-9-outline"] = {"body": _body(91)}
    categories["Weather"].append("weather-9")
    categories["Arrow"].append("weather-9-outline")
    icons["both"] = {"body": _body(92)}
    categories["Arrow"].append("both")
    categories["Food"].append("both")
    icons["retired"] = {"body": _body(93), "hidden": True}
    categories["Zodiac"].append("retired")
    categories["Zodiac"].append("arrow-0-renamed")
    icons["food-1"] = {"body": "<notapath"}
    data = {"prefix": "mdi", "icons": icons, "aliases": {"arrow-0-renamed": {"parent": "arrow-0"}},
            "width": 24, "height": 24}
    (package / "icons.json").write_text(json.dumps(data))
    (package / "metadata.json").write_text(json.dumps({"categories": categories}))
    return root


def config(root: Path, **overrides) -> mdi.MdiConfig:
    return mdi.MdiConfig(root=root, **{"min_icons": 7, "min_test": 1, **overrides})


def test_classes_are_the_one_category_of_each_shown_icon(mdi_root: Path) -> None:
    plan = mdi.plan(config(mdi_root), progress=False)
    assert {c.name for c in plan.classes} == {"Arrow", "Weather"}
    # Food: 7 icons less the unrenderable food-1 = 6; Zodiac 3 (the hidden icon and the alias are not counted)
    assert plan.info.extra["dropped_small_classes"] == {"Food": 6, "Zodiac": 3}
    assert plan.info.extra["left_out_icons"] == {"several_categories": 1, "hidden": 1, "aliases": 1}
    assert Counter(r.class_name for r in plan.rows) == {"Arrow": 12, "Weather": 9}
    ids = {r.source_id for r in plan.rows}
    assert "mdi/both" not in ids and "mdi/retired" not in ids and "mdi/arrow-0-renamed" not in ids
    assert next(r for r in plan.rows if r.source_id == "mdi/weather-9-outline").class_name == "Arrow"


def test_families_strip_the_outline_and_off_redrawings() -> None:
    names = ["bell", "bell-outline", "bell-off", "bell-off-outline", "outline", "bell-ring"]
    assert [mdi.Icon(n, "X", "").family for n in names] == ["bell", "bell", "bell", "bell", "outline", "bell-ring"]


def test_a_family_stays_in_one_split_held_out_with_its_base_icons_class(mdi_root: Path) -> None:
    for seed in range(4):
        plan = mdi.plan(config(mdi_root, seed=seed), progress=False)
        splits: dict[str, set[str]] = defaultdict(set)
        for r in plan.rows:
            family = mdi.Icon(r.source_id.removeprefix("mdi/"), r.class_name, "").family
            splits[family].add("test" if r.split == "test" else "train")
        assert all(len(s) == 1 for s in splits.values()), f"seed {seed}: a family straddles test and training"
        assert len(splits) == 5 + 5  # Arrow's 5 families, Weather's 4 and weather-9 (with its Arrow redrawing)
    grouped = mdi.families_by_class(mdi.read_index(mdi_root)[0])
    assert [icon.name for icon in grouped["Weather"]["weather-9"]] == ["weather-9", "weather-9-outline"]
    assert "weather-9" not in grouped["Arrow"]


def test_the_test_hold_out_is_seeded(mdi_root: Path) -> None:
    def held_out(seed: int) -> set[str]:
        return {r.source_id for r in mdi.plan(config(mdi_root, seed=seed), progress=False).rows if r.split == "test"}

    assert held_out(0) == held_out(0)
    assert any(held_out(0) != held_out(seed) for seed in (1, 2, 3))


def test_family_fraction_keeps_a_seeded_share_of_each_class_s_families(mdi_root: Path) -> None:
    grouped = mdi.families_by_class(mdi.read_index(mdi_root)[0])
    half = mdi.draw_families(grouped, 0.5, seed=0)
    # round(0.5 · n) with halves up, at least one: Arrow 5 → 3, Weather 5 (weather-9 with it) → 3, Food 3 → 2, Zodiac 1
    assert {name: len(families) for name, families in half.items()} == {"Arrow": 3, "Food": 2, "Weather": 3,
                                                                        "Zodiac": 1}
    assert all(set(half[name]) <= set(grouped[name]) for name in half)
    assert half == mdi.draw_families(grouped, 0.5, seed=0)
    assert any(mdi.draw_families(grouped, 0.5, seed=s) != half for s in (1, 2, 3))
    assert mdi.draw_families(grouped, 1.0, seed=0) == grouped
    for bad in (0.0, 1.5, -0.1):
        with pytest.raises(ValueError, match="family_fraction"):
            mdi.draw_families(grouped, bad, seed=0)


def test_an_unrenderable_drawing_is_reported_and_left_out(mdi_root: Path) -> None:
    plan = mdi.plan(config(mdi_root, min_icons=4), progress=False)
    report = plan.info.extra["skipped_images"]
    assert report["count"] == 1 and report["images"][0]["source_id"] == "mdi/food-1"
    assert Counter(r.class_name for r in plan.rows)["Food"] == 6


def test_images_are_rendered_cropped_opaque_pngs(mdi_root: Path) -> None:
    plan = mdi.plan(config(mdi_root), progress=False)
    row = next(r for r in plan.rows if r.source_id == "mdi/arrow-0")
    out = Image.open(io.BytesIO(row.image))
    assert out.format == "PNG" and out.mode == "RGB"
    # the filled rectangle 12 × 10 units of a 24-unit grid on a 96-px canvas, cropped to it
    assert abs(out.size[0] - 12 * 4) <= 2 and abs(out.size[1] - 10 * 4) <= 2
    pixels = np.asarray(out)
    assert pixels[out.size[1] // 2, out.size[0] // 2].max() < 40  # filled: dark inside


def test_build_through_the_cli(mdi_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "mdi-lt"
    code = main(["prepare", "mdi", "--root", str(mdi_root), "--min-icons", "7", "--min-test", "1",
                 "--out", str(out), "--no-progress"])
    assert code == 0 and "prepared mdi" in capsys.readouterr().out
    manifest = read_manifest(str(out))
    assert manifest.num_known == 1 and manifest.num_novel == 1
    rows = prepared_rows(out)
    assert len(rows) == 21 and all(r["image"][:4] == b"\x89PNG" for r in rows)
    assert manifest.extra["family_fraction"] == 1.0


def test_missing_package_names_the_install_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["prepare", "mdi", "--root", str(tmp_path), "--out", str(tmp_path / "out"), "--no-progress"])
    assert code == 2
    err = capsys.readouterr().err
    assert "@iconify-json/mdi" in err and "npm install" in err
    assert not (tmp_path / "out").exists()


def _rewrite(root: Path, file: str, edit) -> None:
    path = root / "@iconify-json" / "mdi" / file
    path.write_text(json.dumps(edit(json.loads(path.read_text()))))


@pytest.mark.parametrize("file, edit, match", [
    ("icons.json", lambda d: [d], "'icons' object"),
    ("icons.json", lambda d: {**d, "icons": {**d["icons"], "arrow-0": {"width": 24}}}, "'arrow-0' lacks a text 'body'"),
    ("icons.json", lambda d: {**d, "icons": {**d["icons"], "arrow-0": {"body": "<g/>", "width": "24"}}},
     "width must be a number"),
    ("icons.json", lambda d: {**d, "height": 0}, "must be positive"),
    ("metadata.json", lambda d: {"categories": {}}, "non-empty 'categories'"),
    ("metadata.json", lambda d: {"categories": {"Arrow": "arrow-0"}}, "icon-name lists"),
    ("metadata.json", lambda d: {"categories": {"Arrow": ["no-such-icon"]}}, "lists 'no-such-icon'"),
])
def test_a_malformed_index_is_an_error_naming_the_file(mdi_root: Path, file: str, edit, match: str) -> None:
    _rewrite(mdi_root, file, edit)
    with pytest.raises(SourceFormatError, match=match):
        mdi.plan(config(mdi_root), progress=False)


def test_a_missing_or_unreadable_index_file_is_an_error_naming_it(mdi_root: Path) -> None:
    (mdi_root / "@iconify-json" / "mdi" / "metadata.json").write_text("{not json")
    with pytest.raises(SourceFormatError, match=r"metadata\.json is not valid JSON"):
        mdi.plan(config(mdi_root), progress=False)
    (mdi_root / "@iconify-json" / "mdi" / "metadata.json").unlink()
    with pytest.raises(SourceFormatError, match=r"metadata\.json does not exist"):
        mdi.plan(config(mdi_root), progress=False)


def test_an_unsafe_icon_name_is_refused(mdi_root: Path) -> None:
    _rewrite(mdi_root, "icons.json", lambda d: {**d, "icons": {**d["icons"], "../x": {"body": "<g/>"}}})
    _rewrite(mdi_root, "metadata.json", lambda d: {"categories": {**d["categories"], "Arrow": ["../x"]}})
    with pytest.raises(SourceFormatError, match="not an icon name"):
        mdi.plan(config(mdi_root), progress=False)


def test_too_few_classes_and_a_tiny_canvas_are_errors(mdi_root: Path) -> None:
    with pytest.raises(SourceFormatError, match="only 0 class"):
        mdi.plan(config(mdi_root, min_icons=50), progress=False)
    with pytest.raises(ValueError, match="at least 8 pixels"):
        mdi.plan(config(mdi_root, render_size=4), progress=False)
