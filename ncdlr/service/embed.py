"""``ncdlr embed``: a frozen encoder's embeddings of a prepared image dataset, or its activation cache.

:func:`embed_dataset` streams the prepared shards with Ray Data, decodes them with the eval transform and
feeds them through ``map_batches`` to a pool of model actors (one frozen encoder each); the rows are written
with :func:`ncdlr.data.features.write_feature_table` (the table's schema and readers live there).
:func:`embed_activations` does the same with A training crops per image and only the encoder's frozen stem,
writing an activation table part by part (resumable; docs/activation-cache.md).
"""

from __future__ import annotations

import logging
import time

import numpy as np
import torch

from ncdlr.data.features import write_feature_table
from ncdlr.models.batching import fixed_passes
from ncdlr.models.batching import pass_rows as default_pass_rows

from .config import ConfigError

log = logging.getLogger(__name__)


class _EncoderActor:
    """Ray Data ``map_batches`` callable: one frozen encoder per actor, ``image [n,3,H,W]`` → ``embedding [n,D]``."""

    def __init__(self, encoder_name: str, pretrained: str, image_size: int, threads: int, rows: int):
        from ncdlr.models import build_encoder

        torch.set_num_threads(threads)
        self.encoder = build_encoder(encoder_name, pretrained=pretrained, trainable_blocks=0, image_size=image_size).eval()
        self.encoder.frozen_pass_rows = rows  # nothing trains: forward runs the whole encoder in passes of `rows`

    def __call__(self, batch: dict) -> dict:
        valid = np.asarray(batch["valid"], dtype=bool)
        images = torch.as_tensor(np.ascontiguousarray(batch["image"], dtype=np.float32))
        emb = np.zeros((len(valid), self.encoder.feature_dim), dtype=np.float32)
        if valid.any():
            with torch.inference_mode():
                emb[valid] = self.encoder(images[torch.as_tensor(valid)]).float().numpy()
        return {"embedding": emb, "label": batch["label"], "split": batch["split"],
                "source_id": batch["source_id"], "valid": valid}


def embed_dataset(data_uri: str, out_uri: str, *, encoder: str, pretrained: str = "", image_size: int = 224,
                  batch_size: int = 64, num_actors: int = 1, threads_per_actor: int = 1,
                  splits: tuple[str, ...] = ("known", "novel", "val", "test"), endpoint_url: str | None = None,
                  pass_rows: int = 0) -> dict:
    """Embed the given splits of a prepared dataset with a frozen encoder and write a feature table.

    Ray Data streams the shards, decodes with the eval transform (resize + centre crop, the encoder's
    input scaling) and runs ``map_batches`` on a pool of ``num_actors`` model actors; each actor runs the
    encoder in passes of exactly ``pass_rows`` images (0: :func:`ncdlr.models.batching.pass_rows` of
    ``image_size``), and the rows are written in ``(split, source_id)`` order, so the table does not depend on
    how Ray Data batched or ordered the rows. Returns ``{"rows", "bad_images", "seconds", "images_per_s",
    "pass_rows"}``; undecodable images are left out of the table, counted and logged by ``source_id``.
    """
    from ray.data import ActorPoolStrategy

    from ncdlr.data import pipeline
    from ncdlr.data.manifest import read_manifest
    from ncdlr.models import input_scaling

    rows_per_pass = _rows_per_pass(pass_rows, image_size)
    manifest = read_manifest(data_uri, endpoint_url)
    present = [s for s in splits if manifest.split_counts.get(s, 0) > 0]
    pipe = pipeline.PipelineConfig(image_size=image_size, scaling=input_scaling(encoder), batch_size=batch_size)
    raw = pipeline.load_splits(data_uri, present, endpoint_url=endpoint_url)
    start = time.perf_counter()
    columns: dict[str, list] = {"embedding": [], "label": [], "split": [], "source_id": []}
    bad: list[str] = []
    for name in present:
        ds = pipeline.with_eval_view(raw[name], pipe).map_batches(
            _EncoderActor, fn_constructor_args=(encoder, pretrained, image_size, threads_per_actor, rows_per_pass),
            batch_size=batch_size, compute=ActorPoolStrategy(size=num_actors), batch_format="numpy",
            num_cpus=threads_per_actor)
        for batch in ds.iter_batches(batch_size=None, batch_format="numpy"):
            valid = np.asarray(batch["valid"], dtype=bool)
            bad += [str(s) for s, ok in zip(batch["source_id"], valid) if not ok]
            columns["embedding"].append(np.asarray(batch["embedding"])[valid])
            for key in ("label", "split", "source_id"):
                columns[key] += [v for v, ok in zip(batch[key], valid) if ok]
    for source_id in bad:
        log.warning("embed: undecodable image %s left out", source_id)
    emb = np.concatenate(columns["embedding"]) if columns["embedding"] else np.zeros((0, 1), np.float32)
    ids = [str(s) for s in columns["source_id"]]
    order = np.lexsort((np.asarray(ids, dtype=str), np.asarray(columns["split"], dtype=str))) if ids else np.arange(0)
    write_feature_table(out_uri, emb[order], np.asarray(columns["label"])[order], [columns["split"][i] for i in order],
                        num_known=manifest.num_known, num_novel=manifest.num_novel, class_names=manifest.class_names,
                        source_ids=[ids[i] for i in order],
                        extra={"encoder": encoder, "pretrained": pretrained, "image_size": image_size,
                               "dataset": data_uri, "pass_rows": rows_per_pass, "threads": threads_per_actor})
    seconds = time.perf_counter() - start
    total = len(emb) + len(bad)
    return {"rows": len(emb), "bad_images": len(bad), "seconds": seconds, "images_per_s": total / max(seconds, 1e-9),
            "pass_rows": rows_per_pass}


