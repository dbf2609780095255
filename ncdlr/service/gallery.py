"""``ncdlr gallery``: a static page of every class a run knows or discovered, to look at and name the clusters.

:func:`build_gallery` gathers, per class of the run's model: its training count (known classes: labelled images;
novel clusters: the model's pseudo-labels of the novel training split, i.e. how many unlabelled training images
it assigns there), how many rows of the predictions it received, its most and least confident examples (their
thumbnails written beside the page), its nearest known classes (cosine of the cluster's mean embedding to each
known prototype), and — where the predictions carry true labels — the Hungarian-matched true class (as in the
metrics), the true class most of its rows have and that share (its purity).
:func:`ncdlr.service.gallery_page.render_gallery` writes the page.

Predictions come from ``--predictions`` (a folder of ``ncdlr predict``) or, by default, from a ``predict`` of the
run's own test split into ``OUT/predictions``. The pseudo-label counts come from a ``predict`` of the novel
training split kept in ``RUN/novel-predictions`` (made once per checkpoint; ``make demo`` makes it while its data
is served, so later galleries of the demo run need only the images they show). Thumbnails are read from where those predictions came from: the
folder of images, the prepared dataset, or — for a feature-table run — the dataset the table was embedded from.
"""

from __future__ import annotations

import hashlib
import io
import logging
from pathlib import Path

import numpy as np
import torch

from .config import ConfigError
from .gallery_page import INDEX_FILE, ClassSection, GalleryPage, Thumb, render_gallery
from .trained_run import TrainedRun, open_run

log = logging.getLogger(__name__)

THUMB_SIDE = 160  #: longest side of a thumbnail, px
NOVEL_PREDICTIONS = "novel-predictions"  #: RUN/<this>: the model's predictions of the novel training split


def _thumb_name(source_id: str) -> str:
    return f"thumbs/{hashlib.sha1(source_id.encode()).hexdigest()[:16]}.jpg"


def write_thumbnail(data: bytes, path: Path, side: int = THUMB_SIDE) -> bool:
    """Decode ``data`` and save a JPEG no larger than ``side`` px at ``path``; False when it is not an image."""
    from ncdlr.data.transforms import decode_rgb

    image = decode_rgb(data)
    if image is None:
        return False
    image.thumbnail((side, side))
    path.parent.mkdir(parents=True, exist_ok=True)
    out = io.BytesIO()
    image.save(out, format="JPEG", quality=85)
    path.write_bytes(out.getvalue())
    return True


def _image_source(meta: dict, endpoint_url: str | None) -> tuple[str, str]:
    """``(kind, uri)`` where the images of the predictions' rows can be read: ``("images", folder)``,
    ``("dataset", uri)`` (for a feature table: the dataset it was embedded from) or ``("", "")`` when nothing
    records it."""
    if meta.get("kind") in ("images", "dataset"):
        return meta["kind"], meta["data"]
    from ncdlr.data.features import read_metadata

    source = read_metadata(meta["data"], endpoint_url=endpoint_url).get("dataset", "")
    return ("dataset", source) if source else ("", "")


def _fetch_images(kind: str, uri: str, ids: list[str], endpoint_url: str | None) -> dict[str, bytes]:
    if kind == "images":
        from ncdlr.data.image_files import read_image_bytes

        return {i: read_image_bytes(uri, i, endpoint_url) for i in ids}
    if kind == "dataset":
        from ncdlr.data.shards import images_by_id

        return images_by_id(uri, ids, endpoint_url=endpoint_url)
    return {}


def pseudo_label_counts(preds: np.ndarray, num_classes: int) -> np.ndarray:
    """``[K]`` rows assigned to each class by the predictions ``preds [N]``."""
    return np.bincount(np.asarray(preds, dtype=np.int64), minlength=num_classes)


def majority_class(labels: np.ndarray) -> tuple[int | None, float | None]:
    """``(the most common true class, its share)`` of a cluster's rows ``labels [n]`` (NaN = unlabelled rows,
    left out); ``(None, None)`` when none is labelled. Ties go to the smaller class id."""
    known = labels[~np.isnan(labels)].astype(np.int64)
    if not len(known):
        return None, None
    counts = np.bincount(known)
    return int(counts.argmax()), float(counts.max() / len(known))


def nearest_known(mean_logits: np.ndarray, known_names: list[str], exclude: int | None, top: int = 3
                  ) -> tuple[tuple[str, float], ...]:
    """The ``top`` known classes of largest ``mean_logits [Ks]`` (the cluster's mean cosine to each known
    prototype, which ranks them as the mean embedding does), ``exclude`` left out."""
    order = [int(k) for k in np.argsort(-mean_logits, kind="stable") if k != exclude][:top]
    return tuple((known_names[k], float(mean_logits[k])) for k in order)


