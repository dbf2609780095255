"""Emoji-LT builder on generated emoji-datasource packages (the npm packages are not needed): the real layout,
``emoji-datasource-<style>/emoji.json`` and ``img/<style>/64/<image>``, with drawn RGBA PNGs."""

from __future__ import annotations

import io
import json
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from ncdlr.cli import main
from ncdlr.data.builders import emoji
from ncdlr.data.builders.common import SourceFormatError
from ncdlr.data.manifest import read_manifest
from tests.fixtures.datasets import prepared_rows

#: (category, subcategory) → emoji in it; "Flags/flag" is below min_emoji 4 and dropped
CLASSES = {("Animals & Nature", "animal-mammal"): 9, ("Food & Drink", "food-fruit"): 6,
           ("Objects", "tool"): 5, ("Symbols", "arrow"): 4, ("Flags", "flag"): 3}


def _drawing(colour: tuple[int, int, int], box: tuple[int, int, int, int]) -> bytes:
    image = Image.new("RGBA", (64, 64), (0, 0, 0, 0))
    image.paste((*colour, 255), box)
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


@pytest.fixture
def emoji_root(tmp_path: Path) -> Path:
    """Two styles; the last tool lacks a twitter drawing; one mammal's google PNG is truncated."""
    root = tmp_path / "node_modules"
    entries = []
    for c, ((category, sub), n) in enumerate(CLASSES.items()):
        for i in range(n):
            image = f"{c:02x}{i:02x}.png"
            entries.append({"image": image, "category": category, "subcategory": sub, "has_img_google": True,
                            "has_img_twitter": not (sub == "tool" and i == n - 1), "has_img_apple": False})
    for style in ("google", "twitter"):
        folder = root / f"emoji-datasource-{style}" / "img" / style / "64"
        folder.mkdir(parents=True)
        (root / f"emoji-datasource-{style}" / "emoji.json").write_text(json.dumps(entries))
        for k, entry in enumerate(entries):
            if entry[f"has_img_{style}"]:
                box = (4 + k % 7, 6, 40 + k % 11, 50) if style == "google" else (10, 2 + k % 5, 60, 30 + k % 9)
                (folder / entry["image"]).write_bytes(_drawing((k * 3 % 256, 90, 200), box))
    broken = root / "emoji-datasource-google" / "img" / "google" / "64" / "0003.png"
    broken.write_bytes(broken.read_bytes()[:40])
    return root


def config(root: Path, **overrides) -> emoji.EmojiConfig:
    return emoji.EmojiConfig(root=root, **{"min_emoji": 4, "min_test": 1, **overrides})


def test_classes_are_subcategories_with_every_style_of_each_emoji(emoji_root: Path) -> None:
    plan = emoji.plan(config(emoji_root), progress=False)
    assert {c.name for c in plan.classes} == {"Animals & Nature/animal-mammal", "Food & Drink/food-fruit",
                                             "Objects/tool", "Symbols/arrow"}
    assert plan.info.extra["dropped_small_classes"] == {"Flags/flag": 3}
    # 9 mammals less the broken one, 6 fruit, 5 tools less the one twitter lacks, 4 arrows; two drawings each
    assert Counter(r.class_name for r in plan.rows) == {"Animals & Nature/animal-mammal": 16,
                                                       "Food & Drink/food-fruit": 12, "Objects/tool": 8,
                                                       "Symbols/arrow": 8}
    by_emoji = Counter(r.source_id.split("/", 1)[1] for r in plan.rows)
    assert set(by_emoji.values()) == {2}
    assert {r.source_id.split("/")[0] for r in plan.rows} == {"google", "twitter"}


def test_an_undecodable_drawing_is_reported_and_its_emoji_dropped_from_every_style(emoji_root: Path) -> None:
    plan = emoji.plan(config(emoji_root), progress=False)
    report = plan.info.extra["skipped_images"]
    assert report["count"] == 1 and report["images"][0]["source_id"] == "google/0003.png"
    assert not any(r.source_id.endswith("/0003.png") for r in plan.rows)


