"""Phosphor-LT builder on a generated @phosphor-icons/core package (the npm package is not needed): the real layout,
``dist/types.d.ts`` (the FigmaCategory enum), ``dist/icons.d.ts`` (the catalogue, as TypeScript declarations, CRLF
lines) and ``assets/<style>/<name>[-<style>].svg``, with filled 256-unit drawings rendered by resvg."""

from __future__ import annotations

import io
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from ncdlr.cli import main
from ncdlr.data.builders import phosphor
from ncdlr.data.builders.common import SourceFormatError
from ncdlr.data.manifest import read_manifest
from tests.fixtures.datasets import prepared_rows

FIGMA = {"ARROWS": "arrows", "SYSTEM": "system & devices", "TIME": "time", "WEATHER": "weather & nature",
         "EDUCATION": "education"}

#: enum member → icon families in it (for even i, the icon and its "-slash" variant): arrows 8 icons, weather &
#: nature 6 + cloud, system & devices 5 + cloud-slash (5 once its broken system-1 is left out), time 2: 23 icons;
#: education has none
FAMILIES = {"ARROWS": 5, "WEATHER": 4, "SYSTEM": 3, "TIME": 1}

TYPES = """export declare enum IconStyle {
    REGULAR = "regular",
    BOLD = "bold"
}
export declare enum IconCategory {
    ARROWS = "arrows",
    SYSTEM = "system"
}
export declare enum FigmaCategory {
""" + ",\n".join(f'    {member} = "{text}"' for member, text in FIGMA.items()) + """
}
export interface IconEntry {
    name: string;
    figma_category: FigmaCategory;
}
"""


def _icons() -> list[tuple[str, str]]:
    """``(name, FigmaCategory member)`` of every icon, in catalogue order; cloud and cloud-slash straddle classes."""
    icons = []
    for member, n in FAMILIES.items():
        for i in range(n):
            base = f"{FIGMA[member].split()[0]}-{i}"
            icons += [(base, member)] + ([(f"{base}-slash", member)] if i % 2 == 0 else [])
    return icons + [("cloud", "WEATHER"), ("cloud-slash", "SYSTEM")]


def _entry(name: str, member: str, k: int) -> str:
    """One catalogue entry in icons.d.ts's form; the first has an alias, and a tag holds braces and ``name:``."""
    alias = ('    readonly alias: {\n        readonly name: "old-name";\n        readonly pascal_name: "OldName";\n'
             '    };\n') if k == 0 else ""
    return (f'    readonly name: "{name}";\n    readonly pascal_name: "{name.title().replace("-", "")}";\n{alias}'
            f'    readonly categories: readonly [IconCategory.ARROWS, IconCategory.SYSTEM];\n'
            f'    readonly figma_category: FigmaCategory.{member};\n'
            f'    readonly tags: readonly ["*new*", "a {{brace}} name: tag", "t{k}"];\n'
            f'    readonly codepoint: {60000 + k};\n    readonly published_in: 2.1;\n    readonly updated_in: 2.1;\n')


def _svg(k: int, style: str) -> str:
    """A 256-unit drawing in Phosphor's form (fill = currentColor): a rectangle whose size depends on k and style."""
    x, y, w, h = 16 + 8 * (k % 5), 24 + 8 * (k % 4), 128 + 16 * (k % 3), 96
    if style == "bold":
        w, h = 160, 160
    return (f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 256 256" fill="currentColor">'
            f'<rect x="{x}" y="{y}" width="{w}" height="{h}"/></svg>')


def _crlf(text: str) -> str:
    return text.replace("\n", "\r\n")


@pytest.fixture
def phosphor_root(tmp_path: Path) -> Path:
    """Every icon in regular and bold (the real package has all six styles); the regular system-1 is not an SVG."""
    root = tmp_path / "node_modules"
    package = root / "@phosphor-icons" / "core"
    (package / "dist").mkdir(parents=True)
    (package / "dist" / "types.d.ts").write_text(_crlf(TYPES), newline="")
    entries = [_entry(name, member, k) for k, (name, member) in enumerate(_icons())]
    icons = ('import { IconCategory, FigmaCategory } from "./types";\n'
             "export type PhosphorIcon = (typeof icons)[number];\n"
             "export declare const icons: readonly [{\n" + "}, {\n".join(entries) + "}];\n")
    (package / "dist" / "icons.d.ts").write_text(_crlf(icons), newline="")
    for style in ("regular", "bold"):
        (package / "assets" / style).mkdir(parents=True)
        for k, (name, _) in enumerate(_icons()):
            phosphor.svg_path(root, style, name).write_text(_svg(k, style))
    phosphor.svg_path(root, "regular", "system-1").write_text("<svg this is not")
    return root