def _rows_per_pass(pass_rows: int, image_size: int) -> int:
    """``pass_rows`` as given (>= 1), or the default for ``image_size`` when 0; negative values are refused."""
    if pass_rows < 0:
        raise ConfigError(f"--pass-rows {pass_rows}: give the images per frozen pass (>= 1), or 0 for the default "
                          f"({default_pass_rows(image_size)} at {image_size} px)")
    return pass_rows or default_pass_rows(image_size)


# ---- the activation cache (ncdlr embed --trainable-blocks B --views A) ----------------------------------------

TRAIN_VIEW_SPLITS = ("known", "novel")  #: splits cached as A random training crops; the others as one centre view


class _StemActor:
    """Ray Data ``map_batches`` callable: the frozen stem of one encoder (everything before its last ``blocks``
    blocks). ``views`` uint8 ``[n, V, 3, H, W]`` (or ``image`` float32 ``[n, 3, H, W]``) → ``activation``
    float16 ``[n, V, *shape]``; undecodable rows stay zeros with ``valid=False``."""

    def __init__(self, encoder_name: str, pretrained: str, image_size: int, blocks: int, threads: int, rows: int):
        from ncdlr.models import build_encoder

        torch.set_num_threads(threads)
        self.encoder = build_encoder(encoder_name, pretrained=pretrained, trainable_blocks=0, image_size=image_size,
                                     cached_blocks=blocks).eval()
        self.blocks, self.rows = blocks, rows

    def __call__(self, batch: dict) -> dict:
        from ncdlr.data.transforms import batch_scaling, normalise_chw_torch

        valid = np.asarray(batch["valid"], dtype=bool)
        if "views" in batch:
            views = torch.as_tensor(np.ascontiguousarray(batch["views"]))  # uint8 [n, V, 3, H, W]
            n, v = views.shape[:2]
            images = views.reshape(n * v, *views.shape[2:])
            scaling = batch_scaling(batch["scaling"])
        else:
            images = torch.as_tensor(np.ascontiguousarray(batch["image"], dtype=np.float32))
            n, v, scaling = images.shape[0], 1, None

        def stem(part: torch.Tensor) -> torch.Tensor:  # uint8 views are scaled pass by pass (float32 only per pass)
            x = normalise_chw_torch(part, scaling) if scaling is not None else part
            return self.encoder.stem(x, self.blocks).to(torch.float16)

        with torch.inference_mode():
            out = fixed_passes(stem, images, self.rows)
        act = out.reshape(n, v, *out.shape[1:]).numpy()
        act[~valid] = 0
        return {"activation": act, "label": batch["label"], "split": batch["split"],
                "source_id": batch["source_id"], "valid": valid}


