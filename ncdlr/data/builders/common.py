"""What every builder shares: seeded randomness, source-image checks, the class table, and the final write.

A builder's ``plan(config)`` turns a source dataset into a ``Plan``: the ``ClassInfo``s plus a list of
``SourceImage`` (a file on disk with its label and split) or of ready ``ImageRecord``s; its ``build``
passes the plan to ``write_plan``, which streams the records into ``ncdlr.data.shards.write_dataset``.

Bad input, decided once for all builders:
- metadata that contradicts itself (an annotation naming a category or image that does not exist, an image
  with two labels, a missing key) → ``SourceFormatError`` naming the file and the id;
- an image file listed by the metadata but absent on disk → ``SourceFormatError`` naming the path
  (a dataset with silently missing images would have the wrong long-tail profile);
- an image file that exists but cannot be decoded → skipped, counted and reported (the manifest's
  ``extra["skipped_images"]``, with each ``source_id`` and reason), because real dumps do contain a few
  broken files and one of them should not cost a multi-hour build.
"""

from __future__ import annotations

import json
import logging
import math
import os
import sys
import zlib
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from ncdlr.data import shards
from ncdlr.data.images import DECODE_ERRORS, clipart_to_rgb, decode_problem, encode
from ncdlr.data.longtail import long_tail_counts, split_known_novel
from ncdlr.data.manifest import DatasetInfo, Manifest
from ncdlr.data.records import SPLITS, ClassInfo, ImageRecord

log = logging.getLogger(__name__)

TRAIN_SPLITS = ("known", "novel")
MAX_LISTED_SKIPS = 1000  # skipped images listed by id in the manifest; the count is always exact


class SourceFormatError(ValueError):
    """The source dataset on disk is malformed; the message names the file, id or path at fault."""


def seeded_rng(seed: int, *tags: str | int) -> np.random.Generator:
    """An independent NumPy generator for one purpose of a build, e.g. ``seeded_rng(0, "subsample", 7)``.

    Streams are keyed by ``(seed, *tags)`` (strings through CRC-32, stable across processes, unlike
    ``hash``), so changing how one class is sampled never shifts another class's draw.
    """
    if seed < 0:
        raise ValueError(f"seed must be >= 0, got {seed}")
    keys = [seed] + [zlib.crc32(tag.encode()) if isinstance(tag, str) else int(tag) for tag in tags]
    return np.random.default_rng(np.random.SeedSequence(keys))


def progress_bar(total: int | None, desc: str, enabled: bool, unit: str = "img") -> tqdm:
    """A tqdm bar on stderr (updates at most once a second) — silent when ``enabled`` is False."""
    return tqdm(total=total, desc=desc, unit=unit, disable=not enabled, mininterval=1.0, file=sys.stderr)


@dataclass(frozen=True)
class SourceImage:
    """One image file of the source dataset, already assigned its final label and split."""

    path: Path  # the encoded image on disk
    label: int  # known 0..Ks-1, novel Ks..K-1
    split: str  # "known" | "novel" | "val" | "test"
    class_name: str
    source_id: str  # stable id: the path relative to the dataset root


@dataclass(frozen=True)
class SkippedImage:
    """A source image left out of the prepared dataset, and why (e.g. ``"OSError: image file is truncated"``)."""

    source_id: str
    reason: str


def require_files(items: Sequence[SourceImage], listed_in: str) -> None:
    """Raise ``SourceFormatError`` naming the first missing path (and how many are missing) if any is."""
    missing = [item.path for item in items if not item.path.is_file()]
    if missing:
        raise SourceFormatError(
            f"{len(missing)} image file(s) listed in {listed_in} do not exist, e.g. {missing[0]}"
        )


def _problem_of(item: SourceImage) -> str | None:
    try:
        data = item.path.read_bytes()
    except FileNotFoundError as exc:
        raise SourceFormatError(f"image file {item.path} does not exist (source_id {item.source_id})") from exc
    return decode_problem(data)