def icons_file(root: Path) -> Path:
    return root / "@phosphor-icons" / "core" / "dist" / "icons.d.ts"


def edit_icons(root: Path, old: str, new: str) -> None:
    path = icons_file(root)
    text = path.read_bytes().decode()
    assert old in text
    path.write_text(text.replace(old, new, 1), newline="")


def config(root: Path, **overrides) -> phosphor.PhosphorConfig:
    return phosphor.PhosphorConfig(root=root, **{"min_icons": 5, "min_test": 1, **overrides})


def test_the_index_parse_maps_the_enum_to_its_text_and_reads_every_icon(phosphor_root: Path) -> None:
    dist = phosphor_root / "@phosphor-icons" / "core" / "dist"
    assert phosphor.read_figma_categories(dist / "types.d.ts") == FIGMA  # IconCategory's members are not taken
    icons = phosphor.read_index(phosphor_root)
    assert [icon.name for icon in icons] == sorted(name for name, _ in _icons())  # the alias old-name is no icon
    assert Counter(icon.class_name for icon in icons) == {"arrows": 8, "weather & nature": 7,
                                                          "system & devices": 6, "time": 2}
    by_name = {icon.name: icon for icon in icons}
    assert by_name["cloud"].class_name == "weather & nature" and by_name["cloud-slash"].class_name == \
        "system & devices"
    assert by_name["arrows-0-slash"].family == "arrows-0" and by_name["arrows-0"].family == "arrows-0"


def test_the_file_of_each_style_carries_its_suffix_but_regular() -> None:
    root = Path("nm")
    assert phosphor.svg_path(root, "regular", "acorn") == root / "@phosphor-icons/core/assets/regular/acorn.svg"
    assert phosphor.svg_path(root, "bold", "acorn") == root / "@phosphor-icons/core/assets/bold/acorn-bold.svg"


def test_classes_are_figma_categories_with_enough_icons(phosphor_root: Path) -> None:
    plan = phosphor.plan(config(phosphor_root), progress=False)
    assert {c.name for c in plan.classes} == {"arrows", "weather & nature", "system & devices"}
    assert plan.info.extra["dropped_small_classes"] == {"time": 2}
    assert Counter(r.class_name for r in plan.rows) == {"arrows": 8, "weather & nature": 7, "system & devices": 5}
    assert {r.source_id.split("/")[0] for r in plan.rows} == {"regular"}
    label_of = {c.name: c.label for c in plan.classes}
    assert all(r.label == label_of[r.class_name] for r in plan.rows)


def test_two_styles_give_each_icon_twice_from_its_own_file(phosphor_root: Path) -> None:
    plan = phosphor.plan(config(phosphor_root, styles=("regular", "bold")), progress=False)
    assert Counter(r.class_name for r in plan.rows) == {"arrows": 16, "weather & nature": 14, "system & devices": 10}
    assert set(Counter(r.source_id.split("/")[1] for r in plan.rows).values()) == {2}
    image = {r.source_id: Image.open(io.BytesIO(r.image)).size for r in plan.rows}
    assert image["bold/arrows-0"] == (60, 60)  # the bold file's 160-unit square, not the regular drawing
    assert image["regular/arrows-0"] != image["bold/arrows-0"]


def test_a_broken_drawing_in_one_style_drops_its_icon_from_every_style(phosphor_root: Path) -> None:
    phosphor.svg_path(phosphor_root, "bold", "arrows-1").write_bytes(b"\xff\xfe not utf-8")
    plan = phosphor.plan(config(phosphor_root, styles=("regular", "bold")), progress=False)
    ids = {r.source_id for r in plan.rows}
    assert "regular/arrows-1" not in ids and "bold/arrows-1" not in ids
    assert {s["source_id"] for s in plan.info.extra["skipped_images"]["images"]} == {"bold/arrows-1",
                                                                                     "regular/system-1"}


