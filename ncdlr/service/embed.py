"""``ncdlr embed``: a frozen encoder's embeddings of a prepared image dataset, written as a feature table.

:func:`embed_dataset` streams the prepared shards with Ray Data, decodes them with the eval transform and
feeds them through ``map_batches`` to a pool of model actors (one frozen encoder each); the rows are written
with :func:`ncdlr.data.features.write_feature_table` (the table's schema and readers live there).
"""

from __future__ import annotations

import logging
import time

import numpy as np
import torch

from ncdlr.data.features import write_feature_table

log = logging.getLogger(__name__)


class _EncoderActor:
    """Ray Data ``map_batches`` callable: one frozen encoder per actor, ``image [n,3,H,W]`` → ``embedding [n,D]``."""

    def __init__(self, encoder_name: str, pretrained: str, image_size: int, threads: int):
        from ncdlr.models import build_encoder

        torch.set_num_threads(threads)
        self.encoder = build_encoder(encoder_name, pretrained=pretrained, trainable_blocks=0, image_size=image_size).eval()

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
                  splits: tuple[str, ...] = ("known", "novel", "val", "test"), endpoint_url: str | None = None) -> dict:
    """Embed the given splits of a prepared dataset with a frozen encoder and write a feature table.

    Ray Data streams the shards, decodes with the eval transform (resize + centre crop, the encoder's
    input scaling) and runs ``map_batches`` on a pool of ``num_actors`` model actors. Returns
    ``{"rows", "bad_images", "seconds", "images_per_s"}``; undecodable images are left out of the table,
    counted and logged by ``source_id``.
    """
    from ray.data import ActorPoolStrategy

    from ncdlr.data import pipeline
    from ncdlr.data.manifest import read_manifest
    from ncdlr.models import input_scaling

    manifest = read_manifest(data_uri, endpoint_url)
    present = [s for s in splits if manifest.split_counts.get(s, 0) > 0]
    pipe = pipeline.PipelineConfig(image_size=image_size, scaling=input_scaling(encoder), batch_size=batch_size)
    raw = pipeline.load_splits(data_uri, present, endpoint_url=endpoint_url)
    start = time.perf_counter()
    columns: dict[str, list] = {"embedding": [], "label": [], "split": [], "source_id": []}
    bad: list[str] = []
    for name in present:
        ds = pipeline.with_eval_view(raw[name], pipe).map_batches(
            _EncoderActor, fn_constructor_args=(encoder, pretrained, image_size, threads_per_actor),
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
    write_feature_table(out_uri, emb, np.asarray(columns["label"]), columns["split"],
                        num_known=manifest.num_known, num_novel=manifest.num_novel, class_names=manifest.class_names,
                        source_ids=[str(s) for s in columns["source_id"]],
                        extra={"encoder": encoder, "dataset": data_uri})
    seconds = time.perf_counter() - start
    total = len(emb) + len(bad)
    return {"rows": len(emb), "bad_images": len(bad), "seconds": seconds, "images_per_s": total / max(seconds, 1e-9)}

