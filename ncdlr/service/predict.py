"""``ncdlr predict``: a trained run applied to new data, written as a prediction table (``ncdlr.data.predictions``).

Three kinds of ``--data``, told apart by what the URI holds:

* a **prepared dataset** (``manifest.json``): the rows of ``split`` (default ``test``; ``all`` for every split),
  with their labels — over the test split this gives exactly ``ncdlr evaluate``'s predictions;
* a **feature table** of the run's kind (what it trained on): its rows as they are, in this process;
* a **folder or ``s3://`` prefix of image files** (JPEG/PNG/WebP, any size): every image under it.

Images go through Ray Data: read tasks decode each image with the run's eval view (resize the short side, centre
crop), and ``map_batches`` hands them to a pool of model actors (``num_actors``, ``threads`` each; ``use_gpu``
puts each actor on a GPU), so it scales out on a cluster. The model's weights travel in the object store, not
through shared disk. Unreadable files are counted and listed (``unreadable-*.parquet``), never dropped silently.
Rows are written in parts of about ``rows_per_part`` as they come, so a run over a large prefix that stops
resumes where it stopped: the same command skips every ``source_id`` already under ``--out``.

A run whose config names a post-hoc fix (``method.posthoc``: la, crt, la+crt) predicts through it: the fix fitted on
its training rows when the run was evaluated (:mod:`ncdlr.service.fitted_fix`) is applied to every row's scores, so
``pred`` is what ``ncdlr evaluate`` scores and ``confidence`` / ``top_score`` are the fixed scores (cos/T − log π̂
for +LA) instead of cosines; the table's metadata names the fix (``posthoc``). A run that names a fix never fitted
for its checkpoint is refused with the ``ncdlr evaluate`` command that fits it.
"""

from __future__ import annotations

import itertools
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ncdlr.data.predictions import TOP, PredictionRows
from ncdlr.methods import PosthocFix

from .config import ConfigError
from .trained_run import (TrainedRun, check_table_fits, image_input, image_model, open_run, posthoc_fix, table_model,
                          with_fix)

log = logging.getLogger(__name__)

DATA_KINDS = ("dataset", "table", "images")


def top_classes(logits: torch.Tensor, top: int = TOP) -> dict[str, np.ndarray]:
    """Per row of cosines ``logits [n, K]``: ``pred [n]`` (argmax), ``confidence [n]`` (its cosine), ``margin [n]``
    (best minus second best; 0 when K = 1), ``top [n, min(top, K)]`` class indices and ``top_score`` (best first)."""
    k = min(top, logits.shape[1])
    score, index = logits.float().topk(k, dim=1)
    second = score[:, 1] if k > 1 else score[:, 0]
    return {"pred": index[:, 0].numpy(), "confidence": score[:, 0].numpy(), "margin": (score[:, 0] - second).numpy(),
            "top": index.numpy(), "top_score": score.numpy()}