def test_test_hold_out_keeps_an_emojis_styles_together(emoji_root: Path) -> None:
    plan = emoji.plan(config(emoji_root), progress=False)
    splits: dict[str, set[str]] = defaultdict(set)
    for r in plan.rows:
        splits[r.source_id.split("/", 1)[1]].add(r.split)
    assert all(len(s) == 1 for s in splits.values()), "an emoji's drawings straddle two splits"
    test_emoji = Counter(r.class_name for r in plan.rows if r.split == "test" and r.source_id.startswith("google"))
    # max(1, round(0.2 n)) emoji per class: n = 8, 6, 4, 4
    assert test_emoji == {"Animals & Nature/animal-mammal": 2, "Food & Drink/food-fruit": 1, "Objects/tool": 1,
                          "Symbols/arrow": 1}

    def held_out(seed: int) -> set[str]:
        return {r.source_id for r in emoji.plan(config(emoji_root, seed=seed), progress=False).rows
                if r.split == "test"}

    assert held_out(0) == held_out(0) != held_out(3)


def test_images_are_cropped_flattened_opaque_pngs(emoji_root: Path) -> None:
    plan = emoji.plan(config(emoji_root), progress=False)
    row = next(r for r in plan.rows if r.source_id == "google/0000.png")
    out = Image.open(io.BytesIO(row.image))
    assert out.format == "PNG" and out.mode == "RGB" and out.size == (40 - 4, 50 - 6)
    assert len(np.unique(np.asarray(out).reshape(-1, 3), axis=0)) == 1  # the drawn rectangle and nothing else


def test_build_through_the_cli(emoji_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "emoji-lt"
    code = main(["prepare", "emoji", "--root", str(emoji_root), "--min-emoji", "4", "--min-test", "1",
                 "--out", str(out), "--no-progress"])
    assert code == 0 and "prepared emoji" in capsys.readouterr().out
    manifest = read_manifest(str(out))
    assert manifest.num_known == 2 and manifest.num_novel == 2
    rows = prepared_rows(out)
    assert len(rows) == 44 and all(r["image"][:4] == b"\x89PNG" for r in rows)
    assert manifest.extra["styles"] == ["google", "twitter"]


def test_missing_package_names_the_install_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["prepare", "emoji", "--root", str(tmp_path), "--out", str(tmp_path / "out"), "--no-progress"])
    assert code == 2
    err = capsys.readouterr().err
    assert "emoji-datasource-google" in err and "npm install" in err
    assert not (tmp_path / "out").exists()


def test_a_listed_drawing_missing_on_disk_is_an_error_naming_it(emoji_root: Path) -> None:
    (emoji_root / "emoji-datasource-twitter" / "img" / "twitter" / "64" / "0101.png").unlink()
    with pytest.raises(SourceFormatError, match=r"0101\.png.*does not exist"):
        emoji.plan(config(emoji_root), progress=False)


@pytest.mark.parametrize("text, match", [("{not json", "not valid JSON"), ('{"image": "a.png"}', "JSON list"),
                                         ('[{"image": "a.png", "category": "X"}]', r"lacks.*subcategory")])
def test_a_malformed_index_is_an_error_naming_the_file(emoji_root: Path, text: str, match: str) -> None:
    (emoji_root / "emoji-datasource-google" / "emoji.json").write_text(text)
    with pytest.raises(SourceFormatError, match=match):
        emoji.plan(config(emoji_root), progress=False)


def test_unknown_style_and_too_few_classes_are_errors(emoji_root: Path) -> None:
    with pytest.raises(ValueError, match="styles"):
        emoji.plan(config(emoji_root, styles=("google", "noto")), progress=False)
    with pytest.raises(ValueError, match="distinct"):
        emoji.plan(config(emoji_root, styles=("google", "google")), progress=False)
    with pytest.raises(SourceFormatError, match="class"):
        emoji.plan(config(emoji_root, min_emoji=7), progress=False)
