"""MDI-LT: a real, naturally long-tailed image set from Material Design Icons, as Iconify's npm package.

Source: the package ``@iconify-json/mdi`` (Apache-2.0; the Pictogrammers' Material Design Icons), fetched from the
npm registry, e.g.

    npm install --prefix /data/mdi @iconify-json/mdi@1.2.3

so that ``--root /data/mdi/node_modules`` holds ``@iconify-json/mdi/icons.json`` (Iconify's JSON: ``icons`` maps each
name to its SVG ``body`` on a ``width`` × ``height`` grid, 24 × 24 here, ``fill="currentColor"``; ``hidden`` marks
retired icons; ``aliases`` are other names of the same drawings) and ``metadata.json`` (``categories``: category →
its icon names; an icon may be in several).

Classes: the category of each icon filed under exactly one (``Animal``, ``Weather``, ``Food / Drink``, ...); icons
in several categories, hidden icons and aliases are left out, and so are categories with fewer than ``min_icons``
icons. The long tail is the icon set's own: how many icons each category has. ``family_fraction`` < 1 keeps that
share of each category's icon families (a seeded draw, ``round(F · n)`` families, at least one), for a smaller set
with about the same tail.

Splits: classes (sorted by name) are split by ``ncdlr.data.longtail.split_known_novel(C, seed)``, labels in that
order. Inside each class a seeded shuffle of its icon *families* holds out ``max(min_test, round(test_fraction · n))``
of them as ``test``: an icon, its outline variant and its crossed-out variant (``bell``, ``bell-outline``,
``bell-off``, ``bell-off-outline``) are one family, always in one split (each is the first redrawn: it would leak
it). A family whose icons sit in two categories is drawn and held out with its base icon's class (else its first
icon's), each icon keeping its own label.

Measured on @iconify-json/mdi 1.2.3 (7638 drawings, 7447 shown; 5388 in a category, 3980 in exactly one, in 60
categories, 2862 families), the defaults: 55 classes (5 categories under 8 icons dropped), 3962 images (the largest
class ``Home Automation``, 380 icons); seed 0 gives 28 known classes with 312 → 9 training images and 27 novel with
167 → 7 (1873 known, 1302 novel and 787 test images). 13 s of wall time beside the test suite on 2 cores, 3.4 MB of
PNGs. ``family_fraction`` 0.5 gives 52 classes and 1975 images, 0.4 44 classes and 1519.

Images: each icon's SVG (its body in an ``<svg>`` of its grid) rendered by resvg (``common.render``, as Tabler-LT's)
on a transparent ``render_size``-px canvas, cropped to the bounding box of its drawn pixels, flattened onto white
(RGB), and encoded as PNG. A drawing resvg cannot render, or one that draws nothing, is skipped and reported
(``extra["skipped_images"]``).
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ncdlr.data.builders.common import (
    Plan,
    SourceFormatError,
    check_render_size,
    class_hold_out,
    class_table,
    convert_styled,
    icon_family,
    icon_set_extra,
    natural_imbalance,
    read_json_index,
    render,
    seeded_rng,
    split_large_classes,
    split_order,
    write_plan,
)
from ncdlr.data.manifest import DatasetInfo, Manifest
from ncdlr.data.records import ImageRecord
from ncdlr.data.images import DECODE_ERRORS


PACKAGE = "@iconify-json/mdi"
INSTALL_HINT = "npm install --prefix DIR @iconify-json/mdi@1.2.3; --root DIR/node_modules"
VARIANTS = ("-outline", "-off")  # suffixes of an icon's redrawings (outlined, crossed out), stripped for its family
STYLE = "mdi"  # the one style: source ids are "mdi/<name>"
_ICON_NAME = re.compile(r"[a-z0-9]+(?:-[a-z0-9]+)*")


@dataclass(frozen=True)
class MdiConfig:
    root: Path  # folder holding @iconify-json/mdi/ (an npm node_modules folder)
    seed: int = 0  # seed of the known/novel split, the test hold-out and the family draw
    min_icons: int = 8  # classes with fewer icons (after the family draw) are dropped
    family_fraction: float = 1.0  # share of each category's icon families kept (seeded), in (0, 1]
    test_fraction: float = 0.2  # share of each class's icon families held out as test
    min_test: int = 2  # ...but at least this many families
    render_size: int = 96  # pixels of the square canvas an SVG is rendered on (before the crop to its content)
    name: str = "mdi"


@dataclass(frozen=True)
class Icon:
    """One icon: its Iconify name, its class (its one category) and its SVG (the body in an ``<svg>`` of its grid)."""

    name: str
    class_name: str
    svg: str

    @property
    def family(self) -> str:
        """The icon it redraws: ``bell`` for ``bell-off-outline``, ``bell-outline``, ``bell-off`` and ``bell``."""
        return icon_family(self.name, VARIANTS)


def package_dir(root: Path) -> Path:
    return Path(root) / PACKAGE


def _grid(entry: dict[str, Any], defaults: dict[str, Any], where: str) -> tuple[float, float, float, float]:
    """``(left, top, width, height)`` of an icon's grid: its own values, else the file's, else Iconify's 0, 0, 16, 16."""
    values = []
    for key, fallback in (("left", 0), ("top", 0), ("width", 16), ("height", 16)):
        value = entry.get(key, defaults.get(key, fallback))
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise SourceFormatError(f"{where}: {key} must be a number, got {value!r}")
        values.append(float(value))
    if values[2] <= 0 or values[3] <= 0:
        raise SourceFormatError(f"{where}: width and height must be positive, got {values[2]:g} × {values[3]:g}")
    return values[0], values[1], values[2], values[3]


