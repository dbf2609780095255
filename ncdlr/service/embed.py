"""Feature tables: a frozen encoder's embeddings of a prepared image dataset, as one parquet file.

Columns: ``embedding`` (list<float32>, width D), ``label`` (int32), ``split`` (string), ``class_name`` and
``source_id`` (strings, optional on read). The schema metadata key ``ncdlr`` holds JSON
``{"num_known", "num_novel", "class_names", "encoder", "dataset"}``; tables from elsewhere without it
are accepted, with Ks and K inferred from the labels of the ``known`` split and of all splits.

:func:`embed_dataset` computes the table with Ray Data: the prepared shards are streamed, decoded with
the eval transform and fed through ``map_batches`` to a pool of model actors (one frozen encoder each).
"""

from __future__ import annotations

import json
import logging
import time

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import torch

from ncdlr.data.storage import resolve

from .train_loop import FeatureSplits

log = logging.getLogger(__name__)

METADATA_KEY = b"ncdlr"


FEATURE_TABLE_COLUMNS = ("embedding", "label", "split")


def open_feature_table(uri: str) -> tuple[pafs.FileSystem, str, pa.Schema]:
    """Filesystem, path and schema of a feature table (parquet file or directory, local or s3://).

    Raises FileNotFoundError / ValueError naming ``uri`` (and the missing column).
    """
    fs, path = resolve(uri)
    try:
        schema = pq.ParquetDataset(path, filesystem=fs).schema
    except (FileNotFoundError, OSError) as err:
        raise FileNotFoundError(f"feature table {uri!r} cannot be read: {err}") from err
    for column in FEATURE_TABLE_COLUMNS:
        if column not in schema.names:
            raise ValueError(f"feature table {uri!r} lacks column {column!r} (has {schema.names})")
    return fs, path, schema


def read_feature_table(uri: str) -> FeatureSplits:
    """Load a feature table (local path or s3://) into per-split tensors; errors name the URI and column."""
    fs, path, _ = open_feature_table(uri)
    table = pq.read_table(path, filesystem=fs)
    emb = table.column("embedding").combine_chunks()
    if not pa.types.is_list(emb.type) and not pa.types.is_fixed_size_list(emb.type) and not pa.types.is_large_list(emb.type):
        raise ValueError(f"feature table {uri!r}: column 'embedding' must be a list of floats, is {emb.type}")
    lengths = set(pa.compute.list_value_length(emb).unique().to_pylist()) if len(emb) else set()
    if len(lengths) > 1:
        raise ValueError(f"feature table {uri!r}: embeddings have different widths {sorted(lengths)}")
    dim = lengths.pop() if lengths else 0
    x = np.asarray(emb.flatten().to_numpy(zero_copy_only=False), dtype=np.float32).reshape(len(emb), dim)
    y = table.column("label").to_numpy().astype(np.int64)
    split = np.asarray(table.column("split").to_pylist())
    meta = json.loads(table.schema.metadata[METADATA_KEY]) if table.schema.metadata and METADATA_KEY in table.schema.metadata else {}
    for needed in ("known", "novel"):
        if not (split == needed).any():
            raise ValueError(f"feature table {uri!r} has no rows with split {needed!r}")
    num_known = int(meta.get("num_known", y[split == "known"].max() + 1))
    num_classes = int(meta.get("num_known", 0) + meta.get("num_novel", 0)) or int(y.max() + 1)
    if (y[split == "known"] >= num_known).any() or (y[split == "novel"] < num_known).any():
        raise ValueError(f"feature table {uri!r}: known labels must be 0..Ks-1 and novel labels Ks..K-1 (Ks={num_known})")
    names = meta.get("class_names") or [str(i) for i in range(num_classes)]
    features = {s: torch.from_numpy(x[split == s]) for s in np.unique(split)}
    labels = {s: torch.from_numpy(y[split == s]) for s in np.unique(split)}
    return FeatureSplits(features, labels, num_known, num_classes - num_known, list(names))


def write_feature_table(uri: str, embeddings: np.ndarray, labels: np.ndarray, splits: list[str] | np.ndarray, *,
                        num_known: int, num_novel: int, class_names: list[str] | None = None,
                        source_ids: list[str] | None = None, extra: dict | None = None) -> None:
    """Write ``embeddings [N, D]`` with labels/splits as a feature table (local path or s3://)."""
    embeddings = np.ascontiguousarray(embeddings, dtype=np.float32)
    n, dim = embeddings.shape
    columns = {
        "embedding": pa.FixedSizeListArray.from_arrays(pa.array(embeddings.reshape(-1)), dim).cast(pa.list_(pa.float32())),
        "label": pa.array(np.asarray(labels, dtype=np.int32)),
        "split": pa.array([str(s) for s in splits]),
    }
    names = class_names or [str(i) for i in range(num_known + num_novel)]
    columns["class_name"] = pa.array([names[int(label)] for label in labels])
    if source_ids is not None:
        columns["source_id"] = pa.array(list(source_ids))
    meta = {"num_known": num_known, "num_novel": num_novel, "class_names": names, **(extra or {})}
    table = pa.table(columns).replace_schema_metadata({METADATA_KEY: json.dumps(meta).encode()})
    fs, path = resolve(uri)
    if isinstance(fs, pafs.LocalFileSystem):  # object stores need no parent "directories"
        fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
    pq.write_table(table, path, filesystem=fs)


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


def synthetic_features(num_known: int = 10, num_novel: int = 10, dim: int = 32, n_max: int = 120,
                       ratio: float = 10.0, test_per_class: int = 10, noise: float = 0.6, seed: int = 0
                       ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A long-tailed clustered feature set (for tests and benchmarks): ``(embeddings [N, D], labels [N], splits [N])``.

    Class ``c`` is a random unit direction plus Gaussian noise of std ``noise / sqrt(D)`` per coordinate;
    train counts follow ``n_max · ratio^(-r/(C-1))`` inside each half; ``test_per_class`` balanced test rows.
    """
    from ncdlr.data.longtail import long_tail_counts

    rng = np.random.default_rng(seed)
    k = num_known + num_novel
    centres = rng.standard_normal((k, dim))
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    counts = long_tail_counts(n_max, num_known, ratio) + long_tail_counts(n_max, num_novel, ratio)
    xs, ys, ss = [], [], []
    for c in range(k):
        for split, n in (("known" if c < num_known else "novel", counts[c]), ("test", test_per_class)):
            xs.append(centres[c] + rng.standard_normal((n, dim)) * noise / np.sqrt(dim))
            ys.append(np.full(n, c))
            ss += [split] * n
    return np.concatenate(xs).astype(np.float32), np.concatenate(ys), np.array(ss)
