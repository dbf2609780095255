"""Tabler-LT: a real, naturally long-tailed image set from the Tabler Icons npm package.

Source: the package ``@tabler/icons`` (MIT), fetched from the npm registry, e.g.

    npm install --prefix /data/tabler @tabler/icons@3.52.0

so that ``--root /data/tabler/node_modules`` holds ``@tabler/icons/icons.json`` (one entry per icon: ``name``,
``category``, ``styles``) and ``@tabler/icons/icons/<style>/<name>.svg`` (24-px-grid line drawings, one designer's
hand, ``stroke="currentColor"``).

Classes: the icon's category (``Animals``, ``Arrows``, ``Weather``, ...). The long tail is the icon set's own: how many
icons each category has. Icons without a category are left out, and so are categories with fewer than ``min_icons``
icons drawn in every style. By default one style (``outline``: every icon has it); ``filled`` exists for about a
fifth of the icons, so adding it keeps only those.

Splits: classes (sorted by name) are split by ``ncdlr.data.longtail.split_known_novel(C, seed)``, labels in that
order. Inside each class a seeded shuffle of its icon *families* holds out ``max(min_test, round(test_fraction · n))``
of them as ``test``: an icon and its crossed-out variant (``bell`` and ``bell-off``) are one family, always in one
split (the second is the first with a slash: it would leak it). The rest go to ``known``/``novel`` by the class's
group.

Measured on @tabler/icons 3.52.0 (5491 icons, each with a category, in 41 categories), style outline, the defaults:
all 41 categories kept, 5491 images (the largest class ``System``, 831 icons; the smallest ``Logic``, 8); seed 0
gives 21 known classes with 666 → 6 training images and 20 novel with 310 → 10 (1077 test images); seed 1 known
302 → 6, novel 665 → 10 (1105 test). 18 s on 2 cores, 6 MB of PNGs; the shards are the same bytes on every build
(checked from a fresh ``npm install``).

Images: each SVG rendered by resvg (``resvg-py``) on a transparent ``render_size``-px canvas, cropped to the bounding
box of its drawn pixels, flattened onto white (RGB), and encoded as PNG. A drawing resvg cannot render, or one that
draws nothing, is skipped and reported (``extra["skipped_images"]``), and its icon dropped from every style.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ncdlr.data.builders.common import (
    Plan,
    SourceFormatError,
    check_render_size,
    check_styles,
    class_hold_out,
    class_table,
    convert_styled,
    convert_svg,
    icon_family,
    icon_set_extra,
    natural_imbalance,
    read_json_index,
    split_large_classes,
    split_order,
    write_plan,
)
from ncdlr.data.manifest import DatasetInfo, Manifest
from ncdlr.data.records import ImageRecord


PACKAGE = "@tabler/icons"
STYLES = ("outline", "filled")
INSTALL_HINT = "npm install --prefix DIR @tabler/icons@3.52.0; --root DIR/node_modules"
CROSSED_OUT = "-off"  # the suffix of an icon's crossed-out variant (same drawing, a slash added)


@dataclass(frozen=True)
class TablerConfig:
    root: Path  # folder holding @tabler/icons/ (an npm node_modules folder)
    styles: tuple[str, ...] = ("outline",)  # drawings per icon, one per style
    seed: int = 0  # seed of the known/novel split and of the test hold-out
    min_icons: int = 8  # classes with fewer icons drawn in every style are dropped
    test_fraction: float = 0.2  # share of each class's icon families held out as test
    min_test: int = 2  # ...but at least this many families
    render_size: int = 96  # pixels of the square canvas an SVG is rendered on (before the crop to its content)
    name: str = "tabler"


@dataclass(frozen=True)
class Icon:
    """One icon of the set: its file name (without ``.svg``) and its class (the category)."""

    name: str
    class_name: str

    @property
    def family(self) -> str:
        """The icon it varies: ``bell`` for ``bell-off`` (and for ``bell``)."""
        return icon_family(self.name, (CROSSED_OUT,))


def package_dir(root: Path) -> Path:
    return Path(root) / PACKAGE


def svg_path(root: Path, style: str, name: str) -> Path:
    return package_dir(root) / "icons" / style / f"{name}.svg"


def read_index(root: Path, styles: tuple[str, ...]) -> list[Icon]:
    """The icons with a category that every style draws, from ``icons.json``, sorted by name.

    Raises ``SourceFormatError`` naming the file for a missing package, unreadable JSON or an entry without a text
    ``name`` / ``category`` and a ``styles`` mapping; ``ValueError`` for unknown or repeated styles.
    """
    check_styles(styles, STYLES)
    if not package_dir(root).is_dir():
        raise SourceFormatError(f"{package_dir(root)} does not exist (install the package with: {INSTALL_HINT})")
    index = package_dir(root) / "icons.json"
    entries = read_json_index(index, "a @tabler/icons")
    if not isinstance(entries, dict):
        raise SourceFormatError(f"{index}: expected a JSON object of icons by name, got {type(entries).__name__}")
    icons: list[Icon] = []
    for key, entry in entries.items():
        if not (isinstance(entry, dict) and isinstance(entry.get("name"), str)
                and isinstance(entry.get("category"), str) and isinstance(entry.get("styles"), dict)):
            raise SourceFormatError(f"{index}: entry {key!r} lacks a text name and category and a styles object")
        if entry["category"] and all(style in entry["styles"] for style in styles):
            icons.append(Icon(entry["name"], entry["category"]))
    if not icons:
        raise SourceFormatError(f"{index}: no icon with a category drawn in every style of {list(styles)}")
    return sorted(icons, key=lambda icon: icon.name)


def plan(config: TablerConfig, *, progress: bool = True) -> Plan:
    """Read, render and split: everything ``build`` writes, in memory (≈ 10 MB for the outline style)."""
    root = Path(config.root)
    styles = tuple(config.styles)
    check_render_size(config.render_size)
    icons = read_index(root, styles)
    made = convert_styled(icons, styles,
                          lambda icon, style: convert_svg(svg_path(root, style, icon.name), config.render_size,
                                                          "icons.json"),
                          lambda icon, style: f"{style}/{icon.name}", "rendering icons", progress=progress)
    drawings, skipped, by_class = made.drawings, made.skipped, made.by_class
    names, num_known, small = split_large_classes(by_class, config.min_icons, config.seed, str(root),
                                                  f"icons drawn in every style of {list(styles)}")

    records: list[ImageRecord] = []
    for label, name in enumerate(names):
        families: dict[str, list[Icon]] = defaultdict(list)
        for icon in by_class[name]:
            families[icon.family].append(icon)
        keys = sorted(families)
        group = "known" if label < num_known else "novel"
        for index, is_test in class_hold_out(len(keys), config.seed, name, config.test_fraction, config.min_test,
                                             unit="icon families"):
            split = "test" if is_test else group
            for icon in families[keys[index]]:
                for style in styles:
                    records.append(ImageRecord(drawings[icon][style], label, split, name, f"{style}/{icon.name}"))
    classes = class_table(names, num_known, (r.label for r in records if r.split != "test"))
    info = DatasetInfo(
        name=config.name,
        source=f"{PACKAGE} ({', '.join(styles)}) at {root}",
        seed=config.seed,
        imbalance=natural_imbalance(classes),
        extra={
            "class_rule": "icons.json category; icons without one left out; classes < min_icons icons drawn in every "
                          "style dropped",
            "styles": list(styles),
            **icon_set_extra(config, f"an icon and its '{CROSSED_OUT}' variant in the same split", small, skipped),
        },
    )
    return Plan(classes=classes, rows=split_order(records, config.seed), info=info, skipped=skipped)


def build(config: TablerConfig, out_uri: str, *, progress: bool = True, **write_options: Any) -> Manifest:
    """Prepare Tabler-LT under ``out_uri`` (local path or ``s3://``); returns the written manifest.

    ``write_options`` go to ``common.write_plan`` (``overwrite``, ``endpoint_url``, ``target_shard_bytes``).
    """
    return write_plan(plan(config, progress=progress), out_uri, progress=progress, **write_options)