def check_decodable(
    items: Sequence[SourceImage], *, progress: bool = True, desc: str = "checking images", workers: int | None = None
) -> tuple[list[SourceImage], list[SkippedImage]]:
    """Split ``items`` into the decodable ones (order kept) and the skipped ones.

    Reads and decodes every file (``ncdlr.data.images.decode_problem``) on a thread pool — PIL releases the
    GIL while decoding. A missing file raises ``SourceFormatError`` naming it.
    """
    workers = workers or min(8, os.cpu_count() or 1)
    kept: list[SourceImage] = []
    skipped: list[SkippedImage] = []
    with ThreadPoolExecutor(workers) as pool, progress_bar(len(items), desc, progress) as bar:
        for item, problem in zip(items, pool.map(_problem_of, items)):
            if problem is None:
                kept.append(item)
            else:
                log.warning("skipping undecodable image %s (%s): %s", item.source_id, item.path, problem)
                skipped.append(SkippedImage(item.source_id, problem))
            bar.update()
    return kept, skipped


def take_decodable(
    candidates: Sequence[SourceImage], count: int, *, verify: bool = True
) -> tuple[list[SourceImage], list[SkippedImage]]:
    """The first ``count`` decodable images of ``candidates`` in the given (already shuffled) order.

    Only as many files as needed are decoded, so a long-tail subsample keeps its exact size when a few
    source files are broken. Fewer than ``count`` come back only when the candidates run out.
    """
    taken: list[SourceImage] = []
    skipped: list[SkippedImage] = []
    start = 0
    while len(taken) < count and start < len(candidates):
        chunk = candidates[start : start + count - len(taken)]
        start += len(chunk)
        if verify:
            good, bad = check_decodable(chunk, progress=False)
        else:
            good, bad = list(chunk), []
        taken.extend(good)
        skipped.extend(bad)
    return taken, skipped


def check_styles(styles: Sequence[str], known: Sequence[str]) -> None:
    """``ValueError`` unless ``styles`` is a non-empty list of distinct names out of ``known``."""
    if not styles or any(s not in known for s in styles) or len(set(styles)) != len(styles):
        raise ValueError(f"styles must be distinct names out of {tuple(known)}, got {list(styles)}")


def read_json_index(index: Path, package: str) -> Any:
    """The parsed JSON of a package's index file; ``SourceFormatError`` naming it when it is missing (not a
    ``package`` package) or not valid JSON."""
    try:
        return json.loads(index.read_text())
    except FileNotFoundError as exc:
        raise SourceFormatError(f"{index} does not exist: not {package} package") from exc
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise SourceFormatError(f"{index} is not valid JSON: {exc}") from exc


def render(svg: bytes, size: int) -> bytes:
    """An SVG's drawing as an opaque, content-cropped PNG: rendered by resvg on a transparent ``size``-px square,
    cropped to its drawn pixels and flattened onto white. Raises ``ValueError`` for an SVG resvg cannot render or
    one that draws nothing, and the ``DECODE_ERRORS`` for what resvg returns but Pillow cannot read."""
    import resvg_py  # the renderer is only needed to prepare the icon sets

    try:
        text = svg.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"not UTF-8 text: {exc}") from exc
    png = bytes(resvg_py.svg_to_bytes(svg_string=text, width=size, height=size))
    return encode(clipart_to_rgb(png), "PNG")


def check_render_size(size: int) -> None:
    """Refuse an SVG canvas too small to draw an icon on (``ValueError``), before any drawing is rendered."""
    if size < 8:
        raise ValueError(f"render_size must be at least 8 pixels, got {size}")


