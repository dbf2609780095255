"""Phosphor-LT: a real, naturally long-tailed image set from the Phosphor Icons npm package.

Source: the package ``@phosphor-icons/core`` (MIT), fetched from the npm registry, e.g.

    npm install --prefix /data/phosphor @phosphor-icons/core@2.1.1

so that ``--root /data/phosphor/node_modules`` holds ``@phosphor-icons/core/assets/<style>/<name>[-<style>].svg``
(``acorn.svg`` in ``regular``, ``acorn-bold.svg`` in ``bold``: 256-unit-grid drawings, ``fill="currentColor"``, one
designer's hand, every icon in all six styles) and the catalogue. The package has no JSON index: the catalogue is
read, without node, from its TypeScript declarations, ``dist/types.d.ts`` (the ``FigmaCategory`` enum: member name →
text) and ``dist/icons.d.ts`` (one entry per icon: ``name``, ``categories`` (several), ``figma_category`` (one)).

Classes: the icon's ``figma_category`` text (``arrows``, ``commerce``, ``weather & nature``, ...): the one section of
the Figma library each icon is filed under. The long tail is the icon set's own: how many icons each section has.
Sections with fewer than ``min_icons`` icons are dropped. By default one style (``regular``); ``--styles`` adds
others (``thin``, ``light``, ``bold``, ``fill``, ``duotone``), each icon once per style.

Splits: classes (sorted by name) are split by ``ncdlr.data.longtail.split_known_novel(C, seed)``, labels in that
order. Inside each class a seeded shuffle of its icon *families* holds out ``max(min_test, round(test_fraction · n))``
of them as ``test``: an icon and its crossed-out variant (``bell`` and ``bell-slash``) are one family, always in one
split (the second is the first with a slash: it would leak it). Two families straddle classes (``cloud`` in weather &
nature, ``cloud-slash`` in system & devices; ``drop`` / ``drop-slash``, design): a family is held out with its base
icon's class, each icon keeping its own label. The rest go to ``known``/``novel`` by each icon's class's group.

Measured on @phosphor-icons/core 2.1.1 (1512 icons, each with one figma_category, in 18 classes: commerce 176,
system & devices 157, design 133, office & editing 131, arrows 121, media 111, maps & travel 99, math & finance 83,
communication 75, brands 74, games 73, people 69, weather & nature 62, security & warnings 45, technology &
development 29, time 28, health & wellness 27, education 19), style regular, the defaults: all 18 classes kept, 1512
images (the largest class ``commerce``, 176 icons; the smallest ``education``, 19); seed 0 gives 9 known classes
with 141 → 15 training images and 9 novel with 125 → 23 (306 test images). 6 s of CPU time (42 s to 3 min of wall
time at nice 19 beside two training runs on 2 cores), 1.5 MB of PNGs; the shards are the same bytes on every build.

Images: each SVG rendered by resvg (``resvg-py``, ``common.render``, as Tabler-LT's) on a transparent
``render_size``-px canvas, cropped to the bounding box of its drawn pixels, flattened onto white (RGB), and encoded
as PNG. A drawing resvg cannot render, or one that draws nothing, is skipped and reported
(``extra["skipped_images"]``), and its icon dropped from every style.
"""

from __future__ import annotations

import re
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
    split_large_classes,
    split_order,
    write_plan,
)
from ncdlr.data.manifest import DatasetInfo, Manifest
from ncdlr.data.records import ImageRecord


PACKAGE = "@phosphor-icons/core"
STYLES = ("regular", "thin", "light", "bold", "fill", "duotone")
INSTALL_HINT = "npm install --prefix DIR @phosphor-icons/core@2.1.1; --root DIR/node_modules"
CROSSED_OUT = "-slash"  # the suffix of an icon's crossed-out variant (same drawing, a slash added)

ENUM = "FigmaCategory"
ICONS_START = "export declare const icons: readonly ["
_ENUM_BLOCK = re.compile(r"export declare enum FigmaCategory \{(?P<body>[^}]*)\}")
_ENUM_MEMBER = re.compile(r'(?P<member>[A-Z][A-Z0-9_]*) = "(?P<text>[^"\\]+)",?')
_NAME_FIELD = re.compile(r'\breadonly name: "(?P<name>[^"\\]*)";')
_FIGMA_FIELD = re.compile(r"\breadonly figma_category: (?P<value>[^;]*);")
_FIGMA_VALUE = re.compile(r"FigmaCategory\.(?P<member>[A-Z][A-Z0-9_]*)")
_ICON_NAME = re.compile(r"[a-z0-9]+(?:-[a-z0-9]+)*")  # also keeps a name from reaching outside assets/<style>/
_ANY_NAME = re.compile(r'\bname: "')


@dataclass(frozen=True)
class PhosphorConfig:
    root: Path  # folder holding @phosphor-icons/core/ (an npm node_modules folder)
    styles: tuple[str, ...] = ("regular",)  # drawings per icon, one per style
    seed: int = 0  # seed of the known/novel split and of the test hold-out
    min_icons: int = 8  # classes with fewer icons are dropped
    test_fraction: float = 0.2  # share of each class's icon families held out as test
    min_test: int = 2  # ...but at least this many families
    render_size: int = 96  # pixels of the square canvas an SVG is rendered on (before the crop to its content)
    name: str = "phosphor"


