"""The static gallery page of discovered classes (issue 16): one HTML file that opens from disk.

:func:`render_gallery` writes ``<out_dir>/index.html`` from a :class:`GalleryPage`: a header (title, run, where
the predictions came from, the metrics as percentages), a table of contents, then one section per class in
:func:`section_order` (novel classes first, largest first) with its counts, its Hungarian-matched true class and
purity where ground truth exists, its nearest known classes, and a row of its most and least confident
thumbnails. Classes with neither training images nor predictions are listed, not hidden, at the end.

The page needs no server, no script and nothing from the network: the CSS is inline and every thumbnail is a
file beside the page (``Thumb.src`` is relative to ``out_dir``). Every text and attribute value is HTML-escaped
(class names come from users). The numbers are also in ``data-*`` attributes (floats as their ``repr``), so a
test reads back exactly what the page was given.

Pure rendering: the caller picks the thumbnails, writes their files and computes the counts.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from html import escape
from pathlib import Path
from urllib.parse import quote

INDEX_FILE = "index.html"

CSS = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 1.5em; color: #222; }
header code, .key { color: #555; }
.metrics { display: flex; gap: 1.5em; list-style: none; padding: 0; font-size: 1.2em; }
.toc { columns: 4 14em; font-size: 0.9em; }
section.cls { border-top: 1px solid #ccc; padding: 0.5em 0; }
section.cls.novel h2::before { content: "novel · "; color: #b35900; }
.row { display: flex; flex-wrap: wrap; gap: 6px; }
figure { margin: 0; width: 128px; font-size: 0.8em; }
figure img { width: 128px; height: 128px; object-fit: cover; display: block; background: #eee; }
.uncertain figure img { outline: 2px solid #d33; }
.none { color: #999; }
"""


@dataclass(frozen=True)
class Thumb:
    """One example image of a class.

    ``src`` is the thumbnail's path relative to the page's folder (e.g. ``thumbs/3f2a.jpg``; percent-encoded in
    the page, so a ``#`` or a space in a file name still loads); ``confidence`` the cosine of the image's feature
    to its predicted class's prototype, in ``[-1, 1]``.
    """

    src: str
    source_id: str
    confidence: float
    true_name: str | None = None


@dataclass(frozen=True)
class ClassSection:
    """One class of the model: known ``0..Ks-1`` or novel ``Ks..K-1``.

    ``key`` is stable (the known class's name, or ``novel-07`` for novel cluster 7); ``name`` is what the user
    calls it (``names.yaml``), else the key. ``train_count`` counts labelled training images of a known class or
    the training pseudo-labels of a novel one; ``predicted_count`` the prediction rows assigned to it.
    ``confident`` holds its most confident examples (best first), ``uncertain`` a few least confident ones,
    ``nearest_known`` (known class name, cosine) most similar first. With ground truth only: ``matched_true``
    (the true class one Hungarian matching over all classes gives it, as in the metrics), ``majority_true`` (the
    true class most of its rows have) and ``purity`` (the fraction of its rows of ``majority_true``). A cluster
    whose majority is not its match holds part of a class matched elsewhere (a big class split in two).
    """

    index: int
    key: str
    name: str
    is_novel: bool
    train_count: int
    predicted_count: int
    confident: tuple[Thumb, ...]
    uncertain: tuple[Thumb, ...]
    nearest_known: tuple[tuple[str, float], ...]
    matched_true: str | None = None
    majority_true: str | None = None
    purity: float | None = None


@dataclass(frozen=True)
class GalleryPage:
    """Everything the page shows. ``metrics`` are fractions (e.g. ``{"all": 0.318}``), ``None`` where unknown."""

    title: str
    run: str
    metrics: dict[str, float | None]
    predictions: str
    sections: tuple[ClassSection, ...]


def section_order(sections: Iterable[ClassSection]) -> list[ClassSection]:
    """Novel classes first, then known; within each by ``train_count`` (largest first), then by index."""
    return sorted(sections, key=lambda s: (not s.is_novel, -s.train_count, s.index))


def render_gallery(page: GalleryPage, out_dir: str | Path) -> Path:
    """Write ``out_dir/index.html`` (``out_dir`` created if missing) and return its path."""
    shown = [s for s in section_order(page.sections) if s.train_count > 0 or s.predicted_count > 0]
    empty = sorted((s for s in page.sections if s.train_count == 0 and s.predicted_count == 0),
                   key=lambda s: s.index)
    html = "\n".join([
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{escape(page.title)}</title>",
        f"<style>{CSS}</style></head><body>",
        _header(page),
        _contents(shown, empty),
        *(_section(s) for s in shown),
        _empty_classes(empty),
        "</body></html>",
        "",
    ])
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / INDEX_FILE
    path.write_text(html, encoding="utf-8")
    return path