def test_an_unrenderable_drawing_is_reported_and_its_icon_left_out(phosphor_root: Path) -> None:
    plan = phosphor.plan(config(phosphor_root), progress=False)
    report = plan.info.extra["skipped_images"]
    assert report["count"] == 1 and report["images"][0]["source_id"] == "regular/system-1"
    assert report["images"][0]["reason"].startswith("ValueError")
    assert not any(r.source_id == "regular/system-1" for r in plan.rows)


def test_test_hold_out_keeps_an_icon_and_its_slash_variant_together(phosphor_root: Path) -> None:
    def held_out_by_family(seed: int) -> dict[str, set[bool]]:
        held_out: dict[str, set[bool]] = defaultdict(set)
        for r in phosphor.plan(config(phosphor_root, seed=seed), progress=False).rows:
            held_out[r.source_id.split("/")[1].removesuffix("-slash")].add(r.split == "test")
        return held_out

    runs = [held_out_by_family(seed) for seed in range(8)]
    assert all(len(s) == 1 for run in runs for s in run.values()), "an icon and its -slash variant straddle splits"
    # cloud (weather & nature) and cloud-slash (system & devices) are one family, held out with cloud's class (in
    # training each goes to its own class's group)
    assert {True, False} <= {next(iter(run["cloud"])) for run in runs}
    assert len({frozenset(family for family, s in run.items() if s == {True}) for run in runs}) > 1

    plan = phosphor.plan(config(phosphor_root), progress=False)
    test_families = Counter(r.class_name for r in plan.rows if r.split == "test" and not r.source_id.endswith("-slash"))
    # max(1, round(0.2 · families)): arrows 5, weather & nature 5 (with cloud), system & devices 2 (system-1 broken)
    assert test_families == {"arrows": 1, "weather & nature": 1, "system & devices": 1}
    groups = {c.name: c.group for c in plan.classes}
    assert all(r.split == groups[r.class_name] for r in plan.rows if r.split != "test")


def test_images_are_rendered_cropped_opaque_pngs(phosphor_root: Path) -> None:
    plan = phosphor.plan(config(phosphor_root), progress=False)
    row = next(r for r in plan.rows if r.source_id == "regular/arrows-0")
    out = Image.open(io.BytesIO(row.image))
    assert out.format == "PNG" and out.mode == "RGB"
    assert abs(out.size[0] - 48) <= 1 and abs(out.size[1] - 36) <= 1  # 128 × 96 units of 256 on a 96-px canvas
    pixels = np.asarray(out)
    assert pixels.max() < 40  # a filled black drawing, cropped to it: no white margin left


def test_build_through_the_cli(phosphor_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "phosphor-lt"
    code = main(["prepare", "phosphor", "--root", str(phosphor_root), "--min-icons", "5", "--min-test", "1",
                 "--out", str(out), "--no-progress"])
    assert code == 0 and "prepared phosphor" in capsys.readouterr().out
    manifest = read_manifest(str(out))
    assert manifest.num_known == 2 and manifest.num_novel == 1
    assert sorted(c.name for c in manifest.classes) == ["arrows", "system & devices", "weather & nature"]
    rows = prepared_rows(out)
    assert len(rows) == 20 and all(r["image"][:4] == b"\x89PNG" for r in rows)
    assert manifest.split_counts == dict(Counter(r["split"] for r in rows)) and manifest.split_counts["test"] >= 3
    assert sorted(manifest.train_counts) == sorted(Counter(r["label"] for r in rows if r["split"] != "test").values())
    assert len(set(manifest.train_counts)) > 1  # the set's own, uneven tail
    held_out: dict[str, set[bool]] = defaultdict(set)
    for r in rows:
        held_out[r["source_id"].split("/")[1].removesuffix("-slash")].add(r["split"] == "test")
    assert all(len(s) == 1 for s in held_out.values()), "an icon and its -slash variant straddle test and training"
    assert manifest.extra["styles"] == ["regular"] and manifest.extra["skipped_images"]["count"] == 1


def test_missing_package_names_the_install_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["prepare", "phosphor", "--root", str(tmp_path), "--out", str(tmp_path / "out"), "--no-progress"])
    assert code == 2
    err = capsys.readouterr().err
    assert "@phosphor-icons/core" in err and "npm install" in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("missing", ["icons.d.ts", "types.d.ts"])