def activation_shape(encoder: str, pretrained: str, image_size: int, blocks: int) -> list[int]:
    """The shape of one cached activation (one stem pass over a blank image on the driver)."""
    from ncdlr.models import build_encoder

    enc = build_encoder(encoder, pretrained=pretrained, trainable_blocks=0, image_size=image_size,
                        cached_blocks=blocks).eval()
    with torch.inference_mode():
        return list(enc.stem(torch.zeros(1, 3, image_size, image_size), blocks).shape[1:])


def _check_resumable(out_uri: str, meta: dict, endpoint_url: str | None) -> set[str]:
    """``source_id``s already cached under ``out_uri`` by an ``embed`` with the same settings (empty for a new
    table); refuses a folder written with other settings (it would mix two caches)."""
    from ncdlr.data.features import read_metadata
    from ncdlr.data.storage import source_ids_under

    done = source_ids_under(out_uri, endpoint_url)
    if done:
        old = read_metadata(out_uri, endpoint_url=endpoint_url)
        keys = ("encoder", "pretrained", "image_size", "cached_blocks", "views", "crop_scale", "seed", "dataset", "shape",
                "photometric")
        before = {**old, "photometric": old.get("photometric", "none")}  # caches before the key held none
        changed = {k: (before.get(k), meta[k]) for k in keys if before.get(k) != meta[k]}
        if changed:
            raise ConfigError(f"{out_uri} already holds an activation cache made with other settings "
                              f"({', '.join(f'{k}: {a!r} there, {b!r} now' for k, (a, b) in changed.items())}); "
                              "choose another --out or delete it")
    return done