def read_icons(icons_path: Path, metadata_path: Path) -> tuple[list[Icon], dict[str, int]]:
    """The shown icons filed under exactly one category, sorted by name, and a count of what was left out
    (``several_categories``, ``hidden``; names a category lists that ``icons.json`` lacks are an error unless they
    are aliases, which are left out as ``aliases``).

    Raises ``SourceFormatError`` naming the file for a missing or unreadable file, a wrong shape (``icons`` an object
    of objects with a text ``body``; ``categories`` an object of name lists), a bad grid or an unsafe icon name.
    """
    data = read_json_index(icons_path, f"an {PACKAGE}")
    if not (isinstance(data, dict) and isinstance(data.get("icons"), dict)):
        raise SourceFormatError(f"{icons_path}: expected a JSON object with an 'icons' object (Iconify's format)")
    aliases = data.get("aliases") or {}
    if not isinstance(aliases, dict):
        raise SourceFormatError(f"{icons_path}: 'aliases' must be an object, got {type(aliases).__name__}")
    meta = read_json_index(metadata_path, f"an {PACKAGE}")
    categories = meta.get("categories") if isinstance(meta, dict) else None
    if not (isinstance(categories, dict) and categories
            and all(isinstance(names, list) and all(isinstance(n, str) for n in names)
                    for names in categories.values())):
        raise SourceFormatError(f"{metadata_path}: expected a non-empty 'categories' object of icon-name lists")

    filed: dict[str, list[str]] = defaultdict(list)
    left_out = {"several_categories": 0, "hidden": 0, "aliases": 0}
    for category, names in categories.items():
        for name in dict.fromkeys(names):
            filed[name].append(category)
    icons: list[Icon] = []
    for name, homes in sorted(filed.items()):
        entry = data["icons"].get(name)
        if entry is None:
            if name in aliases:
                left_out["aliases"] += 1
                continue
            raise SourceFormatError(f"{metadata_path}: category {homes[0]!r} lists {name!r}, which {icons_path.name} "
                                    "does not have")
        where = f"{icons_path}: icon {name!r}"
        if not (isinstance(entry, dict) and isinstance(entry.get("body"), str)):
            raise SourceFormatError(f"{where} lacks a text 'body'")
        if not _ICON_NAME.fullmatch(name):
            raise SourceFormatError(f"{where}: not an icon name (lower-case words joined by '-')")
        if entry.get("hidden"):
            left_out["hidden"] += 1
            continue
        if len(homes) > 1:
            left_out["several_categories"] += 1
            continue
        left, top, width, height = _grid(entry, data, where)
        svg = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:g}" height="{height:g}" '
               f'viewBox="{left:g} {top:g} {width:g} {height:g}">{entry["body"]}</svg>')
        icons.append(Icon(name, homes[0], svg))
    if not icons:
        raise SourceFormatError(f"{metadata_path}: no shown icon is filed under exactly one category")
    return icons, left_out


def read_index(root: Path) -> tuple[list[Icon], dict[str, int]]:
    """:func:`read_icons` on the package's two files; ``SourceFormatError`` with the install command when the
    package folder is missing."""
    package = package_dir(root)
    if not package.is_dir():
        raise SourceFormatError(f"{package} does not exist (install the package with: {INSTALL_HINT})")
    return read_icons(package / "icons.json", package / "metadata.json")


