"""The static gallery page of discovered classes (issue 16): order, escaping, empty classes, and what a real
browser shows when it opens the page from disk."""

from __future__ import annotations

import html
import re

import pytest
from PIL import Image

from ncdlr.service.gallery_page import ClassSection, GalleryPage, Thumb, render_gallery, section_order
from tests.service.browser import read_gallery, require_browser

HOSTILE = '<script>alert(1)</script> & "barn owl"'


def write_thumb(folder, name: str, colour: tuple[int, int, int]) -> str:
    """A real 32x32 image file ``folder/thumbs/name``; returns its path relative to ``folder``."""
    (folder / "thumbs").mkdir(exist_ok=True)
    Image.new("RGB", (32, 32), colour).save(folder / "thumbs" / name)
    return f"thumbs/{name}"


def section(index: int, *, novel: bool, train: int, predicted: int, thumbs=(), uncertain=(), **more) -> ClassSection:
    key = f"novel-{index:02d}" if novel else f"known-{index}"
    return ClassSection(index=index, key=key, name=more.pop("name", key), is_novel=novel, train_count=train,
                        predicted_count=predicted, confident=tuple(thumbs), uncertain=tuple(uncertain),
                        nearest_known=more.pop("nearest_known", ()), **more)


@pytest.fixture
def page(tmp_path) -> GalleryPage:
    """Two known and four novel classes (one named by a hostile user, one with no images at all, one trained
    on but never predicted), with real JPEG and PNG thumbnails in ``tmp_path/thumbs``."""
    jpg = [write_thumb(tmp_path, f"{i}.jpg", (40 * i, 90, 200)) for i in range(4)]
    png = [write_thumb(tmp_path, f"{i}.png", (200, 40 * i, 90)) for i in range(3)]
    sections = (
        section(0, novel=False, train=50, predicted=12, thumbs=[Thumb(jpg[0], "img/a.jpg", 0.91, "known-0")]),
        section(1, novel=False, train=80, predicted=20, thumbs=[Thumb(png[0], "img/b.png", 0.875)],
                uncertain=[Thumb(png[1], "img/c.png", -0.125, "novel-03")]),
        section(2, novel=True, train=30, predicted=9, name=HOSTILE,
                thumbs=[Thumb(jpg[1], "img/d.jpg", 0.8125, "snowy owl"), Thumb(jpg[2], "img/e.jpg", 0.5)],
                uncertain=[Thumb(png[2], "img/f.png", 0.0625)],
                nearest_known=(("known-1", 0.42), ("known-0", 0.1)), matched_true="snowy owl",
                majority_true="snowy owl", purity=2 / 3),
        section(3, novel=True, train=60, predicted=15, thumbs=[Thumb(jpg[3], "img/g.jpg", 0.75)],
                matched_true="known-9", majority_true="barn owl", purity=0.8),
        section(4, novel=True, train=0, predicted=0),
        section(5, novel=True, train=7, predicted=0),
    )
    return GalleryPage(title="Discovered classes", run="runs/demo", predictions="runs/demo/predictions.parquet",
                       metrics={"all": 0.318, "known": 0.6125, "novel": None}, sections=sections)


def section_tags(text: str) -> list[str]:
    return re.findall(r'<section class="cls[^"]*"[^>]*>', text)


def attribute(tag: str, name: str) -> str | None:
    found = re.search(f' {name}="([^"]*)"', tag)
    return None if found is None else html.unescape(found.group(1))


def test_section_order_puts_novel_classes_first_largest_first_ties_by_index():
    sections = [section(0, novel=False, train=5, predicted=1), section(1, novel=False, train=9, predicted=1),
                section(2, novel=True, train=3, predicted=1), section(3, novel=True, train=8, predicted=1),
                section(4, novel=True, train=3, predicted=1)]
    assert [s.index for s in section_order(sections)] == [3, 2, 4, 1, 0]