@dataclass(frozen=True)
class Icon:
    """One icon of the set: its name (the regular style's file name without ``.svg``) and its class (the text of
    its ``figma_category``)."""

    name: str
    class_name: str

    @property
    def family(self) -> str:
        """The icon it varies: ``bell`` for ``bell-slash`` (and for ``bell``)."""
        return icon_family(self.name, (CROSSED_OUT,))


def package_dir(root: Path) -> Path:
    return Path(root) / PACKAGE


def svg_path(root: Path, style: str, name: str) -> Path:
    """``assets/regular/acorn.svg``, ``assets/bold/acorn-bold.svg``: every style but regular suffixes its name."""
    stem = name if style == "regular" else f"{name}-{style}"
    return package_dir(root) / "assets" / style / f"{stem}.svg"


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise SourceFormatError(f"{path} does not exist: not a {PACKAGE} package ({INSTALL_HINT})") from exc
    except UnicodeDecodeError as exc:
        raise SourceFormatError(f"{path} is not UTF-8 text: {exc}") from exc


def read_figma_categories(path: Path) -> dict[str, str]:
    """The ``FigmaCategory`` enum of ``types.d.ts``: member name → text (``WEATHER`` → ``weather & nature``).

    Raises ``SourceFormatError`` naming the file when the enum is missing or empty, a line of it is not
    ``NAME = "text",``, or a member name or text repeats.
    """
    found = _ENUM_BLOCK.search(_read_text(path))
    if found is None:
        raise SourceFormatError(f"{path}: no 'export declare enum {ENUM} {{...}}' block")
    members: dict[str, str] = {}
    for line in found["body"].splitlines():
        if not line.strip():
            continue
        member = _ENUM_MEMBER.fullmatch(line.strip())
        if member is None:
            raise SourceFormatError(f"{path}: enum {ENUM} line {line.strip()!r} is not NAME = \"text\"")
        if member["member"] in members or member["text"] in members.values():
            raise SourceFormatError(f"{path}: enum {ENUM} repeats {member['member']} or {member['text']!r}")
        members[member["member"]] = member["text"]
    if not members:
        raise SourceFormatError(f"{path}: enum {ENUM} has no members")
    return members


def _objects(text: str, path: Path) -> tuple[list[str], list[str]]:
    """The ``{...}`` entries of an array literal's body: each entry's own text (its nested objects cut out) and the
    nested objects' texts (``alias: {name, pascal_name}``). Strings are skipped whole, so a brace in a tag is text.
    ``SourceFormatError`` naming ``path`` for anything but entries and commas between entries, or unbalanced braces.
    """
    entries: list[str] = []
    nested: list[str] = []
    depth = 0
    own: list[str] = []
    inner: list[str] = []
    i = 0
    while i < len(text):
        char = text[i]
        if char == '"' and depth > 0:  # a string: copied whole, escapes included
            end = i + 1
            while end < len(text) and text[end] != '"':
                end += 2 if text[end] == "\\" else 1
            if end >= len(text):
                raise SourceFormatError(f"{path}: unterminated string in entry {len(entries) + 1}")
            (own if depth == 1 else inner).append(text[i:end + 1])
            i = end + 1
            continue
        if char == "{":
            depth += 1
            if depth > 2:
                raise SourceFormatError(f"{path}: entry {len(entries) + 1} nests objects more than one level deep")
        elif char == "}":
            if depth == 0:
                raise SourceFormatError(f"{path}: unbalanced '}}' after entry {len(entries)}")
            depth -= 1
            if depth == 1:
                nested.append("".join(inner))
                inner = []
            elif depth == 0:
                entries.append("".join(own))
                own = []
        elif depth == 1:
            own.append(char)
        elif depth == 2:
            inner.append(char)
        elif not (char.isspace() or char == ","):
            raise SourceFormatError(f"{path}: unexpected {char!r} between entries {len(entries)} and "
                                    f"{len(entries) + 1} of the icons array")
        i += 1
    if depth:
        raise SourceFormatError(f"{path}: the icons array ends inside entry {len(entries) + 1}")
    return entries, nested