def convert_svg(path: Path, size: int, listed_in: str) -> bytes | str:
    """The drawing at ``path`` as a PNG (:func:`render`), or, as a ``str``, why it cannot be one (for
    :func:`convert_styled`). A missing file is a ``SourceFormatError`` naming it and the index (``listed_in``)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError as exc:
        raise SourceFormatError(f"drawing {path} is listed in {listed_in} but does not exist") from exc
    try:
        return render(data, size)
    except (ValueError, *DECODE_ERRORS) as exc:
        return f"{type(exc).__name__}: {exc}"


@dataclass
class StyledDrawings:
    """What :func:`convert_styled` made of every item's drawings: ``drawings[item][style]`` (encoded bytes) for the
    items whose every style converted, the drawings skipped (with their reasons), and ``by_class`` (class name → its
    items, in the given order)."""

    drawings: dict[Any, dict[str, bytes]]
    skipped: list[SkippedImage]
    by_class: dict[str, list[Any]]


def convert_styled(items: Sequence[Any], styles: Sequence[str], convert: Callable[[Any, str], bytes | str],
                   source_id: Callable[[Any, str], str], what: str, *, progress: bool = True) -> StyledDrawings:
    """Convert each of ``items``' drawings, one per style, on a thread pool with a progress bar (``what``):
    ``convert(item, style)`` returns the encoded image or, as a ``str``, why it cannot be one. An item with any
    drawing that failed is left out in every style (so the styles stay paired); its failure is logged and listed
    by ``source_id(item, style)``. Items need a ``class_name`` attribute (``by_class``)."""
    jobs = [(item, style) for item in items for style in styles]
    with ThreadPoolExecutor(min(8, os.cpu_count() or 1)) as pool, progress_bar(len(jobs), what, progress) as bar:
        results = []
        for result in pool.map(lambda job: convert(*job), jobs):
            results.append(result)
            bar.update()
    drawings: dict[Any, dict[str, bytes]] = {}
    skipped: list[SkippedImage] = []
    broken: set[Any] = set()
    for (item, style), result in zip(jobs, results):
        if isinstance(result, str):
            log.warning("skipping %s (and its other styles): %s", source_id(item, style), result)
            skipped.append(SkippedImage(source_id(item, style), result))
            broken.add(item)
        else:
            drawings.setdefault(item, {})[style] = result
    by_class: dict[str, list[Any]] = {}
    for item in items:
        if item not in broken:
            by_class.setdefault(item.class_name, []).append(item)
    return StyledDrawings({k: v for k, v in drawings.items() if k not in broken}, skipped, by_class)


def split_large_classes(by_class: dict[str, list[Any]], min_items: int, seed: int, source: str, unit: str
                        ) -> tuple[list[str], int, dict[str, int]]:
    """Class names in label order for the classes of ``by_class`` with at least ``min_items`` items: sorted by name,
    then known first and novel after by ``split_known_novel(C, seed)``. Returns ``(names, num_known, dropped)``,
    ``dropped`` the smaller classes' sizes; ``SourceFormatError`` naming ``source`` when fewer than 2 remain."""
    dropped = {name: len(items) for name, items in by_class.items() if len(items) < min_items}
    kept = sorted(name for name in by_class if name not in dropped)
    if len(kept) < 2:
        raise SourceFormatError(f"{source}: only {len(kept)} class(es) with >= {min_items} {unit}")
    known, novel = split_known_novel(len(kept), seed)
    return [kept[i] for i in known + novel], len(known), dropped


def class_table(names: Sequence[str], num_known: int, train_labels: Iterable[int]) -> list[ClassInfo]:
    """``ClassInfo`` per label: ``names[label]``, group by ``label < num_known``, train counts from ``train_labels``.

    ``train_labels`` holds the label of every image in the ``known``/``novel`` splits.
    """
    if not 0 < num_known < len(names):
        raise ValueError(f"num_known must be in 1..{len(names) - 1}, got {num_known}")
    counts = Counter(train_labels)
    unknown = set(counts) - set(range(len(names)))
    if unknown:
        raise ValueError(f"train labels {sorted(unknown)[:5]} are outside 0..{len(names) - 1}")
    return [
        ClassInfo(label=label, name=name, group="known" if label < num_known else "novel", train_count=counts[label])
        for label, name in enumerate(names)
    ]


def split_order(items: Sequence[Any], seed: int) -> list[Any]:
    """``items`` grouped by split (known, novel, val, test) and shuffled (seeded) inside each split.

    The shard writer keeps one buffer per split (a shard holds one split), so grouped input keeps only
    one split's rows in memory; the shuffle gives every shard a random mix of classes, so workers that
    read different shards all see every class.
    """
    ordered: list[Any] = []
    for split in SPLITS:
        group = [item for item in items if item.split == split]
        permutation = seeded_rng(seed, "row-order", split).permutation(len(group))
        ordered.extend(group[i] for i in permutation)
    return ordered