def families_by_class(icons: list[Icon]) -> dict[str, dict[str, list[Icon]]]:
    """Class → family key → its icons (sorted by name), each family under its base icon's class (else its first
    icon's class), classes and keys in sorted order."""
    families: dict[str, list[Icon]] = defaultdict(list)
    for icon in sorted(icons, key=lambda icon: icon.name):
        families[icon.family].append(icon)
    grouped: dict[str, dict[str, list[Icon]]] = defaultdict(dict)
    for key in sorted(families):
        members = families[key]
        home = next((icon.class_name for icon in members if icon.name == key), members[0].class_name)
        grouped[home][key] = members
    return {name: grouped[name] for name in sorted(grouped)}


def draw_families(grouped: dict[str, dict[str, list[Icon]]], fraction: float, seed: int
                  ) -> dict[str, dict[str, list[Icon]]]:
    """Keep ``round(fraction · n)`` (at least one) of each class's ``n`` families, a seeded draw per class."""
    if not 0 < fraction <= 1:
        raise ValueError(f"family_fraction must be in (0, 1], got {fraction}")
    if fraction == 1:
        return grouped
    kept = {}
    for name, families in grouped.items():
        keys = list(families)
        take = max(1, math.floor(fraction * len(keys) + 0.5))
        order = seeded_rng(seed, "families", name).permutation(len(keys))[:take]
        kept[name] = {keys[i]: families[keys[i]] for i in sorted(order)}
    return kept


def _convert(icon: Icon, size: int) -> bytes | str:
    try:
        return render(icon.svg.encode("utf-8"), size)
    except (ValueError, *DECODE_ERRORS) as exc:
        return f"{type(exc).__name__}: {exc}"


def plan(config: MdiConfig, *, progress: bool = True) -> Plan:
    """Read, draw, render and split: everything ``build`` writes, in memory (a few MB at the defaults)."""
    root = Path(config.root)
    check_render_size(config.render_size)
    icons, left_out = read_index(root)
    drawn = draw_families(families_by_class(icons), config.family_fraction, config.seed)
    home_of = {key: name for name, families in drawn.items() for key in families}
    chosen = [icon for families in drawn.values() for members in families.values() for icon in members]
    made = convert_styled(chosen, (STYLE,), lambda icon, _: _convert(icon, config.render_size),
                          lambda icon, style: f"{style}/{icon.name}", "rendering icons", progress=progress)
    drawings, skipped = made.drawings, made.skipped
    names, num_known, small = split_large_classes(made.by_class, config.min_icons, config.seed, str(root),
                                                  "icons in one category")
    label_of = {name: label for label, name in enumerate(names)}

    records: list[ImageRecord] = []
    for name in names:
        keys = sorted(key for key, home in home_of.items() if home == name
                      and any(icon in drawings and icon.class_name in label_of for icon in drawn[name][key]))
        for index, is_test in class_hold_out(len(keys), config.seed, name, config.test_fraction, config.min_test,
                                             unit="icon families"):
            for icon in drawn[name][keys[index]]:
                if icon not in drawings or icon.class_name not in label_of:
                    continue
                label = label_of[icon.class_name]
                split = "test" if is_test else "known" if label < num_known else "novel"
                records.append(ImageRecord(drawings[icon][STYLE], label, split, icon.class_name, f"{STYLE}/{icon.name}"))
    classes = class_table(names, num_known, (r.label for r in records if r.split != "test"))
    info = DatasetInfo(
        name=config.name,
        source=f"{PACKAGE} at {root}",
        seed=config.seed,
        imbalance=natural_imbalance(classes),
        extra={
            "class_rule": "metadata.json category of icons filed under exactly one; hidden icons, aliases and icons "
                          "in several categories left out; classes < min_icons icons dropped",
            "left_out_icons": left_out,
            "family_fraction": config.family_fraction,
            **icon_set_extra(config, f"an icon and its {' / '.join(repr(v) for v in VARIANTS)} variants in the same "
                             "split, held out with the base icon's class", small, skipped),
        },
    )
    return Plan(classes=classes, rows=split_order(records, config.seed), info=info, skipped=skipped)


def build(config: MdiConfig, out_uri: str, *, progress: bool = True, **write_options: Any) -> Manifest:
    """Prepare MDI-LT under ``out_uri`` (local path or ``s3://``); returns the written manifest.

    ``write_options`` go to ``common.write_plan`` (``overwrite``, ``endpoint_url``, ``target_shard_bytes``).
    """
    return write_plan(plan(config, progress=progress), out_uri, progress=progress, **write_options)
