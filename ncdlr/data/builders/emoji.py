"""Emoji-LT: a real, naturally long-tailed image set from the emoji-datasource npm packages.

Source: the packages ``emoji-datasource-<style>`` (MIT-licensed metadata; Google's Noto images under Apache 2.0 /
OFL, Twitter's Twemoji under CC-BY 4.0), fetched from the npm registry, e.g.

    npm install --prefix /data/emoji emoji-datasource-google@16.0.0 emoji-datasource-twitter@16.0.0

so that ``--root /data/emoji/node_modules`` holds ``emoji-datasource-<style>/emoji.json`` (one entry per emoji:
``image``, ``category``, ``subcategory``, ``has_img_<style>``) and ``emoji-datasource-<style>/img/<style>/64/
<image>`` (64-px RGBA PNGs).

Classes: the Unicode emoji subcategory, named ``<category>/<subcategory>`` (``Animals & Nature/animal-mammal``,
``Flags/country-flag``). The long tail is the standard's own: how many emoji each subcategory has. Each emoji is
drawn once per style (skin-tone variants are left out: they are the same drawing recoloured), so a class of
``n`` emoji has ``n · len(styles)`` images. Classes with fewer than ``min_emoji`` emoji drawn in every style are
dropped, and an emoji some style lacks is dropped from all styles (the styles stay paired).

Splits: classes (sorted by name) are split by ``ncdlr.data.longtail.split_known_novel(C, seed)``, labels in that
order. Inside each class a seeded shuffle of its *emoji* holds out ``max(min_test, round(test_fraction · n))`` of
them as ``test`` with every style's drawing, so an emoji's two renderings never straddle train and test (the
second would leak the first). The rest go to ``known``/``novel`` by the class's group.

Measured on emoji-datasource 16.0.0 (1911 emoji; 3786 drawings per style with the skin tones), styles google +
twitter, the defaults: 70 of 99 subcategories kept, 1760 emoji, 3520 images (2816 training, 704 test); seed 0 gives
35 known classes with 414 → 12 training images (the country flags known) and 35 novel with 132 → 12; seed 1 puts the
flags among the novel classes (414 → 12). 6 s on 2 cores, 11 MB of PNGs; the shards are the same bytes on every build.

Images: decoded, cropped to the bounding box of their non-transparent pixels, flattened onto white (RGB), and
encoded as PNG (flat colour, as clipart). An image that cannot be decoded, or is fully transparent, is skipped and
reported (``extra["skipped_images"]``), and its emoji dropped from every style.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ncdlr.data.builders.common import (
    Plan,
    SourceFormatError,
    check_styles,
    class_hold_out,
    class_table,
    convert_styled,
    natural_imbalance,
    read_json_index,
    skip_report,
    split_large_classes,
    split_order,
    write_plan,
)
from ncdlr.data.images import DECODE_ERRORS, clipart_to_rgb, encode
from ncdlr.data.manifest import DatasetInfo, Manifest
from ncdlr.data.records import ImageRecord


STYLES = ("google", "twitter", "apple", "facebook")
INSTALL_HINT = ("npm install --prefix DIR emoji-datasource-google@16.0.0 emoji-datasource-twitter@16.0.0; "
                "--root DIR/node_modules")
IMAGE_SIZE_FOLDER = "64"
REQUIRED_KEYS = ("image", "category", "subcategory")


@dataclass(frozen=True)
class EmojiConfig:
    root: Path  # folder holding emoji-datasource-<style>/ (an npm node_modules folder)
    styles: tuple[str, ...] = ("google", "twitter")  # drawings per emoji, one per style
    seed: int = 0  # seed of the known/novel split and of the test hold-out
    min_emoji: int = 8  # classes with fewer emoji drawn in every style are dropped
    test_fraction: float = 0.2  # share of each class's emoji held out as test
    min_test: int = 2  # ...but at least this many emoji
    name: str = "emoji"


@dataclass(frozen=True)
class Emoji:
    """One emoji of the standard: its image file name and its class (``<category>/<subcategory>``)."""

    image: str
    class_name: str


def package_dir(root: Path, style: str) -> Path:
    return Path(root) / f"emoji-datasource-{style}"


def image_path(root: Path, style: str, image: str) -> Path:
    return package_dir(root, style) / "img" / style / IMAGE_SIZE_FOLDER / image


def read_index(root: Path, styles: tuple[str, ...]) -> list[Emoji]:
    """The emoji every style draws, from the first style's ``emoji.json``, sorted by image name.

    Raises ``SourceFormatError`` naming the file for a missing package, unreadable JSON or an entry without
    ``image`` / ``category`` / ``subcategory``.
    """
    check_styles(styles, STYLES)
    for style in styles:
        if not package_dir(root, style).is_dir():
            raise SourceFormatError(f"{package_dir(root, style)} does not exist (install the packages with: "
                                    f"{INSTALL_HINT})")
    index = package_dir(root, styles[0]) / "emoji.json"
    entries = read_json_index(index, "an emoji-datasource")
    if not isinstance(entries, list):
        raise SourceFormatError(f"{index}: expected a JSON list of emoji, got {type(entries).__name__}")
    emoji: list[Emoji] = []
    for position, entry in enumerate(entries):
        missing = [k for k in REQUIRED_KEYS if not isinstance(entry, dict) or not isinstance(entry.get(k), str)]
        if missing:
            raise SourceFormatError(f"{index}: entry {position} lacks the text field(s) {missing}")
        if all(entry.get(f"has_img_{style}", True) for style in styles):
            emoji.append(Emoji(entry["image"], f"{entry['category']}/{entry['subcategory']}"))
    if not emoji:
        raise SourceFormatError(f"{index}: no emoji drawn in every style of {list(styles)}")
    return sorted(emoji, key=lambda e: e.image)


def _convert(path: Path) -> bytes | str:
    """The drawing at ``path`` as an opaque, content-cropped PNG, or the reason it cannot be one."""
    try:
        data = path.read_bytes()
    except FileNotFoundError as exc:
        raise SourceFormatError(f"image file {path} is listed in emoji.json but does not exist") from exc
    try:
        return encode(clipart_to_rgb(data), "PNG")
    except DECODE_ERRORS as exc:
        return f"{type(exc).__name__}: {exc}"


def plan(config: EmojiConfig, *, progress: bool = True) -> Plan:
    """Read, convert and split: everything ``build`` writes, in memory (≈ 10 MB for two styles)."""
    root = Path(config.root)
    styles = tuple(config.styles)
    emoji = read_index(root, styles)
    made = convert_styled(emoji, styles, lambda e, style: _convert(image_path(root, style, e.image)),
                          lambda e, style: f"{style}/{e.image}", "converting emoji", progress=progress)
    drawings, skipped, by_class = made.drawings, made.skipped, made.by_class
    names, num_known, small = split_large_classes(by_class, config.min_emoji, config.seed, str(root),
                                                  f"emoji drawn in every style of {list(styles)}")

    records: list[ImageRecord] = []
    for label, name in enumerate(names):
        items = by_class[name]
        group = "known" if label < num_known else "novel"
        for index, is_test in class_hold_out(len(items), config.seed, name, config.test_fraction, config.min_test,
                                             unit="emoji"):
            e = items[index]
            split = "test" if is_test else group
            for style in styles:
                records.append(ImageRecord(drawings[e][style], label, split, name, f"{style}/{e.image}"))
    classes = class_table(names, num_known, (r.label for r in records if r.split != "test"))
    info = DatasetInfo(
        name=config.name,
        source=f"emoji-datasource ({', '.join(styles)}) at {root}",
        seed=config.seed,
        imbalance=natural_imbalance(classes),
        extra={
            "class_rule": "Unicode emoji subcategory (category/subcategory); skin-tone variants left out; "
                          "classes < min_emoji emoji drawn in every style dropped",
            "styles": list(styles),
            "min_emoji": config.min_emoji,
            "test_rule": f"max({config.min_test}, round({config.test_fraction} * n)) emoji per class, seeded; "
                         "all of an emoji's styles in the same split",
            "dropped_small_classes": small,
            "image_encoding": "PNG; cropped to content, flattened onto white; 64-px source drawings",
            "skipped_images": skip_report(skipped),
        },
    )
    return Plan(classes=classes, rows=split_order(records, config.seed), info=info, skipped=skipped)


def build(config: EmojiConfig, out_uri: str, *, progress: bool = True, **write_options: Any) -> Manifest:
    """Prepare Emoji-LT under ``out_uri`` (local path or ``s3://``); returns the written manifest.

    ``write_options`` go to ``common.write_plan`` (``overwrite``, ``endpoint_url``, ``target_shard_bytes``).
    """
    return write_plan(plan(config, progress=progress), out_uri, progress=progress, **write_options)