def file_records(items: Sequence[SourceImage], *, progress: bool = True, workers: int = 4) -> Iterator[ImageRecord]:
    """``ImageRecord``s with each file's bytes exactly as on disk, read ahead on a few threads, order kept."""
    chunk = 64

    def read(item: SourceImage) -> bytes:
        try:
            return item.path.read_bytes()
        except FileNotFoundError as exc:
            raise SourceFormatError(f"image file {item.path} disappeared during the build") from exc

    with ThreadPoolExecutor(workers) as pool, progress_bar(len(items), "writing shards", progress) as bar:
        for start in range(0, len(items), chunk):
            batch = items[start : start + chunk]
            for item, data in zip(batch, pool.map(read, batch)):
                yield ImageRecord(
                    image=data, label=item.label, split=item.split, class_name=item.class_name, source_id=item.source_id
                )
                bar.update()


def skip_report(skipped: Sequence[SkippedImage]) -> dict[str, Any]:
    """The manifest ``extra["skipped_images"]`` entry: the exact count plus the first ids and reasons."""
    return {
        "count": len(skipped),
        "images": [{"source_id": s.source_id, "reason": s.reason} for s in skipped[:MAX_LISTED_SKIPS]],
    }


def icon_family(name: str, variants: Sequence[str]) -> str:
    """The icon ``name`` redraws: ``name`` with its variant suffixes stripped, repeatedly (``bell`` for
    ``bell-off-outline`` with ``("-outline", "-off")``); a name that is only a suffix stays as it is."""
    while stripped := next((name[: -len(s)] for s in variants if name.endswith(s) and len(name) > len(s)), None):
        name = stripped
    return name


def icon_set_extra(config: Any, families: str, small: dict[str, int], skipped: Sequence[SkippedImage]
                   ) -> dict[str, Any]:
    """The manifest ``extra`` entries every icon set writes (Tabler-LT, Phosphor-LT, MDI-LT): the class-size floor,
    the test rule (``families`` says what one icon family holds), the classes dropped as too small, how the SVGs were
    rendered and the drawings skipped. ``config`` has ``min_icons``, ``min_test``, ``test_fraction`` and
    ``render_size``."""
    return {
        "min_icons": config.min_icons,
        "test_rule": f"max({config.min_test}, round({config.test_fraction} * n)) icon families per class, seeded; "
                     f"{families}",
        "dropped_small_classes": small,
        "image_encoding": f"PNG; SVG rendered by resvg at {config.render_size} px, cropped to content, flattened "
                          "onto white",
        "skipped_images": skip_report(skipped),
    }


@dataclass
class Plan:
    """Everything a build will write, decided before the first byte is written.

    ``rows`` are ``SourceImage``s (files copied byte for byte) or ready ``ImageRecord``s (images the
    builder encoded itself), in the order they will be written.
    """

    classes: list[ClassInfo]
    rows: list[SourceImage] | list[ImageRecord]
    info: DatasetInfo
    skipped: list[SkippedImage] = field(default_factory=list)

    def split_counts(self) -> dict[str, int]:
        return dict(Counter(row.split for row in self.rows))


def natural_imbalance(classes: Sequence[ClassInfo]) -> dict[str, float]:
    """Measured ``R = max / min`` training images per class inside each group (classes with none ignored)."""
    ratios = {}
    for group in ("known", "novel"):
        counts = [c.train_count for c in classes if c.group == group and c.train_count > 0]
        ratios[group] = max(counts) / min(counts) if counts else 0.0
    return ratios


def write_plan(
    plan: Plan,
    out_uri: str,
    *,
    progress: bool = True,
    overwrite: bool = False,
    endpoint_url: str | None = None,
    target_shard_bytes: int = shards.DEFAULT_SHARD_BYTES,
) -> Manifest:
    """Write ``plan`` with ``ncdlr.data.shards.write_dataset`` (manifest last) and return its ``Manifest``.

    ``write_dataset`` re-checks every row against the classes (label range, split vs group, train counts).
    """
    from_files = bool(plan.rows) and isinstance(plan.rows[0], SourceImage)
    # Files are read by file_records, whose bar knows the total; write_dataset's would only count.
    records = file_records(plan.rows, progress=progress) if from_files else plan.rows
    return shards.write_dataset(
        out_uri,
        records,
        plan.classes,
        plan.info,
        target_shard_bytes=target_shard_bytes,
        progress=progress and not from_files,
        overwrite=overwrite,
        endpoint_url=endpoint_url,
    )


