"""Plain image files as a dataset: a local folder or an ``s3://`` prefix of JPEG/PNG/WebP files, any size.

``ncdlr predict`` applies a trained model to such a folder; ``ncdlr gallery`` reads thumbnails from it.
:func:`list_images` lists the image files under the folder (recursively, by suffix, sorted), each named by its
path *relative to the folder* (its ``source_id``); :func:`read_images` streams a list of them with Ray Data as
rows ``image`` (the encoded bytes) and ``source_id``, ready for the eval transform
(``ncdlr.data.pipeline.with_eval_view``), which marks an unreadable file ``valid=False`` instead of failing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow.fs as pafs

from ncdlr.data.storage import ObjectNotFoundError, StorageError, join, resolve, with_retries

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".webp")  #: file name endings read as images (any case)


class EmptyImageFolderError(StorageError):
    """A folder or prefix that holds no image file."""


def is_image_name(name: str) -> bool:
    """Whether a file name ends in one of :data:`IMAGE_SUFFIXES` (case-insensitive) and is not hidden."""
    base = name.rsplit("/", 1)[-1]
    return not base.startswith(".") and base.lower().endswith(IMAGE_SUFFIXES)


def list_images(uri: str, endpoint_url: str | None = None) -> list[str]:
    """Relative paths of every image file under the folder or prefix ``uri`` (recursive), sorted.

    Raises :class:`ObjectNotFoundError` when ``uri`` does not exist (the bucket errors of ``resolve`` for a bad
    bucket or credentials) and :class:`EmptyImageFolderError` when it holds no image file (the message counts the
    other files found, so a wrong suffix shows).
    """
    fs, base = resolve(uri, endpoint_url)
    info = with_retries(lambda: fs.get_file_info(base), uri)
    if info.type == pafs.FileType.File:
        raise StorageError(uri, "is a file; give the folder (or s3:// prefix) that holds the images")
    entries = with_retries(lambda: fs.get_file_info(pafs.FileSelector(base, recursive=True, allow_not_found=True)), uri)
    files = [e.path[len(base):].lstrip("/") for e in entries if e.type == pafs.FileType.File]
    if info.type == pafs.FileType.NotFound and not files:
        raise ObjectNotFoundError(uri, "no such folder or prefix")
    images = sorted(f for f in files if is_image_name(f))
    if not images:
        raise EmptyImageFolderError(uri, f"holds no image file ({', '.join(IMAGE_SUFFIXES)}); "
                                         f"{len(files)} other file(s) found")
    return images


def read_images(uri: str, names: Sequence[str], endpoint_url: str | None = None,
                files_per_block: int = 64) -> Any:
    """A lazy ``ray.data.Dataset`` of the files ``names`` (relative to ``uri``): rows ``image`` (bytes) and
    ``source_id`` (the relative name). Files are read in read tasks of ``files_per_block`` files each."""
    import ray.data

    fs, base = resolve(uri, endpoint_url)
    paths = [join(base, name) for name in names]
    blocks = max(1, -(-len(paths) // files_per_block))
    ds = ray.data.read_binary_files(paths, filesystem=fs, include_paths=True, override_num_blocks=blocks)
    cut = len(base.rstrip("/")) + 1

    def rename(batch: dict) -> dict:
        return {"image": batch["bytes"], "source_id": [str(p)[cut:] for p in batch["path"]]}

    return ds.map_batches(rename, batch_format="numpy", batch_size=None)


def read_image_bytes(uri: str, name: str, endpoint_url: str | None = None) -> bytes:
    """The bytes of one file ``name`` under the folder ``uri`` (a gallery thumbnail's source)."""
    fs, base = resolve(uri, endpoint_url)
    path = join(base, name)
    try:
        with fs.open_input_file(path) as handle:
            return handle.read()
    except FileNotFoundError as err:
        raise ObjectNotFoundError(join(uri, name), "image file not found") from err
