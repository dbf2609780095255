"""A real headless Chromium for tests of the pages we write (test helper, not a test module).

:func:`read_gallery` opens a gallery page from disk the way a user does (``file://``, no server) and reads back
what the browser shows: the numbers from the page's ``data-*`` attributes and every image that failed to load.
Tests call :func:`require_browser` first; it skips them where Playwright or a Chromium is missing
(``make test`` installs ``chromium-headless-shell`` where it can).
"""

from __future__ import annotations

import os
import shutil
from importlib.util import find_spec
from pathlib import Path

import pytest

CANDIDATES = ("chromium-headless-shell", "chromium", "chromium-browser", "google-chrome")
DEBIAN_HEADLESS_SHELL = Path("/usr/lib/chromium/chromium-headless-shell")

# Runs in the page: raw attribute strings, parsed in Python below.
READ_DOM = """() => {
  const attr = (el, name) => el.getAttribute(name);
  const images = el => [...el.querySelectorAll("img")].map(img => ({
    src: attr(img, "src"), alt: attr(img, "alt"), confidence: attr(img, "data-confidence")}));
  return {
    title: document.title,
    metrics: [...document.querySelectorAll("[data-metric]")].map(el => [attr(el, "data-metric"),
                                                                       attr(el, "data-value")]),
    sections: [...document.querySelectorAll("section.cls")].map(el => ({
      index: attr(el, "data-index"), key: attr(el, "data-key"), name: attr(el, "data-name"),
      novel: attr(el, "data-novel"), train_count: attr(el, "data-train-count"),
      predicted_count: attr(el, "data-predicted-count"), matched: attr(el, "data-matched"),
      majority: attr(el, "data-majority"), purity: attr(el, "data-purity"), images: images(el)})),
    empty: [...document.querySelectorAll("#empty li[data-index]")].map(el => attr(el, "data-index")),
    broken_images: [...document.images].filter(img => !img.complete || img.naturalWidth === 0)
                                       .map(img => attr(img, "src")),
    image_count: document.images.length,
  };
}"""


def browser_executable() -> str | None:
    """The Chromium to drive: ``$NCDLR_BROWSER``, else the first of :data:`CANDIDATES` on ``PATH``, else
    Debian's ``/usr/lib/chromium/chromium-headless-shell``; ``None`` if there is none."""
    for name in (os.environ.get("NCDLR_BROWSER"), *CANDIDATES):
        found = shutil.which(name) if name else None
        if found:
            return found
    return str(DEBIAN_HEADLESS_SHELL) if os.access(DEBIAN_HEADLESS_SHELL, os.X_OK) else None


def require_browser() -> None:
    """Skip the calling test unless Playwright imports and a Chromium is found."""
    if find_spec("playwright") is None:
        pytest.skip("playwright is not installed (it is in requirements.lock: make setup)")
    if browser_executable() is None:
        pytest.skip("no Chromium found: apt-get install chromium-headless-shell, or set NCDLR_BROWSER")


def read_gallery(index_html: Path) -> dict:
    """Open ``index_html`` in headless Chromium, wait for ``load`` (every image fetched or failed) and read it.

    Returns ``{"title", "metrics": {key: float | None}, "sections": [{"index", "key", "name", "novel",
    "train_count", "predicted_count", "matched", "majority", "purity", "images": [{"src", "alt", "confidence"}]}],
    "empty": [index], "broken_images": [src], "image_count"}``, sections in page order; ``matched``,
    ``majority`` and ``purity`` are ``None`` where the page has no such attribute. The browser lives only for this call.
    """
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=browser_executable(), args=["--no-sandbox"])
        try:
            page = browser.new_page()
            page.goto(Path(index_html).resolve().as_uri(), wait_until="load")
            raw = page.evaluate(READ_DOM)
        finally:
            browser.close()
    return {
        "title": raw["title"],
        "metrics": {key: float(value) if value else None for key, value in raw["metrics"]},
        "sections": [{
            "index": int(s["index"]), "key": s["key"], "name": s["name"], "novel": s["novel"] == "1",
            "train_count": int(s["train_count"]), "predicted_count": int(s["predicted_count"]),
            "matched": s["matched"], "majority": s["majority"], "purity": None if s["purity"] is None else float(s["purity"]),
            "images": [{**img, "confidence": float(img["confidence"])} for img in s["images"]],
        } for s in raw["sections"]],
        "empty": [int(i) for i in raw["empty"]],
        "broken_images": raw["broken_images"],
        "image_count": raw["image_count"],
    }