def long_tail_targets(num_known: int, num_novel: int, n_max: int, known_ratio: float, novel_ratio: float) -> list[int]:
    """Images to keep per label for a synthetic long tail (method.md §1), in label order.

    Labels inside each half are in the seeded order of ``split_known_novel``, which is also the rank
    order: the first known label is the known head, label ``Ks`` the novel head.
    """
    return long_tail_counts(n_max, num_known, known_ratio) + long_tail_counts(n_max, num_novel, novel_ratio)


def subsample_order(num_candidates: int, seed: int, class_key: str | int) -> np.ndarray:
    """The seeded shuffle inside one class (method.md §1): keep the first ``n_c`` of this order."""
    return seeded_rng(seed, "subsample", class_key).permutation(num_candidates)


def class_hold_out(num_items: int, seed: int, class_name: str, test_fraction: float, min_test: int,
                   unit: str = "images") -> list[tuple[int, bool]]:
    """``(index, is test)`` for each of a class's ``num_items`` items, in the class's seeded order: the first
    ``max(min_test, round(test_fraction · n))`` are held out as test. ``ValueError`` naming the class when that
    leaves no training item (``unit`` names what the items are in the message)."""
    num_test = max(min_test, math.floor(test_fraction * num_items + 0.5))
    if num_test >= num_items:
        raise ValueError(f"class {class_name}: {num_items} {unit} cannot spare {num_test} for test")
    order = subsample_order(num_items, seed, f"test:{class_name}")
    return [(int(index), rank < num_test) for rank, index in enumerate(order)]


def pick_long_tail(source_labels: np.ndarray, order: Sequence[int], targets: Sequence[int],
                   seed: int) -> tuple[list[tuple[int, int]], list[int]]:
    """The training images of an exponential-tail builder: for label ``l`` (source class ``order[l]``), the first
    ``targets[l]`` of the seeded shuffle (:func:`subsample_order`) of that class's rows in ``source_labels [N]``.

    Returns ``[(source row, label)]`` in label order (rows sorted inside a class) and the count kept per label
    (less than the target where the source has too few images).
    """
    picked: list[tuple[int, int]] = []
    got: list[int] = []
    for label, source in enumerate(order):
        candidates = np.flatnonzero(source_labels == source)
        kept = candidates[subsample_order(len(candidates), seed, source)[: targets[label]]]
        got.append(len(kept))
        picked += [(int(i), label) for i in sorted(kept)]
    return picked, got


def long_tail_info(name: str, source: str, seed: int, ratios: tuple[float, float], n_max: int, names: Sequence[str],
                   targets: Sequence[int], got: Sequence[int], **extra: Any) -> DatasetInfo:
    """The manifest's ``DatasetInfo`` of an exponential-tail builder (R^s, R^u = ``ratios``): the profile, the
    classes short of their target, and ``extra`` (e.g. ``source_class_ids``, ``image_encoding``)."""
    return DatasetInfo(
        name=name, source=source, seed=seed,
        imbalance={"known": float(ratios[0]), "novel": float(ratios[1])},
        extra={"n_max": n_max,
               "profile": "floor(n_max * R^(-c/(C_half-1))), rank c = label order inside each half",
               "short_classes": shortfall_report(names, targets, got),
               "skipped_images": {"count": 0, "images": []},
               **extra},
    )


def shortfall_report(names: Sequence[str], wanted: Sequence[int], got: Sequence[int]) -> dict[str, list[int]]:
    """``{name: [wanted, got]}`` for classes with fewer source images than their long-tail target."""
    short = {name: [w, g] for name, w, g in zip(names, wanted, got) if g < w}
    if short:
        log.warning("%d class(es) have fewer images than their long-tail target, e.g. %s",
                    len(short), dict(list(short.items())[:3]))
    return short