def test_a_missing_index_file_is_an_error_naming_it(phosphor_root: Path, missing: str) -> None:
    (phosphor_root / "@phosphor-icons" / "core" / "dist" / missing).unlink()
    with pytest.raises(SourceFormatError, match=rf"{missing.replace('.', '[.]')} does not exist: not a "
                                                r"@phosphor-icons/core package"):
        phosphor.plan(config(phosphor_root), progress=False)


def test_a_listed_drawing_missing_on_disk_is_an_error_naming_it(phosphor_root: Path) -> None:
    phosphor.svg_path(phosphor_root, "bold", "weather-3").unlink()
    phosphor.plan(config(phosphor_root), progress=False)  # the regular style does not need it
    with pytest.raises(SourceFormatError, match=r"weather-3-bold\.svg is listed in dist/icons\.d\.ts but does not"):
        phosphor.plan(config(phosphor_root, styles=("regular", "bold")), progress=False)


@pytest.mark.parametrize("old, new, match", [
    ("    readonly figma_category: FigmaCategory.TIME;\r\n", "",
     r"icons\.d\.ts: icon 'time-0' has 0 figma_category fields"),
    ("FigmaCategory.TIME;", "FigmaCategory.CLOCKS;",
     r"icons\.d\.ts: icon 'time-0' has figma_category FigmaCategory\.CLOCKS, not a member of FigmaCategory"),
    ("FigmaCategory.TIME;", '"time";', r"icon 'time-0' has figma_category \"time\", not a member"),
    ('readonly name: "time-0";', 'readonly name: "Time 0";', r"icons\.d\.ts: entry \d+ has no single name"),
    ('readonly name: "time-0-slash";', 'readonly name: "time-0";', r"icons\.d\.ts: 1 icon name\(s\) repeat"),
    ("export declare const icons", 'export declare const renamed: readonly [{ name: "ghost" }];\r\n'
                                   "export declare const icons", r"icons\.d\.ts: 25 'name:' fields, but 23 icons and "
                                                                 r"1 aliases parsed"),
    ("export declare const icons: readonly [", "export declare const icons: Icon[] = [",
     r"icons\.d\.ts: no 'export declare const icons: readonly \[ \.\.\. \];' array"),
    ("}, {\r\n", "}; {\r\n", r"icons\.d\.ts: unexpected ';' between entries 1 and 2"),
])
def test_a_malformed_icons_file_is_an_error_naming_it(phosphor_root: Path, old: str, new: str, match: str) -> None:
    edit_icons(phosphor_root, old, new)
    with pytest.raises(SourceFormatError, match=match):
        phosphor.read_index(phosphor_root)


def test_an_empty_icons_array_is_an_error(phosphor_root: Path) -> None:
    path = icons_file(phosphor_root)
    path.write_text(path.read_text().split("export declare const icons")[0] + "export declare const icons: readonly "
                    "[];\r\n")
    with pytest.raises(SourceFormatError, match=r"icons\.d\.ts: the icons array is empty"):
        phosphor.read_index(phosphor_root)


@pytest.mark.parametrize("old, new, match", [
    ("enum FigmaCategory", "enum FigmaSection", r"types\.d\.ts: no 'export declare enum FigmaCategory"),
    ('TIME = "time"', "TIME = time", r"types\.d\.ts: enum FigmaCategory line 'TIME = time,' is not"),
    ('TIME = "time"', 'TIME = "arrows"', r"types\.d\.ts: enum FigmaCategory repeats TIME or 'arrows'"),
])
def test_a_malformed_enum_is_an_error_naming_the_file(phosphor_root: Path, old: str, new: str, match: str) -> None:
    path = phosphor_root / "@phosphor-icons" / "core" / "dist" / "types.d.ts"
    path.write_text(path.read_text().replace(old, new))
    with pytest.raises(SourceFormatError, match=match):
        phosphor.read_index(phosphor_root)


def test_unknown_style_too_few_classes_and_a_tiny_canvas_are_errors(phosphor_root: Path) -> None:
    with pytest.raises(ValueError, match="styles"):
        phosphor.plan(config(phosphor_root, styles=("regular", "outline")), progress=False)
    with pytest.raises(ValueError, match="distinct"):
        phosphor.plan(config(phosphor_root, styles=("bold", "bold")), progress=False)
    with pytest.raises(SourceFormatError, match="only 1 class"):
        phosphor.plan(config(phosphor_root, min_icons=8), progress=False)
    with pytest.raises(ValueError, match="render_size"):
        phosphor.plan(config(phosphor_root, render_size=4), progress=False)