def build_gallery(run_dir: str, out_dir: str, *, predictions: str = "", checkpoint: str = "", per_class: int = 8,
                  uncertain: int = 3, endpoint_url: str | None = None, progress: bool = True) -> Path:
    """Write ``out_dir/index.html`` and ``out_dir/thumbs/`` for the run (see the module docstring); returns the page.

    Needs Ray started when it predicts itself (no ``predictions``) or the run trained on images.
    """
    from ncdlr.data.predictions import read_predictions
    from ncdlr.metrics import hungarian_mapping

    run = open_run(run_dir, checkpoint)
    out = Path(out_dir)
    if not predictions:
        predictions = _own_predictions(run, out / "predictions", "test", True, endpoint_url, progress)
    table, meta = read_predictions(predictions, endpoint_url=endpoint_url)
    if meta.get("num_classes") != run.num_classes or meta.get("num_known") != run.num_known:
        raise ConfigError(f"{predictions} holds predictions over {meta.get('num_known')} known / "
                         f"{meta.get('num_classes')} classes, but run {run_dir} has {run.num_known} / {run.num_classes}")
    # the novel split's predictions stay with the run: later galleries need no access to the training data
    train_novel = _own_predictions(run, run.run_dir / NOVEL_PREDICTIONS, "novel", False, endpoint_url, progress)
    novel_counts = pseudo_label_counts(read_predictions(train_novel, ["pred"])[0].column("pred").to_numpy(),
                                       run.num_classes)

    pred = table.column("pred").to_numpy()
    confidence = table.column("confidence").to_numpy()
    ids = table.column("source_id").to_pylist()
    labels = table.column("label").to_numpy(zero_copy_only=False)
    has_labels = table.column("label").null_count < len(table)
    mapping = hungarian_mapping(labels[~np.isnan(labels)].astype(np.int64),
                                pred[~np.isnan(labels)]) if has_labels else {}
    mean_logits = _mean_known_logits(run, table, pred)

    names, keys = run.names(), run.keys()
    chosen: dict[int, tuple[list[int], list[int]]] = {}
    for c in range(run.num_classes):
        rows = np.flatnonzero(pred == c)
        ranked = rows[np.argsort(-confidence[rows], kind="stable")]
        best = ranked[:per_class].tolist()
        worst = [i for i in ranked[::-1][:uncertain].tolist() if i not in best][::-1]
        chosen[c] = (best, worst)
    wanted = sorted({ids[i] for best, worst in chosen.values() for i in best + worst})
    kind, source = _image_source(meta, endpoint_url)
    images = _fetch_images(kind, source, wanted, endpoint_url)
    written = {i for i, data_bytes in images.items() if write_thumbnail(data_bytes, out / _thumb_name(i))}
    if wanted and not written:
        log.warning("gallery: no thumbnails (the images of %s cannot be read from %r)", predictions, source or "anywhere")

    def thumbs(rows: list[int]) -> tuple[Thumb, ...]:
        true_name = (lambda i: run.class_names[int(labels[i])] if has_labels and not np.isnan(labels[i]) else None)
        return tuple(Thumb(_thumb_name(ids[i]), ids[i], float(confidence[i]), true_name(i))
                     for i in rows if ids[i] in written)

    sections = []
    for c in range(run.num_classes):
        rows = pred == c
        matched = mapping.get(c)
        majority, purity = majority_class(labels[rows]) if has_labels else (None, None)
        sections.append(ClassSection(
            index=c, key=keys[c], name=names[c], is_novel=c >= run.num_known,
            train_count=int(novel_counts[c] if c >= run.num_known else run.train_counts[c]),
            predicted_count=int(rows.sum()), confident=thumbs(chosen[c][0]), uncertain=thumbs(chosen[c][1]),
            nearest_known=nearest_known(mean_logits[c], names[:run.num_known], c if c < run.num_known else None)
            if mean_logits is not None and rows.any() else (),
            matched_true=run.class_names[matched] if matched is not None else None,
            majority_true=run.class_names[majority] if majority is not None else None, purity=purity))
    page = GalleryPage(title=f"ncdlr gallery — {run.run_dir.name}", run=str(run.run_dir), metrics=_metrics(run),
                       predictions=predictions, sections=tuple(sections))
    return render_gallery(page, out)


def _own_predictions(run: TrainedRun, folder: Path, split: str, embeddings: bool, endpoint_url: str | None,
                     progress: bool) -> str:
    """The gallery's own predict of ``split`` of the run's data into ``folder``: kept when a
    finished one of this checkpoint is there, resumed when unfinished, redone when made from another checkpoint
    (the run trained again in the same directory). Returns the folder."""
    import shutil

    from ncdlr.data.predictions import read_done, read_metadata

    from .predict import predict_run

    meta = (read_metadata(str(folder)) or read_done(str(folder)) or {}) if folder.is_dir() else {}
    if meta and (meta.get("checkpoint") != run.checkpoint or meta.get("run") != str(run.run_dir.absolute())):
        log.info("gallery: replacing %s (made from checkpoint %s)", folder, meta.get("checkpoint"))
        shutil.rmtree(folder)
    if read_done(str(folder)) is None:
        predict_run(str(run.run_dir), run.cfg.data.features or run.cfg.data.uri, str(folder), split=split,
                    checkpoint=run.checkpoint, embeddings=embeddings, endpoint_url=endpoint_url, progress=progress)
    return str(folder)


def _mean_known_logits(run: TrainedRun, table, pred: np.ndarray) -> np.ndarray | None:
    """``[K, Ks]``: per class, the mean cosine of its rows' embeddings to each known prototype (None without
    embeddings in the predictions)."""
    if "embedding" not in table.column_names:
        return None
    from .trained_run import table_model

    z = torch.as_tensor(np.stack(table.column("embedding").to_numpy(zero_copy_only=False)).astype(np.float32))
    prototypes = table_model(run).class_prototypes().detach()[:, :run.num_known]
    logits = (z @ prototypes).numpy()
    out = np.zeros((run.num_classes, run.num_known), np.float32)
    for c in range(run.num_classes):
        rows = pred == c
        if rows.any():
            out[c] = logits[rows].mean(0)
    return out


def _metrics(run: TrainedRun) -> dict[str, float | None]:
    """All / known / novel class-mean accuracy from the run's ``metrics.json`` (empty before ``evaluate``)."""
    from .report import METRICS_FILE, load_metrics

    if not (run.run_dir / METRICS_FILE).is_file():
        return {}
    metrics = load_metrics(run.run_dir)
    return {key: metrics.get(key) for key in ("all", "known", "novel") if key in metrics}


__all__ = ["INDEX_FILE", "build_gallery"]