def read_icons(path: Path, categories: dict[str, str]) -> list[Icon]:
    """Every icon of ``icons.d.ts`` with its class, the text of its ``figma_category`` (``categories``: the enum),
    sorted by name.

    Raises ``SourceFormatError`` naming the file for a missing ``icons`` array, an entry without exactly one text
    ``name`` or ``figma_category``, a ``figma_category`` that is not a member of the enum, a name that is not
    lowercase words joined by ``-`` or that repeats, no icons at all, or ``name:`` fields in the file other than the
    icons' and their aliases' (an entry the parse missed).
    """
    text = _read_text(path)
    start = text.find(ICONS_START)
    body = text[start + len(ICONS_START):].rstrip() if start >= 0 else ""
    if not body.endswith("];"):
        raise SourceFormatError(f"{path}: no '{ICONS_START} ... ];' array of icons")
    entries, nested = _objects(body[:-2], path)
    icons: list[Icon] = []
    for number, entry in enumerate(entries, 1):
        names = _NAME_FIELD.findall(entry)
        if len(names) != 1 or not _ICON_NAME.fullmatch(names[0]):
            raise SourceFormatError(f"{path}: entry {number} has no single name of lowercase words joined by '-' "
                                    f"(found {names})")
        name = names[0]
        values = _FIGMA_FIELD.findall(entry)
        if len(values) != 1:
            raise SourceFormatError(f"{path}: icon {name!r} has {len(values)} figma_category fields, not 1")
        member = _FIGMA_VALUE.fullmatch(values[0].strip())
        if member is None or member["member"] not in categories:
            raise SourceFormatError(f"{path}: icon {name!r} has figma_category {values[0].strip()}, not a member of "
                                    f"{ENUM} ({', '.join(categories)})")
        icons.append(Icon(name, categories[member["member"]]))
    if not icons:
        raise SourceFormatError(f"{path}: the icons array is empty")
    repeated = len(icons) - len({icon.name for icon in icons})
    if repeated:
        raise SourceFormatError(f"{path}: {repeated} icon name(s) repeat")
    listed = len(_ANY_NAME.findall(text))
    aliases = sum(len(_ANY_NAME.findall(block)) for block in nested)
    if listed != len(icons) + aliases:
        raise SourceFormatError(f"{path}: {listed} 'name:' fields, but {len(icons)} icons and {aliases} aliases "
                                "parsed")
    return sorted(icons, key=lambda icon: icon.name)


def read_index(root: Path) -> list[Icon]:
    """The package's icons with their classes (:func:`read_icons` on ``dist/icons.d.ts``, the enum from
    ``dist/types.d.ts``); ``SourceFormatError`` naming the folder, with the install command, when it is missing."""
    package = package_dir(root)
    if not package.is_dir():
        raise SourceFormatError(f"{package} does not exist (install the package with: {INSTALL_HINT})")
    return read_icons(package / "dist" / "icons.d.ts", read_figma_categories(package / "dist" / "types.d.ts"))


def plan(config: PhosphorConfig, *, progress: bool = True) -> Plan:
    """Read, render and split: everything ``build`` writes, in memory (a few MB for the regular style)."""
    root = Path(config.root)
    styles = tuple(config.styles)
    check_styles(styles, STYLES)
    check_render_size(config.render_size)
    icons = read_index(root)
    made = convert_styled(icons, styles,
                          lambda icon, style: convert_svg(svg_path(root, style, icon.name), config.render_size,
                                                          "dist/icons.d.ts"),
                          lambda icon, style: f"{style}/{icon.name}", "rendering icons", progress=progress)
    drawings, skipped, by_class = made.drawings, made.skipped, made.by_class
    names, num_known, small = split_large_classes(by_class, config.min_icons, config.seed, str(root),
                                                  f"icons drawn in every style of {list(styles)}")
    label_of = {name: label for label, name in enumerate(names)}

    # Families over the kept classes, each held out with its base icon's class (else its first icon's).
    families: dict[str, list[Icon]] = defaultdict(list)
    for name in names:
        for icon in by_class[name]:
            families[icon.family].append(icon)
    home_of = {key: next((icon.class_name for icon in members if icon.name == key), members[0].class_name)
               for key, members in families.items()}
    records: list[ImageRecord] = []
    for name in names:
        keys = sorted(key for key in families if home_of[key] == name)
        for index, is_test in class_hold_out(len(keys), config.seed, name, config.test_fraction, config.min_test,
                                             unit="icon families"):
            for icon in sorted(families[keys[index]], key=lambda icon: icon.name):
                label = label_of[icon.class_name]
                split = "test" if is_test else "known" if label < num_known else "novel"
                for style in styles:
                    records.append(ImageRecord(drawings[icon][style], label, split, icon.class_name,
                                               f"{style}/{icon.name}"))
    classes = class_table(names, num_known, (r.label for r in records if r.split != "test"))
    info = DatasetInfo(
        name=config.name,
        source=f"{PACKAGE} ({', '.join(styles)}) at {root}",
        seed=config.seed,
        imbalance=natural_imbalance(classes),
        extra={
            "class_rule": f"figma_category text (dist/icons.d.ts, enum {ENUM} of dist/types.d.ts); classes < "
                          "min_icons icons drawn in every style dropped",
            "styles": list(styles),
            **icon_set_extra(config, f"an icon and its '{CROSSED_OUT}' variant in the same split, held out with the "
                             "base icon's class", small, skipped),
        },
    )
    return Plan(classes=classes, rows=split_order(records, config.seed), info=info, skipped=skipped)


def build(config: PhosphorConfig, out_uri: str, *, progress: bool = True, **write_options: Any) -> Manifest:
    """Prepare Phosphor-LT under ``out_uri`` (local path or ``s3://``); returns the written manifest.

    ``write_options`` go to ``common.write_plan`` (``overwrite``, ``endpoint_url``, ``target_shard_bytes``).
    """
    return write_plan(plan(config, progress=progress), out_uri, progress=progress, **write_options)