def embed_activations(data_uri: str, out_uri: str, *, encoder: str, pretrained: str = "", image_size: int = 224,
                      blocks: int = 1, views: int = 8, crop_scale: tuple[float, float] = (0.5, 1.0), seed: int = 0,
                      photometric: str = "none", batch_size: int = 32, num_actors: int = 1, threads_per_actor: int = 1,
                      splits: tuple[str, ...] = ("known", "novel", "val", "test"), rows_per_part: int = 512,
                      endpoint_url: str | None = None, progress: bool = True, pass_rows: int = 0) -> dict:
    """Cache the frozen part of ``encoder`` for a prepared dataset: an activation table under the folder ``out_uri``.

    ``known``/``novel`` rows get ``views`` random training crops each (RandomResizedCrop with ``crop_scale``
    and a flip, drawn from ``(seed, source_id)``; with ``photometric="uno"`` UNO's colour jitter, greyscale and blur
    on each crop, from a separate stream of the same seed, so the boxes and flips are those of ``"none"``), the
    other splits one centre view; each crop goes through
    everything before the encoder's last ``blocks`` blocks and is stored as float16 (``ncdlr.data.features``,
    "Activation tables"). Ray Data streams and decodes the shards; ``num_actors`` model actors run the stem in
    passes of exactly ``pass_rows`` crops (0: :func:`ncdlr.models.batching.pass_rows` of ``image_size``), so a
    crop's activation does not depend on how Ray Data batched the rows (the table records ``pass_rows`` and the
    threads per actor, the two settings besides the machine that still change the float rounding).
    Parts of about ``rows_per_part`` rows are written as they fill, so an interrupted call resumes: rows whose
    ``source_id`` is already in the folder are skipped (same settings required). Undecodable images are left
    out, counted and logged. Returns ``{"rows", "skipped", "bad_images", "seconds", "images_per_s",
    "bytes_per_view", "shape", "pass_rows"}``.
    """
    import uuid

    from ray.data import ActorPoolStrategy
    from tqdm import tqdm

    from ncdlr.data import pipeline
    from ncdlr.data.features import write_table_part
    from ncdlr.data.manifest import read_manifest
    from ncdlr.models import input_scaling

    if views < 2:
        raise ConfigError(f"--views {views}: two different cached views per image are the two views of a step; "
                          "cache at least 2")
    manifest = read_manifest(data_uri, endpoint_url)
    present = [s for s in splits if manifest.split_counts.get(s, 0) > 0]
    rows_per_pass = _rows_per_pass(pass_rows, image_size)
    shape = activation_shape(encoder, pretrained, image_size, blocks)
    meta = {"num_known": manifest.num_known, "num_novel": manifest.num_novel, "encoder": encoder,
            "pretrained": pretrained, "image_size": image_size, "cached_blocks": blocks, "shape": shape,
            "views": {s: views if s in TRAIN_VIEW_SPLITS else 1 for s in present},
            "crop_scale": list(crop_scale), "seed": seed, "photometric": photometric, "dataset": data_uri,
            "pass_rows": rows_per_pass, "threads": threads_per_actor}
    done = _check_resumable(out_uri, meta, endpoint_url)
    done_ids = np.array(sorted(done), dtype=object)
    pipe = pipeline.PipelineConfig(image_size=image_size, crop_scale=tuple(crop_scale), scaling=input_scaling(encoder),
                                   photometric=photometric,
                                   batch_size=batch_size, rows_per_block=batch_size)
    raw = pipeline.load_splits(data_uri, present, endpoint_url=endpoint_url, manifest=manifest)
    start = time.perf_counter()
    total = sum(manifest.split_counts[s] for s in present)
    bar = tqdm(total=total, initial=len(done), unit="img", desc="embed", disable=not progress, mininterval=2.0)
    rows, bad = 0, []
    pending: dict[str, list] = {"activation": [], "label": [], "split": [], "source_id": []}

    def flush() -> None:
        if not pending["label"]:
            return
        write_table_part(f"{out_uri.rstrip('/')}/part-{uuid.uuid4().hex[:12]}.parquet",
                         np.concatenate(pending["activation"]), np.concatenate(pending["label"]),
                         sum(pending["split"], []), source_ids=sum(pending["source_id"], []),
                         class_names=manifest.class_names, metadata=meta, endpoint_url=endpoint_url)
        for value in pending.values():
            value.clear()

    for name in present:
        ds = raw[name]
        if done:
            ds = ds.map_batches(pipeline.without_source_ids, fn_kwargs={"done": done_ids}, batch_format="numpy")
        decoded = (pipeline.with_cached_views(ds, pipe, views, seed) if name in TRAIN_VIEW_SPLITS
                   else pipeline.with_eval_view(ds, pipe))
        stems = decoded.map_batches(_StemActor, fn_constructor_args=(encoder, pretrained, image_size, blocks,
                                                                     threads_per_actor, rows_per_pass),
                                    batch_size=batch_size, compute=ActorPoolStrategy(size=num_actors),
                                    batch_format="numpy", num_cpus=threads_per_actor)
        for batch in stems.iter_batches(batch_size=None, batch_format="numpy"):
            valid = np.asarray(batch["valid"], dtype=bool)
            bad += [str(s) for s, ok in zip(batch["source_id"], valid) if not ok]
            pending["activation"].append(np.asarray(batch["activation"])[valid])
            pending["label"].append(np.asarray(batch["label"])[valid])
            pending["split"].append([str(s) for s, ok in zip(batch["split"], valid) if ok])
            pending["source_id"].append([str(s) for s, ok in zip(batch["source_id"], valid) if ok])
            rows += int(valid.sum())
            bar.update(len(valid))
            if sum(len(a) for a in pending["activation"]) >= rows_per_part:
                flush()
        flush()
    bar.close()
    for source_id in bad:
        log.warning("embed: undecodable image %s left out", source_id)
    seconds = time.perf_counter() - start
    return {"rows": rows, "skipped": len(done), "bad_images": len(bad), "seconds": seconds,
            "images_per_s": (rows + len(bad)) / max(seconds, 1e-9), "bytes_per_view": 2 * int(np.prod(shape)),
            "shape": shape, "pass_rows": rows_per_pass}