@torch.inference_mode()
def score(model: torch.nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(z [n, D], logits [n, K])`` of a batch of model inputs (float32, on CPU)."""
    z = model(x).float()
    return z, model.logits(z).float()


class _PredictActor:
    """Ray Data ``map_batches`` callable: one copy of the run's image model. ``image [n,3,S,S]`` float32 and
    ``valid [n]`` → the prediction columns (rows with ``valid=False`` get ``pred = -1``)."""

    def __init__(self, model: Any, threads: int, embeddings: bool, use_gpu: bool):
        import ray

        torch.set_num_threads(threads)
        self.device = torch.device("cuda" if use_gpu else "cpu")
        model = ray.get(model) if isinstance(model, ray.ObjectRef) else model
        self.model = model.to(self.device).eval()
        self.embeddings, self.dim = embeddings, int(model.class_prototypes().shape[0])

    def __call__(self, batch: dict) -> dict:
        valid = np.asarray(batch["valid"], dtype=bool)
        n = len(valid)
        k = min(TOP, self.model.num_known + self.model.num_novel)
        out = {"pred": np.full(n, -1, np.int64), "confidence": np.zeros(n, np.float32),
               "margin": np.zeros(n, np.float32), "top": np.zeros((n, k), np.int64),
               "top_score": np.zeros((n, k), np.float32)}
        z_all = np.zeros((n, self.dim), np.float32) if self.embeddings else None
        if valid.any():
            x = torch.as_tensor(np.ascontiguousarray(batch["image"][valid], dtype=np.float32)).to(self.device)
            z, logits = score(self.model, x)
            for key, value in top_classes(logits.cpu()).items():
                out[key][valid] = value
            if z_all is not None:
                z_all[valid] = z.cpu().numpy()
        result = {**out, "source_id": batch["source_id"], "valid": valid,
                  "label": np.asarray(batch.get("label", np.full(n, -1)), dtype=np.int64),
                  "split": np.asarray(batch.get("split", np.array([""] * n, dtype=object)), dtype=object)}
        if z_all is not None:
            result["embedding"] = z_all
        return result


@dataclass
class _Writer:
    """Collects prediction batches and writes a part whenever ``rows_per_part`` rows are pending."""

    out_uri: str
    num_known: int
    names: list[str]
    metadata: dict[str, Any]
    rows_per_part: int
    endpoint_url: str | None
    rows: int = 0  # written
    unreadable: int = 0
    pending: list[PredictionRows] = field(default_factory=list)
    pending_rows: int = 0

    def add(self, rows: PredictionRows, bad_ids: list[str]) -> None:
        from ncdlr.data.predictions import write_unreadable

        if bad_ids:
            write_unreadable(self.out_uri, bad_ids, "not a readable image", self.endpoint_url)
            self.unreadable += len(bad_ids)
            for source_id in bad_ids:
                log.warning("predict: unreadable image %s (listed under %s)", source_id, self.out_uri)
        if len(rows):
            self.pending.append(rows)
            self.pending_rows += len(rows)
        if self.pending_rows >= self.rows_per_part:
            self.flush()

    def flush(self) -> None:
        from ncdlr.data.predictions import prediction_table, write_part

        if not self.pending:
            return

        def joined(name: str):
            values = [getattr(r, name) for r in self.pending]
            if values[0] is None:
                return None
            return list(itertools.chain.from_iterable(values)) if isinstance(values[0], list) else np.concatenate(values)

        merged = PredictionRows(**{name: joined(name) for name in PredictionRows.__dataclass_fields__})
        write_part(self.out_uri, prediction_table(merged, self.num_known, self.names, self.metadata),
                   self.endpoint_url)
        self.rows += self.pending_rows
        self.pending, self.pending_rows = [], 0


def data_kind(uri: str, endpoint_url: str | None = None) -> str:
    """``"dataset"`` (a ``manifest.json`` at ``uri``), ``"table"`` (a ``.parquet`` file, or a folder with
    ``.parquet`` files at its top) or ``"images"`` (anything else: a folder of image files)."""
    import pyarrow.fs as pafs

    from ncdlr.data.manifest import MANIFEST_NAME
    from ncdlr.data.storage import join, resolve, with_retries

    fs, base = resolve(uri, endpoint_url)
    info = with_retries(lambda: fs.get_file_info([base, join(base, MANIFEST_NAME)]), uri)
    if info[1].type == pafs.FileType.File:
        return "dataset"
    if info[0].type == pafs.FileType.File:
        return "table" if base.endswith(".parquet") else "images"
    entries = with_retries(lambda: fs.get_file_info(pafs.FileSelector(base, allow_not_found=True)), uri)
    parquet = [e for e in entries if e.type == pafs.FileType.File and e.base_name.endswith(".parquet")]
    return "table" if parquet else "images"


def predict_run(run_dir: str, data_uri: str, out_uri: str, *, split: str = "test", checkpoint: str = "",
                embeddings: bool = False, batch_size: int = 64, num_actors: int = 1, threads: int = 1,
                use_gpu: bool = False, rows_per_part: int = 2048, endpoint_url: str | None = None,
                progress: bool = True) -> dict:
    """Predict every row of ``data_uri`` (see the module docstring) with the run at ``run_dir``; write the
    prediction table folder ``out_uri`` (local or ``s3://``), resuming what is there.

    Returns ``{"rows", "skipped", "unreadable", "seconds", "images_per_s", "kind", "out"}`` (``rows``: written
    by this call; ``skipped``: already under ``out_uri``). Needs Ray started for images and datasets.
    """
    from ncdlr.data.predictions import read_metadata, write_done
    from ncdlr.data.storage import source_ids_under

    run = open_run(run_dir, checkpoint)
    kind = data_kind(data_uri, endpoint_url)
    fix = posthoc_fix(run)  # a fix the run names but never fitted is refused before any work
    metadata = {"run": str(run.run_dir.absolute()), "checkpoint": run.checkpoint, "data": data_uri, "kind": kind,
                "split": split if kind != "images" else "", "num_known": run.num_known,
                "num_classes": run.num_classes, "keys": run.keys(), "embeddings": embeddings,
                "posthoc": run.cfg.method.posthoc}
    old = read_metadata(out_uri, endpoint_url)
    old = {"posthoc": "none", **old} if old else old  # folders written before the fix was recorded had none
    changed = {k: (old.get(k), metadata[k]) for k in ("run", "checkpoint", "data", "split", "embeddings", "posthoc")
               if old and old.get(k) != metadata[k]}
    if changed:
        raise ConfigError(f"{out_uri} already holds predictions made otherwise "
                          f"({', '.join(f'{k}: {a!r} there, {b!r} now' for k, (a, b) in changed.items())}); "
                          "choose another --out or delete it")
    done = source_ids_under(out_uri, endpoint_url)  # predicted or listed unreadable: skipped on a resume
    writer = _Writer(out_uri, run.num_known, run.names(), metadata, rows_per_part, endpoint_url)
    start = time.perf_counter()
    if kind == "table":
        _predict_table(run, fix, data_uri, split, writer, done, embeddings, batch_size, endpoint_url)
    else:
        _predict_images(run, fix, kind, data_uri, split, writer, done, embeddings=embeddings, batch_size=batch_size,
                        num_actors=num_actors, threads=threads, use_gpu=use_gpu, endpoint_url=endpoint_url,
                        progress=progress)
    writer.flush()
    seconds = time.perf_counter() - start
    total = writer.rows + writer.unreadable
    stats = {"rows": writer.rows, "skipped": len(done), "unreadable": writer.unreadable, "seconds": seconds,
             "images_per_s": total / max(seconds, 1e-9), "kind": kind, "out": out_uri}
    write_done(out_uri, {**metadata, **stats}, endpoint_url)
    return stats


def _rows_from(batch: dict, valid: np.ndarray, embeddings: bool) -> PredictionRows:
    label = np.asarray(batch["label"])[valid]
    split = [str(s) for s in np.asarray(batch["split"])[valid]]
    return PredictionRows(
        source_id=[str(s) for s in np.asarray(batch["source_id"])[valid]], pred=batch["pred"][valid],
        confidence=batch["confidence"][valid], margin=batch["margin"][valid], top=batch["top"][valid],
        top_score=batch["top_score"][valid], label=label,
        split=[s or None for s in split] if any(split) else None,
        embedding=np.asarray(batch["embedding"])[valid] if embeddings else None)


def _predict_images(run: TrainedRun, fix: PosthocFix, kind: str, data_uri: str, split: str, writer: _Writer,
                    done: set[str], *,
                    embeddings: bool, batch_size: int, num_actors: int, threads: int, use_gpu: bool,
                    endpoint_url: str | None, progress: bool) -> None:
    import ray
    from ray.data import ActorPoolStrategy
    from tqdm import tqdm

    from ncdlr.data import pipeline
    from ncdlr.models import input_scaling

    spec = image_input(run)
    pipe = pipeline.PipelineConfig(image_size=spec.image_size, scaling=input_scaling(spec.encoder),
                                   batch_size=batch_size, rows_per_block=batch_size, decode_batch_size=batch_size)
    if kind == "dataset":
        from ncdlr.data.manifest import read_manifest

        manifest = read_manifest(data_uri, endpoint_url)
        wanted = [s for s in manifest.split_counts if manifest.split_counts[s] > 0] if split == "all" else [split]
        if split != "all" and manifest.split_counts.get(split, 0) == 0:
            raise ConfigError(f"{data_uri} has no rows in split {split!r} (it has {manifest.split_counts})")
        raw = pipeline.load_splits(data_uri, wanted, endpoint_url=endpoint_url, manifest=manifest, shuffle_files=())
        streams = [raw[s] for s in wanted]
        if done:
            ids = np.array(sorted(done), dtype=object)
            streams = [s.map_batches(pipeline.without_source_ids, fn_kwargs={"done": ids}, batch_format="numpy")
                       for s in streams]
        total = sum(manifest.split_counts[s] for s in wanted)
    else:
        from ncdlr.data.image_files import list_images, read_images

        names = list_images(data_uri, endpoint_url)
        todo = [n for n in names if n not in done]
        total = len(names)
        streams = [read_images(data_uri, todo, endpoint_url, files_per_block=batch_size)] if todo else []
    model_ref = ray.put(with_fix(image_model(run), fix))
    bar = tqdm(total=total, initial=min(len(done), total), unit="img", desc="predict", disable=not progress,
               mininterval=2.0)
    for stream in streams:
        scored = pipeline.with_eval_view(stream, pipe).map_batches(
            _PredictActor, fn_constructor_args=(model_ref, threads, embeddings, use_gpu), batch_size=batch_size,
            compute=ActorPoolStrategy(size=num_actors), batch_format="numpy", num_cpus=threads,
            num_gpus=1 if use_gpu else 0,
            # a lost actor fails the call (the same command resumes): Ray could not restart one whose weights came
            # through the object store anyway, and says so on the terminal when restarts are allowed
            max_restarts=0)
        for batch in scored.iter_batches(batch_size=None, batch_format="numpy"):
            valid = np.asarray(batch["valid"], dtype=bool)
            bad = [str(s) for s, ok in zip(batch["source_id"], valid) if not ok]
            writer.add(_rows_from(batch, valid, embeddings), bad)
            bar.update(len(valid))
    bar.close()


def _predict_table(run: TrainedRun, fix: PosthocFix, data_uri: str, split: str, writer: _Writer, done: set[str],
                   embeddings: bool,
                   batch_size: int, endpoint_url: str | None) -> None:
    from ncdlr.data.features import first_view, read_feature_table, read_metadata

    check_table_fits(run, read_metadata(data_uri, endpoint_url=endpoint_url), data_uri)
    table = read_feature_table(data_uri, None if split == "all" else [split], endpoint_url=endpoint_url)
    if split != "all" and split not in table.features:
        raise ConfigError(f"{data_uri} has no rows in split {split!r} (it has {sorted(table.features)})")
    model = with_fix(table_model(run), fix)
    for name in sorted(table.features):
        x, labels = table.features[name], table.labels[name].numpy()
        ids = table.source_ids.get(name) or [f"{name}/{i}" for i in range(len(labels))]
        keep = np.array([i not in done for i in ids], dtype=bool)
        for lo in range(0, len(labels), batch_size):
            part = np.flatnonzero(keep[lo:lo + batch_size]) + lo
            if not len(part):
                continue
            z, logits = score(model, first_view(x[torch.as_tensor(part)]))
            writer.add(PredictionRows(source_id=[ids[i] for i in part], label=labels[part], split=[name] * len(part),
                                      embedding=z.numpy() if embeddings else None, **top_classes(logits)), [])