# ---------------------------------------------------------------------------------------------- pieces


def _attrs(**values: object) -> str:
    """`` name="value"`` pairs (``data_x`` → ``data-x``, ``class_`` → ``class``), escaped; ``None`` left out."""
    return "".join(f' {k.rstrip("_").replace("_", "-")}="{escape(str(v))}"'
                   for k, v in values.items() if v is not None)


def _percent(fraction: float | None) -> str:
    return "—" if fraction is None else f"{100 * fraction:.1f} %"


def _header(page: GalleryPage) -> str:
    metrics = "".join(
        f'<li{_attrs(data_metric=key, data_value="" if value is None else repr(float(value)))}>'
        f"{escape(key)} <b>{_percent(value)}</b></li>"
        for key, value in page.metrics.items())
    return (f"<header><h1>{escape(page.title)}</h1>"
            f"<p>run <code>{escape(page.run)}</code> · predictions <code>{escape(page.predictions)}</code></p>"
            + (f'<ul class="metrics">{metrics}</ul>' if metrics else '<p class="none">no metrics</p>')
            + "</header>")


def _contents(shown: list[ClassSection], empty: list[ClassSection]) -> str:
    links = [f'<li><a href="#cls-{s.index}">{escape(s.name)}</a> ({s.predicted_count:,})</li>' for s in shown]
    if empty:
        links.append(f'<li><a href="#empty">classes with no images ({len(empty)})</a></li>')
    return f'<nav><h2>Classes</h2><ol class="toc">{"".join(links)}</ol></nav>'


def _section(s: ClassSection) -> str:
    attrs = _attrs(class_="cls novel" if s.is_novel else "cls", id=f"cls-{s.index}", data_index=s.index,
                   data_key=s.key, data_name=s.name, data_novel=int(s.is_novel), data_train_count=s.train_count,
                   data_predicted_count=s.predicted_count, data_matched=s.matched_true,
                   data_majority=s.majority_true, data_purity=None if s.purity is None else repr(float(s.purity)))
    key = f' <span class="key">{escape(s.key)}</span>' if s.key != s.name else ""
    train = "training pseudo-labels" if s.is_novel else "labelled training images"
    facts = [f"{s.train_count:,} {train}", f"{s.predicted_count:,} predicted"]
    if s.matched_true is not None:
        facts.append(f"matches <b>{escape(s.matched_true)}</b>")
    if s.majority_true is not None:
        facts.append(f"mostly <b>{escape(s.majority_true)}</b>"
                     + (f" (purity {_percent(s.purity)})" if s.purity is not None else ""))
    nearest = ", ".join(f"{escape(name)} {cosine:.2f}" for name, cosine in s.nearest_known)
    parts = [f"<section{attrs}>", f"<h2>{escape(s.name)}{key}</h2>", f"<p>{' · '.join(facts)}</p>"]
    if nearest:
        parts.append(f'<p class="nearest">nearest known: {nearest}</p>')
    if s.predicted_count == 0:
        parts.append('<p class="none">no predictions</p>')
    parts += [_thumb_row("most confident", "confident", s.confident),
              _thumb_row("least confident", "uncertain", s.uncertain), "</section>"]
    return "\n".join(p for p in parts if p)


def _thumb_row(title: str, kind: str, thumbs: tuple[Thumb, ...]) -> str:
    if not thumbs:
        return ""
    figures = []
    for t in thumbs:
        img = _attrs(src=quote(t.src), alt=t.source_id, title=t.source_id, loading="eager",
                     data_confidence=repr(float(t.confidence)))
        true = f" · true: {escape(t.true_name)}" if t.true_name is not None else ""
        figures.append(f"<figure><img{img}><figcaption>{t.confidence:.3f}{true}</figcaption></figure>")
    return f'<h3>{title}</h3><div class="row {kind}">{"".join(figures)}</div>'


def _empty_classes(empty: list[ClassSection]) -> str:
    if not empty:
        return ""
    items = "".join(f"<li{_attrs(data_index=s.index)}>{escape(s.name)}</li>" for s in empty)
    return (f'<section id="empty"><h2>Classes with no images</h2>'
            f'<p class="none">no training images and no predictions</p><ul>{items}</ul></section>')