def test_the_page_shows_its_sections_in_section_order(page, tmp_path):
    text = render_gallery(page, tmp_path).read_text()
    shown = [int(attribute(tag, "data-index")) for tag in section_tags(text)]
    assert shown == [3, 2, 5, 1, 0]


def test_a_hostile_class_name_is_escaped_in_text_and_attributes(page, tmp_path):
    text = render_gallery(page, tmp_path).read_text()
    assert "<script>" not in text
    assert html.escape(HOSTILE) in text
    [tag] = [t for t in section_tags(text) if attribute(t, "data-index") == "2"]
    assert attribute(tag, "data-name") == HOSTILE


def test_classes_without_images_are_listed_not_hidden(page, tmp_path):
    text = render_gallery(page, tmp_path).read_text()
    empty = text[text.index('<section id="empty">'):]
    assert re.findall(r'<li data-index="(\d+)">', empty) == ["4"]
    assert 'id="cls-4"' not in text and 'href="#empty"' in text


def test_a_trained_class_with_no_predictions_keeps_its_section_and_says_so(page, tmp_path):
    text = render_gallery(page, tmp_path).read_text()
    body = text[text.index('id="cls-5"'):]
    assert "no predictions" in body[:body.index("</section>")]


def test_section_attributes_equal_the_inputs(page, tmp_path):
    text = render_gallery(page, tmp_path).read_text()
    by_index = {s.index: s for s in page.sections}
    for tag in section_tags(text):
        s = by_index[int(attribute(tag, "data-index"))]
        assert attribute(tag, "data-key") == s.key and attribute(tag, "data-name") == s.name
        assert attribute(tag, "data-novel") == ("1" if s.is_novel else "0")
        assert int(attribute(tag, "data-train-count")) == s.train_count
        assert int(attribute(tag, "data-predicted-count")) == s.predicted_count
        assert attribute(tag, "data-matched") == s.matched_true
        assert attribute(tag, "data-majority") == s.majority_true
        assert attribute(tag, "data-purity") == (None if s.purity is None else repr(s.purity))


def test_a_thumbnail_path_is_percent_encoded_so_odd_file_names_still_load(tmp_path):
    odd = section(0, novel=True, train=1, predicted=1, thumbs=[Thumb("thumbs/owl #1.jpg", "owl #1", 0.5)])
    page = GalleryPage(title="t", run="r", metrics={}, predictions="p", sections=(odd,))
    assert 'src="thumbs/owl%20%231.jpg" alt="owl #1"' in render_gallery(page, tmp_path).read_text()


def test_metrics_are_shown_as_percentages_with_their_exact_values_attached(page, tmp_path):
    text = render_gallery(page, tmp_path).read_text()
    assert '<li data-metric="all" data-value="0.318">all <b>31.8 %</b></li>' in text
    assert '<li data-metric="novel" data-value="">novel <b>—</b></li>' in text


def test_in_a_browser_every_image_loads_and_every_number_equals_the_input(page, tmp_path):
    require_browser()
    seen = read_gallery(render_gallery(page, tmp_path))
    assert seen["broken_images"] == []
    assert seen["image_count"] == sum(len(s.confident) + len(s.uncertain) for s in page.sections) == 7
    assert seen["title"] == page.title
    assert seen["metrics"] == page.metrics
    assert seen["empty"] == [4]
    expected = [{"index": s.index, "key": s.key, "name": s.name, "novel": s.is_novel, "train_count": s.train_count,
                 "predicted_count": s.predicted_count, "matched": s.matched_true, "majority": s.majority_true,
                 "purity": s.purity,
                 "images": [{"src": t.src, "alt": t.source_id, "confidence": t.confidence}
                            for t in s.confident + s.uncertain]}
                for s in section_order(page.sections) if s.index != 4]
    assert seen["sections"] == expected


def test_in_a_browser_a_missing_thumbnail_is_reported_broken(page, tmp_path):
    require_browser()
    (tmp_path / "thumbs" / "1.png").unlink()
    seen = read_gallery(render_gallery(page, tmp_path))
    assert seen["broken_images"] == ["thumbs/1.png"]
